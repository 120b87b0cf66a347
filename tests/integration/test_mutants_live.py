"""The mutants only a live stack can detect (tests/mutants.py: queries that are not SQL) stop a real run before
its load, naming the key, and leave nothing running; the run directory says why."""
from __future__ import annotations

import pytest

from monsoon.rundir import TIMELINE_FILE
from monsoon.session import MonsoonSession
from monsoon.stack.reaper import find_leftovers
from monsoon.timeline.store import Events
from tests.mutants import generate

LIVE = [m for m in generate() if m.live]
TINY = """name: tiny
load: {devices: 5, base_rate: 20, shape: {kind: steady}}
profiles: {quick: {warmup: 10, drain_timeout: 10}}
checks: [no_acked_loss]
"""
KEYS = {"loss-query-prose": "storage.loss_query", "count-query-broken": "storage.count_query"}


@pytest.mark.parametrize("mutant", LIVE, ids=lambda m: m.id)
def test_a_broken_query_stops_the_run_before_the_load(mutant, tmp_path):
    stack = mutant.write(tmp_path)
    exp = tmp_path / "tiny.yaml"
    exp.write_text(TINY)
    session = MonsoonSession(profile="quick", runs_dir=tmp_path / "runs", run_id=f"live-{mutant.id}",
                             progress=lambda s: None)
    result = session.run(str(stack), str(exp))
    key = next(k for label, k in KEYS.items() if mutant.id.endswith(label))
    assert result.verdict == "unknown" and result.error and f"{stack}: {key}: " in result.error, result.error
    assert "checked before the load, nothing was sent" in result.error
    events = Events.load(result.dir / TIMELINE_FILE)
    assert not list(events.of("load")) and not events.first("op", op="connected")   # not one message was sent
    assert events.first("service", event="ready") is not None                  # the stack did start: a live finding
    assert find_leftovers(session.run_id) == []                                 # and nothing of it is left
