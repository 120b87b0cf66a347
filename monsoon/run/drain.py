"""The drain after the load: wait until the backlog is empty and storage stops moving."""
from __future__ import annotations

import threading
import time

from monsoon.observe.sampler import Sampler






class _Drain:
    """Waits until the stack's backlog is empty and storage stops moving."""

    def __init__(self, sampler: Sampler, has_kafka: bool):
        self.sampler, self.has_kafka = sampler, has_kafka

    def backlog(self) -> float | None:
        if self.has_kafka:
            return self.sampler.value("kafka", "lag")
        return self.sampler.value("metrics", "queue_depth")

    def wait(self, timeout: float, stop: threading.Event) -> dict:
        t0 = time.monotonic()
        last_stored, stable = None, 0
        while time.monotonic() - t0 < timeout and not stop.is_set():
            time.sleep(1.0)
            backlog = self.backlog()
            stored = self.sampler.value("storage", "stored")
            stable = stable + 1 if (stored is not None and stored == last_stored) else 0
            last_stored = stored
            if backlog is not None and backlog <= 0 and (stored is None or stable >= 2):
                return {"drained": True, "waited_s": round(time.monotonic() - t0, 1), "backlog": backlog}
        return {"drained": False, "waited_s": round(time.monotonic() - t0, 1), "backlog": self.backlog()}
