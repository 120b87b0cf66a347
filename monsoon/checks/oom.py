"""Out-of-memory evidence from every angle, and the ``no_oom`` check that combines it.

The reasoning, sources and measurements behind it: docs/design.md, "monsoon/checks/oom.py"."""
from __future__ import annotations

import bisect
import re
import signal
from dataclasses import dataclass, field
from pathlib import Path

from monsoon.checks.base import FAIL, PASS, RunData, UNKNOWN, Verdict, combine, when
from monsoon.checks.memory import gc_log_files, gc_logs
from monsoon.timeline.views import KILL_KINDS, explained_by_kill, fault_windows
from monsoon.timeline.store import Events
from monsoon.timeline.events import (LOAD, META, SAMPLE, SERVICE, SVC_EXIT, SVC_RESTART, SVC_RESTART_FAILED,
                                     SVC_START, SVC_STOP)


MB = 1024 * 1024
ATTRIBUTE_SLACK_S = 2.0     # an oom_kill increase belongs to an exit this close to its sample interval
KILL_EXPLAINS_S = 60.0      # a platform restart this soon after an injected kill is the kill's (as faultchecks)


# =============================================================== parsing (used by the collectors)


# =============================================================== cgroup evidence

@dataclass(frozen=True)
class OomKillIncrease:
    t_prev: float
    t: float                      # the sample that saw it
    delta: int
    before: int                   # the raw oom_kill counter of the cgroup that rose (or the cumulative)
    after: int
    cgroup: str
    shared: bool                  # other processes than the service's were in that cgroup


@dataclass
class CgroupEvidence:
    service: str | None
    good: list[dict]
    reasons: list[str]
    increases: list[OomKillIncrease] = field(default_factory=list)

    @property
    def available(self) -> bool:
        return bool(self.good)

    @property
    def oom_kills(self) -> int:
        return int(self.good[-1].get("oom_kills") or 0) if self.good else 0

    @property
    def limit_hits(self) -> int:
        return int(self.good[-1].get("limit_hits") or 0) if self.good else 0

    def covers(self, t: float) -> bool:
        """A good sample before ``t`` and one at/after it: an oom_kill at ``t`` would have been counted."""
        return any(s["t"] < t for s in self.good) and any(s["t"] >= t for s in self.good)

    def increase_for_exit(self, t: float) -> OomKillIncrease | None:
        """The oom_kill increase whose sample interval holds (or just follows) an exit at ``t``."""
        return next((i for i in self.increases if i.t_prev < t + ATTRIBUTE_SLACK_S and i.t >= t - ATTRIBUTE_SLACK_S),
                    None)


def cgroup_evidence(events) -> dict[str | None, CgroupEvidence]:
    """The ``cgroup`` collectors' samples, per service (one collector per service of the stack; a run from
    before that has one, of the observed service); empty when none ran."""
    by: dict[str | None, list[dict]] = {}
    for s in events.of(SAMPLE, collector="cgroup"):
        by.setdefault(s.get("service"), []).append(s)
    return {svc: _evidence(svc, samples) for svc, samples in by.items()}


def _evidence(service: str | None, samples: list[dict]) -> CgroupEvidence:
    good = [s for s in samples if s.get("available") and isinstance(s.get("oom_kills"), (int, float))]
    good_ids = {id(s) for s in good}     # a set: a list's `in` made this quadratic in run seconds
    reasons = sorted({str(s.get("reason") or s.get("error")) for s in samples if id(s) not in good_ids
                      and (s.get("reason") or s.get("error"))})
    ev = CgroupEvidence(service, good, reasons)
    for a, b in zip(good, good[1:]):
        d = int(b["oom_kills"]) - int(a["oom_kills"])
        if d <= 0:
            continue
        before, after, where, shared = int(a["oom_kills"]), int(b["oom_kills"]), b.get("cgroup") or "?", False
        cga, cgb = a.get("cgroups") or {}, b.get("cgroups") or {}
        for path, now in cgb.items():
            was = (cga.get(path) or {}).get("oom_kill")
            if isinstance(now.get("oom_kill"), int) and now["oom_kill"] > (was if isinstance(was, int) else 0):
                before, after, where = (was if isinstance(was, int) else 0), now["oom_kill"], path
                shared = bool(now.get("shared"))
                break
        ev.increases.append(OomKillIncrease(a["t"], b["t"], d, before, after, where, shared))
    return ev


