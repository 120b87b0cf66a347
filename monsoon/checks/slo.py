"""An OpenSLO-style latency/availability SLO, evaluated per phase from the fleet's ``load`` events.

The reasoning, sources and measurements behind it: docs/design.md, "monsoon/checks/slo.py"."""
from __future__ import annotations

import builtins
from dataclasses import dataclass
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, TypeAlias, get_args

from monsoon.checks.base import FAIL, PASS, RunData, UNKNOWN, Verdict
from monsoon.timeline.views import FAULT_GRACE_S, fault_spans
from monsoon.timeline.events import LOAD

if TYPE_CHECKING:   # numpy is imported in the functions that use it: naming a check must not load it
    import numpy as np


WORKBOOK_PERIOD_S = 30 * 86400.0
# (long, short, factor) for a 30-day SLO, Google SRE workbook ch. 5, table 5-8
WORKBOOK_RULES = (
    (3600.0, 300.0, 14.4),
    (6 * 3600.0, 1800.0, 6.0),
    (86400.0, 2 * 3600.0, 3.0),
    (3 * 86400.0, 6 * 3600.0, 1.0),
)


@dataclass(frozen=True)
class BurnRule:
    long_s: int
    short_s: int
    factor: float

    def label(self) -> str:
        return f"{self.long_s}s/{self.short_s}s at {self.factor:g}x"


@dataclass(frozen=True)
class Second:
    start: float  # timeline time at which this second of load began
    scheduled: int
    acked: int
    failed: int
    p50: float | None
    p99: float | None
    max: float | None
    sec: int | None = None  # the fleet's second index (the ``sec`` of the load event, the hlog's interval)


@dataclass
class Outcome:
    start: float
    valid: float
    good: float
    unmeasured: int = 0

    @property
    def bad(self) -> float:
        return builtins.max(0.0, self.valid - self.good)


def scaled_windows(slo_window_s: float) -> list[BurnRule]:
    """The workbook's four window pairs scaled from 30 days to ``slo_window_s`` (Pyrra's way), >= 1 s.

    In a very short SLO window several pairs floor to the same windows; then only the
    one with the highest factor is kept (a 1x rule over 1 s / 1 s would fire on any
    bad second -- it no longer detects a slow burn, and the budget itself does)."""
    k = slo_window_s / WORKBOOK_PERIOD_S
    out: list[BurnRule] = []
    for lw, sw, f in WORKBOOK_RULES:  # highest factor first
        r = BurnRule(builtins.max(1, round(lw * k)), builtins.max(1, round(sw * k)), f)
        if not any((o.long_s, o.short_s) == (r.long_s, r.short_s) for o in out):
            out.append(r)
    return out


def good_fraction(threshold_ms: float, p50: float | None, p99: float | None, mx: float | None) -> float | None:
    """Fraction of a second's acks within ``threshold_ms`` from its p50/p99/max (piecewise-linear CDF)."""
    pts = [(0.0, 0.0)]
    for q, v in ((0.5, p50), (0.99, p99), (1.0, mx)):
        if v is None:
            continue
        v = float(v)
        if v >= pts[-1][0]:
            pts.append((v, q))
    if len(pts) == 1:
        return None
    if threshold_ms >= pts[-1][0]:
        return pts[-1][1]
    for (x0, q0), (x1, q1) in zip(pts, pts[1:]):
        if x0 <= threshold_ms < x1:
            return q0 + (q1 - q0) * (threshold_ms - x0) / (x1 - x0)
    return 0.0


def _num(v) -> int:
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0


def _opt(v) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def load_seconds(events) -> list[Second]:
    """The per-second load events, with their start on the timeline clock.

    ``sec`` counts seconds from the load start; an event is written just after its
    second ends, so the load start is estimated as min(t - sec) - 1."""
    raw = list(events.of(LOAD))
    if not raw:
        return []
    with_sec = [e for e in raw if isinstance(e.get("sec"), (int, float))]
    t0 = builtins.min(e["t"] - e["sec"] for e in with_sec) - 1.0 if with_sec else 0.0

    def start(e: dict) -> float:
        return t0 + e["sec"] if with_sec and "sec" in e else e["t"] - 1.0

    out = [Second(start(e), _num(e.get("scheduled")), _num(e.get("acked")), _num(e.get("failed")),
                  _opt(e.get("p50_ms")), _opt(e.get("p99_ms")), _opt(e.get("max_ms")),
                  int(e["sec"]) if isinstance(e.get("sec"), (int, float)) else None) for e in raw]
    return sorted(out, key=lambda s: s.start)


