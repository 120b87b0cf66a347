"""Process backend on a REAL monsoon Stack: pod-kill restarts with a new PID, pause is /proc state T."""
from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from monsoon.faults.base import FaultContext
from monsoon.faults.plan import FaultPlan
from monsoon.faults.process import ProcessBackend, group_members, proc_state, run_processes
from monsoon.spec.fault import FaultSpec
from monsoon.spec.stack import StackSpec
from monsoon.stack.supervisor import Stack
from monsoon.timeline.store import Timeline, read_events

# a parent with a child in its process group: a "pod" of two processes
WORKER = ("import subprocess, sys, time; "
          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)']); "
          "time.sleep(3600)")


def spec() -> StackSpec:
    svc = {"command": [sys.executable, "-c", WORKER], "restart": "always", "restart_delay": 0.2, "stop_timeout": 3}
    return StackSpec.model_validate({
        "name": "fault-test", "services": {"worker": svc, "sleeper": {"command": ["sleep", "3600"], "stop_timeout": 3}},
        "devices": {"port": "1883"}, "provisioning": {"kind": "none"},
        "storage": {"dsn": "postgresql://x", "loss_query": "select 1"}})


@pytest.fixture
def stack(tmp_path):
    events = []
    st = Stack(spec(), tmp_path / "stack", run_id="proc-run-1", on_event=lambda t, **f: events.append((t, f)))
    with st:
        st.events = events
        yield st
    assert not run_processes("proc-run-1")          # the stack stopped every process


def f(kind, service, params=None, **sched):
    return FaultSpec(name=f"{kind}-t", kind=kind, target=service, backend="process", params=params or {},
                     schedule={"at": 0, "duration": 5, **sched})


def test_pod_kill_lands_as_a_restart_with_a_new_pid(stack):
    be = ProcessBackend()
    ctx = FaultContext(run_id="proc-run-1", stack=stack)
    old = stack.pid("worker")
    time.sleep(0.3)
    members = group_members(old)
    assert len(members) == 2, members               # leader + child
    h = be.inject(f("pod-kill", "worker", {"restart_timeout": 15}), ctx)
    land = be.verify(h)
    assert land.landed is True, land.evidence
    assert land.evidence["old_pid"] == old and land.evidence["new_pid"] not in (None, old)
    assert land.evidence["old_pid_state"] in (None, "Z")
    for pid in members:                               # the whole group died, the child too
        assert proc_state(pid) in (None, "Z")
    assert any(t == "service" and e.get("event") == "exit" and e.get("code") == 137 for t, e in stack.events)
    be.heal(h)
    assert be.verify(h).landed is True


def test_pod_kill_without_restart_does_not_land(stack):
    be = ProcessBackend()
    h = be.inject(f("pod-kill", "sleeper", {"restart_timeout": 1.5}), FaultContext(run_id="proc-run-1", stack=stack))
    land = be.verify(h)
    assert land.landed is False and land.evidence["new_pid"] is None


def test_pause_freezes_the_group_and_heal_thaws_it(stack):
    be = ProcessBackend()
    ctx = FaultContext(run_id="proc-run-1", stack=stack)
    time.sleep(0.3)
    pid = stack.pid("worker")
    h = be.inject(f("process-pause", "worker"), ctx)
    land = be.verify(h)
    assert land.landed is True and set(land.evidence["states"].values()) == {"T"}
    assert len(land.evidence["states"]) == 2
    assert be.census("proc-run-1")
    be.heal(h)
    assert be.verify(h).landed is True
    assert proc_state(pid) in ("S", "R") and be.census("proc-run-1") == []


def test_heal_all_after_a_crash_continues_stopped_processes_of_the_run(stack):
    ProcessBackend().inject(f("process-pause", "worker"), FaultContext(run_id="proc-run-1", stack=stack))
    time.sleep(0.2)
    pid = stack.pid("worker")
    assert proc_state(pid) == "T"
    fresh = ProcessBackend()                       # no handles: finds them by MONSOON_RUN_ID
    assert len(fresh.census("proc-run-1")) == 2
    assert len(fresh.heal_all("proc-run-1")) == 2
    time.sleep(0.1)
    assert proc_state(pid) in ("S", "R") and fresh.census("proc-run-1") == []


def test_plan_pause_window_and_final_heal_on_exception(stack, tmp_path):
    tl = Timeline(tmp_path / "tl.jsonl")
    be = ProcessBackend()
    pid = stack.pid("worker")
    with pytest.raises(RuntimeError):
        with FaultPlan([f("process-pause", "worker", at=0.1, duration=60)], {"process": be}, tl,
                       ctx=FaultContext(run_id="proc-run-1", stack=stack), horizon=120, handle_sigterm=False) as plan:
            deadline = time.monotonic() + 5
            while proc_state(pid) != "T":
                assert time.monotonic() < deadline
                time.sleep(0.02)
            raise RuntimeError("the load generator crashed")
    assert proc_state(pid) in ("S", "R")
    evs = [e for e in read_events(tl.path) if e["type"] == "fault"]
    assert [(e["phase"], e["landed"]) for e in evs] == [("inject", True), ("heal", True)]
    assert plan.leftovers == {}
