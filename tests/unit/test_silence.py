"""Verdicts when a platform goes silent: a backlog not seen draining is not drained, a collector that stops
answering leaves a mark, on reduced copies of real timelines."""
import shutil
import threading
import time
from pathlib import Path

from monsoon.checks.base import FAIL, PASS, UNKNOWN, RunData
from monsoon.checks.lag import lag_recovers_within
from monsoon.observe.collectors import Collector
from monsoon.timeline.store import Events
from monsoon.timeline.views import silences
from tests.unit.helpers import RunBuilder

import monsoon.observe.sampler as sampler_mod


def run(b: RunBuilder) -> RunData:
    return RunData(b.write())


def tb_inmemory_x10(tmp_path, storage: bool = True, accounting: bool = False) -> RunBuilder:
    """Reduced copy of real ThingsBoard 4.2.1 with its in-memory queue, x10 burst (quick profile, 100 devices,
    x1 = 1,500 msg/s): the queue reached 81,877, then GC-thrashing TB stopped answering its metrics (~31 s
    without a sample), died of OutOfMemoryError at t=242, was ready again at 297.7, reported 0 at 300.7,
    refilled to 25,361 and drained that second backlog by t=369 (62.7 s after the burst end)."""
    b = RunBuilder(tmp_path, base_rate=1500)
    b.ev("phase", 0, name="warmup", start=126.3, end=186.3)
    b.ev("phase", 0, name="burst", start=186.3, end=306.3)
    b.ev("phase", 0, name="recovery", start=306.3, end=426.3)
    b.service_start(100.0)
    depth = [(130.0, 400.0), (150.0, 20000.0), (155.0, 5000.0), (186.0, 600.0), (190.0, 12000.0),
             (195.0, 30000.0), (200.0, 52000.0), (205.0, 66000.0), (210.0, 78743.0), (211.0, 81877.0),
             (300.7, 0.0), (310.0, 9000.0), (320.0, 18000.0), (330.0, 25361.0), (340.0, 20000.0),
             (350.0, 12000.0), (360.0, 5000.0), (368.0, 1800.0), (369.0, 1400.0), (380.0, 0.0), (400.0, 0.0), (420.0, 0.0)]
    dense = [(t + 0.7, v0 + (v1 - v0) * (t + 0.7 - t0) / (t1 - t0))       # scraped at 1 Hz, but for the silence
             for (t0, v0), (t1, v1) in zip(depth, depth[1:]) if t1 - t0 < 60 for t in range(int(t0), int(t1))
             if t0 < t + 0.7 < t1]
    b.lag(sorted(depth + dense), collector="metrics", field="queue_depth")
    for t in range(212, 242, 2):        # the scrape times out: TB answers nothing
        b.ev("sample", float(t), collector="metrics", error="ReadTimeout: read timed out. (read timeout=0.8)")
    b.ev("service", 242.0, service="platform", event="exit", code=3, oom=True,
         cause="java.lang.OutOfMemoryError (JVM exit 3)")
    b.ev("service", 243.0, service="platform", event="restart", n=2)
    b.ev("service", 297.7, service="platform", event="ready")
    for sec in range(126, 426):         # the fleet: x1, x10 in the burst; thrashing TB acks almost nothing
        t = sec + 1.0
        offered = 15000 if 186 <= sec < 306 else 1500
        acked = offered if t <= 205 or t > 300 else (300 if t <= 242 else 0)
        b.load(sec, offered, acked)
    if storage:                         # incremental stored count: TB wrote little while thrashing
        stored = 0
        for t in range(130, 426, 5):
            stored += 7000 if t < 205 else (400 if t < 242 else (0 if t < 300 else 9000))
            b.ev("sample", float(t), collector="storage", stored=stored, counted="incremental")
    b.ev("drain", 430.0, drained=True, waited_s=4.0, backlog=0, signal="queue depth")
    if accounting:                      # acked messages the stored set lacks: the accounting knows
        b.acked([("d0", s) for s in range(10000)])
        b.stored([("d0", s) for s in range(2000)])
    return b


def test_a_backlog_not_seen_draining_before_a_silent_death_vanished(tmp_path):
    v = lag_recovers_within(run(tb_inmemory_x10(tmp_path)), seconds=300, tolerance=1500)
    assert v.verdict == FAIL, v.message
    f = v.figures
    assert f["emptied_by_crash"] == 1 and f["unseen_s"] == 31.0
    # 81,877 + 9,300 acked in the gap - 2,400 stored in it
    assert f["consumed_in_gap"] == 2400 and f["acked_in_gap"] == 9300 and f["backlog_vanished"] == 88777
    assert "81,877 at t=211s" in v.message and "died (java.lang.OutOfMemoryError (JVM exit 3)) at t=242s" in v.message
    assert "metrics silent from t=211s" in v.message and "ReadTimeout" in v.message
    # the second life's drain is reported apart, never as the recovery
    assert f["second_life_peak"] == 25361 and f["second_life_recovery_s"] == 62.7
    assert "second life (back at t=298s) queued up to 25,361 and fell to <= 1,500 62.7s after the burst end" \
        in v.message


