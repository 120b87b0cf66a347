"""The HTML report, rendered by a real browser (headless Chromium) on a hand-made saved run.

Two experiments, written the way the runner writes them: in-memory x10 (a burst,
heap filling up, an OOM exit and a restart, queue depth, acked messages lost) and
Kafka x10 (consumer lag per partition that drains, a fault window, nothing lost).
``monsoon.report.write.write`` must produce ``report.html`` with the checklist on top and six
decodable plots per experiment; Chromium loads it and a probe script (injected into
a *copy*, the report itself has no JS) records every image's decoded size.
"""
from __future__ import annotations

import base64
import csv
import io
import json
import logging
import math
import shutil
import subprocess
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from monsoon.report import html as html_report, write as report
from monsoon.checks.registry import evaluate

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None, reason="headless Chromium is not installed (Debian package `chromium`: "
                             "apt-get install -y --no-install-recommends chromium)")

RUN_ID = "20260101-120000-beef"
PLOTS = ["rate", "latency", "backlog", "memory", "gc", "stored"]
MB = 1024 * 1024
CHECKS = [{"name": "no_oom", "params": {}}, {"name": "no_acked_loss", "params": {}},
          {"name": "lag_recovers_within", "params": {"seconds": 120}}]


# ------------------------------------------------------------------ a saved run, by hand

class Exp:
    def __init__(self, run_dir: Path, stack: str, experiment: str):
        self.dir = run_dir / f"{stack}--{experiment}"
        self.dir.mkdir(parents=True)
        self.events = [{"type": "meta", "t": 0.0, "wall": 1.7e9, "run_id": RUN_ID, "stack": stack,
                        "experiment": experiment, "profile": "quick", "base_rate": 300, "shape": "burst",
                        "multiplier": 10, "devices": 50, "qos": 1, "checks": CHECKS}]

    def ev(self, type: str, t: float, **f) -> None:
        self.events.append({"type": type, "t": round(t, 3), "wall": round(1.7e9 + t, 3), **f})

    def write(self, acked: list[tuple[str, int]], stored: list[tuple[str, int]]) -> None:
        self.events.sort(key=lambda e: e["t"])
        with open(self.dir / "timeline.jsonl", "w") as fh:
            for e in self.events:
                fh.write(json.dumps(e) + "\n")
        for name, rows, head in (("acked.csv", acked, ["device", "seq", "intended_ms", "acked_ms"]),
                                 ("stored.csv", stored, ["device", "seq"])):
            with open(self.dir / name, "w", newline="") as fh:
                w = csv.writer(fh)
                w.writerow(head)
                for d, s in rows:
                    w.writerow([d, s] + ([0, 1] if name == "acked.csv" else []))


T0, WARMUP, BURST, RECOVERY = 5.0, 15.0, 60.0, 90.0   # load starts at t=5s on the timeline
OOM_T, RESTART_T = T0 + WARMUP + 38.0, T0 + WARMUP + 44.0


def _target(t: float) -> float:
    return 3000.0 if T0 + WARMUP <= t < T0 + WARMUP + BURST else 300.0


def _common(x: Exp) -> None:
    x.ev("service", 0.5, service="postgres", event="start", pid=100, n=1)
    x.ev("service", 1.0, service="platform", event="start", pid=101, n=1)
    x.ev("service", 3.0, service="platform", event="ready", after_s=2.0)
    for name, a, b in (("warmup", 0, WARMUP), ("burst", WARMUP, WARMUP + BURST),
                       ("recovery", WARMUP + BURST, WARMUP + BURST + RECOVERY)):
        x.ev("phase", T0, name=name, start=T0 + a, end=T0 + b)


