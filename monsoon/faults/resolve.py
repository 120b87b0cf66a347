"""The experiment side of faults: resolve an experiment's ``faults:`` against a stack,
build the backends it needs, describe the plan (dry run), and heal every run.

The backends and the plan live in :mod:`monsoon.faults`; this module only glues
them to stacks, experiments and run directories.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from monsoon import settings
from monsoon.faults.base import FaultBackend, FaultError
from monsoon.faults.cgroup import CgroupBackend
from monsoon.faults.kube import KubeBackend, NamespaceNotAllowed, kernel_refusal, local_cluster, one_window, render, to_yaml
from monsoon.faults.litmus import LitmusBackend, refusal as litmus_refusal
from monsoon.faults.process import ProcessBackend
from monsoon.faults.toxiproxy import ToxiproxyBackend
from monsoon.spec.base import _resolve as _resolve_path
from monsoon.spec.experiment import ExperimentSpec, FaultRef
from monsoon.spec.fault import FaultSpec, check_target
from monsoon.spec.stack import StackSpec
from monsoon.spec.yamlio import LocatedDoc, SpecError, load_located, validate


KUBE_NAMESPACES_ENV = "MONSOON_KUBE_NAMESPACES"


@dataclass(frozen=True)
class ResolvedFault:
    """A fault of an experiment resolved for one profile, with what locating a later error in it needs."""
    ref: FaultRef
    spec: FaultSpec
    path: Path                       # the fault profile's file
    target_line: int | None          # the line of ``target`` there
    overridden: frozenset[tuple]     # keys the experiment's entry overrides (("params", "x"), ("target",), ...)
    where: tuple[str | Path, int | None, str] | None = None   # the experiment's entry: file, line, key
    line_in_entry: Callable[[tuple], int | None] | None = None


def _locate(e: SpecError, profile: str, overridden: set[tuple] | frozenset[tuple],
            where: tuple[str | Path, int | None, str] | None,
            line_in_entry: Callable[[tuple], int | None] | None) -> SpecError:
    """An error of fault profile ``profile``, moved to the experiment's entry ``where``: at the override's line
    when the experiment's value is the wrong one, else at the entry, naming the fault profile."""
    if where is None:
        return e
    file, line, key = where
    parts = tuple(e.key.split(".")) if e.key else ()
    if parts and (parts[:1] in overridden or parts[:2] in overridden):   # the experiment's value is wrong
        at = line_in_entry(parts) if line_in_entry is not None else None
        return SpecError(file, at or line, f"{key}.{e.key}", f"{e.message} (overrides fault profile {profile!r})")
    return SpecError(file, line, key, f"fault profile {profile!r}: {e}")


def _resolve(ref: FaultRef, profile: str, where: tuple[str | Path, int | None, str] | None,
             line_in_entry: Callable[[tuple], int | None] | None) -> ResolvedFault:
    overridden: set[tuple] = set()
    try:
        path = _resolve_path("fault profile", ref.profile)
        doc = load_located(path)
        if isinstance(doc.data, dict):
            validate(LocatedDoc(doc.path, {**copy.deepcopy(doc.data), "source": str(path)}, doc.lines), FaultSpec)
            ov = ref.overrides(profile)
            for key in ("params", "schedule"):
                if key in ov:
                    overridden |= {(key, k) for k in ov[key]}
                    doc.data[key] = {**(doc.data.get(key) or {}), **ov.pop(key)}
            overridden |= {(k,) for k in ov}
            doc.data.update(ov)
            doc.data.setdefault("source", str(path))
        spec = validate(doc, FaultSpec)
    except SpecError as e:
        raise _locate(e, ref.profile, overridden, where, line_in_entry) from None
    return ResolvedFault(ref, spec, path, doc.line_of(("target",)), frozenset(overridden), where, line_in_entry)


def _fit_target(r: ResolvedFault, services: Iterable[str]) -> None:
    """The fault's target names services of the stack (SpecError located like any error of the fault)."""
    try:
        check_target(r.spec, set(services), doc_path=r.path, line=r.target_line)
    except SpecError as e:
        raise _locate(e, r.ref.profile, r.overridden, r.where, r.line_in_entry) from None


