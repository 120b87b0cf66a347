"""A paused container that cannot be unpaused is a failure, not a silence: ``unpause_run`` tries every container
of the run, then raises ``UnpauseFailed`` (what failed, and what was unpaused); the process backend's ``heal_all``
raises it with what it healed before; ``monsoon heal`` prints it "heal ... FAILED: <reason>" and exits 1. Docker is
faked: no daemon is needed."""
from __future__ import annotations

import pytest

import monsoon.faults.container as ctr
import monsoon.faults.process as process_mod
from monsoon.faults.process import ProcessBackend


class FakeContainer:
    def __init__(self, name: str, status: str = "paused", error: Exception | None = None):
        self.name, self.status, self.error = name, status, error

    def unpause(self) -> None:
        if self.error is not None:
            raise self.error
        self.status = "running"


@pytest.fixture
def containers(monkeypatch):
    cs = [FakeContainer("r1-db", error=RuntimeError("409 Conflict: container is not paused")),
          FakeContainer("r1-web"), FakeContainer("r1-idle", status="running")]
    monkeypatch.setattr(ctr, "run_containers", lambda run_id: list(cs))
    return cs


def test_unpause_run_tries_every_container_then_raises_what_failed(containers):
    with pytest.raises(ctr.UnpauseFailed) as ei:
        ctr.unpause_run("r1")
    assert ei.value.failed == ["container r1-db: unpause failed: RuntimeError: 409 Conflict: container is not paused"]
    assert ei.value.healed == ["container r1-web unpaused"] and containers[1].status == "running"
    assert str(ei.value) == ("container r1-db: unpause failed: RuntimeError: 409 Conflict: container is not paused"
                             " (healed: container r1-web unpaused)")


def test_unpause_run_returns_what_it_unpaused_when_nothing_fails(containers):
    containers[0].error = None
    assert ctr.unpause_run("r1") == ["container r1-db unpaused", "container r1-web unpaused"]


def test_the_process_backend_raises_it_with_what_it_healed_before(containers, monkeypatch):
    monkeypatch.setattr(process_mod, "run_processes", lambda run_id: [4242])
    monkeypatch.setattr(process_mod, "proc_state", lambda pid: "T")
    monkeypatch.setattr(process_mod, "_cont", lambda pid: True)
    with pytest.raises(ctr.UnpauseFailed) as ei:
        ProcessBackend().heal_all("r1")
    assert ei.value.healed == ["pid 4242 continued (SIGCONT)", "container r1-web unpaused"]
    assert "container r1-db: unpause failed" in str(ei.value)


def test_monsoon_heal_prints_a_failed_unpause_as_a_failure(containers, monkeypatch, capsys, tmp_path):
    import monsoon.faults.heal as chaos
    from monsoon.cli import main as cli_main
    monkeypatch.setattr(process_mod, "run_processes", lambda run_id: [])
    monkeypatch.setattr(chaos, "_toxiproxy_apis_of_runs", lambda: [])
    monkeypatch.setattr(chaos, "cluster_configured", lambda: False)
    monkeypatch.setattr(chaos, "CgroupBackend", type("NoCgroup", (), {
        "name": "cgroup", "__init__": lambda self, state_dir=None: None,
        "heal_all": lambda self, rid: [], "census": lambda self, rid: []}))
    assert cli_main(["heal", "--run-id", "r1", "--keep-processes"]) == 1
    out = capsys.readouterr().out
    assert ("heal r1 process: healing FAILED: UnpauseFailed: container r1-db: unpause failed: RuntimeError: "
            "409 Conflict: container is not paused (healed: container r1-web unpaused)") in out
    assert "healed r1 process" not in out
    assert "STILL IN PLACE r1 process: container r1-db paused" in out     # and the census says it is still paused
