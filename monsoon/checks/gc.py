"""Garbage-collection time as the sign of saturation: *when* and *for how long* a JVM spent more than a
fraction of its wall time collecting.

The reasoning, sources and measurements behind it: docs/design.md, "monsoon/checks/gc.py"."""
from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate
from typing import Literal

from monsoon.checks import impossible
from monsoon.checks.base import FAIL, PASS, RunData, UNKNOWN, Verdict
from monsoon.timeline.views import counter_steps
from monsoon.timeline.events import CALIBRATION_STEP


@dataclass(frozen=True)
class Stretch:
    start: float          # timeline seconds
    end: float
    worst: float          # the highest windowed GC fraction inside it

    @property
    def seconds(self) -> float:
        return self.end - self.start


def gc_rate_series(points: list[tuple[float, float]], window_s: float = 5.0) -> list[tuple[float, float, float]]:
    """``[(t, window_start, fraction)]``: per sample (from the second on), the GC counter's increase over the
    trailing ``window_s`` seconds (at least one sample interval) / the wall time it spans. Resets count from 0."""
    pts = sorted((float(t), float(v)) for t, v in points)
    inc = [0.0, *accumulate(counter_steps(pts))]  # cumulative increase, reset-aware
    out: list[tuple[float, float, float]] = []
    j = 0
    for i in range(1, len(pts)):
        t = pts[i][0]
        while j < i - 1 and pts[j + 1][0] <= t - window_s:
            j += 1
        # j: the latest sample at or before t - window_s (or i - 1 when the samples are sparse)
        span = t - pts[j][0]
        if span <= 0:
            continue
        out.append((t, pts[j][0], max(0.0, (inc[i] - inc[j]) / span)))
    return out


def gc_stretches(points: list[tuple[float, float]], fraction: float, window_s: float = 5.0) -> list[Stretch]:
    """Runs of consecutive samples whose trailing-window GC fraction (:func:`gc_rate_series`) is above
    ``fraction``; overlapping runs merge.  A run's bounds are trimmed to the sample intervals inside it that
    were themselves above ``fraction`` (the window only decides *whether*; the intervals say *when*)."""
    pts = sorted((float(t), float(v)) for t, v in points)
    hot_iv = [(a, b) for (a, _), (b, _), d in zip(pts, pts[1:], counter_steps(pts))
              if b > a and d / (b - a) > fraction]
    runs: list[list[tuple[float, float, float]]] = [[]]
    for p in gc_rate_series(pts, window_s):
        if p[2] > fraction:
            runs[-1].append(p)
        elif runs[-1]:
            runs.append([])
    out: list[Stretch] = []
    for run in (r for r in runs if r):
        a, b = run[0][1], run[-1][0]
        inside = [(x, y) for x, y in hot_iv if x >= a and y <= b]
        if inside:
            a, b = inside[0][0], inside[-1][1]
        s = Stretch(a, b, max(f for _, _, f in run))
        if out and s.start <= out[-1].end:
            last = out.pop()
            s = Stretch(last.start, max(last.end, s.end), max(last.worst, s.worst))
        out.append(s)
    return out


def _phase_at(phases: list[dict], t: float) -> str | None:
    return next((p["name"] for p in phases if float(p["start"]) <= t < float(p["end"])), None)


def kept_up_windows(events) -> list[tuple[float, float]]:
    """The measured windows ``(start, end)`` (timeline seconds) of the calibration steps that kept up: the
    ``calibration-step`` events a ramp writes (a sweep's, a request mix's, a calibration's) with ``ok`` true."""
    return [(float(e["window"][0]), float(e["window"][1])) for e in events.of(CALIBRATION_STEP)
            if e.get("ok") and isinstance(e.get("window"), list) and len(e["window"]) == 2]


def _series_and_stretches(points: list[tuple[float, float]], fraction: float, window_s: float,
                          windows: list[tuple[float, float]] | None
                          ) -> tuple[list[tuple[float, float, float]], list[Stretch]]:
    """:func:`gc_rate_series` and :func:`gc_stretches` of the whole series (``windows`` None), or of each window's
    samples (plus the one before it, so its first interval counts) concatenated: between windows is not judged."""
    if windows is None:
        return gc_rate_series(points, window_s), gc_stretches(points, fraction, window_s)
    pts = sorted((float(t), float(v)) for t, v in points)
    series: list[tuple[float, float, float]] = []
    stretches: list[Stretch] = []
    for a, b in windows:
        part = [p for p in pts if p[0] < a][-1:] + [p for p in pts if a <= p[0] <= b]
        series += gc_rate_series(part, window_s)
        stretches += gc_stretches(part, fraction, window_s)
    return series, stretches


