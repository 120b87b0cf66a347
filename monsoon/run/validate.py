"""The one entry point that validates a run before anything starts: ``validate(stack, experiment, profile)``.

:func:`monsoon.spec.experiment.load_experiment` checks an experiment's structure and every rule that needs
only the spec. What needs the rest of monsoon happens here, still with file, line and key in every error:
each profile's load shape is built and its rate sampled, every check reference is resolved against the
check registry, every fault reference against its fault profile (and the stack's services). The CLI's
``validate``, the session, pytest's collection and calibration all come through here.
"""
from __future__ import annotations

from pathlib import Path

from monsoon.checks.registry import validate_check
from monsoon.faults.resolve import experiment_faults, resolve_fault
from monsoon.load.shapes import check_shape
from monsoon.spec.experiment import AUTO_STAND_INS, ExperimentSpec, load_experiment
from monsoon.spec.fault import FaultSpec
from monsoon.spec.stack import StackSpec
from monsoon.spec.yamlio import SpecError




def check_experiment(spec: ExperimentSpec) -> ExperimentSpec:
    """Every rule of an experiment that needs shapes, checks or fault profiles, for each of its profiles."""
    for profile, d in spec.profiles.items():   # build the shape per profile and sample its rate
        try:
            if spec.load.auto and spec.load.shape.kind == "python":
                # its rates may depend on the calibrated x1 (ctx.base_rate): refused here only when negative
                # whatever x1 is; the runner samples it again once x1 is known, before anything starts
                errs = []
                for stand_in in AUTO_STAND_INS:
                    try:
                        check_shape(spec.load.shape, stand_in, d, profile)
                    except ValueError as e:
                        errs.append(e)
                if len(errs) == len(AUTO_STAND_INS):
                    raise ValueError(f"{errs[0]} (whatever x1 base_rate: auto resolves to)")
            else:
                check_shape(spec.load.shape, spec.load.rate_for_checks, d, profile)
        except ValueError as e:
            raise spec.fail(("load", "shape"), f"profile {profile!r}: {e}") from None
    for i, c in enumerate(spec.checks):
        for profile in spec.profiles:
            if not c.applies(profile):
                continue
            try:
                validate_check(c.name, c.resolved(profile))
            except SpecError as e:
                raise spec.fail(("checks", i), f"{e.key}: no value for profile {profile!r}") from None
            except ValueError as e:
                raise spec.fail(("checks", i), str(e)) from None
    for profile in spec.profiles if spec.faults else ():
        seen: dict[str, int] = {}
        for i, ref in enumerate(spec.faults):
            f = resolve_fault(ref, profile, where=(spec.source, spec.line_of(("faults", i)), f"faults.{i}"))
            if f.name in seen:
                raise spec.fail(("faults", i), f"fault name {f.name!r} is also the name of faults.{seen[f.name]}: "
                                "give each fault a distinct name")
            seen[f.name] = i
    return spec


def load_checked(name_or_path: str | Path) -> ExperimentSpec:
    """An experiment file parsed and fully validated (every profile), as ``monsoon validate`` does it."""
    return check_experiment(load_experiment(name_or_path))


def validate(stack: StackSpec | None, exp: ExperimentSpec, profile: str | None = None) -> list[FaultSpec]:
    """Everything a run of ``exp`` on ``stack`` in ``profile`` needs, checked before anything starts.

    Raises SpecError (file, line, key) on the first problem; returns the experiment's faults resolved for
    the profile and the stack (empty without a stack or a profile)."""
    check_experiment(exp)
    if profile is None:
        return []
    exp.durations(profile)   # the experiment has this profile
    if stack is None:
        return []
    unknown = sorted(set(exp.env) - set(stack.services))
    if unknown:
        raise exp.fail(("env",), f"no service {', '.join(unknown)} in stack {stack.name!r} "
                       f"(it has: {', '.join(stack.services)})")
    return experiment_faults(exp, profile, stack)   # a bad fault fails here
