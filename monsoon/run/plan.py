"""The plan of one run: an experiment validated and resolved once, for one stack and one profile.

:func:`plan_run` checks everything a run needs before anything starts (through
:func:`monsoon.run.validate.validate`) and returns a frozen :class:`RunPlan`: the faults resolved, the checks
the run judges (the implied ones included) and the registry that judges them. :func:`settle_x1` then gives x1
(``base_rate: auto`` calibrated, or a fixed rate's saved capacity) as a new plan. The runner reads the plan;
nothing downstream resolves anything again.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from monsoon.checks.registry import BUILT_IN, CheckRegistry
from monsoon.load.shapes import LoadShape, build_shape, check_shape
from monsoon.observe.progress import Progress
from monsoon.run.calibrate import (calibration_dir, fill_burst, pacing_warning, resolve_experiment, saved_capacity,
                                   x1_line)
from monsoon.run.validate import validate
from monsoon.spec.experiment import ExperimentSpec
from monsoon.spec.fault import FaultSpec
from monsoon.spec.shape import Durations
from monsoon.spec.stack import StackSpec
from monsoon.spec.yamlio import SpecError

__all__ = ["CalibrationFailed", "RunPlan", "plan_run", "run_checks", "settle_x1"]


class CalibrationFailed(Exception):
    """``base_rate: auto`` could not be settled: the run does not run (verdict unknown). ``cause``: why."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


@dataclass(frozen=True)
class RunPlan:
    """One run, validated and resolved: what the runner, the dry run and the report read."""
    stack: StackSpec
    exp: ExperimentSpec                           # base_rate a number once :func:`settle_x1` has run
    profile: str
    faults: tuple[FaultSpec, ...] = ()
    checks: tuple[tuple[str, dict[str, Any]], ...] = ()   # what the run judges, implied checks included
    registry: CheckRegistry = BUILT_IN
    base_rate: dict | None = None                 # how x1 was resolved (monsoon.run.calibrate), when it was

    @property
    def durations(self) -> Durations:
        return self.exp.durations(self.profile)

    @property
    def label(self) -> str:
        return f"{self.stack.name}/{self.exp.name}"

    def shape(self) -> LoadShape:
        """The load shape for this profile (x1 must be a number: after :func:`settle_x1` under ``auto``)."""
        return build_shape(self.exp.load.shape, float(self.exp.load.base_rate), self.durations, self.profile)


def run_checks(exp: ExperimentSpec, profile: str, faults: tuple | list) -> tuple[tuple[str, dict[str, Any]], ...]:
    """The checks a run judges: the experiment's for ``profile``, then the ones every run needs to be honest
    (a fault that did not land, a death that is not an OOM, a load that fell behind must show in the verdict)."""
    checks = [(c.name, c.resolved(profile)) for c in exp.checks if c.applies(profile)]
    names = {n for n, _ in checks}
    if faults and "faults_landed" not in names:
        checks.append(("faults_landed", {}))
    if "no_oom" in names and "no_unexpected_exit" not in names:
        checks.append(("no_unexpected_exit", {}))
    if "load_valid" not in names:
        checks.append(("load_valid", {}))
    return tuple(checks)


def plan_run(stack: StackSpec, exp: ExperimentSpec, profile: str, *, force: bool = False,
             registry: CheckRegistry = BUILT_IN) -> RunPlan:
    """Validate ``exp`` on ``stack`` in ``profile`` (SpecError with file, line, key on the first problem;
    ``force`` lifts the multiplier ceiling) and resolve it into a :class:`RunPlan`. Starts nothing."""
    faults = tuple(validate(stack, exp, profile, force=force, registry=registry))
    return RunPlan(stack, exp, profile, faults, run_checks(exp, profile, faults), registry)


def settle_x1(plan: RunPlan, out_dir: Path, *, run_id: str, progress: Progress = lambda s: None,
              stop: threading.Event | None = None, dry_run: bool = False,
              cal_dir: Path | None = None) -> RunPlan:
    """The plan with x1 settled. ``base_rate: auto``: x1 = the fraction of the calibrated capacity, calibrating
    first when there is no usable calibration (:class:`CalibrationFailed` when it cannot; a python shape is sampled again
    with the real x1: SpecError), and a burst with ``fill`` is sized to the stack's memory (:func:`size_fill`).
    A fixed x1 carries its stack's saved capacity when there is a usable calibration (not in a dry run).
    ``cal_dir`` default: :func:`monsoon.run.calibrate.calibration_dir` (the user's cache)."""
    exp, stack, profile = plan.exp, plan.stack, plan.profile
    out_dir = Path(out_dir)
    info: dict | None
    if exp.load.auto:
        try:
            exp, info = resolve_experiment(stack, exp, profile, out_dir, run_id=run_id, progress=progress,
                                           stop=stop, dry_run=dry_run, cal_dir=cal_dir)
        except Exception as e:   # could not calibrate
            raise CalibrationFailed(e) from e
        if exp.load.shape.kind == "python" and not dry_run:
            try:   # its rates depend on the calibrated x1: sampled now, before anything starts
                check_shape(exp.load.shape, exp.load.base_rate, exp.durations(profile), profile)
            except ValueError as e:
                raise SpecError(exp.source, None, "load.shape",
                                f"with base_rate: auto = {exp.load.base_rate:g} msg/s: {e}") from None
        if not dry_run:
            exp, info = size_fill(exp, stack, profile, info)
            peak = float(exp.load.base_rate) * float(exp.load.shape.multiplier or 1)
            warn = pacing_warning(peak, info.get("generator_us_per_msg"), exp.load.engine or "python")
            if warn:
                info = {**info, "pacing_warning": warn}
                progress(f"[{stack.name}/{exp.name}] WARNING before the load: {warn}")
        return replace(plan, exp=exp, base_rate=info)
    if dry_run:
        return plan
    info = saved_capacity(stack, float(exp.load.base_rate), profile=profile,
                          cal_dir=Path(cal_dir) if cal_dir is not None else calibration_dir())
    return replace(plan, base_rate=info)


def size_fill(exp: ExperimentSpec, stack: StackSpec, profile: str, info: dict) -> tuple[ExperimentSpec, dict]:
    """A burst with ``fill`` (its profile) on a stack that states ``observe.fills_at``: the burst lengthened so
    that its backlog passes what fills the stack's memory ``fill`` times over at the calibrated x1
    (:func:`monsoon.run.calibrate.fill_burst`); how, in ``info``. Anything else: unchanged."""
    d = exp.durations(profile)
    fills_at = stack.observe.fills_at_for(profile)
    if d.fill is None or fills_at is None or exp.load.shape.kind != "burst":
        return exp, info
    try:
        burst_s, growth = fill_burst(d.burst, fill=d.fill, fills_at=fills_at,
                                     multiplier=float(exp.load.shape.multiplier or 1), fraction=float(info["fraction"]),
                                     capacity=float(info["capacity_msg_s"]), factor=float(info.get("factor") or 1.25))
    except ValueError as e:
        raise exp.fail(("profiles", profile, "fill"), str(e)) from None
    info = {**info, "burst_s": burst_s, "fills_at": fills_at, "fill": d.fill, "growth_msg_s": round(growth, 1)}
    info["x1"] = x1_line(info)
    profiles: dict[Any, Durations] = dict(exp.profiles)
    profiles[profile] = d.model_copy(update={"burst": burst_s})
    return exp.model_copy(update={"profiles": profiles}), info

