"""Checks on hand-made timelines, including every case where they must fail or say unknown."""
import pytest

from monsoon.checks.base import FAIL, PASS, UNKNOWN, RunData, combine
from monsoon.checks.registry import evaluate, validate_check
from monsoon.checks.lag import lag_recovers_within
from monsoon.checks.loss import no_acked_loss
from monsoon.checks.oom import no_oom, no_unexpected_exit
from tests.unit.helpers import RunBuilder


def run(b: RunBuilder) -> RunData:
    return RunData(b.write())


# ------------------------------------------------------------------ no_oom

def test_no_oom_passes_on_a_quiet_service(tmp_path):
    v = no_oom(run(RunBuilder(tmp_path).service_start()))
    assert v.verdict == PASS
    assert v.figures["oom_events"] == 0 and v.figures["restarts"] == 0


def test_no_oom_fails_on_jvm_exit_3_and_names_the_time_into_the_burst(tmp_path):
    b = RunBuilder(tmp_path).phases(10, 60, 30).service_start()
    b.ev("service", 52.0, service="platform", event="exit", code=3, oom=True,
         cause="java.lang.OutOfMemoryError (JVM exit 3)")
    b.ev("service", 53.0, service="platform", event="restart", n=2)
    v = no_oom(run(b))
    assert v.verdict == FAIL
    assert v.figures == {"oom_events": 1, "restarts": 1, "exits": 1}
    assert "OutOfMemoryError" in v.message and "42s into the burst" in v.message


def test_no_oom_never_calls_exit_137_without_evidence_an_oom(tmp_path):
    b = RunBuilder(tmp_path).service_start()
    b.ev("service", 5.0, service="platform", event="exit", code=137, oom=False, cause="SIGKILL",
         kernel_log="no OOM-kill line for this pid")
    v = no_oom(run(b))
    assert v.verdict == PASS and v.figures["oom_events"] == 0
    u = no_unexpected_exit(run(b))
    assert u.verdict == FAIL and u.figures["unexpected_exits"] == 1 and "platform died of SIGKILL" in u.message


def test_a_plain_crash_and_restart_is_an_unexpected_exit_not_an_oom(tmp_path):
    b = RunBuilder(tmp_path).service_start()
    b.ev("service", 5.0, service="platform", event="exit", code=1, oom=False, cause="exit 1")
    b.ev("service", 6.0, service="platform", event="restart", n=2)
    v = no_oom(run(b))
    assert v.verdict == PASS and v.figures["oom_events"] == 0 and v.figures["restarts"] == 0
    u = no_unexpected_exit(run(b))
    assert u.verdict == FAIL and u.figures == {"unexpected_exits": 1, "restarts": 1}
    assert u.message.startswith("platform exited with code 1 at t=5s; 1 restart(s)"), u.message


def test_no_oom_is_unknown_without_supervision(tmp_path):
    assert no_oom(run(RunBuilder(tmp_path))).verdict == UNKNOWN


# ------------------------------------------------------------ no_acked_loss

def test_no_acked_loss_passes_and_counts_duplicates_and_unacked_stored(tmp_path):
    acked = [("d1", i) for i in range(10)]
    stored = acked + [("d1", 3), ("d1", 10)]  # one duplicate, one stored-but-never-acked
    v = no_acked_loss(run(RunBuilder(tmp_path).acked(acked).stored(stored)))
    assert v.verdict == PASS
    assert v.figures["acked"] == 10 and v.figures["acked_lost"] == 0
    assert v.figures["duplicates"] == 1 and v.figures["stored_unacked"] == 1


def test_no_acked_loss_fails_with_the_numbers(tmp_path):
    acked = [("d1", i) for i in range(1000)]
    stored = [p for p in acked if not 500 <= p[1] < 507]
    v = no_acked_loss(run(RunBuilder(tmp_path).acked(acked).stored(stored)))
    assert v.verdict == FAIL
    assert v.figures["acked_lost"] == 7
    assert "7 of 1,000 acked messages lost (0.70%)" in v.message and "d1#500" in v.message


