"""A CPU budget for the services a stack starts: ``MONSOON_SERVICE_CPUS=0.5`` puts every process service (and
whatever it forks) into one cgroup of the run with a CPU quota of 0.5 cores; monsoon itself (pytest, the load
generator) stays outside it. Containers and pods have their own ``cpus:`` and are not affected.

cgroup v1 (the ``cpu`` controller's ``cpu.cfs_quota_us``) and v2 (``cpu.max``). The cgroup is
``<parent>/monsoon-cpus-<pid>``, made once per monsoon process, removed at its exit; one left by a killed
monsoon is removed by the next one (when empty). Paths are parameters, for tests."""
from __future__ import annotations

import atexit
import math
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from monsoon.stack.cgroupfs import CgroupFS

ENV = "MONSOON_SERVICE_CPUS"
PERIOD_US = 100_000
MIN_QUOTA_US = 1_000          # the kernel's floor for cfs quota
PREFIX = "monsoon-cpus-"
NEEDS = f"{ENV} needs a writable cgroup cpu controller"


class CpuBudgetError(RuntimeError):
    """The budget cannot be applied here (no writable cpu controller, a quota the kernel refuses)."""


def budget_from_env(environ: Mapping[str, str] | None = None) -> float | None:
    """The cores of ``MONSOON_SERVICE_CPUS`` (None when unset or empty); ValueError for a bad value."""
    raw = (os.environ if environ is None else environ).get(ENV, "").strip()
    if not raw:
        return None
    try:
        cores = float(raw)
    except ValueError:
        raise ValueError(f"{ENV}={raw!r} is not a number of cores (e.g. 0.5, 1, 2)") from None
    if not math.isfinite(cores) or cores <= 0:
        raise ValueError(f"{ENV}={raw!r}: the cores must be a number > 0 (e.g. 0.5, 1, 2)")
    if quota_us(cores) < MIN_QUOTA_US:
        raise ValueError(f"{ENV}={raw!r}: below the smallest quota, {MIN_QUOTA_US / PERIOD_US:g} cores")
    return cores


def quota_us(cores: float, period_us: int = PERIOD_US) -> int:
    """The CFS quota for ``cores`` over ``period_us``."""
    return int(round(cores * period_us))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _write(path: Path, text: str) -> None:
    with open(path, "w") as f:     # one write(2): the kernel reads a cgroup file write by write
        f.write(text)


def locate(mounts: list[tuple[str, str, str]] | None = None, self_cgroup: str | None = None) -> tuple[int, Path]:
    """``(version, parent directory)`` for the run's cpu cgroup: under this process's own cpu cgroup on v1
    (the mount's root when that is not visible); on v2 under its own cgroup when that one delegates ``cpu``,
    else under the mount's root. ``mounts``: (fstype, mountpoint, options); ``self_cgroup``: /proc/self/cgroup."""
    mounts = CgroupFS().mounts() if mounts is None else mounts
    if self_cgroup is None:
        self_cgroup = Path("/proc/self/cgroup").read_text()
    v1 = next((mp for fs, mp, opts in mounts if fs == "cgroup" and "cpu" in opts.split(",")), None)
    v2 = next((mp for fs, mp, _ in mounts if fs == "cgroup2"), None)
    rel1 = rel2 = None
    for line in self_cgroup.splitlines():
        hid, _, rest = line.partition(":")
        ctrls, _, rel = rest.partition(":")
        if "cpu" in ctrls.split(","):
            rel1 = rel
        elif hid == "0" and ctrls == "":
            rel2 = rel
    if v1 is not None:
        own = Path(v1) / (rel1 or "/").lstrip("/")
        return 1, own if own.is_dir() else Path(v1)
    if v2 is not None and "cpu" in _read(Path(v2) / "cgroup.controllers").split():
        root = Path(v2)
        own = root / (rel2 or "/").lstrip("/")
        for cand in ([own] if own != root and own.is_dir() else []) + [root]:
            if _delegates_cpu(cand):
                return 2, cand
        raise CpuBudgetError(f"{NEEDS}: cgroup v2 at {root}: cannot enable the cpu controller for children "
                             f"of {own} or {root} (a cgroup holding processes cannot delegate; run monsoon in a "
                             f"delegated subtree, e.g. systemd-run --scope -p Delegate=yes ...)")
    raise CpuBudgetError(f"{NEEDS}: no cgroup v1 'cpu' hierarchy and no 'cpu' in a cgroup v2 cgroup.controllers "
                         f"(mounts: {', '.join(mp for _, mp, _ in mounts) or 'none'})")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _delegates_cpu(d: Path) -> bool:
    sub = d / "cgroup.subtree_control"
    if "cpu" in _read(sub).split():
        return True
    try:
        _write(sub, "+cpu")
    except OSError:
        return False
    return "cpu" in _read(sub).split()


