"""Process faults on a stack's services: pod-kill / kafka-broker-restart and process-pause.

* pod-kill: a signal (SIGKILL by default) to the service's whole process group
  through the stack; it landed when the supervisor brought the service back with
  a new PID.  Nothing to heal: the restart is the recovery.
* process-pause: SIGSTOP to the group; it landed when ``/proc/<pid>/stat`` says
  ``T`` for the group.  Heal = SIGCONT to the group and every recorded PID, always.

``heal_all(run_id)`` also finds stopped processes of a run without handles (after
a crash): the stack gives every process ``MONSOON_RUN_ID`` in its environment.
"""
from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any, Protocol, cast

from monsoon.faults import container as ctr
from monsoon.faults.base import FaultContext, FaultError, Handle, Landing, wait_for
from monsoon.spec.fault import FaultSpec, PodKillParams, ProcessPauseParams
from monsoon.stack.reaper import find_leftovers


PROC = Path("/proc")


class Processes(Protocol):
    """What the backend needs of a stack (``monsoon.stack.supervisor.Stack`` has it)."""
    def pid(self, service: str) -> int | None: ...
    def kill(self, service: str, sig: int = ...) -> None: ...


def proc_state(pid: int) -> str | None:
    """One-letter state from /proc/<pid>/stat (R, S, D, T, t, Z, ...), None when gone."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat[stat.rindex(")") + 2]


def group_members(pgid: int) -> list[int]:
    out = []
    for d in PROC.iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[2]) == pgid:      # state ppid pgrp ...
            out.append(int(d.name))
    return out


def run_processes(run_id: str) -> list[int]:
    """Live PIDs whose environment says MONSOON_RUN_ID=<run_id>."""
    return find_leftovers(run_id)


def _cont(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGCONT)
        return True
    except ProcessLookupError:
        return False


class ProcessBackend:
    name = "process"

    def __init__(self, stack: Processes | None = None):
        self.stack = stack
        self._handles: dict[str, Handle] = {}

    def _stack(self, ctx: FaultContext | None) -> Processes:
        st = (ctx.stack if ctx is not None and ctx.stack is not None else None) or self.stack
        if st is None:
            raise FaultError("the process backend needs a stack (FaultContext.stack)")
        return st

    def inject(self, fault: FaultSpec, ctx: FaultContext) -> Handle:
        svc = fault.target.service
        if svc is None:
            raise FaultError(f"{fault.name}: the process backend needs a service target")
        stack = self._stack(ctx)
        pid = stack.pid(svc)
        if pid is None:
            raise FaultError(f"{fault.name}: service {svc!r} is not running")
        p = fault.params
        handle = Handle(fault, self.name, ctx.run_id, {"service": svc, "pid": pid, "stack": stack})
        if isinstance(p, PodKillParams):
            sig = signal.Signals[p.signal]
            handle.data.update(signal=sig.name, t_kill=time.monotonic())
            stack.kill(svc, sig)
        elif isinstance(p, ProcessPauseParams) and ctr.container_of(stack, svc) is not None:
            handle.data["container"] = ctr.container_of(stack, svc).name
            self._handles[handle.id] = handle       # registered before the pause: heal_all sees it
            stack.kill(svc, signal.SIGSTOP)         # docker pause: the cgroup freezer
        elif isinstance(p, ProcessPauseParams):
            handle.data["pids"] = group_members(pid) or [pid]
            self._handles[handle.id] = handle       # registered before the signal: heal_all sees it
            stack.kill(svc, signal.SIGSTOP)
        else:
            raise FaultError(f"{fault.name}: the process backend cannot do {fault.kind}")
        self._handles[handle.id] = handle
        return handle

    def heal(self, handle: Handle) -> None:
        if isinstance(handle.fault.params, ProcessPauseParams) and handle.data.get("container"):
            if ctr.paused(handle.data["container"]):
                handle.data["stack"].kill(handle.data["service"], signal.SIGCONT)    # docker unpause
        elif isinstance(handle.fault.params, ProcessPauseParams):
            pgid = handle.data["pid"]
            try:
                os.killpg(pgid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            for pid in handle.data.get("pids", ()):
                _cont(pid)
        handle.healed = True
        self._handles.pop(handle.id, None)

    def heal_all(self, run_id: str) -> list[str]:
        healed = []
        for h in list(self._handles.values()):
            if h.run_id == run_id and not h.healed:
                self.heal(h)
                healed.append(f"{h.fault.name}: {h.data['service']} (pid {h.data['pid']})")
        for pid in run_processes(run_id):
            if proc_state(pid) in ("T", "t") and _cont(pid):
                healed.append(f"pid {pid} continued (SIGCONT)")
        try:
            return healed + ctr.unpause_run(run_id)
        except ctr.UnpauseFailed as e:     # raised with what was healed before it: the caller says both
            raise ctr.UnpauseFailed(e.failed, [*healed, *e.healed]) from e

    def census(self, run_id: str) -> list[str]:
        left = []
        pids = set(run_processes(run_id))
        for h in self._handles.values():
            if h.run_id == run_id:
                pids.update(h.data.get("pids", ()))
                if not h.healed and isinstance(h.fault.params, ProcessPauseParams):
                    left.append(f"{h.fault.name}: unhealed pause of {h.data['service']}")
        for pid in sorted(pids):
            if proc_state(pid) in ("T", "t"):
                left.append(f"pid {pid} stopped (state T)")
        return left + ctr.paused_census(run_id)

    def verify(self, handle: Handle) -> Landing:
        p = handle.fault.params
        stack, svc, old = handle.data["stack"], handle.data["service"], handle.data["pid"]
        if isinstance(p, PodKillParams):
            def restarted() -> bool:
                new = stack.pid(svc)
                return new is not None and new != old
            ok, waited = wait_for(restarted, 0 if handle.healed else p.restart_timeout, 0.05)
            ev: dict[str, Any] = {"method": "pid", "service": svc, "old_pid": old, "new_pid": stack.pid(svc),
                                  "old_pid_state": proc_state(old), "signal": handle.data["signal"]}
            if handle.healed:   # the heal of a kill is the restart: the service must be up again
                up, _ = wait_for(lambda: stack.pid(svc) is not None, p.restart_timeout, 0.1)
                ev["new_pid"] = stack.pid(svc)
                return Landing(up, ev)
            ev["restart_after_s"] = round(time.monotonic() - handle.data["t_kill"], 3) if ok else None
            return Landing(ok, ev)
        p = cast(ProcessPauseParams, p)    # a pause: the only other fault this backend injects
        if handle.data.get("container"):
            name = handle.data["container"]
            want = not handle.healed
            ok, _ = wait_for(lambda: ctr.paused(name) is want, p.verify_timeout)
            return Landing(ok, {"method": "docker inspect State.Paused", "service": svc, "container": name,
                                "paused": ctr.paused(name)})
        pids = handle.data.get("pids", [old])
        if handle.healed:
            ok, _ = wait_for(lambda: all(proc_state(x) not in ("T", "t") for x in pids), p.verify_timeout)
        else:
            ok, _ = wait_for(lambda: all(proc_state(x) in ("T", "t", None) for x in pids)
                             and proc_state(old) in ("T", "t"), p.verify_timeout)
        states = {x: proc_state(x) for x in pids}
        return Landing(ok, {"method": "/proc state", "service": svc, "pid": old, "states": states})
