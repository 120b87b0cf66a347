"""The Cassandra stacks (ThingsBoard's ts_kv_cf): Kafka + Cassandra, and NDU's ack-after-the-Cassandra-write.

Run:  pytest -m cassandra pytest/                   (quick profile: ~2-4 min per case, Cassandra start included)

* x10 on ``kafka-cassandra``: the Kafka queue holds the flood as consumer lag, the consumers write it to
  Cassandra, and every acked message is read back from Cassandra (paged CQL): nothing lost, lag drained;
* pod kill on ``cassandra-ack``: each publish is acked only after its Cassandra write, so a SIGKILL of the
  platform may cost unacked messages (the devices retry them) but nothing acked;
* ``cassandra-slowdown`` on ``kafka-cassandra``: 200 ms on every reply on the platform -> Cassandra hop; the
  queue absorbs it, nothing acked is lost, and ``throughput_drop_pct`` says how far storage fell;
* ``cassandra-down`` on ``kafka-cassandra`` (the platform -> Cassandra hop cut for 20 s: the consumers retry the
  batch, the queue keeps acking) and ``cassandra-node-kill`` on ``cassandra-ack`` (SIGKILL of the Cassandra node,
  restarted with its commit log: writes fail and are not acked meanwhile; the node fsyncs its commit log before
  acking, commitlog_sync: batch, since with Cassandra's default periodic sync a kill loses the last ~100 ms of
  acked writes): each lands, heals, loses nothing acked;
* ``storage-compare`` on ``kafka`` and ``kafka-cassandra``: Postgres vs Cassandra time series side by side.
"""
import pytest


@pytest.mark.burst
@pytest.mark.cassandra
def test_kafka_cassandra_absorbs_x10_and_loses_nothing(monsoon):
    monsoon.run("kafka-cassandra", "burst-x10").assert_pass()


@pytest.mark.chaos
@pytest.mark.cassandra
def test_ack_after_cassandra_write_survives_pod_kill(monsoon):
    monsoon.run("cassandra-ack", "pod-kill").assert_pass()


@pytest.mark.chaos
@pytest.mark.cassandra
def test_cassandra_slowdown_is_absorbed_by_the_kafka_queue(monsoon, record_property):
    result = monsoon.run("kafka-cassandra", "cassandra-slowdown")
    if result.dry_run is None and any(c.name == "throughput_drop" for c in result.checks):
        drop = result.check("throughput_drop").figures.get("throughput_drop_pct")
        record_property("throughput_drop_pct", drop)
        monsoon.progress(f"[kafka-cassandra/cassandra-slowdown] ingestion throughput drop during the slowdown: "
                         f"{drop}%")
    result.assert_pass()


@pytest.mark.chaos
@pytest.mark.cassandra
@pytest.mark.parametrize("stack, experiment", [("kafka-cassandra", "cassandra-down"),
                                               ("cassandra-ack", "cassandra-node-kill")])
def test_cassandra_down_and_node_kill_land_heal_and_lose_nothing_acked(monsoon, stack, experiment):
    result = monsoon.run(stack, experiment)
    if result.dry_run is None:
        landed = result.check("faults_landed").figures
        assert landed.get("faults_injected") == landed.get("faults_landed") == landed.get("faults_healed") == 1, \
            result.failure_message()
    result.assert_pass()


@pytest.mark.cassandra
@pytest.mark.parametrize("stack", ["kafka", "kafka-cassandra"])
def test_postgres_vs_cassandra_side_by_side(monsoon, stack):
    """Time series in Postgres (kafka) vs Cassandra (kafka-cassandra), the same fixed x1 and x3: the session's
    checklist and report put capacity (run `monsoon calibrate STACK` first), ack latency p50/p99 per phase, drain
    time and loss next to each other."""
    monsoon.run(stack, "storage-compare").assert_pass()
