"""Views over a timeline: fault windows, kills and what they explain, downtime."""
from __future__ import annotations

from dataclasses import dataclass


KILL_KINDS = ("pod-kill", "kafka-broker-restart")


KILL_EXIT_WITHIN_S = 60.0      # a SIGTERM'd service's exit is the kill's if it comes this soon after it


@dataclass(frozen=True)
class Window:
    name: str
    kind: str
    target: str
    window: int
    start: float                 # timeline seconds
    end: float | None            # None: never healed
    landed: bool | None
    healed: bool | None
    evidence: dict
    heal_evidence: dict
    late_s: float | None = None  # healed by the final heal after its scheduled heal failed: seconds over its window


def fault_windows(events) -> list[Window]:
    """Every injected fault window with timeline times, landing and heal verdicts.

    A window is judged on its *last* heal: a scheduled heal that failed is retried by the final heal,
    and when that one worked the fault healed, late (``late_s``), and ``end`` is when it really went.
    """
    plan = events.first("fault-plan")
    if plan is None:
        return []
    t0 = plan["t"]
    injects: dict[tuple, dict] = {}
    heals: dict[tuple, list[dict]] = {}
    for e in events.of("fault"):
        key = (e["name"], e["window"])
        if e.get("phase") == "inject":
            injects[key] = e
        elif e.get("phase") == "heal":
            heals.setdefault(key, []).append(e)
    out = []
    for key, e in sorted(injects.items(), key=lambda kv: kv[1]["effective"]):
        hs = sorted(heals.get(key, []), key=lambda h: h["effective"])   # stable: file order on a tie
        h = hs[-1] if hs else None
        late = None
        failed = [x for x in hs[:-1] if x.get("landed") is False]
        if h is not None and h.get("final") and failed:
            planned = failed[0]["intended"] if failed[0].get("intended") is not None else failed[0]["effective"]
            late = round(max(0.0, h["effective"] - planned), 3)
        out.append(Window(e["name"], e["kind"], e.get("service") or e["target"], e["window"], t0 + e["effective"],
                          None if h is None else t0 + h["effective"], e.get("landed"),
                          None if h is None else h.get("landed"), e.get("evidence") or {},
                          {} if h is None else h.get("evidence") or {}, late))
    return out


def explained_by_kill(events, slack: float = 3.0) -> set[tuple[str, str, float]]:
    """(event, service, t) of the exits and restarts that injected kills caused.

    For each kill window of a service: its first exit from ``slack`` seconds before
    to ``slack`` after a SIGKILL (``KILL_EXIT_WITHIN_S`` after a gentler signal: a
    broker's controlled shutdown takes time), and the first restart after that exit.  A crash loop that
    follows is not the fault's doing and stays unexplained.
    """
    out: set[tuple[str, str, float]] = set()
    for w in fault_windows(events):
        if w.kind not in KILL_KINDS:
            continue
        # the first exit after the injection: SIGKILL is instant, a SIGTERM'd broker may take its time
        within = slack if w.evidence.get("signal", "SIGKILL") == "SIGKILL" else KILL_EXIT_WITHIN_S
        exit_ = next((e for e in events.of("service", event="exit", service=w.target)
                      if w.start - slack <= e["t"] <= w.start + within), None)
        if exit_ is None:
            continue
        out.add(("exit", w.target, exit_["t"]))
        restart = next((e for e in events.of("service", event="restart", service=w.target) if e["t"] >= exit_["t"]),
                       None)
        if restart is not None:
            out.add(("restart", w.target, restart["t"]))
    return out


def downtime(events, w: Window) -> float | None:
    """Seconds from a kill's injection until its service was ready again (None: never, or no readiness events)."""
    start = next((e for e in events.of("service", event="start", service=w.target) if e["t"] >= w.start - 3.0), None)
    if start is None:
        return None
    ready = next((e for e in events.of("service", event="ready", service=w.target) if e["t"] >= start["t"]), None)
    return None if ready is None else round(ready["t"] - w.start, 2)


FAULT_GRACE_S = 60.0     # after a fault's heal: a restarted platform reconnects, refills its buffers, still burns


def fault_spans(events, grace_s: float = FAULT_GRACE_S) -> list[tuple[float, float]]:
    """Every injected fault window, from its inject to ``grace_s`` after its heal (to the end: never healed)."""
    return [(w.start, (w.end if w.end is not None else float("inf")) + grace_s) for w in fault_windows(events)]
