"""A private Docker daemon for machines that have Docker installed but no daemon running (CI here).

``monsoon dockerd start`` runs ``dockerd`` with its own data root, exec root and unix socket under
``<cache>/dockerd`` (``MONSOON_DOCKERD_DIR``), and never touches the host's networking: no bridge, no
iptables, no masquerading, no userland proxy; containers run with the host network. ``stop`` ends it
(SIGTERM, then SIGKILL) and unmounts what it leaves mounted (``exec/netns/default``).

Which daemon monsoon talks to: ``DOCKER_HOST`` when set, else this private daemon when it answers,
else Docker's default socket (``docker_host``), as testcontainers does.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from monsoon import settings
from monsoon.paths import CACHE


FLAGS = ("--bridge=none", "--iptables=false", "--ip6tables=false", "--ip-masq=false", "--userland-proxy=false")


SUN_PATH_MAX = 107     # a unix socket path's bytes (sun_path is 108 with its NUL); containerd's fail past it


class DockerdError(RuntimeError):
    pass


def root() -> Path:
    return Path(settings.env("MONSOON_DOCKERD_DIR") or CACHE / "dockerd")


def sock_path(d: Path | None = None) -> Path:
    return (d or root()) / "docker.sock"


def _answers(sock: Path, timeout: float = 2.0) -> bool:
    """True when a Docker API answers _ping on the unix socket ``sock``."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(str(sock))
            s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            return b" 200 " in s.recv(256)
    except OSError:
        return False


def docker_host() -> str | None:
    """The Docker endpoint to use: DOCKER_HOST, else monsoon's private daemon when it runs, else None (default)."""
    if os.environ.get("DOCKER_HOST"):
        return os.environ["DOCKER_HOST"]
    if _answers(sock_path()):
        return f"unix://{sock_path()}"
    return None


def _pid(d: Path) -> int | None:
    try:
        pid = int((d / "dockerd.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return None
    return pid if cmd and Path(cmd.decode()).name == "dockerd" else None


def running(d: Path | None = None) -> int | None:
    """PID of the private daemon when it runs."""
    return _pid(d or root())


def start(d: Path | None = None, timeout: float = 30.0) -> tuple[str, bool]:
    """Start the private daemon unless it already answers; returns (DOCKER_HOST value, whether started now)."""
    d = d or root()
    sock = sock_path(d)
    if _answers(sock):
        return f"unix://{sock}", False
    longest = d.resolve() / "exec" / "containerd" / "containerd-debug.sock"
    if len(str(longest)) > SUN_PATH_MAX:
        raise DockerdError(f"{d} is too deep for a private dockerd: its containerd's socket {longest} would be "
                           f"{len(str(longest))} bytes, over the {SUN_PATH_MAX} a unix socket path may have "
                           "(set MONSOON_DOCKERD_DIR to a shorter directory)")
    exe = shutil.which("dockerd") or ("/usr/sbin/dockerd" if Path("/usr/sbin/dockerd").exists() else None)
    if exe is None:
        raise DockerdError("dockerd not found: install Docker with tools/install-docker "
                           "(apt-get install -y --no-install-recommends docker.io)")
    if os.geteuid() != 0:
        raise DockerdError("a private dockerd needs root (or run your own Docker and set DOCKER_HOST)")
    stop(d)      # a dead daemon's leftovers (pid file, socket, mounts)
    for sub in ("root", "exec"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MONSOON_")}   # not a run's process
    env["PATH"] = env.get("PATH", "") + ":/usr/sbin:/sbin"
    with open(d / "dockerd.log", "ab") as log:
        proc = subprocess.Popen([exe, "--data-root", str(d / "root"), "--exec-root", str(d / "exec"),
                                 "-H", f"unix://{sock}", "--pidfile", str(d / "dockerd.pid"), *FLAGS],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True, env=env)
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if _answers(sock):
            return f"unix://{sock}", True
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    tail = (d / "dockerd.log").read_text(errors="replace").splitlines()[-15:]
    stop(d)
    raise DockerdError(f"dockerd did not answer on {sock} within {timeout:.0f}s; last lines of "
                       f"{d / 'dockerd.log'}:\n  " + "\n  ".join(tail))


@contextmanager
def ensure() -> Iterator[str | None]:
    """The Docker daemon to use: DOCKER_HOST's or monsoon's private one, started here (and stopped on the way
    out) when none answers; raises DockerdError (one line on what to do) when none can be started."""
    started = False
    if docker_host() is None:
        _, started = start()
    try:
        yield docker_host()
    finally:
        if started:
            stop()


def _mounts_under(d: Path) -> list[str]:
    """Mount points at ``d`` or below it, deepest first (dockerd bind-mounts its data root onto itself)."""
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    top = str(d.resolve())
    pts = [ln.split()[1].replace("\\040", " ") for ln in lines]
    return sorted((p for p in pts if p == top or p.startswith(top + "/")), key=len, reverse=True)


def stop(d: Path | None = None, timeout: float = 20.0) -> bool:
    """Stop the private daemon (SIGTERM, SIGKILL after ``timeout``) and unmount what it left; True if it ran."""
    d = d or root()
    pid = _pid(d)
    if pid is not None:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout and Path(f"/proc/{pid}").exists() and _pid(d) == pid:
            time.sleep(0.1)
        if Path(f"/proc/{pid}").exists() and _pid(d) == pid:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            time.sleep(0.5)
    if d.exists():
        for m in _mounts_under(d / "exec") + [str(x) for x in _mounts_under(d / "root") if "/overlay2/" not in x]:
            subprocess.run(["umount", "-l", m], capture_output=True)
        for f in ("docker.sock", "dockerd.pid"):
            try:
                (d / f).unlink()
            except FileNotFoundError:
                pass
    return pid is not None
