"""The experiment side of faults: resolve an experiment's ``faults:`` against a stack,
build the backends it needs, describe the plan (dry run), and heal every run.

The backends and the plan live in :mod:`monsoon.faults`; this module only glues
them to stacks, experiments and run directories.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from .faults.base import FaultBackend, FaultContext, FaultError
from .faults.spec import PROFILES_DIR, FaultSpec, _resolve as _resolve_profile, check_target
from .specs import ExperimentSpec, FaultRef, StackSpec
from .yamlio import SpecError, load_located, validate

KUBE_NAMESPACES_ENV = "MONSOON_KUBE_NAMESPACES"


def resolve_fault(ref: FaultRef, profile: str, *, services: Iterable[str] | None = None,
                  where: tuple[str | Path, int | None, str] | None = None) -> FaultSpec:
    """The fault profile ``ref.profile`` with the experiment's overrides for ``profile``, validated.

    ``where`` (file, line, key) of the experiment's entry: errors in an override
    are reported there, errors of the profile itself at the profile's line.
    """
    try:
        path = _resolve_profile(ref.profile, PROFILES_DIR)
        doc = load_located(path)
        if isinstance(doc.data, dict):
            ov = ref.overrides(profile)
            for key in ("params", "schedule"):
                if key in ov:
                    doc.data[key] = {**(doc.data.get(key) or {}), **ov.pop(key)}
            doc.data.update(ov)
            doc.data.setdefault("source", str(path))
        spec = validate(doc, FaultSpec)
        if services is not None:
            check_target(spec, set(services), doc_path=path, line=doc.line_of(("target",)))
        return spec
    except SpecError as e:
        if where is None:
            raise
        file, line, key = where
        raise SpecError(file, line, key, f"fault profile {ref.profile!r}: {e}") from None


def experiment_faults(exp: ExperimentSpec, profile: str, stack: StackSpec | None = None, *,
                      namespaces: Iterable[str] | None = None) -> list[FaultSpec]:
    """Every fault of an experiment for one profile, checked against the stack's services when given.

    A Kubernetes fault (chaos-mesh, litmus) is rendered here once, so a namespace that is not on
    ``MONSOON_KUBE_NAMESPACES`` (or ``namespaces``) or an object its backend cannot express fails now,
    naming the experiment's file, line and ``faults.N``, before any stack starts: not mid-run as an
    ``unknown`` inject.
    """
    services = set(stack.services) if stack is not None else None
    doc = load_located(exp.source) if exp.source and Path(exp.source).exists() else None
    out = []
    for i, ref in enumerate(exp.faults):
        line = doc.line_of(("faults", i)) if doc is not None else None
        f = resolve_fault(ref, profile, services=services, where=(exp.source, line, f"faults.{i}"))
        if f.backend in ("chaos-mesh", "litmus"):
            _check_kube(f, ref, namespaces, where=(exp.source, line, f"faults.{i}"))
        out.append(f)
    return out   # distinct names: checked by load_experiment


def _check_kube(f: FaultSpec, ref: FaultRef, namespaces: Iterable[str] | None,
                where: tuple[str | Path, int | None, str]) -> None:
    """Render one window of a Kubernetes fault as an inject would: the allow-list and the renderer's refusals."""
    from .faults.kube import NamespaceNotAllowed, one_window, render
    allowed = tuple(kube_namespaces() if namespaces is None else namespaces)
    try:
        render(one_window(f), "validate", allowed)
    except FaultError as e:
        hint = (f" (set {KUBE_NAMESPACES_ENV}=a,b to allow namespaces)" if isinstance(e, NamespaceNotAllowed)
                else "")
        file, line, key = where
        raise SpecError(file, line, key, f"fault profile {ref.profile!r}: {e}{hint}") from None


def kube_namespaces() -> tuple[str, ...]:
    """The namespace allow-list for Kubernetes faults (``MONSOON_KUBE_NAMESPACES=a,b``; empty allows none)."""
    return tuple(x.strip() for x in os.environ.get(KUBE_NAMESPACES_ENV, "").split(",") if x.strip())


