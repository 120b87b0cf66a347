"""Services as containers (``provider: docker``), through testcontainers-python, and their reaper.

A :class:`ContainerProc` stands where a ``subprocess.Popen`` stands for a process service (``pid``, ``poll``,
``wait``, ``returncode``), so the supervisor treats both alike: the same start/ready/exit/restart events, the
same log file (the container's output is followed into it), the same restart policy (monsoon's supervisor
restarts an exited container with ``docker start``: Docker's own restart policy stays ``no``, so every exit is
seen, inspected and reported before the next start).

Every container carries the labels ``monsoon.run-id``, ``monsoon.owner-pid`` and ``monsoon.service``
(:data:`~monsoon.stack.reaper.RUN_ID_LABEL`): Ryuk cannot run on a daemon without a bridge, so
``reap_containers`` (``monsoon reap``, ``monsoon heal``) finds and removes them by label instead.
"""
from __future__ import annotations

import datetime as dt
import logging
import os
import subprocess
import threading
import time
from pathlib import Path
from collections.abc import Sequence
from typing import Any

from monsoon.extras import need
from monsoon.stack.dockerd import docker_host
from monsoon.stack.reaper import OWNER_LABEL, RUN_ID_LABEL, SERVICE_LABEL

WHAT = "a container stack (provider: docker)"


def client():
    """A docker-py client of the daemon monsoon uses (``dockerd.docker_host``); docker-py is imported now
    (``monsoon[containers]``), not when monsoon is."""
    docker = need("docker", "containers", WHAT)
    host = docker_host()
    return docker.DockerClient(base_url=host) if host else docker.from_env()


def _testcontainer(image: str, host: str | None, **kw):
    """A testcontainers ``DockerContainer`` on ``host``, without Ryuk (it needs a port mapping, which a daemon
    with --bridge=none cannot give: monsoon reaps by label). Set on testcontainers' own configuration when a
    container stack starts, not in the environment of every process that imports monsoon."""
    need("docker", "containers", WHAT)
    tc = need("testcontainers.core.container", "containers", WHAT)
    need("testcontainers.core.config", "containers", WHAT).testcontainers_config.ryuk_disabled = True
    client_kw = {"environment": {**os.environ, "DOCKER_HOST": host}} if host else {}
    return tc.DockerContainer(image, docker_client_kw=client_kw, **kw)


