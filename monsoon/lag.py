"""Kafka consumer-lag analysis over a saved timeline: Burrow's status rules, lag in seconds, drain time.

Everything here is a pure function of the ``kafka`` samples in the timeline
(``{"type": "sample", "collector": "kafka", "t": .., "lag": N, "partitions":
{"<topic>-<p>": {"end": E, "committed": C, "lag": L}}}``, about 1 Hz;
``committed`` is -1 while the group has committed nothing; a sample carries
``error`` instead of values when the broker was unreachable).

Burrow's consumer-lag evaluation rules
--------------------------------------
Source: linkedin/Burrow wiki, "Consumer Lag Evaluation Rules"
(https://github.com/linkedin/Burrow/wiki/Consumer-Lag-Evaluation-Rules), the
evaluator ``core/internal/evaluator/caching.go`` (functions ``isLagAlwaysNotZero``,
``checkIfOffsetsRewind``, ``checkIfOffsetsStopped``, ``checkIfOffsetsStalled``,
``checkIfLagNotDecreasing``, ``checkIfRecentLagZero``) and PR #716 ("Allow rewind
detection when previous zero lag").  Implemented here from those descriptions:

Burrow keeps, per partition, a sliding window of the last ``intervals`` (default
10) committed offsets, each with its timestamp and the lag when it was seen, and
evaluates the partition at time ``now``:

0. If the current lag is zero the partition is OK: no rule can make it an error.
1. (Rule 1) If the lag was zero anywhere in the window, the partition is OK.
2. (Rule 2, REWIND) If the committed offset ever goes down from one entry to the next.
   Since PR #716 a rewind is reported even when the lag was zero earlier in the
   window, unless the consumer has since recovered (committed again at or beyond
   the offset it had before the rewind); so this is checked before rule 1.
3. (Rule 3, STOP) If ``now`` minus the newest commit's timestamp is larger than the
   span between the oldest and newest commit in the window, the consumer has stopped
   committing.  Current Burrow checks this before rule 1 too, and suppresses it when a
   recent log-end offset was <= the last committed offset (the consumer was caught up
   a moment ago, ``checkIfRecentLagZero``; here "recent" = the polls since the last commit).
4. (Rule 4, STALL) If every committed offset in the window is the same (the consumer
   commits but does not move) while there is lag.
5. (Rule 5, WARN) If the offsets move but the lag never decreases across the window
   (each entry's lag >= the previous one): the consumer is falling behind.
6. Otherwise OK.  The group's status is its worst partition; STOP, STALL and REWIND
   are errors.  Status numbers are Burrow's ``StatusConstant`` values
   (OK=1, WARN=2, ERR=3, STOP=4, STALL=5, REWIND=6).

How monsoon maps its data onto Burrow's window (an honest approximation): Burrow
sees every commit from ``__consumer_offsets``; monsoon polls the committed offset
about once a second.  Each poll is one window entry (timestamp = poll time), so
``window=10`` means the last ten polls.  A poll cannot tell a consumer that
re-commits the same offset from one that commits nothing, so a dead consumer whose
offsets are still stored shows as STALL (both are errors).  STOP is reported when
the committed offset of a partition stops being reported (it goes back to -1 or
the partition vanishes from successful polls) for longer than the window spanned,
and, as a monsoon extension, when a partition has had lag but no committed offset
for a whole window (the consumer never started).  Partitions with fewer than
``window`` entries are not judged (Burrow's completeness rule).

Lag in seconds
--------------
The kafka-lag-exporter way (lightbend/seglo kafka-lag-exporter, README "Interpolation" and
issue #5 "Interpolate for less variable consumer lag in time estimates"): keep a table
of (time, log-end offset) per partition, find the interval the committed offset falls
in and interpolate linearly the time at which the log-end offset equalled it; the lag
in seconds is ``now`` minus that time.  Here the table holds the whole run (the
exporter keeps a sliding window); before the oldest entry the first rising
segment's slope is extrapolated (monsoon's choice).
"""
from __future__ import annotations

import bisect
import builtins
from collections import deque
from dataclasses import dataclass
from typing import Iterable

