"""no_ingest_stall on fake timelines: periodic dips with an idle CPU are stalls (count, durations, period); dips
with a busy CPU are overload, not stalls; without CPU samples the check cannot tell; the blocking frame of saved
thread dumps is named."""
from monsoon.checks.base import RunData
from monsoon.checks.stall import blocking_frames, no_ingest_stall
from monsoon.rundir import TIMELINE_FILE
from monsoon.timeline.store import Timeline


def _run(tmp_path, seconds=40, stall_every=None, stall_len=2, busy=False, cpu=True):
    with Timeline(tmp_path / TIMELINE_FILE, clock=lambda: 0.0) as tl:
        for s in range(seconds):
            in_stall = stall_every and s >= 8 and (s - 8) % stall_every < stall_len
            tl.add("load", t=float(s), sec=s, target_rate=1000.0, acked=50 if in_stall else 1000,
                   p99_ms=4000.0 if in_stall else 20.0)
            if cpu:
                tl.add("sample", collector="process", t=float(s) + 0.3,
                       cpu_pct=(95.0 if busy else 4.0) if in_stall else 60.0)
    return RunData(tmp_path)


def test_periodic_idle_dips_are_stalls_with_count_duration_and_period(tmp_path):
    v = no_ingest_stall(_run(tmp_path, stall_every=5, stall_len=2))
    assert v.verdict == "fail", v
    f = v.figures
    assert f["stalls"] == 7 and f["max_stall_s"] == 2 and f["period_s"] == 5, f
    assert f["cpu_during_stalls_pct"] == 4.0


def test_a_clean_run_and_a_busy_overload_pass(tmp_path):
    assert no_ingest_stall(_run(tmp_path / "a")).figures["stalls"] == 0
    v = no_ingest_stall(_run(tmp_path / "b", stall_every=5, busy=True))
    assert v.verdict == "pass" and v.figures["stalls"] == 0, v


def test_stalls_inside_a_fault_window_count_only_when_the_fault_just_sets_the_scene(tmp_path):
    """Defect g's experiment slows Cassandra itself: its stalls are inside the fault windows, judged with
    in_faults (a starved pool stalls where a healthy one rides the blip out)."""
    run = _run(tmp_path, seconds=60, stall_every=20, stall_len=4)      # stalls at 8-11, 28-31, 48-51
    with Timeline(tmp_path / TIMELINE_FILE, clock=lambda: 0.0) as tl:   # appended: three windows around them
        tl.add("fault-plan", t=0.0)
        for i, a in enumerate((7.0, 27.0, 47.0)):
            tl.add("fault", t=a, name="cassandra-blips", kind="cassandra-slowdown", target="platform->cassandra",
                   window=i, phase="inject", effective=a, landed=True)
            tl.add("fault", t=a + 6, name="cassandra-blips", kind="cassandra-slowdown",
                   target="platform->cassandra", window=i, phase="heal", effective=a + 6, landed=True)
    run = RunData(tmp_path)
    assert no_ingest_stall(run).figures["stalls"] == 0                  # the fault explains them
    v = no_ingest_stall(run, in_faults="judge")
    assert v.verdict == "fail" and v.figures["stalls"] == 3 and v.figures["period_s"] == 20, v


def test_without_cpu_samples_the_check_cannot_tell(tmp_path):
    assert no_ingest_stall(_run(tmp_path, stall_every=5, cpu=False)).verdict == "unknown"


DUMP = '''"tb-rule-engine-consumer-0" #31 daemon prio=5 os_prio=0 cpu=10ms elapsed=20s tid=0x1 nid=0x2 waiting on condition
   java.lang.Thread.State: TIMED_WAITING (parking)
\tat jdk.internal.misc.Unsafe.park(java.base@17/Native Method)
\tat java.util.concurrent.Semaphore.tryAcquire(java.base@17/Semaphore.java:415)
\tat io.monsoon.platform.CassandraTs.awaitAvailableConnection(CassandraTs.java:120)
\tat io.monsoon.platform.CassandraTs.send(CassandraTs.java:130)

"tb-health" #25 daemon prio=5 os_prio=0 cpu=1ms elapsed=20s tid=0x5 nid=0x6 waiting on condition
   java.lang.Thread.State: TIMED_WAITING (sleeping)
\tat java.lang.Thread.sleep(java.base@17/Native Method)
\tat io.monsoon.platform.Db.sleep(Db.java:150)

"main" #1 prio=5 os_prio=0 cpu=900ms elapsed=20s tid=0x7 nid=0x8 waiting on condition
   java.lang.Thread.State: WAITING (parking)
\tat jdk.internal.misc.Unsafe.park(java.base@17/Native Method)
\tat java.util.concurrent.CountDownLatch.await(java.base@17/CountDownLatch.java:230)
\tat io.monsoon.platform.Main.main(Main.java:160)

"nioEventLoopGroup-2-1" #20 prio=10 os_prio=0 cpu=1ms elapsed=20s tid=0x3 nid=0x4 runnable
   java.lang.Thread.State: RUNNABLE
\tat sun.nio.ch.EPoll.wait(java.base@17/Native Method)
'''


def test_blocking_frame_is_the_first_application_frame_of_waiting_threads(tmp_path):
    assert blocking_frames(DUMP) == {"io.monsoon.platform.CassandraTs.awaitAvailableConnection": 1}
    run = _run(tmp_path, stall_every=5)
    (tmp_path / "thread-dumps").mkdir()
    (tmp_path / "thread-dumps" / "t0012.txt").write_text(DUMP)
    f = no_ingest_stall(run).figures
    assert f["blocking_frame"] == "io.monsoon.platform.CassandraTs.awaitAvailableConnection" and f["thread_dumps"] == 1
