"""The run timeline: append-only typed events in a JSON-lines file.

It is the single source for checks and the report.  Every event carries
``type``, ``t`` (seconds since the timeline opened, monotonic) and ``wall``
(epoch seconds).  Writers call :meth:`Timeline.add` from any thread.

Event types written by monsoon:

* ``meta``    — stack, experiment, profile, load parameters (first event)
* ``phase``   — name, start, end (planned, seconds from load start ``t0``)
* ``load``    — one per second from the fleet: sec (second index from load start), target_rate, scheduled,
  sent, acked, failed, late, connected, p50_ms, p99_ms, max_ms (ack latency from the intended send time)
* ``sample``  — one per collector per second: ``collector`` plus its values, or ``error``:
  ``process`` (up, pid, rss_mb, threads), ``metrics`` (the stack's observe.metrics signals, e.g. heap_used,
  heap_max, queue_depth, received, acked, stored, gc_seconds), ``kafka`` (lag, partitions:
  {"topic-p": {end, committed, lag}}), ``storage`` (stored), ``cgroup`` (the observed service's memory
  cgroup: oom_kill count, limit hits), ``kube`` / ``docker`` (OOMKilled, restart counts; when configured)
* ``service`` — start / ready / exit (code, cause, oom) / restart / stop of a stack service
* ``drain``   — whether the system under test drained its backlog after the load
* ``stored``  — the stored-messages export (path, rows)
* ``fault-plan`` — the fault plan's clock start (its ``t``) and its faults with their windows
* ``fault``   — one per inject / heal of a fault window: name, kind, backend, target, window, phase,
  intended and effective seconds from the plan start, landed (true/false/null), evidence (how it was measured)
* ``fault-census`` — after the final heal: what each backend swept, and what is still in place (leftovers)
* ``op``      — anything else worth journaling (provisioning, connects)
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Iterator


class Timeline:
    def __init__(self, path: Path, clock=time.monotonic, wall=time.time):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._clock, self._wall = clock, wall
        self._t0 = clock()
        self._lock = threading.Lock()
        self._fh = open(self.path, "a", buffering=1)

    def now(self) -> float:
        return self._clock() - self._t0

    def add(self, type: str, **fields: Any) -> dict:
        ev = {"type": type, "t": round(self.now(), 3), "wall": round(self._wall(), 3), **fields}
        line = json.dumps(ev, default=str)
        with self._lock:
            if not self._fh.closed:
                self._fh.write(line + "\n")
        return ev

    def close(self) -> None:
        with self._lock:
            self._fh.close()

    def __enter__(self) -> "Timeline":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_events(path: Path) -> list[dict]:
    """Read a saved timeline; a torn last line (interrupted run) is skipped."""
    out = []
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


class Events:
    """Query helpers over a loaded list of events (pure; used by checks and report)."""

    def __init__(self, events: list[dict]):
        self.events = events
        # one pass over the events: a 24 h run holds ~500k, and every check and plot asks for a few series
        self._by_type: dict[str, list[dict]] = {}
        self._samples: dict[str, list[dict]] = {}
        for e in events:
            self._by_type.setdefault(e.get("type"), []).append(e)
            if e.get("type") == "sample":
                self._samples.setdefault(e.get("collector"), []).append(e)

    @classmethod
    def load(cls, path: Path) -> "Events":
        return cls(read_events(path))

    def of(self, type: str, **match: Any) -> Iterator[dict]:
        pool = self._samples.get(match.get("collector"), []) if type == "sample" and "collector" in match \
            else self._by_type.get(type, [])
        for e in pool:
            if all(e.get(k) == v for k, v in match.items()):
                yield e

    def first(self, type: str, **match: Any) -> dict | None:
        return next(self.of(type, **match), None)

    def meta(self) -> dict:
        return self.first("meta") or {}

    def phases(self) -> list[dict]:
        """Phases with absolute timeline times (``start``/``end`` shifted by the load start)."""
        return [e for e in self.of("phase")]

    def phase(self, name: str) -> dict | None:
        return next((p for p in self.phases() if p["name"] == name), None)

    def series(self, collector: str, field: str) -> list[tuple[float, float]]:
        """(t, value) for every sample of ``collector`` that has a numeric ``field``."""
        out = []
        for e in self.of("sample", collector=collector):
            v = e.get(field)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out.append((e["t"], float(v)))
        return out