def test_no_acked_loss_is_unknown_when_the_stack_had_not_drained(tmp_path):
    b = RunBuilder(tmp_path).acked([("d", 1), ("d", 2)]).stored([("d", 1)])
    b.ev("drain", 100, drained=False, waited_s=120, backlog=5000)
    v = no_acked_loss(run(b))
    assert v.verdict == UNKNOWN and v.figures["acked_lost"] == 1


def test_a_lost_count_with_a_settled_stored_count_is_a_fail_and_no_signal_at_all_says_so(tmp_path):
    b = RunBuilder(tmp_path / "a").acked([("d", 1), ("d", 2)]).stored([("d", 1)])
    b.ev("drain", 100, drained=True, waited_s=4, backlog=None, signal="stored count")   # no backlog metric
    assert no_acked_loss(run(b)).verdict == FAIL
    b = RunBuilder(tmp_path / "b").acked([("d", 1), ("d", 2)]).stored([("d", 1)])
    b.ev("drain", 100, drained=False, waited_s=120, backlog=None, signal=None)
    v = no_acked_loss(run(b))
    assert v.verdict == UNKNOWN and "the stack gives no sign of having settled" in v.message
    assert "storage.count_query" in v.message


def test_no_acked_loss_is_unknown_without_the_stored_export(tmp_path):
    assert no_acked_loss(run(RunBuilder(tmp_path).acked([("d", 1)]))).verdict == UNKNOWN


def test_no_acked_loss_tolerates_a_torn_last_line(tmp_path):
    b = RunBuilder(tmp_path).acked([("d", 1)]).stored([("d", 1)])
    with open(tmp_path / "acked.csv", "a") as fh:
        fh.write("d,")  # the run was killed mid-write
    assert no_acked_loss(run(b)).verdict == PASS


# ------------------------------------------------------ lag_recovers_within

def lag_run(tmp_path, points, collector="kafka", field="lag"):
    return run(RunBuilder(tmp_path, base_rate=100).phases(10, 60, 60).lag(points, collector, field))


def test_lag_recovers_within_passes_and_measures_recovery_from_burst_end(tmp_path):
    pts = [(t, 0) for t in range(0, 10)] + [(t, (t - 10) * 500) for t in range(10, 71)] + \
          [(t, max(0, 30000 - (t - 70) * 1000)) for t in range(71, 130)]
    v = lag_recovers_within(lag_run(tmp_path, pts), seconds=60)
    assert v.verdict == PASS
    assert v.figures["peak_lag"] == 30000
    assert v.figures["recovery_s"] == 30.0  # 30000 - 1000*k <= 100 first at k=30 (t=100)


def test_lag_recovers_within_fails_when_too_slow(tmp_path):
    pts = [(t, 30000 - (t - 70) * 100) for t in range(70, 200)]
    v = lag_recovers_within(lag_run(tmp_path, pts), seconds=60)
    assert v.verdict == FAIL
    assert v.figures["recovery_s"] > 60
    assert "limit 60s" in v.message


def test_lag_recovers_within_fails_when_lag_never_recovers(tmp_path):
    pts = [(t, 50000) for t in range(70, 200)]
    v = lag_recovers_within(lag_run(tmp_path, pts), seconds=60)
    assert v.verdict == FAIL and v.figures["final_lag"] == 50000


def test_lag_recovers_within_is_unknown_when_sampling_stopped_too_early(tmp_path):
    pts = [(t, 50000) for t in range(70, 90)]
    assert lag_recovers_within(lag_run(tmp_path, pts), seconds=60).verdict == UNKNOWN


def test_lag_recovers_within_falls_back_to_queue_depth(tmp_path):
    pts = [(70, 800), (71, 50)]
    v = lag_recovers_within(lag_run(tmp_path, pts, collector="metrics", field="queue_depth"), seconds=10)
    assert v.verdict == PASS and v.figures["peak_lag"] == 800 and "queue depth" in v.message


