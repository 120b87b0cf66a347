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
    # base_rate: auto: the shape exists once x1 is settled (here by hand; settle_x1 reads the calibration)
    load = plan.exp.load.model_copy(update={"base_rate": 500.0})
    settled = dataclasses.replace(plan, exp=plan.exp.model_copy(update={"load": load}))
    assert plan.exp.load.auto and settled.durations.total == settled.shape().duration
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


def _calibration(cal_dir, capacity: float, stack: str = "inmemory") -> None:
    cal_dir.mkdir(parents=True, exist_ok=True)
    (cal_dir / f"{stack}.json").write_text(json.dumps({
        "stack": stack, "capacity_msg_s": capacity, "host": socket.gethostname(), "created": time.time(),
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
    p = tmp_path / "fixed.yaml"
    p.write_text("name: fixed\nload:\n  devices: 1\n  base_rate: 400\n  shape: {kind: burst, multiplier: 3}\n"
                 "profiles: {quick: {warmup: 5, burst: 5}}\nchecks: [no_oom]\n")
    plan = plan_run(load_stack("inmemory"), load_checked(p), "quick")
    assert settle_x1(plan, tmp_path / "o", run_id="r", cal_dir=tmp_path / "cal").base_rate is None   # none saved
    _calibration(tmp_path / "cal", 2000.0)
    info = settle_x1(plan, tmp_path / "o", run_id="r", cal_dir=tmp_path / "cal").base_rate
    assert info["capacity_msg_s"] == 2000.0 and info["fraction"] == 0.2
    assert info["x1"].startswith("x1 = 400 msg/s (fixed rate) = 20% of the 2,000 msg/s measured at 2026-01-01")
    assert settle_x1(plan, tmp_path / "o", run_id="r", dry_run=True, cal_dir=tmp_path / "cal") is plan

    def cannot(*a, **kw):
        raise RuntimeError("base_rate: auto: could not calibrate inmemory")
    monkeypatch.setattr("monsoon.run.plan.resolve_experiment", cannot)
    auto = dataclasses.replace(plan, exp=plan.exp.model_copy(
        update={"load": plan.exp.load.model_copy(update={"base_rate": "auto"})}))
    with pytest.raises(CalibrationFailed) as ei:
        settle_x1(auto, tmp_path / "o", run_id="r", cal_dir=tmp_path / "cal")
    assert isinstance(ei.value.cause, RuntimeError) and "could not calibrate" in str(ei.value)


def test_a_burst_with_fill_lasts_until_its_backlog_passes_the_heap_twice_at_the_calibrated_x1(tmp_path):
    """burst-x10 (fill: 2) on the in-memory stack (observe.fills_at): the slower the machine, the longer the
    burst; a fast one keeps the profile's burst as the shortest; Kafka (no fills_at) keeps it as is."""
    exp = load_experiment("burst-x10")
    d = exp.durations("quick")
    fills = load_stack("inmemory").observe.fills_at_for("quick")
    assert d.fill == 2 and fills and load_stack("kafka").observe.fills_at_for("quick") is None
    bursts = {}
    for cap in (400.0, 2900.0, 20000.0):
        _calibration(tmp_path / "cal", cap)
        plan = settle_x1(plan_run(load_stack("inmemory"), exp, "quick"), tmp_path / "o", run_id="r",
                         cal_dir=tmp_path / "cal")
        info, burst = plan.base_rate, plan.durations.burst
        growth = (10 * 0.25 - 1.25) * cap            # what the stack surely does not absorb
        assert info["growth_msg_s"] == pytest.approx(growth) and info["burst_s"] == burst
        assert growth * burst >= 2 * fills and burst >= d.burst                    # twice the heap, at least
        assert burst == d.burst or growth * (burst - 1) < 2 * fills               # and no longer than that
        assert plan.shape().rate_at(d.warmup + 1) == pytest.approx(10 * 0.25 * cap)
        assert f"burst {burst:g} s, to pass {fills:,} queued messages" in info["x1"]
        bursts[cap] = burst
    assert bursts[400.0] > bursts[2900.0] >= bursts[20000.0] == d.burst
    _calibration(tmp_path / "cal", 2000.0, "kafka")     # (a unit test never calibrates for real)
    kafka = settle_x1(plan_run(load_stack("kafka"), exp, "quick"), tmp_path / "o", run_id="r",
                      cal_dir=tmp_path / "cal")
    assert kafka.durations.burst == d.burst and "burst_s" not in kafka.base_rate


def test_fill_refuses_a_burst_that_need_not_grow_a_backlog():
    from monsoon.run.calibrate import fill_burst
    with pytest.raises(ValueError, match="need not grow"):
        fill_burst(30, fill=2, fills_at=1000, multiplier=3, fraction=0.25, capacity=1000, factor=1.25)
    assert fill_burst(30, fill=2, fills_at=90_000, multiplier=10, fraction=0.25, capacity=1000,
                      factor=1.25) == (144.0, 1250.0)


def test_a_calibration_is_keyed_by_host_stack_file_jars_profile_and_cpu_budget():
    from monsoon.run.calibrate import usable
    now = time.time()
    cal = {"capacity_msg_s": 1000, "host": "h", "created": now, "profile": "quick", "jar_sha256": {"a.jar": "1"},
           "stack_sha256": "s1", "service_cpus": None}
    base = dict(host="h", max_age=86400, now=now, profile="quick", jars={"a.jar": "1"}, stack_file="s1")
    assert usable(cal, **base) == (True, "")
    assert "host" in usable(cal, **{**base, "host": "g"})[1]
    assert "stack file changed" in usable(cal, **{**base, "stack_file": "s2"})[1]
    assert "a.jar changed" in usable(cal, **{**base, "jars": {"a.jar": "2"}})[1]
    assert "profile" in usable(cal, **{**base, "profile": "full"})[1]
    assert "CPU budget" in usable(cal, **base, cpus="0.5")[1]
    assert "days ago" in usable(cal, **{**base, "now": now + 8 * 86400})[1]


def test_the_python_fleets_limit_is_said_before_the_load_from_the_calibrations_own_cost():
    from monsoon.run.calibrate import generator_cost, pacing_warning
    cal = {"steps": [{"ok": True, "sent": 8000, "gen_cpu_s": 0.4}, {"ok": True, "sent": 20000, "gen_cpu_s": 0.8},
                     {"ok": False, "sent": 25000, "gen_cpu_s": 2.0}]}
    assert generator_cost(cal) == 40.0                     # the fastest step kept up with: 0.8 s / 20,000
    assert generator_cost({"steps": [{"ok": True, "sent": 10}]}) is None
    assert pacing_warning(10_000, 40.0, "python") is None  # 0.4 cores
    warn = pacing_warning(25_000, 40.0, "python")          # 1.0 core: more than 70 % of its one core
    assert warn and "25,000 msg/s needs ~1.00 cores" in warn and "engine: native" in warn
    assert pacing_warning(25_000, 40.0, "native") is None and pacing_warning(25_000, None, "python") is None
