"""FaultPlan scheduling with a fake clock and a recording backend: order, timing, final heal, census."""
import json
import threading

import pytest

from monsoon.faults.base import FaultContext, FaultError, Handle, Landing
from monsoon.faults.plan import FaultPlan, schedule
from monsoon.spec.fault import FaultSpec
from monsoon.timeline.store import Timeline, read_events


def fault(name, at, duration, repeat=None, times=None, backend="process", target="svc", kind="process-pause"):
    return FaultSpec(name=name, kind=kind, target=target, backend=backend, params={},
                     schedule={"at": at, "duration": duration, "repeat_every": repeat, "times": times})


class FakeClock:
    def __init__(self):
        self.t = 1000.0
        self.lock = threading.Lock()

    def __call__(self):
        return self.t

    def wait(self, s):
        self.t += s
        return False


class RecordingBackend:
    """Keeps 'in place' state like a real backend, so heal_all and census are meaningful."""
    name = "process"

    def __init__(self, clock, fail_inject=(), fail_heal=()):
        self.clock = clock
        self.log = []
        self.in_place = set()
        self.fail_inject, self.fail_heal = set(fail_inject), set(fail_heal)

    def inject(self, f, ctx):
        self.log.append(("inject", f.name, self.clock()))
        if f.name in self.fail_inject:
            raise FaultError("boom")
        h = Handle(f, self.name, ctx.run_id, {"n": len(self.log)})
        self.in_place.add(h.id)
        return h

    def heal(self, h):
        self.log.append(("heal", h.fault.name, self.clock()))
        if h.fault.name in self.fail_heal:
            self.fail_heal.discard(h.fault.name)   # fails once; the final heal retries
            raise FaultError("heal failed")
        self.in_place.discard(h.id)
        h.healed = True

    def heal_all(self, run_id):
        self.log.append(("heal_all", run_id, self.clock()))
        out = sorted(self.in_place)
        self.in_place.clear()
        return out

    def verify(self, h):
        return Landing(h.id not in self.in_place if h.healed else h.id in self.in_place, {"method": "fake"})

    def census(self, run_id):
        return sorted(self.in_place)


@pytest.fixture
def setup(tmp_path):
    clock = FakeClock()
    tl = Timeline(tmp_path / "timeline.jsonl")
    be = RecordingBackend(clock)
    ctx = FaultContext(run_id="r1")
    return clock, tl, be, ctx


def plan_of(faults, be, tl, ctx, clock, horizon=100, **kw):
    return FaultPlan(faults, {"process": be}, tl, ctx=ctx, horizon=horizon, clock=clock, wait=clock.wait,
                     handle_sigterm=False, **kw)


def test_schedule_orders_heals_before_injects_and_clamps_to_horizon():
    a = fault("a", 10, 5, repeat=20)
    b = fault("b", 15, 100)
    acts = [(x.t, x.phase, x.fault.name, x.window) for x in schedule([a, b], 60)]
    assert acts == [(10, "inject", "a", 0), (15, "heal", "a", 0), (15, "inject", "b", 0), (30, "inject", "a", 1),
                    (35, "heal", "a", 1), (50, "inject", "a", 2), (55, "heal", "a", 2), (60, "heal", "b", 0)]


def test_run_injects_and_heals_at_planned_times(setup):
    clock, tl, be, ctx = setup
    plan = plan_of([fault("a", 10, 5, repeat=20, times=2)], be, tl, ctx, clock)
    plan.t0 = clock()
    plan.run()
    plan.heal_all()
    times = [(op, round(t - 1000, 3)) for op, name, t in be.log if op != "heal_all"]
    assert times == [("inject", 10), ("heal", 15), ("inject", 30), ("heal", 35)]
    # verification runs in a worker pool: order by the plan, not by write order
    evs = sorted((e for e in read_events(tl.path) if e["type"] == "fault"), key=lambda e: e["intended"])
    assert [(e["phase"], e["intended"], e["window"], e["landed"]) for e in evs] == [
        ("inject", 10, 0, True), ("heal", 15, 0, True), ("inject", 30, 1, True), ("heal", 35, 1, True)]
    assert all(e["effective"] >= e["intended"] and e["evidence"] == {"method": "fake"} for e in evs)
    assert {e["kind"] for e in evs} == {"process-pause"} and {e["name"] for e in evs} == {"a"}
    census = [e for e in read_events(tl.path) if e["type"] == "fault-census"]
    assert census and census[0]["leftovers"] == {}
    assert plan.leftovers == {}


