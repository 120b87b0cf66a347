"""serves_throughout: a stack alive (or dead) serving nothing while the load offers work fails, naming the service
and why; on reduced copies of real runs."""
from monsoon.checks.base import FAIL, PASS, UNKNOWN, RunData
from monsoon.checks.registry import CHECKS, validate_check
from monsoon.checks.serve import serves_throughout
from tests.unit.helpers import RunBuilder
from tests.unit.test_silence import tb_inmemory_x10

MB = 1024 * 1024


def run(b: RunBuilder) -> RunData:
    return RunData(b.write())


def test_thrashing_thingsboard_acking_nothing_before_its_oom_fails_with_the_evidence(tmp_path):
    b = tb_inmemory_x10(tmp_path)
    for t in range(186, 212):     # heap samples until the scrape goes silent: at its max
        b.metrics(float(t), heap_used=382.0 * MB, heap_max=384.0 * MB, gc_seconds=10.0 + 0.8 * (t - 186))
    v = serves_throughout(run(b), max_silent_s=10)
    assert v.verdict == FAIL, v.message
    # acks fall to 300 of 15,000 at t=205 and stay there until TB is back at t=300
    assert "platform served" in v.message and "of 1,4" in v.message
    assert "platform died at t=242s (java.lang.OutOfMemoryError (JVM exit 3)), ready again at t=298s" in v.message
    assert "heap at its max (382 of 384 MB)" in v.message and "metrics silent from t=211s" in v.message
    assert v.figures["silent_stretches"] == 1 and v.figures["longest_silent_s"] == 95.0


def hung_second_life(tmp_path) -> RunBuilder:
    """Reduced copy of inmemory-docker x10: killed at its 200 MB limit, the restarted container sat at 200 of
    200 MB for 117 s acking 117 messages (metrics silent, no second kill)."""
    b = RunBuilder(tmp_path, base_rate=400).phases(10, 40, 60).service_start()
    for sec in range(0, 110):
        offered = 4000 if 10 <= sec < 50 else 400
        b.load(sec, offered, offered if sec < 30 else (1 if sec % 40 == 0 else 0))
    b.ev("service", 31.0, service="platform", event="exit", code=137, oom=True, cause="OOMKilled (docker)")
    b.ev("service", 32.0, service="platform", event="restart", n=2)
    b.ev("service", 40.0, service="platform", event="ready")
    for t in range(0, 110):
        b.ev("sample", float(t), collector="cgroup", service="platform", available=1, pid=1, cgroup="/c",
             oom_kills=0, limit_hits=0, cgroups={"/c": {"version": 2, "oom_kill": 0, "limit_hits": 0, "shared": 0,
                                                         "usage_mb": 199.9 if t >= 42 else 120.0,
                                                         "limit_mb": 200.0, "anon_mb": 190.0}})
    for t in range(0, 110):
        if 31 <= t < 110 and t >= 42:
            b.ev("sample", float(t), collector="metrics", error="ReadTimeout: timed out")
        elif t < 31:
            b.metrics(float(t), queue_depth=100.0)
    return b


def test_a_hung_second_life_at_its_memory_limit_is_named(tmp_path):
    v = serves_throughout(run(hung_second_life(tmp_path)), max_silent_s=10)
    assert v.verdict == FAIL, v.message
    assert "platform at its memory limit (200 of 200 MB)" in v.message and "alive" in v.message
    assert "metrics silent from t=30s" in v.message
    assert v.figures["memory_limit_stall_s"] >= 60


def test_a_stack_that_acks_the_whole_burst_passes(tmp_path):
    # Kafka x10: the platform acks as fast as the fleet sends, Kafka absorbs the flood
    b = RunBuilder(tmp_path, base_rate=400).phases(10, 60, 60).service_start()
    for sec in range(130):
        offered = 4000 if 10 <= sec < 70 else 400
        b.load(sec, offered, int(offered * (0.6 if sec in (11, 12) else 0.99)))
    v = serves_throughout(run(b), max_silent_s=10)
    assert v.verdict == PASS and v.figures["unserved_seconds"] == 0, v.message


