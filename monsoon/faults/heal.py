"""Healing from outside a run: ``monsoon heal`` finds every fault a run left in place (Toxiproxy toxics,
frozen processes, cgroup limits, Kubernetes objects) and undoes it; runs whose monsoon is alive are skipped."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple, TypeVar

from monsoon.faults.cgroup import CgroupBackend
from monsoon.faults.kube import KubeBackend
from monsoon.stack.kubeapi import cluster_configured
from monsoon.faults.litmus import LitmusBackend
from monsoon.faults.process import ProcessBackend
from monsoon.faults.resolve import KUBE_NAMESPACES_ENV, ProcStat, kube_namespaces
from monsoon.faults.toxiproxy import ToxiproxyBackend, run_ids_on
from monsoon.stack import cluster
from monsoon.stack.containers import container_census, container_owners, reap_containers
from monsoon.stack.helm import reap_releases, release_census, release_owners
from monsoon.stack.pods import namespace_census, namespace_owners, reap_namespaces
from monsoon.stack.reaper import find_leftovers, labelled_processes, process_owners, reap


def _toxiproxy_apis_of_runs() -> list[str]:
    """API addresses of the Toxiproxy servers that monsoon runs started (found by their MONSOON_RUN_ID label)."""
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


def run_ids_in_place(state_root: Path | None = None, procs: Mapping[int, tuple[str, int | None]] | None = None,
                     objects: Mapping[str, int | None] | None = None) -> set[str]:
    """Run ids that still have something in place: labelled processes, containers, Helm releases, namespaces or
    cgroup records. ``procs`` and ``objects``: what :func:`process_owners` and the object listings said, when the
    caller has read them."""
    if procs is None:
        ids: set[str] = set(labelled_processes().values())
    else:
        ids = {rid for rid, _ in procs.values()}
    ids |= set(_object_owners() if objects is None else objects)
    rec_root = CgroupBackend(state_dir=state_root).state_root / "cgroup"
    if rec_root.exists():
        ids.update(p.name for p in rec_root.iterdir() if p.is_dir() and any(p.glob("*.json")))
    return ids


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


def _reachable(b: ToxiproxyBackend) -> bool:
    try:
        b.client.version()
        return True
    except Exception:   # the probe's answer: a server that cannot say its version is not reachable
        return False


class HealFailure(NamedTuple):
    """A step of a heal that raised: what was being done, and why it failed."""
    what: str       # e.g. "run-1 toxiproxy: deleting the run's proxies on http://127.0.0.1:8474"
    reason: str     # the exception, "<type>: <message>"

    def __str__(self) -> str:
        return f"heal {self.what} FAILED: {self.reason}"


class HealReport(NamedTuple):
    done: list[str]                    # what was healed, deleted or killed
    census: dict[str, list[str]]       # run id -> what is still in place
    notes: list[str]                   # runs left alone (still live)
    failed: list[HealFailure]          # every step that raised: printed as a failure, exit code 1


T = TypeVar("T")


def _reason(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}"


class _Heal:
    """One heal's record: every step goes through ``attempt``, so a step that raises is recorded in ``failed``
    (never swallowed) and the steps after it, and the other runs and backends, still run."""

    def __init__(self, toxiproxy_apis: Iterable[str], reap_processes: bool, state_root: Path | None) -> None:
        self.state_root = state_root
        self.done: list[str] = []
        self.notes: list[str] = []
        self.failed: list[HealFailure] = []
        self.reap_processes = reap_processes
        self.own_tox = _toxiproxy_apis_of_runs()     # servers runs started: reaped with the run's processes
        apis = list(dict.fromkeys([*toxiproxy_apis, *self.own_tox]))
        self.tox = [ToxiproxyBackend(a) for a in apis]
        self.kube: list[KubeBackend] = [KubeBackend("chaos-mesh", kube_namespaces()),
                                        LitmusBackend(kube_namespaces())] if cluster_configured() else []
        if self.kube and not kube_namespaces():
            self.notes.append(f"a Kubernetes cluster is configured but {KUBE_NAMESPACES_ENV} is empty: "
                              "no Kubernetes object was looked for")

    def attempt(self, what: str, step: Callable[..., T], *args: Any) -> T | None:
        """``step(*args)``; when it raises: recorded in ``failed`` as ``what``, and None is returned."""
        try:
            return step(*args)
        except Exception as e:   # recorded: "heal <what> FAILED: <reason>", and the exit code is 1
            self.failed.append(HealFailure(what, _reason(e)))
            return None

    def gone(self, b: Any) -> bool:
        """A run's own Toxiproxy that no longer answers: gone with its run's processes, it holds nothing any more."""
        return b in self.tox and b.client.api in self.own_tox and not _reachable(b)

    def backends(self) -> list[Any]:
        return [ProcessBackend(), CgroupBackend(state_dir=self.state_root), *self.tox, *self.kube]


def _runs_to_heal(h: _Heal) -> set[str]:
    """``heal --all``: every run found in place, less the live ones (named in the notes)."""
    procs, objects = process_owners(), _object_owners()     # read once, for what is in place and what is live
    ids = run_ids_in_place(h.state_root, procs=procs, objects=objects)
    for t in h.tox:
        ids |= h.attempt(f"listing the runs on toxiproxy {t.client.api}", run_ids_on, t) or set()
    for k in h.kube:
        ids |= h.attempt(f"listing the runs' {k.name} objects", k.run_ids) or set()
    live = live_run_owners(procs, objects)
    h.notes += [live_note(rid, live[rid]) for rid in sorted(ids & live.keys())]
    return ids - live.keys()


def _object_owners() -> dict[str, int | None]:
    """Run id -> owner PID label of its containers, Helm releases and namespaces."""
    return {**release_owners(), **namespace_owners(), **container_owners()}


def live_run_owners(procs: Mapping[int, tuple[str, int | None]] | None = None,
                    objects: Mapping[str, int | None] | None = None) -> dict[str, int]:
    """Run id -> PID of its monsoon process, for every run whose monsoon process still runs: found from its
    labelled processes (:func:`live_runs`) or from the owner label of its containers, Helm releases or
    namespaces. ``heal --all`` and ``monsoon reap`` leave these runs alone unless named. ``procs`` and
    ``objects``: what :func:`process_owners` and the object listings said, when the caller has read them."""
    live = live_runs(process_owners() if procs is None else procs)
    owners = _object_owners() if objects is None else objects
    for rid, owner in owners.items():      # a container's, namespace's or release's owner label: is monsoon alive?
        st = _proc_stat(owner) if owner else None
        if rid not in live and owner and st is not None and st[0] not in ("Z", "X"):
            live[rid] = owner
    return live


def live_note(rid: str, owner: int) -> str:
    """The one line that says a live run was left alone, and how to force it."""
    return f"run {rid} is still live (owner pid {owner}): skipped; use --run-id {rid} to force"


def _heal_faults(h: _Heal, rid: str, backends: list[Any]) -> None:
    """Every backend's ``heal_all`` for one run; a backend that raises does not stop the others."""
    for b in backends:
        if h.gone(b):          # a run's own Toxiproxy, reaped with an earlier run: nothing to heal there
            continue
        h.done += [f"{rid} {b.name}: {x}" for x in (h.attempt(f"{rid} {b.name}: healing", b.heal_all, rid) or [])]