def resolve_fault(ref: FaultRef, profile: str, *, services: Iterable[str] | None = None,
                  where: tuple[str | Path, int | None, str] | None = None,
                  line_in_entry: Callable[[tuple], int | None] | None = None) -> FaultSpec:
    """The fault profile ``ref.profile`` with the experiment's overrides for ``profile``, validated.

    The profile is first validated on its own, as ``monsoon validate`` sees it (an override does not hide a
    broken value of the profile). ``where`` (file, line, key) of the experiment's entry: an error in a value the
    experiment overrides is reported at that override's line (``line_in_entry(("schedule", "duration"))``, the
    line inside the entry), errors of the profile itself at the profile's line.
    """
    r = _resolve(ref, profile, where, line_in_entry)
    if services is not None:
        _fit_target(r, services)
    return r.spec


def resolve_entry(exp: ExperimentSpec, i: int, profile: str) -> ResolvedFault:
    """The experiment's ``faults.i`` resolved for one profile (errors at that entry, or at its override's line)."""
    def line_in_entry(p: tuple) -> int | None:
        return exp.line_of(("faults", i, *p))
    return _resolve(exp.faults[i], profile, (exp.source, exp.line_of(("faults", i)), f"faults.{i}"), line_in_entry)


def resolve_faults(exp: ExperimentSpec, profile: str) -> list[ResolvedFault]:
    """Every fault of an experiment resolved for one profile (errors at the experiment's ``faults.N``)."""
    return [resolve_entry(exp, i, profile) for i in range(len(exp.faults))]


def fit_faults(resolved: list[ResolvedFault], stack: StackSpec | None = None, *,
               namespaces: Iterable[str] | None = None) -> list[FaultSpec]:
    """Faults already resolved (:func:`resolve_faults`) checked against a stack's services when given.

    A Kubernetes fault (chaos-mesh, litmus) is rendered here once, so a namespace that is not on
    ``MONSOON_KUBE_NAMESPACES`` (or ``namespaces``) or an object its backend cannot express fails now,
    naming the experiment's file, line and ``faults.N``, before any stack starts: not mid-run as an
    ``unknown`` inject.
    """
    out = []
    for r in resolved:
        if stack is not None:
            _fit_target(r, stack.services)
        if r.spec.backend in ("chaos-mesh", "litmus"):
            assert r.where is not None
            _check_kube(r.spec, r.ref, _allowed(namespaces, stack), where=r.where)
        out.append(r.spec)
    return out   # distinct names: checked by monsoon.run.validate.check_experiment


def experiment_faults(exp: ExperimentSpec, profile: str, stack: StackSpec | None = None, *,
                      namespaces: Iterable[str] | None = None) -> list[FaultSpec]:
    """Every fault of an experiment for one profile, checked against the stack's services when given
    (:func:`resolve_faults`, then :func:`fit_faults`)."""
    return fit_faults(resolve_faults(exp, profile), stack, namespaces=namespaces)


def _check_kube(f: FaultSpec, ref: FaultRef, namespaces: Iterable[str] | None,
                where: tuple[str | Path, int | None, str]) -> None:
    """Render one window of a Kubernetes fault as an inject would: the allow-list and the renderer's refusals."""
    allowed = tuple(kube_namespaces() if namespaces is None else namespaces)
    try:
        render(one_window(f), "validate", allowed)
        refusal = kernel_refusal(f) if local_cluster() else None   # the node is this machine: its kernel decides
        refusal = refusal or (litmus_refusal(f) if f.backend == "litmus" else None)
        if refusal:
            raise FaultError(refusal)
    except FaultError as e:
        hint = (f" (set {KUBE_NAMESPACES_ENV}=a,b to allow namespaces)" if isinstance(e, NamespaceNotAllowed)
                else "")
        file, line, key = where
        raise SpecError(file, line, key, f"fault profile {ref.profile!r}: {e}{hint}") from None


def _allowed(namespaces: Iterable[str] | None, stack: Any) -> tuple[str, ...]:
    """The allow-list, plus the namespace a stack in Kubernetes form creates for its own pods (monsoon's own)."""
    out = tuple(kube_namespaces() if namespaces is None else namespaces)
    spec = getattr(stack, "spec", stack)
    if spec is not None and spec.pods() and spec.kube_namespace() not in out:
        out += (spec.kube_namespace(),)
    return out


def kube_namespaces() -> tuple[str, ...]:
    """The namespace allow-list for Kubernetes faults (``MONSOON_KUBE_NAMESPACES=a,b``; empty allows none)."""
    return tuple(x.strip() for x in (settings.env(KUBE_NAMESPACES_ENV) or "").split(",") if x.strip())


