"""``make bench-load``'s figures from fake runs: pacing inside the target window, sink utilisation."""
from __future__ import annotations

import argparse
import os
import threading
from types import SimpleNamespace

import pytest

from monsoon.selftest import bench
from monsoon.load.stats import SecondStats


def second(t: int, target: float, sent: int) -> SecondStats:
    return SecondStats(t=t, target_rate=target, scheduled=sent, sent=sent, acked=sent, failed=0, late=0,
                       connected=10, p50_ms=1.0, p99_ms=2.0, max_ms=3.0)


class FakeFleet:
    """A NativeFleet stand-in replaying per-second stats: 100 msg/s asked for 5 s, the generator manages
    80/s and works its backlog off after the window, so it sends the whole schedule (500) in the end."""

    SECONDS = [second(s, 100.0, 80) for s in range(5)] + [second(5, 0.0, 60), second(6, 0.0, 40)]

    def __init__(self, devices, host, port, **kw) -> None:
        self.extra = {"workers": [{"cpu_s": 1.5}], "send_late_p99_ms": 900.0, "send_late_max_ms": 1900.0}

    def __enter__(self) -> FakeFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def connect(self) -> None:
        pass

    def run(self, stop: threading.Event, on_second) -> SimpleNamespace:
        for s in self.SECONDS:
            on_second(s)
        n = sum(s.sent for s in self.SECONDS)
        return SimpleNamespace(late=300, scheduled=n, sent=n, acked=n, p99_ms=950.0)


class FakeSinks(bench.Sinks):
    """Sinks whose only "sink process" is this test process (its CPU is real and moving)."""

    def __init__(self) -> None:
        self.port = 1
        self.procs = [SimpleNamespace(pid=os.getpid())]


