"""Fault checks on hand-made timelines: faults_landed, throughput_drop, latency_objective, and how
no_oom and lag_recovers_within read injected faults.  Every check is shown passing, failing and
saying unknown; ``monsoon analyze`` must reach the same verdicts offline."""
from __future__ import annotations

import csv
import json
import sys
import types

import pytest

import monsoon
from monsoon.checks.base import FAIL, INFO, PASS, UNKNOWN, RunData
from monsoon.checks.registry import evaluate
from monsoon.checks.lag import lag_recovers_within
from monsoon.checks.oom import no_oom, no_unexpected_exit
from monsoon.analysis import analyze
from monsoon.timeline.views import explained_by_kill, fault_windows
from monsoon.checks.faults import faults_landed, latency_objective, throughput_drop
from tests.unit.helpers import RunBuilder

WALL0 = 1_700_000_000.0   # the meta event's wall clock at timeline t=0


def builder(dir, base_rate: float = 100.0, plan_t: float | None = 0.0, **meta) -> RunBuilder:
    """A RunBuilder whose meta event carries a realistic wall clock (the acked log is wall-clock)."""
    b = RunBuilder(dir, base_rate=base_rate)
    b.events[0].update(wall=WALL0, **meta)
    if plan_t is not None:
        b.ev("fault-plan", plan_t, run_id="r", horizon=120, faults=[])
    return b


def fault(b: RunBuilder, name: str, window: int, phase: str, effective: float, landed, *, plan_t: float = 0.0,
          kind: str = "network-latency", target: str = "platform->postgres", backend: str = "toxiproxy",
          evidence: dict | None = None, intended: float | None | str = "effective", **extra) -> RunBuilder:
    """One ``fault`` event as FaultPlan writes it (``effective`` relative to the plan start; ``intended``
    None for the final heal)."""
    return b.ev("fault", plan_t + effective + 0.2, name=name, kind=kind, backend=backend, target=target,
                window=window, phase=phase, intended=effective if intended == "effective" else intended,
                effective=effective, landed=landed,
                evidence=evidence if evidence is not None else {"method": "probe:postgres"}, **extra)


def window(b: RunBuilder, name: str, start: float, end: float | None, *, n: int = 0, landed=True, healed=True,
           plan_t: float = 0.0, **kw) -> RunBuilder:
    fault(b, name, n, "inject", start, landed, plan_t=plan_t, **kw)
    if end is not None:
        kw.pop("evidence", None)
        fault(b, name, n, "heal", end, healed, plan_t=plan_t, **kw)
    return b


def census(b: RunBuilder, t: float, leftovers: dict | None = None) -> RunBuilder:
    return b.ev("fault-census", t, run_id="r", swept={}, leftovers=leftovers or {}, errors=[])


def run(b: RunBuilder) -> RunData:
    return RunData(b.write())


# ------------------------------------------------------------ fault_windows

def test_fault_windows_place_faults_on_the_timeline_from_the_plan_start(tmp_path):
    b = builder(tmp_path, plan_t=12.5)
    window(b, "lat", 30, 45, plan_t=12.5)
    window(b, "lat", 90, None, n=1, plan_t=12.5)
    [w0, w1] = fault_windows(run(b).events)
    assert (w0.name, w0.window, w0.start, w0.end, w0.landed, w0.healed) == ("lat", 0, 42.5, 57.5, True, True)
    assert (w1.window, w1.start, w1.end, w1.healed) == (1, 102.5, None, None)


def test_fault_windows_are_empty_without_a_plan(tmp_path):
    b = builder(tmp_path, plan_t=None)
    assert fault_windows(run(b).events) == []


# ------------------------------------------------------------ faults_landed