def build_backends(faults: list[FaultSpec], stack: Any, run_dir: Path) -> dict[str, FaultBackend]:
    """One backend per name the faults use, bound to the running stack."""
    out: dict[str, FaultBackend] = {}
    for name in sorted({f.backend for f in faults}):
        if name == "toxiproxy":
            api = stack.spec.chaos.toxiproxy
            if not api:
                raise FaultError(f"stack {stack.spec.name!r} has no Toxiproxy (chaos.toxiproxy): its hops cannot "
                                 "be slowed; use a stack that routes them through Toxiproxy, e.g. kafka-registry")
            out[name] = ToxiproxyBackend(stack.endpoint(api))
        elif name == "process":
            out[name] = ProcessBackend(stack)
        elif name == "cgroup":
            out[name] = CgroupBackend(stack=stack)
        else:
            out[name] = (LitmusBackend(_allowed(None, stack), out_dir=run_dir) if name == "litmus"
                         else KubeBackend(name, _allowed(None, stack), out_dir=run_dir))
    return out


# ------------------------------------------------------------------ dry run

def _what(f: FaultSpec) -> str:
    p = f.params
    d = p.model_dump() if p is not None else {}
    if f.backend == "toxiproxy":
        proxy = f"proxy m_<run>__{f.target.hop[0]}__{f.target.hop[1]}" if f.target.hop else "?"
        if f.kind in ("dependency-down", "cassandra-down"):
            return f"Toxiproxy: {d['mode']} {proxy}"
        if f.kind == "bandwidth":
            return f"Toxiproxy: bandwidth {d['rate_kbps']} KiB/s {d['stream']} on {proxy}"
        return f"Toxiproxy: latency {d['latency_ms']} ms +/- {d['jitter_ms']} ms {d['stream']} on {proxy}"
    if f.backend == "process":
        if f.kind == "process-pause":
            return f"SIGSTOP the process group of {f.target}, SIGCONT at the end"
        return f"{d['signal']} the process group of {f.target}; expect a supervised restart within {d['restart_timeout']:g}s"
    if f.backend == "cgroup":
        return f"lower the memory limit of {f.target}'s cgroup to {d['limit_mb']} MiB ({d['mode']}), restore at the end"
    return f"{f.backend}: apply the objects below in namespace {f.target.kube.namespace if f.target.kube else '?'}"


def describe(stack: StackSpec, exp: ExperimentSpec, profile: str, faults: list[FaultSpec], run_id: str,
             checks: Sequence[str]) -> str:
    """What a run would do, without doing it; ``checks``: the names of what it judges (its plan's, implied
    checks included: :func:`monsoon.run.plan.run_checks`)."""
    d = exp.durations(profile)
    lines = [f"DRY RUN {stack.name} / {exp.name} ({profile}): nothing is started, nothing is injected",
             f"  stack: start {', '.join(stack.start_order())}",
             f"  load: {exp.load.devices} devices, QoS {exp.load.qos}, x1 = {exp.load.base_rate:g} msg/s, "
             f"{exp.load.shape.kind}" + (f" x{exp.load.shape.multiplier:g}" if exp.load.shape.multiplier else "")
             + f", {d.total:g}s (+ drain up to {d.drain_timeout:g}s)"]
    for f in faults:
        wins = f.schedule.windows(d.total)
        when = ", ".join(f"{a:g}-{b:g}s" for a, b in wins[:4]) + (f" ... ({len(wins)} windows)" if len(wins) > 4 else "")
        lines.append(f"  fault {f.name} [{f.kind}, {f.backend}] on {f.target} at {when or 'never (after the load)'}")
        lines.append(f"    {_what(f)}")
        if f.backend in ("chaos-mesh", "litmus"):
            try:   # what each window applies (monsoon injects and heals every window itself)
                text = to_yaml(render(one_window(f), run_id, kube_namespaces()))
            except FaultError as e:
                text = f"REFUSED: {e}"
            lines.extend("    | " + x for x in text.rstrip().splitlines())
    lines.append(f"  checks: {', '.join(checks)}")
    return "\n".join(lines)


# ------------------------------------------------------------- heal --all


ProcStat = Callable[[int], "tuple[str, int, int] | None"]


