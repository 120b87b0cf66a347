"""The request mix's pure parts: the spec, the open-model schedule, the per-operation windows, the judge, the
decision and the report (monsoon/load/mix.py, monsoon/spec/mix.py, monsoon/run/mix.py, monsoon/report/mix.py)."""
from __future__ import annotations

import pytest

from monsoon.load.mix import MixClient, MixCriteria, MixDevice, OpStats, judge_ops, per_second_counts, schedule_second
from monsoon.load.shapes import Stage, Stages
from monsoon.report import mix as report
from monsoon.run.calibrate import Step
from monsoon.run.mix import RampMix, mix_decision, plan_mix
from monsoon.spec.experiment import load_experiment
from monsoon.spec.mix import MixSpec
from monsoon.spec.stack import load_stack
from monsoon.spec.yamlio import SpecError


def test_shares_normalise_the_weights_and_writes_must_carry_the_ramp():
    m = MixSpec(weights={"read": 4, "search": 2, "write": 3, "modify": 1})
    assert m.shares() == {"read": 0.4, "search": 0.2, "write": 0.3, "modify": 0.1}
    assert MixSpec(weights={"write": 1, "read": 0}).shares() == {"write": 1.0}
    with pytest.raises(ValueError, match="write must be > 0"):
        MixSpec(weights={"read": 1})
    with pytest.raises(ValueError):
        MixSpec(weights={"write": 1, "delete": 1})


def test_fractions_carry_over_so_a_rare_op_still_runs():
    carry: dict[str, float] = {}
    sent = [per_second_counts(10, {"read": 0.5, "modify": 0.03}, carry) for _ in range(10)]
    assert all(s["read"] == 5 for s in sent)
    assert sum(s["modify"] for s in sent) == 3           # 0.3/s over 10 s


def test_a_second_is_spread_evenly_and_interleaved():
    sched = schedule_second({"read": 2, "search": 1, "modify": 0})
    assert sched == [(0.25, "read"), (0.5, "search"), (0.75, "read")]


def test_op_windows_count_and_take_percentiles():
    st = OpStats("read")
    for s in range(4):
        st.at(s).scheduled += 10
        st.at(s).sent += 10
        for k in range(10):
            st.answered(s, 0.001 * (k + 1) * (s + 1), None)
    st.error(3, "HTTP 500: boom")
    w = st.window(1, 3)
    assert (w["scheduled"], w["ok"], w["errors"], w["seconds"], w["ok_rate"]) == (20, 20, 0, 2, 10.0)
    assert w["p50_ms"] <= w["p99_ms"] <= w["p999_ms"] <= w["max_ms"] == pytest.approx(30, rel=0.01)
    t = st.totals(4.0)
    assert t["errors"] == 1 and t["first_error"] == "HTTP 500: boom" and t["error_kinds"] == {"HTTP 500": 1}


def win(scheduled=100, errors=0, refused=0, late=0, p99=10.0):
    return {"scheduled": scheduled, "errors": errors, "refused": refused, "late": late, "p99_ms": p99}


def test_the_judge_names_generator_then_errors_then_latency():
    base = {"read": win(), "search": win()}
    assert judge_ops({"read": win(), "search": win(p99=40)}, base) == (None, "")
    crit, why = judge_ops({"read": win(errors=5, refused=5), "search": win()}, base)
    assert crit == "errors" and "read: 5 of 100 failed" in why and "too many in-flight" in why
    assert judge_ops({"read": win(errors=1)}, base)[0] is None             # 1 % is allowed
    crit, why = judge_ops({"read": win(), "search": win(p99=400)}, base)
    assert crit == "latency-knee" and why.startswith("search: p99 400 ms")
    assert judge_ops({"read": win(p99=200)}, {"read": win(p99=10)})[0] is None   # under the 250 ms floor
    assert judge_ops({"read": win(late=60, errors=50)}, base)[0] == "generator"
    assert judge_ops({"read": win(errors=3)}, base, MixCriteria(error_fraction=0.05))[0] is None


def test_the_ramp_side_sends_the_total_rate_and_judges_against_the_first_step():
    class Client:
        started: list[float] = []

        def start(self, rates):
            self.started = rates

        def window(self, a, b):
            return {"read": win(p99=10 if a < 10 else 100)}
    c = Client()
    rm = RampMix(c, 0.25, MixCriteria())   # type: ignore[arg-type]
    rm.start(Stages((Stage("warmup", 2.0, 25.0), Stage("step00", 3.0, 50.0))))
    assert c.started == [100.0, 100.0, 200.0, 200.0, 200.0]
    first, later = rm.window(200, 0, 5), rm.window(400, 10, 15)
    assert first["ops_target"] == 200 and rm.judge(first, None) == (None, "")
    assert rm.judge(later, first)[0] is None                    # 100 ms: 10 x, but under the floor


