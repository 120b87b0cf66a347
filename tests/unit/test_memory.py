"""GC-log parsing, leak slopes (heap after GC, RSS) and GC time fraction, on hand-made runs."""
import random
from datetime import datetime, timezone

import pytest

from monsoon.checks.registry import CHECKS, validate_check
from monsoon.checks.base import FAIL, PASS, UNKNOWN, RunData
from monsoon.checks.memory import back_half, gc_time_fraction, heap_after_gc, no_memory_leak, ols_slope, parse_gc_log
from tests.unit.helpers import RunBuilder

# A real-looking Parallel GC unified log (-Xlog:gc*:file=...:time,uptime,level,tags), JDK 17
SAMPLE = """\
[2026-11-22T00:44:28.680+0000][0.006s][info][gc] Using Parallel
[2026-11-22T00:44:28.681+0000][0.007s][info][gc,init] Heap Max Capacity: 192M
[2026-11-22T00:44:30.166+0000][1.492s][info][gc,start    ] GC(0) Pause Young (Allocation Failure)
[2026-11-22T00:44:30.176+0000][1.503s][info][gc,heap     ] GC(0) PSYoungGen: 49152K(57344K)->5538K(57344K) Eden: 49152K(49152K)->0K(49152K) From: 0K(8192K)->5538K(8192K)
[2026-11-22T00:44:30.176+0000][1.503s][info][gc,heap     ] GC(0) ParOldGen: 0K(131072K)->24K(131072K)
[2026-11-22T00:44:30.176+0000][1.503s][info][gc,metaspace] GC(0) Metaspace: 13868K(14080K)->13868K(14080K) NonClass: 12343K(12480K)->12343K(12480K) Class: 1525K(1600K)->1525K(1600K)
[2026-11-22T00:44:30.176+0000][1.503s][info][gc          ] GC(0) Pause Young (Allocation Failure) 48M->5M(184M) 10.603ms
[2026-11-22T00:44:30.176+0000][1.503s][info][gc,cpu      ] GC(0) User=0.01s Sys=0.01s Real=0.02s
[2026-11-22T00:44:30.433+0000][1.760s][info][gc,start    ] GC(2) Pause Full (Metadata GC Threshold)
[2026-11-22T00:44:30.434+0000][1.760s][info][gc,phases,start] GC(2) Marking Phase
[2026-11-22T00:44:30.467+0000][1.794s][info][gc          ] GC(2) Pause Full (Metadata GC Threshold) 6M->6M(184M) 33.792ms
[2026-11-22T00:44:41.201+0000][12.527s][info][gc          ] GC(3) Pause Young (Allocation Failure) 54336K->10240K(188416K) 18.830ms
[2026-11-22T00:45:02.900+0000][34.226s][info][gc          ] GC(4) Pause Full (Ergonomics) 1G->1023M(2G) 812.500ms
"""


def run(b: RunBuilder) -> RunData:
    return RunData(b.write())


