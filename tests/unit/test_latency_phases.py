"""Ack latency per phase from the fleet's per-second HdrHistograms (latency.hlog): the interval log,
the per-phase sums against exact numpy percentiles, and latency_objective's phase mode and figures."""
import csv

import numpy as np
import pytest

from monsoon.checks.base import FAIL, PASS, UNKNOWN, RunData
from monsoon.checks.faults import latency_objective
from monsoon.rundir import LATENCY_FILE
from monsoon.timeline.hdrlog import IntervalLogWriter, new_histogram, percentile_ms, phase_histograms, read_intervals
from tests.unit.helpers import RunBuilder

PHASES = [("warmup", 0, 10), ("burst", 10, 20), ("recovery", 20, 30)]
SCALE_MS = {"warmup": 20.0, "burst": 400.0, "recovery": 60.0}


def hdr_rank_value(sorted_us: np.ndarray, q: float) -> float:
    """The exact value HdrHistogram's rank rule picks: the int(q/100 * n + 0.5)-th smallest (at least the 1st)."""
    rank = max(1, int(q / 100.0 * len(sorted_us) + 0.5))
    return float(sorted_us[rank - 1])


def write_log(dir, seconds: dict[int, np.ndarray], start_wall: float = 1e9) -> None:
    w = IntervalLogWriter(dir / LATENCY_FILE, start_wall)
    for sec in sorted(seconds):
        h = new_histogram()
        for v in seconds[sec]:
            h.record_value(int(v))
        w.write(sec, h)
    w.close()


def synthetic(dir, per_s: int = 300, seed: int = 5, t0: float = 0.0):
    """Lognormal latencies (us) per second, a different scale per phase, 2 drain seconds after the load.
    Returns the run and the exact latencies per phase (drain seconds in the last phase)."""
    rng = np.random.default_rng(seed)
    b = RunBuilder(dir)
    for name, a, e in PHASES:
        b.phase(name, t0 + a, t0 + e)
    seconds, exact = {}, {n: [] for n, _, _ in PHASES}
    for sec in range(32):
        name = next((n for n, a, e in PHASES if a <= sec < e), "recovery")
        lat = np.maximum(1, rng.lognormal(np.log(SCALE_MS[name] * 1000), 0.6, per_s)).astype(np.int64)
        seconds[sec] = lat
        exact[name].append(lat)
    write_log(dir, seconds)
    return RunData(b.write()), {n: np.sort(np.concatenate(v)) for n, v in exact.items()}


# ------------------------------------------------------------------ the interval log

def test_interval_log_round_trip_and_format(tmp_path):
    h = new_histogram()
    for v in (1000, 2000, 3000):
        h.record_value(v)
    w = IntervalLogWriter(tmp_path / LATENCY_FILE, 1700000000.0)
    w.write(0, h)
    w.write(1, new_histogram())          # an empty second writes nothing
    w.write(2, h)
    w.close()
    lines = (tmp_path / LATENCY_FILE).read_text().splitlines()
    assert lines[1] == "#[StartTime: 1700000000.000 (seconds since epoch)]"
    assert lines[2] == '"StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"'
    assert lines[3].startswith("0.000,1.000,3.007,HIST")    # max in ms: 3000 us, top of its bucket (< 1 % above)
    got = list(read_intervals(tmp_path / LATENCY_FILE))
    assert [(s, n) for s, n, _ in got] == [(0.0, 1.0), (2.0, 1.0)]


def test_hdrh_own_reader_reads_the_log(tmp_path):
    from hdrh.log import HistogramLogReader
    run, exact = synthetic(tmp_path)
    reader = HistogramLogReader(str(tmp_path / LATENCY_FILE), new_histogram())
    total = reader.add_next_interval_histogram()
    n = 0
    while total is not None:
        n += 1
        total = reader.add_next_interval_histogram()
    assert n == 32


def test_a_torn_last_line_is_skipped(tmp_path):
    run, exact = synthetic(tmp_path)
    with open(tmp_path / LATENCY_FILE, "a") as fh:
        fh.write("32.000,1.000,5.0,HISTFAAAAB")          # killed mid-write
    hs = phase_histograms(tmp_path / LATENCY_FILE, run.events.phases())
    assert hs["all"].get_total_count() == 32 * 300


# ------------------------------------------------------------------ per-phase sums vs exact percentiles

@pytest.mark.parametrize("t0", [0.0, 12.5])     # phases relative to the load start, wherever it is
def test_phase_percentiles_match_exact_numpy_percentiles(tmp_path, t0):
    run, exact = synthetic(tmp_path, t0=t0)
    hs = phase_histograms(tmp_path / LATENCY_FILE, run.events.phases())
    assert hs["warmup"].get_total_count() == 10 * 300 and hs["recovery"].get_total_count() == 12 * 300
    assert hs["all"].get_total_count() == 32 * 300
    for name, xs in exact.items():
        for q in (50, 90, 99, 99.9):
            got_us = percentile_ms(hs[name], q) * 1000
            want = hdr_rank_value(xs, q)
            # HdrHistogram reports the top of the exact value's bucket: never below, at most 1/128 above
            assert want - 0.5 <= got_us <= want * (1 + 1 / 128) + 1, (name, q, got_us, want)
            # and, the way a reader would compare, within 1 % of numpy's own percentile
            assert got_us == pytest.approx(np.percentile(xs, q, method="nearest"), rel=0.01), (name, q)