def test_faults_landed_passes_when_every_fault_landed_and_healed(tmp_path):
    b = builder(tmp_path)
    window(b, "lat", 30, 45)
    window(b, "kill", 60, 65, kind="pod-kill", target="platform", backend="process")
    census(b, 100)
    v = faults_landed(run(b))
    assert v.verdict == PASS, v.message
    assert v.figures == {"faults_injected": 2, "faults_landed": 2, "faults_healed": 2, "faults_healed_late": 0,
                         "faults_left_in_place": 0}
    assert "network-latency" in v.message and "pod-kill" in v.message


@pytest.mark.parametrize("landed,how", [(None, "not measurable"), (False, "did not land")])
def test_faults_landed_is_unknown_when_an_inject_did_not_demonstrably_land(tmp_path, landed, how):
    b = builder(tmp_path)
    window(b, "lat", 30, 45)
    window(b, "slow-mongo", 50, 70, landed=landed, evidence={"method": "api", "error": "probe timed out"})
    census(b, 100)
    v = faults_landed(run(b))
    assert v.verdict == UNKNOWN
    assert "slow-mongo#0" in v.message and how in v.message and "probe timed out" in v.message
    assert v.figures["faults_injected"] == 2 and v.figures["faults_landed"] == 1 and v.figures["faults_healed"] == 2


def test_faults_landed_fails_when_a_heal_did_not_land(tmp_path):
    b = builder(tmp_path)
    window(b, "lat", 30, 45, healed=False)
    census(b, 100)
    v = faults_landed(run(b))
    assert v.verdict == FAIL
    assert v.figures["faults_healed"] == 0 and "lat#0" in v.message


def test_faults_landed_judges_the_last_heal_a_failed_scheduled_heal_retried_by_the_final_heal(tmp_path):
    b = builder(tmp_path)
    window(b, "ok", 10, 20)
    fault(b, "lat", 0, "inject", 30, True)
    fault(b, "lat", 0, "heal", 45, False, evidence={"method": "heal", "error": "FaultError: toxiproxy 503"})
    fault(b, "lat", 0, "heal", 90.5, True, intended=None, final=True)    # FaultPlan.heal_all retried it
    census(b, 100)
    v = faults_landed(run(b))
    assert v.verdict == PASS, v.message
    assert v.figures["faults_healed"] == 2 and v.figures["faults_healed_late"] == 1
    assert v.figures["max_heal_overstay_s"] == 45.5 and v.figures["faults_left_in_place"] == 0
    assert "healed late by the final heal" in v.message and "lat#0 +45.5s" in v.message
    [w_ok, w_lat] = fault_windows(run(b).events)
    assert w_ok.late_s is None
    assert (w_lat.end, w_lat.healed, w_lat.late_s) == (90.5, True, 45.5)   # the fault really lasted until then


def test_faults_landed_fails_when_the_final_heal_failed_too(tmp_path):
    b = builder(tmp_path)
    fault(b, "lat", 0, "inject", 30, True)
    fault(b, "lat", 0, "heal", 45, False, evidence={"method": "heal", "error": "FaultError: toxiproxy 503"})
    fault(b, "lat", 0, "heal", 90.5, False, intended=None, final=True,
          evidence={"method": "heal", "error": "FaultError: still 503"})
    census(b, 100, {"toxiproxy": ["toxic m_r__platform__postgres/m_r__lat__0__downstream"]})
    v = faults_landed(run(b))
    assert v.verdict == FAIL and v.figures["faults_healed"] == 0 and v.figures["faults_healed_late"] == 0
    assert "lat#0 (FaultError: still 503)" in v.message


def test_faults_landed_fails_when_a_fault_was_never_healed(tmp_path):
    b = builder(tmp_path)
    window(b, "lat", 30, None)
    census(b, 100)
    v = faults_landed(run(b))
    assert v.verdict == FAIL and "lat#0" in v.message


def test_faults_landed_fails_when_the_census_found_leftovers(tmp_path):
    b = builder(tmp_path)
    window(b, "lat", 30, 45)
    census(b, 100, {"toxiproxy": ["toxic m_r__platform__postgres/m_r__lat__0__downstream"]})
    v = faults_landed(run(b))
    assert v.verdict == FAIL
    assert v.figures["faults_left_in_place"] == 1
    assert "toxiproxy: toxic m_r__platform__postgres/m_r__lat__0__downstream" in v.message


