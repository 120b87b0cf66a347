"""The one course every run takes: an experiment, a size sweep, a request mix and a calibration.

Each is a :class:`Course` through the same named phases, reported to one place (:meth:`Course.enter`: where a
signal would find the run, its checklist says, and one ``op: course`` event on the timeline), as Chaos
Toolkit's runner reports each phase of an experiment to one event handler:

========================  =====================================================================================
``starting the stack``    :meth:`Course.start_stack`: the stack, its stop shielded from further signals
                          (:class:`~monsoon.run.shield.TeardownShield`) on every exit path
``load``                  the fleet (:class:`~monsoon.run.harness.LoadHarness`: preflight, devices, collectors,
                          the sampler) and its load; a sweep or a mix ramps it (:func:`monsoon.run.calibrate.ramp`)
``drain``                 the backlog drains (an experiment's :class:`~monsoon.run.drain.Drain`; a sweep's
                          after each size, before the next size's ``load``)
``read-back``             storage is read back (an experiment's ``stored`` dataset)
``teardown``              every service but storage stops; storage is read again; the stack stops
``checks``                :meth:`Course.judge`: the plan's checks over the run directory (after the timeline
                          closes: not on it)
========================  =====================================================================================

:meth:`Course.guarded` is the body every course runs in: an exception becomes the run's ``error`` (on the
timeline with its traceback, said on the progress line) and does not crash the session; a signal either
becomes the run's record (``on_interrupt``) or goes on up (a calibration's). Each course then writes its own
record (``result.json``, ``sweep.json``, ``mix.json``, ``calibration.json``) and report.
"""
from __future__ import annotations

import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from monsoon.checks.base import Verdict
from monsoon.checks.registry import CheckRegistry
from monsoon.observe.progress import Progress
from monsoon.run.harness import StackEvents
from monsoon.run.shield import TeardownShield
from monsoon.spec.stack import StackSpec
from monsoon.stack.supervisor import Stack
from monsoon.timeline.events import OP, OP_COURSE, OP_ERROR, OP_INTERRUPTED
from monsoon.timeline.store import Timeline

#: the stages of a run's course, in order (their names are the ``stage`` of an interrupted run's record)
START, LOAD, DRAIN, READ_BACK, TEARDOWN, CHECKS = ("starting the stack", "load", "drain", "read-back", "teardown",
                                                  "checks")
STAGES = (START, LOAD, DRAIN, READ_BACK, TEARDOWN, CHECKS)


class Course:
    """One run's course on its open timeline ``tl``: the stage it is in, the stack's events (exits and restarts
    of ``watch``, or of any service, said and counted: :class:`StackEvents`), the teardown shield and the error
    that stopped it, if any."""

    def __init__(self, tl: Timeline, label: str, progress: Progress, *, watch: str | None = None):
        self.tl, self.label, self.progress = tl, label, progress
        self.events = StackEvents(tl, label, progress, watch=watch)
        self.shield = TeardownShield(progress)
        self.where: dict[str, Any] = {"stage": START}   # where a signal would find the run
        self.error: str | None = None

    def enter(self, stage: str) -> None:
        """The run enters ``stage`` (one of :data:`STAGES`): the one place a phase is reported."""
        self.where = {"stage": stage}
        if stage != CHECKS:     # the checks run after the timeline closes
            self.tl.add(OP, op=OP_COURSE, stage=stage)

    def start_stack(self, spec: StackSpec, out_dir: Path, *, run_id: str, profile: str, detail: str = "",
                    env: dict[str, dict[str, str]] | None = None,
                    restart: Mapping[str, str] | None = None) -> Any:
        """The stack, to enter with ``with``: started on entering, stopped on every exit, its stop run to the end
        whatever signals arrive meanwhile. ``detail``: the rest of the progress line that says so."""
        self.enter(START)
        self.progress(f"[{self.label}] starting stack {spec.name}{detail}")
        return self.shield.around_exit(Stack(spec, out_dir, run_id=run_id, on_event=self.events, profile=profile,
                                             env_overrides=env, restart_overrides=restart))

    @contextmanager
    def guarded(self, *, on_interrupt: Callable[[KeyboardInterrupt], None] | None = None,
                cleanup: Callable[[], None] | None = None) -> Iterator["Course"]:
        """The course's body. An exception: the run failed to run (``error``, on the timeline with its
        traceback, and said), the session goes on. A signal: ``on_interrupt`` (None: it goes on up).
        ``cleanup`` runs last on every path."""
        try:
            yield self
        except Exception as e:  # the run failed to run: recorded as its error, not a crash of the session
            self.error = f"{type(e).__name__}: {e}"
            self.tl.add(OP, op=OP_ERROR, error=self.error, traceback=traceback.format_exc())
            self.progress(f"[{self.label}] ERROR {self.error}")
        except KeyboardInterrupt as e:
            if on_interrupt is None:
                raise
            on_interrupt(e)
        finally:
            if cleanup is not None:
                cleanup()

    def interrupted(self, e: KeyboardInterrupt) -> None:
        """A ramp's ``on_interrupt``: torn down already, its record says ``error: interrupted``."""
        self.error = "interrupted"
        self.tl.add(OP, op=OP_INTERRUPTED)

    def judge(self, registry: CheckRegistry, out_dir: Path,
              checks: Sequence[tuple[str, dict[str, Any]]]) -> list[Verdict]:
        """The checks' verdicts over the run directory."""
        self.where = {"stage": CHECKS}
        return registry.evaluate(out_dir, list(checks))
