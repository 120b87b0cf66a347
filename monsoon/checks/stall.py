"""``no_ingest_stall``: periodic ingestion stalls while the service sits idle (NDU's connection-pool starvation).

A pure function of the timeline: the fleet's per-second ``load`` events (``acked``, ``target_rate``, ``p99_ms``) and
the ``process`` collector's 1 Hz ``cpu_pct`` of the service under test. A second is *stalled* when the load asks for
messages (``target_rate > 0``) and either fewer than ``min_rate_fraction`` of the target were acked or the p99 ack
latency exceeds ``max_latency_ms`` — while the service's CPU is below ``idle_cpu_pct`` (a service that is busy is
overloaded, not stalled). Seconds inside fault windows are not judged (the fault explains them; ``in_faults:
judge`` judges them too), nor the first
``settle_s`` seconds of load. Consecutive stalled seconds make one stall; stalls shorter than ``min_stall_s`` are
ignored. Figures: how many, how long, how often (median start-to-start period). More than ``max_stalls`` fails.

When the run saved JVM thread dumps taken while a stall was live (``thread-dumps/*.txt``, ``jcmd <pid>
Thread.print``), ``blocking_frame`` names the most common top application frame of the threads waiting in them."""
from __future__ import annotations

import bisect
import re
import statistics
from collections import Counter
from pathlib import Path
from typing import Literal

from monsoon.checks.base import FAIL, PASS, UNKNOWN, RunData, Verdict
from monsoon.timeline.views import fault_windows

from monsoon.rundir import THREAD_DUMP_DIR
from monsoon.timeline.events import LOAD

# frames that are only the mechanics of waiting: the blocking frame is the first frame below them
_WAIT_MECHANICS = re.compile(r"^(java\.|jdk\.|sun\.)")
_FRAME = re.compile(r"^\s+at ([\w$.<>/]+)\(")
_STATE = re.compile(r"java\.lang\.Thread\.State: (WAITING|TIMED_WAITING|BLOCKED)")


def blocking_frames(text: str) -> Counter:
    """For each waiting/blocked thread of a ``Thread.print`` dump: its first frame outside the JDK. Threads that
    merely sleep (``Thread.sleep`` on top: timers, health loops) and the ``main`` thread (it parks until shutdown
    in most servers) are not waiting for anything the load needs."""
    out: Counter = Counter()
    for block in text.split("\n\n"):
        if not _STATE.search(block) or block.lstrip().startswith('"main"'):
            continue
        frames = [m.group(1) for m in map(_FRAME.match, block.splitlines()) if m]
        if not frames or frames[0] == "java.lang.Thread.sleep":
            continue
        first = next((f for f in frames if not _WAIT_MECHANICS.match(f)), None)
        if first is not None:
            out[first] += 1
    return out


def dump_frames(run_dir: Path, ignore: tuple[str, ...] = ()) -> tuple[int, Counter]:
    """(dumps read, blocking frames over all of them), leaving out frames that start with ``ignore``."""
    total: Counter = Counter()
    files = sorted((Path(run_dir) / THREAD_DUMP_DIR).glob("*.txt"))
    for f in files:
        for frame, n in blocking_frames(f.read_text(errors="replace")).items():
            if not frame.startswith(ignore):
                total[frame] += n
    return len(files), total


# pools that wait for work all the time: never the cause of a stall
IDLE_WAITERS = ("io.netty.", "org.apache.kafka.", "com.datastax.oss.driver.shaded.netty.", "com.zaxxer.hikari.",
                "io.prometheus.", "com.sun.net.httpserver.", "sun.net.httpserver.")