# =============================================================== stalled at the memory limit

LIMIT_FULL = 0.97           # cgroup usage at or above this share of its limit is "at the limit"
LIMIT_ANON = 0.50           # ... and anonymous memory at least this share (else it is page cache, reclaimable)
LIMIT_STARVED = 0.10        # a load second with fewer acks than this share of its target is starved
LIMIT_STALL_MIN_S = 10.0    # shorter spans at the limit are a GC or a flush, not a stall
LIMIT_GAP_S = 2.5           # samples further apart than this break a span


@dataclass(frozen=True)
class LimitStall:
    """A service sitting at its memory cgroup's limit while the load got (almost) no acks: no kill, no
    progress. The kernel keeps reclaiming file pages (the JVM's own code, the page cache) instead of
    OOM-killing, so the container is alive, at its limit, and serves nothing."""
    service: str
    start: float
    end: float
    usage_mb: float
    limit_mb: float
    anon_mb: float | None         # memory the kernel cannot reclaim without swap (None: an older run)
    refaults: int | None          # file pages read back after eviction during the span (thrashing)
    acked: int
    scheduled: int

    @property
    def seconds(self) -> float:
        return round(self.end - self.start + 1.0, 1)


def _limited(sample: dict) -> dict | None:
    """The cgroup of a sample that has a limit (the service's current one first)."""
    groups = sample.get("cgroups") or {}
    cur = groups.get(sample.get("cgroup") or "")
    for g in ([cur] if cur else []) + list(groups.values()):
        if isinstance(g.get("usage_mb"), (int, float)) and isinstance(g.get("limit_mb"), (int, float)) \
                and g["limit_mb"] > 0:
            return g
    return None


def _at_limit(g: dict | None) -> bool:
    if g is None or g["usage_mb"] < LIMIT_FULL * g["limit_mb"]:
        return False
    anon = g.get("anon_mb")                  # runs before memory.stat was read: usage alone
    return not isinstance(anon, (int, float)) or anon >= LIMIT_ANON * g["limit_mb"]