def test_a_backlog_emptied_by_a_crash_is_not_a_recovery(tmp_path):
    b = RunBuilder(tmp_path, base_rate=100).phases(10, 60, 60).service_start()
    b.lag([(60, 40000), (65, 52000), (69, 0), (70, 0), (75, 10)], collector="metrics", field="queue_depth")
    b.ev("service", 67.5, service="platform", event="exit", code=3, oom=True, cause="java.lang.OutOfMemoryError")
    v = lag_recovers_within(run(b), seconds=60)
    assert v.verdict == FAIL and v.figures["emptied_by_crash"] == 1
    assert "was 52,000 when platform died" in v.message and "t=68s" in v.message and "vanished" in v.message


def test_a_backlog_wiped_by_a_crash_during_the_burst_is_never_a_recovery(tmp_path):
    # the case: the in-memory queue's backlog dies with the heap mid-burst; the restarted platform
    # builds a small backlog again and drains it after the burst — which alone would read as a recovery
    b = RunBuilder(tmp_path, base_rate=100).phases(10, 60, 60).service_start()
    pts = [(float(t), 2000.0 * (t - 10)) for t in range(10, 40)] + \
          [(float(t), 300.0) for t in range(46, 70)] + [(float(t), 0.0) for t in range(70, 120)]
    b.lag(pts, collector="metrics", field="queue_depth")
    b.ev("service", 40.2, service="platform", event="exit", code=3, oom=True, cause="java.lang.OutOfMemoryError")
    b.ev("service", 41.5, service="platform", event="restart", n=2)
    v = lag_recovers_within(run(b), seconds=60)
    assert v.verdict == FAIL and v.figures["emptied_by_crash"] == 1 and v.figures["backlog_vanished"] == 58000
    assert "t=40s" in v.message
    b2 = RunBuilder(tmp_path / "2", base_rate=100).phases(10, 60, 60).service_start()   # no death: a recovery
    b2.lag(pts, collector="metrics", field="queue_depth")
    assert lag_recovers_within(run(b2), seconds=60).verdict == PASS


def test_a_backlog_the_platform_stopped_reporting_before_it_died_still_vanished(tmp_path):
    # real TB 4.2.1, in-memory x10: GC-thrashing towards its OutOfMemoryError it stopped answering its metrics;
    # the last sample (132,639 queued) was 11 s before the death, the restarted server counted from zero
    b = RunBuilder(tmp_path, base_rate=100).phases(10, 60, 60).service_start()
    pts = [(33.0, 173451.0), (38.0, 163845.0), (44.0, 163486.0), (49.0, 152516.0), (77.0, 132639.0),
           (110.0, -301.0), (115.0, 0.0), (120.0, 0.0)]
    b.lag(pts, collector="metrics", field="queue_depth")
    b.ev("service", 88.0, service="platform", event="exit", code=3, oom=True, cause="java.lang.OutOfMemoryError")
    b.ev("service", 89.0, service="platform", event="restart", n=2)
    v = lag_recovers_within(run(b), seconds=300)
    # its restarted server's put-minus-done queue depth read -301 at t=110: a gauge that cannot be true, so the
    # check cannot read that sample as "empty" (issue 39): unknown, naming it
    assert v.verdict == UNKNOWN and "emptied_by_crash" not in v.figures
    assert v.message.startswith("queue depth (observe.metrics.queue_depth) cannot be true: -301 at t=110s")
    # with that sample at zero (a gauge that can be true), the backlog vanished with the process
    b1 = RunBuilder(tmp_path / "1", base_rate=100).phases(10, 60, 60).service_start()
    b1.lag([(t, max(0.0, x)) for t, x in pts], collector="metrics", field="queue_depth")
    b1.ev("service", 88.0, service="platform", event="exit", code=3, oom=True, cause="java.lang.OutOfMemoryError")
    b1.ev("service", 89.0, service="platform", event="restart", n=2)
    v = lag_recovers_within(run(b1), seconds=300)
    assert v.verdict == FAIL and v.figures["emptied_by_crash"] == 1 and v.figures["backlog_vanished"] == 132639
    # the same gap with a backlog the platform could have drained in it (it drained 1,000 msg/s before): no
    # claim that the crash took it, but no recovery either: nothing saw it drain (test_silence has the counters)
    b2 = RunBuilder(tmp_path / "2", base_rate=100).phases(10, 60, 60).service_start()
    b2.lag([(60.0, 9000.0), (65.0, 4000.0), (77.0, 3000.0), (95.0, 0.0), (100.0, 0.0)],
           collector="metrics", field="queue_depth")
    b2.ev("service", 88.0, service="platform", event="exit", code=137, oom=False, cause="SIGKILL")
    v2 = lag_recovers_within(run(b2), seconds=300)
    assert v2.verdict == UNKNOWN and "emptied_by_crash" not in v2.figures and v2.figures["backlog_unseen"] == 3000


