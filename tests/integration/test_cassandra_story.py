"""The Kafka + Cassandra stack as a user runs it: one experiment (``cassandra-slowdown`` on ``kafka-cassandra``,
quick profile) starts Postgres, Kafka, Cassandra (fast-boot flags), Toxiproxy and the reference platform writing
ThingsBoard's ``ts_kv_cf``; a steady QoS1 load runs while 200 ms of latency sits on the platform -> Cassandra hop.
Every acked message is read back from Cassandra (paged CQL, entity ids named through Postgres) and none is lost;
the fault landed (CQL probe slower through the proxy) and healed; throughput_drop reports its figure."""
import json
import re

import pytest

from monsoon.session import run_one
from monsoon.timeline.columnar import iter_dicts
from monsoon.spec.experiment import load_experiment
from monsoon.spec.stack import load_stack
from monsoon.stack.reaper import find_leftovers

pytestmark = pytest.mark.integration
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-")


def test_kafka_cassandra_stack_stores_every_acked_message_and_a_slowdown_lands_and_heals(tmp_path):
    run_id = "cassandra-story"
    result = run_one(load_stack("kafka-cassandra"), load_experiment("cassandra-slowdown"), "quick",
                     tmp_path / "run", run_id=run_id, progress=print)
    figures = {c.name: c.figures for c in result.checks}
    verdicts = {c.name: c.verdict for c in result.checks}
    print(json.dumps(figures, indent=1, default=str))
    assert result.error is None, result.error
    loss = figures["no_acked_loss"]
    assert loss["acked_lost"] == 0 and loss["acked"] > 5000, loss
    stored = list(iter_dicts(tmp_path / "run" / "stored.csv"))
    assert list(stored[0]) == ["device", "seq", "stored_ms"] and len(stored) >= loss["acked"]
    assert not UUID_RE.match(stored[0]["device"]), f"entity ids not named through Postgres: {stored[0]}"
    fl = figures["faults_landed"]
    assert verdicts["faults_landed"] == "pass", fl
    assert fl["faults_injected"] == fl["faults_landed"] == fl["faults_healed"] == 1 and fl["faults_left_in_place"] == 0
    assert isinstance(figures["throughput_drop"].get("throughput_drop_pct"), (int, float)), figures["throughput_drop"]
    assert find_leftovers(run_id) == []
