"""Faults on ``provider: docker`` services: what the process and cgroup backends do when the target is a container.

* pod-kill: ``docker kill`` (the stack's ``kill``), then monsoon's supervisor restarts the container (its restart
  policy); landed when the container runs again with a new PID — the process backend's own check.
* process-pause: ``docker pause`` (the cgroup freezer); landed when Docker says ``State.Paused``; heal =
  ``docker unpause``. ``heal_all`` unpauses every paused container carrying the run's label.
* memory-pressure: ``docker update --memory`` (swap equal: no swap); the original limits are written to a
  record first, so ``heal_all`` restores them after monsoon was killed, and ``census`` names a limit not back.
"""
from __future__ import annotations

from typing import Any

from monsoon.faults.base import FaultError
from monsoon.stack.containers import client, run_containers


def container_of(stack: Any, service: str | None):
    """The ContainerProc of a container service, None for a process service (or a stack without containers)."""
    get = getattr(stack, "container", None)
    return get(service) if get is not None and service is not None else None


def paused(name: str) -> bool | None:
    """Whether Docker says the container is paused (None when it is gone)."""
    try:
        c = client().containers.get(name)
    except Exception:   # no such container, or no daemon to ask: either way it is gone (None, as documented)
        return None
    return bool((c.attrs.get("State") or {}).get("Paused"))


class UnpauseFailed(FaultError):
    """Paused containers of a run that could not be unpaused (``failed``: one line each, with the reason);
    ``healed``: what was healed before the failure was raised (the other containers are still tried)."""

    def __init__(self, failed: list[str], healed: list[str]) -> None:
        self.failed, self.healed = list(failed), list(healed)
        super().__init__("; ".join(self.failed) + (f" (healed: {', '.join(self.healed)})" if self.healed else ""))


def unpause_run(run_id: str) -> list[str]:
    """Unpause every paused container of a run (found by its label); returns what was unpaused.

    Raises ``UnpauseFailed`` after trying every container when one or more could not be unpaused."""
    out: list[str] = []
    failed: list[str] = []
    for c in run_containers(run_id):
        if c.status == "paused":
            try:
                c.unpause()
                out.append(f"container {c.name} unpaused")
            except Exception as e:   # every container is tried; the failures are raised together below
                failed.append(f"container {c.name}: unpause failed: {type(e).__name__}: {e}")
    if failed:
        raise UnpauseFailed(failed, out)
    return out


def paused_census(run_id: str) -> list[str]:
    return [f"container {c.name} paused" for c in run_containers(run_id) if c.status == "paused"]


def memory(name: str) -> tuple[int, int] | None:
    """(Memory, MemorySwap) of a container's HostConfig in bytes (0 = no limit), None when it is gone."""
    try:
        c = client().containers.get(name)
    except Exception:   # no such container, or no daemon to ask: either way it is gone (None, as documented)
        return None
    hc = c.attrs.get("HostConfig") or {}
    return int(hc.get("Memory") or 0), int(hc.get("MemorySwap") or 0)


def set_memory(name: str, mem: int, swap: int) -> None:
    """``docker update --memory mem --memory-swap swap`` (swap -1: unlimited swap)."""
    client().containers.get(name).update(mem_limit=mem, memswap_limit=swap)


def restore_memory(rec: dict) -> bool:
    """Put a container's recorded limits back; False when the container is gone (nothing left to restore)."""
    now = memory(rec["container"])
    if now is None:
        return False
    mem, swap = int(rec["original"]), int(rec["original_swap"])
    if now != (mem, swap):
        set_memory(rec["container"], mem, swap if swap > 0 else -1)
    return True