def build_backends(faults: list[FaultSpec], stack: Any, run_dir: Path) -> dict[str, FaultBackend]:
    """One backend per name the faults use, bound to the running stack."""
    out: dict[str, FaultBackend] = {}
    for name in sorted({f.backend for f in faults}):
        if name == "toxiproxy":
            from .faults.toxiproxy import ToxiproxyBackend
            api = stack.spec.chaos.toxiproxy
            if not api:
                raise FaultError(f"stack {stack.spec.name!r} has no Toxiproxy (chaos.toxiproxy): its hops cannot "
                                 "be slowed; use a stack that routes them through Toxiproxy, e.g. kafka-registry")
            out[name] = ToxiproxyBackend(stack.endpoint(api))
        elif name == "process":
            from .faults.process import ProcessBackend
            out[name] = ProcessBackend(stack)
        elif name == "cgroup":
            from .faults.cgroup import CgroupBackend
            out[name] = CgroupBackend(stack=stack)
        else:
            from .faults.kube import KubeBackend
            out[name] = KubeBackend(name, kube_namespaces(), out_dir=run_dir)
    return out


# ------------------------------------------------------------------ dry run

def _what(f: FaultSpec) -> str:
    p = f.params
    d = p.model_dump() if p is not None else {}
    if f.backend == "toxiproxy":
        proxy = f"proxy m_<run>__{f.target.hop[0]}__{f.target.hop[1]}" if f.target.hop else "?"
        if f.kind == "dependency-down":
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


def describe(stack: StackSpec, exp: ExperimentSpec, profile: str, faults: list[FaultSpec], run_id: str) -> str:
    """What a run would do, without doing it."""
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
            from .faults.kube import one_window, render, to_yaml
            try:   # what each window applies (monsoon injects and heals every window itself)
                text = to_yaml(render(one_window(f), run_id, kube_namespaces()))
            except FaultError as e:
                text = f"REFUSED: {e}"
            lines.extend("    | " + x for x in text.rstrip().splitlines())
    checks = [c.name for c in exp.checks if c.applies(profile)]
    checks += [n for n in (["faults_landed"] if faults else []) + ["load_valid"] if n not in checks]
    lines.append(f"  checks: {', '.join(checks)}")
    return "\n".join(lines)


# ------------------------------------------------------------- heal --all

def _toxiproxy_apis_of_runs() -> list[str]:
    """API addresses of the Toxiproxy servers that monsoon runs started (found by their MONSOON_RUN_ID label)."""
    from .stack import find_leftovers
    apis = []
    for pid in find_leftovers():
        try:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv if a]
        if not args or not Path(args[0]).name.startswith("toxiproxy-server"):
            continue
        host, port = "127.0.0.1", "8474"
        for i, a in enumerate(args[:-1]):
            if a in ("-port", "--port"):
                port = args[i + 1]
            if a in ("-host", "--host"):
                host = args[i + 1]
        apis.append(f"http://{host}:{port}")
    return apis


def run_ids_in_place(state_root: Path | None = None) -> set[str]:
    """Run ids that still have something in place: labelled processes or cgroup records."""
    from .faults.cgroup import CgroupBackend
    from .stack import labelled_processes
    ids: set[str] = set(labelled_processes().values())
    rec_root = CgroupBackend(state_dir=state_root).state_root / "cgroup"
    if rec_root.exists():
        ids.update(p.name for p in rec_root.iterdir() if p.is_dir() and any(p.glob("*.json")))
    return ids


ProcStat = Callable[[int], "tuple[str, int, int] | None"]


