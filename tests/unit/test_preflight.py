"""Preflight: a broken endpoint, metric or query stops the run before the load, naming the key."""
from __future__ import annotations

import pytest

from monsoon.observe.collectors import MetricsCollector, SqlCountCollector
from monsoon.observe.preflight import preflight, probe
from monsoon.spec.stack import StackSpec
from monsoon.spec.yamlio import SpecError

SPEC = StackSpec.model_validate({"name": "s", "source": "stacks/s.yaml", "services": {"a": {"command": ["true"]}},
                                 "devices": {"port": "1"}, "provisioning": {"kind": "none"},
                                 "storage": {"dsn": "postgresql://x", "loss_query": "SELECT 1"}})


class Metrics(MetricsCollector):
    def __init__(self, answer):
        super().__init__("http://127.0.0.1:1/metrics", {"queue_depth": "tb_queue_size", "heap": "jvm_heap"})
        self.answer = answer

    def sample(self):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


class Count(SqlCountCollector):
    def __init__(self, error=None):
        super().__init__("postgresql://x", "SELECT count(*) FROM t")
        self.error = error

    def probe(self):
        if self.error:
            raise self.error


class Source:
    def __init__(self, error=None):
        self.error, self.checked = error, 0

    def check(self):
        self.checked += 1
        if self.error:
            raise ValueError(self.error)


def test_everything_answering_passes_at_once():
    clock = [0.0]
    preflight(SPEC, [Metrics({"queue_depth": 0, "heap": 1}), Count()], Source(), sleep=lambda s: None,
              clock=lambda: clock[0])


def test_a_missing_metric_names_its_key():
    assert probe(SPEC, [Metrics({"heap": 1})], None) == {
        "observe.metrics.queue_depth": "no series 'tb_queue_size' at http://127.0.0.1:1/metrics"}


def test_a_broken_loss_query_and_count_query_name_their_keys():
    got = probe(SPEC, [Count(RuntimeError('relation "t" does not exist'))], Source('syntax error at or near "SELEC"'))
    assert got == {"storage.count_query": 'RuntimeError: relation "t" does not exist',
                   "storage.loss_query": 'syntax error at or near "SELEC"'}


def test_it_waits_for_a_slow_endpoint_then_fails_with_file_key_and_the_rest():
    t = [0.0]
    src = Source("it needs seq (name them with AS)")
    with pytest.raises(SpecError) as e:
        preflight(SPEC, [Metrics(ConnectionError("refused"))], src, within=5,
                  sleep=lambda s: t.__setitem__(0, t[0] + s), clock=lambda: t[0])
    assert src.checked == 6     # probed once a second until the window closed
    assert str(e.value).startswith("stacks/s.yaml: observe.metrics_url: ConnectionError: refused: checked before "
                                   "the load, nothing was sent (also: storage.loss_query)")


def test_an_endpoint_that_comes_up_within_the_window_passes():
    t = [0.0]
    m = Metrics(ConnectionError("refused"))
    def sleep(s):
        t[0] += s
        if t[0] >= 3:
            m.answer = {"queue_depth": 0, "heap": 1}
    preflight(SPEC, [m], Source(), within=10, sleep=sleep, clock=lambda: t[0])
