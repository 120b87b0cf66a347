"""``serves_throughout``: the stack never sits alive (or dead) serving nothing while the load offers work.

A pure function of the timeline. A load second (the fleet's per-second ``load`` event) is *unserved* when it
offered messages (``target_rate > 0``) and fewer than ``min_fraction`` of them were acknowledged. Consecutive
unserved seconds make one silent stretch; one longer than ``max_silent_s`` fails. Seconds inside the
experiment's fault windows and their settle time (:func:`monsoon.timeline.views.fault_spans`) are not judged:
the fault explains them. The first ``settle_s`` seconds of load are not judged either (devices connecting).

Each failing stretch names the service and the evidence of why it served nothing, whatever the timeline holds:
a death and how long until it was ready again, its heap at its max, the share of the time in GC, a memory-limit
stall (:func:`monsoon.checks.oom.limit_stalls`: the container at its cgroup limit, the kernel reclaiming instead
of killing), its metrics silent (:func:`monsoon.timeline.views.silences`), what storage wrote meanwhile.
Acks are the measure (what the devices get); the stored rate is evidence only, since a queue in front of
storage may lawfully store slower than it acks.
"""
from __future__ import annotations

from monsoon.checks import impossible
from monsoon.checks.base import FAIL, PASS, UNKNOWN, RunData, Verdict
from monsoon.checks.oom import heap_headroom, limit_stalls
from monsoon.timeline.views import counter_steps, fault_spans, silences
from monsoon.timeline.events import LOAD, SAMPLE, SERVICE, SVC_EXIT, SVC_READY, SVC_START

MB = 1024 * 1024


def _stretches(seconds: list[tuple[float, int, float]], gap: float = 1.6) -> list[tuple[float, float, int, float]]:
    """Consecutive unserved load seconds (event times at most ``gap`` apart) -> (first second's start, last
    second's end, acked, offered)."""
    out: list[list] = []
    for t, acked, offered in seconds:
        if out and t - out[-1][1] <= gap:
            out[-1][1] = t
            out[-1][2] += acked
            out[-1][3] += offered
        else:
            out.append([t - 1.0, t, acked, offered])
    return [(a, b, n, o) for a, b, n, o in out]


def _service(run: RunData, a: float, b: float) -> str:
    """The service a stretch is about: the one that died in or just before it, else the one the process collector
    follows (by pid), else the only one started."""
    dead = [e for e in run.events.of(SERVICE, event=SVC_EXIT) if a - 5.0 <= e["t"] <= b]
    if dead:
        return str(dead[0]["service"])
    pids = {e.get("pid") for e in run.events.of(SAMPLE, collector="process") if e.get("pid")}
    starts = list(run.events.of(SERVICE, event=SVC_START))
    by_pid = [e["service"] for e in starts if e.get("pid") in pids]
    if by_pid:
        return str(by_pid[0])
    names = {e["service"] for e in starts}
    return str(next(iter(names))) if len(names) == 1 else "the platform"


