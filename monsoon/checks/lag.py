"""Kafka consumer-lag analysis over a saved timeline: Burrow's status rules, lag in seconds, drain time.

The reasoning, sources and measurements behind it: docs/design.md, "monsoon/checks/lag.py"."""
from __future__ import annotations
from bisect import bisect_left
from dataclasses import dataclass, field

import bisect
import builtins

from monsoon.checks import impossible
from monsoon.checks.base import FAIL, PASS, RunData, UNKNOWN, Verdict, when
from monsoon.checks.burrow import ERRORS, OK, STATUS_NAMES, WARN, kafka_samples, partition_statuses
from monsoon.rundir import ACKED_DATA, STORED_DATA
from monsoon.timeline.columnar import run_file_exists
from monsoon.timeline.views import KILL_KINDS, Window, downtime, fault_windows, silences
from monsoon.timeline.events import DRAIN, LOAD, SAMPLE, SERVICE, SVC_EXIT, SVC_READY


_max = builtins.max  # ``max`` is a check parameter below


# ------------------------------------------------------------ reading samples


# ------------------------------------------------------------ Burrow's rules


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

def lag_bounded(run: RunData, max: float) -> Verdict:
    """The backlog (Kafka consumer lag, else the platform's queue depth) never exceeds ``max``."""
    name = "lag_bounded"
    limit = max
    what, series = run.backlog_series()
    if not series:
        return Verdict(name, UNKNOWN, {"max": limit}, "no kafka lag or queue depth samples in the timeline"
                       + run.backlog_missing())
    bad = impossible.backlog(run.events, what, series)
    if bad is not None:      # a backlog below zero is a wrong metric, not an empty queue
        return Verdict(name, UNKNOWN, {**bad.figures(), "max": limit}, bad.message(name))
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
                       f"{what} peaked at {peak:,.0f} at {when(run, t_peak)}, above the limit {limit:,.0f} "
                       f"(first over at {when(run, over[0][0])}, {len(over)} samples over){drain_note}")
    ts = [t for t, _ in series]
    gap = _max((b - a for a, b in zip(ts, ts[1:])), default=0.0)
    figures["longest_gap_s"] = round(gap, 1)
    if gap > 10.0:
        return Verdict(name, UNKNOWN, figures,
                       f"{what} stayed <= {peak:,.0f} (limit {limit:,.0f}) where sampled, but sampling had a "
                       f"{gap:.0f}s gap: the lag in between is unknown")
    return Verdict(name, PASS, figures,
                   f"{what} peaked at {peak:,.0f} at {when(run, t_peak)} (limit {limit:,.0f}){drain_note}")


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
    figures: dict[str, float] = {"stalled_partitions": len(errs), "worst_status": worst, "partitions": len(per),
               "window": window, "warn_polls": warns}
    if errs:
        firsts = sorted((v[0] for v in errs.values()), key=lambda s: (-s.status, s.t))
        parts = [f"{s.partition} {s.name} at {when(run, s.t)}: {s.reason}" for s in firsts[:3]]
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


def settled_at(series: list[tuple[float, float]], start: float, tol: float, grace: float,
               stop: float | None = None) -> tuple[float | None, tuple[float, float, float] | None]:
    """When the backlog fell to <= ``tol`` for good, from ``start`` on (up to ``stop``): the first sample at
    or below ``tol`` after which it never again stayed above ``tol`` for ``grace`` seconds or more (a
    consumer that catches up and then stalls has not recovered). Returns (time or None, the last relapse
    that undid a recovery as (start, end, peak) or None)."""
    rec = above = None
    peak = 0.0
    relapse = None
    for t, v in series:   # sorted by time
        if t < start:
            continue
        if stop is not None and t >= stop:
            break
        if v <= tol:
            if rec is None:
                rec = t
            above = None
            continue
        if above is None:
            above, peak = t, v
        peak = max(peak, v)
        if rec is not None and t - above >= grace:
            relapse = (above, t, peak)
            rec = None
    if rec is None and relapse is not None and above is not None:
        relapse = (relapse[0], series[-1][0] if stop is None else min(stop, series[-1][0]), peak)
    return rec, relapse


def _relapse_note(relapse: tuple[float, float, float] | None, tol: float) -> str:
    if relapse is None:
        return ""
    a, b, peak = relapse
    return (f"; it had fallen to <= {tol:,.0f}, then rose again at t={a:.0f}s and stayed above it for "
            f"{b - a:.0f}s (peak {peak:,.0f}): a relapse, not a recovery")


