"""Preflight: within seconds of the stack becoming ready, before any load, every declared endpoint answers.

The stack's storage queries run (the loss query for its columns only), its metrics endpoint is scraped and
every declared metric must be there, its Kafka bootstrap must answer, every declared fact about the platform
(``observe.facts``) must be readable; the facts read are returned. The first thing broken stops the run
before the load, as a SpecError naming the stack file and the key; a 24-hour soak does not find out at its end.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from monsoon.observe.facts import read_facts
from monsoon.observe.collectors import Collector, KafkaLagCollector, MetricsCollector, ProbeFailed, SqlCountCollector
from monsoon.observe.storage import StoredSource
from monsoon.spec.stack import StackSpec
from monsoon.spec.yamlio import SpecError

WITHIN_S = 10.0   # how long a declared endpoint may take to answer once the stack is ready


def _why(e: BaseException) -> str:
    """An error in one line: its type and message."""
    return f"{type(e).__name__}: {' '.join(str(e).split())}"


def probe(spec: StackSpec, collectors: Iterable[Collector], source: StoredSource | None,
          render: Callable[[str], str] | None = None, facts: dict[str, str] | None = None) -> dict[str, str]:
    """What does not answer now: {key: message}, in the stack file's terms. With ``render`` (the stack's
    template renderer) the declared facts are read too, into ``facts``."""
    problems: dict[str, str] = {}
    got: dict[str, Any] | None
    if render is not None and spec.observe.facts:
        got, missing = read_facts(spec.observe.facts, render)
        problems.update(missing)
        if facts is not None:
            facts.update(got)
    for c in collectors:
        try:
            if isinstance(c, SqlCountCollector):
                c.probe()        # both its queries: the exact one and the running one
                continue
            got = c.sample() if isinstance(c, (MetricsCollector, KafkaLagCollector)) else None
        except ProbeFailed as e:
            problems[e.key] = _why(e.cause)
            continue
        except Exception as e:   # any failure to answer is the finding
            key = {"metrics": "observe.metrics_url", "kafka": "observe.kafka.bootstrap",
                   "storage": "storage.count_query"}[c.name]
            problems[key] = _why(e)
            continue
        if isinstance(c, MetricsCollector):
            assert got is not None     # a MetricsCollector's sample is a dict
            for name, selector in c.selectors.items():
                if name not in got:
                    problems[f"observe.metrics.{name}"] = f"no series {selector!r} at {c.url}"
    if source is not None:
        try:
            source.check()
        except Exception as e:
            problems["storage.cql" if spec.storage.kind == "cassandra" else "storage.loss_query"] = str(e)
    return problems


def preflight(spec: StackSpec, collectors: list[Collector], source: StoredSource | None, *,
              render: Callable[[str], str] | None = None,
              within: float = WITHIN_S, sleep: Callable[[float], None] = time.sleep,
              clock: Callable[[], float] = time.monotonic) -> dict[str, str]:
    """Probe until everything answers or ``within`` seconds pass; then raise SpecError for what still does not.
    Returns the platform's facts (``observe.facts``, read with ``render``)."""
    deadline = clock() + within
    facts: dict[str, str] = {}
    while True:
        problems = probe(spec, collectors, source, render, facts)
        if not problems or clock() >= deadline:
            break
        sleep(1.0)
    if problems:
        (key, msg), *more = problems.items()
        also = f" (also: {', '.join(k for k, _ in more)})" if more else ""
        raise SpecError(spec.source, None, key, f"{msg}: checked before the load, nothing was sent{also}")
    return facts
