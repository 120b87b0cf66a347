"""The teardown shield: a second Ctrl-C / SIGTERM during the final heal, census or stack stop is recorded
and reported afterwards, never raised in the middle of it (monsoon.run.shield.TeardownShield)."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from monsoon.faults.base import FaultContext
from monsoon.faults.plan import FaultPlan
from monsoon.run.shield import TeardownShield
from monsoon.timeline.store import Timeline, read_events
from tests.unit.test_fault_plan import RecordingBackend, fault

pytestmark = pytest.mark.skipif(threading.current_thread() is not threading.main_thread(),
                                reason="signal handlers need the main thread")


def plugin_like_sigterm(signum, frame):
    """What monsoon's pytest plugin installs: SIGTERM unwinds like Ctrl-C."""
    raise KeyboardInterrupt(f"monsoon: received {signal.Signals(signum).name}")


@pytest.fixture
def plugin_handlers():
    """SIGTERM as the plugin sets it, and SIGINT as Python sets it in a session started from a terminal (a
    session started by a script in the background inherits SIGINT ignored, and Python then leaves it so)."""
    old = signal.signal(signal.SIGTERM, plugin_like_sigterm)
    old_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGTERM, old)
    signal.signal(signal.SIGINT, old_int)


def settle(seconds: float = 0.2) -> None:
    """Let a pending Python signal handler run (it runs between bytecodes of the main thread)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        time.sleep(0.01)


class Teardown:
    """A context manager whose exit takes a while and gets signalled in the middle."""

    def __init__(self, signals=(signal.SIGTERM, signal.SIGINT), from_thread=False):
        self.signals, self.from_thread = signals, from_thread
        self.steps: list[str] = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.steps.append("heal started")
        if self.from_thread:
            t = threading.Thread(target=lambda: [os.kill(os.getpid(), s) for s in self.signals])
            t.start()
            t.join()
        else:
            for s in self.signals:
                os.kill(os.getpid(), s)
        settle()
        self.steps.append("healed")
        settle()
        self.steps.append("stopped")
        return False


@pytest.mark.parametrize("from_thread", [False, True])
def test_signals_during_teardown_are_recorded_and_raised_only_after_it(plugin_handlers, from_thread):
    said: list[str] = []
    shield = TeardownShield(said.append)
    td = Teardown(from_thread=from_thread)
    with pytest.raises(KeyboardInterrupt) as ki:
        with shield.around_exit(td):
            pass
    assert td.steps == ["heal started", "healed", "stopped"]          # the body ran to its end
    assert sorted(shield.received) == ["SIGINT", "SIGTERM"]   # pending handlers run in signal-number order
    assert "SIGTERM" in str(ki.value) and "SIGINT" in str(ki.value) and "during teardown" in str(ki.value)
    assert said.count("monsoon: still healing/stopping, please wait (SIGTERM received)") == 1
    assert said.count("monsoon: still healing/stopping, please wait (SIGINT received)") == 1
    # the handlers in place before are back
    assert signal.getsignal(signal.SIGTERM) is plugin_like_sigterm
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert not shield.armed


def test_no_signal_no_interrupt_and_the_handlers_are_restored(plugin_handlers):
    shield = TeardownShield(lambda s: None)
    td = Teardown(signals=())
    with shield.around_exit(td):
        pass
    assert td.steps[-1] == "stopped" and shield.received == []
    assert signal.getsignal(signal.SIGTERM) is plugin_like_sigterm


def test_an_interrupt_already_on_its_way_is_not_replaced(plugin_handlers):
    shield = TeardownShield(lambda s: None)
    td = Teardown()
    first = KeyboardInterrupt("the first Ctrl-C")
    with pytest.raises(KeyboardInterrupt) as ki:
        with shield.around_exit(td):
            raise first
    assert ki.value is first
    assert td.steps[-1] == "stopped" and sorted(shield.received) == ["SIGINT", "SIGTERM"]


def test_a_signal_during_the_teardown_of_a_failed_run_becomes_the_interrupt(plugin_handlers):
    shield = TeardownShield(lambda s: None)
    with pytest.raises(KeyboardInterrupt) as ki:
        with shield.around_exit(Teardown(signals=(signal.SIGTERM,))):
            raise RuntimeError("the load crashed")
    assert isinstance(ki.value.__cause__, RuntimeError)   # the user asked to stop: the session must not go on


def test_hold_keeps_the_shield_up_between_the_final_heal_and_the_stack_stop(plugin_handlers):
    """Inner teardown (the fault plan) leaving by an exception: no gap before the outer one (the stack)."""
    shield = TeardownShield(lambda s: None)
    stack, plan = Teardown(signals=()), Teardown(signals=(signal.SIGINT,))
    between = []
    with pytest.raises(KeyboardInterrupt) as ki:
        with shield.around_exit(stack):
            with shield.around_exit(plan, hold=True):
                pass                       # the signal during the plan's heal is raised after it ...
            between.append("not reached")  # ... so the drain does not run
    assert between == []
    assert plan.steps[-1] == "stopped" and stack.steps[-1] == "stopped"
    assert "SIGINT" in str(ki.value) and not shield.armed
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_hold_after_a_clean_heal_brings_the_shield_down_for_the_drain(plugin_handlers):
    shield = TeardownShield(lambda s: None)
    with shield.around_exit(Teardown(signals=())):
        with shield.around_exit(Teardown(signals=()), hold=True):
            pass
        assert not shield.armed           # a Ctrl-C during the drain interrupts it as usual
        assert signal.getsignal(signal.SIGTERM) is plugin_like_sigterm


def test_a_second_sigterm_cannot_cut_the_final_heal_short(tmp_path, plugin_handlers):
    """A real FaultPlan: the first heal gets a second SIGTERM; every fault still heals and the census is taken."""
    tl = Timeline(tmp_path / "timeline.jsonl")
    be = RecordingBackend(time.monotonic)
    heal = be.heal

    def heal_and_get_signalled(h):
        if not any(op == "heal" for op, *_ in be.log):
            os.kill(os.getpid(), signal.SIGTERM)
            settle(0.1)
        heal(h)
    be.heal = heal_and_get_signalled
    plan = FaultPlan([fault("a", 0, 3600), fault("b", 0, 3600)], {"process": be}, tl, ctx=FaultContext(run_id="r1"),
                     horizon=7200, handle_sigterm=False)
    said: list[str] = []
    shield = TeardownShield(said.append)
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        with shield.around_exit(plan):
            for _ in range(500):
                if len(be.in_place) == 2:
                    break
                time.sleep(0.01)
            assert len(be.in_place) == 2
    assert not be.in_place and plan.leftovers == {}
    assert [op for op, *_ in be.log].count("heal") == 2 and be.log[-1][0] == "heal_all"
    assert [e for e in read_events(tl.path) if e["type"] == "fault-census"]
    assert any("still healing/stopping, please wait" in s for s in said)


def test_a_fault_plan_with_its_own_sigterm_handler_leaves_the_shield_in_place(tmp_path):
    """Without the plugin the plan installs its own SIGTERM handler; its exit must not put SIG_DFL back
    under the shield (a SIGTERM would then kill monsoon in the middle of the stack's stop)."""
    old = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        shield = TeardownShield(lambda s: None)
        seen = []

        class Stack:
            def __enter__(self):
                return self

            def __exit__(self, *exc):
                seen.append(signal.getsignal(signal.SIGTERM))   # no signal is sent: SIG_DFL would kill pytest

        be = RecordingBackend(time.monotonic)
        plan = FaultPlan([fault("a", 0, 3600)], {"process": be}, Timeline(tmp_path / "timeline.jsonl"),
                         ctx=FaultContext(run_id="r1"), horizon=7200, handle_sigterm=True)
        with pytest.raises(RuntimeError):
            with shield.around_exit(Stack()):
                with shield.around_exit(plan, hold=True):
                    assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)   # the plan's
                    raise RuntimeError("the load crashed")
        assert seen == [shield._on_signal]
        assert not be.in_place
    finally:
        signal.signal(signal.SIGTERM, old)


