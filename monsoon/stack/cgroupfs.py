"""Reading memory cgroups (v1 and v2): a process's cgroup, its limit, usage and OOM kills. Read-only and
neutral: the cgroup fault (:mod:`monsoon.faults.cgroup`, which writes limits) and the collectors
(:mod:`monsoon.observe.collectors`, which sample them) both use it."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


class CgroupUnavailable(RuntimeError):
    """A process has no memory cgroup this code can read (gone, or no memory controller)."""


V1_UNLIMITED = 9223372036854771712  # what v1 reports for "no limit" (PAGE_COUNTER_MAX * 4096)
PAGE = 4096
# not "use mode: in-place": the cgroup at hand is monsoon's own, and in-place would cap monsoon with the service
V2_DELEGATE_HINT = ("run monsoon in a leaf cgroup of a delegated subtree (e.g. systemd-run --user --scope "
                    "-p Delegate=yes ...), or give the service a cgroup of its own (a container) and use "
                    "mode: in-place there")


@dataclass(frozen=True)
class CgroupDir:
    version: int        # 1 or 2
    path: Path

    @property
    def limit_file(self) -> Path:
        return self.path / ("memory.limit_in_bytes" if self.version == 1 else "memory.max")

    @property
    def usage_file(self) -> Path:
        return self.path / ("memory.usage_in_bytes" if self.version == 1 else "memory.current")

    def read_limit(self) -> str:
        return self.limit_file.read_text().strip()

    def procs(self) -> list[int]:
        try:
            return [int(x) for x in (self.path / "cgroup.procs").read_text().split()]
        except FileNotFoundError:
            return []

    def subtree_procs(self) -> list[int]:
        """Every process a limit on this cgroup would cap: its own and those of every cgroup below it."""
        out = set(self.procs())
        for d, _, files in os.walk(self.path):
            if d != str(self.path) and "cgroup.procs" in files:
                out.update(CgroupDir(self.version, Path(d)).procs())
        return sorted(out)

    def oom_kills(self) -> int | None:
        f = self.path / ("memory.oom_control" if self.version == 1 else "memory.events")
        try:
            for line in f.read_text().splitlines():
                k, _, v = line.partition(" ")
                if k == "oom_kill":
                    return int(v)
        except (FileNotFoundError, ValueError):
            pass
        return None

    def stats(self) -> dict:
        out: dict = {"cgroup": str(self.path), "version": self.version}
        for key, f in (("limit", self.limit_file), ("usage_bytes", self.usage_file),
                       ("failcnt", self.path / "memory.failcnt")):
            try:
                out[key] = f.read_text().strip()
            except FileNotFoundError:
                pass
        out["oom_kills"] = self.oom_kills()
        return out


def limit_bytes(value: str) -> int | None:
    """A limit file's value in bytes; None = unlimited."""
    v = value.strip()
    if v == "max" or v == "-1":
        return None
    n = int(v)
    return None if n >= V1_UNLIMITED else n


class CgroupFS:
    """Finds a process's memory cgroup from ``/proc/<pid>/cgroup`` and the mount table.

    ``proc`` and ``mounts`` are parameters so tests can point them at a fake tree.
    """

    error: type[Exception] = CgroupUnavailable    # what memory_cgroup raises (the fault plan's: its own error)

    def __init__(self, proc: Path = Path("/proc"), mounts: list[tuple[str, str, str]] | None = None):
        self.proc = Path(proc)
        self._mounts = mounts

    def mounts(self) -> list[tuple[str, str, str]]:
        """(fstype, mountpoint, options) of every cgroup mount."""
        if self._mounts is not None:
            return self._mounts
        out = []
        for line in Path("/proc/self/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[2] in ("cgroup", "cgroup2"):
                out.append((parts[2], parts[1], parts[3]))
        return out

    def memory_cgroup(self, pid: int) -> CgroupDir:
        try:
            lines = (self.proc / str(pid) / "cgroup").read_text().splitlines()
        except FileNotFoundError:
            raise self.error(f"process {pid} is gone") from None
        v1_mount = next((mp for fs, mp, opts in self.mounts() if fs == "cgroup" and "memory" in opts.split(",")), None)
        v2_mount = next((mp for fs, mp, _ in self.mounts() if fs == "cgroup2"), None)
        v2_rel = None
        for line in lines:
            hid, ctrls, rel = line.split(":", 2)
            if v1_mount and "memory" in ctrls.split(","):
                return CgroupDir(1, Path(v1_mount) / rel.lstrip("/"))
            if hid == "0" and ctrls == "":
                v2_rel = rel
        if v2_mount and v2_rel is not None:
            d = Path(v2_mount) / v2_rel.lstrip("/")
            controllers = (d / "cgroup.controllers") if (d / "cgroup.controllers").exists() else Path(v2_mount) / "cgroup.controllers"
            if "memory" in controllers.read_text().split():
                return CgroupDir(2, d)
        raise self.error("no memory cgroup controller for this process: neither a v1 'memory' hierarchy nor "
                         "'memory' in the v2 cgroup.controllers (this kernel/container does not allow memory limits)")

    def available(self) -> str | None:
        """None when memory limits can be set here, else the reason they cannot."""
        try:
            cg = self.memory_cgroup(os.getpid())
        except CgroupUnavailable as e:
            return str(e)
        if not os.access(cg.path, os.W_OK):
            return f"{cg.path} is not writable (needs root or a delegated cgroup)"
        if cg.version == 2:
            sub = (cg.path / "cgroup.subtree_control")
            if "memory" not in sub.read_text().split() and cg.procs():
                return (f"cgroup v2: {cg.path} holds processes and does not delegate the memory controller to "
                        "children (no-internal-processes rule); " + V2_DELEGATE_HINT)
        return None
