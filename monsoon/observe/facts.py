"""Facts about the platform under test, read from the running platform itself (``observe.facts``).

A verdict is about one version of one deployment: ThingsBoard 4.2.1 with a Kafka queue and time series in
Postgres is not ThingsBoard with an in-memory queue. The stack file says what it *means* to deploy; these facts
are what the running platform *says* it is (its actuator, its resolved configuration), read once it is ready
and before the load. The report's header, summary.json and the checklist carry them.
"""
from __future__ import annotations

import json
from typing import Any, Callable, Mapping

import requests

from monsoon.spec.stack import FactSpec

TIMEOUT_S = 5.0


class FactError(RuntimeError):
    """A fact that could not be read: one line, for the preflight."""


def pick(doc: Any, path: str) -> Any:
    """``pick({"build": {"version": "4.2.1"}}, "build.version") -> "4.2.1"``; list items by index."""
    cur = doc
    for part in path.split("."):
        if isinstance(cur, Mapping) and part in cur:
            cur = cur[part]
        elif isinstance(cur, list) and part.lstrip("-").isdigit() and -len(cur) <= int(part) < len(cur):
            cur = cur[int(part)]
        else:
            have = ", ".join(sorted(map(str, cur))[:8]) if isinstance(cur, Mapping) else type(cur).__name__
            raise FactError(f"no field {part!r} of {path!r} in the answer (it has: {have or 'nothing'})")
    return cur


def as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def read_fact(url: str, path: str, timeout: float = TIMEOUT_S) -> str:
    """GET ``url`` and return the JSON field ``path`` as text; FactError says what went wrong."""
    try:
        resp = requests.get(url, headers={"Accept": "application/json"}, timeout=timeout)
    except requests.RequestException as e:
        raise FactError(f"GET {url}: {type(e).__name__}") from None
    if resp.status_code != 200:
        raise FactError(f"GET {url}: HTTP {resp.status_code} {resp.reason}")
    try:
        doc = resp.json()
    except ValueError:
        raise FactError(f"GET {url}: not JSON ({resp.content[:60]!r})") from None
    return as_text(pick(doc, path))


def read_facts(facts: Mapping[str, FactSpec], render: Callable[[str], str]) -> tuple[dict[str, str], dict[str, str]]:
    """``({name: value}, {"observe.facts.<name>": problem})`` for every declared fact."""
    values: dict[str, str] = {}
    problems: dict[str, str] = {}
    for name, fact in facts.items():
        try:
            values[name] = read_fact(render(fact.url), fact.json_path)
        except FactError as e:
            problems[f"observe.facts.{name}"] = str(e)
    return values, problems
