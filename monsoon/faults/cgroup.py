"""memory-pressure: lower a service's cgroup memory limit, then restore it.

Supports cgroup v1 (``memory.limit_in_bytes``) and v2 (``memory.max``).

* ``mode: child`` (default): make ``<service's cgroup>/m_<run-id>__<service>``,
  move the service's process group into it, set its limit.  Heal: restore the
  original limit, move the processes back, remove the directory.  Nested under
  the service's own cgroup, so every parent limit still applies.
* ``mode: in-place``: lower the limit of the cgroup the service already is in
  (e.g. its container's); heal writes the remembered original back.  Only for a
  service with a cgroup of its own: services monsoon starts inherit monsoon's
  cgroup, and lowering that one would cap pytest, Kafka and every other process
  in it.  So in-place is refused when the cgroup (or one below it, which the
  limit covers too) holds any process outside the target's process group.

Before anything is changed a record (cgroup, limit file, original value, PIDs) is
written to ``<state_dir>/cgroup/<run-id>/*.json``, so ``heal_all`` restores it even
after monsoon was killed, and ``census`` reports any limit not back at its original.
"""
from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

from monsoon.faults import container as ctr
from monsoon.faults.base import FaultContext, FaultError, Handle, Landing
from monsoon.faults.process import group_members
from monsoon.paths import CACHE
from monsoon.spec.fault import FaultSpec, MemoryPressureParams
from monsoon.stack.cgroupfs import (PAGE, V1_UNLIMITED, V2_DELEGATE_HINT, CgroupDir, CgroupFS as ReadCgroupFS,
                                     CgroupUnavailable, limit_bytes)
from monsoon.stack.reaper import check_run_id


class CgroupUnavailableFault(FaultError, CgroupUnavailable):
    """No memory cgroup for a fault's target: a FaultError to the fault plan, CgroupUnavailable to readers."""


class CgroupFS(ReadCgroupFS):
    """:class:`monsoon.stack.cgroupfs.CgroupFS` raising :class:`FaultError` (the fault plan's error)."""
    error = CgroupUnavailableFault