def test_without_counters_the_accounting_says_the_silent_backlog_was_lost(tmp_path):
    v = lag_recovers_within(run(tb_inmemory_x10(tmp_path, storage=False, accounting=True)), seconds=300,
                            tolerance=1500)
    assert v.verdict == FAIL and v.figures["acked_lost"] == 8000 and v.figures["backlog_vanished"] == 81877
    assert "the accounting finds 8,000 acked messages never stored" in v.message


def test_without_counters_or_accounting_a_silent_backlog_is_unknown_never_a_recovery(tmp_path):
    # the fastest fall seen (3,000 msg/s at t=150..155, a healthy moment) could have emptied 81,877 in 31 s on
    # paper: the old rule let the second life's drain pass for a recovery
    v = lag_recovers_within(run(tb_inmemory_x10(tmp_path, storage=False)), seconds=300, tolerance=1500)
    assert v.verdict == UNKNOWN and v.figures["backlog_unseen"] == 81877
    assert "not seen draining" in v.message and "second life" in v.message


def test_counters_that_show_the_backlog_consumed_in_the_gap_clear_the_death(tmp_path):
    b = RunBuilder(tmp_path, base_rate=100).phases(10, 60, 60).service_start()
    b.lag([(60.0, 9000.0), (65.0, 4000.0), (77.0, 3000.0), (95.0, 0.0), (100.0, 0.0)],
          collector="metrics", field="queue_depth")
    for t, n in ((70.0, 10000), (80.0, 11000), (88.5, 14500), (96.0, 14600)):
        b.ev("sample", t, collector="storage", stored=n, counted="exact")
    b.ev("service", 88.0, service="platform", event="exit", code=137, oom=False, cause="SIGKILL")
    v = lag_recovers_within(run(b), seconds=300)
    assert v.verdict == PASS and "emptied_by_crash" not in v.figures, v.message


def test_silences_from_error_samples_gaps_and_recorded_marks():
    ev = Events([{"type": "sample", "t": float(t), "collector": "metrics", "queue_depth": 1} for t in range(10)]
                + [{"type": "sample", "t": float(t), "collector": "metrics", "error": "ConnectionRefused"}
                   for t in range(10, 20)]
                + [{"type": "sample", "t": 20.0, "collector": "metrics", "queue_depth": 1}]
                + [{"type": "sample", "t": float(t), "collector": "process", "rss_mb": 1} for t in (0, 1, 9, 10)]
                + [{"type": "sample", "t": float(t), "collector": "storage", "stored": 1} for t in (0, 9)]
                + [{"type": "silence", "t": 40.0, "collector": "kafka", "start": 30.0, "end": 40.0,
                    "reason": "no answer for 10s"}])
    got = [(s.collector, s.start, s.end, s.reason) for s in silences(ev)]
    assert got == [("process", 1.0, 9.0, "no answer"), ("metrics", 9.0, 20.0, "ConnectionRefused"),
                   ("kafka", 30.0, 40.0, "no answer for 10s")]   # storage rests on purpose: no silence


def test_a_collector_that_samples_every_5_s_on_purpose_is_not_silent_but_its_errors_are():
    """The demo's healthy in-memory x10 showed "services silent" 8 times: the services collector reads /proc
    every 5th second by design. Its gaps are not silences; its errors still are, and so are the sampler's marks."""
    ev = Events([{"type": "sample", "t": float(t), "collector": "services", "rss_mb": {"platform": 60}}
                 for t in range(0, 100, 5)])
    assert silences(ev) == []
    ev = Events([{"type": "sample", "t": float(t), "collector": "services", "rss_mb": {"platform": 60}}
                 for t in (0, 5)]
                + [{"type": "sample", "t": float(t), "collector": "services", "error": "PermissionError"}
                   for t in (10, 15)]
                + [{"type": "sample", "t": 20.0, "collector": "services", "rss_mb": {"platform": 60}}]
                + [{"type": "silence", "t": 60.0, "collector": "services", "start": 30.0, "end": 60.0,
                    "reason": "no answer for 30s"}])
    assert [(s.collector, s.start, s.end, s.reason) for s in silences(ev)] == [
        ("services", 5.0, 20.0, "PermissionError"), ("services", 30.0, 60.0, "no answer for 30s")]


class _Flaky(Collector):
    name = "metrics"

    def __init__(self):
        self.n = 0

    def sample(self):
        self.n += 1
        if 3 <= self.n <= 10:
            raise TimeoutError("read timed out")
        return {"queue_depth": 1}


class _Timeline:
    def __init__(self):
        self.events, self.t0, self.lock = [], time.monotonic(), threading.Lock()

    def now(self):
        return time.monotonic() - self.t0

    def add(self, type, **f):
        with self.lock:
            self.events.append({"type": type, "t": self.now(), **f})


