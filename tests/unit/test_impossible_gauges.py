"""A gauge that cannot be true makes its check unknown, naming it (issue 39): a negative queue depth or lag, a
counter that goes backwards with no restart to explain it. Hand-made timelines; also ``lag_at_end`` (the run's
end, not the burst's) and the side-by-side table's fixed x1."""
from __future__ import annotations

import pytest

from monsoon.checks import impossible
from monsoon.checks.base import FAIL, PASS, UNKNOWN, RunData
from monsoon.checks.gc import gc_time_below
from monsoon.checks.lag import lag_bounded, lag_recovers_within
from monsoon.checks.load import load_valid
from monsoon.checks.memory import gc_time_fraction
from monsoon.report import sidebyside
from tests.unit.helpers import RunBuilder


def run(b: RunBuilder) -> RunData:
    return RunData(b.write())


def user_backlog(bad: bool = True) -> list[tuple[float, float]]:
    """The user's run: a backlog gauge at 0 before the burst, then -166 falling to -1,121 (a put-minus-done
    formula that does not measure the queue). ``bad=False``: the same shape, mirrored above zero."""
    pts = [(float(t), 0.0) for t in range(0, 12)]
    pts += [(float(t), -166.0 - (t - 12) * 955.0 / 118) for t in range(12, 131)]   # -166 at t=12 .. -1,121 at t=130
    return pts if bad else [(t, abs(v) if t < 70 else 0.0) for t, v in pts]


def queue_run(tmp_path, pts, base_rate=100.0) -> RunData:
    return run(RunBuilder(tmp_path, base_rate=base_rate).phases(10, 60, 60)
               .lag(pts, collector="metrics", field="queue_depth"))


# ------------------------------------------------------ a negative backlog

def test_the_users_negative_backlog_is_unknown_not_a_recovery_naming_the_metric_time_and_value(tmp_path):
    v = lag_recovers_within(queue_run(tmp_path, user_backlog()), seconds=60)
    assert v.verdict == UNKNOWN                            # was: PASS, "queue depth peaked at 0", lag_at_end=-1121
    assert v.message.startswith("queue depth (observe.metrics.queue_depth) cannot be true: -166 at t=12s")
    assert "a queue depth is never negative" in v.message and "119 of 131 samples impossible, lowest -1,121" in v.message
    assert "not a zero" in v.message
    assert v.figures["first_impossible_t"] == 12.0 and v.figures["first_impossible_value"] == -166.0
    assert v.figures["impossible_samples"] == 119 and "peak_lag" not in v.figures
    # the same run with a gauge that can be true is judged as before
    ok = lag_recovers_within(queue_run(tmp_path / "ok", user_backlog(bad=False)), seconds=60)
    assert ok.verdict == PASS and "first_impossible_t" not in ok.figures


def test_one_negative_sample_is_enough_and_lag_bounded_says_unknown_too(tmp_path):
    pts = [(float(t), 50.0) for t in range(0, 130)]
    pts[90] = (90.0, -3.0)
    r = queue_run(tmp_path, pts)
    for v in (lag_bounded(r, max=1000), lag_recovers_within(r, seconds=60)):
        assert v.verdict == UNKNOWN, v
        assert "-3 at t=90s" in v.message and "1 of 130 samples" in v.message
        assert v.figures["first_impossible_value"] == -3.0
    # fail does not beat a gauge that cannot be true: its positive readings are the same wrong series
    over = [(t, 5000.0 if 20 <= t < 40 else v) for t, v in pts]
    assert lag_bounded(queue_run(tmp_path / "over", over), max=1000).verdict == UNKNOWN
    assert lag_bounded(queue_run(tmp_path / "over-ok", [(t, max(v, 0.0)) for t, v in over]), max=1000).verdict == FAIL