def _reap_run(h: _Heal, rid: str) -> None:
    """Delete the run's proxies, kill its processes, remove its containers and namespaces."""
    for t in h.tox:
        if h.gone(t):
            continue
        h.done += [f"{rid} toxiproxy: proxy {x} deleted" for x in (h.attempt(
            f"{rid} toxiproxy: deleting the run's proxies on {t.client.api}", t.unroute, rid) or [])]
    pids = h.attempt(f"{rid}: killing the run's processes", reap, rid) or []
    if pids:
        h.done.append(f"{rid}: killed {len(pids)} leftover process(es)")
    gone = h.attempt(f"{rid}: removing the run's containers", reap_containers, rid) or []
    if gone:
        h.done.append(f"{rid}: removed {len(gone)} leftover container(s): {', '.join(gone)}")
    gone = h.attempt(f"{rid}: uninstalling the run's Helm releases", reap_releases, rid) or []
    if gone:
        h.done.append(f"{rid}: uninstalled {len(gone)} leftover Helm release(s): {', '.join(gone)}")
    gone = h.attempt(f"{rid}: deleting the run's namespaces", reap_namespaces, rid) or []
    if gone:
        h.done.append(f"{rid}: deleted {len(gone)} leftover namespace(s) and their pods: {', '.join(gone)}")


