"""memory-pressure on the REAL cgroup hierarchy: a child cgroup under the service's own, OOM, restore."""
from __future__ import annotations

import os
import sys
import time

import pytest

from monsoon.faults.base import FaultContext, FaultError
from monsoon.faults.cgroup import CgroupBackend, CgroupFS
from monsoon.spec.fault import FaultSpec
from monsoon.spec.stack import StackSpec
from monsoon.stack.supervisor import Stack

FS = CgroupFS()
REASON = FS.available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"memory cgroups not usable here: {REASON}")

# allocates 16 MiB every 0.1 s after a "go" file appears, up to 400 MiB, then idles
HOG = ("import os, sys, time\n"
       "go = sys.argv[1]; blocks = []\n"
       "while not os.path.exists(go): time.sleep(0.05)\n"
       "for _ in range(25):\n"
       "    blocks.append(b\"\\x01\" * (16 << 20)); time.sleep(0.1)\n"
       "time.sleep(3600)\n")


@pytest.fixture
def stack(tmp_path):
    go = tmp_path / "go"
    spec = StackSpec.model_validate({
        "name": "cg", "services": {"hog": {"command": [sys.executable, "-c", HOG, str(go)], "stop_timeout": 3}},
        "devices": {"port": "1"}, "provisioning": {"kind": "none"},
        "storage": {"dsn": "x", "loss_query": "x"}})
    events = []
    with Stack(spec, tmp_path / "stack", run_id="cg-run-1", on_event=lambda t, **f: events.append((t, f))) as st:
        st.go, st.events = go, events
        yield st


def mp(limit_mb):
    return FaultSpec(name="mp", kind="memory-pressure", target="hog", backend="cgroup",
                     params={"limit_mb": limit_mb}, schedule={"duration": 30})


def test_lowered_limit_oom_kills_then_restores(stack, tmp_path):
    be = CgroupBackend(state_dir=tmp_path / "state")
    pid = stack.pid("hog")
    parent = FS.memory_cgroup(pid)
    original_parent_limit = parent.read_limit()
    h = be.inject(mp(96), FaultContext(run_id="cg-run-1", stack=stack))
    child = FS.memory_cgroup(pid)
    assert child.path.parent == parent.path and child.path.name == "m_cg-run-1__hog"
    land = be.verify(h)
    assert land.landed is True and land.evidence["pid_in_cgroup"] is True, land.evidence
    assert int(land.evidence["limit"]) == 96 << 20
    stack.go.touch()                                        # now allocate up to 400 MiB
    deadline = time.monotonic() + 20
    while not any(e.get("event") == "exit" for _, e in stack.events):
        assert time.monotonic() < deadline, "the hog was not OOM-killed under a 96 MiB limit"
        time.sleep(0.05)
    exit_ev = next(e for _, e in stack.events if e.get("event") == "exit")
    assert exit_ev["code"] == 137
    assert child.oom_kills() and child.oom_kills() >= 1
    assert be.census("cg-run-1")
    be.heal(h)
    assert be.verify(h).landed is True and not child.path.exists()
    assert parent.read_limit() == original_parent_limit        # the parent was never touched
    assert be.census("cg-run-1") == []


def test_heal_all_after_a_crash_moves_back_and_removes_the_cgroup(stack, tmp_path):
    pid = stack.pid("hog")
    parent = FS.memory_cgroup(pid)
    CgroupBackend(state_dir=tmp_path / "state").inject(mp(256), FaultContext(run_id="cg-run-1", stack=stack))
    assert FS.memory_cgroup(pid).path != parent.path
    fresh = CgroupBackend(state_dir=tmp_path / "state")    # no handles: the record on disk is enough
    assert fresh.census("cg-run-1")
    assert fresh.heal_all("cg-run-1")
    assert FS.memory_cgroup(pid).path == parent.path
    assert fresh.census("cg-run-1") == []


def test_memory_already_held_stays_with_the_parent_on_v1(stack, tmp_path):
    """v1 on kernels without move_charge_at_immigrate (removed in 6.x): only NEW memory counts against the limit."""
    stack.go.touch()
    time.sleep(3.0)                                          # all 400 MiB allocated, charged to the parent
    be = CgroupBackend(state_dir=tmp_path / "state")
    pid = stack.pid("hog")
    h = be.inject(mp(32), FaultContext(run_id="cg-run-1", stack=stack))
    try:
        land = be.verify(h)
        print(f"\nlimit 32 MiB on a ~300 MiB process: {land.evidence}, charges_moved={h.data.get('charges_moved')}")
        if h.data["version"] == 1 and h.data.get("charges_moved") is False:
            assert land.landed is True and int(land.evidence["usage_bytes"]) < 32 << 20
            assert stack.pid("hog") == pid                   # not killed: its memory is charged elsewhere
    finally:
        be.heal(h)
    assert be.census("cg-run-1") == []
