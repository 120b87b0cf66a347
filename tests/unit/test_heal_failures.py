"""``monsoon heal`` says a failure is a failure: a step that raises (a backend's heal, a census, the reaper) is in
``HealReport.failed`` with its reason, printed "heal <what> FAILED: <reason>" (never "healed"), makes the exit code
1, and does not stop the other backends, steps or runs. Everything machine-wide is faked, as in
test_heal_live_runs.py: this must never touch a real run of this machine."""
from __future__ import annotations

import pytest

import monsoon.faults.heal as chaos
import monsoon.stack.reaper as stack_mod
from monsoon.cli import main as cli_main
from monsoon.faults.heal import HealFailure, heal_everything


class FakeBackend:
    """A backend whose ``heal_all`` heals ``heals`` or raises ``error``; its census is ``left``."""

    def __init__(self, name: str, heals=(), error: Exception | None = None, left=(), census_error=None):
        self.name, self.heals, self.error, self.left, self.census_error = name, list(heals), error, list(left), census_error
        self.healed: list[str] = []

    def heal_all(self, run_id: str) -> list[str]:
        if self.error is not None:
            raise self.error
        self.healed.append(run_id)
        return [f"{x} of {run_id}" for x in self.heals]

    def census(self, run_id: str) -> list[str]:
        if self.census_error is not None:
            raise self.census_error
        return list(self.left)


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """No labelled process, no Toxiproxy, no cluster; the process and cgroup backends are ``backends``."""
    backends = {"process": FakeBackend("process"), "cgroup": FakeBackend("cgroup")}
    reaped: list[str] = []
    monkeypatch.setattr(chaos, "ProcessBackend", lambda: backends["process"])
    monkeypatch.setattr(chaos, "CgroupBackend", lambda state_dir=None: backends["cgroup"])
    monkeypatch.setattr(chaos, "_toxiproxy_apis_of_runs", lambda: [])
    monkeypatch.setattr(chaos, "cluster_configured", lambda: False)
    monkeypatch.setattr(chaos, "run_ids_in_place", lambda state_root=None, **_: {"run-a", "run-b"})
    for mod in (stack_mod, chaos):   # the reaper, and heal_everything's own reference
        monkeypatch.setattr(mod, "process_owners", lambda: {})
        monkeypatch.setattr(mod, "reap", lambda rid=None: reaped.append(rid) or [])
    monkeypatch.setattr(chaos, "namespace_owners", lambda: {})
    monkeypatch.setattr(chaos, "container_owners", lambda: {})
    monkeypatch.setattr(chaos, "reap_containers", lambda rid=None: [])
    monkeypatch.setattr(chaos, "reap_namespaces", lambda rid=None: [])
    monkeypatch.setattr(chaos, "container_census", lambda rid: [])
    monkeypatch.setattr(chaos, "namespace_census", lambda rid: [])
    monkeypatch.setattr(chaos.cluster, "left_behind", lambda: None)
    monkeypatch.setattr(chaos, "release_owners", lambda: {})        # Helm releases: none (never a real one)
    monkeypatch.setattr(chaos, "reap_releases", lambda rid=None: [])
    monkeypatch.setattr(chaos, "release_census", lambda rid: [])
    return backends, reaped, monkeypatch


def test_a_heal_that_raises_is_a_failure_with_its_reason_and_the_other_faults_are_still_healed(machine):
    backends, reaped, _ = machine
    backends["process"] = FakeBackend("process", error=PermissionError("SIGCONT to pid 42: not permitted"))
    backends["cgroup"] = FakeBackend("cgroup", heals=["memory limit restored"])
    rep = heal_everything("run-a")
    assert rep.failed == [HealFailure("run-a process: healing", "PermissionError: SIGCONT to pid 42: not permitted")]
    assert str(rep.failed[0]) == "heal run-a process: healing FAILED: PermissionError: SIGCONT to pid 42: not permitted"
    assert rep.done == ["run-a cgroup: memory limit restored of run-a"]    # the next backend still healed
    assert not any("FAILED" in d for d in rep.done)
    assert reaped == ["run-a"]                                           # and the steps after it still ran


def test_heal_all_heals_the_other_runs_when_one_fails(machine):
    backends, reaped, _ = machine

    class FailsOnA(FakeBackend):
        def heal_all(self, run_id: str) -> list[str]:
            if run_id == "run-a":
                raise RuntimeError("the cgroup record of run-a is unreadable")
            return super().heal_all(run_id)
    backends["cgroup"] = FailsOnA("cgroup", heals=["limit restored"])
    rep = heal_everything(None)
    assert [str(f) for f in rep.failed] == [
        "heal run-a cgroup: healing FAILED: RuntimeError: the cgroup record of run-a is unreadable"]
    assert rep.done == ["run-b cgroup: limit restored of run-b"]
    assert backends["process"].healed == ["run-a", "run-b"] and reaped == ["run-a", "run-b"]


def test_a_reaper_that_raises_is_a_failure_and_the_containers_are_still_removed(machine):
    backends, reaped, monkeypatch = machine

    def reap(rid=None):
        raise OSError("cannot read /proc")
    monkeypatch.setattr(chaos, "reap", reap)
    monkeypatch.setattr(chaos, "reap_containers", lambda rid=None: [f"{rid}-web"])
    rep = heal_everything("run-a")
    assert [str(f) for f in rep.failed] == ["heal run-a: killing the run's processes FAILED: OSError: cannot read /proc"]
    assert rep.done == ["run-a: removed 1 leftover container(s): run-a-web"]


def test_a_census_that_raises_is_in_the_census(machine):
    backends, _, monkeypatch = machine
    backends["cgroup"] = FakeBackend("cgroup", census_error=RuntimeError("cgroupfs not mounted"))
    monkeypatch.setattr(chaos, "container_census", lambda rid: (_ for _ in ()).throw(ConnectionError("no dockerd")))
    rep = heal_everything("run-a")
    assert rep.census == {"run-a": ["cgroup: census failed: cgroupfs not mounted",
                                    "docker: census failed: ConnectionError: no dockerd"]}


def test_the_cli_prints_a_failure_as_a_failure_and_exits_1(machine, capsys):
    backends, _, _ = machine
    backends["process"] = FakeBackend("process", error=PermissionError("not permitted"))
    backends["cgroup"] = FakeBackend("cgroup", heals=["limit restored"])
    assert cli_main(["heal", "--run-id", "run-a"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert "heal run-a process: healing FAILED: PermissionError: not permitted" in out
    assert "healed run-a cgroup: limit restored of run-a" in out
    assert not any(line.startswith("healed") and "FAILED" in line for line in out)
    assert "nothing to heal" not in out


def test_the_cli_exits_0_when_every_step_worked_and_nothing_is_left(machine, capsys):
    assert cli_main(["heal", "--all"]) == 0
    assert "nothing to heal" in capsys.readouterr().out