def build_inmemory(run_dir: Path) -> Exp:
    """x10 on an in-memory queue: heap fills, OOM at 38 s into the burst, restart, queued messages lost."""
    x = Exp(run_dir, "inmemory", "burst-x10")
    _common(x)
    end = T0 + WARMUP + BURST + RECOVERY
    heap, queue, gc, stored, alive = 200 * MB, 0.0, 0.0, 0, True
    for i in range(int(end) + 1):
        t = float(i)
        alive = not (OOM_T <= t < RESTART_T)
        if t >= T0 and t < end:
            target = _target(t)
            capacity = 1500.0
            acked = 0 if not alive else target
            if alive and target > capacity:
                queue += target - capacity
            elif alive:
                queue = max(0.0, queue - (capacity - target))
            p50 = 4 + queue / 400 if alive else None
            x.ev("load", t + 0.01, sec=int(t - T0), target_rate=target, scheduled=target, sent=target,
                 acked=acked, failed=0 if alive else target, late=0, connected=50 if alive else 0,
                 p50_ms=p50, p99_ms=(p50 * 6 if p50 else None), max_ms=(p50 * 9 if p50 else None))
            stored += int(min(target, capacity)) if alive else 0
        if OOM_T <= t < OOM_T + 1:
            x.ev("service", t + 0.2, service="platform", event="exit", code=3, oom=True,
                 cause="java.lang.OutOfMemoryError: Java heap space")
            queue, heap = 0.0, 0
        if RESTART_T <= t < RESTART_T + 1:
            x.ev("service", t + 0.1, service="platform", event="restart", n=2)
            x.ev("service", t + 0.1, service="platform", event="start", pid=202, n=2)
            heap, gc = 150 * MB, 0.0
        if alive:
            heap = min(1000 * MB, 200 * MB + queue * 14_000 + 30 * MB * math.sin(t / 3) ** 2)
            gc += 0.01 + 0.5 * (heap / (1024 * MB)) ** 4
            x.ev("sample", t + 0.3, collector="metrics", heap_used=heap, heap_max=1024 * MB,
                 queue_depth=queue, gc_seconds=round(gc, 4), received=stored, stored=stored)
            x.ev("sample", t + 0.31, collector="process", up=True, pid=101, rss_mb=300 + heap / MB * 1.1,
                 threads=60)
        else:
            x.ev("sample", t + 0.3, collector="metrics", error="ConnectionRefusedError: [Errno 111]")
            x.ev("sample", t + 0.31, collector="process", up=False)
        x.ev("sample", t + 0.32, collector="storage", stored=stored)
    x.ev("op", end, op="load-end", sent=1, acked=1)
    x.ev("drain", end + 5, drained=True, backlog=0, waited_s=5)
    acked = [(f"d{d}", s) for d in range(5) for s in range(200)]
    x.write(acked, [p for p in acked if p[1] < 150])       # 250 acked messages lost
    return x


def build_kafka(run_dir: Path) -> Exp:
    """x10 on a Kafka queue: lag builds during the burst and drains; a fault window; nothing lost."""
    x = Exp(run_dir, "kafka", "burst-x10")
    _common(x)
    # the events a FaultPlan writes: its clock start, then inject/heal with plan-relative "effective" times
    x.ev("fault-plan", T0, run_id="r", horizon=WARMUP + BURST + RECOVERY, faults=[])
    for phase, eff in (("inject", 90.0), ("heal", 120.0)):
        x.ev("fault", T0 + eff + 0.2, name="network-latency", kind="network-latency", backend="toxiproxy",
             target="platform->kafka", window=0, phase=phase, intended=eff, effective=eff, landed=True, evidence={})
    end = T0 + WARMUP + BURST + RECOVERY
    ends, committed, stored, gc = [0, 0, 0], [0, 0, 0], 0, 0.0
    for i in range(int(end) + 60):  # sampling goes on while the backlog drains after the load
        t = float(i)
        target = _target(t) if T0 <= t < end else 0.0
        if T0 <= t < end:
            x.ev("load", t + 0.01, sec=int(t - T0), target_rate=target, scheduled=target, sent=target,
                 acked=target * (0.97 if target > 1000 else 1.0), failed=0, late=0, connected=50,
                 p50_ms=3.0 + (2 if target > 1000 else 0), p99_ms=12.0 + (30 if target > 1000 else 0),
                 max_ms=80.0)
        consume = 1400.0 if not (T0 + 90 <= t < T0 + 120) else 900.0
        parts = {}
        for p in range(3):
            ends[p] += int(target / 3)
            committed[p] = min(ends[p], committed[p] + int(consume / 3))
            parts[f"telemetry-{p}"] = {"end": ends[p], "committed": committed[p], "lag": ends[p] - committed[p]}
        stored = sum(committed)
        x.ev("sample", t + 0.3, collector="kafka", lag=sum(v["lag"] for v in parts.values()), partitions=parts)
        heap = 300 * MB + 200 * MB * abs(math.sin(t / 7))
        gc += 0.005 + 0.02 * (heap / (1024 * MB))
        x.ev("sample", t + 0.31, collector="metrics", heap_used=heap, heap_max=1024 * MB, gc_seconds=round(gc, 4),
             stored=stored)
        x.ev("sample", t + 0.32, collector="process", up=True, pid=101, rss_mb=700 + heap / MB * 0.2, threads=80)
        x.ev("sample", t + 0.33, collector="storage", stored=stored)
    x.ev("op", end, op="load-end", sent=1, acked=1)
    x.ev("drain", end + 59, drained=True, backlog=0, waited_s=59)
    acked = [(f"d{d}", s) for d in range(5) for s in range(200)]
    x.write(acked, acked + acked[:3])
    return x


