"""Healing from outside a run: ``monsoon heal`` finds every fault a run left in place (Toxiproxy toxics,
frozen processes, cgroup limits, Kubernetes objects) and undoes it; runs whose monsoon is alive are skipped."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple

from monsoon.faults.cgroup import CgroupBackend
from monsoon.faults.kube import KubeBackend
from monsoon.stack.kubeapi import cluster_configured
from monsoon.faults.litmus import LitmusBackend
from monsoon.faults.process import ProcessBackend
from monsoon.faults.resolve import KUBE_NAMESPACES_ENV, ProcStat, kube_namespaces
from monsoon.faults.toxiproxy import ToxiproxyBackend, run_ids_on
from monsoon.stack import cluster
from monsoon.stack.containers import container_census, container_owners, reap_containers
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


def run_ids_in_place(state_root: Path | None = None) -> set[str]:
    """Run ids that still have something in place: labelled processes or cgroup records."""
    ids: set[str] = set(labelled_processes().values()) | set(container_owners()) | set(namespace_owners())
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
    except Exception:
        return False


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

    done: list[str] = []
    notes: list[str] = []
    own_tox = _toxiproxy_apis_of_runs()     # servers runs started: reaped with the run's processes
    apis = list(dict.fromkeys([*toxiproxy_apis, *own_tox]))
    tox = [ToxiproxyBackend(a) for a in apis]
    kube = [KubeBackend("chaos-mesh", kube_namespaces()), LitmusBackend(kube_namespaces())] \
        if cluster_configured() else []
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
        owners = {**namespace_owners(), **container_owners()}
        for rid, owner in owners.items():      # a container's or namespace's owner label: is that monsoon alive?
            st = _proc_stat(owner) if owner else None
            if rid not in live and st is not None and st[0] not in ("Z", "X"):
                live[rid] = owner
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
                except Exception as e:   # said here; the census below names what is left
                    done.append(f"{rid} toxiproxy: FAILED to delete the run's proxies on {b.client.api}: {e}")
            pids = reap(rid)
            if pids:
                done.append(f"{rid}: killed {len(pids)} leftover process(es)")
            gone = reap_containers(rid)
            if gone:
                done.append(f"{rid}: removed {len(gone)} leftover container(s): {', '.join(gone)}")
            gone = reap_namespaces(rid)
            if gone:
                done.append(f"{rid}: deleted {len(gone)} leftover namespace(s) and their pods: {', '.join(gone)}")
    if run_id is None and reap_processes:      # after the runs' namespaces: deleting them needs the cluster
        why = cluster.left_behind()
        if why:
            done.append(f"monsoon's cluster ({why}): stopped " + ", ".join(cluster.down()))
    census: dict[str, list[str]] = {}
    if run_id is None and cluster.left_behind():
        census["k8s-cluster"] = cluster.census()
    for rid in sorted(ids):
        for b in backends:
            try:
                left = b.census(rid, routed=True) if reap_processes and b in tox else b.census(rid)
            except Exception as e:
                if b in tox and reap_processes and b.client.api in own_tox and not _reachable(b):
                    continue   # a run's own Toxiproxy, gone with its processes: it holds nothing any more
                left = [f"census failed: {e}"]
            if left:
                census.setdefault(rid, []).extend(f"{b.name}: {x}" for x in left)
        if reap_processes:
            census.setdefault(rid, []).extend(f"docker: {x}" for x in container_census(rid))
            census[rid].extend(f"kubernetes: {x}" for x in namespace_census(rid))
            if not census[rid]:
                del census[rid]
    return HealReport(done, census, notes)
