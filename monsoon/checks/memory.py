"""Memory checks over a saved run: leak slope (heap after GC, RSS) and the fraction of time spent in GC.

The reasoning, sources and measurements behind it: docs/design.md, "monsoon/checks/memory.py"."""
from __future__ import annotations

import bisect
import builtins
import math
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from monsoon.checks import impossible
from monsoon.checks.base import FAIL, PASS, RunData, UNKNOWN, Verdict
from monsoon.rundir import GC_LOG
from monsoon.timeline.views import counter_steps, fault_spans
from monsoon.timeline.events import LOAD, OP, OP_LOAD_END, SAMPLE


MIN_POINTS = 10
T_SIGNIFICANT = 3.0

_UNIT_MB = {"B": 1.0 / (1024 * 1024), "K": 1.0 / 1024, "M": 1.0, "G": 1024.0}
_PAUSE = re.compile(
    r"GC\((?P<id>\d+)\)\s+Pause\s+(?P<kind>[A-Za-z][A-Za-z ]*?)\s*(?:\([^)]*\)\s*)*"
    r"(?P<before>\d+(?:\.\d+)?)(?P<bu>[BKMG])->(?P<after>\d+(?:\.\d+)?)(?P<au>[BKMG])"
    r"\((?P<total>\d+(?:\.\d+)?)(?P<tu>[BKMG])\)\s+(?P<ms>\d+(?:\.\d+)?)ms")
_DECOR = re.compile(r"\[([^\]]+)\]")


@dataclass(frozen=True)
class GcPause:
    uptime_s: float | None
    wall: float | None  # epoch seconds from the ``time`` decorator
    kind: str  # "Young", "Full", "Remark", ...
    before_mb: float
    after_mb: float
    total_mb: float
    pause_ms: float
    jvm: int  # 0 for the first JVM in the file, +1 at each restart (uptime going back)