def _proc_stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent PID, start time in clock ticks since boot) of a process; None when it is gone."""
    try:
        s = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    f = s[s.rindex(")") + 2:].split()      # the command name, in parentheses, may hold spaces
    return f[0], int(f[1]), int(f[19])


def live_runs(owners: Mapping[int, tuple[str, int | None]], stat: ProcStat | None = None) -> dict[str, int]:
    """Run ids whose monsoon process still runs -> that process's PID: ``heal --all`` leaves them alone.

    ``owners``: labelled PID -> (run id, ``MONSOON_OWNER_PID``), as ``stack.process_owners`` reads them.
    A process labelled before owners were recorded falls back to its parent, unless that is init (its
    monsoon died and it was reparented) or a process of the same run.  An owner that is gone, a zombie,
    or younger than the process it would have started (its PID was reused) is dead.
    """
    stat = stat or _proc_stat
    out: dict[str, int] = {}
    for pid, (rid, owner) in sorted(owners.items()):
        if rid in out:
            continue
        me = stat(pid)
        if me is None:
            continue
        if owner is None:
            owner = me[1]
            if owner <= 1 or owners.get(owner, ("",))[0] == rid:
                continue
        o = stat(owner)
        if o is None or o[0] in ("Z", "X") or o[2] > me[2]:
            continue
        out[rid] = owner
    return out


class HealReport(NamedTuple):
    done: list[str]                    # what was healed, deleted or killed
    census: dict[str, list[str]]       # run id -> what is still in place
    notes: list[str]                   # runs left alone (still live), what could not be looked at


def heal_everything(run_id: str | None = None, *, toxiproxy_apis: Iterable[str] = (),
                    reap_processes: bool = True, state_root: Path | None = None) -> HealReport:
    """Heal every fault of one run (or of every run) without handles: after ``kill -9`` of monsoon.

    Order: thaw stopped processes, restore cgroup limits, delete the run's
    toxics and proxies on every known Toxiproxy, delete labelled Kubernetes
    objects (when a cluster is configured: in the namespaces of
    ``MONSOON_KUBE_NAMESPACES``), then (optionally) kill the run's processes.

    ``run_id=None`` (``--all``): every run found in place (labelled processes, cgroup records, the
    run-prefixed names on Toxiproxy, the ``monsoon.io/run-id`` labels of Kubernetes objects) except
    the runs whose monsoon process is still alive (``live_runs``): those are only named in ``notes``.
    A run id given explicitly is healed whatever its owner does.
    """
    from .faults.cgroup import CgroupBackend
    from .faults.kube import KubeBackend, cluster_configured
    from .faults.process import ProcessBackend
    from .faults.toxiproxy import ToxiproxyBackend, run_ids_on
    from .stack import process_owners, reap

    done: list[str] = []
    notes: list[str] = []
    apis = list(dict.fromkeys([*toxiproxy_apis, *_toxiproxy_apis_of_runs()]))
    tox = [ToxiproxyBackend(a) for a in apis]
    kube = [KubeBackend(f, kube_namespaces()) for f in ("chaos-mesh", "litmus")] if cluster_configured() else []
    if kube and not kube_namespaces():
        notes.append(f"a Kubernetes cluster is configured but {KUBE_NAMESPACES_ENV} is empty: "
                     "no Kubernetes object was looked for")
    ids = {run_id} if run_id else run_ids_in_place(state_root)
    if not run_id:
        for b in tox:
            try:
                ids.update(run_ids_on(b))
            except Exception as e:  # an unreachable Toxiproxy holds nothing any more
                done.append(f"toxiproxy {b.client.api}: not reachable ({type(e).__name__})")
        for b in kube:
            try:
                ids.update(b.run_ids())
            except Exception as e:
                notes.append(f"{b.name}: cannot list objects: {type(e).__name__}: {e}")
        live = live_runs(process_owners())
        for rid in sorted(ids & live.keys()):
            notes.append(f"run {rid} is still live (owner pid {live[rid]}): skipped; use --run-id {rid} to force")
        ids -= live.keys()
    backends: list[Any] = [ProcessBackend(), CgroupBackend(state_dir=state_root), *tox, *kube]
    for rid in sorted(ids):
        for b in backends:
            try:
                done += [f"{rid} {b.name}: {x}" for x in b.heal_all(rid)]
            except Exception as e:
                done.append(f"{rid} {b.name}: FAILED {e}")
        if reap_processes:
            for b in tox:
                try:
                    done += [f"{rid} toxiproxy: proxy {x} deleted" for x in b.unroute(rid)]
                except Exception:
                    pass
            pids = reap(rid)
            if pids:
                done.append(f"{rid}: killed {len(pids)} leftover process(es)")
    census: dict[str, list[str]] = {}
    for rid in sorted(ids):
        for b in backends:
            if reap_processes and b.name == "toxiproxy":
                continue   # the run's own Toxiproxy is gone with its processes
            try:
                left = b.census(rid)
            except Exception as e:
                left = [f"census failed: {e}"]
            if left:
                census.setdefault(rid, []).extend(f"{b.name}: {x}" for x in left)
    return HealReport(done, census, notes)
