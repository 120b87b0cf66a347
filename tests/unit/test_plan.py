"""A run's plan (monsoon/run/plan.py) and the check registry a session carries: in-process, nothing started."""
from __future__ import annotations

import dataclasses
import json
import socket
import time

import pytest

from monsoon.checks.base import PASS, Verdict
from monsoon.checks.registry import CHECKS, CheckRegistry
from monsoon.run.plan import CalibrationFailed, RunPlan, plan_run, settle_x1
from monsoon.run.validate import load_checked
from monsoon.spec.experiment import load_experiment
from monsoon.spec.stack import load_stack
from monsoon.spec.yamlio import SpecError

from tests.unit.helpers import RunBuilder

CUSTOM = ("name: e\nload:\n  devices: 1\n  base_rate: 10\n  shape: {kind: steady}\n"
          "profiles: {quick: {warmup: 5}}\nchecks:\n  - no_oom\n  - stored_within: {seconds: 3}\n")


def stored_within(run, seconds: float) -> Verdict:
    return Verdict("stored_within", PASS, {"seconds": seconds})


def test_the_plan_holds_the_resolved_faults_and_every_check_the_run_judges():
    plan = plan_run(load_stack("kafka"), load_experiment("pod-kill"), "quick")
    assert isinstance(plan, RunPlan) and plan.label == "kafka/pod-kill"
    assert [f.kind for f in plan.faults] == ["pod-kill"]
    names = [n for n, _ in plan.checks]
    # the experiment's, then the implied: a fault must land, a death that is not an OOM shows, the load is valid
    assert names[-3:] == ["faults_landed", "no_unexpected_exit", "load_valid"] and "no_oom" in names
    assert plan.durations.total == plan.shape().duration
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.profile = "full"   # type: ignore[misc]


def test_a_bad_experiment_fails_planning_with_file_line_and_key(tmp_path):
    p = tmp_path / "e.yaml"
    p.write_text(CUSTOM)
    with pytest.raises(SpecError) as ei:
        plan_run(load_stack("inmemory"), load_experiment(p), "quick")
    assert str(ei.value).startswith(f"{p}:9: checks.1: unknown check 'stored_within'")


def test_a_fresh_registry_in_process_knows_its_own_checks_and_no_other():
    mine, other = CheckRegistry(), CheckRegistry()
    mine.register("stored_within", stored_within)
    assert "stored_within" in mine and "stored_within" not in other and "stored_within" not in CHECKS
    mine.validate("stored_within", {"seconds": 3})
    with pytest.raises(ValueError, match="check 'stored_within' needs parameter 'seconds'"):
        mine.validate("stored_within", {})
    with pytest.raises(ValueError, match="a check named 'stored_within' exists already"):
        mine.register("stored_within", lambda run: None)
    with pytest.raises(TypeError):
        CHECKS["x"] = stored_within   # type: ignore[index]   # the built-in mapping is read-only


def test_the_plan_carries_the_registry_that_validates_and_judges(tmp_path):
    reg = CheckRegistry()
    reg.register("stored_within", stored_within)
    p = tmp_path / "e.yaml"
    p.write_text(CUSTOM)
    plan = plan_run(load_stack("inmemory"), load_experiment(p), "quick", registry=reg)
    assert plan.registry is reg and ("stored_within", {"seconds": 3}) in plan.checks
    run = RunBuilder(tmp_path / "run").write()
    [v] = plan.registry.evaluate(run, [("stored_within", {"seconds": 3})])
    assert (v.name, v.verdict, v.figures) == ("stored_within", PASS, {"seconds": 3})


def test_a_session_with_its_own_registry_runs_a_custom_check_in_process(tmp_path):
    from monsoon.session import MonsoonSession
    reg = CheckRegistry()
    reg.register("stored_within", stored_within)
    p = tmp_path / "e.yaml"
    p.write_text(CUSTOM)
    lines: list[str] = []
    res = MonsoonSession(runs_dir=tmp_path / "runs", dry_run=True, progress=lines.append,
                         checks=reg).run("inmemory", str(p))
    assert "checks: no_oom, stored_within, no_unexpected_exit, load_valid" in res.dry_run   # the plan's checks
    with pytest.raises(SpecError, match="unknown check 'stored_within'"):   # a session of its own: built-ins only
        MonsoonSession(runs_dir=tmp_path / "runs", dry_run=True, progress=lines.append).run("inmemory", str(p))


def _calibration(cal_dir, capacity: float) -> None:
    cal_dir.mkdir(parents=True, exist_ok=True)
    (cal_dir / "inmemory.json").write_text(json.dumps({
        "stack": "inmemory", "capacity_msg_s": capacity, "host": socket.gethostname(), "created": time.time(),
        "date": "2026-01-01T00:00:00+00:00", "profile": "quick", "result": "capacity", "lower_bound": False}))


def test_settling_x1_gives_a_new_plan_and_leaves_the_old_one(tmp_path):
    p = tmp_path / "auto.yaml"
    p.write_text("name: e\nload:\n  devices: 1\n  base_rate: auto\n  base_fraction: 0.25\n  shape: {kind: steady}\n"
                 "profiles: {quick: {warmup: 5}}\nchecks: [no_oom]\n")
    plan = plan_run(load_stack("inmemory"), load_checked(p), "quick")
    _calibration(tmp_path / "cal", 1600.0)
    settled = settle_x1(plan, tmp_path / "runs" / "r" / "x", run_id="r", cal_dir=tmp_path / "cal")
    assert plan.exp.load.auto and plan.base_rate is None
    assert settled.exp.load.base_rate == 400.0 and settled.base_rate["source"] == "calibration-file"
    assert settled.shape().rate_at(0) == 400.0


def test_a_fixed_x1_carries_the_saved_capacity_and_a_failed_calibration_says_why(tmp_path, monkeypatch):
    plan = plan_run(load_stack("inmemory"), load_experiment("burst-x3"), "quick")
    assert settle_x1(plan, tmp_path / "o", run_id="r", cal_dir=tmp_path / "cal").base_rate is None   # none saved
    _calibration(tmp_path / "cal", 2000.0)
    info = settle_x1(plan, tmp_path / "o", run_id="r", cal_dir=tmp_path / "cal").base_rate
    assert info["capacity_msg_s"] == 2000.0 and info["fraction"] == 0.2
    assert settle_x1(plan, tmp_path / "o", run_id="r", dry_run=True, cal_dir=tmp_path / "cal") is plan

    def cannot(*a, **kw):
        raise RuntimeError("base_rate: auto: could not calibrate inmemory")
    monkeypatch.setattr("monsoon.run.plan.resolve_experiment", cannot)
    auto = dataclasses.replace(plan, exp=plan.exp.model_copy(
        update={"load": plan.exp.load.model_copy(update={"base_rate": "auto"})}))
    with pytest.raises(CalibrationFailed) as ei:
        settle_x1(auto, tmp_path / "o", run_id="r", cal_dir=tmp_path / "cal")
    assert isinstance(ei.value.cause, RuntimeError) and "could not calibrate" in str(ei.value)