OK, WARN, ERR, STOP, STALL, REWIND = 1, 2, 3, 4, 5, 6
STATUS_NAMES = {OK: "OK", WARN: "WARN", ERR: "ERR", STOP: "STOP", STALL: "STALL", REWIND: "REWIND"}
ERRORS = (STOP, STALL, REWIND)

_max = builtins.max  # ``max`` is a check parameter below


@dataclass(frozen=True)
class Entry:
    """One observation of a partition: poll time, committed offset (None = not committed), log-end, lag."""
    t: float
    committed: int | None
    end: int
    lag: int


@dataclass(frozen=True)
class PartitionStatus:
    partition: str
    t: float
    status: int
    reason: str

    @property
    def name(self) -> str:
        return STATUS_NAMES[self.status]


# ------------------------------------------------------------ reading samples

def kafka_samples(events) -> list[dict]:
    """Kafka samples that carry partition data (error samples are left out)."""
    return [e for e in events.of("sample", collector="kafka")
            if isinstance(e.get("partitions"), dict) and "error" not in e]


def partition_history(samples: list[dict]) -> dict[str, list[Entry]]:
    """Per partition, one entry per successful poll.  A partition missing from a poll after it was seen
    is recorded as not committed (its last known log-end offset carried forward)."""
    out: dict[str, list[Entry]] = {}
    for s in samples:
        parts = s["partitions"]
        for name in set(parts) | set(out):
            p = parts.get(name)
            if p is None:
                prev = out[name][-1]
                out[name].append(Entry(s["t"], None, prev.end, prev.lag))
                continue
            try:
                end = int(p["end"])
                c = int(p["committed"])
            except (KeyError, TypeError, ValueError):
                continue
            lag = int(p.get("lag", end - c if c >= 0 else end))
            out.setdefault(name, []).append(Entry(s["t"], c if c >= 0 else None, end, _max(lag, 0)))
    return out


# ------------------------------------------------------------ Burrow's rules

def evaluate_window(entries: list[Entry], now: float | None = None, window: int = 10) -> tuple[int, str]:
    """Burrow's status of one partition at ``now`` from its recent polls (newest last).

    Returns (status, reason).  ``entries`` may be longer than ``window``; the last
    ``window`` committed offsets form Burrow's window.
    """
    if not entries:
        return OK, "no data"
    now = entries[-1].t if now is None else now
    cur = entries[-1]
    recent = entries[-window:]
    commits = [e for e in entries if e.committed is not None][-window:]
    if not commits:
        # monsoon extension: lag but never a committed offset over a whole window
        if len(recent) >= window and all(e.lag > 0 for e in recent):
            return STOP, f"no committed offset while lag grew to {cur.lag:,}"
        return OK, "nothing committed, no lag"
    last = commits[-1]
    current_lag = cur.lag if cur.committed is not None else _max(cur.end - last.committed, 0)
    if len(commits) < window:   # Burrow's completeness rule first: a short window judges nothing
        return OK, f"incomplete window ({len(commits)}/{window}){', caught up' if current_lag == 0 else ''}"
    if current_lag == 0:
        return OK, "caught up"
    # Rule 2 (REWIND, PR #716 order): a decrease not yet recovered from
    for a, b in zip(commits, commits[1:]):
        if b.committed < a.committed and last.committed < _max(c.committed for c in commits if c.t <= a.t):
            return REWIND, f"committed offset went back from {a.committed:,} to {b.committed:,} at t={b.t:.0f}s"
    # Rule 3 (STOP): silent for longer than the window spanned, unless caught up a moment ago
    span = last.t - commits[0].t
    # Burrow keeps a short ring of recent log-end offsets; here: the polls since the last commit
    recently_caught_up = any(e.end <= last.committed for e in recent if e.t >= last.t)
    if now - last.t > span and not recently_caught_up:
        return STOP, (f"no committed offset for {now - last.t:.0f}s (window spanned {span:.0f}s), "
                      f"last {last.committed:,}, lag {current_lag:,}")
    # Rule 1: lag zero anywhere in the window
    if any(e.lag == 0 for e in commits):
        return OK, "lag was zero in the window"
    # Rule 4 (STALL): offsets do not move
    if all(e.committed == commits[0].committed for e in commits):
        return STALL, (f"committed offset stuck at {last.committed:,} for {len(commits)} polls "
                       f"({span:.0f}s) while lag went {commits[0].lag:,} -> {current_lag:,}")
    # Rule 5 (WARN): offsets move, lag never decreases
    if all(b.lag >= a.lag for a, b in zip(commits, commits[1:])):
        return WARN, f"lag never decreased over {len(commits)} polls ({commits[0].lag:,} -> {last.lag:,})"
    return OK, "consuming"