def limit_stalls(run: RunData, min_s: float = LIMIT_STALL_MIN_S) -> list[LimitStall]:
    """Spans of at least ``min_s`` seconds in which a service's cgroup sat at its limit (usage >= 97 %,
    anonymous memory >= 50 % when the run recorded it: a limit full of page cache is reclaimable and normal)
    and every load second in them was starved (fewer acks than 10 % of its target). Seconds an injected fault
    explains are not judged (a kill's window reaches ``KILL_EXPLAINS_S`` past its start: the restart)."""
    loads = sorted((float(e["t"]), int(e.get("acked") or 0), int(e.get("scheduled") or 0),
                    float(e.get("target_rate") or 0)) for e in run.events.of(LOAD))
    if not loads:
        return []
    wins = [(w.start - 1.0, max(w.end if w.end is not None else float("inf"),
                                w.start + KILL_EXPLAINS_S if w.kind in KILL_KINDS else 0.0) + 2.0)
            for w in fault_windows(run.events)]
    load_t = [x[0] for x in loads]
    out: list[LimitStall] = []
    by: dict[str, list[dict]] = {}
    for s in run.events.of(SAMPLE, collector="cgroup"):
        if s.get("available"):
            by.setdefault(str(s.get("service") or "the service"), []).append(s)
    for svc, samples in by.items():
        span: list[tuple[dict, dict, tuple]] = []

        def close(svc: str = svc, span: list = span) -> None:   # bound now: B023
            if span and span[-1][0]["t"] - span[0][0]["t"] + 1.0 >= min_s:
                seconds = {x[2] for x in span}
                rf = [g.get("refaults") for _, g, _ in span]
                out.append(LimitStall(
                    svc, float(span[0][0]["t"]), float(span[-1][0]["t"]),
                    max(g["usage_mb"] for _, g, _ in span), max(g["limit_mb"] for _, g, _ in span),
                    max((g["anon_mb"] for _, g, _ in span if isinstance(g.get("anon_mb"), (int, float))),
                        default=None),
                    (rf[-1] - rf[0]) if all(isinstance(x, int) for x in rf) and len(rf) > 1 and rf[-1] > rf[0]
                    else None,
                    sum(x[1] for x in seconds), sum(x[2] for x in seconds)))
            span.clear()

        for s in samples:
            g = _limited(s)
            i = bisect.bisect_left(load_t, float(s["t"]) - 1.5)
            near = [x for x in loads[i:i + 3] if abs(x[0] - float(s["t"])) <= 1.5]
            sec = min(near, key=lambda x: abs(x[0] - float(s["t"]))) if near else None
            starved = (sec is not None and sec[3] > 0 and sec[1] < LIMIT_STARVED * sec[3]
                       and not any(a <= float(s["t"]) <= b for a, b in wins))
            full = _at_limit(g)
            if span and float(s["t"]) - span[-1][0]["t"] > LIMIT_GAP_S:
                close()
            if full and starved:
                assert g is not None and sec is not None     # full: g is a cgroup; starved: sec is a load second
                span.append((s, g, sec))
            else:
                close()
        close()
    return sorted(out, key=lambda x: x.start)


# =============================================================== platform (kubernetes / docker) evidence

@dataclass(frozen=True)
class PlatformEvent:
    t: float
    key: str                     # pod/container or container name
    kind: str                    # "oom", "exit", "restart"
    text: str
    delta: int = 1


@dataclass
class PlatformEvidence:
    label: str                   # "kubernetes" / "docker"
    samples: int
    good: int
    events: list[PlatformEvent]
    keys: int                    # containers seen
    problems: list[str]          # why the angle can't vouch (errors, nothing matched, containers missing)

    def of(self, kind: str) -> list[PlatformEvent]:
        return [e for e in self.events if e.kind == kind]


def platform_evidence(events, collector: str, label: str) -> PlatformEvidence | None:
    samples = list(events.of(SAMPLE, collector=collector))
    if not samples:
        return None
    good = [s for s in samples if isinstance(s.get("containers"), dict)]
    problems: list[str] = []
    if not good:
        errs = sorted({str(s.get("error")) for s in samples if s.get("error")})
        problems.append(f"every {label} query failed ({len(samples)}), e.g. {errs[0] if errs else 'no data'}")
        return PlatformEvidence(label, len(samples), 0, [], 0, problems)
    base = good[0]["containers"]
    seen_terms = {(k, t.get("finished_at")) for k, c in base.items() for t in c.get("terminations") or []}
    last_restarts = {k: int(c.get("restarts") or 0) for k, c in base.items()}
    last_id = {k: c.get("id") for k, c in base.items()}
    out: list[PlatformEvent] = []
    keys = set(base)
    for s in good[1:]:
        for k, c in s["containers"].items():
            keys.add(k)
            if k in last_id and c.get("id") != last_id[k]:      # docker: a re-created container counts anew
                last_restarts[k] = 0
            last_id[k] = c.get("id")
            for term in c.get("terminations") or []:
                tk = (k, term.get("finished_at"))
                if tk in seen_terms:
                    continue
                seen_terms.add(tk)
                code = term.get("exit_code")
                if term.get("oom_killed"):
                    out.append(PlatformEvent(s["t"], k, "oom", f"{label}: {k} OOMKilled (exit {code}, finished "
                                                            f"{term.get('finished_at')})"))
                else:
                    out.append(PlatformEvent(s["t"], k, "exit", f"{label}: {k} terminated: "
                                                             f"{term.get('reason') or 'exit'} (exit {code})"))
            n = int(c.get("restarts") or 0)
            prev = last_restarts.get(k, 0)
            if n > prev:
                out.append(PlatformEvent(s["t"], k, "restart", f"{label}: {k} restartCount {prev}→{n}", n - prev))
            last_restarts[k] = n
    if not keys:
        problems.append(f"{label}: no container matched (every sample empty)")
    missing = sorted({m for s in good for m in s.get("missing") or []} - keys)
    if missing:
        problems.append(f"{label}: container(s) {', '.join(missing)} not found")
    return PlatformEvidence(label, len(samples), len(good), out, len(keys), problems)


