"""Views over a timeline: fault windows, kills and what they explain, downtime."""
from __future__ import annotations

from dataclasses import dataclass
from monsoon.timeline.events import (FAULT, FAULT_PLAN, SAMPLE, SERVICE, SILENCE, SVC_EXIT, SVC_READY, SVC_RESTART,
                                     SVC_START)


# pod-failure (Chaos Mesh) stops the pod's container too: kubelet SIGTERMs it when its image becomes the pause image
# container-kill (Chaos Mesh, through chaos-daemon) SIGKILLs the container's task: kubelet starts it again
KILL_KINDS = ("pod-kill", "kafka-broker-restart", "pod-failure", "container-kill")


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
    plan = events.first(FAULT_PLAN)
    if plan is None:
        return []
    t0 = plan["t"]
    injects: dict[tuple, dict] = {}
    heals: dict[tuple, list[dict]] = {}
    for e in events.of(FAULT):
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
        if w.evidence.get("killed_uids") or w.evidence.get("restarted"):   # a pod (container) kill landed by its
            # effect (a Litmus Job kills seconds after its engine is created): gone (restarted) by the time the
            # landing check saw it, no later
            within = max(within, float(w.evidence.get("waited_s") or 0) + float(w.evidence.get("effect_waited_s") or 0)
                         + slack)
        exit_ = next((e for e in events.of(SERVICE, event=SVC_EXIT, service=w.target)
                      if w.start - slack <= e["t"] <= w.start + within), None)
        if exit_ is None:
            continue
        out.add(("exit", w.target, exit_["t"]))
        restart = next((e for e in events.of(SERVICE, event=SVC_RESTART, service=w.target) if e["t"] >= exit_["t"]),
                       None)
        if restart is not None:
            out.add(("restart", w.target, restart["t"]))
    return out


def downtime(events, w: Window) -> float | None:
    """Seconds from a kill's injection until its service was ready again (None: never, or no readiness events)."""
    start = next((e for e in events.of(SERVICE, event=SVC_START, service=w.target) if e["t"] >= w.start - 3.0), None)
    if start is None:
        return None
    ready = next((e for e in events.of(SERVICE, event=SVC_READY, service=w.target) if e["t"] >= start["t"]), None)
    return None if ready is None else round(ready["t"] - w.start, 2)


FAULT_GRACE_S = 60.0     # after a fault's heal: a restarted platform reconnects, refills its buffers, still burns


def fault_spans(events, grace_s: float = FAULT_GRACE_S) -> list[tuple[float, float]]:
    """Every injected fault window, from its inject to ``grace_s`` after its heal (to the end: never healed)."""
    return [(w.start, (w.end if w.end is not None else float("inf")) + grace_s) for w in fault_windows(events)]


SILENCE_MIN_S = 5.0      # a collector without an answer for this long is silent: what it measures was not seen
RESTING = ("storage", "services")   # collectors that skip seconds on purpose: an exact count resting during
#                                    the load; the services' RSS, one /proc pass every 5 s (the sampler still
#                                    marks them when they stop answering: their silence events)


@dataclass(frozen=True)
class Silence:
    collector: str
    start: float                 # its last answer before the silence (timeline seconds)
    end: float | None            # its first answer after it (None: it never answered again)
    reason: str                  # the error it gave, or "no answer"


def silences(events, min_s: float = SILENCE_MIN_S) -> list[Silence]:
    """Every stretch of at least ``min_s`` seconds in which a collector gave no answer: the marks the sampler
    recorded (``silence`` events: from, until, which collector, why), and, for runs without them or a collector
    stuck in its call, the stretches its samples show: errors only (refused, timed out), or no sample at all
    between two answers (not for a collector that rests on purpose, :data:`RESTING`). Overlapping stretches of
    one collector are merged. What a silent collector measures was not seen there: never read it as fine."""
    spans: dict[str, list[tuple[float, float | None, str]]] = {}
    for e in events.of(SILENCE):
        if isinstance(e.get("start"), (int, float)):
            end = e.get("end")
            spans.setdefault(str(e.get("collector")), []).append(
                (float(e["start"]), float(end) if isinstance(end, (int, float)) else None,
                 str(e.get("reason") or "no answer")))
    by: dict[str, list[dict]] = {}
    for e in events.of(SAMPLE):
        by.setdefault(str(e.get("collector")), []).append(e)
    for name, samples in by.items():
        last_ok: float | None = None
        err: str | None = None
        for s in samples:
            t = float(s["t"])
            if s.get("error") is not None:
                err = err or str(s["error"])
                continue
            if last_ok is not None and t - last_ok >= min_s and (err is not None or name not in RESTING):
                spans.setdefault(name, []).append((last_ok, t, err or "no answer"))
            last_ok, err = t, None
        if err is not None and last_ok is not None and float(samples[-1]["t"]) - last_ok >= min_s:
            spans.setdefault(name, []).append((last_ok, None, err))
    out = []
    for name, ss in spans.items():
        ss.sort(key=lambda x: x[0])
        merged: list[list] = []
        for a, b, why in ss:
            if merged and (merged[-1][1] is None or a <= merged[-1][1]):
                if merged[-1][1] is not None:
                    merged[-1][1] = None if b is None else max(merged[-1][1], b)
                continue
            merged.append([a, b, why])
        out += [Silence(name, a, b, why) for a, b, why in merged if b is None or b - a >= min_s]
    return sorted(out, key=lambda s: (s.start, s.collector))


def silent_during(silent: list[Silence], a: float, b: float, collector: str | None = None) -> list[Silence]:
    """The silences (of ``collector``, else any) that overlap [a, b]."""
    return [s for s in silent if (collector is None or s.collector == collector)
            and s.start < b and (s.end is None or s.end > a)]


def counter_steps(points: list[tuple[float, float]]) -> list[float]:
    """The increase of a cumulative counter over each interval of its ``(t, value)`` samples, as Prometheus'
    ``increase`` counts it: a drop is a reset (a restarted process), and the new value counts from zero."""
    return [b - a if b >= a else b for (_, a), (_, b) in zip(points, points[1:])]
