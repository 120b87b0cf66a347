"""Checks: pure functions of a saved run directory -> Verdict.

A check never talks to a live system.  It reads the timeline, the acked log
written by the fleet and the stored-messages export, so ``monsoon analyze``
can re-run it offline.  Verdicts are ``pass``, ``fail`` or ``unknown``
(the data can't decide); they compose: fail beats unknown beats pass.
"""
from __future__ import annotations

import inspect
from bisect import bisect_left
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable

from .timeline import Events

PASS, FAIL, UNKNOWN = "pass", "fail", "unknown"
_RANK = {PASS: 0, UNKNOWN: 1, FAIL: 2}

ACKED_FILE = "acked.csv"
STORED_FILE = "stored.csv"         # written by a monsoon.accounting.StoredSource
TIMELINE_FILE = "timeline.jsonl"


@dataclass(frozen=True)
class Verdict:
    name: str
    verdict: str
    figures: dict[str, float] = field(default_factory=dict)
    message: str = ""

    def to_dict(self) -> dict:
        return {"name": self.name, "verdict": self.verdict, "figures": self.figures, "message": self.message}


def combine(verdicts: list[str]) -> str:
    """fail beats unknown beats pass; nothing to judge is unknown."""
    if not verdicts:
        return UNKNOWN
    return max(verdicts, key=_RANK.__getitem__)


class RunData:
    """Everything a check may read, loaded lazily from a run directory."""

    def __init__(self, dir: Path, events: Events | None = None):
        self.dir = Path(dir)
        self._events = events

    @property
    def events(self) -> Events:
        if self._events is None:
            self._events = Events.load(self.dir / TIMELINE_FILE)
        return self._events

    @property
    def meta(self) -> dict:
        return self.events.meta()

    @cached_property
    def accounting(self):
        """Every (device, seq) accounted for across sent.csv, acked.csv and stored.csv
        (:func:`monsoon.accounting.account`; computed once, shared by the checks that need it)."""
        from .accounting import account
        return account(self.dir)

    @cached_property
    def latency_histograms(self):
        """Ack-latency HdrHistograms summed per phase (and ``all``) from the fleet's per-second interval log
        (:func:`monsoon.hdrlog.phase_histograms`); None when the run has no such log."""
        from .hdrlog import LATENCY_FILE, phase_histograms
        p = self.dir / LATENCY_FILE
        return phase_histograms(p, self.events.phases()) if p.exists() else None

    def load_end(self) -> float | None:
        e = self.events.first("op", op="load-end")
        return e["t"] if e else None

    def phase_end(self, name: str) -> float | None:
        p = self.events.phase(name)
        return p["end"] if p else None

    def backlog_series(self) -> tuple[str, list[tuple[float, float]]]:
        """Kafka consumer lag when the stack has Kafka, else the platform's queue depth."""
        lag = self.events.series("kafka", "lag")
        if lag:
            return "kafka consumer lag", lag
        return "queue depth", self.events.series("metrics", "queue_depth")


# ---------------------------------------------------------------- the checks

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
    end = run.phase_end("burst")
    if end is None:
        from .faultchecks import fault_windows
        wins = [w for w in fault_windows(run.events) if w.end is not None]
        if wins and series:
            return _recovers_after_faults(run, what, series, wins, seconds, tol, grace)
    anchor = "burst end"
    if end is None:
        end, anchor = run.load_end(), "load end"
    if end is None or not series:
        return Verdict(name, UNKNOWN, {}, f"no {what} samples or no burst/load end in the timeline")
    peak = max(v for _, v in series)
    after = [(t, v) for t, v in series if t >= end]
    figures = {"peak_lag": peak, "tolerance": tol, "limit_s": seconds}
    if not after:
        return Verdict(name, UNKNOWN, figures, f"no {what} sample after the {anchor}")
    figures["lag_at_end"] = after[0][1]
    rec, relapse = settled_at(series, end, tol, grace)
    if relapse is not None:
        figures["relapses"] = 1
    drain = _drain_figures(run, what, tol)
    figures.update(drain)
    if rec is not None:
        figures["recovery_s"] = round(rec - end, 1)
        crash = _emptied_by_crash(run, series, rec, tol)
        if crash is not None:
            figures["emptied_by_crash"] = 1
            return Verdict(name, FAIL, figures,
                           f"{what} peaked at {peak:,.0f} and did not drain: it vanished when {crash['service']} "
                           f"died ({crash.get('cause', 'exit')}) at t={crash['t']:.0f}s — the backlog was lost, "
                           f"not processed")
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
    from .faultchecks import explained_by_kill
    name = "lag_recovers_within"
    explained = explained_by_kill(run.events)
    last_t = series[-1][0]
    recs: list[tuple[object, float | None, float]] = []   # (window, recovery seconds or None, peak after start)
    from .faultchecks import KILL_KINDS, downtime
    crashed = []
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
        if rec is not None:
            crash = _emptied_by_crash(run, since, rec, tol)
            if crash is not None and ("exit", crash["service"], crash["t"]) not in explained:
                crashed.append((w, crash))
        last = seen[-1] if seen else (end, float("nan"))
        recs.append((w, None if rec is None else rec - end, peak))
        if rec is None:
            pend.append((w, last[0] - end, last[1], stop))
    peak_all = max((p for _, _, p in recs), default=0.0)
    done = [r for _, r, _ in recs if r is not None]
    figures = {"peak_lag": peak_all, "tolerance": tol, "limit_s": seconds, "faults": len(wins),
               "faults_recovered": len(done)}
    if relapses:
        figures["relapses"] = len(relapses)
    if done:
        figures["recovery_s"] = round(max(done), 1)
        figures["recovery_s_mean"] = round(sum(done) / len(done), 1)
    if crashed:
        w, crash = crashed[0]
        figures["emptied_by_crash"] = 1
        return Verdict(name, FAIL, figures,
                       f"{what} did not drain after {w.name}#{w.window}: it vanished when {crash['service']} died "
                       f"({crash.get('cause', 'exit')}) at t={crash['t']:.0f}s — the backlog was lost, not processed")
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
    from .lag import drain_time
    auto = run.meta.get("base_rate_auto") or {}
    cap = auto.get("capacity_msg_s") if isinstance(auto, dict) else None
    d = drain_time(run.events, tolerance=tol, capacity=float(cap) if cap else None)
    if not d:
        return {}
    out = {k: d[k] for k in ("predicted_drain_s", "observed_drain_s") if d.get(k) is not None}
    if d.get("capacity"):
        out["drain_capacity_msg_s"] = round(d["capacity"], 1)
    return out