def _evidence(run: RunData, svc: str, a: float, b: float, silent: list, stalls: list) -> tuple[list[str], dict]:
    ev = run.events
    out: list[str] = []
    figures: dict = {}
    for e in ev.of(SERVICE, event=SVC_EXIT):
        if a - 5.0 <= e["t"] <= b:
            ready = next((r["t"] for r in ev.of(SERVICE, event=SVC_READY, service=e["service"]) if r["t"] >= e["t"]),
                         None)
            out.append(f"{e['service']} died at t={e['t']:.0f}s ({e.get('cause') or 'exit ' + str(e.get('code'))})"
                       + (f", ready again at t={ready:.0f}s" if ready is not None else ", never ready again"))
    used = [(t, v) for t, v in ev.series("metrics", "heap_used") if a - 10.0 <= t <= b]
    mx = [v for t, v in ev.series("metrics", "heap_max") if a - 10.0 <= t <= b and v > 0]
    if used and mx:
        peak = max(v for _, v in used)
        figures["heap_used_mb"], figures["heap_max_mb"] = round(peak / MB, 1), round(max(mx) / MB, 1)
        if peak >= 0.9 * max(mx):
            out.append(f"heap at its max ({peak / MB:,.0f} of {max(mx) / MB:,.0f} MB)")
    if not any(w.startswith("heap at its max") for w in out):    # no heap metric then: the GC log may say
        for h in heap_headroom(run)[0]:
            if h.t is not None and a - 60.0 <= h.t <= b and h.pct < 10.0:
                out.append(f"{h.service}'s heap after GC at {h.peak_after_gc_mb:,.0f} of {h.max_mb:,.0f} MB "
                           f"at t={h.t:.0f}s (GC log)")
    gc_all = ev.series("metrics", "gc_seconds")
    gc = [(t, v) for t, v in gc_all if a - 2.0 <= t <= b + 2.0]
    wrong = impossible.backwards(gc_all, impossible.GC_SECONDS, ev) if len(gc) >= 2 else None
    if wrong is not None:     # evidence only: a counter that cannot be true is said, not read
        out.append(f"{wrong.metric} not read: {wrong.value:,.6g} at t={wrong.t:.0f}s ({wrong.rule})")
    elif len(gc) >= 2 and gc[-1][0] > gc[0][0]:     # a restart resets the counter: its new value counts from zero
        share = sum(counter_steps(gc)) / (gc[-1][0] - gc[0][0])
        figures["gc_time_pct"] = round(100.0 * share, 1)
        if share >= 0.3:
            out.append(f"{100.0 * share:.0f}% of the time in GC")
    for x in stalls:
        if x.start <= b and x.end >= a:
            figures["memory_limit_stall_s"] = x.seconds
            out.append(f"{x.service} at its memory limit ({x.usage_mb:,.0f} of {x.limit_mb:,.0f} MB) for "
                       f"{x.seconds:.0f} s from t={x.start:.0f}s: alive, the kernel reclaiming instead of killing")
    for s in silent:
        if s.start < b and (s.end is None or s.end > a):
            until = f"t={s.end:.0f}s" if s.end is not None else "the end"
            out.append(f"{s.collector} silent from t={s.start:.0f}s to {until} ({s.reason[:60]})")
    stored = [(t, v) for t, v in ev.series("storage", "stored") if a - 5.0 <= t <= b + 5.0]
    if len(stored) >= 2 and stored[-1][0] > stored[0][0]:
        rate = (stored[-1][1] - stored[0][1]) / (stored[-1][0] - stored[0][0])
        figures["stored_rate"] = round(rate, 1)
        out.append(f"storage wrote {rate:,.0f} msg/s meanwhile")
    cpu = [v for t, v in ev.series("process", "cpu_pct") if a <= t <= b]
    if cpu:
        figures["cpu_pct"] = round(sum(cpu) / len(cpu), 1)
        if not out:
            out.append(f"{svc}'s CPU {figures['cpu_pct']:.0f}% meanwhile")
    return out, figures


def serves_throughout(run: RunData, max_silent_s: float = 10, min_fraction: float = 0.1,
                      settle_s: float = 5) -> Verdict:
    """No stretch longer than ``max_silent_s`` seconds, outside fault windows (and their settle time), in which
    the load offered work and fewer than ``min_fraction`` of it was acked."""
    name = "serves_throughout"
    loads = sorted((float(e["t"]), int(e.get("acked") or 0), float(e.get("target_rate") or 0))
                   for e in run.events.of(LOAD) if float(e.get("target_rate") or 0) > 0)
    if not loads:
        return Verdict(name, UNKNOWN, {}, "no load second offered any work: nothing to serve")
    spans = fault_spans(run.events)
    t0 = loads[0][0]
    judged = [x for x in loads if x[0] >= t0 + settle_s and not any(a <= x[0] <= b for a, b in spans)]
    if not judged:
        return Verdict(name, UNKNOWN, {"judged_seconds": 0},
                       "every load second was in a fault window or its settle time: nothing judged")
    unserved = [x for x in judged if x[1] < min_fraction * x[2]]
    stretches = _stretches(unserved)
    longest = max((b - a for a, b, _, _ in stretches), default=0.0)
    figures: dict = {"judged_seconds": len(judged), "unserved_seconds": len(unserved),
                     "longest_silent_s": round(longest, 1), "max_silent_s": max_silent_s}
    bad = [s for s in stretches if s[1] - s[0] > max_silent_s]
    if not bad:
        return Verdict(name, PASS, figures,
                       f"acked >= {min_fraction:.0%} of the offered load but for stretches of at most {longest:.0f}s "
                       f"(limit {max_silent_s:g}s; {len(judged)} load seconds judged outside fault windows)")
    figures["silent_stretches"] = len(bad)
    silent, stalls = silences(run.events), limit_stalls(run)
    parts = []
    for i, (a, b, acked, offered) in enumerate(bad[:3]):
        svc = _service(run, a, b)
        why, more = _evidence(run, svc, a, b, silent, stalls)
        if i == 0:
            figures.update(more)
        parts.append(f"{svc} served {acked:,} of {offered:,.0f} messages offered for {b - a:.0f}s from t={a:.0f}s"
                     + (f": {'; '.join(why)}" if why else ": no sign why in the timeline"))
    return Verdict(name, FAIL, figures,
                   f"{'; '.join(parts)} (at most {max_silent_s:g}s under {min_fraction:.0%} of the offered load "
                   f"allowed outside fault windows)")
