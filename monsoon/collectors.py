"""Collectors: each samples one signal of a live stack into the timeline at 1 Hz.

A collector's ``sample()`` returns a dict of values or raises; the
``Sampler`` runs each collector in its own thread (so a slow one can't delay
the others), writes a ``sample`` event per call (``error`` on failure) and
keeps the latest values for the runner (drain detection, progress).
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable

import requests
from prometheus_client.parser import text_string_to_metric_families

log = logging.getLogger(__name__)


class Collector:
    name = "collector"

    def sample(self) -> dict[str, Any]:
        raise NotImplementedError

    def close(self) -> None:
        pass


class ProcessCollector(Collector):
    """RSS and thread count of one stack service's current process (follows restarts)."""

    name = "process"

    def __init__(self, pid_of: Callable[[], int | None]):
        self.pid_of = pid_of

    def sample(self) -> dict[str, Any]:
        pid = self.pid_of()
        if pid is None:
            return {"up": 0}
        out: dict[str, Any] = {"up": 1, "pid": pid}
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    out["rss_mb"] = round(int(line.split()[1]) / 1024, 1)
                elif line.startswith("Threads:"):
                    out["threads"] = int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            return {"up": 0}
        return out


def parse_selector(sel: str) -> tuple[str, dict[str, str]]:
    """``name{a="b",c="d"}`` -> (name, {a: b, c: d})."""
    if "{" not in sel:
        return sel.strip(), {}
    name, rest = sel.split("{", 1)
    labels = {}
    for part in rest.rstrip("}").split(","):
        if part.strip():
            k, v = part.split("=", 1)
            labels[k.strip()] = v.strip().strip('"')
    return name.strip(), labels


def select_metrics(text: str, selectors: dict[str, str]) -> dict[str, float]:
    """Sum of the samples matching each selector in a Prometheus text exposition."""
    wanted = {sig: parse_selector(sel) for sig, sel in selectors.items()}
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            for sig, (name, labels) in wanted.items():
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    out[sig] = out.get(sig, 0.0) + float(s.value)
    return out


class MetricsCollector(Collector):
    """Scrapes a Prometheus endpoint and keeps the configured signals."""

    name = "metrics"

    def __init__(self, url: str, selectors: dict[str, str], timeout: float = 0.8):
        self.url, self.selectors, self.timeout = url, selectors, timeout
        self.session = requests.Session()

    def sample(self) -> dict[str, Any]:
        r = self.session.get(self.url, timeout=self.timeout)
        r.raise_for_status()
        return select_metrics(r.text, self.selectors)

    def close(self) -> None:
        self.session.close()


class KafkaLagCollector(Collector):
    """Consumer-group lag: log-end offset minus committed offset, per partition (confluent-kafka admin API)."""

    name = "kafka"

    def __init__(self, bootstrap: str, group: str, topic: str | None, timeout: float = 0.9):
        from confluent_kafka.admin import AdminClient
        self.group, self.topic, self.timeout = group, topic, timeout
        self.admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 2000,
                                  "log_level": 0, "logger": logging.getLogger("monsoon.kafka-admin")})

    def sample(self) -> dict[str, Any]:
        from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition
        from confluent_kafka.admin import OffsetSpec
        fut = self.admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(self.group)],
                                                     request_timeout=self.timeout)
        committed = {(tp.topic, tp.partition): tp.offset
                     for tp in fut[self.group].result().topic_partitions or []}
        topics = {self.topic} if self.topic else {t for t, _ in committed}
        md = self.admin.list_topics(timeout=self.timeout)
        req = {}
        for t in topics:
            if t in md.topics:
                for p in md.topics[t].partitions:
                    req[TopicPartition(t, p)] = OffsetSpec.latest()
        if not req:
            return {"lag": 0, "partitions": {}, "topic_missing": 1}
        ends = {(tp.topic, tp.partition): f.result().offset
                for tp, f in self.admin.list_offsets(req, request_timeout=self.timeout).items()}
        parts, total = {}, 0
        for key, end in ends.items():
            c = committed.get(key, -1)
            lag = end - c if c >= 0 else end  # nothing committed yet: everything is lag
            total += max(lag, 0)
            parts[f"{key[0]}-{key[1]}"] = {"end": end, "committed": c, "lag": max(lag, 0)}
        return {"lag": total, "partitions": parts}


class SqlCountCollector(Collector):
    """Stored messages so far, from the stack's count query."""

    name = "storage"

    def __init__(self, dsn: str, query: str):
        self.dsn, self.query = dsn, query
        self.conn = None

    def sample(self) -> dict[str, Any]:
        import psycopg
        try:
            if self.conn is None or self.conn.closed:
                self.conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=2,
                                            options="-c statement_timeout=2000")
            (n,) = self.conn.execute(self.query).fetchone()
            return {"stored": int(n or 0)}
        except Exception:
            if self.conn is not None:
                self.conn.close()
            self.conn = None
            raise

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()


class Sampler:
    """Runs collectors at a fixed period, each in its own thread, into a timeline."""

    def __init__(self, timeline, collectors: list[Collector], period: float = 1.0):
        self.timeline, self.collectors, self.period = timeline, collectors, period
        self.latest: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> "Sampler":
        for c in self.collectors:
            t = threading.Thread(target=self._loop, args=(c,), name=f"collector-{c.name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _loop(self, c: Collector) -> None:
        next_t = time.monotonic()
        while not self._stop.is_set():
            try:
                values = c.sample()
                self.latest[c.name] = values
                self.timeline.add("sample", collector=c.name, **values)
            except Exception as e:  # a down service is data, not a crash
                self.latest[c.name] = {"error": str(e)[:200]}
                self.timeline.add("sample", collector=c.name, error=f"{type(e).__name__}: {str(e)[:200]}")
            next_t += self.period
            delay = next_t - time.monotonic()
            if delay < 0:  # fell behind: skip the missed ticks rather than burst
                next_t = time.monotonic()
                delay = 0
            self._stop.wait(delay)

    def stop(self) -> None:
        """Stop sampling and close the collectors; idempotent (the runner stops it before the export
        and again on every exit path)."""
        if self._stop.is_set():
            return
        self._stop.set()
        for t in self._threads:
            t.join(timeout=5)
        for c in self.collectors:
            try:
                c.close()
            except Exception:
                pass

    def value(self, collector: str, key: str) -> Any:
        return self.latest.get(collector, {}).get(key)


def collectors_for(stack) -> list[Collector]:
    """The collectors a running :class:`~monsoon.stack.Stack` supports, from its ``observe`` section."""
    spec = stack.spec
    out: list[Collector] = []
    obs = spec.observe
    if obs.service:
        out.append(ProcessCollector(lambda: stack.pid(obs.service)))
    if obs.metrics_url and obs.metrics:
        out.append(MetricsCollector(stack.endpoint(obs.metrics_url), dict(obs.metrics)))
    if obs.kafka:
        out.append(KafkaLagCollector(stack.endpoint(obs.kafka.bootstrap), obs.kafka.group, obs.kafka.topic))
    if spec.storage.count_query:
        out.append(SqlCountCollector(stack.endpoint(spec.storage.dsn), spec.storage.count_query))
    return out