def make_run(tmp_path: Path) -> tuple[Path, list[dict]]:
    run_dir = tmp_path / "runs" / RUN_ID
    results = []
    for x in (build_inmemory(run_dir), build_kafka(run_dir)):
        meta = x.events[0]
        checks = evaluate(x.dir, [(c["name"], c["params"]) for c in CHECKS])
        results.append({"stack": meta["stack"], "experiment": meta["experiment"],
                        "verdict": max((c.verdict for c in checks), key=["pass", "unknown", "fail"].index),
                        "checks": [c.to_dict() for c in checks], "dir": str(x.dir)})
    return run_dir, results


EXPECTED = {("inmemory", "burst-x10", "no_oom"): "fail",
            ("inmemory", "burst-x10", "no_acked_loss"): "fail",
            ("inmemory", "burst-x10", "lag_recovers_within"): "fail",   # its queue vanished with the OOM'd heap
            ("kafka", "burst-x10", "no_oom"): "pass",
            ("kafka", "burst-x10", "no_acked_loss"): "pass",
            ("kafka", "burst-x10", "lag_recovers_within"): "pass"}


# ------------------------------------------------------------------ Chromium

def chromium(tmp_path: Path, *args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    profile = tmp_path / f"chromium-profile-{time.monotonic_ns()}"
    profile.mkdir()
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           "--disable-dev-shm-usage", "--hide-scrollbars", f"--user-data-dir={profile}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)


PROBE = """<script>
window.addEventListener('load', function () {
  document.querySelectorAll('img[data-plot]').forEach(function (img) {
    img.setAttribute('data-probe-complete', String(img.complete));
    img.setAttribute('data-probe-width', String(img.naturalWidth));
    img.setAttribute('data-probe-height', String(img.naturalHeight));
  });
  document.body.setAttribute('data-probe-done', '1');
});
</script></body>"""


class Dom(HTMLParser):
    """Document-order list of the elements the test cares about."""

    def __init__(self):
        super().__init__()
        self.order: list[tuple[str, dict]] = []
        self.rows: list[dict] = []
        self.imgs: list[dict] = []
        self.section: dict | None = None
        self.body: dict = {}

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if tag == "section":
            self.section = a
            self.order.append(("section", a))
        elif tag == "table":
            self.order.append(("table", a))
        elif tag == "div" and a.get("id") == "decision":
            self.order.append(("decision", a))
        elif tag == "tr" and "data-verdict" in a:
            self.rows.append(a)
        elif tag == "img":
            self.imgs.append({**a, "_section": (self.section or {}).get("id")})


def parse(text: str) -> Dom:
    d = Dom()
    d.feed(text)
    return d


# ------------------------------------------------------------------ the tests

@needs_chromium
def test_report_html_renders_in_chromium(tmp_path):
    from PIL import Image

    run_dir, results = make_run(tmp_path)
    report.write(run_dir, RUN_ID, "quick", results)
    page = run_dir / "report.html"
    assert (run_dir / "summary.json").exists() and (run_dir / "checklist.md").exists()
    text = page.read_text()
    # one self-contained file: nothing fetched from anywhere
    assert "<script" not in text and "<link" not in text and "@import" not in text and "url(" not in text
    assert 'src="http' not in text and "src='http" not in text

    probe = tmp_path / "probe.html"
    probe.write_text(text.replace("</body>", PROBE, 1))
    res = chromium(tmp_path, "--virtual-time-budget=10000", "--dump-dom", probe.as_uri())
    assert res.returncode == 0, res.stderr[-2000:]
    dom = parse(res.stdout)
    assert dom.body.get("data-probe-done") == "1", "Chromium did not finish loading the page"

    # the checklist is on top: decision, then the table, before any experiment
    kinds = [k for k, a in dom.order if k in ("decision", "table") or "experiment" in a.get("class", "")]
    assert kinds[:2] == ["decision", "table"], kinds[:4]
    decision = next(a for k, a in dom.order if k == "decision")
    assert decision["data-decision"] == "NO-GO" and "nogo" in decision["class"]
    got = {(r["data-stack"], r["data-experiment"], r["data-check"]): r["data-verdict"] for r in dom.rows}
    assert got == EXPECTED
    md = (run_dir / "checklist.md").read_text()
    assert md.count("\n| inmemory | burst-x10 ") + md.count("\n| kafka | burst-x10 ") == len(dom.rows)  # as checklist.md
    # one experiment on two stacks: their figures side by side, in the report and the checklist
    assert "## Side by side: burst-x10" in md and 'class="side-by-side" data-experiment="burst-x10"' in text
    assert "OutOfMemoryError" in text and "acked messages lost" in text     # the evidence messages

    # every plot of every experiment is there, decoded by Chromium and a non-trivial PNG
    sections = [a for k, a in dom.order if k == "section" and "experiment" in a.get("class", "")]
    assert [(s["data-stack"], s["data-experiment"], s["data-verdict"]) for s in sections] == \
        [("inmemory", "burst-x10", "fail"), ("kafka", "burst-x10", "pass")]
    for s in sections:
        imgs = [i for i in dom.imgs if i["_section"] == s["id"]]
        assert [i["data-plot"] for i in imgs] == PLOTS, s["id"]
        for i in imgs:
            where = f"{s['id']} / {i['data-plot']}"
            assert i["data-has-data"] == "true", where
            assert i["data-probe-complete"] == "true" and int(i["data-probe-width"]) >= 800, (where, i)
            assert int(i["data-probe-height"]) >= 200, where
            head, b64 = i["src"].split(",", 1)
            assert head == "data:image/png;base64", where
            png = base64.b64decode(b64, validate=True)
            assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 15_000, (where, len(png))
            im = Image.open(io.BytesIO(png)).convert("RGB")
            assert im.size == (int(i["data-probe-width"]), int(i["data-probe-height"]))
            assert len(im.getcolors(maxcolors=1 << 20) or []) > 50, f"{where}: looks blank"
        assert len({i["id"] for i in imgs}) == 6

    # a screenshot, for a human to look at (kept next to the run)
    shot = run_dir / "report-screenshot.png"
    res = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,4000", page.as_uri())
    assert res.returncode == 0 and shot.exists(), res.stderr[-2000:]
    assert Image.open(shot).size == (1400, 4000) and shot.stat().st_size > 100_000


def test_missing_data_says_no_data(tmp_path):
    run_dir = tmp_path / "r1"
    x = Exp(run_dir, "bare", "steady")
    x.write([], [])
    report.write(run_dir, "r1", "quick", [{"stack": "bare", "experiment": "steady", "verdict": "unknown",
                                           "checks": [], "error": "RuntimeError: stack never came up"}])
    dom = parse((run_dir / "report.html").read_text())
    assert [i["data-plot"] for i in dom.imgs] == PLOTS
    assert all(i["data-has-data"] == "false" for i in dom.imgs)
    assert all(len(base64.b64decode(i["src"].split(",", 1)[1])) > 3000 for i in dom.imgs)
    assert [r["data-check"] for r in dom.rows] == ["(run)"]


def test_plot_failure_keeps_summary_and_checklist(tmp_path, monkeypatch, caplog):
    run_dir, results = make_run(tmp_path)

    def boom(*a, **k):
        raise RuntimeError("matplotlib exploded")
    monkeypatch.setattr(html_report, "render", boom)
    with caplog.at_level(logging.WARNING, logger="monsoon.report"):
        s, md = report.write(run_dir, RUN_ID, "quick", results)
    assert json.loads((run_dir / "summary.json").read_text())["run_id"] == RUN_ID
    assert (run_dir / "checklist.md").read_text() == md
    assert not (run_dir / "report.html").exists()
    assert "report.html not written" in caplog.text and "matplotlib exploded" in caplog.text


def test_analyze_regenerates_report_html(tmp_path, capsys):
    from monsoon import cli
    run_dir, _ = make_run(tmp_path)
    assert not (run_dir / "report.html").exists()
    rc = cli.main(["analyze", str(run_dir)])
    assert rc == 1  # in-memory x10 fails, as it should
    dom = parse((run_dir / "report.html").read_text())
    got = {(r["data-stack"], r["data-experiment"], r["data-check"]): r["data-verdict"] for r in dom.rows}
    assert got == EXPECTED
    assert len(dom.imgs) == 12 and all(i["data-has-data"] == "true" for i in dom.imgs)


def test_downsample_keeps_peaks_and_bounds_points():
    import numpy as np
    t = np.arange(86_400, dtype=float)
    y = np.zeros_like(t)
    y[43_210] = 1e6                                   # a one-second spike in a day
    for how in ("mean", "max", "minmax"):
        xs, ys = html_report.downsample(t, y, 2000, how)
        assert len(xs) == len(ys) <= 2000
        assert xs[0] >= 0 and xs[-1] <= 86_399
    assert html_report.downsample(t, y, 2000, "max")[1].max() == 1e6
    assert html_report.downsample(t, y, 2000, "minmax")[1].max() == 1e6
