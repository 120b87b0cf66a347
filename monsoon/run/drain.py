"""The drain after the load: wait until the stack has settled, on whichever sign it gives.

The signs, best first: the backlog (Kafka consumer lag, or the platform's queue-depth metric) at zero with the
stored count steady; or, for a stack with neither, the stored count (its ``count_query``) no longer growing.
"Steady" is judged on fresh counts only: a count query slower than the drain's 1 s look leaves the same reading
in place, and the same reading seen twice is not a count that stopped growing (the drain ended while the stored
count was still rising: 130,087 -> 136,087 in its last second, on real ThingsBoard). Every other backlog the
stack declares (a metrics signal named ``*_pending`` or ``*_backlog``, e.g. ThingsBoard's ``sql_ts_pending``:
writes queued in front of storage) must be empty too.
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

    def pending(self) -> dict[str, float]:
        """The other backlogs the stack declares: metrics signals named ``*_pending`` or ``*_backlog``."""
        vals = (getattr(self.sampler, "latest", None) or {}).get("metrics") or {}
        return {k: v for k, v in vals.items() if k.endswith(("_pending", "_backlog")) and isinstance(v, (int, float))}

    def _fresh(self, collector: str, seen: dict) -> bool:
        """Whether ``collector`` has written a sample since the last look (a sampler that cannot say: always)."""
        seq = getattr(self.sampler, "seq", None)
        if seq is None:
            return True
        n = seq(collector)
        fresh = n != seen.get(collector)
        seen[collector] = n
        return fresh

    def wait(self, timeout: float, stop: threading.Event) -> dict:
        t0 = time.monotonic()
        last_stored, stable = None, 0
        looked: dict[str, int] = {}
        seen: set[str] = set()
        backlog = None
        self.sampler.drain_begins()      # the storage count turns exact (cheap or resting during the load)
        while time.monotonic() - t0 < timeout and not stop.is_set():
            time.sleep(1.0)
            backlog = self.backlog()
            if backlog is not None and backlog < 0:   # a backlog is never negative: a wrong metric is not "empty"
                seen.add(f"{self.backlog_signal} (negative, {backlog:,.0f}: not read)")
                backlog = None                        # the stored count alone decides, as on a stack without one
            stored = self.sampler.value("storage", "stored")
            if self.sampler.value("storage", "counted") not in (None, "exact"):
                stored = None        # the load's cheap count, not yet the exact one: it cannot say "steady"
                last_stored, stable = None, 0
                if backlog is not None:
                    seen.add(self.backlog_signal)
                seen.add("stored count")
                continue
            fresh = self._fresh("storage", looked)
            if stored is None or stored != last_stored:
                stable = 0
            elif fresh:                               # the same count again, from a new sample: steady
                stable += 1
            last_stored = stored
            pending = {k: v for k, v in self.pending().items() if v > 0}
            if pending:                               # writes still queued in front of storage: not settled
                seen.add(", ".join(sorted(pending)))
                stable = 0
                backlog = backlog if backlog is not None and backlog > 0 else sum(pending.values())
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