class CgroupBackend:
    name = "cgroup"

    def __init__(self, state_dir: Path | None = None, fs: CgroupFS | None = None, stack=None):
        self.state_root = Path(state_dir) if state_dir else CACHE / "fault-state"
        self.fs = fs or CgroupFS()
        self.stack = stack
        self._handles: dict[str, Handle] = {}

    # --- records
    def _record_dir(self, run_id: str) -> Path:
        return self.state_root / "cgroup" / check_run_id(run_id)

    def _write_record(self, handle: Handle) -> None:
        d = self._record_dir(handle.run_id)
        d.mkdir(parents=True, exist_ok=True)
        keys = (("service", "docker", "container", "cgroup", "original", "original_swap", "limit_bytes")
                if handle.data.get("docker") else
                ("service", "version", "cgroup", "parent", "created", "original", "pids", "limit_bytes"))
        rec = {k: handle.data[k] for k in keys}
        rec.update(fault=handle.fault.name, id=handle.id)
        tmp = d / f".{handle.id}.json.tmp"
        tmp.write_text(json.dumps(rec))
        tmp.rename(d / f"{handle.id}.json")
        handle.data["record"] = str(d / f"{handle.id}.json")

    def _records(self, run_id: str) -> list[tuple[Path, dict]]:
        d = self._record_dir(run_id)
        out = []
        for f in sorted(d.glob("*.json")) if d.exists() else ():
            try:
                out.append((f, json.loads(f.read_text())))
            except (OSError, ValueError):
                continue
        return out

    # --- FaultBackend
    def inject(self, fault: FaultSpec, ctx: FaultContext) -> Handle:
        p = fault.params
        if not isinstance(p, MemoryPressureParams) or p.limit_mb is None:
            raise FaultError(f"{fault.name}: the cgroup backend does memory-pressure with params.limit_mb")
        if ctx.state_dir is not None:
            self.state_root = Path(ctx.state_dir)
        stack = ctx.stack or self.stack
        svc = fault.target.service
        if stack is None or svc is None:
            raise FaultError(f"{fault.name}: the cgroup backend needs a stack and a service target")
        pid = stack.pid(svc)
        if pid is None:
            raise FaultError(f"{fault.name}: service {svc!r} is not running")
        want = p.limit_mb * 1024 * 1024
        if ctr.container_of(stack, svc) is not None:
            return self._inject_container(fault, ctx, svc, ctr.container_of(stack, svc).name, want)
        cur = self.fs.memory_cgroup(pid)
        pids = group_members(pid) or [pid]
        if p.mode == "child":
            target = CgroupDir(cur.version, cur.path / f"m_{ctx.run_id}__{svc}")
            data = {"service": svc, "version": cur.version, "cgroup": str(target.path), "parent": str(cur.path),
                    "created": True, "original": "max" if cur.version == 2 else str(V1_UNLIMITED),
                    "pids": pids, "limit_bytes": want}
        else:
            self._check_own_cgroup(fault, svc, cur, pids)
            target = cur
            data = {"service": svc, "version": cur.version, "cgroup": str(cur.path), "parent": None,
                    "created": False, "original": cur.read_limit(), "pids": pids, "limit_bytes": want}
        handle = Handle(fault, self.name, ctx.run_id, data)
        self._write_record(handle)                       # before touching anything
        self._handles[handle.id] = handle
        try:
            if p.mode == "child":
                if cur.version == 2:
                    self._delegate_v2(cur.path)
                target.path.mkdir(exist_ok=True)
                handle.data["original"] = target.read_limit()
                self._write_record(handle)
                if cur.version == 1:
                    # v1 leaves memory already used charged to the old cgroup unless charges move
                    # with the task: then the new limit covers what the service already holds
                    try:
                        (target.path / "memory.move_charge_at_immigrate").write_text("3")
                    except OSError:
                        handle.data["charges_moved"] = False
                for x in pids:
                    self._move(x, target.path)
            target.limit_file.write_text(str(want))
        except OSError as e:
            self.heal(handle)
            hint = (" (v1 refuses a limit below what the group already uses and cannot reclaim: "
                    "choose a larger limit_mb)" if e.errno == errno.EBUSY else "")
            raise FaultError(f"{fault.name}: cannot set {target.limit_file} to {want}: {e}{hint}") from None
        return handle

    def _inject_container(self, fault: FaultSpec, ctx: FaultContext, svc: str, name: str, want: int) -> Handle:
        """``docker update --memory`` of a container service (its original limits recorded first)."""
        orig = ctr.memory(name)
        if orig is None:
            raise FaultError(f"{fault.name}: container {name} of {svc!r} is gone")
        if orig[0] == 0:    # docker update cannot put "no limit" back: the heal could not restore it
            raise FaultError(f"{fault.name}: container {name} has no memory limit to lower and restore: give "
                             f"service {svc!r} a mem_limit")
        data = {"service": svc, "docker": True, "container": name, "cgroup": f"container {name}",
                "original": orig[0], "original_swap": orig[1], "limit_bytes": want}
        handle = Handle(fault, self.name, ctx.run_id, data)
        self._write_record(handle)                       # before touching anything
        self._handles[handle.id] = handle
        try:
            ctr.set_memory(name, want, want)
        except Exception as e:
            self.heal(handle)
            raise FaultError(f"{fault.name}: docker update --memory {want} of {name} failed: {e} (the kernel "
                             "refuses a limit below what the container uses and cannot reclaim: choose a larger "
                             "limit_mb)") from None
        return handle

    @staticmethod
    def _check_own_cgroup(fault: FaultSpec, svc: str, cg: CgroupDir, members: list[int]) -> None:
        """mode: in-place only on a cgroup that holds nothing but the service's process group."""
        others = sorted(set(cg.subtree_procs()) - set(members))
        if not others:
            return
        me = os.getpid()
        who = ", ".join(str(x) + (" (monsoon itself)" if x == me else "") for x in others[:8])
        raise FaultError(
            f"{fault.name}: mode: in-place would lower the memory limit of {cg.path}, which also holds "
            f"{len(others)} process(es) outside {svc}'s process group (pid {who}{', ...' if len(others) > 8 else ''}): "
            "the limit would cap them too (monsoon, pytest, the other services). Use mode: child (the default), or "
            "give the service a cgroup of its own (a container) for in-place")

    @staticmethod
    def _move(pid: int, path: Path) -> None:
        try:
            (path / "cgroup.procs").write_text(str(pid))
        except ProcessLookupError:
            pass
        except OSError as e:
            if e.errno != errno.ESRCH:
                raise

    @staticmethod
    def _delegate_v2(path: Path) -> None:
        sub = path / "cgroup.subtree_control"
        if "memory" not in sub.read_text().split():
            try:
                sub.write_text("+memory")
            except OSError as e:
                raise FaultError(f"cgroup v2: cannot enable the memory controller for children of {path}: {e} "
                                 f"(a cgroup holding processes cannot delegate; {V2_DELEGATE_HINT})") from None

    def _restore(self, rec: dict) -> None:
        if rec.get("docker"):
            ctr.restore_memory(rec)
            return
        cg = CgroupDir(rec["version"], Path(rec["cgroup"]))
        if not cg.path.exists():
            return
        try:
            cg.limit_file.write_text(str(rec["original"]))
        except FileNotFoundError:
            return
        if rec.get("created") and rec.get("parent"):
            parent = Path(rec["parent"])
            for pid in cg.procs():
                self._move(pid, parent)
            for _ in range(50):          # a just-moved task may still be accounted for a moment
                try:
                    cg.path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError as e:
                    if e.errno != errno.EBUSY:
                        raise
                    time.sleep(0.02)

    def heal(self, handle: Handle) -> None:
        self._restore(handle.data)
        rec = handle.data.get("record")
        if rec:
            Path(rec).unlink(missing_ok=True)
        handle.healed = True
        self._handles.pop(handle.id, None)

    def heal_all(self, run_id: str) -> list[str]:
        healed = []
        for h in list(self._handles.values()):
            if h.run_id == run_id:
                self.heal(h)
                healed.append(f"{h.fault.name}: {h.data['cgroup']} restored")
        for f, rec in self._records(run_id):
            self._restore(rec)
            f.unlink(missing_ok=True)
            healed.append(f"{rec['fault']}: {rec['cgroup']} restored from record")
        return healed

    def census(self, run_id: str) -> list[str]:
        left = []
        recs = [r for _, r in self._records(run_id)]
        recs += [h.data for h in self._handles.values() if h.run_id == run_id]
        seen = set()
        for rec in recs:
            if rec["cgroup"] in seen:
                continue
            seen.add(rec["cgroup"])
            if rec.get("docker"):
                now = ctr.memory(rec["container"])
                if now is not None and now[0] != int(rec["original"]):
                    left.append(f"container {rec['container']}: memory limit {now[0]}, original {rec['original']}")
                continue
            cg = CgroupDir(rec["version"], Path(rec["cgroup"]))
            if rec.get("created"):
                if cg.path.exists():
                    left.append(f"cgroup {cg.path} still exists (limit {cg.read_limit()})")
            elif cg.path.exists() and limit_bytes(cg.read_limit()) != limit_bytes(str(rec["original"])):
                left.append(f"cgroup {cg.path}: limit {cg.read_limit()}, original {rec['original']}")
        return left

    def verify(self, handle: Handle) -> Landing:
        d = handle.data
        if d.get("docker"):
            now = ctr.memory(d["container"])
            want = int(d["original"]) if handle.healed else d["limit_bytes"]
            return Landing(now is not None and now[0] == want,
                           {"method": "docker inspect HostConfig.Memory", "container": d["container"],
                            "memory": now[0] if now else None, "wanted": want})
        cg = CgroupDir(d["version"], Path(d["cgroup"]))
        pid = d["pids"][0]
        if handle.healed:
            if d["created"]:
                ok = not cg.path.exists()
                ev = {"method": "cgroupfs", "cgroup": str(cg.path), "removed": ok}
                return Landing(ok, ev)
            limit = cg.read_limit()
            return Landing(limit_bytes(limit) == limit_bytes(str(d["original"])),
                           {"method": "cgroupfs", "cgroup": str(cg.path), "limit": limit, "original": d["original"]})
        if not cg.path.exists():
            return Landing(False, {"method": "cgroupfs", "cgroup": str(cg.path), "error": "cgroup is gone"})
        ev = {"method": "cgroupfs", **cg.stats(), "requested_bytes": d["limit_bytes"], "pid": pid}
        got = limit_bytes(cg.read_limit())
        member = pid in cg.procs() or pid not in [int(x) for x in os.listdir("/proc") if x.isdigit()]
        ev["pid_in_cgroup"] = pid in cg.procs()
        ok = got is not None and abs(got - d["limit_bytes"]) < PAGE and member
        return Landing(ok, ev)