def no_ingest_stall(run: RunData, min_rate_fraction: float = 0.5, max_latency_ms: float = 2000,
                    idle_cpu_pct: float = 30, min_stall_s: float = 1, max_stalls: float = 1,
                    settle_s: float = 5, in_faults: Literal["skip", "judge"] = "skip") -> Verdict:
    """See the module docstring. ``in_faults: judge``: judge the seconds inside fault windows too, for an experiment
    whose fault only sets the scene (a slow dependency that a healthy service rides out and a starved one stalls
    on), not the cause the check would otherwise let explain them."""
    name = "no_ingest_stall"
    ev = run.events
    loads = [e for e in ev.of(LOAD) if float(e.get("target_rate") or 0) > 0]
    cpu = ev.series("process", "cpu_pct")
    if not loads:
        return Verdict(name, UNKNOWN, {}, "no load seconds in the timeline")
    if not cpu:
        return Verdict(name, UNKNOWN, {}, "no CPU samples of the service (process collector cpu_pct): cannot tell "
                       "a stall from an overload")
    wins = fault_windows(ev)
    t0 = loads[0]["t"]
    stalled: list[tuple[float, float]] = []      # (t, cpu) of each stalled second
    judged = 0
    for e in loads:
        t = e["t"]
        if t < t0 + settle_s or (in_faults != "judge" and any(w.start - 1 <= t and (w.end is None or t <= w.end + 2)
                                                         for w in wins)):
            continue
        c = _nearest(cpu, t)
        if c is None:
            continue
        judged += 1
        slow = (float(e.get("acked") or 0) < min_rate_fraction * float(e["target_rate"])
                or float(e.get("p99_ms") or 0) > max_latency_ms)
        if slow and c < idle_cpu_pct:
            stalled.append((t, c))
    stalls = _group(stalled)
    stalls = [s for s in stalls if s[1] - s[0] + 1 >= min_stall_s]
    durations = [round(b - a + 1, 1) for a, b, _ in stalls]
    figures: dict = {"stalls": len(stalls), "stalled_seconds": round(sum(durations), 1), "judged_seconds": judged}
    if stalls:
        figures["stall_durations_s"] = durations[:50]
        figures["max_stall_s"] = max(durations)
        figures["mean_stall_s"] = round(statistics.mean(durations), 1)
        figures["cpu_during_stalls_pct"] = round(statistics.mean(c for _, _, cs in stalls for c in cs), 1)
        if len(stalls) >= 2:
            gaps = [b[0] - a[0] for a, b in zip(stalls, stalls[1:])]
            figures["period_s"] = round(statistics.median(gaps), 1)
            figures["period_range_s"] = [round(min(gaps), 1), round(max(gaps), 1)]
    dumps, frames = dump_frames(run.dir, IDLE_WAITERS)
    if dumps:
        figures["thread_dumps"] = dumps
        if frames:
            frame, n = frames.most_common(1)[0]
            figures["blocking_frame"] = frame
            figures["blocking_frame_threads"] = n
    if judged == 0:
        return Verdict(name, UNKNOWN, figures, "no load second outside fault windows had a CPU sample")
    what = (f"{len(stalls)} stall(s) of {figures.get('mean_stall_s', 0)} s on average"
            + (f", one every {figures['period_s']} s" if "period_s" in figures else "")
            + (f", CPU {figures['cpu_during_stalls_pct']}% meanwhile" if stalls else "")
            + (f"; threads waiting in {figures['blocking_frame']}" if "blocking_frame" in figures else ""))
    if len(stalls) > max_stalls:
        return Verdict(name, FAIL, figures, f"ingestion stalled while the service sat idle: {what} "
                       f"(acked < {min_rate_fraction:g} x target or p99 > {max_latency_ms:g} ms, CPU < "
                       f"{idle_cpu_pct:g}%; at most {max_stalls:g} allowed)")
    return Verdict(name, PASS, figures, f"{what} in {judged} s judged (at most {max_stalls:g} allowed)"
                   if stalls else f"no stall in {judged} s judged")


def _nearest(series: list[tuple[float, float]], t: float, within: float = 1.5) -> float | None:
    """The value of the sample nearest to ``t`` (``series`` sorted by time), if within ``within`` seconds."""
    i = bisect.bisect_left(series, (t,))
    near = [p for p in series[max(0, i - 1):i + 1] if abs(p[0] - t) <= within]
    return min(near, key=lambda p: abs(p[0] - t))[1] if near else None


def _group(stalled: list[tuple[float, float]], gap: float = 1.6) -> list[tuple[float, float, list[float]]]:
    """Consecutive stalled seconds (at most ``gap`` apart) -> (first t, last t, cpu values)."""
    out: list[tuple[float, float, list[float]]] = []
    for t, c in stalled:
        if out and t - out[-1][1] <= gap:
            a, _, cs = out[-1]
            out[-1] = (a, t, cs + [c])
        else:
            out.append((t, t, [c]))
    return out
