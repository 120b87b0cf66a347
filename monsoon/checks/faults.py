"""Checks about injected faults: did they land and heal, what did they cost.

Pure functions of a saved run directory, like every check.  A fault's times on
the timeline come from the ``fault-plan`` event (the plan's clock start) plus
each ``fault`` event's ``effective`` seconds.

* ``faults_landed``      — every fault landed and healed, nothing left in place
  (added to every experiment that injects faults).
* ``throughput_drop``    — ingestion throughput during the fault windows versus
  before the first fault: ``throughput_drop_pct``.
* ``latency_objective``  — a publish->PUBACK percentile, measured from the
  intended send time (no coordinated omission), during the faults, a phase, or
  the whole load.  Its verdict is named ``latency_objective`` for the default
  ``during: faults`` and ``latency_objective[<phase or all>]`` otherwise, so an
  experiment may hold one per phase (``check_base`` gives the check back).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from monsoon.checks.base import FAIL, INFO, PASS, RunData, UNKNOWN, Verdict
from monsoon.rundir import ACKED_DATA
from monsoon.checks.accounting import read_columns
from monsoon.timeline.columnar import run_file_exists
from monsoon.timeline.views import KILL_KINDS, downtime, fault_windows
from monsoon.timeline.events import FAULT_CENSUS, FAULT_PLAN, LOAD, META

if TYPE_CHECKING:   # numpy (and monsoon.timeline.hdrlog, which imports it) in the functions that use them
    import numpy as np


LATENCY_DEFAULT_DURING = "faults"


def latency_objective_name(during: str = LATENCY_DEFAULT_DURING) -> str:
    """``latency_objective`` for the default ``during``, ``latency_objective[<during>]`` for a phase or ``all``."""
    return "latency_objective" if during == LATENCY_DEFAULT_DURING else f"latency_objective[{during}]"


def faults_landed(run: RunData) -> Verdict:
    """Every fault landed (measured), healed (measured), and the census after the run found nothing left."""
    name = "faults_landed"
    ev = run.events
    if ev.first(FAULT_PLAN) is None:
        planned = run.meta.get("faults") or []
        return Verdict(name, UNKNOWN, {"faults_injected": 0, "faults_landed": 0, "faults_healed": 0},
                       f"{len(planned)} fault(s) planned but the fault plan never started (the run ended early)")
    wins = fault_windows(ev)
    # an inject that raised put nothing in place: it did not land, and there is nothing to heal
    failed = [w for w in wins if w.landed is False and w.evidence.get("method") == "inject"]
    census = ev.first(FAULT_CENSUS) or {}
    leftovers = census.get("leftovers") or {}
    n_left = sum(len(v) for v in leftovers.values())
    landed = [w for w in wins if w.landed is True]
    placed = [w for w in wins if w not in failed]
    healed = [w for w in placed if w.end is not None and w.healed is not False]
    late = [w for w in healed if w.late_s is not None]
    figures: dict[str, float] = {"faults_injected": len(wins), "faults_landed": len(landed),
               "faults_healed": len(healed),
               "faults_healed_late": len(late), "faults_left_in_place": n_left}
    if late:
        figures["max_heal_overstay_s"] = max(w.late_s for w in late if w.late_s is not None)
    downs = [d for d in (downtime(ev, w) for w in wins if w.kind in KILL_KINDS) if d is not None]
    if downs:
        figures["max_downtime_s"] = max(downs)   # kill -> the service ready again
    if census == {}:
        return Verdict(name, UNKNOWN, figures, "no census after the fault plan: cannot say every fault healed")
    if n_left or len(healed) < len(placed):
        bad = [f"{w.name}#{w.window} ({w.heal_evidence.get('error') or 'heal not verified'})"
               for w in placed if w not in healed]
        what = "; ".join(bad + [f"{b}: {', '.join(v)}" for b, v in leftovers.items()])
        return Verdict(name, FAIL, figures, f"faults not healed: {what}")
    if not wins:
        return Verdict(name, UNKNOWN, figures, "no fault window was injected during the load")
    not_landed = [w for w in wins if w.landed is not True]
    if not_landed:
        w = not_landed[0]
        how = w.evidence.get("error") or w.evidence.get("method") or "no measurement"
        return Verdict(name, UNKNOWN, figures,
                       f"{len(not_landed)} of {len(wins)} fault(s) did not demonstrably land, e.g. {w.name}#{w.window} "
                       f"on {w.target} ({'not measurable' if w.landed is None else 'did not land'}: {how}); "
                       "the run cannot vouch for the stack under that fault")
    kinds = sorted({w.kind for w in wins})
    overstay = "" if not late else (
        f"; {len(late)} healed late by the final heal after a failed scheduled heal "
        f"({', '.join(f'{w.name}#{w.window} +{w.late_s:g}s' for w in late[:5])}{', ...' if len(late) > 5 else ''})")
    return Verdict(name, PASS, figures,
                   f"{len(wins)} fault window(s) ({', '.join(kinds)}) landed and healed; census clean" + overstay)


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def throughput_drop(run: RunData, max_pct: float | None = None, settle_s: float = 5.0) -> Verdict:
    """Acked msg/s inside the fault windows versus before the first fault (after ``settle_s`` of load).

    With ``max_pct`` the check fails when throughput fell by more; without it the
    drop is reported (pass) as long as it can be measured.
    """
    name = "throughput_drop"
    wins = fault_windows(run.events)
    loads = [(e["t"], float(e.get("acked") or 0), float(e.get("target_rate") or 0)) for e in run.events.of(LOAD)]
    if not wins or not loads:
        return Verdict(name, UNKNOWN, {}, "no fault window or no load seconds in the timeline")
    first = min(w.start for w in wins)
    t_load = loads[0][0]
    base = [a for t, a, _ in loads if t_load + settle_s <= t < first]
    base_target = [r for t, _, r in loads if t_load + settle_s <= t < first]
    during = [a for t, a, _ in loads
              if any(w.start <= t - 1.0 and (w.end is None or t <= w.end) for w in wins)]
    b, d = _mean(base), _mean(during)
    figures: dict[str, float] = {"baseline_msg_s": round(b, 1) if b is not None else 0,
                                 "during_faults_msg_s": round(d, 1) if d is not None else 0,
                                 "baseline_seconds": len(base), "fault_seconds": len(during)}
    if b is None or d is None or b <= 0 or len(base) < 3:
        return Verdict(name, UNKNOWN, figures, f"too little data: {len(base)} baseline second(s) before the first "
                       f"fault at t={first:.0f}s, {len(during)} second(s) inside fault windows")
    drop = max(0.0, 100.0 * (1.0 - d / b))
    figures["throughput_drop_pct"] = round(drop, 1)
    if base_target:
        figures["target_msg_s"] = round(_mean(base_target) or 0, 1)
    msg = (f"ingestion fell from {b:,.0f} to {d:,.0f} acked msg/s during the fault windows "
           f"({drop:.1f}% drop, {len(during)} s of faults)")
    if max_pct is None:
        return Verdict(name, INFO, figures, msg + " (reported; no limit set)")
    figures["limit_pct"] = max_pct
    return Verdict(name, PASS if drop <= max_pct else FAIL, figures, msg + f"; limit {max_pct:g}%")


def _wall_offset(events) -> float | None:
    """wall - t of the timeline (to place wall-clock times of the acked log on it)."""
    m = events.first(META)
    return None if m is None else m["wall"] - m["t"]


def ack_latencies(run: RunData, spans: list[tuple[float, float]] | None) -> np.ndarray:
    """publish->PUBACK latency (ms, from the intended send time) of the acked messages intended inside ``spans``
    (both ends included), in file order: the ``acked`` dataset read in numpy chunks (a last row cut off mid-line is not
    data), each row placed among the merged spans with one ``searchsorted``: linear in rows, whatever the
    number of fault windows."""
    import numpy as np
    p = run.dir / ACKED_DATA
    off = _wall_offset(run.events)
    if not run_file_exists(p) or off is None:
        return np.zeros(0)
    starts, ends = merged_spans(spans) if spans is not None else (None, None)
    found, chunks = read_columns(p, ["intended_ms", "acked_ms"])
    if len(found) < 2:
        return np.zeros(0)
    out = []
    for _codes, (intended, acked) in chunks:
        lat = (acked - intended).astype(np.float64)
        if starts is not None:
            assert ends is not None     # merged_spans gives both, or neither
            lat = lat[in_spans(intended / 1000.0 - off, starts, ends)]
        out.append(lat)
    return np.concatenate(out) if out else np.zeros(0)


def merged_spans(spans: list[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """Closed spans merged into sorted, disjoint ``(starts, ends)``: a time is in one of ``spans`` exactly
    when it is in one of these."""
    import numpy as np
    starts: list[float] = []
    ends: list[float] = []
    for a, b in sorted((float(a), float(b)) for a, b in spans if a <= b):
        if starts and a <= ends[-1]:
            ends[-1] = max(ends[-1], b)
        else:
            starts.append(a)
            ends.append(b)
    return np.array(starts, dtype=np.float64), np.array(ends, dtype=np.float64)


def in_spans(t: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Mask of the times ``t`` inside one of the merged closed spans (:func:`merged_spans`)."""
    import numpy as np
    if len(starts) == 0:
        return np.zeros(len(t), dtype=bool)
    i = np.searchsorted(starts, t, side="right") - 1
    return (i >= 0) & (t <= ends[np.maximum(i, 0)])


