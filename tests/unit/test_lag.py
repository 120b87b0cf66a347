"""Burrow's consumer-lag rules, lag in seconds, drain time and the lag checks, on hand-made timelines."""
import pytest

from monsoon.checks.registry import CHECKS, validate_check
from monsoon.checks.base import FAIL, PASS, UNKNOWN, RunData
from monsoon.checks.burrow import ERR, OK, REWIND, STALL, STOP, WARN, Entry, evaluate_window, group_status, partition_statuses, PartitionStatus
from monsoon.checks.lag import consumer_not_stalled, drain_time, lag_bounded, lag_seconds, lag_seconds_series, predicted_drain_s
from tests.unit.helpers import RunBuilder

P = "tb_rule_engine-0"


def run(b: RunBuilder) -> RunData:
    return RunData(b.write())


def entries(rows):
    """rows of (t, committed, end) -> Entry list (lag = end - committed)."""
    return [Entry(t, c, e, max(e - c, 0) if c is not None else e) for t, c, e in rows]


# ------------------------------------------------------------ Burrow's rules, one partition

def test_ok_when_the_consumer_keeps_up_with_noisy_lag():
    rows = [(t, 100 * t - (5 + t % 3), 100 * t) for t in range(1, 12)]  # lag 5..7, up and down
    st, why = evaluate_window(entries(rows), window=10)
    assert st == OK and why == "consuming"


def test_ok_when_current_lag_is_zero_whatever_happened_before():
    rows = [(t, 500, 500 + 10 * t) for t in range(10)] + [(10, 700, 700)]
    assert evaluate_window(entries(rows), window=10)[0] == OK


def test_rule_1_zero_lag_anywhere_in_the_window_is_ok_even_if_stuck_now():
    rows = [(0, 500, 500)] + [(t, 500, 500 + t) for t in range(1, 10)]  # lag 0, then stuck with small lag
    st, why = evaluate_window(entries(rows), window=10)
    assert st == OK and "zero" in why


def test_warn_when_offsets_move_but_lag_never_decreases():
    rows = [(t, 100 * t, 100 * t + 50 * t) for t in range(1, 11)]  # consumer 100/s, producer 150/s
    st, why = evaluate_window(entries(rows), window=10)
    assert st == WARN
    assert "50 -> 500" in why


def test_stall_when_the_committed_offset_does_not_move_while_lag_grows():
    rows = [(t, 1000, 1000 + 100 * t) for t in range(1, 11)]
    st, why = evaluate_window(entries(rows), window=10)
    assert st == STALL
    assert "stuck at 1,000" in why and "100 -> 1,000" in why


def test_stop_when_no_commit_for_longer_than_the_window_spanned():
    rows = [(t, 100 * t, 100 * t + 20 + 5 * (t % 2)) for t in range(10)]  # commits over 9 s
    assert evaluate_window(entries(rows), now=9.0, window=10)[0] == OK
    assert evaluate_window(entries(rows), now=18.0, window=10)[0] == OK  # 9 s silent = span: not yet
    st, why = evaluate_window(entries(rows), now=19.5, window=10)
    assert st == STOP and "no committed offset for 10s" in why


def test_stop_is_suppressed_when_the_consumer_was_caught_up_a_moment_ago():
    # Burrow's checkIfRecentLagZero: a recent log-end <= last committed -> not stopped yet
    rows = [(t, 900, 900) for t in range(10)]
    es = entries(rows) + [Entry(30.0, None, 905, 5)]
    assert evaluate_window(es, now=30.0, window=10)[0] != STOP


def test_rewind_when_the_committed_offset_goes_back():
    rows = [(t, 100 * t, 100 * t + 30) for t in range(1, 6)] + [(t, 50 + t, 1000 + t) for t in range(6, 11)]
    st, why = evaluate_window(entries(rows), window=10)
    assert st == REWIND and "went back from 500 to 56" in why


