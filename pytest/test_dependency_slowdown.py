"""A slow Mongo registry and a slow Infinispan cache under steady load (Hono shape).

Run:  pytest -m chaostest_dependency_slowdown.py      (quick profile: ~3 min each)

Stack ``kafka-registry``: the platform looks devices up in a MongoDB registry
(FerretDB) through an Infinispan cache, and every hop goes through Toxiproxy.
For 60 s (quick) every reply on the hop is delayed 500 ms +/- 100 ms. The
experiment asserts an error budget (99 % of messages acked within 2 s) and a
latency objective (p99 <= 3 s during the slowdown), accounts for every acked
message, and reports ``throughput_drop_pct``: how far ingestion fell.
"""
import pytest


@pytest.mark.chaos
@pytest.mark.parametrize("experiment", ["mongo-slowdown", "infinispan-slowdown"])
def test_dependency_slowdown(monsoon, experiment, record_property):
    result = monsoon.run("kafka-registry", experiment)
    if result.dry_run is None and any(c.name == "throughput_drop" for c in result.checks):
        drop = result.check("throughput_drop").figures.get("throughput_drop_pct")
        record_property("throughput_drop_pct", drop)
        monsoon.progress(f"[kafka-registry/{experiment}] ingestion throughput drop during the slowdown: {drop}%")
    result.assert_pass()