def test_an_exit_after_the_drain_does_not_taint_the_recovery(tmp_path):
    b = RunBuilder(tmp_path, base_rate=100).phases(10, 60, 60).service_start()
    b.lag([(65, 52000), (75, 30000), (90, 0), (100, 0)], collector="metrics", field="queue_depth")
    b.ev("service", 95, service="platform", event="exit", code=137, oom=False, cause="SIGKILL")
    v = lag_recovers_within(run(b), seconds=60)
    assert v.verdict == PASS and "emptied_by_crash" not in v.figures


def test_lag_recovers_within_is_unknown_without_samples(tmp_path):
    assert lag_recovers_within(lag_run(tmp_path, []), seconds=60).verdict == UNKNOWN


# ----------------------------------------------------------- composition

def test_combine_fail_beats_unknown_beats_pass():
    assert combine([PASS, UNKNOWN, FAIL]) == FAIL
    assert combine([PASS, UNKNOWN]) == UNKNOWN
    assert combine([PASS, PASS]) == PASS
    assert combine([]) == UNKNOWN


def test_evaluate_turns_a_crashing_check_into_unknown(tmp_path):
    lag_run(tmp_path, [(70, 5), (71, 0)])
    out = evaluate(tmp_path, [("lag_recovers_within", {"seconds": "x"}), ("no_oom", {})])
    assert out[0].verdict == UNKNOWN and "crashed" in out[0].message
    assert out[1].name == "no_oom"  # the others still ran


@pytest.mark.parametrize("name,params,err", [
    ("no_such_check", {}, "unknown check"),
    ("lag_recovers_within", {}, "needs parameter 'seconds'"),
    ("lag_recovers_within", {"seconds": 5, "bogus": 1}, "no parameter 'bogus'"),
    ("lag_recovers_within", {"seconds": -1}, "must be a number >= 0"),
])
def test_validate_check_rejects_bad_references(name, params, err):
    with pytest.raises(ValueError, match=err):
        validate_check(name, params)


# ------------------------------------------- lag_recovers_within: a relapse is not a recovery

def test_lag_that_drains_then_stalls_is_not_a_recovery(tmp_path):
    # drained 5 s after the burst, then the consumer stalls: lag grows and never comes back
    pts = [(t, 30000) for t in range(60, 71)] + [(t, 0) for t in range(71, 76)] + \
          [(t, (t - 75) * 400) for t in range(76, 200)]
    v = lag_recovers_within(lag_run(tmp_path, pts), seconds=60)
    assert v.verdict == FAIL, v.message
    assert v.figures["relapses"] == 1 and v.figures["final_lag"] == 124 * 400
    assert "relapse, not a recovery" in v.message and "t=76s" in v.message


def test_a_short_blip_after_recovery_is_tolerated_and_a_long_one_moves_recovery(tmp_path):
    base = [(t, 30000) for t in range(60, 71)] + [(t, 0) for t in range(71, 80)]
    blip = [(t, 5000) for t in range(80, 85)] + [(t, 0) for t in range(85, 200)]        # 5 s above: a blip
    v = lag_recovers_within(lag_run(tmp_path / "a", base + blip), seconds=60)
    assert v.verdict == PASS and v.figures["recovery_s"] == 1.0 and "relapses" not in v.figures
    long = [(t, 5000) for t in range(80, 145)] + [(t, 0) for t in range(145, 200)]      # 65 s above
    v = lag_recovers_within(lag_run(tmp_path / "b", base + long), seconds=60)
    assert v.verdict == FAIL and v.figures["recovery_s"] == 75.0, v.message
    v = lag_recovers_within(lag_run(tmp_path / "c", base + long), seconds=60, grace=120)
    assert v.verdict == PASS and v.figures["recovery_s"] == 1.0