def test_rewind_is_reported_even_after_zero_lag_unless_recovered():
    # PR #716: zero lag earlier in the window does not hide a rewind...
    rows = [(1, 500, 500), (2, 600, 610), (3, 10, 620)] + [(t, 10 + t, 700) for t in range(4, 11)]
    assert evaluate_window(entries(rows), window=10)[0] == REWIND
    # ...but a consumer that has gone past its pre-rewind offset again has recovered
    rows = [(1, 500, 520), (2, 600, 610), (3, 10, 620)] + [(t, 100 * t, 100 * t + 10) for t in range(7, 14)]
    assert evaluate_window(entries(rows), window=10)[0] == OK


def test_an_incomplete_window_is_not_judged():
    rows = [(t, 1000, 1000 + 100 * t) for t in range(1, 6)]
    st, why = evaluate_window(entries(rows), window=10)
    assert st == OK and why.startswith("incomplete")


def test_group_status_is_the_worst_partition_and_errors_collapse_to_err():
    mk = lambda s: PartitionStatus("p", 0.0, s, "")  # noqa: E731
    assert group_status([mk(OK), mk(WARN)]) == WARN
    assert group_status([mk(OK), mk(STALL), mk(WARN)]) == ERR
    assert group_status([]) == OK


# ------------------------------------------------------------ the consumer_not_stalled check

def healthy(b, t0=0, t1=30, parts=(P, "tb_rule_engine-1")):
    for t in range(t0, t1):
        b.kafka(float(t), {p: (200 * t + 40, 200 * t + 40 - (8 + (t * 7 + i) % 5)) for i, p in enumerate(parts)})
    return b


def test_consumer_not_stalled_passes_on_a_healthy_consumer(tmp_path):
    v = consumer_not_stalled(run(healthy(RunBuilder(tmp_path))))
    assert v.verdict == PASS
    assert v.figures["stalled_partitions"] == 0 and v.figures["worst_status"] == OK


def test_consumer_not_stalled_passes_with_warn_on_a_consumer_falling_behind(tmp_path):
    b = RunBuilder(tmp_path)
    for t in range(30):
        b.kafka(float(t), {P: (300 * t, 200 * t)})
    v = consumer_not_stalled(run(b))
    assert v.verdict == PASS and v.figures["worst_status"] == WARN and v.figures["warn_polls"] > 0


def test_consumer_not_stalled_fails_on_a_stall_and_names_partition_and_time(tmp_path):
    b = RunBuilder(tmp_path).phases(10, 60, 60)
    healthy(b, 0, 20)
    for t in range(20, 40):  # partition 1 keeps going, partition 0 stops moving
        b.kafka(float(t), {P: (200 * t + 40, 200 * 20 + 30), "tb_rule_engine-1": (200 * t + 40, 200 * t + 30)})
    v = consumer_not_stalled(run(b))
    assert v.verdict == FAIL
    assert v.figures["stalled_partitions"] == 1 and v.figures["worst_status"] == STALL
    assert f"{P} STALL at t=29s (19s into the burst)" in v.message
    assert "stuck at 4,030" in v.message


def test_consumer_not_stalled_fails_on_stop_when_committed_offsets_vanish(tmp_path):
    b = healthy(RunBuilder(tmp_path), 0, 12, parts=(P,))
    for t in range(12, 40):
        b.kafka(float(t), {P: (200 * t, -1)})  # the group's offsets are gone
    v = consumer_not_stalled(run(b))
    assert v.verdict == FAIL and v.figures["worst_status"] == STOP
    assert "STOP" in v.message and P in v.message


def test_consumer_not_stalled_fails_when_the_consumer_never_commits(tmp_path):
    b = RunBuilder(tmp_path)
    for t in range(15):
        b.kafka(float(t), {P: (100 * (t + 1), -1)})
    v = consumer_not_stalled(run(b))
    assert v.verdict == FAIL and "no committed offset" in v.message


def test_consumer_not_stalled_fails_on_rewind(tmp_path):
    b = healthy(RunBuilder(tmp_path), 0, 15, parts=(P,))
    for t in range(15, 30):
        b.kafka(float(t), {P: (200 * t + 40, 100 + 150 * (t - 15))})  # reset to an old offset
    v = consumer_not_stalled(run(b))
    assert v.verdict == FAIL and v.figures["worst_status"] == REWIND and "REWIND" in v.message


