"""The per-phase error-budget SLO and its multi-window burn-rate rules, on hand-made load events."""
import pytest

from monsoon.checks.registry import CHECKS, validate_check
from monsoon.checks.base import FAIL, PASS, UNKNOWN, RunData
from monsoon.checks.slo import BurnRule, Outcome, Second, burn_rates, error_budget, first_firing, good_fraction, load_seconds, outcomes, scaled_windows
from tests.unit.helpers import RunBuilder


def run(b: RunBuilder) -> RunData:
    return RunData(b.write())


def steady(b: RunBuilder, secs, rate=200, bad=None, **lat):
    """``rate`` msg/s acked with healthy latency; ``bad`` maps second -> (acked, failed, p50, p99, max)."""
    bad = bad or {}
    for s in secs:
        if s in bad:
            acked, failed, p50, p99, mx = bad[s]
            b.load(s, rate, acked, failed, p50, p99, mx)
        else:
            b.load(s, rate, rate, **lat)
    return b


# ------------------------------------------------------------ windows

def test_windows_are_the_workbook_pairs_for_a_30_day_slo():
    assert [(r.long_s, r.short_s, r.factor) for r in scaled_windows(30 * 86400)] == [
        (3600, 300, 14.4), (21600, 1800, 6.0), (86400, 7200, 3.0), (259200, 21600, 1.0)]


def test_windows_scale_to_a_10_minute_run_with_a_one_second_floor():
    # 600 s / 30 d = 1/4320: 1h -> 0.83 s, 5m -> 0.07 s (both floored to 1 s), 6h -> 5 s, 3d -> 60 s ...
    assert [(r.long_s, r.short_s, r.factor) for r in scaled_windows(600)] == [
        (1, 1, 14.4), (5, 1, 6.0), (20, 2, 3.0), (60, 5, 1.0)]


def test_windows_that_floor_to_the_same_pair_keep_only_the_fastest_rule():
    # a 60 s phase: 1h/5m and 6h/30m both floor to 1 s / 1 s; the 6x duplicate is dropped
    assert [(r.long_s, r.short_s, r.factor) for r in scaled_windows(60)] == [
        (1, 1, 14.4), (2, 1, 3.0), (6, 1, 1.0)]
    assert [(r.long_s, r.short_s, r.factor) for r in scaled_windows(5)] == [(1, 1, 14.4)]


def test_windows_scale_to_a_24_hour_soak():
    assert [(r.long_s, r.short_s) for r in scaled_windows(86400)] == [
        (120, 10), (720, 60), (2880, 240), (8640, 720)]


# ------------------------------------------------------------ burn-rate rules

RULE = BurnRule(10, 2, 6.0)


def burns(bad_fracs):
    valid = [100.0] * len(bad_fracs)
    return valid, [100.0 * f for f in bad_fracs]


def test_rule_fires_when_both_windows_burn():
    f = first_firing(*burns([0.1] * 10), RULE, 0.01)  # 10% bad = 10x burn everywhere
    assert f is not None and f[1] == pytest.approx(10.0) and f[2] == pytest.approx(10.0)


def test_rule_does_not_fire_when_only_the_long_window_burns():
    # the long window still burns at 8x, but the last 2 s are clean: the incident is over
    assert first_firing(*burns([0.1] * 8 + [0.0, 0.0]), RULE, 0.01) is None
    (i, lb, sb), = burn_rates(*burns([0.1] * 8 + [0.0, 0.0]), RULE, 0.01)
    assert lb == pytest.approx(8.0) and sb == 0.0


def test_rule_does_not_fire_when_only_the_short_window_burns():
    # a blip: 20% bad in the last second -> short window 10x, long window only 2x
    assert first_firing(*burns([0.0] * 9 + [0.2]), RULE, 0.01) is None


def test_rule_needs_a_full_long_window():
    assert burn_rates(*burns([0.5] * 9), RULE, 0.01) == []


# ------------------------------------------------------------ per-second accounting

def test_good_fraction_from_three_quantiles():
    assert good_fraction(500, 20, 80, 120) == 1.0
    assert 0.99 <= good_fraction(500, 20, 300, 900) < 1.0  # p99 within: at least 99% good
    assert good_fraction(500, 20, 300, 900) == pytest.approx(0.99 + 0.01 * 200 / 600)
    assert 0.5 <= good_fraction(500, 100, 1000, 2000) < 0.99
    assert good_fraction(500, 1000, 2000, 3000) == pytest.approx(0.25)
    assert good_fraction(500, None, None, None) is None


def test_unresolved_messages_are_bad_and_charged_to_the_last_scheduled_seconds():
    secs = [Second(float(i), 100, 100, 0, 10, 20, 30) for i in range(5)] + \
           [Second(5.0 + i, 100, 0, 0, None, None, None) for i in range(3)]
    outs = outcomes(secs, 500)
    assert [o.valid for o in outs] == [100] * 8  # valid == scheduled over the run
    assert [o.bad for o in outs] == [0] * 5 + [100] * 3


