"""A size sweep through the session (the ``monsoon`` fixture): its result object and its dry run."""
import pytest

from monsoon.load.sweep import TransportResult
from monsoon.report.result import DryRunSkipped, RunFailed, StackUnavailable
from monsoon.report.sweep import SweepResult
from monsoon.session import MonsoonSession
from monsoon.spec.yamlio import SpecError


def _record(caps, gc="pass"):
    return {"stack": "kafka", "experiment": "size-sweep", "run_id": "r", "sizes": [
        {"size": s, "capacity_msg_s": c, "lower_bound": False, "criterion": "latency" if c else None,
         "reason": f"p99 over 1 s at {s}" if c else "no step kept up",
         "transport": TransportResult(s, produced=t * 3, consumed=t * 3, seconds=3.0).to_dict()}
        for s, c, t in zip((100, 10000), caps, (60000, 5000))],
        "checks": [{"name": "gc_time_below", "verdict": gc, "figures": {"worst_gc_fraction": 0.2},
                    "message": "for 12 s"}]}


def test_a_passing_sweep_and_its_figures(tmp_path):
    r = SweepResult.from_record(_record([4000.0, 500.0]), tmp_path, "quick")
    assert r.verdict == "pass" and r.trends["mb_s"] == "rises"
    r.assert_pass()
    d = r.to_dict()
    assert d["kind"] == "size-sweep" and [c["name"] for c in d["checks"]] == ["gc_time_below", "sweep_capacity"]
    assert d["figures"]["mb_s[10000B]"] == 5.0 and d["figures"]["transport_msg_s[100B]"] == 60000


def test_assert_pass_fails_with_the_table(tmp_path):
    r = SweepResult.from_record(_record([4000.0, None], gc="fail"), tmp_path, "quick")
    with pytest.raises(RunFailed) as e:
        r.assert_pass()
    msg = str(e.value)
    assert msg.startswith("kafka / size-sweep (quick): FAIL")
    assert "100 B | 4,000 | 0.40 | 60,000 | 6.00 | 93% | latency: p99 over 1 s at 100" in msg
    assert "10 KB | - | - | 5,000 | 50.00 | - | -" in msg
    assert "FAIL    sweep_capacity: no step kept up at 10 KB" in msg and "FAIL    gc_time_below" in msg


def test_dry_run_prints_the_plan_and_starts_nothing(tmp_path):
    said = []
    s = MonsoonSession(runs_dir=tmp_path / "runs", dry_run=True, progress=said.append)
    r = s.sweep("kafka", "size-sweep-story")
    assert "[dry run] size sweep kafka/size-sweep-story (quick)" in said[0] and "100 B, 10000 B" in said[0]
    assert "transport alone: Kafka produce+consume" in said[0]
    with pytest.raises(DryRunSkipped):
        r.assert_pass()
    assert not (tmp_path / "runs").exists() and not s.results


def test_an_experiment_without_sizes_is_refused_before_anything_starts(tmp_path):
    s = MonsoonSession(runs_dir=tmp_path / "runs", progress=lambda m: None)
    with pytest.raises(SpecError, match="load.payload.sizes"):
        s.sweep("kafka", "burst-x3")
    assert not (tmp_path / "runs").exists()


def test_thingsboards_sweep_is_planned_to_its_mqtt_limit_and_skips_without_its_jar(tmp_path, monkeypatch):
    said: list[str] = []
    s = MonsoonSession(runs_dir=tmp_path / "runs", dry_run=True, progress=said.append)
    s.sweep("thingsboard-kafka", "size-sweep-thingsboard")
    assert "sizes: 100 B, 1000 B, 10000 B, 60000 B" in said[0] and "Kafka produce+consume" in said[0]
    monkeypatch.setattr("monsoon.stack.supervisor.CACHE", tmp_path / "cache")   # no jar there
    s = MonsoonSession(runs_dir=tmp_path / "runs", progress=said.append, dry_run=True)   # never starts a stack
    with pytest.raises(StackUnavailable, match="thingsboard-4.2.1-boot.jar"):
        s.sweep("thingsboard-kafka", "size-sweep-thingsboard", skip_unavailable=True)
    assert not s.results


def test_a_capacity_that_is_only_a_lower_bound_is_said(tmp_path):
    rec = _record([4000.0, 500.0])
    rec["sizes"][1].update(lower_bound=True, criterion="max-rate")
    r = SweepResult.from_record(rec, tmp_path, "quick")
    cap = r.check("sweep_capacity")
    assert cap.verdict == "pass" and cap.figures["lower_bounds"] == 1, cap
    assert "only a lower bound at 10 KB (max-rate)" in cap.message, cap.message


def test_a_sweep_judges_throughput_without_the_latency_knee_unless_asked():
    from monsoon.spec.experiment import load_experiment
    from monsoon.run.calibrate import Criteria, Step, step_failures
    sw = load_experiment("size-sweep-story").load.sweep.resolved("quick")
    assert sw["latency_k"] is None
    loaded = Step(index=1, target=192, seconds=4, scheduled=768, sent=768, acked=768, p99_ms=384.0)
    assert step_failures(loaded, 42.0, Criteria(latency_k=float("inf"))) == []     # ThingsBoard at 1 KB, measured
    assert [c for c, _ in step_failures(loaded, 42.0, Criteria())] == ["latency-knee"]