def test_consumer_not_stalled_ignores_broker_error_samples(tmp_path):
    b = healthy(RunBuilder(tmp_path), 0, 15)
    for t in range(15, 20):
        b.kafka_error(float(t))
    healthy(b, 20, 30)
    assert consumer_not_stalled(run(b)).verdict == PASS


def test_consumer_not_stalled_is_unknown_without_samples_or_full_windows(tmp_path):
    assert consumer_not_stalled(run(RunBuilder(tmp_path / "a"))).verdict == UNKNOWN
    v = consumer_not_stalled(run(healthy(RunBuilder(tmp_path / "b"), 0, 5)))
    assert v.verdict == UNKNOWN and "full window" in v.message


def test_consumer_not_stalled_is_unknown_on_a_few_caught_up_polls(tmp_path):
    # three polls at lag 0 are not a judged window: "caught up" must not turn too little data into a pass
    b = RunBuilder(tmp_path)
    for t in range(3):
        b.kafka(float(t), {P: (100 * t, 100 * t)})
    v = consumer_not_stalled(run(b))
    assert v.verdict == UNKNOWN and "full window" in v.message


def test_partition_statuses_evaluate_at_every_poll(tmp_path):
    b = RunBuilder(tmp_path)
    for t in range(12):
        b.kafka(float(t), {P: (100 * t + 100, 50)})
    sts = partition_statuses(RunData(b.write()).events, window=10)[P]
    assert [s.status for s in sts[:9]] == [OK] * 9 and sts[9].status == STALL


# ------------------------------------------------------------ lag in seconds

def test_lag_seconds_interpolates_the_log_end_table():
    table = [(0.0, 0), (10.0, 1000), (20.0, 2000)]
    assert lag_seconds(table, 1500, now=20.0) == pytest.approx(5.0)
    assert lag_seconds(table, 250, now=20.0) == pytest.approx(17.5)
    assert lag_seconds(table, 2000, now=20.0) == 0.0  # caught up


def test_lag_seconds_uses_the_first_time_the_log_end_passed_the_offset():
    table = [(0.0, 100), (10.0, 100), (20.0, 200)]  # no production between 0 and 10 s
    assert lag_seconds(table, 150, now=20.0) == pytest.approx(5.0)
    assert lag_seconds(table, 100, now=20.0) == pytest.approx(10.0)


def test_lag_seconds_extrapolates_before_the_table():
    table = [(10.0, 1000), (20.0, 2000)]  # 100 msg/s, so offset 0 was written at t=0
    assert lag_seconds(table, 0, now=20.0) == pytest.approx(20.0)
    assert lag_seconds([], 0, now=5.0) is None


def test_lag_seconds_series_from_the_timeline(tmp_path):
    b = RunBuilder(tmp_path)
    for t in range(11):
        b.kafka(float(t), {P: (100 * t, max(0, 100 * (t - 3)))})  # consumer 3 s behind
    s = lag_seconds_series(RunData(b.write()).events)
    assert s[-1] == (10.0, pytest.approx(3.0))


# ------------------------------------------------------------ drain time and lag_bounded

def burst_and_drain(b, tail=60):
    """Producer 100/s, 1000/s during t=10..20; consumer capacity 300/s; drains at t=55."""
    end = com = 0
    for t in range(0, 20 + tail):
        if t:
            end += 1000 if 10 < t <= 20 else 100
            com = min(end, com + 300)
        b.kafka(float(t), {P: (end, com)})
    return b


def test_predicted_drain_arithmetic():
    assert predicted_drain_s(7000, 300, 100) == pytest.approx(35.0)
    assert predicted_drain_s(7000, 100, 100) is None  # never drains
    assert predicted_drain_s(0, 1, 5) == 0.0


def test_drain_time_predicts_and_observes(tmp_path):
    d = drain_time(RunData(burst_and_drain(RunBuilder(tmp_path)).write()).events, tolerance=100)
    assert d["backlog"] == 7000 and d["peak_t"] == 20.0
    assert d["capacity"] == pytest.approx(300.0) and d["inflow"] == pytest.approx(100.0)
    assert d["predicted_drain_s"] == pytest.approx(35.0) and d["observed_drain_s"] == pytest.approx(35.0)