def test_a_negative_kafka_lag_is_unknown(tmp_path):
    b = RunBuilder(tmp_path, base_rate=100).phases(10, 60, 60)
    b.lag([(float(t), 0.0) for t in range(0, 10)] + [(float(t), -40.0) for t in range(10, 130)])
    v = lag_recovers_within(run(b), seconds=60)
    assert v.verdict == UNKNOWN and v.message.startswith("kafka consumer lag (observe.kafka) cannot be true: -40 at t=10s")


def test_a_committed_offset_past_the_log_end_is_a_negative_lag_the_total_hides(tmp_path):
    # the lag poll writes max(end - committed, 0) per partition: the total says 0, the partition says -25
    b = RunBuilder(tmp_path, base_rate=100).phases(10, 60, 60)
    for t in range(0, 130):
        end = 1000 + 10 * t
        b.kafka(float(t), {"tb-0": (end, end - 5 if t < 80 else end + 25), "tb-1": (end, end)})
    v = lag_recovers_within(run(b), seconds=60)
    assert v.verdict == UNKNOWN
    assert v.message.startswith("kafka consumer lag of tb-0 (observe.kafka) cannot be true: -25 at t=80s")
    assert "committed offset is past its log end" in v.message
    assert lag_bounded(run(b), max=10_000).verdict == UNKNOWN


# ------------------------------------------------------ a counter that goes backwards

def gc_run(tmp_path, points, events=()) -> RunData:
    b = RunBuilder(tmp_path).phase("steady", 0.0, 100.0)
    for t, v in points:
        b.metrics(t, gc_seconds=v)
    for t, f in events:
        b.ev("service", t, service="platform", **f)
    return RunData(b.write())


def sawtooth() -> list[tuple[float, float]]:
    """A gauge read as a counter (``jvm_gc_pause_seconds_max`` instead of ``_sum``): up and down, no restart."""
    return [(float(t), 0.05 * (t % 7)) for t in range(0, 101)]


def test_a_gc_counter_that_goes_backwards_without_a_restart_is_unknown(tmp_path):
    r = gc_run(tmp_path, sawtooth())
    for check in (gc_time_below, gc_time_fraction):
        v = check(r)
        assert v.verdict == UNKNOWN, v
        assert v.message.startswith("gc_seconds (observe.metrics.gc_seconds) cannot be true: 0 at t=7s")
        assert "it fell from 0.3 at t=6s with no restart in between" in v.message
        assert v.figures["first_impossible_t"] == 7.0 and v.figures["impossible_samples"] == 14


def test_a_counter_reset_by_a_restart_is_a_reset_not_an_error(tmp_path):
    pts = [(float(t), 0.3 * (t if t < 50 else t - 50)) for t in range(0, 101)]
    assert gc_time_fraction(gc_run(tmp_path / "bare", pts)).verdict == UNKNOWN     # nothing restarted it
    restarted = gc_run(tmp_path / "exit", pts, [(49.5, {"event": "exit", "code": 137}),
                                                (49.8, {"event": "restart", "n": 2})])
    v = gc_time_fraction(restarted)
    assert v.verdict == FAIL and v.figures["gc_fraction.steady"] == pytest.approx(0.3, abs=0.005)
    assert gc_time_below(restarted, fraction=0.5).verdict == PASS
    # a gap in the samples long enough to hide a restart (the endpoint down while the JVM came back)
    gap = [(t, v) for t, v in pts if not 46 <= t <= 49]
    assert gc_time_fraction(gc_run(tmp_path / "gap", gap)).verdict == FAIL


def test_a_counter_below_zero_is_impossible_and_the_helpers_say_none_on_good_series():
    assert impossible.backwards([(0.0, 1.0), (1.0, -0.5)], "x").rule == "a counter is never negative"
    assert impossible.backwards([(0.0, 1.0), (1.0, 1.0), (2.0, 3.0)], "x") is None
    assert impossible.backwards([(0.0, 1.0), (1.0, 1.0 - 1e-12)], "x") is None       # float noise of a sum
    assert impossible.negative([(0.0, 0.0), (1.0, 4.0)], "x") is None


