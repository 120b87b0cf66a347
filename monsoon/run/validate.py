"""Validation of a run before anything starts: ``validate(stack, experiment, profile)``.

:func:`monsoon.spec.experiment.load_experiment` checks an experiment's structure and every rule that needs only
the spec; what needs the rest of monsoon is here, still with file, line and key in every error: each profile's
shape sampled, check references resolved against a check registry, fault references against their profiles and
the stack, and this machine's limits. :func:`monsoon.run.plan.plan_run` builds a run's plan on top of it.
"""
from __future__ import annotations

import resource
from pathlib import Path

from monsoon.checks.registry import BUILT_IN, CheckRegistry
from monsoon.faults.resolve import ResolvedFault, fit_faults, resolve_entry
from monsoon.load.shapes import check_shape
from monsoon.spec.experiment import AUTO_STAND_INS, ExperimentSpec, check_fits, load_experiment
from monsoon.spec.fault import FaultSpec
from monsoon.spec.stack import StackSpec
from monsoon.spec.yamlio import SpecError
from monsoon import options as opt


def check_experiment(spec: ExperimentSpec, *, force: bool = False, registry: CheckRegistry = BUILT_IN) -> ExperimentSpec:
    """Every rule of an experiment that needs shapes, checks (known to ``registry``) or fault profiles, and the
    limits of this machine and of each profile (:func:`limits`; ``force`` lifts the multiplier ceiling), for
    each of its profiles."""
    _check_experiment(spec, force=force, registry=registry)
    return spec


def _check_experiment(spec: ExperimentSpec, *, force: bool, registry: CheckRegistry) -> dict[str, list[ResolvedFault]]:
    """:func:`check_experiment`, returning each profile's faults as resolved on the way (no profile: no faults)."""
    peaks: dict[str, float] = {}
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
                clash = spec.load.shape.duplicate_phase(d)   # phase names depend on the profile's windows
                if clash:
                    raise ValueError(clash)
                peaks[profile] = check_shape(spec.load.shape, spec.load.rate_for_checks, d, profile)
        except ValueError as e:
            raise spec.fail(("load", "shape"), f"profile {profile!r}: {e}") from None
    for i, c in enumerate(spec.checks):
        for profile in spec.profiles:
            if not c.applies(profile):
                continue
            try:
                registry.validate(c.name, c.resolved(profile))
            except SpecError as e:
                raise spec.fail(("checks", i), f"{e.key}: no value for profile {profile!r}") from None
            except ValueError as e:
                raise spec.fail(("checks", i), str(e)) from None
    resolved: dict[str, list[ResolvedFault]] = {}
    for profile in spec.profiles if spec.faults else ():
        seen: dict[str, int] = {}
        resolved[profile] = []
        for i in range(len(spec.faults)):
            r = resolve_entry(spec, i, profile)
            if r.spec.name in seen:
                raise spec.fail(("faults", i), f"fault name {r.spec.name!r} is also the name of "
                                f"faults.{seen[r.spec.name]}: give each fault a distinct name")
            seen[r.spec.name] = i
            resolved[profile].append(r)
    for profile in spec.profiles:
        limits(spec, profile, force=force, peak=peaks.get(profile))
    return resolved


def load_checked(name_or_path: str | Path, *, force: bool = False,
                 registry: CheckRegistry = BUILT_IN) -> ExperimentSpec:
    """An experiment file parsed and fully validated (every profile), as ``monsoon validate`` does it."""
    return check_experiment(load_experiment(name_or_path), force=force, registry=registry)


# Limits known up front: what this machine and a profile can run. An experiment past one is refused at
# validation, naming the limit; the multiplier ceiling alone is a judgement call that --monsoon-force lifts.
MULTIPLIER_CEILING = 100.0                       # x1 times more than this is a typo (1e9) more often than a test
PROFILE_CEILING_S = {"quick": 3600.0, "nightly": 86400.0, "full": 7 * 86400.0}   # a profile's whole load
# msg/s one generator process (a Job's pod for kubernetes) paces here (bench-load)
ENGINE_RATE = {"python": 25_000.0, "native": 100_000.0, "kubernetes": 100_000.0}
FD_RESERVE = 256                                 # descriptors the generator process keeps for everything else


def fd_limit() -> int:
    """The open-file limit the load generator can raise itself to (the hard limit)."""
    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def port_range() -> int:
    """Ephemeral ports: connections one source address can open to one host:port."""
    try:
        lo, hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return hi - lo + 1
    except (OSError, ValueError):
        return 28_232   # Linux's default range