def test_faults_landed_reports_the_downtime_of_a_kill(tmp_path):
    b = builder(tmp_path).service_start()
    b.ev("service", 1.0, service="platform", event="ready")
    window(b, "kill", 60, 65, kind="pod-kill", target="platform", backend="process")
    b.ev("service", 60.1, service="platform", event="exit", code=137, oom=False, cause="SIGKILL")
    b.ev("service", 61.0, service="platform", event="restart", n=2)
    b.ev("service", 61.0, service="platform", event="start", pid=2, n=2)
    b.ev("service", 75.5, service="platform", event="ready")
    census(b, 100)
    v = faults_landed(run(b))
    assert v.verdict == PASS and v.figures["max_downtime_s"] == 15.5


def test_faults_landed_is_unknown_when_the_plan_never_started(tmp_path):
    b = builder(tmp_path, plan_t=None, faults=[{"name": "lat"}, {"name": "kill"}])
    v = faults_landed(run(b))
    assert v.verdict == UNKNOWN
    assert v.figures == {"faults_injected": 0, "faults_landed": 0, "faults_healed": 0}
    assert "2 fault(s) planned" in v.message and "ended early" in v.message


def test_faults_landed_is_unknown_without_a_census(tmp_path):
    b = builder(tmp_path)
    window(b, "lat", 30, 45)
    v = faults_landed(run(b))
    assert v.verdict == UNKNOWN and "census" in v.message


def test_faults_landed_an_inject_that_raised_did_not_land_rather_than_not_heal(tmp_path):
    b = builder(tmp_path)
    window(b, "ok", 10, 20)
    fault(b, "lat", 0, "inject", 30, False, evidence={"method": "inject", "error": "FaultError: no proxy"})
    census(b, 100)
    v = faults_landed(run(b))
    assert v.verdict == UNKNOWN
    assert "lat#0" in v.message and "no proxy" in v.message


# ---------------------------------------------------------- throughput_drop

def throughput_run(tmp_path, start: float = 30, end: float = 45, base: int = 400, during: int = 200,
                   secs: int = 60) -> RunData:
    """400 acked/s, 200/s inside the fault window [start, end] (timeline seconds; load from t=0)."""
    b = builder(tmp_path)
    for sec in range(secs):
        inside = start <= sec and sec + 1 <= end
        b.load(sec, scheduled=base, acked=during if inside else base)
    window(b, "lat", start, end)
    census(b, secs + 5)
    return run(b)


def test_throughput_drop_measures_the_drop_inside_the_fault_windows(tmp_path):
    v = throughput_drop(throughput_run(tmp_path))
    assert v.verdict == INFO     # no limit: it cannot fail, so it reports and is never shown as a PASS
    assert v.figures["baseline_msg_s"] == 400 and v.figures["during_faults_msg_s"] == 200
    assert v.figures["throughput_drop_pct"] == 50.0
    assert v.figures["baseline_seconds"] == 24   # t=6..29: after 5 s of settling, before the fault at 30
    assert v.figures["fault_seconds"] == 15
    assert "no limit" in v.message


def test_throughput_drop_fails_above_the_limit(tmp_path):
    v = throughput_drop(throughput_run(tmp_path), max_pct=30)
    assert v.verdict == FAIL
    assert v.figures["throughput_drop_pct"] == 50.0 and v.figures["limit_pct"] == 30
    assert "50.0% drop" in v.message


def test_throughput_drop_passes_under_the_limit(tmp_path):
    assert throughput_drop(throughput_run(tmp_path), max_pct=60).verdict == PASS