def partition_statuses(events, window: int = 10) -> dict[str, list[PartitionStatus]]:
    """Burrow's status of every partition evaluated at every successful poll."""
    samples = kafka_samples(events)
    hist = partition_history(samples)
    out: dict[str, list[PartitionStatus]] = {}
    for name, entries in hist.items():
        res = []
        commits: deque[Entry] = deque(maxlen=window)
        recent: deque[Entry] = deque(maxlen=window)
        for e in entries:  # only what the rules look at: the last `window` commits and polls
            recent.append(e)
            if e.committed is not None:
                commits.append(e)
            seen = {id(x) for x in recent}
            tail = sorted([x for x in commits if id(x) not in seen] + list(recent), key=lambda x: x.t)
            st, why = evaluate_window(tail, e.t, window)
            res.append(PartitionStatus(name, e.t, st, why))
        out[name] = res
    return out


def group_status(statuses: Iterable[PartitionStatus]) -> int:
    """Worst partition status (Burrow's group status); ERR when any partition is in error."""
    worst = _max((s.status for s in statuses), default=OK)
    return ERR if worst in ERRORS else worst


# ------------------------------------------------------------ lag in seconds

def lag_seconds(table: list[tuple[float, float]], committed: float, now: float) -> float | None:
    """Seconds since the log-end offset was ``committed``, from a (time, log-end) table (kafka-lag-exporter)."""
    pts = sorted(table)
    return _lag_seconds([t for t, _ in pts], [e for _, e in pts], committed, now)


def _lag_seconds(times: list[float], ends: list[float], committed: float, now: float) -> float | None:
    """``lag_seconds`` on a time-ordered table with non-decreasing log-end offsets (binary search)."""
    if not times:
        return None
    i = bisect.bisect_right(ends, committed)  # first entry whose log-end is past the committed offset
    if i == len(ends):
        return 0.0
    if i > 0:
        t0, e0, t1, e1 = times[i - 1], ends[i - 1], times[i], ends[i]
        return _max(0.0, now - (t0 + (committed - e0) * (t1 - t0) / (e1 - e0)))
    # older than the table: extrapolate the first segment with a rising log-end
    j = bisect.bisect_right(ends, ends[0])
    if j == len(ends):
        return _max(0.0, now - times[0])
    rate = (ends[j] - ends[0]) / (times[j] - times[0])
    return _max(0.0, now - (times[0] - (ends[0] - committed) / rate))


def lag_seconds_series(events) -> list[tuple[float, float]]:
    """(t, worst partition lag in seconds) at every successful poll."""
    tables: dict[str, tuple[list[float], list[float]]] = {}
    out = []
    for s in kafka_samples(events):
        worst = None
        for name, p in s["partitions"].items():
            try:
                end, c = float(p["end"]), float(p["committed"])
            except (KeyError, TypeError, ValueError):
                continue
            times, ends = tables.setdefault(name, ([], []))
            if ends and end < ends[-1]:  # the log-end went back (partition recreated): start over
                times.clear()
                ends.clear()
            times.append(s["t"])
            ends.append(end)
            ls = _lag_seconds(times, ends, c if c >= 0 else 0.0, s["t"])
            if ls is not None:
                worst = ls if worst is None else _max(worst, ls)
        if worst is not None:
            out.append((s["t"], worst))
    return out


# ------------------------------------------------------------ drain time