# --- issue 17: an interrupt still gives a checklist, and one signal during the checks lets them finish

def test_one_signal_during_the_checks_lets_them_finish_and_is_reported():
    import os
    import signal as sig
    from monsoon.run.shield import FinishFirst
    said = []
    with FinishFirst(said.append, "finishing the checks of s/e") as fin:
        os.kill(os.getpid(), sig.SIGTERM)
        done = sum(range(1000))          # the work goes on after the first signal
    assert done == 499500 and fin.received == ["SIGTERM"]
    assert signal_handler_is_back(sig.SIGTERM, fin)


def test_a_second_signal_during_the_checks_stops_at_once():
    import os
    import signal as sig
    import pytest
    from monsoon.run.shield import FinishFirst
    from monsoon.signals import Interrupted
    with pytest.raises(Interrupted) as e:
        with FinishFirst(lambda s: None):
            os.kill(os.getpid(), sig.SIGTERM)
            os.kill(os.getpid(), sig.SIGINT)
            raise AssertionError("not reached: the second signal stops the work")
    assert e.value.signal == "SIGINT"
    with pytest.raises(Interrupted):     # after an interrupted run, the first one already stops
        with FinishFirst(lambda s: None, already=True):
            os.kill(os.getpid(), sig.SIGTERM)
            raise AssertionError("not reached")