def lag_recovers_within(run: RunData, seconds: float, tolerance: float | None = None, grace: float = 10) -> Verdict:
    """After the burst ends (or each fault window ends, or the load ends), the backlog returns to near zero
    (``tolerance``, default about one second of x1 traffic) within ``seconds`` and stays there: rising above
    it again for ``grace`` seconds or more (before the next fault window, or the end of sampling) undoes the
    recovery, so a consumer that drains and then stalls fails."""
    name = "lag_recovers_within"
    what, series = run.backlog_series()
    base = float(run.meta.get("base_rate") or 0)
    tol = tolerance if tolerance is not None else max(10.0, base)  # about one second of x1 traffic
    bad = impossible.backlog(run.events, what, series)
    if bad is not None:      # a backlog below zero is a wrong metric, not an empty queue
        return Verdict(name, UNKNOWN, {**bad.figures(), "tolerance": tol, "limit_s": seconds}, bad.message(name))
    end = run.phase_end("burst")
    if end is None:
        wins = [w for w in fault_windows(run.events) if w.end is not None]
        if wins and series:
            return _recovers_after_faults(run, what, series, wins, seconds, tol, grace)
    anchor = "burst end"
    if end is None:
        end, anchor = run.load_end(), "load end"
    if end is None or not series:
        return Verdict(name, UNKNOWN, {}, f"no {what} samples or no burst/load end in the timeline"
                       + run.backlog_missing())
    peak = max(v for _, v in series)
    lost = vanished_across_death(run, series, tol)
    if lost is not None:
        return _vanished_verdict(run, what, {"peak_lag": peak, "tolerance": tol, "limit_s": seconds,
                                             "lag_at_end": series[-1][1]}, lost, series,
                                 end, anchor, tol, grace)
    after = [(t, v) for t, v in series if t >= end]
    figures = {"peak_lag": peak, "tolerance": tol, "limit_s": seconds}
    if not after:
        return Verdict(name, UNKNOWN, figures, f"no {what} sample after the {anchor}")
    figures["lag_at_burst_end" if anchor == "burst end" else "lag_at_load_end"] = after[0][1]
    figures["lag_at_end"] = series[-1][1]     # the run's last sample, not the burst's end
    rec, relapse = settled_at(series, end, tol, grace)
    if relapse is not None:
        figures["relapses"] = 1
    drain = _drain_figures(run, what, tol)
    figures.update(drain)
    if rec is not None:
        figures["recovery_s"] = round(rec - end, 1)
        ok = rec - end <= seconds
        pred = drain.get("predicted_drain_s")
        note = "" if not drain else (f"; drain from the peak predicted {pred:g}s" if pred is not None else
                                     "; drain from the peak predicted never") + \
            (f", observed {drain['observed_drain_s']:g}s" if drain.get("observed_drain_s") is not None else "")
        return Verdict(name, PASS if ok else FAIL, figures,
                       f"{what} peaked at {peak:,.0f} and fell to <= {tol:,.0f} {rec - end:.1f}s after the {anchor} "
                       f"(limit {seconds:g}s){note}")
    observed = after[-1][0] - end
    figures["recovery_s"] = round(observed, 1)
    figures["final_lag"] = after[-1][1]
    if observed < seconds:
        return Verdict(name, UNKNOWN, figures,
                       f"{what} still {after[-1][1]:,.0f} when sampling ended {observed:.0f}s after the {anchor}, "
                       f"before the {seconds:g}s limit{_relapse_note(relapse, tol)}")
    return Verdict(name, FAIL, figures,
                   f"{what} peaked at {peak:,.0f} and was still {after[-1][1]:,.0f} {observed:.0f}s after the "
                   f"{anchor} (limit {seconds:g}s){_relapse_note(relapse, tol)}")