@dataclass
class CpuCgroup:
    """One cgroup with a CPU quota; :meth:`preexec` puts a child process into it before it execs."""
    version: int
    path: Path
    cores: float
    period_us: int = PERIOD_US

    @property
    def parent(self) -> Path:
        return self.path.parent

    @property
    def procs_file(self) -> Path:
        return self.path / "cgroup.procs"

    @classmethod
    def create(cls, cores: float, *, parent: Path, version: int, name: str | None = None,
               period_us: int = PERIOD_US) -> "CpuCgroup":
        """Make ``parent/name`` (default ``monsoon-cpus-<pid>``) and set its quota; CpuBudgetError if it cannot."""
        if not cores > 0 or quota_us(cores, period_us) < MIN_QUOTA_US:
            raise ValueError(f"{ENV}: {cores!r} cores is not a usable quota")
        cg = cls(version, Path(parent) / (name or f"{PREFIX}{os.getpid()}"), cores, period_us)
        try:
            cg.path.mkdir(exist_ok=True)
        except OSError as e:
            raise CpuBudgetError(f"{NEEDS}: cannot create {cg.path}: {e.strerror or e}") from None
        try:
            cg.set_quota()
        except OSError as e:
            cg.remove()
            raise CpuBudgetError(f"{NEEDS}: cannot set the quota of {cg.path} to {cores:g} cores: "
                                 f"{e.strerror or e} (a parent quota below it is refused)") from None
        return cg

    def quota_files(self) -> dict[str, str]:
        """What :meth:`set_quota` writes: file name -> text, in order."""
        q = quota_us(self.cores, self.period_us)
        if self.version == 1:
            return {"cpu.cfs_period_us": str(self.period_us), "cpu.cfs_quota_us": str(q)}
        return {"cpu.max": f"{q} {self.period_us}"}

    def set_quota(self) -> None:
        for f, text in self.quota_files().items():
            _write(self.path / f, text)

    def preexec(self) -> Callable[[], None]:
        """A ``preexec_fn`` for :class:`subprocess.Popen`: the child moves itself into this cgroup."""
        procs = os.fsencode(self.procs_file)

        def join() -> None:
            fd = os.open(procs, os.O_WRONLY)
            try:
                os.write(fd, str(os.getpid()).encode())
            finally:
                os.close(fd)
        return join

    def add(self, pid: int) -> None:
        _write(self.procs_file, str(pid))

    def pids(self) -> list[int]:
        return [int(x) for x in _read(self.procs_file).split()]

    def stat(self) -> dict[str, int]:
        """``cpu.stat`` (nr_periods, nr_throttled, throttled_time or throttled_usec, ...)."""
        out = {}
        for line in _read(self.path / "cpu.stat").splitlines():
            k, _, v = line.partition(" ")
            if v.strip().lstrip("-").isdigit():
                out[k] = int(v)
        return out

    def probe(self) -> None:
        """Start one short process through :meth:`preexec`: CpuBudgetError when a child cannot join."""
        cmd = [shutil.which("true") or sys.executable] + ([] if shutil.which("true") else ["-c", ""])
        try:
            rc = subprocess.run(cmd, preexec_fn=self.preexec(), stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=30).returncode
        except (OSError, subprocess.SubprocessError) as e:
            raise CpuBudgetError(f"{NEEDS}: a process cannot be moved into {self.procs_file} "
                                 f"({type(e).__name__}: {e})") from None
        if rc != 0:
            raise CpuBudgetError(f"{NEEDS}: a probe process in {self.path} exited {rc}")

    def remove(self, wait_s: float = 2.0) -> bool:
        """Move what is left back to the parent, then remove the cgroup; False when it is still there."""
        deadline = time.monotonic() + wait_s
        while True:
            for pid in self.pids():
                try:
                    _write(self.parent / "cgroup.procs", str(pid))
                except OSError:
                    pass        # gone meanwhile
            try:
                self.path.rmdir()
                return True
            except FileNotFoundError:
                return True
            except OSError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.05)


def remove_stale(parent: Path) -> list[Path]:
    """Remove the empty ``monsoon-cpus-<pid>`` cgroups of monsoon processes that are gone; the removed ones."""
    out = []
    for d in sorted(Path(parent).glob(f"{PREFIX}*")):
        pid = d.name[len(PREFIX):]
        if not pid.isdigit() or int(pid) == os.getpid() or _alive(int(pid)):
            continue
        try:
            d.rmdir()
            out.append(d)
        except OSError:
            pass
    return out


def check(cores: float = 1.0) -> None:
    """Make, probe and remove a cgroup with ``cores``: CpuBudgetError when a budget cannot be applied here."""
    version, parent = locate()
    cg = CpuCgroup.create(cores, parent=parent, version=version, name=f"{PREFIX}{os.getpid()}-check")
    try:
        cg.probe()
    finally:
        cg.remove()


# ------------------------------------------------------- the process's services cgroup

_lock = threading.Lock()
_active: CpuCgroup | None = None


def _teardown() -> None:
    global _active
    with _lock:
        cg, _active = _active, None
    if cg is not None and not cg.remove():
        print(f"monsoon: could not remove the cgroup {cg.path} (processes still in it: {cg.pids()})",
              file=sys.stderr)


def service_cgroup() -> CpuCgroup | None:
    """The cgroup of this process's services under ``MONSOON_SERVICE_CPUS`` (None without a budget): made
    and probed on first use, removed at exit. ValueError for a bad value, CpuBudgetError when it cannot be made."""
    global _active
    cores = budget_from_env()
    with _lock:
        if cores is None:
            return None
        if _active is not None and _active.cores == cores:
            return _active
        version, parent = locate()
        remove_stale(parent)
        if _active is not None:          # the budget changed within the process: a new quota, same cgroup
            _active.cores = cores
            try:
                _active.set_quota()
            except OSError as e:
                raise CpuBudgetError(f"{NEEDS}: cannot set the quota of {_active.path} to {cores:g} cores: "
                                     f"{e.strerror or e}") from None
            return _active
        cg = CpuCgroup.create(cores, parent=parent, version=version)
        try:
            cg.probe()
        except CpuBudgetError:
            cg.remove()
            raise
        _active = cg
        atexit.register(_teardown)
        return cg


def service_preexec() -> Callable[[], None] | None:
    """The ``preexec_fn`` for a process service: None without a budget."""
    cg = service_cgroup()
    return cg.preexec() if cg is not None else None


def problems() -> list[str]:
    """Why ``MONSOON_SERVICE_CPUS`` cannot be applied (empty: fine, or no budget), for a stack's preflight."""
    try:
        service_cgroup()
    except (ValueError, CpuBudgetError) as e:
        return [str(e)]
    return []
