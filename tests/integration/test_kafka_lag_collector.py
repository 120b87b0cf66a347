"""The Kafka lag collector on a real broker: exact lag per partition, and it survives a broker restart.

The AdminClient's ListConsumerGroupOffsets aborts the whole Python process when the
coordinator connection drops mid-request (librdkafka #4605): a kafka-broker-restart fault
killed monsoon itself. The collector must keep sampling (errors, then numbers again).
"""
import signal
import time

import pytest

from monsoon.observe.collectors import KafkaLagCollector
from monsoon.paths import REPO
from monsoon.stack.supervisor import Stack

from tests.integration.test_stack_runtime import stack_file

pytestmark = pytest.mark.integration

KAFKA = f"""\
kafka:
  command: ["{REPO}/stacks/bin/run-kafka", "{{dir}}", "{{port:kafka}}", "{{port:kafka_controller}}"]
  ready: {{tcp: "127.0.0.1:{{port:kafka}}", timeout: 90}}
  restart: always
  ephemeral: true
"""


def test_lag_is_exact_and_the_collector_survives_a_broker_restart(tmp_path):
    from confluent_kafka import Consumer, Producer, TopicPartition
    spec = stack_file(tmp_path, KAFKA, name="lag", ports=("kafka_controller",))
    with Stack(spec, tmp_path / "run", run_id="lag-restart") as st:
        bootstrap = f"127.0.0.1:{st.ports['kafka']}"
        p = Producer({"bootstrap.servers": bootstrap})
        for i in range(300):
            p.produce("t", key=str(i % 2), value=b"x", partition=i % 2)
        assert p.flush(30) == 0
        c = Consumer({"bootstrap.servers": bootstrap, "group.id": "g", "enable.auto.commit": False})
        c.commit(offsets=[TopicPartition("t", 0, 100), TopicPartition("t", 1, 150)], asynchronous=False)
        c.close()
        col = KafkaLagCollector(bootstrap, "g", "t", timeout=2.0)
        s = col.sample()
        assert s["lag"] == 50 + 0 and s["partitions"]["t-0"] == {"end": 150, "committed": 100, "lag": 50}
        # ThingsBoard's shape: one group per topic (re-Main-consumer-N on tb_rule_engine.main.N), given by pattern
        # partition 0 named: unkeyed records go where the sticky partitioner puts each batch (num.partitions=2),
        # and a CI run lost this assertion to a batch that landed on partition 1
        for n in range(3):
            for i in range(10 * (n + 1)):
                p.produce(f"tb_re.main.{n}", value=b"x", partition=0)
        assert p.flush(30) == 0
        for n in range(2):   # group 2 never committed: its topic's whole log is lag
            c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"re-consumer-{n}", "enable.auto.commit": False})
            c.commit(offsets=[TopicPartition(f"tb_re.main.{n}", 0, 4)], asynchronous=False)
            c.close()
        pat = KafkaLagCollector(bootstrap, "re-consumer-*", "tb_re.main.*", timeout=2.0)
        ps = pat.sample()
        assert ps["groups"] == 2 and ps["lag"] == (10 - 4) + (20 - 4) + 30, ps
        assert KafkaLagCollector(bootstrap, "re-consumer-*", "tb_re.main", timeout=2.0).sample() == {"topic_missing": 1}
        pat.close()
        # a broker restart while sampling as fast as the Sampler would
        st.kill("kafka", signal.SIGTERM)
        errors, back = 0, None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                back = col.sample()
                if errors and back["lag"] == 50:
                    break
            except Exception:
                errors += 1
            time.sleep(0.2)
        col.close()
        assert back is not None and back["lag"] == 50, (errors, back)


def test_a_cluster_id_that_starts_with_a_dash_still_starts_the_broker(tmp_path):
    """1 random cluster id in 64 starts with '-': passed as '-t ID' it read as an option and
    the broker exited during start-up (a CI run lost its Mongo-slowdown scenario to it)."""
    from confluent_kafka.admin import AdminClient
    cid = "-AbCdEfGhIjKlMnOpQrStu"
    spec = stack_file(tmp_path, KAFKA.replace("  restart: always\n", f"  env: {{KAFKA_CLUSTER_ID: '{cid}'}}\n"),
                      name="dash", ports=("kafka_controller",))
    with Stack(spec, tmp_path / "run", run_id="dash-id") as st:
        admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{st.ports['kafka']}"})
        meta = admin.list_topics(timeout=30)
        assert meta.cluster_id == cid, meta.cluster_id


def test_a_topic_that_does_not_exist_is_missing_data_and_the_recovery_unknown(tmp_path):
    """On a real broker, the collector pointed at a topic nobody created: no lag is reported (not 0), and a
    run whose every Kafka sample is like that gets lag_recovers_within unknown, not the PASS it used to get."""
    from monsoon.checks.base import RunData
    from monsoon.checks.lag import lag_recovers_within
    from monsoon.rundir import TIMELINE_FILE
    from monsoon.timeline.store import Timeline
    spec = stack_file(tmp_path, KAFKA, name="nolag", ports=("kafka_controller",))
    with Stack(spec, tmp_path / "run", run_id="lag-missing") as st:
        col = KafkaLagCollector(f"127.0.0.1:{st.ports['kafka']}", "tb-rule-engine", "no_such_topic", timeout=2.0)
        nogroup = KafkaLagCollector(f"127.0.0.1:{st.ports['kafka']}", "no-such-group", None, timeout=2.0)
        try:
            samples = [col.sample() for _ in range(3)]
            no_group = nogroup.sample()     # no topic given and a group that never committed: no lag either
        finally:
            col.close()
            nogroup.close()
    assert samples == [{"topic_missing": 1}] * 3
    assert no_group in ({"group_missing": 1}, {"topic_missing": 1}), no_group
    out = tmp_path / "exp"
    out.mkdir()
    with Timeline(out / TIMELINE_FILE) as tl:
        tl.add("meta", stack="nolag", experiment="x", base_rate=100)
        tl.add("phase", name="burst", start=1.0, end=2.0)
        for s in samples:
            tl.add("sample", collector="kafka", **s)
            tl.add("sample", collector="metrics", queue_depth=0)
        tl.add("op", op="load-end")
    v = lag_recovers_within(RunData(out), seconds=60)
    assert v.verdict == "unknown" and "the Kafka topic was missing in 3 poll(s)" in v.message