def _recovers_after_faults(run: RunData, what: str, series: list[tuple[float, float]], wins: list,
                           seconds: float, tol: float, grace: float) -> Verdict:
    """Recovery measured from the end of every fault window (and held until the next window starts): the
    slowest one is judged."""
    name = "lag_recovers_within"
    last_t = series[-1][0]
    recs: list[tuple[Window, float | None, float]] = []   # (window, recovery seconds or None, peak after start)
    relapses = []
    pend = []   # (window, seconds observed before the next window or the end, lag then, next window start)
    starts = sorted(w.start for w in wins)
    ts = [t for t, _ in series]   # sorted: each window looks only at its own slice
    for w in wins:
        since = series[bisect_left(ts, w.start):]
        peak = max((v for _, v in since), default=0.0)
        end = w.end
        if w.kind in KILL_KINDS:   # a killed service builds its backlog once it is back: measure from then
            down = downtime(run.events, w)
            end = max(end, w.start + down) if down is not None else end
        stop = next((s for s in starts if s > w.start), None)
        lo, hi = bisect_left(ts, end), (bisect_left(ts, stop) if stop is not None else len(series))
        seen = series[lo:hi]
        rec, relapse = settled_at(series[lo:], end, tol, grace, stop)
        if relapse is not None:
            relapses.append((w, relapse))
        last = seen[-1] if seen else (end, float("nan"))
        recs.append((w, None if rec is None else rec - end, peak))
        if rec is None:
            pend.append((w, last[0] - end, last[1], stop))
    peak_all = max((p for _, _, p in recs), default=0.0)
    done = [r for _, r, _ in recs if r is not None]
    figures = {"peak_lag": peak_all, "tolerance": tol, "limit_s": seconds, "faults": len(wins),
               "faults_recovered": len(done), "lag_at_end": series[-1][1]}
    if relapses:
        figures["relapses"] = len(relapses)
    if done:
        figures["recovery_s"] = round(max(done), 1)
        figures["recovery_s_mean"] = round(sum(done) / len(done), 1)
    lost = vanished_across_death(run, series, tol)
    if lost is not None:
        return _vanished_verdict(run, what, figures, lost, series, None, "fault window", tol, grace)
    slow = [(w, r) for w, r, _ in recs if r is not None and r > seconds]
    if slow:
        w, r = max(slow, key=lambda x: x[1])
        return Verdict(name, FAIL, figures, f"{what} took {r:.1f}s to fall to <= {tol:,.0f} after {w.name}#{w.window} "
                                            f"ended (limit {seconds:g}s)")
    if pend:
        failed = [p for p in pend if p[1] >= seconds]
        w, waited, lag, stop = failed[0] if failed else pend[0]
        figures["final_lag"] = lag
        verdict = FAIL if failed else UNKNOWN
        why = ("" if verdict == FAIL else f"; the next fault window started at t={stop:.0f}s, before the limit"
               if stop is not None and stop <= last_t else "; sampling ended before the limit")
        note = _relapse_note(next((r for rw, r in relapses if rw is w), None), tol)
        return Verdict(name, verdict, figures,
                       f"{what} still {lag:,.0f} {waited:.0f}s after {w.name}#{w.window} ended "
                       f"(limit {seconds:g}s{why}){note}")
    return Verdict(name, PASS, figures,
                   f"{what} (peak {peak_all:,.0f}) fell to <= {tol:,.0f} within {max(done):.1f}s after each of "
                   f"{len(wins)} fault window(s) (mean {figures['recovery_s_mean']:.1f}s, limit {seconds:g}s)")


def _drain_figures(run: RunData, what: str, tol: float) -> dict:
    """Predicted (backlog / (capacity - inflow)) next to observed drain of the peak Kafka backlog; capacity
    from the run's calibration (base_rate: auto) when it has one, else the fastest consumption observed."""
    if not what.startswith("kafka"):
        return {}
    auto = run.meta.get("base_rate_auto") or {}
    cap = auto.get("capacity_msg_s") if isinstance(auto, dict) else None
    d = drain_time(run.events, tolerance=tol, capacity=float(cap) if cap else None)
    if not d:
        return {}
    out = {k: d[k] for k in ("predicted_drain_s", "observed_drain_s") if d.get(k) is not None}
    if d.get("capacity"):
        out["drain_capacity_msg_s"] = round(d["capacity"], 1)
    return out


VANISH_GAP_S = 5.0      # the backlog sample before a death must be this recent to say what the death took


@dataclass(frozen=True)
class Vanish:
    """A backlog that a service death took: the last backlog sample before the death, and what it became."""
    exit: dict
    t_before: float
    before: float            # the last backlog seen before the death
    after: float             # the first one after it
    verdict: str             # FAIL: lost; UNKNOWN: not seen draining, and nothing tells whether it did
    evidence: str = ""       # how the gap before the death was judged ('' when the sample before it was fresh)
    figures: dict = field(default_factory=dict)


def _fastest_drain(run: RunData, series: list[tuple[float, float]]) -> float:
    """The fastest the backlog could have drained, msg/s: the calibrated capacity when the run has one, and
    never less than the steepest fall seen between two samples of this run."""
    auto = run.meta.get("base_rate_auto") or {}
    cap = auto.get("capacity_msg_s") if isinstance(auto, dict) else None
    deaths = [e["t"] for e in run.events.of(SERVICE, event=SVC_EXIT)]
    seen = max(((a - b) / (tb - ta) for (ta, a), (tb, b) in zip(series, series[1:])
                if tb > ta and not any(ta < d <= tb for d in deaths)), default=0.0)   # a fall across a death is no drain
    return max(float(cap or 0.0), seen, 0.0)