def test_silence_inside_a_fault_window_and_its_settle_time_is_not_judged(tmp_path):
    b = RunBuilder(tmp_path, base_rate=400).service_start()
    b.ev("fault-plan", 0.0)
    b.ev("fault", 20.0, name="pod-kill", kind="pod-kill", target="platform", window=1, phase="inject",
         effective=20.0, landed=True)
    b.ev("fault", 25.0, name="pod-kill", kind="pod-kill", target="platform", window=1, phase="heal",
         effective=25.0, landed=True)
    for sec in range(200):
        b.load(sec, 400, 0 if 20 <= sec < 60 else 400)
    assert serves_throughout(run(b), max_silent_s=10).verdict == PASS
    b.load(150, 400, 0).load(151, 400, 0)          # two silent seconds: under the limit
    for sec in range(160, 175):                     # fifteen: over it, outside any window
        b.load(sec, 400, 3)
    v = serves_throughout(run(b), max_silent_s=10)
    assert v.verdict == FAIL and "for 15s from t=160s" in v.message and "no sign why" in v.message


def test_serves_throughout_is_registered_validated_and_unknown_without_load(tmp_path):
    assert CHECKS["serves_throughout"] is serves_throughout
    validate_check("serves_throughout", {"max_silent_s": 10})
    assert serves_throughout(run(RunBuilder(tmp_path)), max_silent_s=10).verdict == UNKNOWN


def test_without_heap_metrics_the_gc_log_names_the_full_heap(tmp_path):
    from datetime import datetime, timezone
    b = RunBuilder(tmp_path, base_rate=400).service_start()
    b.events[0]["wall"] = datetime(2026, 11, 22, 3, 14, tzinfo=timezone.utc).timestamp() - 50.0   # t=60 at 03:14:10
    b.gc_log("[2026-11-22T03:13:53.543+0000][0.018s][info][gc,init] Heap Max Capacity: 384M\n" + "\n".join(
        f"[2026-11-22T03:14:{10 + i:06.3f}+0000][{i:.3f}s][info][gc          ] GC({i}) Pause Full (G1 Compaction "
        f"Pause) 384M->{370 + i}M(384M) 900.0ms" for i in range(12)) + "\n")
    for sec in range(100):
        b.load(sec, 400, 400 if sec < 55 else 0)
    v = serves_throughout(run(b), max_silent_s=10)
    assert v.verdict == FAIL and "platform's heap after GC at 381 of 384 MB at t=71s (GC log)" in v.message, v.message


def test_the_gc_share_of_a_stretch_counts_across_a_restart(tmp_path):
    """The GC counter restarts from zero with the process: the share is the counter's increase over the stretch
    (each drop a reset, as gc_time_fraction counts it), not last minus first (negative here: the stretch was left
    without its GC figure)."""
    b = RunBuilder(tmp_path, base_rate=400).service_start()
    for sec in range(80):
        b.load(sec, 400, 0 if 20 <= sec < 60 else 400)
    b.ev("service", 39.0, service="platform", event="exit", code=137, cause="killed")
    b.ev("service", 40.0, service="platform", event="restart", n=2)
    b.ev("service", 41.0, service="platform", event="ready")
    for t in range(10, 70):          # half of every second in GC, before and after the restart
        b.metrics(float(t), gc_seconds=100.0 + 0.5 * (t - 10) if t < 40 else 0.5 * (t - 40))
    v = serves_throughout(run(b), max_silent_s=10)
    assert v.verdict == FAIL, v.message
    # samples t=18..62 (the stretch 20-60 +- 2 s): 104 -> 11 last minus first; 21.5 s of GC in 44 s counted
    assert v.figures["gc_time_pct"] == 48.9, v.figures
    assert "49% of the time in GC" in v.message, v.message