def _pct(sorted_xs: Sequence[float] | np.ndarray, q: float) -> float:
    """Nearest-rank percentile."""
    i = min(len(sorted_xs) - 1, max(0, math.ceil(q / 100.0 * len(sorted_xs)) - 1))
    return sorted_xs[i]


def _phase_figures(hists) -> dict[str, float]:
    """``p50_ms.<phase>``, ``p99_ms.<phase>``, ``p999_ms.<phase>`` of every phase that saw acks."""
    from monsoon.timeline.hdrlog import percentile_ms
    out: dict[str, float] = {}
    for ph, h in (hists or {}).items():
        if ph == "all" or h.get_total_count() == 0:
            continue
        out[f"p50_ms.{ph}"] = percentile_ms(h, 50)
        out[f"p99_ms.{ph}"] = percentile_ms(h, 99)
        out[f"p999_ms.{ph}"] = percentile_ms(h, 99.9)
    return out


def latency_objective(run: RunData, max_ms: float, percentile: float = 99, during: str = LATENCY_DEFAULT_DURING,
                      min_samples: float = 100) -> Verdict:
    """The ``percentile`` of ack latency stays under ``max_ms`` ``during`` the fault windows, a phase, or ``all``.

    A phase (and ``all``) is judged from the fleet's per-second HdrHistograms (``latency.hlog``) when the run
    has them: cheap on a 24 h run, exact to the histogram's precision (< 1 %), a message counted in the second
    its PUBACK arrived.  The fault windows (arbitrary spans), and runs without the log, read the exact
    latencies of the ``acked`` dataset (a message counted at its intended send time).  With the log, every verdict
    also carries ``p50_ms.<phase>``, ``p99_ms.<phase>`` and ``p999_ms.<phase>`` of every phase.
    """
    import numpy as np
    from monsoon.timeline.hdrlog import max_ms as hdr_max_ms, percentile_ms
    name = latency_objective_name(during)   # one checklist row per phase, not several identical ones
    key = f"p{percentile:g}_ms"
    hists = run.latency_histograms
    per_phase = _phase_figures(hists)
    if during == "faults":
        spans = [(w.start, w.end if w.end is not None else float("inf")) for w in fault_windows(run.events)]
        if not spans:
            return Verdict(name, UNKNOWN, dict(per_phase), "no fault window in the timeline")
        where = "during the fault windows"
    elif during == "all":
        spans, where = None, "over the whole load"
    else:
        ph = run.events.phase(during)
        if ph is None:
            return Verdict(name, UNKNOWN, dict(per_phase), f"no phase {during!r} in the timeline")
        spans, where = [(ph["start"], ph["end"])], f"in the {during} phase"
    if during != "faults" and hists is not None and during in hists:
        h = hists[during]
        n = h.get_total_count()
        figures = {"samples": n, "limit_ms": max_ms}
        if n < min_samples:
            figures.update(per_phase)
            return Verdict(name, UNKNOWN, figures, f"only {n} acked message(s) {where}: need {min_samples:g}")
        figures.update({"p50_ms": percentile_ms(h, 50), key: percentile_ms(h, percentile), "max_ms": hdr_max_ms(h)})
        figures.update(per_phase)
        v = figures[key]
        return Verdict(name, PASS if v <= max_ms else FAIL, figures,
                       f"p{percentile:g} ack latency {where} {v:,.0f} ms (p50 {figures['p50_ms']:,.0f} ms, "
                       f"max {figures['max_ms']:,.0f} ms, {n:,} msgs, HdrHistogram); objective <= {max_ms:g} ms")
    lat = np.sort(ack_latencies(run, spans))
    figures = {"samples": len(lat), "limit_ms": max_ms}
    if len(lat) < min_samples:
        figures.update(per_phase)
        return Verdict(name, UNKNOWN, figures, f"only {len(lat)} acked message(s) {where}: need {min_samples:g}")
    figures.update({"p50_ms": float(_pct(lat, 50)), key: float(_pct(lat, percentile)), "max_ms": float(lat[-1])})
    figures.update(per_phase)
    v = figures[key]
    return Verdict(name, PASS if v <= max_ms else FAIL, figures,
                   f"p{percentile:g} ack latency {where} {v:,.0f} ms (p50 {figures['p50_ms']:,.0f} ms, "
                   f"max {figures['max_ms']:,.0f} ms, {len(lat):,} msgs); objective <= {max_ms:g} ms")


# Imported last: checks.py imports this module's checks at its own end.