def signal_handler_is_back(signum, fin) -> bool:
    import signal as sig
    return sig.getsignal(signum) != fin._on_signal


def test_the_checklist_of_an_interrupted_session_names_the_signal_and_marks_the_run_partial():
    from monsoon.report.checklist import checklist, summary
    cut = {"stack": "kafka", "experiment": "burst-x10", "verdict": "unknown", "figures": {},
           "interrupted": {"signal": "SIGTERM", "t": 42.4, "stage": "load", "phase": "burst"}, "partial": True,
           "checks": [{"name": "no_acked_loss", "verdict": "pass", "figures": {"acked_lost": 0}}]}
    whole = {"stack": "inmemory", "experiment": "burst-x3", "verdict": "pass", "figures": {},
             "checks": [{"name": "no_oom", "verdict": "pass", "figures": {"oom_events": 0}}]}
    s = summary("r1", "quick", [whole, cut])
    assert s["interrupted"] == {"stack": "kafka", "experiment": "burst-x10", "signal": "SIGTERM", "t": 42.4,
                                "stage": "load", "phase": "burst"}
    md = checklist(s)
    assert "**Decision: NO-GO**" in md and "interrupted by SIGTERM at t=42s (load phase burst)" in md
    assert "| kafka | burst-x10 | no_acked_loss | PASS (partial) |" in md
    assert "| inmemory | burst-x3 | no_oom | PASS |" in md
    # a session stopped while a whole run's checks finished: the run keeps its verdict, the decision is NO-GO
    s2 = summary("r2", "quick", [whole], {"stack": "inmemory", "experiment": "burst-x3", "signal": "SIGINT",
                                          "t": 80.0, "stage": "checks"})
    assert "**Decision: NO-GO**" in checklist(s2) and "(checks)" in checklist(s2)
    assert "interrupted" not in summary("r3", "quick", [whole])


def test_every_course_that_starts_a_stack_stops_it_behind_the_teardown_shield():
    """An experiment, a calibration, a sweep and a mix each start a stack; a second Ctrl-C during any one's
    stop must not cut it short. No module of monsoon/ may enter a Stack except through shield.around_exit, which
    one place does (Course.start_stack, monsoon/run/course.py), and each of the four enters its stack through it."""
    import ast
    from pathlib import Path
    repo = Path(__file__).resolve().parents[2]
    bare, shielded, starts = [], [], []
    for p in sorted((repo / "monsoon").rglob("*.py")):
        rel = str(p.relative_to(repo))
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "around_exit" and node.args \
                    and isinstance(node.args[0], ast.Call) and getattr(node.args[0].func, "id", None) == "Stack":
                shielded.append(rel)
            if not isinstance(node, (ast.With, ast.AsyncWith)):
                continue
            for item in node.items:
                call = item.context_expr
                if not isinstance(call, ast.Call):
                    continue
                name = getattr(call.func, "id", None) or getattr(call.func, "attr", None)
                if name == "Stack":
                    bare.append(f"{rel}:{node.lineno}")
                elif name == "start_stack":
                    starts.append(rel)
    assert bare == [], f"a Stack entered without TeardownShield.around_exit: {bare}"
    assert shielded == ["monsoon/run/course.py"], shielded
    assert {"monsoon/run/experiment.py", "monsoon/run/calibrate.py", "monsoon/run/sweep.py",
            "monsoon/run/mix.py"} <= set(starts), starts
