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

    def drain_begins(self):
        self.began = self.clock.t

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


def test_the_drain_waits_for_the_exact_count_after_the_loads_cheap_one(clock):
    """During the load the stored count may be an estimate; the drain turns it exact and judges only that."""
    script = {("kafka", "lag"): [0], ("storage", "stored"): [90, 90, 90, 100, 100, 100],
              ("storage", "counted"): ["estimate", "estimate", "estimate", "exact"]}
    s = Sampler(clock, script)
    d = Drain(s, has_kafka=True).wait(120, threading.Event())
    assert s.began == 0.0                       # told before the first look
    assert d["drained"] and d["waited_s"] == 6.0    # not at 3 s on the steady estimate: 4, 5, 6 exact


def test_the_storage_count_is_cheap_during_the_load_and_exact_from_the_drain():
    from monsoon.observe.collectors import SqlCountCollector
    t = [0.0]
    c = SqlCountCollector("postgresql://x", "SELECT count(*) FROM m", clock=lambda: t[0])
    assert c.plan() == "exact"
    t[0] = 0.5
    c.took("exact", 0.0)                        # a full count of 0.5 s rests 5 s: at most 10 % of the time
    plans = []
    for t[0] in (1.0, 4.9, 5.0):
        plans.append(c.plan())
    assert plans == [None, None, "exact"]
    c.drain_begins()
    t[0] = 5.5
    c.took("exact", 5.0)
    assert c.plan() == "exact"                  # the drain counts every second, whatever it costs
    est = SqlCountCollector("postgresql://x", "SELECT count(*) FROM m", "SELECT reltuples::bigint FROM pg_class")
    inc = SqlCountCollector("postgresql://x", "SELECT count(*) FROM m",
                            "SELECT count(*), max(id) FROM m WHERE id > coalesce(%(since)s, 0)")
    assert (est.plan(), inc.plan()) == ("estimate", "incremental")
    assert [inc.add(r) for r in [(3, 100), (0, None), (None, None), (2, 105)]] == [3, 3, 3, 5] and inc.since == 105
    est.drain_begins()
    inc.drain_begins()
    assert (est.plan(), inc.plan()) == ("exact", "exact")


class SlowCount(Sampler):
    """A stored count whose query takes ``every`` seconds: the same reading stays in place between samples."""

    def __init__(self, clock, script, every):
        super().__init__(clock, script)
        self.every = every

    def seq(self, collector):
        return (int(self.clock.t) - 1) // self.every if collector == "storage" else int(self.clock.t)

    def value(self, collector, key):
        if collector != "storage":
            return super().value(collector, key)
        seq, n = self.script.get((collector, key)), (int(self.clock.t) - 1) // self.every
        return seq[min(n, len(seq) - 1)] if seq else None


def test_a_slow_count_read_twice_is_not_a_steady_count(clock):
    # real TB: the drain ended while the stored count still rose (130,087 -> 136,087 in its last second)
    s = SlowCount(clock, {("kafka", "lag"): [0], ("storage", "stored"): [130087, 136087, 140000, 140000, 140000,
                                                                          140000]}, every=3)
    d = Drain(s, has_kafka=True).wait(120, threading.Event())
    assert d["drained"] and d["waited_s"] == 13.0      # three fresh counts of 140,000 (samples at 7, 10, 13 s), not 3 s


def test_writes_still_queued_in_front_of_storage_keep_the_drain_waiting(clock):
    s = Sampler(clock, {("metrics", "queue_depth"): [0], ("storage", "stored"): [5, 5, 5, 5, 5, 5]})
    s.latest = {"metrics": {"queue_depth": 0, "sql_ts_pending": 127000}}
    d = Drain(s, has_kafka=False).wait(10, threading.Event())
    assert d == {"drained": False, "waited_s": 10.0, "backlog": 127000,
                 "signal": "queue depth, sql_ts_pending, stored count"}
    s.latest["metrics"]["sql_ts_pending"] = 0
    assert Drain(s, has_kafka=False).wait(10, threading.Event())["drained"]


def test_a_negative_backlog_is_not_read_as_drained(clock):
    """A user's wrong queue-depth formula read -1,121: the drain took it for empty while storage still moved.
    Now the stored count alone decides (it must settle), and the negative gauge is named."""
    s = Sampler(clock, {("metrics", "queue_depth"): [-166, -500, -1121],
                        ("storage", "stored"): [100, 150, 180, 190, 190, 190, 190, 190]})
    d = Drain(s, has_kafka=False).wait(120, threading.Event())
    assert d["drained"] and d["signal"] == "stored count" and d["waited_s"] == 7.0, d
    s = Sampler(clock, {("metrics", "queue_depth"): [-5]})
    clock.t = 0.0
    d = Drain(s, has_kafka=False).wait(20, threading.Event())
    assert d == {"drained": False, "waited_s": 20.0, "backlog": None, "signal": "queue depth (negative, -5: not read)"}