def test_throughput_drop_is_unknown_with_too_little_baseline(tmp_path):
    v = throughput_drop(throughput_run(tmp_path, start=7, end=20))
    assert v.verdict == UNKNOWN
    assert v.figures["baseline_seconds"] < 3 and "throughput_drop_pct" not in v.figures


def test_throughput_drop_is_unknown_without_faults(tmp_path):
    b = builder(tmp_path, plan_t=None)
    for sec in range(30):
        b.load(sec, 400, 400)
    assert throughput_drop(run(b)).verdict == UNKNOWN


# -------------------------------------------------------- latency_objective

def write_acked(dir, rows) -> None:
    """rows: (t_intended on the timeline, latency ms) -> acked.csv in wall-clock ms."""
    with open(dir / "acked.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["device", "seq", "intended_ms", "acked_ms"])
        for i, (t, lat) in enumerate(rows):
            intended = int(round((WALL0 + t) * 1000))
            w.writerow(["d1", i, intended, intended + int(lat)])


def latency_run(tmp_path, inside_ms: float, outside_ms: float, per_s: int = 20) -> RunData:
    """A fault window 30-45 s; messages intended every 1/per_s s from 0 to 60 s."""
    b = builder(tmp_path)
    b.phase("warmup", 0, 30).phase("soak", 30, 60)
    window(b, "lat", 30, 45)
    census(b, 65)
    rows = [(i / per_s, inside_ms if 30 <= i / per_s <= 45 else outside_ms) for i in range(60 * per_s)]
    write_acked(tmp_path, rows)
    return run(b)


def test_latency_objective_fails_when_the_fault_windows_are_slow(tmp_path):
    v = latency_objective(latency_run(tmp_path, inside_ms=2000, outside_ms=20), max_ms=500)
    assert v.verdict == FAIL
    assert v.figures["p99_ms"] == 2000 and v.figures["limit_ms"] == 500
    assert v.figures["samples"] == 15 * 20 + 1
    assert "2,000 ms" in v.message and "during the fault windows" in v.message


def test_latency_objective_ignores_slow_messages_outside_the_windows(tmp_path):
    r = latency_run(tmp_path, inside_ms=20, outside_ms=5000)
    v = latency_objective(r, max_ms=500)
    assert v.verdict == PASS and v.figures["p99_ms"] == 20
    assert latency_objective(r, max_ms=500, during="all").verdict == FAIL


def test_latency_objective_in_a_named_phase(tmp_path):
    r = latency_run(tmp_path, inside_ms=2000, outside_ms=20)
    v = latency_objective(r, max_ms=500, during="warmup")
    assert v.verdict == PASS and v.figures["p99_ms"] == 20
    v = latency_objective(r, max_ms=500, during="soak", percentile=50)
    assert v.verdict == FAIL and v.figures["p50_ms"] == 2000
    assert latency_objective(r, max_ms=500, during="burst").verdict == UNKNOWN


def test_latency_objective_names_its_verdict_by_phase_and_keeps_the_plain_name_for_the_faults(tmp_path):
    r = latency_run(tmp_path, inside_ms=2000, outside_ms=20)
    assert latency_objective(r, max_ms=500).name == "latency_objective"
    assert latency_objective(r, max_ms=500, during="faults").name == "latency_objective"
    assert latency_objective(r, max_ms=500, during="warmup").name == "latency_objective[warmup]"
    assert latency_objective(r, max_ms=500, during="all").name == "latency_objective[all]"
    assert latency_objective(r, max_ms=500, during="burst").name == "latency_objective[burst]"   # unknown too


def test_per_phase_latency_objectives_get_their_own_checklist_rows_and_defect_matrix_entries(tmp_path):
    from monsoon.selftest.defects import Defect, clean_entry, defect_entry
    from monsoon.report.checklist import checklist, summary
    r = latency_run(tmp_path, inside_ms=2000, outside_ms=20)
    vs = evaluate(r.dir, [("latency_objective", {"max_ms": 500}),
                          ("latency_objective", {"max_ms": 500, "during": "warmup"}),
                          ("latency_objective", {"max_ms": 500, "during": "soak", "percentile": 50})])
    assert [(v.name, v.verdict) for v in vs] == [("latency_objective", FAIL), ("latency_objective[warmup]", PASS),
                                                 ("latency_objective[soak]", FAIL)]
    result = {"stack": "kafka", "experiment": "slow", "verdict": FAIL, "figures": {},
              "checks": [v.to_dict() for v in vs]}
    md = checklist(summary("run-1", "quick", [result]))
    rows = [ln for ln in md.splitlines() if ln.startswith("| kafka | slow |")]
    assert len(rows) == 3 and len(set(rows)) == 3
    assert "| latency_objective[warmup] | PASS | p99_ms=20, p50_ms=20, samples=" in md   # its key figures
    # the defect matrix keys verdicts by name: none merged, and the check's phase verdicts catch a defect
    clean = clean_entry("defect-clean-x", 1, result)
    assert clean["checks"] == {"latency_objective": FAIL, "latency_objective[warmup]": PASS,
                               "latency_objective[soak]": FAIL}
    d = Defect("x", "slow", "kafka", "latency_objective", "DEFECT_X", "none")
    e = defect_entry(d, result)
    assert e["caught"] and e["expected_verdict"] == FAIL
    only_phase = dict(result, checks=[vs[1].to_dict(), vs[2].to_dict()])
    e = defect_entry(d, only_phase)
    assert e["caught"] and e["caught_by"] == ["latency_objective[soak]"] and e["figures"]["p50_ms"] == 2000
    e = defect_entry(d, dict(result, checks=[vs[1].to_dict()]))
    assert not e["caught"] and e["expected_verdict"] == PASS


def test_latency_objective_is_unknown_below_min_samples(tmp_path):
    r = latency_run(tmp_path, inside_ms=2000, outside_ms=20, per_s=2)   # 31 messages in the window
    v = latency_objective(r, max_ms=500)
    assert v.verdict == UNKNOWN and v.figures["samples"] == 31
    assert latency_objective(r, max_ms=500, min_samples=30).verdict == FAIL


def test_latency_objective_is_unknown_without_the_acked_log(tmp_path):
    b = builder(tmp_path)
    window(b, "lat", 30, 45)
    assert latency_objective(run(b), max_ms=500).verdict == UNKNOWN


def _latency_with_outliers(tmp_path, n: int, slow: int) -> RunData:
    b = builder(tmp_path)
    window(b, "lat", 0, 100)
    write_acked(tmp_path, [(i * 100 / n, 5000 if i < slow else 10) for i in range(n)])
    return run(b)


def test_latency_objective_p99_of_200_messages_with_1pct_outliers(tmp_path):
    v = latency_objective(_latency_with_outliers(tmp_path, 200, 2), max_ms=100)
    assert v.verdict == PASS and v.figures["p99_ms"] == 10


def test_latency_objective_p99_of_100_messages_with_1pct_outliers(tmp_path):
    v = latency_objective(_latency_with_outliers(tmp_path, 100, 1), max_ms=100)
    assert v.figures["p99_ms"] == 10 and v.verdict == PASS


# ------------------------------------------------------------------ no_oom

def kill_run(tmp_path, *, fault_on: str | None = "platform", oom: bool = False, exit_t: float = 30.1,
             code: int = 137) -> RunData:
    b = builder(tmp_path).service_start()
    if fault_on is not None:
        window(b, "kill", 30, 35, kind="pod-kill", target=fault_on, backend="process",
               evidence={"method": "pid", "service": fault_on, "old_pid": 1, "new_pid": 2,
                         "restart_after_s": 2.0})
        census(b, 100)
    b.ev("service", exit_t, service="platform", event="exit", code=code, oom=oom,
         cause="java.lang.OutOfMemoryError (JVM exit 3)" if oom else "SIGKILL")
    b.ev("service", exit_t + 2, service="platform", event="restart", n=2)
    return run(b)


def test_no_oom_passes_on_an_injected_pod_kill(tmp_path):
    r = kill_run(tmp_path)
    assert explained_by_kill(r.events) == {("exit", "platform", 30.1), ("restart", "platform", 32.1)}
    v = no_oom(r)
    assert v.verdict == PASS, v.message
    assert v.figures == {"oom_events": 0, "restarts": 0, "exits": 0, "injected_kills": 1}
    assert "1 exit(s) caused by injected kills" in v.message


def test_the_same_exit_without_a_fault_is_an_unexpected_death(tmp_path):
    r = kill_run(tmp_path, fault_on=None)
    assert no_oom(r).figures == {"oom_events": 0, "restarts": 0, "exits": 1}
    v = no_unexpected_exit(r)
    assert v.verdict == FAIL and v.figures == {"unexpected_exits": 1, "restarts": 1}


def test_no_oom_fails_when_the_kill_was_of_another_service(tmp_path):
    r = kill_run(tmp_path, fault_on="kafka")
    assert explained_by_kill(r.events) == set()
    assert no_unexpected_exit(r).verdict == FAIL


@pytest.mark.parametrize("exit_t", [26.5, 34.0, 67.0])
def test_an_exit_that_does_not_follow_the_kill_is_unexpected(tmp_path, exit_t):
    v = no_unexpected_exit(kill_run(tmp_path, exit_t=exit_t))   # more than 3 s before or after the injection
    assert v.verdict == FAIL and v.figures["unexpected_exits"] == 1 and "injected_kills" not in v.figures


def test_no_oom_fails_on_a_crash_loop_after_an_injected_kill(tmp_path):
    b = builder(tmp_path).service_start()
    window(b, "kill", 30, 35, kind="pod-kill", target="platform", backend="process")
    census(b, 100)
    b.ev("service", 30.1, service="platform", event="exit", code=137, oom=False, cause="SIGKILL")
    b.ev("service", 32.0, service="platform", event="restart", n=2)
    b.ev("service", 33.0, service="platform", event="exit", code=1, oom=False, cause="exit 1")
    b.ev("service", 34.0, service="platform", event="restart", n=3)
    assert no_oom(run(b)).verdict == PASS
    v = no_unexpected_exit(run(b))
    assert v.verdict == FAIL
    assert v.figures == {"unexpected_exits": 1, "restarts": 1, "injected_kills": 1}
    assert "platform exited with code 1 at t=33s" in v.message


def test_no_oom_fails_on_an_oom_death_inside_the_kill_window(tmp_path):
    v = no_oom(kill_run(tmp_path, oom=True, code=3))
    assert v.verdict == FAIL
    assert v.figures["oom_events"] == 1 and v.figures["exits"] == 1
    assert "OutOfMemoryError" in v.message


def test_no_oom_passes_on_a_kafka_broker_restart_with_a_slow_controlled_shutdown(tmp_path):
    b = builder(tmp_path).service_start(service="kafka")
    window(b, "broker-restart", 120, 150, kind="kafka-broker-restart", target="kafka", backend="process",
           evidence={"method": "pid", "service": "kafka", "old_pid": 1, "new_pid": 2, "signal": "SIGTERM",
                     "restart_after_s": 9.0})
    census(b, 200)
    b.ev("service", 128.0, service="kafka", event="exit", code=143, oom=False, cause="SIGTERM")
    b.ev("service", 129.0, service="kafka", event="restart", n=2)
    v = no_oom(run(b))
    assert v.verdict == PASS, v.message
    assert v.figures["injected_kills"] == 1


# ------------------------------------------------- lag_recovers_within + faults

def lag_run(tmp_path, second_recovers_at: float | None, last_sample: float = 200) -> RunData:
    """Two pod kills (30-35 s, 90-95 s) on a steady load: lag 5000 after each, recovering at
    45 s (10 s after the first) and at ``second_recovers_at`` (None: never, samples until ``last_sample``)."""
    b = builder(tmp_path).phase("warmup", 0, 30).phase("recovery", 30, last_sample)
    window(b, "kill", 30, 35, kind="pod-kill", target="platform", backend="process")
    window(b, "kill", 90, 95, n=1, kind="pod-kill", target="platform", backend="process")
    census(b, last_sample + 1)
    pts = []
    t = 0.0
    while t <= last_sample:
        high = 30 <= t < 45 or (90 <= t and (second_recovers_at is None or t < second_recovers_at))
        pts.append((t, 5000.0 if high else 5.0))
        t += 5
    b.lag(pts)
    b.ev("op", last_sample, op="load-end")
    return run(b)


def test_lag_recovers_after_every_fault_window(tmp_path):
    v = lag_recovers_within(lag_run(tmp_path, second_recovers_at=115), seconds=60)
    assert v.verdict == PASS, v.message
    assert v.figures["recovery_s"] == 20 and v.figures["recovery_s_mean"] == 15
    assert v.figures["faults"] == 2 and v.figures["faults_recovered"] == 2 and v.figures["peak_lag"] == 5000


def test_lag_recovers_fails_when_one_window_recovers_too_slowly(tmp_path):
    v = lag_recovers_within(lag_run(tmp_path, second_recovers_at=175), seconds=60)
    assert v.verdict == FAIL
    assert v.figures["recovery_s"] == 80
    assert "kill#1" in v.message and "80.0s" in v.message


def test_lag_recovers_fails_when_a_window_never_recovers(tmp_path):
    v = lag_recovers_within(lag_run(tmp_path, second_recovers_at=None, last_sample=200), seconds=60)
    assert v.verdict == FAIL
    assert v.figures["faults_recovered"] == 1 and v.figures["final_lag"] == 5000
    assert "kill#1" in v.message


def test_lag_recovers_is_unknown_when_sampling_ended_before_the_limit(tmp_path):
    v = lag_recovers_within(lag_run(tmp_path, second_recovers_at=None, last_sample=120), seconds=60)
    assert v.verdict == UNKNOWN
    assert "kill#1" in v.message and "before the limit" in v.message


def test_a_backlog_emptied_by_a_crash_after_a_fault_window_is_not_a_recovery(tmp_path):
    b = builder(tmp_path).service_start().phase("warmup", 0, 30).phase("recovery", 30, 120)
    window(b, "lat", 30, 45)
    census(b, 121)
    b.lag([(float(t), 5000.0 if 30 <= t < 75 else 0.0) for t in range(0, 121, 5)],
          collector="metrics", field="queue_depth")
    b.ev("service", 72.0, service="platform", event="exit", code=3, oom=True,
         cause="java.lang.OutOfMemoryError (JVM exit 3)")
    b.ev("op", 120.0, op="load-end")
    v = lag_recovers_within(run(b), seconds=60)
    assert v.verdict == FAIL and v.figures.get("emptied_by_crash") == 1


# ---------------------------------------------------------- monsoon analyze

CHECKS = [{"name": "no_oom", "params": {}},
          {"name": "lag_recovers_within", "params": {"seconds": 60}},
          {"name": "throughput_drop", "params": {"max_pct": 30}},
          {"name": "latency_objective", "params": {"max_ms": 500}},
          {"name": "faults_landed", "params": {}}]   # added by the runner to every experiment with faults


def full_run(dir, experiment: str, slow: bool) -> RunBuilder:
    b = builder(dir, base_rate=400, experiment=experiment, stack="kafka", run_id="run-1", checks=CHECKS,
                faults=[{"name": "kill"}])
    b.service_start().phase("warmup", 0, 30).phase("recovery", 30, 90)
    window(b, "kill", 30, 35, kind="pod-kill", target="platform", backend="process",
           evidence={"method": "pid", "restart_after_s": 2.0})
    census(b, 95)
    b.ev("service", 30.1, service="platform", event="exit", code=137, oom=False, cause="SIGKILL")
    b.ev("service", 32.0, service="platform", event="restart", n=2)
    for sec in range(90):
        inside = 30 <= sec and sec + 1 <= 35
        b.load(sec, 400, (100 if slow else 380) if inside else 400)
    b.lag([(float(t), 5000.0 if 30 <= t < (110 if slow else 45) else 0.0) for t in range(0, 131, 5)])
    b.ev("op", 90.0, op="load-end")
    rows = [(i / 20, (2000 if slow else 50) if 30 <= i / 20 <= 35 else 20) for i in range(90 * 20)]
    b.write()
    write_acked(b.dir, rows)
    return b


def test_analyze_reproduces_the_fault_verdicts_offline(tmp_path, monkeypatch):
    # the plots are not under test here, and importing matplotlib alone takes seconds
    stub = types.ModuleType("monsoon.html_report")
    stub.write = lambda run_dir, s: None
    monkeypatch.setitem(sys.modules, "monsoon.html_report", stub)
    monkeypatch.setattr(monsoon, "html_report", stub, raising=False)
    run_dir = tmp_path / "run-1"
    full_run(run_dir / "kafka--good", "good", slow=False)
    full_run(run_dir / "kafka--bad", "bad", slow=True)
    direct = {sub: {v.name: v for v in evaluate(run_dir / sub, [(c["name"], c["params"]) for c in CHECKS])}
              for sub in ("kafka--good", "kafka--bad")}
    assert {n: v.verdict for n, v in direct["kafka--good"].items()} == dict.fromkeys(direct["kafka--good"], PASS)
    assert {n: v.verdict for n, v in direct["kafka--bad"].items()} == {
        "no_oom": PASS, "lag_recovers_within": FAIL, "throughput_drop": FAIL, "latency_objective": FAIL,
        "faults_landed": PASS}

    s = analyze(run_dir)
    by = {r["experiment"]: r for r in s["results"]}
    assert by["good"]["verdict"] == PASS and by["bad"]["verdict"] == FAIL
    for exp, sub in (("good", "kafka--good"), ("bad", "kafka--bad")):
        got = {c["name"]: c for c in by[exp]["checks"]}
        assert list(got) == [c["name"] for c in CHECKS]
        for name, v in direct[sub].items():
            assert (got[name]["verdict"], got[name]["figures"], got[name]["message"]) == \
                   (v.verdict, v.figures, v.message)
    saved = json.loads((run_dir / "kafka--bad" / "result.json").read_text())
    assert saved["verdict"] == FAIL
    assert (run_dir / "summary.json").exists() and (run_dir / "checklist.md").exists()


def test_lag_that_relapses_before_the_next_fault_window_is_not_a_recovery(tmp_path):
    # kill#0 (30-35): lag drains at 45, then climbs back from 50 and stays up until kill#1 starts at 90
    b = builder(tmp_path).phase("warmup", 0, 30).phase("recovery", 30, 200)
    window(b, "kill", 30, 35, kind="pod-kill", target="platform", backend="process")
    window(b, "kill", 90, 95, n=1, kind="pod-kill", target="platform", backend="process")
    census(b, 201)
    b.lag([(float(t), 5000.0 if 30 <= t < 45 or 50 <= t < 90 or 90 <= t < 115 else 5.0) for t in range(0, 201, 5)])
    b.ev("op", 200, op="load-end")
    v = lag_recovers_within(run(b), seconds=30)
    assert v.verdict == FAIL, v.message
    assert v.figures["relapses"] == 1 and v.figures["faults_recovered"] == 1 and v.figures["final_lag"] == 5000
    assert "kill#0" in v.message and "relapse" in v.message
    # with a limit longer than the gap to the next window, the first window cannot be decided
    v = lag_recovers_within(run(b), seconds=120)
    assert v.verdict == UNKNOWN and "next fault window started at t=90s" in v.message, v.message
