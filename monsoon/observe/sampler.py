"""The sampler: polls every collector about once a second into the timeline, on its own thread."""
from __future__ import annotations

import logging
import threading
import time
from typing import Any

from monsoon.observe.collectors import Collector
from monsoon.timeline.views import SILENCE_MIN_S
from monsoon.timeline.events import SAMPLE, SILENCE


class Sampler:
    """Runs collectors at a fixed period, each in its own thread, into a timeline.

    Silence is a signal: a collector that gives no answer (errors only, or a call that hangs) for
    ``SILENCE_MIN_S`` or more leaves a ``silence`` event (``collector``, ``start`` = its last answer,
    ``end`` = its next one, ``reason``), written when it answers again or when sampling stops (``open``)."""

    def __init__(self, timeline, collectors: list[Collector], period: float = 1.0):
        self.timeline, self.collectors, self.period = timeline, collectors, period
        self.latest: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._answered: dict[str, float] = {}       # collector -> timeline t of its last answer
        self._why: dict[str, str] = {}              # collector -> the first error since that answer
        self._seq: dict[str, int] = {}              # collector -> samples written (the drain's "fresh")

    def start(self) -> "Sampler":
        for c in self.collectors:
            t = threading.Thread(target=self._loop, args=(c,), name=f"collector-{c.name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def _now(self) -> float:
        now = getattr(self.timeline, "now", None)
        return now() if callable(now) else time.monotonic()

    def _answered_now(self, name: str) -> None:
        """``name`` answered (values, or nothing to sample this second): close a silence it leaves behind."""
        now, last = self._now(), self._answered.get(name)
        if last is not None and now - last >= SILENCE_MIN_S:
            self.timeline.add(SILENCE, collector=name, start=round(last, 3), end=round(now, 3),
                              reason=self._why.get(name) or f"no answer for {now - last:.0f}s")
        self._answered[name] = now
        self._why.pop(name, None)

    def _loop(self, c: Collector) -> None:
        next_t = time.monotonic()
        self._answered.setdefault(c.name, self._now())
        while not self._stop.is_set():
            try:
                values = c.sample()
                self._answered_now(c.name)
                if values is not None:            # None: the collector had nothing to sample this second
                    self.latest[c.name] = values
                    self._seq[c.name] = self._seq.get(c.name, 0) + 1
                    self.timeline.add(SAMPLE, collector=c.name, **values)
            except Exception as e:  # a down service is data, not a crash
                self.latest[c.name] = {"error": str(e)[:200]}
                self._why.setdefault(c.name, f"{type(e).__name__}: {str(e)[:200]}")
                self.timeline.add(SAMPLE, collector=c.name, error=f"{type(e).__name__}: {str(e)[:200]}")
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
        now = self._now()
        for name, last in list(self._answered.items()):   # silent until the end: marked open
            if now - last >= SILENCE_MIN_S:
                try:
                    self.timeline.add(SILENCE, collector=name, start=round(last, 3), end=round(now, 3),
                                      reason=self._why.get(name) or f"no answer for {now - last:.0f}s", open=True)
                except Exception as e:   # the timeline cannot take it: said in the log instead
                    logging.getLogger(__name__).warning("monsoon: the silence of collector %s was not recorded: %s: %s",
                                                        name, type(e).__name__, e)
        for c in self.collectors:
            try:
                c.close()
            except Exception as e:   # said; sampling is over, the collector's samples are written already
                logging.getLogger(__name__).warning("monsoon: collector %s did not close: %s: %s",
                                                    getattr(c, "name", c), type(e).__name__, e)

    def seq(self, collector: str) -> int:
        """How many samples ``collector`` has written: a reading is fresh when this has moved."""
        return self._seq.get(collector, 0)

    def value(self, collector: str, key: str) -> Any:
        return self.latest.get(collector, {}).get(key)
