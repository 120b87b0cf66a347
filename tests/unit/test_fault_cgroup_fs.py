"""cgroup backend logic on a fake cgroupfs tree: v1/v2 discovery, remembered original, restore after a crash."""
import json
import os
from pathlib import Path

import pytest

from monsoon.faults.base import FaultContext, FaultError
from monsoon.faults.cgroup import CgroupBackend, CgroupFS, limit_bytes
from monsoon.spec.fault import FaultSpec


def fake_tree(tmp_path, version, pid):
    proc = tmp_path / "proc" / str(pid)
    proc.mkdir(parents=True)
    root = tmp_path / "cg"
    if version == 1:
        cg = root / "memory" / "svc"
        cg.mkdir(parents=True)
        (cg / "memory.limit_in_bytes").write_text("9223372036854771712\n")
        (cg / "memory.usage_in_bytes").write_text("1000\n")
        (proc / "cgroup").write_text("5:cpu:/\n4:memory:/svc\n0::/\n")
        mounts = [("cgroup", str(root / "cpu"), "rw,cpu"), ("cgroup", str(root / "memory"), "rw,relatime,memory"),
                  ("cgroup2", str(root / "unified"), "rw")]
    else:
        cg = root / "svc.scope"
        cg.mkdir(parents=True)
        (root / "cgroup.controllers").write_text("cpu io memory pids\n")
        (cg / "cgroup.controllers").write_text("memory pids\n")
        (cg / "memory.max").write_text("max\n")
        (cg / "memory.current").write_text("2000\n")
        (cg / "memory.events").write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
        (proc / "cgroup").write_text("0::/svc.scope\n")
        mounts = [("cgroup2", str(root), "rw,nsdelegate")]
    (cg / "cgroup.procs").write_text(f"{pid}\n")
    return CgroupFS(proc=tmp_path / "proc", mounts=mounts), cg


class OneService:
    def __init__(self, pid):
        self._pid = pid

    def pid(self, service):
        return self._pid


def mp(limit=64):
    return FaultSpec(name="mp", kind="memory-pressure", target="svc", backend="cgroup",
                     params={"limit_mb": limit, "mode": "in-place"}, schedule={"duration": 5})


@pytest.mark.parametrize("version,limit_name,original", [(1, "memory.limit_in_bytes", "9223372036854771712"),
                                                          (2, "memory.max", "max")])
def test_in_place_lowers_then_restores(tmp_path, version, limit_name, original):
    pid = os.getpid()   # group_members() reads the real /proc; our pid exists there
    fs, cg = fake_tree(tmp_path, version, pid)
    assert fs.memory_cgroup(pid).version == version and fs.memory_cgroup(pid).path == cg
    be = CgroupBackend(state_dir=tmp_path / "state", fs=fs)
    ctx = FaultContext(run_id="r1", stack=OneService(pid))
    h = be.inject(mp(64), ctx)
    assert (cg / limit_name).read_text() == str(64 * 1024 * 1024)
    land = be.verify(h)
    assert land.landed is True and land.evidence["version"] == version
    if version == 2:
        assert land.evidence["oom_kills"] == 1
    rec = json.loads(next((tmp_path / "state" / "cgroup" / "r1").glob("*.json")).read_text())
    assert rec["original"] == original
    assert be.census("r1") and "original" in be.census("r1")[0]
    be.heal(h)
    assert (cg / limit_name).read_text() == original
    assert be.verify(h).landed is True and be.census("r1") == []


def test_heal_all_restores_from_the_record_after_a_crash(tmp_path):
    pid = os.getpid()
    fs, cg = fake_tree(tmp_path, 2, pid)
    CgroupBackend(state_dir=tmp_path / "state", fs=fs).inject(mp(32), FaultContext(run_id="r2", stack=OneService(pid)))
    assert (cg / "memory.max").read_text() == str(32 << 20)
    fresh = CgroupBackend(state_dir=tmp_path / "state", fs=fs)     # a new process: no handles
    assert fresh.census("r2")
    healed = fresh.heal_all("r2")
    assert healed and (cg / "memory.max").read_text() == "max"
    assert fresh.census("r2") == [] and not list((tmp_path / "state" / "cgroup" / "r2").glob("*.json"))


def test_no_memory_controller_is_a_clear_error(tmp_path):
    pid = os.getpid()
    fs, cg = fake_tree(tmp_path, 2, pid)
    (cg / "cgroup.controllers").write_text("pids\n")
    (cg.parent / "cgroup.controllers").write_text("pids\n")
    with pytest.raises(FaultError, match="no memory cgroup controller"):
        fs.memory_cgroup(pid)


def test_limit_values():
    assert limit_bytes("max") is None and limit_bytes("9223372036854771712") is None
    assert limit_bytes("67108864\n") == 64 << 20


# ------------------------------------------ mode: in-place only on a cgroup the service has to itself

def test_in_place_is_refused_when_the_cgroup_holds_other_processes(tmp_path):
    """Services inherit monsoon's cgroup: lowering its limit in place would cap monsoon and everything else."""
    svc_pid = 4_000_000 + os.getpid() % 1000          # no such process: its process group is itself alone
    fs, cg = fake_tree(tmp_path, 2, svc_pid)
    (cg / "cgroup.procs").write_text(f"{svc_pid}\n{os.getpid()}\n")   # monsoon (this pytest) sits beside it
    be = CgroupBackend(state_dir=tmp_path / "state", fs=fs)
    with pytest.raises(FaultError) as e:
        be.inject(mp(64), FaultContext(run_id="r3", stack=OneService(svc_pid)))
    msg = str(e.value)
    assert f"{os.getpid()} (monsoon itself)" in msg and "outside svc's process group" in msg
    assert "mode: child" in msg
    assert (cg / "memory.max").read_text() == "max\n"                 # nothing was touched
    assert not (tmp_path / "state" / "cgroup" / "r3").exists() and be.census("r3") == []


def test_in_place_counts_the_processes_of_cgroups_below_too(tmp_path):
    svc_pid = 4_100_000 + os.getpid() % 1000
    fs, cg = fake_tree(tmp_path, 1, svc_pid)
    sub = cg / "kafka"
    sub.mkdir()
    (sub / "cgroup.procs").write_text("4242\n")
    with pytest.raises(FaultError, match=r"1 process\(es\) outside svc's process group \(pid 4242\)"):
        CgroupBackend(state_dir=tmp_path / "state", fs=fs).inject(mp(64), FaultContext(run_id="r4",
                                                                                       stack=OneService(svc_pid)))
    assert (cg / "memory.limit_in_bytes").read_text() == "9223372036854771712\n"


def test_v2_hints_no_longer_recommend_in_place_on_monsoons_own_cgroup(tmp_path, monkeypatch):
    pid = os.getpid()
    fs, cg = fake_tree(tmp_path, 2, pid)
    (cg / "cgroup.subtree_control").write_text("\n")
    msg = fs.available()
    assert msg and "no-internal-processes" in msg
    assert "or use mode: in-place" not in msg and "a cgroup of its own" in msg and "Delegate=yes" in msg

    real = type(cg).write_text

    def refuse(self, *a, **kw):
        if self.name == "cgroup.subtree_control":
            raise OSError(16, "Device or resource busy")
        return real(self, *a, **kw)
    monkeypatch.setattr(type(cg), "write_text", refuse)
    with pytest.raises(FaultError) as e:
        CgroupBackend._delegate_v2(cg)
    assert "use mode: in-place)" not in str(e.value) and "a cgroup of its own" in str(e.value)