def test_failed_inject_is_recorded_and_not_healed(setup):
    clock, tl, be, ctx = setup
    be.fail_inject = {"a"}
    plan = plan_of([fault("a", 1, 5)], be, tl, ctx, clock)
    plan.t0 = clock()
    plan.run()
    plan.heal_all()
    evs = [e for e in read_events(tl.path) if e["type"] == "fault"]
    assert [(e["phase"], e["landed"]) for e in evs] == [("inject", False)]
    assert "boom" in evs[0]["evidence"]["error"] and plan.errors
    assert [op for op, *_ in be.log] == ["inject", "heal_all"]


def test_failed_heal_is_retried_by_the_final_heal(setup):
    clock, tl, be, ctx = setup
    be.fail_heal = {"a"}
    plan = plan_of([fault("a", 1, 5)], be, tl, ctx, clock)
    plan.t0 = clock()
    plan.run()
    assert be.in_place                      # the scheduled heal failed
    left = plan.heal_all()
    assert left == {} and not be.in_place
    evs = [e for e in read_events(tl.path) if e["type"] == "fault"]
    assert [(e["phase"], e["landed"], e.get("final", False)) for e in evs] == [
        ("inject", True, False), ("heal", False, False), ("heal", True, True)]


def test_exception_in_the_body_still_heals_everything(setup):
    clock, tl, be, ctx = setup
    injected = threading.Event()
    orig = be.inject

    def inject(f, c):
        h = orig(f, c)
        injected.set()
        return h
    be.inject = inject
    real_plan = FaultPlan([fault("a", 0, 3600)], {"process": be}, tl, ctx=ctx, horizon=7200,
                          handle_sigterm=False)
    with pytest.raises(RuntimeError, match="load crashed"):
        with real_plan:
            assert injected.wait(5)
            raise RuntimeError("load crashed")
    assert not be.in_place and real_plan.leftovers == {}
    evs = [e for e in read_events(tl.path) if e["type"] == "fault"]
    assert [(e["phase"], e.get("final", False)) for e in evs] == [("inject", False), ("heal", True)]
    assert evs[1]["intended"] is None


def test_keyboard_interrupt_still_heals(setup):
    clock, tl, be, ctx = setup
    plan = FaultPlan([fault("a", 0, 3600)], {"process": be}, tl, ctx=ctx, horizon=7200, handle_sigterm=False)
    with pytest.raises(KeyboardInterrupt):
        with plan:
            for _ in range(200):
                if be.in_place:
                    break
                threading.Event().wait(0.01)
            raise KeyboardInterrupt
    assert not be.in_place and ("heal_all", "r1") == be.log[-1][:2]


def test_census_reports_what_heal_all_could_not_remove(setup):
    clock, tl, be, ctx = setup

    class Stubborn(RecordingBackend):
        def heal(self, h):
            raise FaultError("stuck")

        def heal_all(self, run_id):
            return []
    st = Stubborn(clock)
    plan = plan_of([fault("a", 1, 5)], st, tl, ctx, clock)
    plan.t0 = clock()
    plan.run()
    left = plan.heal_all()
    assert list(left) == ["process"] and len(left["process"]) == 1
    census = [e for e in read_events(tl.path) if e["type"] == "fault-census"][0]
    assert census["leftovers"] == left and any("stuck" in x for x in census["errors"])


def test_missing_backend_is_refused_before_anything_runs(setup):
    clock, tl, be, ctx = setup
    good, bad = fault("p", 0, 1), fault("n", 0, 1, backend="toxiproxy", target="a->b", kind="dependency-down")
    with pytest.raises(ValueError, match="no backend for toxiproxy"):
        FaultPlan([good, bad], {"process": be}, tl, ctx=ctx, horizon=10)
    assert be.log == [] and be.in_place == set()          # the fault that had a backend was not injected either
    assert not [e for e in read_events(tl.path) if e["type"] in ("fault", "fault-census")]


def test_events_are_json_lines(setup):
    clock, tl, be, ctx = setup
    plan = plan_of([fault("a", 0, 1)], be, tl, ctx, clock)
    plan.t0 = clock()
    plan.run()
    plan.heal_all()
    events = [json.loads(line) for line in tl.path.read_text().splitlines()]   # every line is one JSON object
    faults = [e for e in events if e["type"] == "fault"]
    assert [(e["phase"], e["name"]) for e in faults] == [("inject", "a"), ("heal", "a")]
    assert all(isinstance(e["t"], (int, float)) for e in events)
    assert [e["type"] for e in events][-1] == "fault-census"


# ------------------------------------------- a slow teardown: in-flight actions are waited for, every heal written