def test_a_stored_count_that_fell_is_no_evidence_of_a_drain(tmp_path):
    # a backlog last seen 12 s before a silent death; the stored count (the only counter) fell in between:
    # it cannot say the backlog was consumed, so the verdict rests on what else there is (nothing: unknown)
    b = RunBuilder(tmp_path, base_rate=100).phases(10, 60, 60).service_start()
    b.lag([(60.0, 9000.0), (65.0, 4000.0), (77.0, 3000.0), (95.0, 0.0), (100.0, 0.0)],
          collector="metrics", field="queue_depth")
    b.ev("service", 89.0, service="platform", event="exit", code=137, oom=False, cause="SIGKILL")
    for t, n in ((70.0, 50_000), (77.0, 60_000), (80.0, 10_000), (90.0, 70_000)):
        b.ev("sample", t, collector="storage", stored=n, counted="exact")
    v = lag_recovers_within(run(b), seconds=300)
    assert v.verdict == UNKNOWN and "backlog_unseen" in v.figures and "consumed_in_gap" not in v.figures


# ------------------------------------------------------ lag_at_end is the run's end

def test_lag_at_end_is_the_last_sample_and_lag_at_burst_end_the_burst_ends(tmp_path):
    pts = [(float(t), 0.0) for t in range(0, 10)] + [(float(t), (t - 10) * 500.0) for t in range(10, 71)] + \
          [(float(t), max(7.0, 30000.0 - (t - 70) * 1000)) for t in range(71, 131)]
    v = lag_recovers_within(queue_run(tmp_path, pts), seconds=60)
    assert v.verdict == PASS
    assert v.figures["lag_at_burst_end"] == 30000.0 and v.figures["lag_at_end"] == 7.0


def test_without_a_burst_the_anchor_is_the_load_end(tmp_path):
    b = RunBuilder(tmp_path, base_rate=100).phase("steady", 0, 60)
    b.lag([(float(t), 300.0 if t < 62 else 3.0) for t in range(0, 90)], collector="metrics", field="queue_depth")
    b.ev("op", 60.0, op="load-end")
    v = lag_recovers_within(run(b), seconds=60)
    assert v.figures["lag_at_load_end"] == 300.0 and v.figures["lag_at_end"] == 3.0
    assert "lag_at_burst_end" not in v.figures


# ------------------------------------------------------ the side-by-side table's fixed x1

def load_run(tmp_path, **meta) -> RunData:
    b = RunBuilder(tmp_path, base_rate=400.0)
    b.events[0].update(meta)
    b.phase("steady", 0, 3)
    for s in range(3):
        b.load(s, scheduled=400, acked=400)
    b.ev("op", 3.5, op="load-end", scheduled=1200, sent=1200, late=0, dropped=0)
    return run(b)


def test_load_valid_carries_the_x1_fixed_or_resolved(tmp_path):
    assert load_valid(load_run(tmp_path / "fixed")).figures["base_rate_msg_s"] == 400.0
    auto = load_run(tmp_path / "auto", base_rate="auto", base_rate_auto={"base_rate": 250.0, "capacity_msg_s": 1000})
    assert load_valid(auto).figures["base_rate_msg_s"] == 250.0


def compared(stack, x1_check=None, resolved=None):
    r = {"stack": stack, "experiment": "storage-compare", "verdict": "pass", "figures": {},
         "checks": [{"name": "load_valid", "verdict": "pass",
                     "figures": {} if x1_check is None else {"base_rate_msg_s": x1_check}}]}
    if resolved is not None:
        r["base_rate"] = resolved
        r["figures"].update(base_rate_msg_s=resolved["base_rate"], calibrated_capacity_msg_s=resolved["capacity_msg_s"])
    return r