def mem_bytes(size: str) -> int:
    """``256m`` -> bytes (b, k, m, g; powers of 1024, as Docker reads them)."""
    s = size.strip().lower()
    mult = {"b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(s[-1:], None)
    return int(float(s[:-1]) * mult) if mult else int(float(s))


def container_name(run_id: str, service: str) -> str:
    return f"monsoon-{run_id}-{service}"


class ContainerProc:
    """One service's container, looking like a Popen to the supervisor."""

    def __init__(self, *, image: str, command: list[str], env: dict[str, str], name: str, labels: dict[str, str],
                 log_path: Path, workdir: Path, mem_limit: str | None = None, cpus: float | None = None,
                 volumes: Sequence[str] = (), stop_signal: str = "SIGTERM"):
        kw: dict[str, Any] = {"labels": labels, "network_mode": "host", "working_dir": str(workdir),
                              "stop_signal": stop_signal}
        if mem_limit:
            kw["mem_limit"] = kw["memswap_limit"] = mem_bytes(mem_limit)   # no swap: over the limit is an OOM kill
        if cpus:
            kw["nano_cpus"] = int(cpus * 1e9)
        self.tc = _testcontainer(image, docker_host(), command=command or None, env=env, name=name, **kw)
        self.tc.with_volume_mapping(str(workdir), str(workdir), "rw")
        for v in volumes:
            parts = v.split(":")
            self.tc.with_volume_mapping(parts[0], parts[1] if len(parts) > 1 else parts[0],
                                        parts[2] if len(parts) > 2 else "rw")
        self.name, self.log_path = name, log_path
        self.returncode: int | None = None
        self.terminations: list[dict] = []     # every exit, inspected at once: finished_at, exit_code, oom_killed
        self._state: dict = {}
        self._follower: threading.Thread | None = None
        self._exit_lock = threading.Lock()

    # --- lifecycle
    @property
    def container(self):
        return self.tc.get_wrapped_container()

    def start(self) -> "ContainerProc":
        """Create and start the container (first time), or ``docker start`` it again (a restart)."""
        since = dt.datetime.now(dt.timezone.utc)
        if self.tc._container is None:
            self._remove_stale()
            self.tc.start()
        else:
            self.container.start()
        self.returncode = None
        self.refresh()
        self._follower = threading.Thread(target=self._follow, args=(since,), name=f"logs-{self.name}", daemon=True)
        self._follower.start()
        return self

    def _remove_stale(self) -> None:
        """A container of the same name left by an earlier start of this run id (a crashed run): removed."""
        try:
            old = client().containers.get(self.name)
        except Exception:   # no container of that name (or no daemon to ask): nothing stale to remove
            return
        if (old.labels or {}).get(RUN_ID_LABEL) == self.tc._kwargs["labels"].get(RUN_ID_LABEL):
            old.remove(force=True, v=True)

    def _follow(self, since: dt.datetime) -> None:
        try:
            stream = self.container.logs(stream=True, follow=True, stdout=True, stderr=True, since=since)
            with open(self.log_path, "ab", buffering=0) as log:
                for chunk in stream:
                    log.write(chunk)
        except Exception:   # the container is gone: its log ends here
            pass

    def refresh(self) -> dict:
        c = self.container
        c.reload()
        self._state = c.attrs.get("State") or {}
        return self._state

    @property
    def state(self) -> dict:
        return self._state

    @property
    def pid(self) -> int:
        return int(self._state.get("Pid") or 0)

    @property
    def id(self) -> str:
        return self.container.id[:12]

    def _exited(self, st: dict) -> int:
        with self._exit_lock:       # the supervisor's wait and a collector's poll may both see the exit
            if self.returncode is not None:
                return self.returncode
            return self._record_exit(st)

    def _record_exit(self, st: dict) -> int:
        code = int(st.get("ExitCode", -1))
        self.terminations.append({"finished_at": st.get("FinishedAt"), "exit_code": code,
                                  "oom_killed": 1 if st.get("OOMKilled") else 0,
                                  "reason": "OOMKilled" if st.get("OOMKilled") else None})
        self.returncode = code
        if self._follower is not None:
            self._follower.join(timeout=2)
        return code

    def poll(self) -> int | None:
        if self.returncode is not None:
            return self.returncode
        try:
            st = self.refresh()
        except Exception:       # removed behind our back
            self.returncode = 137
            return self.returncode
        if st.get("Running") or st.get("Paused") or st.get("Restarting"):
            return None
        return self._exited(st)

    def wait(self, timeout: float | None = None) -> int:
        """The exit code once the container has exited (``subprocess.TimeoutExpired`` after ``timeout``)."""
        while self.returncode is None:
            try:
                self.container.wait(timeout=timeout)
            except Exception:
                if timeout is not None and self.poll() is None:
                    raise subprocess.TimeoutExpired(self.name, timeout) from None
                time.sleep(0.2)       # a hiccup of the daemon's stream: ask again (poll says when it is gone)
            self.poll()
        return self.returncode

    @property
    def oom_killed(self) -> bool:
        return bool(self._state.get("OOMKilled"))

    # --- capabilities the faults use
    def signal(self, sig: int) -> None:
        self.container.kill(signal=int(sig))

    def pause(self) -> None:
        self.container.pause()

    def unpause(self) -> None:
        self.container.unpause()

    def memory_limit(self) -> int:
        c = self.container
        c.reload()
        return int((c.attrs.get("HostConfig") or {}).get("Memory") or 0)

    def stop(self, timeout: float) -> None:
        """Stop (its stop signal, SIGKILL after ``timeout``) and remove the container."""
        try:
            c = self.container
        except Exception:   # never created, or already removed: nothing to stop
            return
        try:
            c.reload()
            if (c.attrs.get("State") or {}).get("Paused"):
                c.unpause()
            if self.returncode is None:
                c.stop(timeout=max(1, int(timeout)))
        except Exception:   # safe to ignore: remove(force=True) below kills and removes it all the same
            pass
        self.poll()
        try:
            c.remove(force=True, v=True)
        except Exception as e:   # said; the container keeps the run's label: `monsoon heal` removes it
            logging.getLogger(__name__).warning("monsoon: container %s was not removed: %s: %s",
                                                getattr(c, "name", "?"), type(e).__name__, e)


# ------------------------------------------------------------------ reaper

def labels_for(run_id: str, service: str) -> dict[str, str]:
    return {RUN_ID_LABEL: run_id, OWNER_LABEL: str(os.getpid()), SERVICE_LABEL: service}


def run_containers(run_id: str | None = None, cl=None) -> list:
    """Every container (running, paused or exited) of a run, or of any monsoon run, found by its label."""
    try:
        cl = cl or client()
        flt = {"label": f"{RUN_ID_LABEL}={run_id}" if run_id else RUN_ID_LABEL}
        return cl.containers.list(all=True, filters=flt)
    except Exception:        # no daemon: nothing of ours can be running
        return []


def container_owners() -> dict[str, int | None]:
    """Run id -> the PID of the monsoon process that started its containers (``heal --all`` skips live ones)."""
    out: dict[str, int | None] = {}
    for c in run_containers():
        lab = c.labels or {}
        owner = lab.get(OWNER_LABEL, "")
        out[lab.get(RUN_ID_LABEL, "?")] = int(owner) if owner.isdigit() else None
    return out


def reap_containers(run_id: str | None = None) -> list[str]:
    """Remove every container of a run (or of every run), paused ones included; returns their names."""
    gone = []
    for c in run_containers(run_id):
        try:
            if c.status == "paused":
                c.unpause()
            c.remove(force=True, v=True)
            gone.append(c.name)
        except Exception as e:   # said; the next container is still tried, and container_census names this one
            logging.getLogger(__name__).warning("monsoon: container %s of run %s was not removed: %s: %s",
                                                c.name, run_id or "(any)", type(e).__name__, e)
    return gone


def container_census(run_id: str) -> list[str]:
    """What of a run's containers is still there: each container, and whether it is paused."""
    return [f"container {c.name} ({c.status})" for c in run_containers(run_id)]