def test_acks_that_resolve_in_a_later_second_raise_no_false_alarm(tmp_path):
    b = RunBuilder(tmp_path).phase("steady", 0, 600)
    for s in range(600):
        b.load(s, 200, 150 if s % 2 == 0 else 250)  # acks lag behind the schedule, then catch up
    v = error_budget(run(b))
    assert v.verdict == PASS and v.figures["budget_consumed_pct"] == 0.0


def test_load_seconds_are_placed_on_the_timeline_clock(tmp_path):
    b = RunBuilder(tmp_path)
    for s in range(3):
        b.load(s, 10, 10, t0=42.0)
    assert [s.start for s in load_seconds(run(b).events)] == [42.0, 43.0, 44.0]


# ------------------------------------------------------------ the error_budget check

def test_error_budget_passes_on_clean_data(tmp_path):
    b = steady(RunBuilder(tmp_path).phase("steady", 0, 600), range(600))
    v = error_budget(run(b))
    assert v.verdict == PASS
    assert v.figures["budget_consumed_pct"] == 0.0 and v.figures["worst_burn_rate"] == 0.0
    assert v.figures["good"] == v.figures["valid"] == 120000


def test_error_budget_fails_when_the_budget_is_spent(tmp_path):
    # 2% of every second's messages fail: twice the 1% budget, but never a fast burn
    b = steady(RunBuilder(tmp_path).phase("steady", 0, 600), range(600),
               bad={s: (196, 4, 20, 80, 120) for s in range(600)})
    v = error_budget(run(b))
    assert v.verdict == FAIL
    assert v.figures["budget_consumed_pct"] == pytest.approx(200.0)
    assert v.figures["valid"] == 120000 and v.figures["good"] == 117600
    assert "200.0% of the budget spent (2,400 bad of 120,000, budget 1,200)" in v.message


def test_error_budget_counts_slow_acks_as_bad(tmp_path):
    # every ack takes ~2 s: nothing within 500 ms
    b = steady(RunBuilder(tmp_path).phase("steady", 0, 100), range(100), p50=2000.0, p99=2500.0, max_ms=3000.0)
    v = error_budget(run(b), latency_ms=500)
    assert v.verdict == FAIL and v.figures["good"] == pytest.approx(100 * 200 * 0.125)


def test_error_budget_fast_burn_fires_within_budget_on_a_10_minute_run(tmp_path):
    # one second with 20% failures: 3% of the budget, but a 14.4x burn on the scaled 1 s / 1 s pair
    b = steady(RunBuilder(tmp_path).phase("steady", 0, 600), range(600), bad={300: (160, 40, 20, 80, 120)})
    v = error_budget(run(b))
    assert v.verdict == FAIL
    assert v.figures["budget_consumed_pct"] == pytest.approx(40 / 1200 * 100, abs=0.01)
    assert v.figures["worst_burn_rate"] == pytest.approx(20.0)
    assert "burn-rate rule 1s/1s at 14.4x fired at t=301s" in v.message


def test_error_budget_tolerates_a_blip_below_every_rule(tmp_path):
    b = steady(RunBuilder(tmp_path).phase("steady", 0, 600), range(600), bad={300: (180, 20, 20, 80, 120)})
    v = error_budget(run(b))
    assert v.verdict == PASS and v.figures["worst_burn_rate"] == pytest.approx(10.0)


def test_a_planned_burst_does_not_spend_the_recovery_budget(tmp_path):
    b = RunBuilder(tmp_path).phases(60, 60, 480)
    # the burst: half the acks slow (p50 at the threshold), recovery clean
    steady(b, range(0, 60))
    steady(b, range(60, 120), rate=2000, p50=500.0, p99=3000.0, max_ms=4000.0)
    steady(b, range(120, 600))
    assert error_budget(run(b), phase="recovery").verdict == PASS
    burst = error_budget(run(b), phase="burst")
    assert burst.verdict == FAIL and burst.figures["budget_consumed_pct"] == pytest.approx(5000.0)
    every = error_budget(run(b))
    assert every.verdict == FAIL and every.figures["budget_consumed_pct.recovery"] == 0.0
    assert every.message.startswith("SLO 99% within 500ms broken in burst:")


def test_error_budget_leaves_the_warmup_out_unless_asked(tmp_path):
    b = RunBuilder(tmp_path).phases(60, 60, 60)
    steady(b, range(0, 60), bad={s: (150, 50, 20, 80, 120) for s in range(5)})  # a cold start
    steady(b, range(60, 180))
    v = error_budget(run(b))
    assert v.verdict == PASS and "budget_consumed_pct.warmup" not in v.figures and v.figures["phases_judged"] == 2
    assert error_budget(run(b), phase="warmup").verdict == FAIL


def test_error_budget_charges_a_hang_at_the_end(tmp_path):
    b = steady(RunBuilder(tmp_path).phase("steady", 0, 600), range(590))
    for s in range(590, 600):
        b.load(s, 200, 0, p50=None, p99=None, max_ms=None)  # scheduled, never acked
    v = error_budget(run(b))
    assert v.verdict == FAIL and v.figures["valid"] == 120000 and v.figures["good"] == 118000