def _kill_explains(windows, t: float) -> bool:
    return any(w.start - 3.0 <= t <= w.start + KILL_EXPLAINS_S + 2.0 for w in windows)


# =============================================================== headroom

_MAX_CAP = re.compile(r"Heap Max Capacity:\s*(\d+(?:\.\d+)?)([BKMG])")
_UNIT = {"B": 1.0 / MB, "K": 1.0 / 1024, "M": 1.0, "G": 1024.0}


def _log_max_heap_mb(path: Path) -> float | None:
    try:
        with open(path, errors="replace") as fh:
            for _, line in zip(range(200), fh):      # a gc,init line near the top
                m = _MAX_CAP.search(line)
                if m:
                    return float(m[1]) * _UNIT[m[2]]
    except OSError:
        pass
    return None


@dataclass(frozen=True)
class Headroom:
    service: str
    peak_after_gc_mb: float
    max_mb: float
    source: str                   # where the max came from
    pct: float
    t: float | None               # timeline time of the peak pause, when the log has wall times


def gc_logs_with_rotated(run_dir: Path) -> tuple[dict[str, list], dict[str, list[Path]]]:
    """Every JVM's GC pauses by service, with the files they came from: ``gc.log`` plus the files the JVM
    rotated away at each restart (a JVM that died of OOM is in a rotated file); see ``memory.gc_log_files``."""
    return gc_logs(run_dir), gc_log_files(run_dir)


def heap_headroom(run) -> tuple[list[Headroom], str]:
    """Per service GC log: peak heap-after-GC vs the max heap; with the reason when none could be measured."""
    logs, files = gc_logs_with_rotated(run.dir)
    if not logs:
        return [], "no GC log (services/*/gc.log)"
    metric = [v for _, v in run.events.series("metrics", "heap_max") if v > 0]
    meta = run.events.first(META)
    off = (meta["wall"] - meta["t"]) if meta and isinstance(meta.get("wall"), (int, float)) else None
    last_t = max((float(e["t"]) for e in run.events.events if isinstance(e.get("t"), (int, float))), default=0.0)
    out, why = [], []
    for svc, pauses in logs.items():
        if not pauses:
            why.append(f"{svc}: no GC pause in its log")
            continue
        peak = max(pauses, key=lambda p: p.after_mb)
        mx, src = None, ""
        if metric and len(logs) == 1:
            mx, src = max(metric) / MB, "heap_max metric"
        if mx is None:
            caps = [c for c in (_log_max_heap_mb(f) for f in files.get(svc, [])) if c]
            mx, src = (max(caps) if caps else None), "GC log Heap Max Capacity"
        if not mx:
            why.append(f"{svc}: no max heap (no heap_max metric, no 'Heap Max Capacity' in its GC log)")
            continue
        t = None if (peak.wall is None or off is None) else round(peak.wall - off, 1)
        if t is not None and not (-60.0 <= t <= last_t + 60.0):
            t = None                      # the log's clock does not match the timeline's: leave the time out
        out.append(Headroom(svc, round(peak.after_mb, 1), round(mx, 1), src,
                            round(100.0 * (1.0 - peak.after_mb / mx), 1), t))
    return out, "; ".join(why)


# =============================================================== the check

def _signal_of(code) -> str:
    if isinstance(code, int) and code > 128:
        try:
            return signal.Signals(code - 128).name
        except ValueError:
            pass
    return f"exit {code}"


