"""ThreadDumper: dumps only while a second stalls, at most max_dumps, min_gap_s apart, after settle_s; each dump
saved under thread-dumps/ with an op event (a fake jcmd stands in for the JDK's)."""
import json
import os

from monsoon.observe.threaddump import ThreadDumper
from monsoon.rundir import THREAD_DUMP_DIR, TIMELINE_FILE
from monsoon.timeline.store import Timeline


def test_dumps_while_stalled_within_its_limits(tmp_path):
    jcmd = tmp_path / "jcmd"
    jcmd.write_text('#!/bin/sh\necho "dump of $1 $2"\n')
    jcmd.chmod(0o755)
    with Timeline(tmp_path / TIMELINE_FILE) as tl:
        d = ThreadDumper(lambda: os.getpid(), tmp_path, tl, max_dumps=2, min_gap_s=3, settle_s=5, jcmd=str(jcmd))
        for sec in range(30):
            stalled = sec in (2, 8, 9, 10, 20, 25)      # 2: before settle; 9, 10: too soon after 8; 25: over max
            d.on_second({"sec": sec, "target_rate": 100.0, "acked": 10 if stalled else 100, "p99_ms": 5.0})
            d.close()
    files = sorted(p.name for p in (tmp_path / THREAD_DUMP_DIR).iterdir())
    assert files == ["t000008.txt", "t000020.txt"], files
    assert (tmp_path / THREAD_DUMP_DIR / "t000008.txt").read_text() == f"dump of {os.getpid()} Thread.print\n"
    ops = [json.loads(line) for line in open(tmp_path / TIMELINE_FILE)]
    assert [o["sec"] for o in ops if o.get("op") == "thread-dump"] == [int(f[1:7]) for f in files]


def test_a_latency_spike_is_a_stall_and_no_target_is_not(tmp_path):
    with Timeline(tmp_path / TIMELINE_FILE) as tl:
        d = ThreadDumper(lambda: None, tmp_path, tl, jcmd="/bin/true")
        assert d.stalled({"target_rate": 100, "acked": 100, "p99_ms": 5000})
        assert not d.stalled({"target_rate": 0, "acked": 0, "p99_ms": None})
        assert not d.stalled({"target_rate": 100, "acked": 90, "p99_ms": 30})
