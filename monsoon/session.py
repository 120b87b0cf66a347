"""A monsoon session: one run id, one run directory, many experiment results.

Each run is planned once (:func:`monsoon.run.plan.plan_run`: both specs validated, faults and checks resolved
against the session's check registry), x1 settled (:func:`monsoon.run.plan.settle_x1`: ``base_rate: auto``
calibrated when needed), and only then the plan handed to the runner.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable, TextIO, TypeVar

from monsoon.analysis import write_result, write_results
from monsoon.checks.registry import CheckRegistry
from monsoon.faults.resolve import describe
from monsoon.observe.progress import Progress
from monsoon import settings
from monsoon.report.result import ExperimentResult, RunInterrupted, StackUnavailable
from monsoon.report.sweep import SweepResult
from monsoon.run.experiment import RunContext, run_experiment
from monsoon.run.plan import CalibrationFailed, RunPlan, plan_run, settle_x1
from monsoon.run.sweep import describe_sweep, plan_sweep, run_sweep
from monsoon.run.mix import describe_mix, plan_mix, run_mix
from monsoon.report.mix import MixResult
from monsoon.rundir import experiment_dir_name, new_run_id, point_latest
from monsoon.spec.experiment import ExperimentSpec, load_experiment
from monsoon.spec.stack import StackSpec, load_stack
from monsoon.stack.ports import StackError
from monsoon.stack.supervisor import Stack

_Ramp = TypeVar("_Ramp", SweepResult, MixResult)   # what MonsoonSession._ramp returns


def run_one(stack_spec: StackSpec, exp: ExperimentSpec, profile: str, out_dir: Path, *, run_id: str,
            progress: Progress = lambda s: None, progress_every: float = 5.0, stop: threading.Event | None = None,
            dry_run: bool = False, calibration_dir: Path | None = None, live: TextIO | None = None,
            plan: RunPlan | None = None) -> ExperimentResult:
    """Plan (unless ``plan`` is given: :func:`plan_run` already ran), settle x1, then run one experiment
    (``dry_run``: print what would be done, start nothing). A bad spec raises SpecError before anything
    starts; a calibration that fails gives a result with an error (verdict unknown). See
    :func:`monsoon.run.experiment.run_experiment` for the rest."""
    out_dir = Path(out_dir)
    if plan is None:
        plan = plan_run(stack_spec, exp, profile)   # a bad fault, env or check fails here, before anything starts
    try:
        plan = settle_x1(plan, out_dir, run_id=run_id, progress=progress, stop=stop, dry_run=dry_run,
                         cal_dir=calibration_dir)
    except CalibrationFailed as e:   # could not calibrate: the run did not run (verdict unknown)
        result = ExperimentResult(stack_spec.name, exp.name, profile, out_dir,
                                  error=f"{type(e.cause).__name__}: {e.cause}")
        progress(f"[{stack_spec.name}/{exp.name}] ERROR {result.error}")
        out_dir.mkdir(parents=True, exist_ok=True)
        write_result(out_dir, result.to_dict())
        return result
    if dry_run:
        result = ExperimentResult(plan.stack.name, plan.exp.name, profile, out_dir, base_rate=plan.base_rate)
        result.dry_run = describe(plan.stack, plan.exp, profile, list(plan.faults), run_id,
                                  [name for name, _ in plan.checks])
        if plan.base_rate:
            result.dry_run = result.dry_run.replace(f"x1 = {plan.exp.load.base_rate:g} msg/s",
                                                    plan.base_rate["describe"])
        progress(result.dry_run)
        return result
    return run_experiment(RunContext(plan, out_dir, run_id, progress=progress, progress_every=progress_every,
                                     stop=stop or threading.Event(), live=live))


class MonsoonSession:
    def __init__(self, *, profile: str = "quick", runs_dir: Path | None = None, run_id: str | None = None,
                 progress: Callable[[str], None] = print, dry_run: bool = False, live: TextIO | None = None,
                 on_result: Callable[[ExperimentResult, "MonsoonSession"], None] | None = None, force: bool = False,
                 checks: CheckRegistry | None = None):
        self.profile = profile
        self.runs_dir = settings.runs_dir(runs_dir)
        self.run_id = run_id or new_run_id()
        self.progress = progress
        self.results: list[ExperimentResult] = []
        self.stop = threading.Event()
        self.dry_run = dry_run
        self.live = live      # a terminal for the live load panel (None: plain progress lines)
        self.on_result = on_result   # sees each result before the report is written (pytest_monsoon_result)
        self.force = force           # lift the multiplier ceiling (--monsoon-force)
        self.interrupted: dict | None = None   # the signal that stopped the session: stack, experiment, signal, t
        self.checks = checks if checks is not None else CheckRegistry()   # built-in + pytest_monsoon_add_checks
        self.no_history = False      # --monsoon-no-history: results are not recorded in the run history

    @property
    def run_dir(self) -> Path:
        return self.runs_dir / self.run_id

    def run(self, stack: str, experiment: str, *, skip_unavailable: bool = False) -> ExperimentResult:
        """Validate both specs, then run the experiment against a fresh stack. ``skip_unavailable``: a stack
        whose ``requires`` are missing (a part set-up cannot fetch, like ThingsBoard's jar) raises
        :class:`StackUnavailable` (a skip, in one line) instead of giving an ``unknown`` result."""
        plan = plan_run(load_stack(stack), load_experiment(experiment), self.profile, force=self.force,
                        registry=self.checks)   # fail before starting anything
        stack_spec, exp = plan.stack, plan.exp
        if skip_unavailable:
            self._preflight(stack_spec)
        if self.dry_run:
            return run_one(stack_spec, exp, self.profile, self.run_dir / experiment_dir_name(stack_spec.name, exp.name),
                           run_id=self.run_id, progress=self.progress, dry_run=True, plan=plan)
        out = self._new_out(stack_spec, exp)
        try:
            try:
                result = run_one(stack_spec, exp, self.profile, out, run_id=self.run_id,
                                 progress=self.progress, stop=self.stop, live=self.live, plan=plan)
            except RunInterrupted as e:   # torn down already; its result (judged over what exists) is reported
                self.interrupted = {"stack": stack_spec.name, "experiment": exp.name, **e.interruption}
                self._add(e.result)
                raise
            self._add(result)
            return result
        finally:  # an interrupted run still leaves a report of what finished, and of what it cut short
            self.write_report()

    def sweep(self, stack: str, experiment: str, *, sizes: tuple[int, ...] | None = None,
              skip_unavailable: bool = False) -> SweepResult:
        """A size sweep (``load.payload.sizes``, :mod:`monsoon.run.sweep`) against a fresh stack: per size, the
        platform's sustained capacity beside its transport's. Its ``sweep.json``, checklist and report go
        under ``<run dir>/<stack>--<experiment>/``; its result joins the session's summary and checklist."""
        stack_spec = load_stack(stack)
        exp = plan_sweep(stack_spec, load_experiment(experiment), self.profile, sizes=sizes, force=self.force,
                         registry=self.checks)   # fail before starting anything
        if skip_unavailable:
            self._preflight(stack_spec)
        return self._ramp(stack_spec, exp, "size sweep", describe_sweep, run_sweep, SweepResult)

    def mix(self, stack: str, experiment: str, *, skip_unavailable: bool = False) -> MixResult:
        """A request mix (``load.mix``, :mod:`monsoon.run.mix`) against a fresh stack: reads, searches, writes and
        modifications ramped until a step is not kept up, the capacity and what stopped it. Its ``mix.json``,
        checklist and report go under ``<run dir>/<stack>--<experiment>/``; its result joins the session's.
        ``skip_unavailable``: as for :meth:`run`."""
        stack_spec = load_stack(stack)
        exp = plan_mix(stack_spec, load_experiment(experiment), self.profile, force=self.force, registry=self.checks)
        if skip_unavailable:
            self._preflight(stack_spec)
        return self._ramp(stack_spec, exp, "request mix", describe_mix, run_mix, MixResult)

    def _ramp(self, stack_spec: StackSpec, exp: ExperimentSpec, what: str, describer: Callable[..., str],
              runner: Callable[..., dict], result_cls: type[_Ramp]) -> _Ramp:
        """The course a size sweep and a request mix share: a dry run describes it; otherwise it runs in its own
        directory, its result joins the session's, and an interrupted ramp (torn down already) stops the session."""
        if self.dry_run:
            result = result_cls(stack_spec.name, exp.name, self.profile,
                                self.run_dir / experiment_dir_name(stack_spec.name, exp.name),
                                dry_run=describer(stack_spec, exp, self.profile, self.run_id))
            self.progress(result.dry_run or "")
            return result
        out = self._new_out(stack_spec, exp)
        try:
            rec = runner(stack_spec, exp, out, run_id=self.run_id, profile=self.profile, progress=self.progress,
                         stop=self.stop, registry=self.checks)
            result = result_cls.from_record(rec, out, self.profile)
            self._add(result)
            if rec.get("error") == "interrupted":   # torn down already: the session stops here
                raise KeyboardInterrupt(f"monsoon: the {what} {stack_spec.name}/{exp.name} was interrupted")
            return result
        finally:
            self.write_report()

    def _preflight(self, stack_spec: StackSpec) -> None:
        try:
            Stack(stack_spec, self.run_dir, run_id=self.run_id).preflight()
        except StackError as e:
            raise StackUnavailable(" ".join(str(e).split())) from None

    def _new_out(self, stack_spec: StackSpec, exp: ExperimentSpec) -> Path:
        """A fresh ``<run dir>/<stack>--<experiment>[-N]`` for a run (the run dir made, runs/latest at it)."""
        out = self.run_dir / experiment_dir_name(stack_spec.name, exp.name)
        n = 2
        while out.exists():
            out = self.run_dir / experiment_dir_name(stack_spec.name, exp.name, n)
            n += 1
        self.run_dir.mkdir(parents=True, exist_ok=True)
        point_latest(self.run_dir)
        return out

    def _add(self, result: ExperimentResult) -> None:
        self.results.append(result)
        if self.on_result is not None:
            self.on_result(result, self)

    def write_report(self) -> tuple[dict, str] | None:
        if not self.run_dir.exists():
            return None
        return write_results(self.run_dir, self.run_id, self.profile, [r.to_dict() for r in self.results],
                             interrupted=self.interrupted)