def test_the_sampler_marks_a_collector_that_stops_answering(monkeypatch):
    monkeypatch.setattr(sampler_mod, "SILENCE_MIN_S", 0.3)
    tl = _Timeline()
    s = sampler_mod.Sampler(tl, [_Flaky()], period=0.1).start()
    while sum(1 for e in tl.events if e["type"] == "sample" and "error" not in e) < 4:
        time.sleep(0.05)
    s.stop()
    marks = [e for e in tl.events if e["type"] == "silence"]
    assert len(marks) == 1 and marks[0]["collector"] == "metrics" and marks[0]["reason"].startswith("TimeoutError")
    assert marks[0]["end"] - marks[0]["start"] >= 0.3
    assert [(x.collector, x.reason[:12]) for x in silences(Events(tl.events), min_s=0.3)] == [("metrics", "TimeoutError")]


def test_the_report_shades_a_silence_apart_from_the_fault_windows(tmp_path):
    from monsoon.report.html import Plotter, windows_of
    ev = Events.load(tb_inmemory_x10(tmp_path).write() / "timeline.jsonl")
    got = [(w.name, w.start, w.end, w.kind) for w in windows_of(ev) if w.kind == "silence"]
    assert got == [("metrics silent", 211.0, 300.7, "silence")]
    fig, ax = Plotter(ev)._axes("backlog")
    spans = [p for p in ax.patches if p.get_hatch() == "xx"]
    assert len(spans) == 1 and spans[0].get_facecolor()[3] < 0.16   # lighter than a fault window


def test_monsoon_analyze_gives_the_corrected_verdicts_on_the_saved_run(tmp_path):
    from monsoon.analysis import analyze
    b = tb_inmemory_x10(tmp_path / "run" / "tb--x10", accounting=True)
    b.events[0].update(stack="tb", experiment="x10", checks=[
        {"name": "lag_recovers_within", "params": {"seconds": 300}},
        {"name": "serves_throughout", "params": {"max_silent_s": 10}}, {"name": "no_acked_loss", "params": {}}])
    b.write()
    got = {c["name"]: c["verdict"] for r in analyze(tmp_path / "run")["results"] for c in r["checks"]}
    assert got == {"lag_recovers_within": FAIL, "serves_throughout": FAIL, "no_acked_loss": FAIL}


FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_a_real_silent_death_on_kubernetes_analyses_to_its_verdicts(tmp_path):
    """A reduced real run (tests/fixtures/README.md): inmemory-k8s x10, the platform pod OOMKilled three times,
    its metrics silent before the second and third deaths."""
    from monsoon.analysis import analyze
    shutil.copytree(FIXTURES / "inmemory-k8s-x10-silent-death", tmp_path / "run" / "inmemory-k8s--burst-x10")
    r = analyze(tmp_path / "run")["results"][0]
    got = {c["name"]: c for c in r["checks"]}
    assert {n: c["verdict"] for n, c in got.items()} == {
        "no_oom": FAIL, "no_acked_loss": FAIL, "lag_recovers_within": FAIL, "serves_throughout": FAIL,
        "no_unexpected_exit": PASS, "load_valid": PASS}
    assert got["no_oom"]["figures"]["oom_events"] == 3
    assert (got["no_acked_loss"]["figures"]["acked"], got["no_acked_loss"]["figures"]["acked_lost"]) == (12487, 7458)
    lag = got["lag_recovers_within"]
    assert lag["figures"]["emptied_by_crash"] == 1 and lag["figures"]["backlog_vanished"] == 19945
    serve = got["serves_throughout"]
    assert serve["figures"]["silent_stretches"] == 2 and serve["figures"]["longest_silent_s"] == 30.0
    assert "platform served 109 of 68,000 messages offered for 17s from t=38s" in serve["message"]
    assert "metrics silent from t=38s to t=53s" in serve["message"]


def test_a_real_hung_second_life_in_a_container_analyses_to_its_verdicts(tmp_path):
    """A reduced real run (tests/fixtures/README.md): inmemory-docker x10, OOMKilled, then the second life stalled
    at its 200 MB limit with its metrics silent; 21 of the kept devices' rows were stored only after the stop."""
    from monsoon.analysis import analyze
    shutil.copytree(FIXTURES / "inmemory-docker-x10-hung-second-life", tmp_path / "run" / "inmemory-docker--x10")
    got = {c["name"]: c for c in analyze(tmp_path / "run")["results"][0]["checks"]}
    assert {n: c["verdict"] for n, c in got.items()} == {
        "no_oom": FAIL, "no_acked_loss": FAIL, "serves_throughout": FAIL, "no_unexpected_exit": PASS,
        "load_valid": PASS}
    oom = got["no_oom"]["figures"]
    assert (oom["docker_oom_killed"], oom["memory_limit_stalls"], oom["memory_limit_stall_s"]) == (1, 1, 23.0)
    loss = got["no_acked_loss"]
    assert {k: loss["figures"][k] for k in ("acked", "stored", "stored_late", "acked_lost")} == \
        {"acked": 9465, "stored": 3479, "stored_late": 21, "acked_lost": 5986}
    assert "21 stored late" in loss["message"]
    serve = got["serves_throughout"]
    assert "platform served 0 of 74,000 messages offered for 23s from t=37s" in serve["message"]
    assert "at its memory limit (200 of 200 MB)" in serve["message"] and "metrics silent from t=36s" in serve["message"]
