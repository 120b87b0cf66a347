"""Hand-made run directories for check tests (a saved timeline, acked and stored logs)."""
from __future__ import annotations

import csv
import json
from pathlib import Path


class RunBuilder:
    def __init__(self, dir: Path, base_rate: float = 100.0):
        self.dir = Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.events: list[dict] = [{"type": "meta", "t": 0.0, "wall": 0.0, "base_rate": base_rate,
                                    "profile": "quick", "stack": "s", "experiment": "e", "run_id": "r",
                                    "checks": []}]

    def ev(self, type: str, t: float, **f) -> "RunBuilder":
        self.events.append({"type": type, "t": t, "wall": 1e9 + t, **f})
        return self

    def phases(self, warmup: float, burst: float, recovery: float) -> "RunBuilder":
        self.ev("phase", 0, name="warmup", start=0, end=warmup)
        self.ev("phase", 0, name="burst", start=warmup, end=warmup + burst)
        self.ev("phase", 0, name="recovery", start=warmup + burst, end=warmup + burst + recovery)
        return self

    def service_start(self, t: float = 0.0, service: str = "platform") -> "RunBuilder":
        return self.ev("service", t, service=service, event="start", pid=1, n=1)

    def lag(self, points: list[tuple[float, float]], collector: str = "kafka",
            field: str = "lag") -> "RunBuilder":
        for t, v in points:
            self.ev("sample", t, collector=collector, **{field: v})
        return self

    def acked(self, pairs) -> "RunBuilder":
        with open(self.dir / "acked.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["device", "seq", "intended_ms", "acked_ms"])
            for d, s in pairs:
                w.writerow([d, s, 0, 1])
        return self

    def stored(self, pairs) -> "RunBuilder":
        with open(self.dir / "stored.csv", "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["device", "seq"])
            for d, s in pairs:
                w.writerow([d, s])
        return self

    def write(self) -> Path:
        with open(self.dir / "timeline.jsonl", "w") as fh:
            for e in sorted(self.events, key=lambda e: e["t"]):
                fh.write(json.dumps(e) + "\n")
        return self.dir