@dataclass
class Deaths:
    """Every service exit of a run, sorted by what explains it (each exit in exactly one list)."""
    ooms: list[tuple[dict, str]] = field(default_factory=list)        # (exit, the evidence)
    unexpected: list[tuple[dict, str]] = field(default_factory=list)  # (exit, why it is not an OOM)
    injected: list[dict] = field(default_factory=list)                # a monsoon kill explains it
    restarts: list[dict] = field(default_factory=list)                # restarts no injected kill explains
    stray: list[tuple[str, OomKillIncrease]] = field(default_factory=list)   # oom_kill rises no exit explains
    uncovered: list[dict] = field(default_factory=list)               # SIGKILLs no OOM angle could have seen
    supervised: bool = False                                          # the timeline has service events
    cgroups: dict = field(default_factory=dict)


def deaths(ev: Events) -> Deaths:
    """Sort every ``service`` exit: an OOM on evidence (an OutOfMemoryError in its log, the kernel's OOM
    line for its pid, an ``oom_kill`` increase of its cgroup in the same sample interval as a SIGKILL exit),
    else the work of an injected kill, else an unexpected death (with its signal)."""
    out = Deaths(supervised=ev.first(SERVICE, event=SVC_START) is not None)
    if not out.supervised:
        return out
    cgs = cgroup_evidence(ev)
    out.cgroups = cgs
    explained = explained_by_kill(ev)
    matched: set[tuple[str, float]] = set()      # oom_kill increases (cgroup, t) an exit accounts for
    for e in ev.of(SERVICE, event=SVC_EXIT):
        svc, code = e["service"], e.get("code")
        cg = cgs.get(svc) or (cgs.get(None) if len(cgs) == 1 else None)   # a run with one unnamed collector
        inc = cg.increase_for_exit(e["t"]) if (cg is not None and cg.available and code == 137) else None
        if inc is not None and (inc.cgroup, inc.t) in matched:
            inc = None
        if e.get("oom"):
            if inc is not None:                   # the cgroup saw the same death: it is this exit's
                matched.add((inc.cgroup, inc.t))
            out.ooms.append((e, e.get("cause") or "out of memory"))
        elif inc is not None:
            matched.add((inc.cgroup, inc.t))
            out.ooms.append((e, f"exit 137, cgroup oom_kill {inc.before}→{inc.after}: killed by the kernel OOM "
                                f"killer"))
        elif ("exit", svc, e["t"]) in explained:
            out.injected.append(e)
        else:
            seen = []
            if cg is not None and cg.available and cg.covers(e["t"]):
                seen.append("cgroup oom_kill unchanged")
            kl = e.get("kernel_log")
            if kl is not None and not str(kl).startswith("kernel log unreadable"):
                seen.append("no kernel OOM-kill line for its pid")
            if code == 137 and not seen:
                out.uncovered.append(e)
            sig = _signal_of(code)
            cause = e.get("cause")
            why = ((f"{svc} died of {sig}" if sig.startswith("SIG") else f"{svc} exited with code {code}")
                   + (f" ({cause})" if cause and code != 137 and cause != f"exit {code}" else "")
                   + ((", sent by monsoon outside any kill fault" if str(cause or "").startswith("killed by monsoon")
                       else ", not sent by monsoon") if code == 137 else "")
                   + (f", with no OOM evidence ({', '.join(seen)})" if seen else
                      ", with no OOM angle to tell (no cgroup samples, kernel log unreadable)" if code == 137 else ""))
            out.unexpected.append((e, why))
    for e in ev.of(SERVICE, event=SVC_STOP):     # a death while it was being stopped is a death like any other
        if e.get("oom") or e.get("code") == 3:
            out.ooms.append((e, "exit 3 while being stopped (the JVM's ExitOnOutOfMemoryError code: an "
                                "OutOfMemoryError during its graceful stop)"))
    out.restarts = [e for e in ev.of(SERVICE, event=SVC_RESTART) if ("restart", e["service"], e["t"]) not in explained]
    seen_inc: set[tuple[str, float]] = set(matched)
    for svc, cg in cgs.items():
        for inc in cg.increases:
            if (inc.cgroup, inc.t) in seen_inc:
                continue
            seen_inc.add((inc.cgroup, inc.t))
            out.stray.append((svc or "the service", inc))
    return out


