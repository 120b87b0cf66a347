"""``leg_objective``: the latency objective and error budget of one leg of a request/response flow (Hono's
command flow: ``telemetry``, ``event``, ``command_request``, ``command_response``), from the run's
``legs.json`` (outcomes by code per load second) and ``legs-<leg>.hlog`` (round trips per load second), inside
or outside the fault windows. A sign-off reads: "command round trip p99.9 under N ms, with M 503s"."""
from __future__ import annotations

import json
from typing import Callable

from monsoon.checks.base import FAIL, INFO, PASS, RunData, UNKNOWN, Verdict
from monsoon.rundir import LEG_LATENCY_FILE, LEGS_FILE
from monsoon.timeline.views import fault_windows
from monsoon.timeline.events import LOAD

WINDOWS = ("all", "faults", "outside_faults", "before_faults", "after_faults")   # or a phase's name
RECOVERY_GRACE_S = 10.0    # after_faults: from this long after the last heal (a retry in flight may still fail)


def leg_objective_name(leg: str, during: str) -> str:
    return f"leg_objective[{leg}]" if during == "all" else f"leg_objective[{leg},{during}]"


def _sec_times(run: RunData) -> dict[int, float]:
    """Load second -> timeline time at its end (the ``load`` events)."""
    return {int(e["sec"]): float(e["t"]) for e in run.events.of(LOAD) if "sec" in e and "t" in e}


def _selector(run: RunData, during: str) -> tuple[Callable[[float], bool], str] | str:
    """A predicate on a second's timeline time (its end) for ``during``, and words for it; or why none."""
    if during == "all":
        return (lambda t: True), "over the whole load"
    if during not in WINDOWS:
        ph = run.events.phase(during)
        if ph is None:
            return f"no phase {during!r} in the timeline (or use one of: {', '.join(WINDOWS)})"
        a, b = float(ph["start"]), float(ph["end"])
        return (lambda t: a <= t - 0.5 < b), f"in the {during} phase"     # the second's middle in the phase
    wins = fault_windows(run.events)
    spans = [(w.start, w.end if w.end is not None else float("inf")) for w in wins]
    if not spans:
        return "no fault window in the timeline"
    first, last = min(s for s, _ in spans), max(e for _, e in spans)
    if during == "faults":       # a second that overlaps a window (it ends inside, or up to 1 s after)
        return (lambda t: any(s < t <= e + 1.0 for s, e in spans)), "during the fault windows"
    if during == "outside_faults":
        return (lambda t: not any(s < t <= e + 1.0 for s, e in spans)), "outside the fault windows"
    if during == "before_faults":
        return (lambda t: t <= first), "before the first fault"
    if last == float("inf"):
        return "the last fault window never healed"
    return (lambda t: t > last + RECOVERY_GRACE_S), f"from {RECOVERY_GRACE_S:g}s after the last heal"


def leg_objective(run: RunData, leg: str = "command_request", max_ms: float | None = None, percentile: float = 99.9,
                  max_errors: int | None = None, during: str = "all", min_samples: int = 1) -> Verdict:
    """The ``percentile`` round trip of ``leg`` under ``max_ms`` and at most ``max_errors`` failed requests (any
    code but success: ``http 503``, ``timeout``, ``no command``, ...) ``during`` the run (``all``), the fault
    windows (``faults``), outside them, before the first or after the last (from 10 s after its heal), or a
    phase of the load shape (its name: a stage's, ``warmup``, ...). Figures: ok, errors (and per
    code), p50/p99/p99.9/max ms. Without ``max_ms`` and ``max_errors`` it cannot fail: it reports (``info``)."""
    import numpy as np      # (and monsoon.timeline.hdrlog, which imports it): here, not when the check is named
    from monsoon.timeline.hdrlog import LatencyLog, max_ms as hist_max_ms, percentile_ms
    name = leg_objective_name(leg, during)
    path = run.dir / LEGS_FILE
    if not path.exists():
        return Verdict(name, UNKNOWN, {}, f"no {LEGS_FILE} in the run (a transport without legs, or cut short)")
    doc = json.loads(path.read_text()).get("legs", {})
    if leg not in doc:
        return Verdict(name, UNKNOWN, {}, f"no leg {leg!r} in {LEGS_FILE} (legs: {', '.join(doc) or 'none'})")
    sel = _selector(run, during)
    if isinstance(sel, str):
        return Verdict(name, UNKNOWN, {}, sel)
    pick, where = sel
    times = _sec_times(run)

    def chosen(sec: float) -> bool:
        t = times.get(int(sec))
        return t is not None and pick(t)

    codes: dict[str, int] = {}
    for sec, outcomes in doc[leg]["seconds"]:
        if chosen(sec):
            for code, n in outcomes.items():
                codes[code] = codes.get(code, 0) + int(n)
    ok = codes.pop("ok", 0)
    errors = sum(codes.values())
    figures: dict[str, float] = {"ok": ok, "errors": errors}
    for code, n in sorted(codes.items()):
        figures["errors." + code.replace(" ", "_")] = n
    hl = run.dir / LEG_LATENCY_FILE.format(leg=leg)
    value = None
    if hl.exists():
        log = LatencyLog.read(hl)
        mask = np.array([chosen(s) for s in log.secs], dtype=bool)
        h = log.histogram(mask) if len(mask) else None
        if h is not None and h.get_total_count():
            for k, q in (("p50_ms", 50.0), ("p99_ms", 99.0), ("p999_ms", 99.9)):
                figures[k] = round(percentile_ms(h, q), 3)
            figures["max_ms"] = round(hist_max_ms(h), 3)
            value = percentile_ms(h, percentile)
    words = f"{leg} {where}: {ok} ok, {errors} failed" + (
        f" ({', '.join(f'{n} {c}' for c, n in sorted(codes.items()))})" if codes else "") + (
        f", p{percentile:g} {value:.1f} ms" if value is not None else "")
    if ok + errors < min_samples:
        return Verdict(name, UNKNOWN, figures, f"{words}: fewer than {min_samples} requests to judge")
    bad = []
    if max_ms is not None:
        if value is None:
            return Verdict(name, UNKNOWN, figures, f"{words}: no successful round trip to measure")
        if value > max_ms:
            bad.append(f"p{percentile:g} {value:.1f} ms > {max_ms:g} ms")
    if max_errors is not None and errors > max_errors:
        bad.append(f"{errors} failed > {max_errors}")
    if bad:
        return Verdict(name, FAIL, figures, f"{words}: " + "; ".join(bad))
    if max_ms is None and max_errors is None:
        return Verdict(name, INFO, figures, words + " (reported; no max_ms or max_errors set)")
    return Verdict(name, PASS, figures, words)
