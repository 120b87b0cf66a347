"""The drain after the load: wait until the stack has settled, on whichever sign it gives.

The signs, best first: the backlog (Kafka consumer lag, or the platform's queue-depth metric) at zero with the
stored count steady; or, for a stack with neither, the stored count (its ``count_query``) no longer growing.
The ``drain`` event says which sign ended the wait (``signal``), or that the stack gives none, so a loss check
can tell "lost" from "not yet stored" and say why when it cannot.

The stored count is the exact ``count_query`` from the drain's start on: during the load the storage collector
may count cheaply (``storage.running_count_query``, or the exact count resting between runs), and until the
first exact sample arrives the count is not judged.
"""
from __future__ import annotations

import threading
import time

from monsoon.observe.sampler import Sampler

STORED_STEADY_S = 3     # seconds of an unchanged stored count that mean "settled" when there is no backlog signal


class Drain:
    """Waits until the stack's backlog is empty and storage stops moving (or the stored count alone settles)."""

    def __init__(self, sampler: Sampler, has_kafka: bool):
        self.sampler, self.has_kafka = sampler, has_kafka

    @property
    def backlog_signal(self) -> str:
        return "kafka lag" if self.has_kafka else "queue depth"

    def backlog(self) -> float | None:
        if self.has_kafka:
            return self.sampler.value("kafka", "lag")
        return self.sampler.value("metrics", "queue_depth")

    def wait(self, timeout: float, stop: threading.Event) -> dict:
        t0 = time.monotonic()
        last_stored, stable = None, 0
        seen: set[str] = set()
        backlog = None
        self.sampler.drain_begins()      # the storage count turns exact (cheap or resting during the load)
        while time.monotonic() - t0 < timeout and not stop.is_set():
            time.sleep(1.0)
            backlog = self.backlog()
            stored = self.sampler.value("storage", "stored")
            if self.sampler.value("storage", "counted") not in (None, "exact"):
                stored = None        # the load's cheap count, not yet the exact one: it cannot say "steady"
                last_stored, stable = None, 0
                if backlog is not None:
                    seen.add(self.backlog_signal)
                seen.add("stored count")
                continue
            stable = stable + 1 if (stored is not None and stored == last_stored) else 0
            last_stored = stored
            if backlog is not None:
                seen.add(self.backlog_signal)
            if stored is not None:
                seen.add("stored count")
            if backlog is not None and backlog <= 0 and (stored is None or stable >= 2):
                return self._done(True, t0, backlog, self.backlog_signal)
            if backlog is None and stored is not None and stable >= STORED_STEADY_S:
                return self._done(True, t0, backlog, "stored count")
        # not settled: say which signs there were (none at all: nothing could have told)
        return self._done(False, t0, backlog, ", ".join(sorted(seen)) or None)

    @staticmethod
    def _done(drained: bool, t0: float, backlog: float | None, signal: str | None) -> dict:
        return {"drained": drained, "waited_s": round(time.monotonic() - t0, 1), "backlog": backlog, "signal": signal}