def _acks_between(run: RunData, a: float, b: float) -> int:
    """Messages the fleet had acknowledged (so the platform had taken in) in the load seconds ending in (a, b]."""
    return sum(int(e.get("acked") or 0) for e in run.events.of(LOAD) if a < float(e["t"]) <= b)


def _consumed_between(run: RunData, a: float, b: float) -> tuple[float, float, str] | None:
    """What the platform's own counters say it consumed from ``a`` to its death at ``b``: (consumed, until, which
    counter), from the stored count (an exact or incremental count, not an estimate) or the Kafka committed
    offsets; a counter counts only with a reading at or before ``a`` and one within ``VANISH_GAP_S`` after ``b``
    (the first after the death: what it counts past the death only makes the consumption larger). None when no
    counter covers the gap."""
    stored = [(float(e["t"]), float(e["stored"])) for e in run.events.of(SAMPLE, collector="storage")
              if isinstance(e.get("stored"), (int, float)) and e.get("counted", "exact") in ("exact", "incremental")]
    kafka = [(t, c) for t, _, c in _totals(kafka_samples(run.events))]
    for counter, pts in (("the stored count", stored), ("the Kafka committed offsets", kafka)):
        if impossible.backwards(pts, counter, run.events) is not None:
            continue     # a count that fell with nothing to reset it cannot say what was consumed
        lo = [v for t, v in pts if t <= a]
        hi = next(((t, v) for t, v in pts if t >= b), None)
        if lo and hi is not None and hi[0] - b <= VANISH_GAP_S:
            return max(0.0, hi[1] - lo[-1]), hi[0], counter
    return None


def _accounting_loss(run: RunData) -> int | None:
    """Acked messages the run's accounting (acked vs stored, after a drain that settled) finds never stored;
    None when it cannot say (no acked or stored dataset, or the drain did not settle: late is not lost)."""
    drain = run.events.first(DRAIN)
    if drain is None or not drain.get("drained"):
        return None
    if not (run_file_exists(run.dir / ACKED_DATA) and run_file_exists(run.dir / STORED_DATA)):
        return None
    return int(run.accounting.acked_lost)


def _unseen(run: RunData, series: list[tuple[float, float]], t0: float, before: float, death: dict,
            tol: float) -> tuple[str, str, dict] | None:
    """A backlog last seen at ``t0`` (``before`` queued), not seen again before ``death``: was it drained in the
    gap? Only the platform's own counters can say so; without them it counts as vanished (FAIL) when the
    run's accounting finds acked messages never stored, or when even the fastest drain could not have emptied
    it; else nobody can tell (UNKNOWN). None: the counters show it drained. Returns (verdict, evidence,
    figures)."""
    td = float(death["t"])
    gap = td - t0
    silent = [s for s in silences(run.events) if s.start < td and (s.end is None or s.end > t0)]
    why = f"not seen for {gap:.0f}s before the death" + \
        (f" ({silent[0].collector} silent from t={silent[0].start:.0f}s: {silent[0].reason[:80]})" if silent else "")
    figures: dict = {"unseen_s": round(gap, 1)}
    counted = _consumed_between(run, t0, td)
    if counted is not None:
        consumed, until, counter = counted
        acks = _acks_between(run, t0, until)
        left = before + acks - consumed
        figures.update(consumed_in_gap=consumed, acked_in_gap=acks, backlog_at_death=max(0.0, round(left)))
        if left <= 2 * tol:
            return None
        return FAIL, (f"{why}; in it {counter} rose by {consumed:,.0f} while the fleet had {acks:,} acked: about "
                      f"{left:,.0f} still queued at the death"), figures
    lost = _accounting_loss(run)
    if lost is not None:
        figures["acked_lost"] = lost
        if lost <= 2 * tol:
            return None    # everything acked was stored: whatever was queued was drained
        return FAIL, (f"{why}, and no counter of the platform covers the gap; the accounting finds {lost:,} "
                      f"acked messages never stored"), figures
    fastest = _fastest_drain(run, series)
    if before - fastest * gap > 2 * tol:
        return FAIL, (f"{why}; even the fastest drain ({fastest:,.0f} msg/s) could not have emptied it in "
                      f"that time"), figures
    return UNKNOWN, (f"{why}, and no counter of the platform (stored count, committed offsets) nor the "
                     f"accounting tells whether it drained in between"), figures