def step(i, ok, target, criterion=None, reason=""):
    return Step(i, target * 0.3, 4.0, ok=ok, criterion=criterion, reason=reason,
                mix={"ops_target": target, "ops": {"read": {"ok_rate": target * 0.4}}})


def test_the_decision_is_the_last_step_kept_up_and_what_stopped_the_next():
    d = mix_decision([step(0, True, 100), step(1, True, 200), step(2, False, 400, "gc", "saturated by GC: 40%")],
                     True)
    assert d["capacity_ops_s"] == 200 and d["criterion"] == "gc"
    assert d["result"] == "capacity 200 ops/s (stopped by gc: at 400 ops/s: saturated by GC: 40%)"
    assert mix_decision([step(0, False, 100, "errors", "x")], True)["capacity_ops_s"] is None
    top = mix_decision([step(0, True, 100)], True)
    assert top["criterion"] == "max-rate" and report.capacity_verdict(top).verdict == "fail"
    gen = mix_decision([step(0, True, 100), step(1, False, 200, "generator", "late")], True)
    assert gen["generator_bound"] and report.capacity_verdict(gen).verdict == "fail"


def record():
    ops = {"read": {"ok_rate": 80.0, "p50_ms": 2.0, "p99_ms": 9.0, "p999_ms": 20.0, "errors": 0, "refused": 0},
           "modify": {"ok_rate": 20.0, "p50_ms": 1.0, "p99_ms": 3.0, "p999_ms": 4.0, "errors": 2, "refused": 0}}
    return {"stack": "kafka-registry", "experiment": "mix-story", "profile": "quick", "shares": {"read": 0.4,
            "write": 0.5, "modify": 0.1}, "capacity_ops_s": 200.0, "criterion": "gc", "generator_bound": False,
            "result": "capacity 200 ops/s (stopped by gc: ...)", "capacity_step_ops": ops, "ops": ops,
            "warmup": {"entities": 3, "found": 3, "seconds": 0.5, "lookup": {"ok": 3, "errors": 0, "p99_ms": 5.0},
                       "read": {"ok": 3, "errors": 0, "p99_ms": 7.0, "p50_ms": 3.0, "p999_ms": 7.0}},
            "steps": [step(0, True, 200).to_dict(), step(1, False, 400, "gc", "saturated").to_dict()]}


def test_the_report_has_the_operations_the_warm_up_apart_and_the_verdicts():
    rec = record()
    cap = report.capacity_verdict(rec)
    assert cap.verdict == "pass" and cap.figures["capacity_ops_s"] == 200 and cap.figures["p999_ms[read]"] == 20
    warm = report.warmup_verdict(rec)
    assert warm.verdict == "pass" and warm.figures["warmup_p99_ms[read]"] == 7.0
    rec["warmup"]["found"] = 2
    assert report.warmup_verdict(rec).verdict == "fail"
    md = report.markdown(rec, [cap.to_dict()])
    assert "| read | 40% | 80.0 | 2.0 | 9.0 | 20.0 | 0 | 0 |" in md and "| modify | 10% |" in md
    assert "## Warm-up (judged apart): 2 of 3 entities" in md and "| 1 | 400 |" in md and "gc: saturated" in md
    r = report.MixResult.from_record(rec, "/tmp/x", "quick")   # type: ignore[arg-type]
    d = r.to_dict()
    assert d["kind"] == "request-mix" and d["figures"]["capacity_ops_s"] == 200
    assert "| read | 40% |" not in r.failure_message() and "read | 40% | 80.0" in r.failure_message()


def test_a_mix_is_planned_before_anything_starts():
    exp = load_experiment("mix-story")
    assert plan_mix(load_stack("kafka-registry"), exp, "quick") is exp
    with pytest.raises(SpecError, match="load.mix"):
        plan_mix(load_stack("kafka-registry"), load_experiment("size-sweep-story"), "quick")
    with pytest.raises(SpecError, match="provisioning kind none"):
        s = load_stack("kafka-registry")
        plan_mix(s.model_copy(update={"provisioning": s.provisioning.model_copy(update={"kind": "none"})}), exp,
                 "quick")


def test_modify_needs_one_topic_not_thingsboards_pattern():
    with pytest.raises(SpecError, match="is a pattern"):
        plan_mix(load_stack("thingsboard-kafka"), load_experiment("mix-story"), "quick")


def test_modify_needs_a_kafka_topic_and_the_client_says_so():
    with pytest.raises(ValueError, match="Kafka topic"):
        MixClient("http://127.0.0.1:1", "u", "p", [MixDevice("d")], shares={"modify": 1.0})