def _stop_left_cluster(h: _Heal) -> None:
    why = h.attempt("monsoon's cluster: looking for it", cluster.left_behind)
    if why:
        stopped = h.attempt(f"monsoon's cluster ({why}): stopping it", cluster.down)
        if stopped is not None:
            h.done.append(f"monsoon's cluster ({why}): stopped " + ", ".join(stopped))


def _census(h: _Heal, ids: set[str], backends: list[Any], whole_machine: bool) -> dict[str, list[str]]:
    """What is still in place after the heal; a census that fails is itself in the census (it is not clean)."""
    census: dict[str, list[str]] = {}
    if whole_machine:
        try:
            if cluster.left_behind():
                census["k8s-cluster"] = cluster.census()
        except Exception as e:   # recorded in the census, which is then not clean (exit code 1)
            census["k8s-cluster"] = [f"census failed: {_reason(e)}"]
    for rid in sorted(ids):
        left: list[str] = []
        for b in backends:
            try:
                mine = b.census(rid, routed=True) if h.reap_processes and b in h.tox else b.census(rid)
            except Exception as e:    # recorded in the census, which is then not clean (exit code 1)
                if h.reap_processes and h.gone(b):
                    continue
                mine = [f"census failed: {e}"]
            left += [f"{b.name}: {x}" for x in mine]
        if h.reap_processes:
            for name, look in (("docker", container_census), ("kubernetes", namespace_census),
                               ("helm", release_census)):
                try:
                    left += [f"{name}: {x}" for x in look(rid)]
                except Exception as e:   # recorded in the census, as above
                    left.append(f"{name}: census failed: {_reason(e)}")
        if left:
            census[rid] = left
    return census


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

    A step that raises is recorded in ``failed`` (what, and why) and the heal goes on with the other
    steps, backends and runs.
    """
    h = _Heal(toxiproxy_apis, reap_processes, state_root)
    ids = {run_id} if run_id else _runs_to_heal(h)
    backends = h.backends()
    for rid in sorted(ids):
        _heal_faults(h, rid, backends)
        if reap_processes:
            _reap_run(h, rid)
    if run_id is None and reap_processes:      # after the runs' namespaces: deleting them needs the cluster
        _stop_left_cluster(h)
    census = _census(h, ids, backends, whole_machine=run_id is None)
    return HealReport(h.done, census, h.notes, h.failed)


class ReapReport(NamedTuple):
    pids: list[int]                    # processes killed
    containers: list[str]              # containers removed
    releases: list[str]                # Helm releases uninstalled (namespace/name)
    namespaces: list[str]              # namespaces deleted
    notes: list[str]                   # live runs left alone
    shared_in_use: bool                # a live run may use monsoon's dockerd and cluster: leave them running


def reap_left_behind(run_id: str | None = None) -> ReapReport:
    """``monsoon reap``: kill the processes and remove the containers, Helm releases and namespaces of one run,
    or, with no run id, of every run whose monsoon process is gone. A live run (:func:`live_run_owners`) is
    left alone unless named: a ``make reap`` in one terminal must not kill a soak running in another."""
    live: dict[str, int] = {}
    targets: Iterable[str | None] = [run_id]
    if run_id is None:      # the processes and objects in place are listed once, for liveness and for targets
        procs, objects = process_owners(), _object_owners()
        live = live_run_owners(procs, objects)
        if live:
            targets = sorted(run_ids_in_place(procs=procs, objects=objects) - live.keys())
    r = ReapReport([], [], [], [], [live_note(rid, live[rid]) for rid in sorted(live)], bool(live))
    for rid in targets:
        r.pids.extend(reap(rid))
        r.containers.extend(reap_containers(rid))
        r.releases.extend(reap_releases(rid))
        r.namespaces.extend(reap_namespaces(rid))
    return r