def limits(exp: ExperimentSpec, profile: str, *, force: bool = False, peak: float | None = None) -> None:
    """Refuse, naming the limit, what this machine or the profile cannot run (SpecError with file, line, key).
    ``peak``: the profile's highest rate, as the shape check sampled it (None under base_rate: auto)."""
    load, d = exp.load, exp.durations(profile)
    shape = load.shape
    mults = [m for m in (shape.multiplier, shape.to, shape.from_) if m is not None]
    mults += [s.multiplier for s in shape.stages or () if s.multiplier is not None]
    mults += [s.multiplier for s in shape.steps or ()]
    if not force and mults and max(mults) > MULTIPLIER_CEILING:
        raise exp.fail(("load", "shape"), f"a multiplier of x{max(mults):g} is above monsoon's ceiling of "
                       f"x{MULTIPLIER_CEILING:g}; if you mean it, run with {opt.FORCE} (monsoon validate --force)")
    ceiling = PROFILE_CEILING_S[profile]
    if d.total > ceiling:
        raise exp.fail(("profiles", profile), f"the {profile} load lasts {d.total:,.0f} s, past the {profile} "
                       f"profile's limit of {ceiling:,.0f} s ({ceiling / 3600:g} h)")
    if not load.auto and peak is not None:
        per_process = load.workers if load.engine in ("native", "kubernetes") else 1
        cap = ENGINE_RATE[load.engine] * per_process
        if peak > cap:
            hint = ("use engine: native with more workers" if load.engine == "native" else
                    "use engine: native (about 100,000 msg/s per worker)")
            if load.rate_for_checks > cap:   # x1 alone is past it: the rate is what to change, not the shape
                raise exp.fail(("load", "base_rate"), f"x1 is {load.rate_for_checks:,.0f} msg/s, past what "
                               f"{per_process} {load.engine} generator process(es) can pace here ({cap:,.0f} "
                               f"msg/s): {hint}")
            raise exp.fail(("load", "shape"), f"the {profile} profile peaks at {peak:,.0f} msg/s, past what "
                           f"{per_process} {load.engine} generator process(es) can pace here ({cap:,.0f} msg/s): {hint}")
    if load.engine == "python":
        fds, ports = fd_limit() - FD_RESERVE, port_range()
        if load.devices > min(fds, ports):
            which = (f"the open-file limit ({fd_limit():,} less {FD_RESERVE} reserved)" if fds <= ports else
                     f"the {ports:,} ephemeral ports one source address has")
            raise exp.fail(("load", "devices"), f"{load.devices:,} devices is more connections than one python "
                           f"generator can hold here: {which}; use engine: native with workers (each spreads its "
                           "devices over 127.0.0.x source addresses)")


def validate(stack: StackSpec | None, exp: ExperimentSpec, profile: str | None = None, *,
             force: bool = False, registry: CheckRegistry = BUILT_IN) -> list[FaultSpec]:
    """Everything a run of ``exp`` on ``stack`` in ``profile`` needs, checked before anything starts.

    Raises SpecError (file, line, key) on the first problem; returns the experiment's faults resolved for
    the profile and the stack (empty without a stack or a profile). ``force`` lifts the multiplier ceiling."""
    resolved = _check_experiment(exp, force=force, registry=registry)
    if profile is None:
        return []
    exp.durations(profile)   # the experiment has this profile
    if stack is None:
        return []
    unknown = sorted(set(exp.env) - set(stack.services))
    if unknown:
        raise exp.fail(("env",), f"no service {', '.join(unknown)} in stack {stack.name!r} "
                       f"(it has: {', '.join(stack.services)})")
    unknown = sorted(set(exp.restart) - set(stack.services))
    if unknown:
        raise exp.fail(("restart",), f"no service {', '.join(unknown)} in stack {stack.name!r} "
                       f"(it has: {', '.join(stack.services)})")
    if exp.load.transport is not None and exp.load.transport not in stack.devices.offers():
        raise exp.fail(("load", "transport"), f"stack {stack.name!r} offers no {exp.load.transport} devices (it has: "
                       f"{', '.join(stack.devices.offers())}; others go under its devices.endpoints)")
    faults = fit_faults(resolved.get(profile, []), stack)   # a fault the stack cannot take fails here
    needs_toxiproxy(resolved.get(profile, []), stack)
    misfits = check_fits(exp, stack)   # a check that needs a signal the stack does not observe
    if misfits:
        raise misfits[0]
    return faults


def needs_toxiproxy(resolved: list[ResolvedFault], stack: StackSpec) -> None:
    """A Toxiproxy fault on a stack without ``chaos.toxiproxy`` (its proxies' API) is refused here, naming the
    experiment's ``faults.N`` and the stack's file, not mid-run when the fault backends are built."""
    if stack.chaos.toxiproxy:
        return
    for r in resolved:
        if r.spec.backend == "toxiproxy" and r.where is not None:
            file, line, key = r.where
            raise SpecError(file, line, key, f"fault {r.spec.name!r} ({r.spec.kind}) goes through Toxiproxy, but "
                            f"stack {stack.name!r} ({stack.source or 'its file'}) has no chaos.toxiproxy: use a stack "
                            "that routes its hops through Toxiproxy and names its API there")