def test_drain_time_when_the_backlog_never_drains(tmp_path):
    d = drain_time(RunData(burst_and_drain(RunBuilder(tmp_path), tail=10).write()).events, tolerance=100)
    assert d["observed_drain_s"] is None and d["predicted_drain_s"] == pytest.approx(35.0)


def test_lag_bounded_passes_with_drain_figures(tmp_path):
    v = lag_bounded(run(burst_and_drain(RunBuilder(tmp_path, base_rate=100)).phases(10, 10, 60)), max=10000)
    assert v.verdict == PASS
    assert v.figures["peak_lag"] == 7000 and v.figures["max"] == 10000
    assert v.figures["predicted_drain_s"] == pytest.approx(35.0)
    assert v.figures["observed_drain_s"] == pytest.approx(35.0)
    assert v.figures["peak_lag_s"] > 0
    assert "drain predicted 35s, observed 35s" in v.message


def test_lag_bounded_fails_with_the_numbers(tmp_path):
    v = lag_bounded(run(burst_and_drain(RunBuilder(tmp_path, base_rate=100)).phases(10, 10, 60)), max=5000)
    assert v.verdict == FAIL
    assert v.figures["peak_lag"] == 7000 and v.figures["samples_over"] > 0
    assert "peaked at 7,000 at t=20s" in v.message and "limit 5,000" in v.message


def test_lag_bounded_falls_back_to_queue_depth(tmp_path):
    b = RunBuilder(tmp_path).lag([(t, 50.0 * (t % 4)) for t in range(20)], "metrics", "queue_depth")
    v = lag_bounded(run(b), max=100)
    assert v.verdict == FAIL and "queue depth" in v.message and v.figures["peak_lag"] == 150


def test_lag_bounded_is_unknown_without_samples_or_across_a_blind_gap(tmp_path):
    assert lag_bounded(run(RunBuilder(tmp_path / "a")), max=10).verdict == UNKNOWN
    b = RunBuilder(tmp_path / "b")
    healthy(b, 0, 10, parts=(P,))
    for t in range(10, 40):
        b.kafka_error(float(t))
    healthy(b, 40, 50, parts=(P,))
    v = lag_bounded(run(b), max=1000)
    assert v.verdict == UNKNOWN and v.figures["longest_gap_s"] == 31.0


# ------------------------------------------------------------ registration

def test_lag_checks_are_registered_and_validated():
    assert CHECKS["lag_bounded"] is lag_bounded and CHECKS["consumer_not_stalled"] is consumer_not_stalled
    validate_check("lag_bounded", {"max": 5000})
    validate_check("consumer_not_stalled", {"window": 20})
    with pytest.raises(ValueError, match="needs parameter 'max'"):
        validate_check("lag_bounded", {})


def test_a_lag_poll_that_failed_or_found_no_group_is_missing_data_with_its_reason(tmp_path):
    from monsoon.checks.base import RunData
    from monsoon.checks.lag import lag_recovers_within
    from tests.unit.helpers import RunBuilder
    b = RunBuilder(tmp_path, base_rate=100).phases(10, 60, 60)
    for t in range(0, 130, 5):
        b.ev("sample", float(t), collector="kafka", **({"group_missing": 1} if t < 60 else
                                                       {"error": "KafkaException: _TIMED_OUT"}))
        b.ev("sample", float(t), collector="metrics", queue_depth=0)      # never stands in for the lag
    v = lag_recovers_within(RunData(b.write()), seconds=60)
    assert v.verdict == "unknown"
    assert "the consumer group had committed no offset in 12 poll(s)" in v.message, v.message


def test_partition_history_is_in_partition_order_whatever_the_hash_seed():
    # the check's message lists partitions in this order: it must not follow set iteration (PYTHONHASHSEED)
    from monsoon.checks.burrow import partition_history
    names = [f"telemetry-{i}" for i in (7, 3, 5, 0, 9, 1)]
    samples = [{"t": 1.0, "partitions": {n: {"end": 10, "committed": 5} for n in names}},
               {"t": 2.0, "partitions": {n: {"end": 12, "committed": 6} for n in reversed(names)}}]
    assert list(partition_history(samples)) == sorted(names)
