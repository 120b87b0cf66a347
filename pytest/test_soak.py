"""Soak: steady x1 load with a fault every period.

Run:  pytest -m soak                               (quick: 4 min)
      pytest -m soak --monsoon-profile=full        (24 h)

In turn, each period: a pod kill of the platform, a Mongo slowdown, an
Infinispan slowdown, and a Kafka broker restart (see experiments/soak.yaml;
every profile keeps the same ratios). Asserts no OOM, no acked loss, lag
recovery after every fault, the error budget and no memory leak.
"""
import pytest


@pytest.mark.soak
@pytest.mark.chaos
def test_soak_with_periodic_faults(monsoon):
    monsoon.run("kafka-registry", "soak").assert_pass()