def _totals(samples: list[dict]) -> list[tuple[float, float, float]]:
    """(t, sum of log-end, sum of committed) for polls where every partition has a committed offset."""
    out = []
    names = None
    for s in samples:
        parts = s["partitions"]
        try:
            if not parts or any(int(p["committed"]) < 0 for p in parts.values()):
                continue
            if names is not None and set(parts) != names:
                names = set(parts)
                out = []  # the partition set changed: rates across it are meaningless
            names = set(parts)
            out.append((s["t"], float(sum(int(p["end"]) for p in parts.values())),
                        float(sum(int(p["committed"]) for p in parts.values()))))
        except (KeyError, TypeError, ValueError):
            continue
    return out


def max_rate(points: list[tuple[float, float]], span: float = 5.0) -> float | None:
    """Largest average rate of a counter over any stretch of at least ``span`` seconds."""
    best = None
    j = 0
    for i in range(len(points)):
        while j < i and points[i][0] - points[j + 1][0] >= span:
            j += 1
        dt = points[i][0] - points[j][0]
        if dt >= span * 0.5 and dt > 0:
            r = (points[i][1] - points[j][1]) / dt
            best = r if best is None else _max(best, r)
    return best


def predicted_drain_s(backlog: float, capacity: float, inflow: float) -> float | None:
    """Queueing arithmetic: a backlog drains at (capacity - inflow) per second; None when it never drains."""
    if backlog <= 0:
        return 0.0
    if capacity <= inflow:
        return None
    return backlog / (capacity - inflow)


def drain_time(events, tolerance: float = 10.0, span: float = 5.0, capacity: float | None = None) -> dict | None:
    """Predicted vs observed drain of the peak Kafka backlog.

    capacity = ``capacity`` when given (a calibrated capacity, measured apart from this run), else
    the largest observed consumption rate (delta committed / delta t over ``span`` seconds, summed
    over partitions: measured during the drain itself, so the prediction can only check the
    arithmetic); inflow = the production rate (delta
    log-end / delta t) from the peak until the lag fell to ``tolerance`` (or sampling
    ended); predicted = backlog / (capacity - inflow).  None without usable samples.
    """
    tot = _totals(kafka_samples(events))
    if len(tot) < 3:
        return None
    lags = [(t, e - c) for t, e, c in tot]
    i_peak = builtins.max(range(len(lags)), key=lambda i: lags[i][1])
    t_peak, backlog = lags[i_peak]
    source = "calibration" if capacity else "observed"
    capacity = capacity or max_rate([(t, c) for t, _, c in tot], span)
    out: dict = {"backlog": backlog, "peak_t": t_peak, "capacity": capacity, "capacity_source": source}
    i_done = next((i for i in range(i_peak, len(lags)) if lags[i][1] <= tolerance), None)
    if backlog <= tolerance:
        out.update(observed_drain_s=0.0, predicted_drain_s=0.0, inflow=None)
        return out
    i_end = i_done if i_done is not None else len(tot) - 1
    if i_end > i_peak:
        inflow = (tot[i_end][1] - tot[i_peak][1]) / (tot[i_end][0] - tot[i_peak][0])
    else:
        inflow = None
    out["inflow"] = inflow
    out["observed_drain_s"] = round(tot[i_done][0] - t_peak, 1) if i_done is not None else None
    out["predicted_drain_s"] = (predicted_drain_s(backlog, capacity, inflow)
                                if capacity is not None and inflow is not None else None)
    if out["predicted_drain_s"] is not None:
        out["predicted_drain_s"] = round(out["predicted_drain_s"], 1)
    return out


# ------------------------------------------------------------ the checks

def _when(run: RunData, t: float) -> str:
    s = f"t={t:.0f}s"
    for p in run.events.phases():
        if p["start"] <= t < p["end"]:
            return s + f" ({t - p['start']:.0f}s into the {p['name']})"
    return s