# ------------------------------------------------------------------ latency_objective's phase mode

def test_a_phase_is_judged_from_the_histograms(tmp_path):
    run, exact = synthetic(tmp_path)                 # no acked.csv at all: only the histograms
    v = latency_objective(run, max_ms=1000, during="burst")
    assert v.verdict == FAIL and v.figures["samples"] == 3000
    assert v.figures["p99_ms"] == pytest.approx(hdr_rank_value(exact["burst"], 99) / 1000, rel=0.01)
    assert "in the burst phase" in v.message and "HdrHistogram" in v.message
    v = latency_objective(run, max_ms=1000, during="warmup")
    assert v.verdict == PASS and v.figures["p50_ms"] == pytest.approx(20, rel=0.1)


def test_every_verdict_carries_the_per_phase_figures(tmp_path):
    run, exact = synthetic(tmp_path)
    v = latency_objective(run, max_ms=5000, during="all", percentile=99.9)
    assert v.verdict == PASS and v.figures["samples"] == 32 * 300 and "p99.9_ms" in v.figures
    for name, xs in exact.items():
        for key, q in (("p50_ms", 50), ("p99_ms", 99), ("p999_ms", 99.9)):
            assert v.figures[f"{key}.{name}"] == pytest.approx(hdr_rank_value(xs, q) / 1000, rel=0.01)
    assert v.figures["p999_ms.burst"] > v.figures["p999_ms.recovery"] > v.figures["p999_ms.warmup"]


def test_too_few_samples_in_a_phase_is_unknown(tmp_path):
    run, _ = synthetic(tmp_path, per_s=5)                   # 50 acks in the warmup
    v = latency_objective(run, max_ms=1000, during="warmup")
    assert v.verdict == UNKNOWN and v.figures["samples"] == 50 and "p50_ms.burst" in v.figures
    assert latency_objective(run, max_ms=1000, during="warmup", min_samples=50).verdict == PASS


def test_a_phase_without_acks_has_no_figures_and_is_unknown(tmp_path):
    b = RunBuilder(tmp_path)
    for name, a, e in PHASES:
        b.phase(name, a, e)
    write_log(tmp_path, {s: np.full(200, 5000) for s in range(10)})     # only the warmup saw acks
    run = RunData(b.write())
    v = latency_objective(run, max_ms=100, during="burst")
    assert v.verdict == UNKNOWN and v.figures["samples"] == 0
    assert "p99_ms.warmup" in v.figures and "p99_ms.burst" not in v.figures
    assert latency_objective(run, max_ms=100, during="soak").verdict == UNKNOWN     # no such phase


def test_fault_windows_still_read_the_exact_acked_log(tmp_path):
    """during: faults spans arbitrary windows: acked.csv, exact; the per-phase figures come along."""
    run, _ = synthetic(tmp_path)
    wall0 = 1_700_000_000.0
    b = RunBuilder(tmp_path)
    b.events[0]["wall"] = wall0          # the acked log is wall-clock: place it on the timeline
    for name, a, e in PHASES:
        b.phase(name, a, e)
    b.ev("fault-plan", 0.0, faults=[])
    b.ev("fault", 0.0, name="lat", kind="network-latency", backend="toxiproxy", target="x", window=0,
         phase="inject", intended=12.0, effective=12.0, landed=True, evidence={})
    b.ev("fault", 0.0, name="lat", kind="network-latency", backend="toxiproxy", target="x", window=0,
         phase="heal", intended=18.0, effective=18.0, landed=True, evidence={})
    run = RunData(b.write())
    with open(tmp_path / "acked.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["device", "seq", "intended_ms", "acked_ms"])
        for i in range(3000):
            t = i / 100
            lat = 777 if 12 <= t <= 18 else 5
            intended = int(round((wall0 + t) * 1000))
            w.writerow(["d", i, intended, intended + lat])
    v = latency_objective(run, max_ms=500)
    assert v.verdict == FAIL and v.figures["p99_ms"] == 777 and v.figures["samples"] == 601
    assert "p99_ms.burst" in v.figures


def test_without_the_log_a_phase_falls_back_to_the_acked_log(tmp_path):
    b = RunBuilder(tmp_path)
    b.events[0]["wall"] = 1e9
    b.phase("warmup", 0, 10)
    run = RunData(b.write())
    with open(tmp_path / "acked.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["device", "seq", "intended_ms", "acked_ms"])
        for i in range(200):
            intended = int(round((1e9 + i / 20) * 1000))
            w.writerow(["d", i, intended, intended + 42])
    v = latency_objective(run, max_ms=100, during="warmup")
    assert v.verdict == PASS and v.figures["p99_ms"] == 42 and "HdrHistogram" not in v.message
    assert not any("." in k for k in v.figures)