def outcomes(seconds: list[Second], latency_ms: float, good_counts: dict[int, int] | None = None) -> list[Outcome]:
    """Per second: valid and good message counts (see the module docstring).  ``good_counts`` (acks within
    ``latency_ms`` per second, counted from the fleet's HdrHistograms) replaces the quantile estimate for
    the seconds it has."""
    out = []
    for s in seconds:
        if good_counts is not None and s.sec is not None and s.sec in good_counts:
            out.append(Outcome(s.start, float(s.acked + s.failed), float(builtins.min(s.acked, good_counts[s.sec])), 0))
            continue
        gf = good_fraction(latency_ms, s.p50, s.p99, s.max)
        unmeasured = s.acked if gf is None and s.acked else 0
        good = s.acked * (1.0 if gf is None else gf)
        out.append(Outcome(s.start, float(s.acked + s.failed), good, unmeasured))
    unresolved = sum(s.scheduled for s in seconds) - sum(s.acked + s.failed for s in seconds)
    for s, o in zip(reversed(seconds), reversed(out)):  # FIFO: the last scheduled are the unresolved
        if unresolved <= 0:
            break
        take = builtins.min(unresolved, s.scheduled)
        o.valid += take
        unresolved -= take
    return out


def phase_spans(events, seconds: list[Second]) -> list[tuple[str, float, float]]:
    """(name, start, end) of each phase; the whole load as one ``run`` phase when none are recorded."""
    ph = [(p["name"], float(p["start"]), float(p["end"])) for p in events.phases()
          if isinstance(p.get("start"), (int, float)) and isinstance(p.get("end"), (int, float))]
    if ph:
        return sorted(ph, key=lambda p: p[1])
    if not seconds:
        return []
    return [("run", seconds[0].start, seconds[-1].start + 1.0)]


def split_by_phase(spans, outs: list[Outcome]) -> dict[str, list[Outcome]]:
    """Seconds by the phase their start falls in; before the first phase -> first, after the last -> last
    (the fleet's drain seconds)."""
    res: dict[str, list[Outcome]] = {n: [] for n, _, _ in spans}
    for o in outs:
        name = spans[0][0]
        for n, a, _b in spans:
            if o.start + 1e-6 >= a:
                name = n
        res[name].append(o)
    return res


@dataclass
class PhaseResult:
    name: str
    duration_s: float
    valid: float
    good: float
    unmeasured: int
    consumed_pct: float
    worst_burn: float
    fired: list[tuple[BurnRule, float, float, float]]  # rule, time, long burn, short burn
    rules: list[BurnRule]

    @property
    def bad(self) -> float:
        return builtins.max(0.0, self.valid - self.good)


Seconds: TypeAlias = "Sequence[float] | np.ndarray"     # a value per second of a phase