def gc_line(wall: float, uptime: float, n: int, after_mb: float, kind: str = "Young", total: int = 184) -> str:
    ts = datetime.fromtimestamp(wall, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "+0000"
    cause = "Allocation Failure" if kind == "Young" else "Ergonomics"
    return (f"[{ts}][{uptime:.3f}s][info][gc          ] GC({n}) Pause {kind} ({cause}) "
            f"{after_mb + 40:.0f}M->{after_mb:.0f}M({total}M) 5.000ms\n")


def gc_text(points, kind="Young", wall0=1e9):
    """points: (seconds since JVM start, MB after GC)."""
    return "".join(gc_line(wall0 + t, t, i, mb, kind) for i, (t, mb) in enumerate(points))


# ------------------------------------------------------------ parsing

def test_parse_gc_log_reads_every_pause_line_of_a_parallel_gc_log():
    ps = parse_gc_log(SAMPLE)
    assert [p.kind for p in ps] == ["Young", "Full", "Young", "Full"]
    assert [p.after_mb for p in ps] == [5.0, 6.0, 10.0, 1023.0]
    assert ps[0].before_mb == 48.0 and ps[0].total_mb == 184.0 and ps[0].pause_ms == pytest.approx(10.603)
    assert ps[2].before_mb == pytest.approx(54336 / 1024) and ps[2].total_mb == pytest.approx(184.0)
    assert ps[3].before_mb == 1024.0 and ps[3].total_mb == 2048.0 and ps[3].pause_ms == 812.5
    assert ps[0].uptime_s == 1.503
    assert ps[0].wall == datetime(2026, 11, 22, 0, 44, 30, 176000, tzinfo=timezone.utc).timestamp()
    assert all(p.jvm == 0 for p in ps)


def test_parse_gc_log_notices_a_jvm_restart():
    text = SAMPLE + "[2026-11-22T00:46:00.000+0000][0.900s][info][gc] GC(0) Pause Young (Allocation Failure) " \
                    "30M->4M(184M) 3.1ms\n"
    assert [p.jvm for p in parse_gc_log(text)] == [0, 0, 0, 0, 1]


def test_parse_gc_log_ignores_non_pause_lines_and_garbage():
    assert parse_gc_log("[0.1s][info][gc] Using Parallel\nnot a gc line\n") == []


# ------------------------------------------------------------ statistics

def test_ols_slope_in_mb_per_hour_with_its_t_statistic():
    rnd = random.Random(1)
    pts = [(t, 100 + 20 * t / 3600 + rnd.gauss(0, 1)) for t in range(0, 7200, 60)]
    s = ols_slope(pts)
    assert s.per_hour == pytest.approx(20, abs=1.0)
    assert s.t > 50 and s.significant
    flat = ols_slope([(t, 100.0) for t in range(20)])
    assert flat.per_hour == 0.0 and flat.t == 0.0 and not flat.significant
    assert ols_slope([(0, 1.0), (0, 2.0), (0, 3.0)]) is None


def test_back_half_keeps_the_second_half_by_time():
    assert back_half([(t, 0.0) for t in range(11)]) == [(t, 0.0) for t in range(5, 11)]


def test_heap_after_gc_prefers_full_gcs_when_there_are_enough():
    young = [(t, 100 + (t % 600) / 10) for t in range(0, 7200, 30)]  # promotion sawtooth
    full = [(t + 599, 100.0) for t in range(0, 7200, 600)] * 2  # full GCs every 10 min, flat live set
    pauses = sorted(parse_gc_log(gc_text(young)) + parse_gc_log(gc_text(sorted(full), kind="Full")),
                    key=lambda p: p.uptime_s)
    lives, label = heap_after_gc(pauses)
    assert label == "heap after full GC" and len(lives) == 1 and {y for _, y in lives[0]} == {100.0}


# ------------------------------------------------------------ no_memory_leak

HOURS = 4


def heap_run(tmp_path, f, n=240):
    pts = [(i * HOURS * 3600 / n, f(i * HOURS * 3600 / n)) for i in range(n)]
    return run(RunBuilder(tmp_path).gc_log(gc_text(pts)))


def test_no_memory_leak_passes_on_a_flat_heap(tmp_path):
    v = no_memory_leak(heap_run(tmp_path, lambda t: 120.0 + (t // 7 % 3)))
    assert v.verdict == PASS
    assert abs(v.figures["heap_slope_mb_per_h"]) < 5 and v.figures["heap_points"] >= 100


def test_no_memory_leak_fails_on_a_leaking_heap_with_the_numbers(tmp_path):
    v = no_memory_leak(heap_run(tmp_path, lambda t: 120.0 + 200 * t / 3600), max_mb_per_hour=50)
    assert v.verdict == FAIL
    assert v.figures["heap_slope_mb_per_h"] == pytest.approx(200, abs=2)
    assert "slope +200" in v.message and "above the cap 50 MB/h" in v.message


def test_no_memory_leak_raises_no_alarm_on_noisy_flat_data(tmp_path):
    rnd = random.Random(7)
    v = no_memory_leak(heap_run(tmp_path, lambda t: 300 + rnd.uniform(-150, 150)))
    assert v.verdict == PASS and abs(v.figures["heap_t"]) < 3


def test_no_memory_leak_passes_a_significant_slope_below_the_cap(tmp_path):
    v = no_memory_leak(heap_run(tmp_path, lambda t: 120.0 + 10 * t / 3600))
    assert v.verdict == PASS and v.figures["heap_t"] > 3 and "within the cap" in v.message


def test_no_memory_leak_judges_rss_too(tmp_path):
    b = RunBuilder(tmp_path)
    for i in range(600):
        b.process(i * 12.0, 400 + 150 * (i * 12.0) / 3600)
    v = no_memory_leak(run(b))
    assert v.verdict == FAIL and v.figures["rss_slope_mb_per_h"] == pytest.approx(150, abs=1)


def test_no_memory_leak_does_not_take_a_restart_for_a_leak(tmp_path):
    b = RunBuilder(tmp_path)
    for i in range(300):  # flat, killed, restarted 100 MB higher, flat again: no climb within a life
        b.process(i * 12.0, 300.0 + (i % 3), pid=1)
    for i in range(300, 600):
        b.process(i * 12.0, 400.0 + (i % 3), pid=2)
    v = no_memory_leak(run(b))
    assert v.verdict == PASS and v.figures["rss_lives"] == 2 and abs(v.figures["rss_slope_mb_per_h"]) < 5


def test_no_memory_leak_does_not_take_a_step_at_a_fault_for_a_leak_but_still_sees_a_climb_between_faults(tmp_path):
    """The nightly soak: the platform's RSS stepped once by +122 MB within 15 s of a Kafka broker restart, then
    stayed flat; the pooled slope called it +230 MB/h. Cut at the fault window, each stretch has its own
    baseline; a climb between faults is still a leak, and without the fault on record the step still fails."""
    def build(dir, rss, fault=True):
        b = RunBuilder(dir)
        if fault:
            b.ev("fault-plan", 0.0, run_id="r", horizon=7200, faults=[])
            for phase, t in (("inject", 5000.0), ("heal", 5010.0)):
                b.ev("fault", t, name="broker", kind="kafka-broker-restart", backend="process", target="kafka",
                     window=0, phase=phase, intended=t, effective=t, landed=True, evidence={})
        for i in range(600):
            b.process(i * 12.0, rss(i * 12.0) + (i % 3))
        return run(b)
    step = lambda t: 230.0 + (122.0 if t >= 5030 else 0.0)   # noqa: E731
    v = no_memory_leak(build(tmp_path / "step", step), min_minutes=10)
    assert v.verdict == PASS and abs(v.figures["rss_slope_mb_per_h"]) < 5, v.message
    assert v.figures["rss_lives"] == 2 and "process lives cut at fault windows" in v.message
    assert no_memory_leak(build(tmp_path / "nofault", step, fault=False), min_minutes=10).verdict == FAIL
    climb = lambda t: 230.0 + 150 * t / 3600 + (122.0 if t >= 5030 else 0.0)   # noqa: E731
    v = no_memory_leak(build(tmp_path / "climb", climb), min_minutes=10)
    assert v.verdict == FAIL and v.figures["rss_slope_mb_per_h"] == pytest.approx(150, abs=2), v.message


def test_no_memory_leak_catches_a_leak_that_restarts_with_every_pod_kill(tmp_path):
    # a soak with a pod kill every hour: each JVM life climbs 200 MB/h from its own baseline, and no single
    # life's back half is long enough (min_minutes=60), but the lives together are
    text = ""
    for life in range(6):
        wall0 = 1e9 + life * 3000
        text += gc_text([(t, 120.0 + 200 * t / 3600 + (t // 7 % 3)) for t in range(0, 3000, 20)], wall0=wall0)
    v = no_memory_leak(run(RunBuilder(tmp_path / "leak").gc_log(text)), max_mb_per_hour=50, min_minutes=60)
    assert v.verdict == FAIL, v.message
    assert v.figures["heap_lives"] == 6 and v.figures["heap_slope_mb_per_h"] == pytest.approx(200, abs=5)
    assert "6 process lives" in v.message
    flat = "".join(gc_text([(t, 120.0 + (t // 7 % 3)) for t in range(0, 3000, 20)], wall0=1e9 + life * 3000)
                   for life in range(6))
    v = no_memory_leak(run(RunBuilder(tmp_path / "flat").gc_log(flat)), max_mb_per_hour=50, min_minutes=60)
    assert v.verdict == PASS, v.message


def test_no_memory_leak_is_unknown_when_one_series_cannot_be_judged(tmp_path):
    b = RunBuilder(tmp_path).gc_log(gc_text([(t, 100.0) for t in range(0, 240, 20)]))  # 6 heap points
    for i in range(600):
        b.process(i * 12.0, 400.0 + (i % 3))                                             # flat RSS
    v = no_memory_leak(run(b))
    assert v.verdict == UNKNOWN and "only 6 point(s)" in v.message


def test_no_memory_leak_is_unknown_with_fewer_than_10_points(tmp_path):
    v = no_memory_leak(heap_run(tmp_path, lambda t: 100 + t, n=12))  # 6 points in the back half
    assert v.verdict == UNKNOWN and "only 6 point(s)" in v.message
    assert no_memory_leak(run(RunBuilder(tmp_path / "none"))).verdict == UNKNOWN


def test_no_memory_leak_will_not_call_a_short_ramp_a_leak(tmp_path):
    b = RunBuilder(tmp_path)
    for t in range(300):  # a 5-minute run whose RSS still ramps up
        b.process(float(t), 180 + t / 20)
    v = no_memory_leak(run(b))
    assert v.verdict == UNKNOWN and "too short" in v.message
    assert no_memory_leak(run(b), min_minutes=1).verdict == FAIL


# ------------------------------------------------------------ gc_time_fraction

def test_gc_time_fraction_passes_and_reports_every_phase(tmp_path):
    b = RunBuilder(tmp_path).phases(10, 60, 60)
    for t in range(131):
        b.metrics(float(t), gc_seconds=0.02 * t)
    v = gc_time_fraction(run(b))
    assert v.verdict == PASS
    assert v.figures["gc_fraction.burst"] == pytest.approx(0.02) and v.figures["worst_gc_fraction"] == 0.02


def test_gc_time_fraction_fails_when_a_phase_is_saturated(tmp_path):
    b = RunBuilder(tmp_path).phases(10, 60, 60)
    g = 0.0
    for t in range(131):
        b.metrics(float(t), gc_seconds=g)
        g += 0.45 if 10 <= t < 70 else 0.01
    v = gc_time_fraction(run(b), max_fraction=0.2)
    assert v.verdict == FAIL
    assert v.figures["gc_fraction.burst"] == pytest.approx(0.45, abs=0.01)
    assert "45.0% of the burst in GC (27.0s of 60s), above 20%" in v.message


def test_gc_time_fraction_survives_a_counter_reset(tmp_path):
    b = RunBuilder(tmp_path).phase("steady", 0, 100)
    for t in range(101):
        b.metrics(float(t), gc_seconds=0.3 * (t if t < 50 else t - 50))  # JVM restarted at t=50
    b.ev("service", 49.5, service="platform", event="restart", n=2)   # without it the fall is impossible (issue 39)
    v = gc_time_fraction(run(b))
    assert v.verdict == FAIL and v.figures["gc_fraction.steady"] == pytest.approx(0.3, abs=0.005)


def test_gc_time_fraction_falls_back_to_gc_log_pauses(tmp_path):
    b = RunBuilder(tmp_path).phase("steady", 0, 100)
    b.ev("op", 0.0, op="start")  # the RunBuilder's wall clock is 1e9 + t: GC times map back onto t
    lines = "".join(gc_line(1e9 + t, t, t, 50).replace("5.000ms", "500.000ms") for t in range(100))
    v = gc_time_fraction(run(b.gc_log(lines)))
    assert v.verdict == FAIL and v.figures["gc_fraction.steady"] == pytest.approx(0.5)
    assert "GC log pauses" in v.message


def test_gc_time_fraction_is_unknown_without_data(tmp_path):
    assert gc_time_fraction(run(RunBuilder(tmp_path))).verdict == UNKNOWN


def test_memory_checks_are_registered_and_validated():
    assert CHECKS["no_memory_leak"] is no_memory_leak and CHECKS["gc_time_fraction"] is gc_time_fraction
    validate_check("no_memory_leak", {"max_mb_per_hour": 20, "min_minutes": 30})
    validate_check("gc_time_fraction", {"max_fraction": 0.1})


def test_gc_logs_read_the_files_the_jvm_rotated_at_each_restart_oldest_first(tmp_path):
    import os
    from monsoon.checks.memory import gc_logs
    d = tmp_path / "services" / "platform"
    d.mkdir(parents=True)
    # the JVM renames gc.log at every start; numbers are reused, so age decides the order
    for name, life, mtime in (("gc.log.1", 0, 100), ("gc.log.0", 1, 200), ("gc.log", 2, 300)):
        (d / name).write_text(gc_text([(t, 100.0 + life) for t in range(0, 100, 10)], wall0=1e9 + life * 100))
        os.utime(d / name, (mtime, mtime))
    (d / "gc.log.bak").write_text(gc_text([(1, 999.0)]))     # not the JVM's: ignored
    ps = gc_logs(tmp_path)["platform"]
    assert [p.jvm for p in ps] == [0] * 10 + [1] * 10 + [2] * 10
    assert [p.after_mb for p in ps[::10]] == [100.0, 101.0, 102.0]


def test_rotated_gc_logs_are_ordered_by_their_first_wall_time_when_a_copy_lost_their_mtimes(tmp_path):
    """A kept run (a git checkout, a cp without -p) has every file's mtime of the copy: the lives' order comes
    from the wall time each file starts with."""
    import os
    from monsoon.checks.memory import gc_logs
    d = tmp_path / "services" / "platform"
    d.mkdir(parents=True)
    for name, life, mtime in (("gc.log.0", 0, 300), ("gc.log.1", 1, 100), ("gc.log", 2, 200)):
        (d / name).write_text(gc_text([(t, 100.0 + life) for t in range(0, 100, 10)], wall0=1e9 + life * 100))
        os.utime(d / name, (mtime, mtime))
    ps = gc_logs(tmp_path)["platform"]
    assert [p.after_mb for p in ps[::10]] == [100.0, 101.0, 102.0]
    assert [p.jvm for p in ps] == [0] * 10 + [1] * 10 + [2] * 10