class VirtualThread:
    """The scheduler thread as heal_all sees it, its join timeouts counted in virtual seconds: what blocks it
    (``release``) ends after ``block_s`` of them, so a 45 s inject check takes no real 45 s."""

    def __init__(self, real, release, block_s):
        self.real, self.release, self.block_s, self.waited = real, release, block_s, 0.0

    def is_alive(self):
        return self.real.is_alive()

    def join(self, timeout=None):
        self.waited += float("inf") if timeout is None else timeout
        if self.waited >= self.block_s:
            self.release.set()
            self.real.join(10)


def test_heal_all_waits_for_a_heal_blocked_on_a_slow_inject_check(tmp_path):
    """SIGTERM just after a broker restart: the scheduled heal waits (up to its check bound) for the restart's
    landing check, for longer than 30 s; the final heal must wait for it, and its heal event must be written."""
    tl = Timeline(tmp_path / "timeline.jsonl")
    release, in_heal = threading.Event(), threading.Event()

    class SlowCheck(RecordingBackend):
        def verify(self, h):
            if not h.healed:
                in_heal.wait(5)
                release.wait(15)        # the inject's landing check: 45 (virtual) seconds
            return super().verify(h)
    be = SlowCheck(FakeClock())
    plan = FaultPlan([fault("restart", 0, 0.2)], {"process": be}, tl, ctx=FaultContext(run_id="r1"), horizon=10,
                     handle_sigterm=False)
    plan.start()
    real = plan._thread
    for _ in range(500):            # the scheduler is in the heal action, waiting for the inject's check
        if [op for op, *_ in be.log] == ["inject"] and plan.now() > 0.4:
            break
        threading.Event().wait(0.01)
    in_heal.set()
    plan._thread = VirtualThread(real, release, block_s=45)
    safety = threading.Timer(5, release.set)   # without the fix heal_all would otherwise hang on the pool
    safety.start()
    try:
        left = plan.heal_all()
    finally:
        safety.cancel()
        release.set()
        real.join(10)
    tl.close()
    evs = read_events(tl.path)
    faults = [(e["phase"], e["window"], e["landed"]) for e in evs if e["type"] == "fault"]
    assert sorted(faults) == [("heal", 0, True), ("inject", 0, True)]
    assert plan._thread.waited >= 45                       # waited past the old fixed 30 s
    kinds = [e["type"] for e in evs]
    assert kinds.index("fault-census") > max(i for i, e in enumerate(evs) if e["type"] == "fault")
    assert left == {} and not be.in_place and not any("shutdown" in x for x in plan.errors)


def test_a_heal_verified_after_the_pool_is_gone_still_writes_its_event(setup):
    """The last scheduled heal can come after the verification pool shut down: measured inline, still written."""
    clock, tl, be, ctx = setup
    plan = plan_of([fault("a", 1, 5)], be, tl, ctx, clock)
    plan.t0 = clock()
    plan._pool.shutdown(wait=True)
    plan.run()
    evs = [e for e in read_events(tl.path) if e["type"] == "fault"]
    assert [(e["phase"], e["landed"]) for e in evs] == [("inject", True), ("heal", True)]
    assert not plan.errors


def test_a_heal_hung_past_its_bound_is_taken_over_by_the_final_heal(tmp_path):
    tl = Timeline(tmp_path / "timeline.jsonl")
    entered, hang = threading.Event(), threading.Event()

    class HangingHeal(RecordingBackend):
        name = "toxiproxy"

        def heal(self, h):
            if threading.current_thread().name == "fault-plan":   # the scheduled heal's backend call hangs
                entered.set()
                hang.wait(5)
            super().heal(h)
    be = HangingHeal(FakeClock())
    f = FaultSpec(name="lat", kind="network-latency", target="a->b", backend="toxiproxy",
                  params={"latency_ms": 10, "probe": "none"}, schedule={"at": 0, "duration": 0.1})
    plan = FaultPlan([f], {"toxiproxy": be}, tl, ctx=FaultContext(run_id="r1"), horizon=10, handle_sigterm=False,
                     inject_check_timeout=0.2, action_timeout=0.3, idle_grace=0.2)
    plan.start()
    assert entered.wait(5)
    try:
        left = plan.heal_all()
    finally:
        hang.set()
        plan._thread.join(5)
    tl.close()
    heals = [e for e in read_events(tl.path) if e["type"] == "fault" and e["phase"] == "heal"]
    assert [(e["window"], e["landed"], e.get("final")) for e in heals] == [(0, True, True)]   # one, by the final heal
    assert left == {} and any("still busy" in x for x in plan.errors)