def _emptied_by_crash(run: RunData, series: list[tuple[float, float]], rec: float, tol: float) -> dict | None:
    """The service exit, if any, between the last above-tolerance backlog sample and ``rec``."""
    high = [t for t, v in series if t < rec and v > tol]
    if not high:
        return None
    t_hi = high[-1]
    return next((e for e in run.events.of("service", event="exit") if t_hi <= e["t"] <= rec), None)


CHECKS: dict[str, Callable[..., Verdict]] = {
    "lag_recovers_within": lag_recovers_within,
}


def check_base(name: str) -> str:
    """The registered check behind a verdict's name: ``latency_objective[steady]`` -> ``latency_objective``."""
    return name.split("[", 1)[0]


def validate_check(name: str, params: dict[str, Any]) -> None:
    """Raise ValueError naming what is wrong with a check reference."""
    if name not in CHECKS:
        raise ValueError(f"unknown check {name!r} (known: {', '.join(sorted(CHECKS))})")
    sig = inspect.signature(CHECKS[name])
    accepted = [p for p in list(sig.parameters)[1:]]
    for k, v in params.items():
        if k not in accepted:
            raise ValueError(f"check {name!r} has no parameter {k!r} (accepts: {', '.join(accepted) or 'none'})")
        default = sig.parameters[k].default
        if isinstance(v, str) and (default is None or isinstance(default, str)):
            continue  # a name, e.g. error_budget's phase
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            raise ValueError(f"check {name!r}: {k} must be a number >= 0, got {v!r}")
    for p in list(sig.parameters.values())[1:]:
        if p.default is inspect.Parameter.empty and p.name not in params:
            raise ValueError(f"check {name!r} needs parameter {p.name!r}")


def evaluate(run_dir: Path, checks: list[tuple[str, dict[str, Any]]]) -> list[Verdict]:
    run = RunData(run_dir)
    out = []
    for name, params in checks:
        try:
            out.append(CHECKS[name](run, **params))
        except Exception as e:  # a broken check must not hide the others
            out.append(Verdict(name, UNKNOWN, {}, f"check crashed: {type(e).__name__}: {e}"))
    return out


# ------------------------------------------------ checks from their own modules
# Imported last: accounting.py, lag.py, slo.py, memory.py and oom.py import Verdict & co. from this module.
from .oom import no_oom  # noqa: E402
from .lag import consumer_not_stalled, lag_bounded  # noqa: E402
from .memory import gc_time_fraction, no_memory_leak, no_thread_leak  # noqa: E402
from .slo import error_budget  # noqa: E402
from .faultchecks import faults_landed, latency_objective, throughput_drop  # noqa: E402
from .accounting import SENT_FILE, no_acked_loss, no_duplicates, no_unexpected  # noqa: E402
from .loadchecks import load_valid  # noqa: E402

CHECKS.update({
    "no_acked_loss": no_acked_loss,
    "no_duplicates": no_duplicates,
    "no_unexpected": no_unexpected,
    "no_oom": no_oom,
    "lag_bounded": lag_bounded,
    "consumer_not_stalled": consumer_not_stalled,
    "error_budget": error_budget,
    "no_memory_leak": no_memory_leak,
    "gc_time_fraction": gc_time_fraction,
    "no_thread_leak": no_thread_leak,
    "faults_landed": faults_landed,
    "throughput_drop": throughput_drop,
    "latency_objective": latency_objective,
    "load_valid": load_valid,
})