def kafka_drain_run(tmp_path, capacity=500.0, calibrated=None):
    """x1 = 100 msg/s, x10 for 20 s; one partition consumed at up to ``capacity`` msg/s."""
    b = RunBuilder(tmp_path, base_rate=100).phases(10, 20, 60)
    if calibrated:
        b.events[0]["base_rate_auto"] = {"capacity_msg_s": calibrated}
    end = committed = 0.0
    for t in range(0, 91):
        end += 1000.0 if 10 <= t < 30 else 100.0
        committed = min(end, committed + capacity)
        b.kafka(float(t), {"tb-0": (int(end), int(committed))})
    return run(b)


def test_lag_recovers_within_puts_the_predicted_drain_next_to_the_observed_one(tmp_path):
    # peak backlog 10,000 at the burst end; drains at 500 - 100 = 400 msg/s net: 25 s
    v = lag_recovers_within(kafka_drain_run(tmp_path / "a"), seconds=60)
    assert v.verdict == PASS
    assert v.figures["predicted_drain_s"] == pytest.approx(25, abs=1)
    assert v.figures["observed_drain_s"] == pytest.approx(25, abs=1.5)
    assert v.figures["drain_capacity_msg_s"] == pytest.approx(500)
    assert "drain from the peak predicted" in v.message
    # with a calibrated capacity that the run did not reach, the prediction and the observation part ways
    v = lag_recovers_within(kafka_drain_run(tmp_path / "b", calibrated=900.0), seconds=60)
    assert v.figures["drain_capacity_msg_s"] == 900 and v.figures["predicted_drain_s"] == pytest.approx(12.5, abs=0.5)
    assert v.figures["observed_drain_s"] == pytest.approx(25, abs=1.5)


def test_a_kafka_topic_that_never_existed_is_unknown_not_a_recovery(tmp_path):
    """The false PASS seen on a real ThingsBoard (issue 17): every lag poll found no topic, and lag 0 read as
    recovered while 14,186 acked messages were lost. Missing data is never a zero, nor the queue depth's."""
    b = RunBuilder(tmp_path)
    b.ev("phase", 0, name="burst", start=10.0, end=70.0)
    for t in range(0, 130, 5):
        b.ev("sample", float(t), collector="kafka", topic_missing=1)
        b.ev("sample", float(t), collector="metrics", queue_depth=0)   # the platform's own queue: empty, not Kafka
    b.ev("op", 120.0, op="load-end")
    v = lag_recovers_within(run(b), seconds=60)
    assert v.verdict == UNKNOWN and "the Kafka topic was missing in 26 poll(s)" in v.message
    assert "missing data, not a zero" in v.message


def test_an_oom_during_the_stacks_stop_is_counted_like_any_other(tmp_path):
    # real TB, Kafka x10: a second OutOfMemoryError during its 10 s graceful stop (stop code 3)
    b = RunBuilder(tmp_path).phases(10, 60, 30).service_start()
    b.ev("service", 140.0, service="platform", event="stop", code=3)
    b.ev("service", 140.5, service="postgres", event="stop", code=0)
    v = no_oom(run(b))
    assert v.verdict == FAIL and v.figures["oom_events"] == 1 and "while being stopped" in v.message
    b2 = RunBuilder(tmp_path / "2").phases(10, 60, 30).service_start()
    b2.ev("service", 140.0, service="platform", event="stop", code=143)
    assert no_oom(run(b2)).verdict == PASS


def test_a_check_that_cannot_fail_is_info_and_never_makes_a_pass_on_its_own():
    from monsoon.checks.base import INFO, combine
    assert combine([PASS, INFO]) == PASS and combine([FAIL, INFO]) == FAIL and combine([UNKNOWN, INFO]) == UNKNOWN
    assert combine([INFO, INFO]) == INFO      # nothing judged: not a pass
