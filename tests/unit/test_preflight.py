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


# --- observe.facts: what the running platform says it is, read with the preflight


class _Actuator:
    """A real HTTP server on loopback answering like ThingsBoard's actuator (info, env/<property>)."""

    def __init__(self, routes: dict[str, tuple[int, bytes]]):
        import http.server
        import threading

        class H(http.server.BaseHTTPRequestHandler):
            def do_GET(self):   # noqa: N802
                status, body = routes.get(self.path, (404, b'{"status":404}'))
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def _facts_spec(facts: dict) -> StackSpec:
    return StackSpec.model_validate({**SPEC.model_dump(by_alias=True, exclude_unset=True),
                                     "observe": {"facts": facts}})


def test_facts_are_read_from_the_running_platform_and_returned():
    api = _Actuator({"/actuator/info": (200, b'{"build":{"version":"4.2.1","name":"ThingsBoard"}}'),
                     "/actuator/env/queue.type": (200, b'{"property":{"source":"env","value":"kafka"}}'),
                     "/list": (200, b'{"items":[{"v":3}]}')})
    try:
        spec = _facts_spec({"version": {"url": "{base}/actuator/info", "json": "build.version"},
                            "queue": {"url": "{base}/actuator/env/queue.type", "json": "property.value"},
                            "third": {"url": "{base}/list", "json": "items.0.v"}})
        got = preflight(spec, [], None, render=lambda s: s.replace("{base}", api.url), sleep=lambda s: None)
    finally:
        api.close()
    assert got == {"version": "4.2.1", "queue": "kafka", "third": "3"}


def test_a_fact_that_does_not_answer_stops_the_run_naming_its_key():
    api = _Actuator({"/actuator/info": (200, b'{"git":{}}')})
    try:
        spec = _facts_spec({"version": {"url": "{base}/actuator/info", "json": "build.version"},
                            "queue": {"url": "{base}/actuator/env/queue.type", "json": "property.value"}})
        got = probe(spec, [], None, lambda s: s.replace("{base}", api.url), {})
    finally:
        api.close()
    assert got["observe.facts.version"] == "no field 'build' of 'build.version' in the answer (it has: git)"
    assert got["observe.facts.queue"].endswith("/actuator/env/queue.type: HTTP 404 Not Found")


def test_facts_are_not_read_without_a_renderer():
    spec = _facts_spec({"version": {"url": "http://127.0.0.1:1/x", "json": "v"}})
    assert probe(spec, [], None) == {}


def test_the_checklist_and_result_say_what_each_platform_said_it_is(tmp_path):
    from monsoon.report.checklist import checklist, summary
    from monsoon.report.result import ExperimentResult
    res = ExperimentResult("thingsboard-kafka", "x10", "quick", tmp_path,
                           platform={"version": "4.2.1", "queue": "kafka", "ts_database": "sql"})
    d = res.to_dict()
    assert d["platform"] == {"version": "4.2.1", "queue": "kafka", "ts_database": "sql"}
    md = checklist(summary("r", "quick", [d]))
    assert "- thingsboard-kafka: version=4.2.1, queue=kafka, ts_database=sql" in md
    assert "Platforms under test" not in checklist(summary("r", "quick", [ExperimentResult("a", "b", "quick",
                                                                                           tmp_path).to_dict()]))