def _burn_arrays(valid: Seconds, bad: Seconds, rule: BurnRule,
                 budget_ratio: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(indexes, long-window burns, short-window burns) where the rule's long window is full and both
    windows saw traffic: prefix sums, one vectorised pass (a day is 86,400 seconds, per rule)."""
    import numpy as np
    cv = np.concatenate(([0.0], np.cumsum(np.asarray(valid, dtype=np.float64))))
    cb = np.concatenate(([0.0], np.cumsum(np.asarray(bad, dtype=np.float64))))
    short = builtins.min(rule.short_s, rule.long_s)
    i = np.arange(rule.long_s - 1, len(valid))
    lv, sv = cv[i + 1] - cv[i + 1 - rule.long_s], cv[i + 1] - cv[i + 1 - short]
    ok = (lv > 0) & (sv > 0)
    i, lv, sv = i[ok], lv[ok], sv[ok]
    lb = (cb[i + 1] - cb[i + 1 - rule.long_s]) / lv / budget_ratio
    sb = (cb[i + 1] - cb[i + 1 - short]) / sv / budget_ratio
    return i, lb, sb


def burn_rates(valid: Seconds, bad: Seconds, rule: BurnRule,
               budget_ratio: float) -> list[tuple[int, float, float]]:
    """(index, long-window burn, short-window burn) at every second where the rule's long window is full."""
    i, lb, sb = _burn_arrays(valid, bad, rule, budget_ratio)
    return list(zip(i.tolist(), lb.tolist(), sb.tolist()))


def first_firing(valid: Seconds, bad: Seconds, rule: BurnRule,
                 budget_ratio: float) -> tuple[int, float, float] | None:
    """The first second at which both the long and the short window burn above the rule's factor."""
    import numpy as np
    i, lb, sb = _burn_arrays(valid, bad, rule, budget_ratio)
    hit = np.flatnonzero((lb > rule.factor) & (sb > rule.factor))
    if not len(hit):
        return None
    k = int(hit[0])
    return int(i[k]), float(lb[k]), float(sb[k])


def masked(starts: np.ndarray, spans: list[tuple[float, float]]) -> np.ndarray:
    """Which seconds (by start time) fall in any of ``spans`` ``[a, b)``: one ``searchsorted`` per span."""
    import numpy as np
    out = np.zeros(len(starts), dtype=bool)
    for a, b in spans:
        out[np.searchsorted(starts, a, "left"):np.searchsorted(starts, b, "left")] = True
    return out


def evaluate_phase(name: str, duration_s: float, outs: list[Outcome], objective: float,
                   unburnt: Sequence[tuple[float, float]] = ()) -> PhaseResult:
    """``unburnt``: spans whose seconds the burn-rate rules leave out (they still spend the budget)."""
    import numpy as np
    ratio = 1.0 - objective
    valid: Seconds = [o.valid for o in outs]     # per second; an array once spans are left out
    bad: Seconds = [o.bad for o in outs]
    good = sum(o.good for o in outs)
    v = sum(valid)
    b = builtins.max(0.0, v - good)
    consumed = 100.0 * (b / v) / ratio if v > 0 else 0.0
    if unburnt:
        skip = masked(np.array([o.start for o in outs], dtype=np.float64), list(unburnt))
        valid = np.where(skip, 0.0, valid)
        bad = np.where(skip, 0.0, bad)
    rules = scaled_windows(duration_s)
    fired = []
    worst = 0.0
    for r in rules:
        _i, lb, sb = _burn_arrays(valid, bad, r, ratio)
        if len(lb):
            worst = builtins.max(worst, float(np.minimum(lb, sb).max()))
        f = first_firing(valid, bad, r, ratio)
        if f:
            fired.append((r, outs[f[0]].start + 1.0, f[1], f[2]))
    return PhaseResult(name, duration_s, v, good, sum(o.unmeasured for o in outs), consumed, worst, fired, rules)


def evaluate(events, objective: float = 0.99, latency_ms: float = 500.0,
             good_counts: dict[int, int] | None = None, unburnt: Sequence[tuple[float, float]] = ()
             ) -> list[PhaseResult]:
    """Every phase's SLO result (phases without traffic are left out)."""
    secs = load_seconds(events)
    if not secs:
        return []
    spans = phase_spans(events, secs)
    by = split_by_phase(spans, outcomes(secs, latency_ms, good_counts))
    res = []
    for n, a, b in spans:
        outs = by.get(n) or []
        if sum(o.valid for o in outs) <= 0:
            continue
        res.append(evaluate_phase(n, builtins.max(b - a, float(len(outs))), outs, objective, unburnt))
    return res


BURN_RATE = get_args(Literal["all", "outside-faults"])


def error_budget(run: RunData, objective: float = 0.99, latency_ms: float = 500, phase: str | None = None,
                 burn_rate: Literal["all", "outside-faults"] = "all") -> Verdict:
    """Per phase, ``objective`` of the scheduled messages are acked within ``latency_ms``: fails when a phase
    spends more than its error budget or a multi-window burn-rate rule fires.

    ``phase=None`` judges every phase but the warmup (not under SLO by its nature; name it to judge it).
    ``burn_rate``: ``all`` (the rules judge every second) or ``outside-faults``: the rules leave out each
    injected fault window and the :data:`~monsoon.timeline.views.FAULT_GRACE_S` after its heal, whose seconds still spend the budget.
    A soak injects faults on purpose: a pod kill burns at 100 % for seconds, which a fast-burn rule scaled to
    the run always calls a page, so there the rules ask whether anything *else* burnt the budget fast."""
    name = "error_budget"
    if not 0.0 < float(objective) < 1.0:
        return Verdict(name, UNKNOWN, {}, f"objective must be between 0 and 1 (exclusive), got {objective!r}")
    if burn_rate not in BURN_RATE:
        return Verdict(name, UNKNOWN, {}, f"burn_rate must be one of {', '.join(BURN_RATE)}, got {burn_rate!r}")
    log = run.latency_log
    good_counts = log.good_per_second(float(latency_ms)) if log is not None else None
    unburnt = fault_spans(run.events) if burn_rate == "outside-faults" else []
    results = evaluate(run.events, float(objective), float(latency_ms), good_counts, unburnt)
    if not results:
        return Verdict(name, UNKNOWN, {}, "no load seconds with traffic in the timeline: nothing to judge")
    if phase is not None:
        results = [r for r in results if r.name == phase]
        if not results:
            return Verdict(name, UNKNOWN, {}, f"no traffic in phase {phase!r} (or no such phase)")
    else:
        results = [r for r in results if r.name != "warmup"]
        if not results:
            return Verdict(name, UNKNOWN, {}, "no traffic after the warmup: nothing to judge")
    failing = [r for r in results if r.consumed_pct > 100.0 or r.fired]
    worst = builtins.max(results, key=lambda r: (r in failing, r.consumed_pct))
    figures: dict[str, float] = {
        "budget_consumed_pct": round(worst.consumed_pct, 2),
        "worst_burn_rate": round(builtins.max(r.worst_burn for r in results), 2),
        "good": round(worst.good, 1), "valid": round(worst.valid, 1),
        "objective": float(objective), "latency_ms": float(latency_ms), "phases_judged": len(results),
        "good_counted_from_histograms": int(good_counts is not None),
    }
    for r in results:
        figures[f"budget_consumed_pct.{r.name}"] = round(r.consumed_pct, 2)
    if burn_rate != "all":
        figures["burn_rate_windows_left_out"] = len(unburnt)
    unmeasured = sum(r.unmeasured for r in results)
    if unmeasured:
        figures["unmeasured"] = unmeasured
    slo = f"{objective * 100:g}% within {latency_ms:g}ms"
    if unburnt:
        slo += f" (burn-rate rules outside {len(unburnt)} fault window(s) + {FAULT_GRACE_S:g}s)"

    def describe(r: PhaseResult) -> str:
        s = (f"{r.name}: {r.consumed_pct:.1f}% of the budget spent ({r.bad:,.0f} bad of {r.valid:,.0f}, "
             f"budget {(1 - objective) * r.valid:,.0f})")
        for rule, t, lb, sb in r.fired:
            s += f"; burn-rate rule {rule.label()} fired at t={t:.0f}s (long {lb:.1f}x, short {sb:.1f}x)"
        return s

    if failing:
        return Verdict(name, FAIL, figures, f"SLO {slo} broken in " + " | ".join(describe(r) for r in failing))
    return Verdict(name, PASS, figures,
                   f"SLO {slo} held: " + ", ".join(f"{r.name} {r.consumed_pct:.1f}% of budget" for r in results)
                   + f"; worst burn rate {figures['worst_burn_rate']:g}x")


# At the bottom on purpose: checks.py imports this module at its end to register the checks,
# so whichever of the two is imported first, both finish loading.