def _platforms(run: RunData):
    """(collector, label, key, evidence, kill windows) of the Kubernetes and Docker angles that ran."""
    kill_windows = [w for w in fault_windows(run.events) if w.kind in KILL_KINDS]
    for collector, label, key in (("kube", "kubernetes", "k8s"), ("docker", "docker", "docker")):
        pe = platform_evidence(run.events, collector, label)
        if pe is not None:
            yield label, key, pe, kill_windows


def no_oom(run: RunData, min_headroom_pct: float | None = None) -> Verdict:
    """No service of the stack died of out-of-memory, on evidence only: a JVM OutOfMemoryError (exit 3 with
    it, or in its log), the kernel's OOM-kill line naming its pid, an ``oom_kill`` increase of its cgroup
    (every service's cgroup is sampled), Kubernetes' or Docker's OOMKilled.

    A SIGKILL (exit 137) with none of these is not an OOM: it is an unexpected death, ``no_unexpected_exit``'s
    to report. Deaths an injected kill explains are the fault working (``injected_kills``).
    ``heap_headroom_pct`` (100 x (1 - peak heap-after-GC / max heap)) is reported; below ``min_headroom_pct``
    it fails (a near-OOM).
    """
    name = "no_oom"
    figures: dict[str, float] = {}
    results: list[tuple[str, str]] = []          # (verdict, message) per finding
    notes: list[str] = []                        # what passed, for the one-line reason
    angles = 0                                   # angles that held data

    d = deaths(run.events)
    if d.supervised:
        angles += 1
        after_oom = [r for r in d.restarts if any(e["service"] == r["service"] and e["t"] <= r["t"] for e, _ in d.ooms)]
        figures.update({"oom_events": len(d.ooms), "restarts": len(after_oom),
                        "exits": len(d.ooms) + len(d.unexpected)})   # every death no injected kill explains
        if d.injected:
            figures["injected_kills"] = len(d.injected)
        if d.ooms:
            results.append((FAIL, "; ".join(f"{e['service']} died: {why} at {when(run, e['t'])}" for e, why in d.ooms[:3])
                            + f"; {len(after_oom)} restart(s) after it"))
        else:
            notes.append("no out-of-memory death" + (f" ({len(d.injected)} exit(s) caused by injected kills)"
                                                      if d.injected else "")
                         + (f"; {len(d.unexpected)} death(s) without OOM evidence: see no_unexpected_exit"
                            if d.unexpected else ""))
        for e in d.uncovered:
            results.append((UNKNOWN, f"{e['service']} died of SIGKILL (exit 137) at {when(run, e['t'])} and no "
                                     f"angle could tell whether the kernel OOM killer did it (no cgroup samples of "
                                     f"it, kernel log unreadable)"))
        for svc, inc in d.stray:
            what = (f"cgroup oom_kill {inc.before}→{inc.after} in {inc.cgroup} at {when(run, inc.t)} "
                    f"without an exit 137 of {svc}")
            if inc.shared:
                results.append((UNKNOWN, what + ": the cgroup is shared with other processes, so the victim "
                                                "may not be the service's"))
            else:
                results.append((FAIL, what + f": the kernel OOM killer killed a process of {svc}"))
        stalls = limit_stalls(run)
        if stalls:
            figures["memory_limit_stalls"] = len(stalls)
            figures["memory_limit_stall_s"] = max(x.seconds for x in stalls)
            for x in stalls[:3]:
                killed = any(e["service"] == x.service and x.start <= e["t"] <= x.end + LIMIT_GAP_S + 2.0
                             for e, _ in d.ooms)
                results.append((FAIL, f"{x.service} stalled at its memory limit for {x.seconds:.0f} s from "
                                      f"{when(run, x.start)}: cgroup usage {x.usage_mb:,.1f} of {x.limit_mb:,.0f} MB"
                                      + (f" ({x.anon_mb:,.0f} MB anonymous)" if x.anon_mb is not None else "")
                                      + f", {x.acked:,} of {x.scheduled:,} messages acked meanwhile"
                                      + (f", {x.refaults:,} evicted file pages re-read (thrashing)" if x.refaults
                                         else "")
                                      + ("; then the kernel OOM-killed it" if killed else
                                         "; the kernel did not OOM-kill it: alive, at its limit, serving nothing")))
        good = {svc: cg for svc, cg in d.cgroups.items() if cg.available}
        if good:
            figures["cgroup_oom_kills"] = sum(cg.oom_kills for cg in good.values())
            figures["cgroup_limit_hits"] = sum(cg.limit_hits for cg in good.values())
            if run.events.first(LOAD) is not None and any(     # judged against a load, on memory.stat
                    "anon_mb" in g for cg in good.values() for x in cg.good for g in (x.get("cgroups") or {}).values()):
                figures["memory_limit_stalls"] = len(stalls)  # (an older run's figures stay as they were)
            if not any(cg.increases for cg in good.values()):
                notes.append(f"cgroup oom_kill +0 ({len(good)} service(s), "
                             f"{sum(len(cg.good) for cg in good.values())} samples)")
        elif d.cgroups:
            cg = next(iter(d.cgroups.values()))
            notes.append(f"cgroup angle unavailable: {cg.reasons[0] if cg.reasons else 'no usable sample'}")

    for label, key, pe, _kill_windows in _platforms(run):
        if pe.good:
            angles += 1
            figures[f"{key}_oom_killed"] = len(pe.of("oom"))
        if pe.of("oom"):
            results.append((FAIL, "; ".join(f"{e.text} at {when(run, e.t)}" for e in pe.of("oom")[:3])))
        elif pe.good:
            notes.append(f"{label}: {pe.keys} container(s), 0 OOMKilled")
        for p in pe.problems:
            results.append((UNKNOWN, p))

    # ---- heap headroom
    headroom_note = None
    rows, why = heap_headroom(run)
    if rows:
        worst = min(rows, key=lambda r: r.pct)
        figures["heap_headroom_pct"] = worst.pct
        figures["heap_peak_after_gc_mb"] = worst.peak_after_gc_mb
        figures["heap_max_mb"] = worst.max_mb
        if len(rows) > 1:
            for r in rows:
                figures[f"heap_headroom_pct.{r.service}"] = r.pct
        desc = (f"heap headroom {worst.pct:.1f}%: {worst.service}'s heap after GC peaked at "
                f"{worst.peak_after_gc_mb:,.0f} MB of {worst.max_mb:,.0f} MB max ({worst.source})"
                + (f" at {when(run, worst.t)}" if worst.t is not None else ""))
        if min_headroom_pct is not None:
            lim = float(min_headroom_pct)
            figures["min_headroom_pct"] = lim
            if worst.pct < lim:
                results.append((FAIL, desc + f", below the {lim:g}% minimum: a near-OOM"))
            else:
                headroom_note = desc + f" (minimum {lim:g}%)"
        else:
            headroom_note = desc
    elif min_headroom_pct is not None:
        figures["min_headroom_pct"] = float(min_headroom_pct)
        results.append((UNKNOWN, f"heap headroom not measurable: {why}"))

    if angles == 0:
        figures.setdefault("oom_events", 0)
        figures.setdefault("restarts", 0)
        return Verdict(name, UNKNOWN, figures,
                       "no service events in the timeline: monsoon did not supervise this stack"
                       + ("" if not results else "; " + "; ".join(m for _, m in results)))
    return _verdict(name, figures, results, notes, headroom_note)