def vanished_across_death(run: RunData, series: list[tuple[float, float]], tol: float) -> Vanish | None:
    """The first service death across which the backlog vanished: above twice the tolerance in the last sample
    before the death, and at or below the tolerance, or a tenth of what it was, in the first sample after. A
    dead service processes nothing, so such a drop is the backlog lost, not drained; wherever in the run the
    death happens (during the burst, in a fault window, or in the recovery), and whatever caused it (an OOM, a
    crash, an injected kill). When the last sample is older than ``VANISH_GAP_S`` (a JVM thrashing towards its
    OutOfMemoryError stops answering its metrics: real TB, 11 s and 31 s without a sample before the death), a
    backlog not seen draining is not drained (:func:`_unseen`): only the platform's own counters can show that
    it was, and without them the verdict is FAIL or UNKNOWN, never a recovery."""
    ts = [t for t, _ in series]
    for e in run.events.of(SERVICE, event=SVC_EXIT):
        i = bisect_left(ts, e["t"])
        if i == 0 or i >= len(series):
            continue
        (t0, before), (_, after) = series[i - 1], series[i]
        if not (before > 2 * tol and after <= max(tol, before / 10)):
            continue
        if e["t"] - t0 <= VANISH_GAP_S:
            return Vanish(e, t0, before, after, FAIL)
        judged = _unseen(run, series, t0, before, e, tol)
        if judged is None:
            continue
        return Vanish(e, t0, before, after, *judged)
    return None


def _second_life(run: RunData, series: list[tuple[float, float]], v: Vanish, end: float | None, anchor: str,
                 tol: float, grace: float) -> tuple[str, dict]:
    """What the restarted service did with the backlog it built again, reported apart from the first life's."""
    td = float(v.exit["t"])
    back = next((float(e["t"]) for e in run.events.of(SERVICE, event=SVC_READY, service=v.exit.get("service"))
                 if e["t"] >= td), None)
    later = [(t, x) for t, x in series if t > td]
    if not later:
        return "", {}
    peak = max(x for _, x in later)
    figures: dict = {"second_life_peak": peak}
    start = max(end, later[0][0]) if end is not None else later[0][0]
    rec, _ = settled_at(later, start, tol, grace)
    where = f" (back at t={back:.0f}s)" if back is not None else ""
    if rec is None:
        return (f"; apart from that, the second life{where} queued up to {peak:,.0f} and was still "
                f"{later[-1][1]:,.0f} when sampling ended"), figures
    after = f"{rec - end:.1f}s after the {anchor}" if end is not None else f"at t={rec:.0f}s"
    if end is not None:
        figures["second_life_recovery_s"] = round(rec - end, 1)
    return f"; apart from that, the second life{where} queued up to {peak:,.0f} and fell to <= {tol:,.0f} {after}", figures


def _vanished_verdict(run: RunData, what: str, figures: dict, v: Vanish, series: list[tuple[float, float]],
                      end: float | None = None, anchor: str = "burst end", tol: float = 0.0,
                      grace: float = 10) -> Verdict:
    e, before, after = v.exit, v.before, v.after
    cause = e.get('cause') or 'exit ' + str(e.get('code'))
    if not v.evidence:     # the sample before the death was fresh (the message of runs before the gap rule)
        figures = {**figures, "emptied_by_crash": 1, "backlog_vanished": before}
        return Verdict("lag_recovers_within", FAIL, figures,
                       f"{what} was {before:,.0f} when {e['service']} died ({cause})"
                       f" at t={e['t']:.0f}s and {after:,.0f} once it was back — the backlog vanished with the process: "
                       f"lost, not drained, so this is no recovery")
    second, more = _second_life(run, series, v, end, anchor, tol, grace)
    figures = {**figures, **v.figures, **more}
    head = (f"{what} was {before:,.0f} at t={v.t_before:.0f}s, last seen before {e['service']} died ({cause}) at "
            f"t={e['t']:.0f}s, and {after:,.0f} once it was back: {v.evidence}")
    if v.verdict == FAIL:
        figures.update(emptied_by_crash=1, backlog_vanished=figures.get("backlog_at_death", before))
        return Verdict("lag_recovers_within", FAIL, figures,
                       f"{head} — a backlog not seen draining is not drained: it vanished with the process, lost, so "
                       f"this is no recovery{second}")
    figures["backlog_unseen"] = before
    return Verdict("lag_recovers_within", UNKNOWN, figures,
                   f"{head} — a backlog not seen draining is not a recovery{second}")