def test_the_side_by_side_table_shows_a_fixed_x1_as_fixed():
    fixed = compared("kafka", x1_check=400.0)                                     # fixed, no calibration
    calibrated = compared("kafka-cassandra", x1_check=400.0,
                          resolved={"base_rate": 400.0, "capacity_msg_s": 1600.0, "fixed": True})
    auto = compared("inmemory", x1_check=250.0, resolved={"base_rate": 250.0, "capacity_msg_s": 1000.0})
    old = compared("mongo")                                                       # a result from before: no x1
    _, rows = sidebyside.tables([fixed, calibrated, auto, old])["storage-compare"]
    x1 = {r["stack"]: sidebyside.cells(r, [])[3] for r in rows}
    assert x1 == {"kafka": "400 msg/s (fixed)", "kafka-cassandra": "400 msg/s (fixed)", "inmemory": "250",
                  "mongo": "-"}
    assert "| kafka | PASS | - | 400 msg/s (fixed) |" in sidebyside.markdown([fixed, old])


def test_serves_throughout_names_a_gc_counter_that_fell_and_does_not_read_it(tmp_path):
    from monsoon.checks.serve import serves_throughout
    b = RunBuilder(tmp_path, base_rate=400).service_start()
    for sec in range(80):
        b.load(sec, 400, 0 if 20 <= sec < 60 else 400)
    for t, v in sawtooth()[10:70]:
        b.metrics(t, gc_seconds=v)
    v = serves_throughout(run(b), max_silent_s=10)
    assert v.verdict == FAIL                       # judged on the acks, as ever: the GC share is evidence only
    assert "gc_time_pct" not in v.figures
    assert "gc_seconds (observe.metrics.gc_seconds) not read: 0 at t=14s (a counter only rises" in v.message


def test_a_stack_that_states_what_its_queue_depth_leaves_out_is_judged_below_zero_down_to_that(tmp_path):
    """ThingsBoard's put-minus-done depth reads -3 per device from the first connect (its connect and activity
    events reach the rule engine through no counter of the formula): a stack stating queue_depth_uncounted: 5
    is judged on it down to -5 x the run's devices, and below that the metric is wrong again."""
    pts = [(float(t), -301.0 if t < 10 else (8000.0 if t < 70 else -250.0)) for t in range(0, 130)]

    def stated(d, pts, per_device=5, devices=100):
        b = RunBuilder(d).phases(10, 60, 60).lag(pts, collector="metrics", field="queue_depth")
        b.events[0].update(queue_depth_uncounted=per_device, devices=devices)
        return run(b)
    v = lag_recovers_within(stated(tmp_path / "tb", pts), seconds=60)
    assert v.verdict == PASS and v.figures["peak_lag"] == 8000.0, v.message
    assert lag_bounded(stated(tmp_path / "tb2", pts), max=10000).verdict == PASS
    # 20 devices allow only -100: -301 is wrong again, and so is the same run of a stack that states nothing
    few = lag_recovers_within(stated(tmp_path / "few", pts, devices=20), seconds=60)
    assert few.verdict == UNKNOWN and "-301 at t=0s" in few.message
    assert lag_recovers_within(queue_run(tmp_path / "none", pts), seconds=60).verdict == UNKNOWN
    # a Kafka lag is never excused by it
    b = RunBuilder(tmp_path / "kafka").phases(10, 60, 60).lag([(float(t), -5.0) for t in range(130)])
    b.events[0].update(queue_depth_uncounted=5, devices=100)
    assert lag_recovers_within(run(b), seconds=60).verdict == UNKNOWN


def test_queue_depth_uncounted_needs_a_queue_depth():
    from monsoon.spec.stack import ObserveSpec
    with pytest.raises(ValueError, match="queue_depth_uncounted needs metrics.queue_depth"):
        ObserveSpec(queue_depth_uncounted=5)
    assert ObserveSpec(metrics_url="http://x", metrics={"queue_depth": "a - b"}, queue_depth_uncounted=5)