def test_pacing_counts_only_what_went_out_inside_the_window(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(bench, "NativeFleet", FakeFleet)
    a = argparse.Namespace(pacing_rate=100.0, pacing_duration=5.0, pacing_devices=10)
    r = bench.phase_pacing(a, FakeSinks(), tmp_path)
    assert r["sent"] == 500                       # the whole schedule went out, 100 msg/s x 5 s ...
    assert r["sent_in_window"] == 400 and r["window_s"] == 5
    assert r["achieved_rate"] == 80.0             # ... but only 80/s inside the 5 s asked for
    assert r["pacing_error_pct"] == pytest.approx(20.0)
    assert r["worst_second_error_pct"] == pytest.approx(20.0)
    assert "sink_cpu_s" in r and len(r["sink_utilisation"]) == 1   # one sink process, its CPU s per elapsed s


def test_pacing_worst_second_is_reported_apart_from_the_window_average() -> None:
    secs = [second(0, 100.0, 100), second(1, 100.0, 50), second(2, 100.0, 150), second(3, 0.0, 0)]
    f = bench.pacing_figures(secs, 3.0)
    assert f["pacing_error_pct"] == 0.0           # on average on target ...
    assert f["worst_second_error_pct"] == 50.0    # ... one second half empty, the next 1.5x full
    # a window that is not whole seconds: only its whole seconds count
    assert bench.pacing_figures(secs, 2.5)["window_s"] == 2


def test_sink_utilisation_is_cpu_seconds_per_elapsed_second_of_each_process() -> None:
    # two processes measured from the start, a third started during the window
    u = bench.sink_usage([1.0, 2.0], [3.0, 2.5, 0.5], 4.0)
    assert u["sink_utilisation"] == [0.5, 0.125, 0.125]
    assert u["sink_utilisation_max"] == 0.5
    assert u["sink_cpu_s"] == 3.0 and u["sink_elapsed_s"] == 4.0


def test_a_measured_child_runs_as_make_bench_load_starts_it():
    """``run_child`` starts this module with ``python -m``: a paho child against a real sink acks every message.
    (The module once moved and the children kept its old name; make bench-load failed while this file passed.)"""
    from monsoon.load.native import ensure_loadgen
    sinks = bench.Sinks(ensure_loadgen(), 1)
    try:
        r = bench.run_child(["paho", str(sinks.port), "300", "10"])
    finally:
        sinks.close()
    assert r["acked"] == 300 and r["cpu_s"] > 0, r
    assert bench.per_msg(r) > 0


def test_the_physical_floor_runs_against_a_real_sink_and_counts_its_syscalls():
    """``monsoon-loadgen floor``: pre-encoded publishes, ``batch`` per write, every one acked."""
    from monsoon.load.native import ensure_loadgen
    binary = ensure_loadgen()
    sinks = bench.Sinks(binary, 1)
    try:
        # enough messages that its CPU time is above the clock's tick (600 took "0.0 s" once, in CI)
        f = bench.run_floor(binary, sinks.port, 3, 240_000, 4)
    finally:
        sinks.close()
    assert f["acked"] == 240_000 and f["batch"] == 4 and f["connections"] == 3 and f["payload_bytes"] == 146
    assert f["writes"] == 60_000 and f["reads"] >= 60_000 // 64   # one write per batch; reads gather acks
    assert bench.per_msg(f) > 0


def test_the_paced_floor_writes_what_each_tick_made_due():
    """``floor --rate``: the floor on the engine's clock: 30,000 msg/s on 3 connections, a tick of 5 ms, so
    ~50 publishes per connection a tick (fewer where a tick came late and more was due: never a backlog)."""
    from monsoon.load.native import ensure_loadgen
    binary = ensure_loadgen()
    sinks = bench.Sinks(binary, 1)
    try:
        f = bench.run_floor(binary, sinks.port, 3, 30_000, 1, rate=30_000.0, tick_ms=5.0)
    finally:
        sinks.close()
    assert f["acked"] == 30_000 and f["connections"] == 3
    assert f["writes"] <= 3 * 205 and f["batch"] >= 30_000 / (3 * 205)   # ~200 ticks of 5 ms over ~1 s
    assert f["elapsed_s"] >= 0.95                                           # paced, not flat out


def test_cpu_columns_side_by_side_with_their_ratios():
    us = {"monsoon": 1.8, "monsoon_unbatched": 8.6, "floor": 0.72, "floor_unbatched": 8.9, "floor_paced": 1.5,
          "paho": 83.0, "monsoon_python": None}
    r = bench.cpu_ratios(us)
    assert r["ratio"] == round(1.8 / 83.0, 4) and r["ratio_floor"] == 2.5 and r["ratio_floor_paced"] == 1.2
    assert r["ratio_unbatched_floor"] == round(8.6 / 8.9, 4) and r["batching_gain"] == round(8.6 / 1.8, 4)
    assert r["ratio_python"] is None                          # a column that did not run has no ratio


def test_generator_cores_inside_the_target_window():
    secs = [SecondStats(t=t, target_rate=100.0, scheduled=100, sent=100, acked=100, failed=0, late=0, connected=1,
                        p50_ms=1.0, p99_ms=1.0, max_ms=1.0, gen_cpu_s=c) for t, c in enumerate([0.1, 0.3, 0.2, 5.0])]
    g = bench.generator_cores(secs, 3.0)                      # second 3 (a drain) is outside the window
    assert g["generator_cores"] == 0.2 and g["generator_cores_max"] == 0.3
    assert g["generator_us_per_msg"] == round(0.6 / 300 * 1e6, 3) and g["cpus"] >= 1
    assert bench.generator_cores([second(0, 1.0, 1)], 3.0) == {}   # not measured: nothing claimed


def test_floor_rounds_give_each_pairs_ratio_and_the_medians():
    from monsoon.selftest.bench import floor_rounds_summary
    out = floor_rounds_summary([{"monsoon": 1.2, "floor_paced": 1.0, "late": 0},
                                {"monsoon": 1.0, "floor_paced": 0.8, "late": 0},
                                {"monsoon": 1.1, "floor_paced": None, "late": 0}])
    assert [r["ratio_floor_paced"] for r in out["rounds"]] == [1.2, 1.25, None]
    assert out["median_monsoon"] == 1.1 and out["median_floor_paced"] == 0.9
    assert out["median_ratio_floor_paced"] == 1.225        # the median of the pairs' ratios, not of the medians
