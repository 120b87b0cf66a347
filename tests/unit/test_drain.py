"""The drain ends on any sign that the stack has settled, and says which (or that there was none)."""
from __future__ import annotations

import threading
import types

import pytest

import monsoon.run.drain as drain_mod
from monsoon.run.drain import Drain


class Clock:
    def __init__(self):
        self.t = 0.0

    def monotonic(self):
        return self.t

    def sleep(self, s):
        self.t += s


class Sampler:
    """value(collector, key) from a script: {(collector, key): [v at second 1, v at 2, ...]} (last one repeats)."""

    def __init__(self, clock, script):
        self.clock, self.script = clock, script

    def value(self, collector, key):
        seq = self.script.get((collector, key))
        if not seq:
            return None
        return seq[min(int(self.clock.t) - 1, len(seq) - 1)]


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(drain_mod, "time", types.SimpleNamespace(monotonic=c.monotonic, sleep=c.sleep))
    return c


def test_a_stack_with_only_a_stored_count_drains_when_it_stops_growing(clock):
    s = Sampler(clock, {("storage", "stored"): [100, 150, 180, 190, 190, 190, 190, 190]})
    d = Drain(s, has_kafka=False).wait(120, threading.Event())
    assert d == {"drained": True, "waited_s": 7.0, "backlog": None, "signal": "stored count"}


def test_kafka_lag_at_zero_with_a_steady_stored_count_drains(clock):
    s = Sampler(clock, {("kafka", "lag"): [500, 20, 0], ("storage", "stored"): [1, 2, 3, 3, 3]})
    d = Drain(s, has_kafka=True).wait(120, threading.Event())
    assert d["drained"] and d["signal"] == "kafka lag" and d["waited_s"] == 5.0


def test_a_backlog_that_stays_up_is_not_drained_whatever_the_stored_count_does(clock):
    s = Sampler(clock, {("metrics", "queue_depth"): [900], ("storage", "stored"): [7]})
    d = Drain(s, has_kafka=False).wait(30, threading.Event())
    assert d == {"drained": False, "waited_s": 30.0, "backlog": 900, "signal": "queue depth, stored count"}


def test_no_sign_at_all_waits_the_timeout_and_says_none(clock):
    d = Drain(Sampler(clock, {}), has_kafka=False).wait(20, threading.Event())
    assert d == {"drained": False, "waited_s": 20.0, "backlog": None, "signal": None}
