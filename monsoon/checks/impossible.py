"""Samples that cannot be true: a backlog gauge below zero, a cumulative counter that goes backwards with no
restart to explain it.

A wrong metric is not a quiet one. A backlog gauge built from the wrong series (``'put_total - done_total'``
with the terms the wrong way round, a selector on the wrong queue) went to -166 .. -1,121 in a user's run, and
``lag_recovers_within`` read it as "peaked at 0, drained": a pass on a number nobody measured. A check that
reads such a series says ``unknown`` instead, naming the metric and its first impossible sample (time and
value): :func:`negative` for a gauge that counts things (a queue depth, a consumer lag), :func:`backwards` for a
counter (``gc_seconds``, the exact stored count). A counter's drop is a reset, not an error, when something
could have restarted the process in between: a service's start, exit, restart or stop in the timeline, an
injected kill's window, or a gap in the samples long enough to hide a restart (Prometheus' ``increase`` reads
every drop as a reset; here only a drop nothing explains is impossible)."""
from __future__ import annotations

from dataclasses import dataclass

from monsoon.checks.burrow import kafka_samples
from monsoon.timeline.views import KILL_KINDS, fault_windows
from monsoon.timeline.events import SERVICE, SVC_DONE, SVC_EXIT, SVC_READY, SVC_RESTART, SVC_START, SVC_STOP


#: the JVM's cumulative GC-time counter, as the stack file names it
GC_SECONDS = "gc_seconds (observe.metrics.gc_seconds)"

#: service events after which a process's counters start again from zero
RESTART_EVENTS = (SVC_START, SVC_EXIT, SVC_RESTART, SVC_READY, SVC_STOP, SVC_DONE)

#: a gap between two samples at least this long (or this many median sample intervals) may hide a restart
RESTART_GAP_S = 3.0
RESTART_GAP_INTERVALS = 2.5


@dataclass(frozen=True)
class Impossible:
    """The first sample of ``metric`` that cannot be true, and how many such samples the series has."""
    metric: str           # what the stack file calls it, e.g. "queue depth (observe.metrics.queue_depth)"
    t: float              # the first impossible sample's time (timeline seconds)
    value: float          # its value
    rule: str             # why it cannot be: "a queue depth is never negative", "a counter only rises, ..."
    count: int            # impossible samples in the series
    worst: str            # the worst of them, said: "lowest -1,121", "largest unexplained fall 40"
    samples: int          # samples in the series
    advice: str = "fix the metric's selector or formula in the stack file"

    def figures(self) -> dict[str, float]:
        return {"impossible_samples": self.count, "first_impossible_t": round(self.t, 1),
                "first_impossible_value": self.value}

    def message(self, check: str = "the check") -> str:
        more = (f"; {self.count:,} of {self.samples:,} samples impossible, {self.worst}"
                if self.count > 1 else f"; 1 of {self.samples:,} samples")
        return (f"{self.metric} cannot be true: {self.value:,.6g} at t={self.t:.0f}s ({self.rule}){more}. "
                f"A wrong metric is not a zero: {check} cannot judge on it; {self.advice}")


def _fmt(v: float) -> str:
    return f"{v:,.6g}"


def negative(series: list[tuple[float, float]], metric: str, what: str = "a backlog",
             uncounted: float = 0.0) -> Impossible | None:
    """The first sample below zero of a gauge that counts things (``what`` says which: a queue depth, a consumer
    lag), None when every sample is >= 0. ``uncounted``: how far below zero a sample may be and still be what the
    platform finishes without counting it in (``observe.queue_depth_uncounted`` x the devices), not a wrong
    metric."""
    bad = [(t, v) for t, v in series if v < -uncounted]
    if not bad:
        return None
    return Impossible(metric, bad[0][0], bad[0][1], f"{what} is never negative", len(bad),
                      f"lowest {_fmt(min(v for _, v in bad))}", len(series))


def restart_marks(events) -> tuple[list[float], list[tuple[float, float | None]]]:
    """When something could have restarted a process: the times of service lifecycle events, and the spans of
    injected kill windows (end None: never healed)."""
    marks = sorted(float(e["t"]) for e in events.of(SERVICE) if e.get("event") in RESTART_EVENTS)
    spans = [(w.start, w.end) for w in fault_windows(events) if w.kind in KILL_KINDS]
    return marks, spans


def _median_step(series: list[tuple[float, float]]) -> float:
    steps = sorted(b[0] - a[0] for a, b in zip(series, series[1:]) if b[0] > a[0])
    return steps[len(steps) // 2] if steps else 0.0


def backwards(series: list[tuple[float, float]], metric: str, events=None) -> Impossible | None:
    """The first drop of a cumulative counter that no restart explains (:func:`restart_marks`, or a gap in the
    samples that could hide one), None when it only rises or every drop is a reset; also a counter below zero
    (no counter starts below zero)."""
    pts = sorted(series)
    bad: list[tuple[float, float, str, float]] = []    # (t, value, rule, size)
    marks, spans = restart_marks(events) if events is not None else ([], [])
    gap = max(RESTART_GAP_S, RESTART_GAP_INTERVALS * _median_step(pts))
    for i, (t, v) in enumerate(pts):
        if v < 0:
            bad.append((t, v, "a counter is never negative", abs(v)))
            continue
        if i == 0:
            continue
        ta, a = pts[i - 1]
        if v >= a - 1e-9 * max(1.0, abs(a)):
            continue
        explained = (t - ta >= gap or any(ta <= m <= t for m in marks)
                     or any(s <= t and (e is None or e >= ta) for s, e in spans))
        if not explained:
            bad.append((t, v, f"a counter only rises, and it fell from {_fmt(a)} at t={ta:.0f}s with no restart "
                              "in between", a - v))
    if not bad:
        return None
    t, v, rule, _ = bad[0]
    return Impossible(metric, t, v, rule, len(bad), f"largest unexplained fall {_fmt(max(b[3] for b in bad))}",
                      len(pts))


#: the backlog series :meth:`RunData.backlog_series` names, as the stack file names them, and what they count
BACKLOGS = {"kafka consumer lag": ("kafka consumer lag (observe.kafka)", "a consumer lag"),
            "queue depth": ("queue depth (observe.metrics.queue_depth)", "a queue depth")}


def backlog(events, what: str, series: list[tuple[float, float]]) -> Impossible | None:
    """The backlog series of a run (``what``: its name from :meth:`RunData.backlog_series`) below zero; for a
    Kafka lag also a partition whose committed offset is past its log end (a negative lag that the lag poll
    writes as 0, so the total alone cannot show it)."""
    metric, counts = BACKLOGS.get(what, (what, "a backlog"))
    meta = events.meta()
    per_device = meta.get("queue_depth_uncounted") if what == "queue depth" else None
    found = negative(series, metric, counts, float(per_device or 0) * float(meta.get("devices") or 0))
    if not what.startswith("kafka"):
        return found
    over = []
    for s in kafka_samples(events):
        for name, p in s["partitions"].items():
            try:
                end, c = float(p["end"]), float(p["committed"])
            except (KeyError, TypeError, ValueError):
                continue
            if c >= 0 and end >= 0 and c > end:
                over.append((s["t"], name, end - c))
    if not over or (found is not None and found.t <= over[0][0]):
        return found
    t, name, lag = over[0]
    return Impossible(f"kafka consumer lag of {name} (observe.kafka)", t, lag,
                      "its committed offset is past its log end, and a consumer lag is never negative", len(over),
                      f"lowest {_fmt(min(x[2] for x in over))}", len(series),
                      "was the topic recreated or the group's offsets moved during the run?")
