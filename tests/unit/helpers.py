"""Hand-made run directories for check tests (a saved timeline, acked and stored logs), and the string
constants of a module's code (for the tests that keep a name with its one owner)."""
from __future__ import annotations

import ast
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

    def phase(self, name: str, start: float, end: float) -> "RunBuilder":
        return self.ev("phase", 0, name=name, start=start, end=end)

    def kafka(self, t: float, parts: dict[str, tuple[int, int]]) -> "RunBuilder":
        """One kafka poll: {"topic-p": (end, committed)}; committed -1 = nothing committed."""
        ps = {n: {"end": e, "committed": c, "lag": max(e - c, 0) if c >= 0 else e} for n, (e, c) in parts.items()}
        return self.ev("sample", t, collector="kafka", lag=sum(p["lag"] for p in ps.values()), partitions=ps)

    def kafka_error(self, t: float) -> "RunBuilder":
        return self.ev("sample", t, collector="kafka", error="KafkaException: broker unreachable")

    def load(self, sec: int, scheduled: int, acked: int, failed: int = 0, p50: float | None = 20.0,
             p99: float | None = 80.0, max_ms: float | None = 120.0, t0: float = 0.0) -> "RunBuilder":
        """One second of the fleet's load (written just after the second ends, as the runner does)."""
        return self.ev("load", t0 + sec + 1.0, sec=sec, target_rate=float(scheduled), scheduled=scheduled,
                       sent=scheduled, acked=acked, failed=failed, late=0, connected=1, p50_ms=p50, p99_ms=p99,
                       max_ms=max_ms)

    def metrics(self, t: float, **fields) -> "RunBuilder":
        return self.ev("sample", t, collector="metrics", **fields)

    def process(self, t: float, rss_mb: float, pid: int = 1) -> "RunBuilder":
        return self.ev("sample", t, collector="process", up=1, pid=pid, rss_mb=rss_mb, threads=40)

    def gc_log(self, text: str, service: str = "platform") -> "RunBuilder":
        d = self.dir / "services" / service
        d.mkdir(parents=True, exist_ok=True)
        (d / "gc.log").write_text(text)
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


def code_strings(path: Path) -> set[str]:
    """The string constants of a module's code: docstrings (of the module, its classes and functions) left out."""
    tree = ast.parse(Path(path).read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)
            and id(n) not in docs}


# ------------------------------------------------------------ real runs kept as fixtures (tests/fixtures/)

#: the checks that read the acked/stored/sent datasets, which a fixture keeps for some devices only
DATASET_CHECKS = {"no_acked_loss", "no_duplicates", "no_unexpected"}


def rejudge(kept: Path, tmp_path: Path) -> tuple[dict, dict]:
    """(the checks of a copy of the kept experiment folder judged again with ``monsoon analyze``, by name; the
    run's own result.json). Never in place: analyze writes into the tree it reads."""
    import shutil
    from monsoon.analysis import analyze
    recorded = json.loads((kept / "result.json").read_text())
    shutil.copytree(kept, tmp_path / "run" / f"{recorded['stack']}--{recorded['experiment']}")
    (result,) = analyze(tmp_path / "run")["results"]
    return {c["name"]: c for c in result["checks"]}, recorded


def assert_as_recorded(got: dict, recorded: dict) -> None:
    """The run's verdicts again; and its figures again where the check reads only what was kept whole."""
    assert {n: c["verdict"] for n, c in got.items()} == {c["name"]: c["verdict"] for c in recorded["checks"]}
    for c in recorded["checks"]:
        if c["name"] not in DATASET_CHECKS:
            now = got[c["name"]]["figures"]
            assert {k: now.get(k) for k in c["figures"]} == c["figures"], c["name"]