def gc_time_below(run: RunData, fraction: float = 0.1, window_s: float = 5.0, max_seconds: float = 0.0,
                  over: Literal["run", "kept-up"] = "run") -> Verdict:
    """The observed JVM never spent more than ``fraction`` of its wall time in GC (over any trailing
    ``window_s`` seconds) for more than ``max_seconds`` in all; says when and for how long it did.

    ``over: kept-up`` judges only the measured windows of the ramp steps that kept up (:func:`kept_up_windows`):
    a sweep or a request mix ends each ramp with a step the platform did not keep up with, by design, and GC
    there is what stopped it (said in its result), not a defect of the platform at its capacity."""
    name = "gc_time_below"
    figures: dict[str, float] = {"fraction": float(fraction), "window_s": float(window_s)}
    points = run.events.series("metrics", "gc_seconds")
    bad = impossible.backwards(points, impossible.GC_SECONDS, run.events)
    if bad is not None:      # a GC-time counter that runs backwards measures something else
        return Verdict(name, UNKNOWN, {**figures, **bad.figures()}, bad.message(name))
    scope = ""
    if over == "kept-up":
        windows = kept_up_windows(run.events)
        if not windows:
            return Verdict(name, UNKNOWN, figures, "over: kept-up, but the timeline has no ramp step that kept up "
                                                   "(calibration-step events with ok and window): nothing to judge")
        series, stretches = _series_and_stretches(points, fraction, window_s, windows)
        figures.update(kept_up_steps=len(windows), judged_s=round(sum(b - a for a, b in windows), 1))
        scope = f" (judged over the {len(windows)} ramp steps that kept up, {figures['judged_s']:g}s)"
    else:
        series, stretches = _series_and_stretches(points, fraction, window_s, None)
    if not series:
        return Verdict(name, UNKNOWN, figures, "fewer than two gc_seconds samples (the JVM's GC-time counter, "
                                               "observe.metrics.gc_seconds): nothing to judge" + scope)
    worst = max(f for _, _, f in series)
    hot = sum(s.seconds for s in stretches)
    figures.update(worst_gc_fraction=round(worst, 4), gc_over_s=round(hot, 1), gc_stretches=len(stretches),
                   mean_gc_fraction=round(sum(f for _, _, f in series) / len(series), 4))
    phases = run.events.phases()
    t0 = float(phases[0]["start"]) if phases else series[0][0]
    stack = run.meta.get("stack")
    service = f"the JVM behind {stack}'s metrics endpoint" if stack else "the JVM behind the metrics endpoint"

    def where(s: Stretch) -> str:
        ph = _phase_at(phases, s.start) or _phase_at(phases, s.end)
        return (f"{s.start - t0:+.0f}s..{s.end - t0:+.0f}s ({s.seconds:.0f}s"
                + (f", in {ph}" if ph else "") + f", up to {s.worst * 100:.0f}%)")
    if stretches:
        figures["first_over_s"] = round(stretches[0].start - t0, 1)
        desc = "; ".join(where(s) for s in stretches[:6]) + (f"; +{len(stretches) - 6} more" if len(stretches) > 6
                                                              else "")
        msg = (f"{service} spent more than {fraction * 100:g}% of its wall time in GC (over {window_s:g}s "
               f"windows) for {hot:.0f}s in {len(stretches)} stretch(es), times from the load's start: {desc}"
               + scope)
        if hot > max_seconds:
            return Verdict(name, FAIL, figures, msg + (f" (allowed {max_seconds:g}s)" if max_seconds else ""))
        return Verdict(name, PASS, figures, msg + f", within the {max_seconds:g}s allowed")
    return Verdict(name, PASS, figures, f"GC time stayed within {fraction * 100:g}% of wall time over every "
                                        f"{window_s:g}s window (worst {worst * 100:.1f}%, {len(series)} samples)"
                                        + scope)