def _decorations(line: str) -> tuple[float | None, float | None]:
    wall = up = None
    for d in _DECOR.findall(line[:120]):
        d = d.strip()
        if up is None and re.fullmatch(r"\d+(?:\.\d+)?s", d):
            up = float(d[:-1])
        elif up is None and re.fullmatch(r"\d+ms", d):
            up = float(d[:-2]) / 1000.0
        elif wall is None and re.match(r"\d{4}-\d\d-\d\dT", d):
            try:
                wall = datetime.strptime(d, "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
            except ValueError:
                pass
    return up, wall


def parse_gc_log(text: str) -> list[GcPause]:
    """Every ``Pause`` line with a heap transition, in file order."""
    out: list[GcPause] = []
    jvm, last_up = 0, None
    for line in text.splitlines():
        m = _PAUSE.search(line)
        if not m:
            continue
        up, wall = _decorations(line)
        if up is not None and last_up is not None and up < last_up:
            jvm += 1
        if up is not None:
            last_up = up
        out.append(GcPause(up, wall, m["kind"].strip(),
                           float(m["before"]) * _UNIT_MB[m["bu"]], float(m["after"]) * _UNIT_MB[m["au"]],
                           float(m["total"]) * _UNIT_MB[m["tu"]], float(m["ms"]), jvm))
    return out


def gc_log_files(run_dir: Path) -> dict[str, list[Path]]:
    """``services/<service>/gc.log`` and the files the JVM rotated away (``gc.log.0``, ``gc.log.001``, ...: at
    every restart and at the size limit), oldest first: ``gc.log`` last, the others by the wall time their first
    line is decorated with (rotation reuses numbers), else by modification time (which a copy of the run, or a
    git checkout of a kept one, does not keep)."""
    out: dict[str, list[Path]] = {}
    rotated = GC_LOG + "."
    for p in Path(run_dir).glob(f"services/*/{GC_LOG}*"):
        if p.name == GC_LOG or (p.name.startswith(rotated) and p.name[len(rotated):].isdigit()):
            out.setdefault(p.parent.name, []).append(p)

    def age(p: Path) -> tuple[int, float]:
        try:
            with p.open("rb") as fh:
                first = fh.readline(200).decode(errors="replace")
            wall = _decorations(first)[1]
            return (p.name == GC_LOG, wall if wall is not None else p.stat().st_mtime)
        except OSError:
            return (p.name == GC_LOG, 0.0)
    return {svc: sorted(ps, key=age) for svc, ps in sorted(out.items())}


def gc_logs(run_dir: Path) -> dict[str, list[GcPause]]:
    """Parsed GC logs of a run by service, every JVM life in order (rotated files first, see
    :func:`gc_log_files`; ``GcPause.jvm`` counts the lives)."""
    out = {}
    for svc, files in gc_log_files(run_dir).items():
        text = []
        for p in files:
            try:
                text.append(p.read_text(errors="replace"))
            except OSError:
                continue
        out[svc] = parse_gc_log("\n".join(text))
    return out


# ------------------------------------------------------------ statistics

@dataclass(frozen=True)
class Slope:
    n: int
    per_hour: float  # units (MB) per hour
    se_per_hour: float
    t: float
    span_s: float    # the time covered by the points (summed over the lives when there are several)
    first: float     # the fitted line at the start and the end of the last life
    last: float
    lives: int = 1

    @property
    def significant(self) -> bool:
        return self.t > T_SIGNIFICANT


def pooled_slope(lives: list[list[tuple[float, float]]]) -> Slope | None:
    """One least-squares slope of (seconds, MB) in MB/hour shared by several process lives, each with its own
    intercept (a restart starts from a new baseline; a leak shows as the same climb in every life), with its
    standard error ``sqrt(SSR / (n - lives - 1) / Sxx)`` (within-life sums) and t-statistic."""
    groups = [[(x / 3600.0, y) for x, y in sorted(g)] for g in lives if len(g) >= 2]
    n, k = sum(len(g) for g in groups), len(groups)
    if not groups or n - k - 1 < 1:
        return None
    sxx = sxy = 0.0
    means = []
    for g in groups:
        mx, my = sum(x for x, _ in g) / len(g), sum(y for _, y in g) / len(g)
        means.append((mx, my))
        sxx += sum((x - mx) ** 2 for x, _ in g)
        sxy += sum((x - mx) * (y - my) for x, y in g)
    if sxx <= 0:
        return None
    b = sxy / sxx
    ssr = sum((y - my - b * (x - mx)) ** 2 for g, (mx, my) in zip(groups, means) for x, y in g)
    se = math.sqrt(ssr / (n - k - 1) / sxx)
    if se > 0:
        t = b / se
    else:
        t = math.inf if b > 0 else (-math.inf if b < 0 else 0.0)
    (mx, my), g = means[-1], groups[-1]
    span = sum((g_[-1][0] - g_[0][0]) * 3600.0 for g_ in groups)
    return Slope(n, b, se, t, span, my + b * (g[0][0] - mx), my + b * (g[-1][0] - mx), k)


def ols_slope(points: list[tuple[float, float]]) -> Slope | None:
    """Least-squares slope of (seconds, MB) in MB/hour with its standard error and t-statistic."""
    return pooled_slope([points]) if len(points) >= 3 else None


def back_half(points: list[tuple]) -> list[tuple]:
    """The points (time first) in the second half of the series' time span."""
    if not points:
        return []
    pts = sorted(points)
    mid = (pts[0][0] + pts[-1][0]) / 2.0
    return [p for p in pts if p[0] >= mid]


# ------------------------------------------------------------ series

def heap_after_gc(pauses: list[GcPause]) -> tuple[list[list[tuple[float, float]]], str]:
    """(seconds, MB after GC) of every JVM life in the log, each life's back half; full-GC pauses only when
    there are enough of them."""
    if not pauses:
        return [], "no GC pauses"
    use_wall = all(p.wall is not None for p in pauses)
    if not use_wall and not all(p.uptime_s is not None for p in pauses):
        return [], "GC log lines have neither a time nor an uptime decorator"
    halves = []
    for jvm in sorted({p.jvm for p in pauses}):
        halves.append(back_half([((p.wall if use_wall else p.uptime_s), p.after_mb, p.kind)
                                 for p in pauses if p.jvm == jvm]))
    full = [[(x, y) for x, y, k in h if k.startswith("Full")] for h in halves]
    if sum(len(f) for f in full) >= MIN_POINTS:
        return [f for f in full if f], "heap after full GC"
    return [[(x, y) for x, y, _ in h] for h in halves], "heap after GC"


def rss_series(events) -> list[list[tuple[float, float]]]:
    """(t, rss_mb) of the process samples, one list per pid (process life), in order."""
    lives: dict = {}
    for e in events.of(SAMPLE, collector="process"):
        v = e.get("rss_mb")
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            lives.setdefault(e.get("pid"), []).append((e["t"], float(v)))
    return list(lives.values())


def between_faults(points: list[tuple], spans: list[tuple[float, float]]) -> list[list[tuple]]:
    """The points (time first, sorted) outside every span, cut into pieces at the spans.  A fault may shift a
    process's level once (a Kafka reconnect's buffers, a heap that grew): given its own baseline, each piece
    shows only the climb between faults, which is what a leak is.  One bisect per point."""
    merged: list[list[float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = builtins.max(merged[-1][1], b)
        else:
            merged.append([a, b])
    starts = [a for a, _ in merged]
    pieces: dict[int, list[tuple]] = {}
    for p in points:
        k = bisect.bisect_right(starts, p[0])
        if k and p[0] < merged[k - 1][1]:
            continue                      # inside a fault window or its grace
        pieces.setdefault(k, []).append(p)
    return [pieces[k] for k in sorted(pieces)]


# ------------------------------------------------------------ the checks

def _judge(key: str, label: str, lives: list[list[tuple[float, float]]], cap: float,
           min_minutes: float, pieces: str = "process lives") -> tuple[str, dict, str, bool]:
    """(verdict, figures, message, too_short) for one series (its lives' back halves)."""
    npts = sum(len(g) for g in lives)
    if npts < MIN_POINTS:
        return UNKNOWN, {f"{key}_points": npts}, f"{label}: only {npts} point(s) in the back half", False
    s = pooled_slope(lives)
    if s is None:
        return UNKNOWN, {f"{key}_points": npts}, f"{label}: all points at the same time", False
    fig = {f"{key}_slope_mb_per_h": round(s.per_hour, 2), f"{key}_t": round(s.t, 2) if math.isfinite(s.t) else 1e9,
           f"{key}_points": s.n, f"{key}_span_min": round(s.span_s / 60.0, 1)}
    if s.lives > 1:
        fig[f"{key}_lives"] = s.lives
        desc = (f"{label} over the back halves of {s.lives} {pieces} ({s.span_s / 60:.0f} min, each from "
                f"its own baseline; last {s.first:,.0f} -> {s.last:,.0f} MB): "
                f"slope {s.per_hour:+,.1f} MB/h (se {s.se_per_hour:,.1f}, t={s.t:.1f}, n={s.n})")
    else:
        desc = (f"{label} {s.first:,.0f} -> {s.last:,.0f} MB over the last {s.span_s / 60:.0f} min: "
                f"slope {s.per_hour:+,.1f} MB/h (se {s.se_per_hour:,.1f}, t={s.t:.1f}, n={s.n})")
    if s.significant and s.per_hour > cap:
        if s.span_s < min_minutes * 60.0:
            return UNKNOWN, fig, (desc + f" above {cap:g} MB/h, but {s.span_s / 60:.0f} min is too short "
                                  f"(< {min_minutes:g} min) to tell a warm-up ramp from a leak"), True
        return FAIL, fig, desc + f" is significant and above the cap {cap:g} MB/h", False
    why = "not significant" if not s.significant else f"within the cap {cap:g} MB/h"
    return PASS, fig, desc + f": {why}", False


def no_memory_leak(run: RunData, max_mb_per_hour: float = 50, min_minutes: float = 10) -> Verdict:
    """Neither heap-after-GC (GC log) nor RSS grows significantly faster than ``max_mb_per_hour`` over the
    back half of the run (see the module docstring for the test)."""
    name = "no_memory_leak"
    cap = float(max_mb_per_hour)
    results = []  # (verdict, message, too_short)
    figures: dict[str, float] = {"max_mb_per_hour": cap}
    logs = gc_logs(run.dir)
    for svc, pauses in logs.items():
        pts, label = heap_after_gc(pauses)
        key, label = ("heap", label) if len(logs) == 1 else (f"heap.{svc}", f"{svc} {label}")
        v, f, m, short = _judge(key, label, pts, cap, min_minutes)
        figures.update(f)
        results.append((v, m, short))
    rss_all = rss_series(run.events)
    if rss_all or not logs:
        halves = [back_half(g) for g in rss_all]
        spans = fault_spans(run.events)
        cut: list[list[tuple]] | None
        cut = [piece for h in halves for piece in between_faults(h, spans)]
        if len(cut) == len(halves) or sum(len(c) for c in cut) < MIN_POINTS:
            cut = None            # no fault in a back half, or one that fills it (a short chaos run): as they are
        v, f, m, short = _judge("rss", "rss", cut or halves, cap, min_minutes,
                                "process lives cut at fault windows" if cut else "process lives")
        figures.update(f)
        results.append((v, m, short))
    order = {FAIL: 0, UNKNOWN: 1, PASS: 2}
    msg = "; ".join(m for _, m, _ in sorted(results, key=lambda r: order[r[0]]))
    verdicts = [v for v, _, _ in results]
    if not logs and not rss_all:
        return Verdict(name, UNKNOWN, figures, "no GC log and no process RSS samples: nothing to judge")
    if FAIL in verdicts:
        return Verdict(name, FAIL, figures, msg)
    if any(short for _, _, short in results) or UNKNOWN in verdicts:   # fail > unknown > pass: a series
        return Verdict(name, UNKNOWN, figures, msg)                       # that can't be judged proves nothing
    return Verdict(name, PASS, figures, msg)


def _wall_offset(events) -> float | None:
    """wall - t of the timeline (the median over events), to map epoch times onto the timeline clock."""
    offs = sorted(float(e["wall"]) - float(e["t"]) for e in events.events
                  if isinstance(e.get("wall"), (int, float)) and isinstance(e.get("t"), (int, float)))
    return offs[len(offs) // 2] if offs else None


def timeline_gc_pauses(run_dir: Path, events) -> list[tuple[float, GcPause]]:
    """Every GC pause of a run's GC logs (every service, every JVM life) with its time on the timeline clock
    (its ``time`` decorator mapped through the events' wall times), in time order; [] when it cannot be mapped."""
    off = _wall_offset(events)
    if off is None:
        return []
    return sorted(((p.wall - off, p) for ps in gc_logs(run_dir).values() for p in ps if p.wall is not None),
                  key=lambda x: x[0])


def gc_fractions(run: RunData) -> tuple[str, list[tuple[str, float, float, float]]]:
    """(source, [(phase, gc seconds, wall seconds, fraction)]) per phase (or the whole run)."""
    series = run.events.series("metrics", "gc_seconds")
    phases = [(p["name"], float(p["start"]), float(p["end"])) for p in run.events.phases()]
    out = []
    if len(series) >= 2:
        if not phases:
            phases = [("run", series[0][0], series[-1][0])]
        for n, a, b in phases:
            pts = [(t, v) for t, v in series if a <= t <= b]
            if len(pts) < 2 or pts[-1][0] - pts[0][0] < 1.0:
                continue
            gc, wall = sum(counter_steps(pts)), pts[-1][0] - pts[0][0]
            out.append((n, gc, wall, gc / wall))
        return "gc_seconds counter", out
    pauses = timeline_gc_pauses(run.dir, run.events)
    if not pauses:
        return "", []
    ts = [(t, p.pause_ms / 1000.0) for t, p in pauses]
    if not phases:
        phases = [("run", ts[0][0], ts[-1][0])]
    for n, a, b in phases:
        if b - a < 1.0:
            continue
        gc = sum(d for t, d in ts if a <= t < b)
        out.append((n, gc, b - a, gc / (b - a)))
    return "GC log pauses", out


def gc_time_fraction(run: RunData, max_fraction: float = 0.2) -> Verdict:
    """In no phase does the JVM spend more than ``max_fraction`` of wall time in GC."""
    name = "gc_time_fraction"
    bad = impossible.backwards(run.events.series("metrics", "gc_seconds"), impossible.GC_SECONDS, run.events)
    if bad is not None:      # a GC-time counter that runs backwards measures something else
        return Verdict(name, UNKNOWN, {**bad.figures(), "max_fraction": float(max_fraction)}, bad.message(name))
    source, rows = gc_fractions(run)
    if not rows:
        return Verdict(name, UNKNOWN, {"max_fraction": float(max_fraction)},
                       "no gc_seconds samples and no timed GC log covering a phase: nothing to judge")
    worst = builtins.max(rows, key=lambda r: r[3])
    figures = {"worst_gc_fraction": round(worst[3], 4), "max_fraction": float(max_fraction)}
    for n, _, _, f in rows:
        figures[f"gc_fraction.{n}"] = round(f, 4)
    desc = ", ".join(f"{n} {f * 100:.1f}% ({gc:.1f}s of {w:.0f}s)" for n, gc, w, f in rows)
    if worst[3] > max_fraction:
        return Verdict(name, FAIL, figures,
                       f"the JVM spent {worst[3] * 100:.1f}% of the {worst[0]} in GC ({worst[1]:.1f}s of "
                       f"{worst[2]:.0f}s), above {max_fraction * 100:g}% [{source}: {desc}]")
    return Verdict(name, PASS, figures, f"GC time within {max_fraction * 100:g}% [{source}: {desc}]")


# ------------------------------------------------------------ thread leaks

def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2.0


def thread_series(events) -> tuple[int | None, list[tuple[float, float]]]:
    """(pid, [(t, threads)]) of the process samples of the last pid."""
    samples = [e for e in events.of(SAMPLE, collector="process")
               if isinstance(e.get("threads"), (int, float)) and not isinstance(e.get("threads"), bool)]
    if not samples:
        return None, []
    pid = samples[-1].get("pid")
    return pid, [(e["t"], float(e["threads"])) for e in samples if e.get("pid") == pid]


def connected_series(events) -> list[tuple[float, int]]:
    """(t, devices connected) of every second of the load."""
    return [(e["t"], int(e["connected"])) for e in events.of(LOAD)
            if isinstance(e.get("connected"), (int, float)) and not isinstance(e.get("connected"), bool)]


def no_thread_leak(run: RunData, min_increase: float = 20, max_per_reconnect: float = 0.25,
                   window_s: float = 10) -> Verdict:
    """The observed service does not keep a thread per device reconnect.

    Compares the service's thread count (``process`` samples, last pid only) in the ``window_s`` seconds
    before the first device disconnect (the baseline, every device connected) with the last ``window_s``
    seconds of the load (every device connected again), medians of each.  ``reconnects`` = devices that
    connected again in between (the rises of the fleet's per-second ``connected`` count).  Fails when the
    count grew by at least ``min_increase`` threads **and** by at least ``max_per_reconnect`` threads per
    reconnect: pools that grow to a bounded size once (HTTP workers, lookup threads) stay under
    ``min_increase``; a leak grows with every reconnect.  Unknown without thread samples in both windows, or
    when no device reconnected (nothing exercised the reconnect path, whatever the count did).
    """
    name = "no_thread_leak"
    figures: dict[str, float] = {"min_increase": float(min_increase), "max_per_reconnect": float(max_per_reconnect)}
    pid, threads = thread_series(run.events)
    if not threads:
        return Verdict(name, UNKNOWN, figures, "no process thread samples in the timeline")
    t_pid0, t_pid1 = threads[0][0], threads[-1][0]
    conn = [(t, c) for t, c in connected_series(run.events) if t_pid0 <= t <= t_pid1]
    end = run.load_end()
    end = min(end, t_pid1) if end is not None else t_pid1
    # the first disconnect during this pid's life: the second where fewer devices are connected than before
    first_drop = next((t for (_, a), (t, b) in zip(conn, conn[1:]) if b < a), None)
    base_end = first_drop if first_drop is not None else end - window_s
    base = [v for t, v in threads if base_end - window_s <= t < base_end]
    last = [v for t, v in threads if end - window_s <= t <= end]
    after = [(t, c) for t, c in conn if first_drop is not None and t >= first_drop]
    reconnects = sum(max(0, b - a) for (_, a), (_, b) in zip(after, after[1:]))
    figures["reconnects"] = reconnects
    le = run.events.first(OP, op=OP_LOAD_END)
    if le is not None and isinstance(le.get("reconnects"), (int, float)):
        figures["reconnect_attempts"] = le["reconnects"]
    if len(base) < 3 or len(last) < 3:
        return Verdict(name, UNKNOWN, figures,
                       f"too few thread samples of pid {pid} before the first disconnect ({len(base)}) or at the "
                       f"end of the load ({len(last)}) to compare")
    b, e = _median(base), _median(last)
    inc = e - b
    figures.update(threads_baseline=b, threads_end=e, thread_increase=inc, threads_peak=max(v for _, v in threads))
    if reconnects:
        figures["threads_per_reconnect"] = round(inc / reconnects, 3)
    desc = (f"threads {b:.0f} before the first disconnect -> {e:.0f} at the end of the load "
            f"({inc:+.0f}) across {reconnects} device reconnect(s)")
    if reconnects == 0:
        return Verdict(name, UNKNOWN, figures, desc + ": no device reconnected, the reconnect path was not exercised")
    if inc >= min_increase and inc / reconnects >= max_per_reconnect:
        return Verdict(name, FAIL, figures,
                       desc + f": {inc / reconnects:.2f} per reconnect, above +{min_increase:g} threads and "
                              f"{max_per_reconnect:g} per reconnect: a thread leak")
    return Verdict(name, PASS, figures, desc + f": within +{min_increase:g} threads or {max_per_reconnect:g} per "
                                              f"reconnect")


# At the bottom on purpose: checks.py imports this module at its end to register the checks,
# so whichever of the two is imported first, both finish loading.
