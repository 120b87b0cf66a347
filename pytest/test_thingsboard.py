"""The x3 / x10 story on the real ThingsBoard 4.2.1: in-memory queue and Kafka queue, Postgres.

Run:  pytest -m burst pytest/ -k thingsboard

Needs TB's server jar, built once from a clone of its public repository at tag v4.2.1:
      tools/build-thingsboard <git clone of github.com/thingsboard/thingsboard at v4.2.1>
Without it these cases skip, saying so in one line.

x1 is calibrated against each stack (base_rate: auto). Expected: both stacks pass x3; in-memory x10 dies of
OutOfMemoryError, is restarted, and loses acked messages (FAIL with the numbers); Kafka x10 holds the flood
as consumer lag, drains it and loses nothing (PASS).
"""
import pytest

from monsoon.spec.stack import load_stack
from monsoon.stack.ports import StackError
from monsoon.stack.supervisor import Stack

STACKS = ["thingsboard-inmemory", "thingsboard-kafka"]
EXPERIMENTS = ["thingsboard-burst-x3", "thingsboard-burst-x10"]


def missing(stack: str) -> str | None:
    """What the stack's ``requires`` lack (the TB jar), in one line; None when it can start."""
    try:
        Stack(load_stack(stack), "unused", run_id="preflight").preflight()
    except StackError as e:
        return " ".join(str(e).split())
    return None


@pytest.mark.burst
@pytest.mark.parametrize("experiment", EXPERIMENTS)
@pytest.mark.parametrize("stack", STACKS)
def test_thingsboard_burst_flood(monsoon, stack, experiment):
    why = missing(stack)
    if why:
        pytest.skip(why)
    monsoon.run(stack, experiment).assert_pass()