def _verdict(name: str, figures: dict, results: list[tuple[str, str]], notes: list[str],
             extra: str | None = None) -> Verdict:
    """Fail beats unknown beats pass; the message leads with the worst findings (the notes when all pass)."""
    verdict = combine([v for v, _ in results] or [PASS])
    order = {FAIL: 0, UNKNOWN: 1, PASS: 2}
    msgs = notes if verdict == PASS else [m for v, m in sorted(results, key=lambda r: order[r[0]])]
    if extra:                                   # context for every verdict (heap headroom)
        msgs = msgs + [extra]
    return Verdict(name, verdict, figures, "; ".join(msgs))


def no_unexpected_exit(run: RunData) -> Verdict:
    """No service of the stack died, or restarted, without a cause monsoon knows: an injected kill (the
    fault working) or an out-of-memory death (``no_oom``'s). A SIGKILL from outside, a crash, an exit 1:
    each is named with its service, its signal or code, and when it happened (``unexpected_exits``)."""
    name = "no_unexpected_exit"
    figures: dict[str, float] = {}
    results: list[tuple[str, str]] = []
    notes: list[str] = []
    angles = 0
    d = deaths(run.events)
    if d.supervised:
        angles += 1
        oom_svcs = {e["service"] for e, _ in d.ooms}
        restarts = [r for r in d.restarts if not any(e["service"] == r["service"] and e["t"] <= r["t"]
                                                     for e, _ in d.ooms)]
        failed = list(run.events.of(SERVICE, event=SVC_RESTART_FAILED))
        figures.update({"unexpected_exits": len(d.unexpected), "restarts": len(restarts)})
        if d.injected:
            figures["injected_kills"] = len(d.injected)
        if d.ooms:
            figures["oom_deaths"] = len(d.ooms)
        if d.unexpected:
            results.append((FAIL, "; ".join(f"{why} at {when(run, e['t'])}" for e, why in d.unexpected[:3])
                            + (f" (and {len(d.unexpected) - 3} more)" if len(d.unexpected) > 3 else "")
                            + f"; {len(restarts)} restart(s)"))
        for f in failed:
            results.append((FAIL, f"{f['service']} could not be restarted at {when(run, f['t'])}: "
                                  f"{str(f.get('error', ''))[:200]}"))
        if not d.unexpected and not failed:
            notes.append("no unexpected death or restart"
                         + (f" ({len(d.injected)} caused by injected kills)" if d.injected else "")
                         + (f"; {len(d.ooms)} out-of-memory death(s) of {', '.join(sorted(oom_svcs))}: see no_oom"
                            if d.ooms else ""))
    for label, key, pe, kill_windows in _platforms(run):
        if not pe.good:
            continue
        angles += 1
        exits_p = [e for e in pe.of("exit") if not _kill_explains(kill_windows, e.t)]
        restarts_p = [e for e in pe.of("restart") if not _kill_explains(kill_windows, e.t)]
        n_restarts = max(0, sum(e.delta for e in restarts_p) - len(pe.of("oom")))   # an OOMKilled restarts too
        figures[f"{key}_exits"] = len(exits_p)
        figures[f"{key}_restarts"] = n_restarts
        injected_p = sum(e.delta for e in pe.of("restart") if e not in restarts_p) + \
            len([e for e in pe.of("exit") if e not in exits_p])
        if injected_p:
            figures[f"{key}_injected_kills"] = injected_p
        if exits_p or n_restarts:
            shown = (exits_p or restarts_p)[:3]
            results.append((FAIL, "; ".join(f"{e.text} at {when(run, e.t)}" for e in shown)
                            + f"; {n_restarts} restart(s) without an OOMKilled or an injected kill"))
        else:
            notes.append(f"{label}: {pe.keys} container(s), no unexpected exit or restart")
    if angles == 0:
        return Verdict(name, UNKNOWN, figures, "no service events in the timeline: monsoon did not supervise "
                                               "this stack, and no Kubernetes or Docker angle ran")
    return _verdict(name, figures, results, notes)


# At the bottom on purpose (as memory.py): checks.py imports this module at its end to register no_oom
# and no_unexpected_exit.
