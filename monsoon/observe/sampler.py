"""The sampler: polls every collector about once a second into the timeline, on its own thread."""
from __future__ import annotations

import threading
import time
from typing import Any

from monsoon.observe.collectors import Collector


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
                if values is not None:            # None: the collector had nothing to sample this second
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

    def drain_begins(self) -> None:
        """The load is over: every collector reports exact values from now on (the storage count)."""
        for c in self.collectors:
            c.drain_begins()

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
