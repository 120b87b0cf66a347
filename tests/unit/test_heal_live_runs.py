"""``monsoon heal --all`` leaves live runs alone: the owner-PID label, ``live_runs`` and the skip in
``heal_everything`` (everything machine-wide is faked: this must never touch a real run of this machine)."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import monsoon.faults.heal as chaos
import monsoon.stack.reaper as stack_mod
from monsoon.faults.heal import heal_everything, live_runs
from monsoon.cli import main as cli_main
from monsoon.spec.stack import load_stack
from monsoon.stack.reaper import OWNER_ENV, process_owners
from monsoon.stack.supervisor import Stack
from monsoon.stack.ports import allocate_ports

NO_PID = 10**9   # above any pid_max: fake processes that no signal can reach


class FakeProc:
    """A fake /proc: pid -> (state, parent PID, start ticks)."""

    def __init__(self, table: dict[int, tuple[str, int, int]]):
        self.table = table

    def __call__(self, pid: int):
        return self.table.get(pid)


# ------------------------------------------------------------------ live_runs (pure)

def test_a_run_whose_owner_runs_is_live_and_one_whose_owner_is_gone_is_not():
    proc = FakeProc({100: ("S", 1, 500),                          # monsoon, alive
                     NO_PID + 1: ("S", 100, 900), NO_PID + 2: ("S", NO_PID + 1, 901),   # live run's services
                     NO_PID + 3: ("S", 1, 900)})                  # a run whose monsoon (pid 200) is gone
    owners = {NO_PID + 1: ("live", 100), NO_PID + 2: ("live", 100), NO_PID + 3: ("dead", 200)}
    assert live_runs(owners, proc) == {"live": 100}


def test_a_zombie_owner_or_a_reused_owner_pid_is_dead():
    proc = FakeProc({100: ("Z", 1, 500), 300: ("S", 1, 2000), NO_PID + 1: ("S", 1, 900), NO_PID + 2: ("S", 1, 900)})
    owners = {NO_PID + 1: ("zombie-owner", 100),          # monsoon killed -9, not yet reaped
              NO_PID + 2: ("reused-owner", 300)}          # pid 300 started after the process it "started"
    assert live_runs(owners, proc) == {}


def test_a_process_labelled_before_owners_were_recorded_falls_back_to_its_parent():
    proc = FakeProc({100: ("S", 1, 500),
                     NO_PID + 1: ("S", 100, 900),               # legacy run, parent monsoon alive
                     NO_PID + 2: ("S", NO_PID + 1, 901),        # its child: parent is the run's own process
                     NO_PID + 3: ("S", 1, 900),                 # legacy orphan: reparented to init
                     NO_PID + 4: ("S", NO_PID + 3, 901)})
    owners = {NO_PID + 1: ("legacy-live", None), NO_PID + 2: ("legacy-live", None),
              NO_PID + 3: ("legacy-orphan", None), NO_PID + 4: ("legacy-orphan", None)}
    assert live_runs(owners, proc) == {"legacy-live": 100}


# ------------------------------------------------------------------ the label, on real processes

def test_the_stack_labels_every_service_with_its_owner_pid(tmp_path):
    spec = load_stack("inmemory")
    st = Stack(spec, tmp_path, run_id="r-owner")
    st.ctx, st.ports = st._base_ctx(), allocate_ports(spec)
    for name in spec.services:
        env = st._build(name).env
        assert (env["MONSOON_RUN_ID"], env[OWNER_ENV]) == ("r-owner", str(os.getpid()))


def test_process_owners_and_live_runs_read_the_real_proc():
    rid = f"unit-owner-{os.getpid()}"
    dead = subprocess.Popen(["true"])     # a monsoon that is gone
    dead.wait()
    procs = []
    try:
        for suffix, owner in (("live", str(os.getpid())), ("dead", str(dead.pid)), ("legacy", None)):
            env = {**os.environ, "MONSOON_RUN_ID": f"{rid}-{suffix}"}
            env.pop(OWNER_ENV, None)
            if owner:
                env[OWNER_ENV] = owner
            procs.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env))
        mine = {pid: v for pid, v in process_owners().items() if v[0].startswith(rid)}
        assert mine == {procs[0].pid: (f"{rid}-live", os.getpid()), procs[1].pid: (f"{rid}-dead", dead.pid),
                        procs[2].pid: (f"{rid}-legacy", None)}
        # the legacy process's parent is this test: alive; the dead owner's pid may only come back reused
        assert live_runs(mine) == {f"{rid}-live": os.getpid(), f"{rid}-legacy": os.getpid()}
    finally:
        for p in procs:
            p.kill()
            p.wait()


# ------------------------------------------------------------------ heal_everything skips live runs

@pytest.fixture
def machine(monkeypatch, tmp_path):
    """A fake machine: labelled processes, /proc, no Toxiproxy, no cluster, a private cgroup state dir."""
    owners: dict[int, tuple[str, int | None]] = {}
    proc = FakeProc({})
    reaped: list[str] = []
    for mod in (stack_mod, chaos):   # the reaper, and heal_everything's own reference
        monkeypatch.setattr(mod, "process_owners", lambda: dict(owners))
    monkeypatch.setattr(chaos, "_proc_stat", proc)
    monkeypatch.setattr(chaos, "_toxiproxy_apis_of_runs", lambda: [])
    for mod in (stack_mod, chaos):   # the reaper, and heal_everything's own reference
        monkeypatch.setattr(mod, "reap", lambda rid=None: reaped.append(rid) or [])
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return owners, proc.table, reaped, tmp_path


def test_heal_all_skips_a_live_run_and_heals_an_orphaned_one(machine, capsys):
    owners, table, reaped, state = machine
    table.update({100: ("S", 1, 500), NO_PID + 1: ("S", 100, 900), NO_PID + 2: ("S", 1, 900)})
    owners.update({NO_PID + 1: ("run-live", 100), NO_PID + 2: ("run-orphan", 4242)})
    rep = heal_everything(None, state_root=state)
    assert rep.notes == ["run run-live is still live (owner pid 100): skipped; use --run-id run-live to force"]
    assert reaped == ["run-orphan"] and "run-live" not in rep.census


def test_heal_run_id_forces_a_live_run(machine):
    owners, table, reaped, state = machine
    table.update({100: ("S", 1, 500), NO_PID + 1: ("S", 100, 900)})
    owners.update({NO_PID + 1: ("run-live", 100)})
    rep = heal_everything("run-live", state_root=state)
    assert rep.notes == [] and reaped == ["run-live"]


def test_the_cli_says_which_run_it_skipped(machine, capsys, monkeypatch):
    owners, table, reaped, state = machine
    table.update({100: ("S", 1, 500), NO_PID + 1: ("S", 100, 900)})
    owners.update({NO_PID + 1: ("run-live", 100)})
    monkeypatch.setattr(chaos, "run_ids_in_place", lambda state_root=None, **_: {"run-live"})
    assert cli_main(["heal", "--all"]) == 0
    out = capsys.readouterr().out
    assert "run run-live is still live (owner pid 100): skipped; use --run-id run-live to force" in out
    assert "nothing to heal" in out and reaped == []


# ------------------------------------------------------------------ monsoon reap leaves live runs alone

def test_reap_without_a_run_id_kills_an_orphaned_run_and_leaves_a_live_one(monkeypatch):
    """A `make reap` in one terminal killed a live measurement run's services in another (2026-11-29): reap
    with no run id now skips runs whose monsoon still runs, as heal --all does. Real processes, real /proc;
    only this test's own labelled processes are visible to it."""
    import monsoon.stack.reaper as reaper_mod
    rid = f"unit-reap-{os.getpid()}"
    real_owners = reaper_mod.process_owners
    mine = lambda: {pid: v for pid, v in real_owners().items() if v[0].startswith(rid)}   # noqa: E731
    for mod in (reaper_mod, chaos):
        monkeypatch.setattr(mod, "process_owners", mine)
    monkeypatch.setattr(chaos, "run_ids_in_place", lambda state_root=None, **_: {v[0] for v in mine().values()})
    for name in ("container_owners", "release_owners", "namespace_owners"):
        monkeypatch.setattr(chaos, name, lambda: {})
    for name in ("reap_containers", "reap_releases", "reap_namespaces"):
        monkeypatch.setattr(chaos, name, lambda rid=None: [])
    dead = subprocess.Popen(["true"])
    dead.wait()
    procs = {}
    try:
        for suffix, owner in (("live", os.getpid()), ("orphan", dead.pid)):
            env = {**os.environ, "MONSOON_RUN_ID": f"{rid}-{suffix}", OWNER_ENV: str(owner)}
            procs[suffix] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
        rep = chaos.reap_left_behind()
        assert rep.pids == [procs["orphan"].pid]
        assert procs["orphan"].wait(timeout=10) == -9
        assert procs["live"].poll() is None
        assert rep.notes == [f"run {rid}-live is still live (owner pid {os.getpid()}): skipped; "
                             f"use --run-id {rid}-live to force"]
        assert rep.shared_in_use
        forced = chaos.reap_left_behind(f"{rid}-live")          # named: reaped whatever its owner does
        assert forced.pids == [procs["live"].pid] and not forced.shared_in_use
        assert procs["live"].wait(timeout=10) == -9
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def test_the_reap_command_names_the_live_run_and_leaves_dockerd_and_the_cluster_up(machine, capsys, monkeypatch):
    from monsoon.stack import cluster, dockerd
    owners, table, _, _ = machine
    table.update({100: ("S", 1, 500), NO_PID + 1: ("S", 100, 900)})
    owners.update({NO_PID + 1: ("run-live", 100)})
    reaped: list = []
    monkeypatch.setattr(chaos, "reap", lambda rid=None: reaped.append(rid) or [])
    monkeypatch.setattr(chaos, "run_ids_in_place", lambda state_root=None, **_: {"run-live"})
    for name in ("reap_containers", "reap_releases", "reap_namespaces"):
        monkeypatch.setattr(chaos, name, lambda rid=None: [])
    for name in ("container_owners", "release_owners", "namespace_owners"):
        monkeypatch.setattr(chaos, name, lambda: {})
    stopped: list = []
    monkeypatch.setattr(dockerd, "stop", lambda *a, **k: stopped.append("dockerd") or True)
    monkeypatch.setattr(cluster, "left_behind", lambda *a, **k: stopped.append("cluster") or "gone")
    assert cli_main(["reap"]) == 0
    out = capsys.readouterr().out
    assert "run run-live is still live (owner pid 100): skipped; use --run-id run-live to force" in out
    assert "left monsoon's private dockerd and cluster running" in out
    assert reaped == [] and stopped == []
