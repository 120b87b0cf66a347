"""Labels and the reaper: every process monsoon starts carries ``MONSOON_RUN_ID`` and ``MONSOON_OWNER_PID``;
leftovers are found and killed by them; run ids and Kubernetes names are checked here."""
from __future__ import annotations
import hashlib

import os
import re
import shutil
import signal
from pathlib import Path


OWNER_ENV = "MONSOON_OWNER_PID"
# the same two labels on a container (``provider: docker``), plus the service it runs
RUN_ID_LABEL = "monsoon.run-id"
OWNER_LABEL = "monsoon.owner-pid"
SERVICE_LABEL = "monsoon.service"


def labelled_processes() -> dict[int, str]:
    """Live processes started by monsoon: PID -> the run id in their MONSOON_RUN_ID environment label."""
    return {pid: rid for pid, (rid, _) in process_owners().items()}


def process_owners() -> dict[int, tuple[str, int | None]]:
    """Live processes started by monsoon: PID -> (run id, PID of the monsoon process that started it).

    Both come from the environment labels ``MONSOON_RUN_ID`` and ``MONSOON_OWNER_PID``; the owner is None
    for a process labelled before owners were recorded."""
    out: dict[int, tuple[str, int | None]] = {}
    me, owner_label = os.getpid(), OWNER_ENV.encode() + b"="
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
        except (OSError, ProcessLookupError):
            continue
        rid, owner = None, None
        for kv in env:
            if kv.startswith(b"MONSOON_RUN_ID="):
                rid = kv[len(b"MONSOON_RUN_ID="):].decode()
            elif kv.startswith(owner_label):
                v = kv[len(owner_label):]
                owner = int(v) if v.isdigit() else None
        if rid is not None:
            out[int(d.name)] = (rid, owner)
    return out


def find_leftovers(run_id: str | None = None) -> list[int]:
    """PIDs of live processes started by monsoon (optionally of one run), found by their environment label."""
    return [pid for pid, rid in labelled_processes().items() if run_id is None or rid == run_id]


def reap(run_id: str | None = None) -> list[int]:
    """Kill every leftover process of a run (or of any run); returns the PIDs signalled."""
    pids = find_leftovers(run_id)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    # temp clusters that run-postgres puts in /tmp when the run dir is out of the postgres user's reach
    for d in Path("/tmp").glob(f"monsoon-pg-{run_id or ''}*"):
        shutil.rmtree(d, ignore_errors=True)
    return pids


RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")


def check_run_id(run_id: str) -> str:
    """Run ids end up in proxy names, cgroup directory names and Kubernetes labels."""
    if not RUN_ID_RE.match(run_id) or "__" in run_id:
        raise ValueError(f"run id {run_id!r}: use letters, digits, '-', '_', '.' (max 63, no '__')")
    return run_id


RUN_LABEL = "monsoon.io/run-id"


def _dns_name(*parts: str) -> str:
    # 63, not the 253 a name may have: Chaos Mesh and Litmus copy the name into label values of what they create
    return _short(re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-"))


def _short(s: str, limit: int = 63) -> str:
    """``s`` cut to ``limit`` characters; a cut one ends in a hash of the whole, so distinct inputs stay distinct."""
    if len(s) <= limit:
        return s
    return s[:limit - 9].rstrip("-_.") + "-" + hashlib.sha256(s.encode()).hexdigest()[:8]