def test_error_budget_is_unknown_without_data(tmp_path):
    assert error_budget(run(RunBuilder(tmp_path / "a"))).verdict == UNKNOWN
    b = steady(RunBuilder(tmp_path / "b").phases(10, 10, 10), range(30))
    assert error_budget(run(b), phase="steady").verdict == UNKNOWN
    assert error_budget(run(b), objective=1).verdict == UNKNOWN


def test_error_budget_without_phases_judges_the_whole_load(tmp_path):
    v = error_budget(run(steady(RunBuilder(tmp_path), range(60))))
    assert v.verdict == PASS and "budget_consumed_pct.run" in v.figures


def test_error_budget_is_registered_and_validated():
    assert CHECKS["error_budget"] is error_budget
    validate_check("error_budget", {"objective": 0.999, "latency_ms": 250})


def test_outcome_bad_is_never_negative():
    assert Outcome(0.0, 10.0, 12.0).bad == 0.0


def test_error_budget_counts_good_acks_from_the_latency_histograms(tmp_path):
    # every second: 95 acks at 10 ms, 5 at 900 ms. The quantiles (p50 10, p99 900) only bracket the 500 ms
    # threshold (an estimate of ~23% bad); the per-second HdrHistograms count exactly 5% bad.
    from monsoon.rundir import LATENCY_FILE
    from monsoon.timeline.hdrlog import IntervalLogWriter, new_histogram
    b = RunBuilder(tmp_path).phase("steady", 0, 100)
    for s in range(100):
        b.load(s, 100, 100, 0, 10.0, 900.0, 900.0)
    d = b.write()
    w = IntervalLogWriter(d / LATENCY_FILE, start_wall_s=1e9)
    for s in range(100):
        h = new_histogram()
        h.record_value(10_000, 95)
        h.record_value(900_000, 5)
        w.write(s, h)
    w.close()
    v = error_budget(RunData(d), objective=0.9, latency_ms=500)
    assert v.verdict == PASS, v.message
    assert v.figures["budget_consumed_pct"] == pytest.approx(50.0) and v.figures["good_counted_from_histograms"] == 1
    (d / LATENCY_FILE).unlink()        # without the histograms: the quantile estimate, which overshoots
    v = error_budget(RunData(d), objective=0.9, latency_ms=500)
    assert v.verdict == FAIL and v.figures["budget_consumed_pct"] > 200


def test_burn_rate_outside_faults_leaves_the_injected_windows_out_of_the_rules_not_out_of_the_budget(tmp_path):
    """A soak's pod kill burns at 100 % for 5 s: the fast-burn rule scaled to a 2 h run pages on it whatever the
    platform does. With ``burn_rate: outside-faults`` the rules skip the window and 60 s after its heal, the
    budget still pays for it; a burn outside any fault window still fires."""
    b = RunBuilder(tmp_path).phase("steady", 0, 7200)
    b.ev("fault-plan", 0.0, run_id="r", horizon=7200, faults=[])
    for phase, t in (("inject", 1000.0), ("heal", 1005.0)):
        b.ev("fault", t, name="kill", kind="pod-kill", backend="process", target="platform", window=0, phase=phase,
             intended=t, effective=t, landed=True, evidence={})
    bad = {s: (0, 200, None, None, None) for s in range(1000, 1005)}            # the kill: every send fails
    bad.update({s: (200, 0, 1500.0, 4000.0, 5000.0) for s in range(1005, 1030)})   # reconnecting: slow acks
    steady(b, range(7200), bad=bad)
    every = error_budget(run(b), objective=0.97, latency_ms=2000)
    assert every.verdict == FAIL and "burn-rate rule" in every.message
    outside = error_budget(run(b), objective=0.97, latency_ms=2000, burn_rate="outside-faults")
    assert outside.verdict == PASS, outside.message
    assert outside.figures["budget_consumed_pct"] == every.figures["budget_consumed_pct"] > 0   # still paid
    assert outside.figures["burn_rate_windows_left_out"] == 1 and "outside 1 fault window(s) + 60s" in outside.message
    b2 = RunBuilder(tmp_path / "b2").phase("steady", 0, 7200)                    # the same burn, 200 s after the heal
    b2.events = b.events[:1] + [e for e in b.events[1:] if e["type"] != "load"]
    steady(b2, range(7200), bad={s + 200: v for s, v in bad.items()})
    late = error_budget(run(b2), objective=0.97, latency_ms=2000, burn_rate="outside-faults")
    assert late.verdict == FAIL and "burn-rate rule" in late.message
    assert error_budget(run(b), burn_rate="outside").verdict == UNKNOWN
    with pytest.raises(ValueError, match="burn_rate must be one of all, outside-faults"):
        validate_check("error_budget", {"burn_rate": "outside_faults"})
    validate_check("error_budget", {"burn_rate": "outside-faults"})
