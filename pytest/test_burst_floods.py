"""x3 / x10 burst floods against the in-memory-queue and the Kafka-queue stacks.

Run:  pytest -m burst                    (quick profile: minutes)
      pytest -m burst --monsoon-profile=full

Each case starts a fresh stack, floods it with the experiment's load shape,
and asserts every check of the experiment (no_oom, no_acked_loss,
lag_recovers_within). The expected story: the in-memory stack passes x3 and
FAILS x10 (OutOfMemoryError, acked messages lost); the Kafka stack passes both.
`make demo` runs the two x10 cases, which tell the story on their own (monsoon.cli.DEMO_CASES).
"""
import pytest

from monsoon.spec.experiment import experiments_marked

STACKS = ["inmemory", "kafka"]
# a broken burst-*.yaml is still listed: its own cases report its error, the others still run
EXPERIMENTS = experiments_marked("burst", "burst-*.yaml")


@pytest.mark.burst
@pytest.mark.parametrize("experiment", EXPERIMENTS)
@pytest.mark.parametrize("stack", STACKS)
def test_burst_flood(monsoon, stack, experiment):
    result = monsoon.run(stack, experiment)
    result.assert_pass()
