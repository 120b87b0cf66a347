"""Torn runs said out loud: a verdict that rests on a part of the run that was cut off is ``unknown``.

The reasoning, sources and measurements behind it: docs/design.md, "monsoon/checks/torn.py"."""
from __future__ import annotations

from dataclasses import dataclass, field

from monsoon.checks.base import FAIL, INFO, PASS, RunData, UNKNOWN, Verdict, check_base
from monsoon.rundir import ACKED_DATA, LATENCY_FILE, SENT_DATA, STORED_DATA, TIMELINE_FILE
from monsoon.timeline.events import DRAIN, FAULT_CENSUS, OP, OP_LOAD_END, STORED

PASS_ONLY = frozenset({PASS})
FAIL_ONLY = frozenset({FAIL})
BOTH = frozenset({PASS, FAIL})
NEITHER: frozenset[str] = frozenset()          # read (for figures), but its damage cannot overturn the verdict: named only


@dataclass(frozen=True)
class Reads:
    """What a check reads: the timeline up to ``until`` and ``files``, each with the verdicts (pass, fail)
    that a damage to it can no longer support."""

    until: str                                  # a key of _UNTIL
    timeline: frozenset = PASS_ONLY
    files: dict[str, frozenset] = field(default_factory=dict)


READS: dict[str, Reads] = {
    "no_acked_loss": Reads("stored", BOTH, {ACKED_DATA: PASS_ONLY, STORED_DATA: FAIL_ONLY, SENT_DATA: NEITHER}),
    "no_duplicates": Reads("stored", PASS_ONLY, {STORED_DATA: PASS_ONLY}),
    "no_unexpected": Reads("stored", PASS_ONLY, {STORED_DATA: PASS_ONLY, SENT_DATA: FAIL_ONLY}),
    "no_oom": Reads("stored"),
    "no_unexpected_exit": Reads("stored"),
    "lag_recovers_within": Reads("drain"),
    "lag_bounded": Reads("drain"),
    "consumer_not_stalled": Reads("drain"),
    "no_memory_leak": Reads("drain", BOTH),
    "gc_time_fraction": Reads("drain", BOTH),
    "no_thread_leak": Reads("load-end", BOTH),
    "faults_landed": Reads("fault-census"),
    "throughput_drop": Reads("load-end", BOTH),
    "latency_objective": Reads("load-end", BOTH, {ACKED_DATA: BOTH, LATENCY_FILE: BOTH}),
    "error_budget": Reads("load-end", BOTH, {LATENCY_FILE: BOTH}),
    "load_valid": Reads("load-end"),
}

# a check monsoon does not know (a hook's): it may read anything
DEFAULT_READS = Reads("stored", PASS_ONLY, {f: PASS_ONLY for f in (ACKED_DATA, STORED_DATA, SENT_DATA, LATENCY_FILE)})

# the event a check reads the timeline up to, and what to call it
_UNTIL = {
    "load-end": (lambda ev: ev.first(OP, op=OP_LOAD_END), "load end"),
    "fault-census": (lambda ev: ev.first(FAULT_CENSUS), "fault census"),
    "drain": (lambda ev: ev.first(DRAIN), "drain"),
    "stored": (lambda ev: ev.first(STORED), "stored-messages export"),
}


def damage(run: RunData, name: str) -> list[tuple[frozenset, str]]:
    """The torn spots that check ``name`` reads, each with the verdicts it can no longer support and why."""
    tears = run.tears
    if not tears:
        return []
    reads = READS.get(check_base(name), DEFAULT_READS)
    out: list[tuple[frozenset, str]] = []
    timeline = [t for t in tears if t.file == TIMELINE_FILE]
    if timeline:
        ev = run.events
        find, label = _UNTIL[reads.until]
        until = find(ev)
        if not ev.intact_until(until):
            lines = [t for t in timeline if t.kind == "line"]
            tail = next((t for t in timeline if t.kind == "tail"), None)
            if until is None and tail is not None:       # the cut came before the event
                out.append((reads.timeline, f"{tail.note}, before its {label}"))
            else:                                        # a line before the event is not an event
                out.append((reads.timeline, f"{lines[0].note}, before its {label}"))
    for t in tears:
        sides = reads.files.get(t.file)
        if sides is not None:
            out.append((sides, t.note))
    return out


def withhold(run: RunData, name: str, v: Verdict) -> Verdict:
    """``v`` unchanged for an intact run.  On a torn one: ``unknown`` when a damage it read can overturn it
    (the reason first, then what the check said on the part it read); otherwise the same verdict, its
    message naming the damage it stands despite (an ``unknown`` too)."""
    found = damage(run, name)
    if not found:
        return v
    said = PASS if v.verdict == INFO else v.verdict     # a reported figure stands or falls as a pass would
    why = [r for sides, r in found if said in sides]
    if why:
        return Verdict(v.name, UNKNOWN, v.figures,
                       f"{'; '.join(why)}: a {v.verdict} cannot stand on the part that was read ({v.message})")
    also = "; ".join(r for _, r in found)
    if v.verdict == UNKNOWN:
        return Verdict(v.name, UNKNOWN, v.figures, f"{v.message}; {also}")
    return Verdict(v.name, v.verdict, v.figures, f"{v.message} ({also}: the {v.verdict} stands on what was read)")