def lag_bounded(run: RunData, max: float) -> Verdict:
    """The backlog (Kafka consumer lag, else the platform's queue depth) never exceeds ``max``."""
    name = "lag_bounded"
    limit = max
    what, series = run.backlog_series()
    if not series:
        return Verdict(name, UNKNOWN, {"max": limit}, "no kafka lag or queue depth samples in the timeline")
    t_peak, peak = builtins.max(series, key=lambda p: p[1])
    figures: dict[str, float] = {"peak_lag": peak, "max": limit}
    if what.startswith("kafka"):
        ls = lag_seconds_series(run.events)
        if ls:
            figures["peak_lag_s"] = round(builtins.max(v for _, v in ls), 1)
        base = float(run.meta.get("base_rate") or 0)
        d = drain_time(run.events, tolerance=_max(10.0, base))
        if d:
            for k in ("predicted_drain_s", "observed_drain_s"):
                if d.get(k) is not None:
                    figures[k] = d[k]
    drain_note = ""
    if "predicted_drain_s" in figures or "observed_drain_s" in figures:
        p = figures.get("predicted_drain_s")
        o = figures.get("observed_drain_s")
        drain_note = (f"; drain predicted {p:g}s" if p is not None else "; drain predicted never") + \
                     (f", observed {o:g}s" if o is not None else ", not observed")
    over = [(t, v) for t, v in series if v > limit]
    if over:
        figures["samples_over"] = len(over)
        return Verdict(name, FAIL, figures,
                       f"{what} peaked at {peak:,.0f} at {_when(run, t_peak)}, above the limit {limit:,.0f} "
                       f"(first over at {_when(run, over[0][0])}, {len(over)} samples over){drain_note}")
    ts = [t for t, _ in series]
    gap = _max((b - a for a, b in zip(ts, ts[1:])), default=0.0)
    figures["longest_gap_s"] = round(gap, 1)
    if gap > 10.0:
        return Verdict(name, UNKNOWN, figures,
                       f"{what} stayed <= {peak:,.0f} (limit {limit:,.0f}) where sampled, but sampling had a "
                       f"{gap:.0f}s gap: the lag in between is unknown")
    return Verdict(name, PASS, figures,
                   f"{what} peaked at {peak:,.0f} at {_when(run, t_peak)} (limit {limit:,.0f}){drain_note}")


def consumer_not_stalled(run: RunData, window: int = 10) -> Verdict:
    """No partition is ever STOP, STALL or REWIND by Burrow's rules over a window of ``window`` polls."""
    name = "consumer_not_stalled"
    window = int(window)
    if window < 2:
        return Verdict(name, UNKNOWN, {}, f"window must be >= 2 polls, got {window}")
    per = partition_statuses(run.events, window)
    if not per:
        return Verdict(name, UNKNOWN, {}, "no kafka partition samples in the timeline")
    judged = {p: sts for p, sts in per.items()
              if sum(1 for s in sts if not s.reason.startswith(("incomplete", "no data", "nothing"))) > 0}
    errs = {p: [s for s in sts if s.status in ERRORS] for p, sts in per.items()}
    errs = {p: v for p, v in errs.items() if v}
    worst = _max((s.status for sts in per.values() for s in sts), default=OK)
    warns = sum(1 for sts in per.values() for s in sts if s.status == WARN)
    figures = {"stalled_partitions": len(errs), "worst_status": worst, "partitions": len(per),
               "window": window, "warn_polls": warns}
    if errs:
        firsts = sorted((v[0] for v in errs.values()), key=lambda s: (-s.status, s.t))
        parts = [f"{s.partition} {s.name} at {_when(run, s.t)}: {s.reason}" for s in firsts[:3]]
        return Verdict(name, FAIL, figures,
                       f"worst status {STATUS_NAMES[worst]} ({worst}); {len(errs)} partition(s) in error: "
                       + "; ".join(parts))
    if not judged:
        return Verdict(name, UNKNOWN, figures,
                       f"no partition had a full window of {window} polls: cannot judge the consumer")
    return Verdict(name, PASS, figures,
                   f"{len(per)} partition(s) never STOP/STALL/REWIND over {window}-poll windows "
                   f"(worst {STATUS_NAMES[worst]}, {warns} WARN poll(s))")


# At the bottom on purpose: checks.py imports this module at its end to register the checks,
# so whichever of the two is imported first, both finish loading.
from .checks import FAIL, PASS, UNKNOWN, RunData, Verdict  # noqa: E402
