"""Burrow's consumer-status rules over the sampled Kafka offsets (OK, WARN, ERR, STOP, STALL, REWIND)."""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Iterable

import builtins

from monsoon.timeline.events import SAMPLE

_max = builtins.max  # ``max`` is a parameter name in the lag checks


OK, WARN, ERR, STOP, STALL, REWIND = 1, 2, 3, 4, 5, 6


STATUS_NAMES = {OK: "OK", WARN: "WARN", ERR: "ERR", STOP: "STOP", STALL: "STALL", REWIND: "REWIND"}


ERRORS = (STOP, STALL, REWIND)


@dataclass(frozen=True)
class Entry:
    """One observation of a partition: poll time, committed offset (None = not committed), log-end, lag."""
    t: float
    committed: int | None
    end: int
    lag: int


@dataclass(frozen=True)
class PartitionStatus:
    partition: str
    t: float
    status: int
    reason: str

    @property
    def name(self) -> str:
        return STATUS_NAMES[self.status]


def kafka_samples(events) -> list[dict]:
    """Kafka samples that carry partition data (error samples are left out)."""
    return [e for e in events.of(SAMPLE, collector="kafka")
            if isinstance(e.get("partitions"), dict) and "error" not in e]


def partition_history(samples: list[dict]) -> dict[str, list[Entry]]:
    """Per partition, one entry per successful poll.  A partition missing from a poll after it was seen
    is recorded as not committed (its last known log-end offset carried forward)."""
    out: dict[str, list[Entry]] = {}
    for s in samples:
        parts = s["partitions"]
        for name in sorted(set(parts) | set(out)):     # sorted: a verdict's words never depend on hash order
            p = parts.get(name)
            if p is None:
                prev = out[name][-1]
                out[name].append(Entry(s["t"], None, prev.end, prev.lag))
                continue
            try:
                end = int(p["end"])
                c = int(p["committed"])
            except (KeyError, TypeError, ValueError):
                continue
            lag = int(p.get("lag", end - c if c >= 0 else end))
            out.setdefault(name, []).append(Entry(s["t"], c if c >= 0 else None, end, _max(lag, 0)))
    return out


def evaluate_window(entries: list[Entry], now: float | None = None, window: int = 10) -> tuple[int, str]:
    """Burrow's status of one partition at ``now`` from its recent polls (newest last).

    Returns (status, reason).  ``entries`` may be longer than ``window``; the last
    ``window`` committed offsets form Burrow's window.
    """
    if not entries:
        return OK, "no data"
    now = entries[-1].t if now is None else now
    cur = entries[-1]
    recent = entries[-window:]
    commits = [e for e in entries if e.committed is not None][-window:]
    if not commits:
        # monsoon extension: lag but never a committed offset over a whole window
        if len(recent) >= window and all(e.lag > 0 for e in recent):
            return STOP, f"no committed offset while lag grew to {cur.lag:,}"
        return OK, "nothing committed, no lag"
    last = commits[-1]
    assert last.committed is not None     # commits holds only the entries with a committed offset
    current_lag = cur.lag if cur.committed is not None else _max(cur.end - last.committed, 0)
    if len(commits) < window:   # Burrow's completeness rule first: a short window judges nothing
        return OK, f"incomplete window ({len(commits)}/{window}){', caught up' if current_lag == 0 else ''}"
    if current_lag == 0:
        return OK, "caught up"
    # Rule 2 (REWIND, PR #716 order): a decrease not yet recovered from
    for a, b in zip(commits, commits[1:]):
        assert a.committed is not None and b.committed is not None     # commits: committed entries only
        if b.committed < a.committed and last.committed < _max(c.committed for c in commits
                                                               if c.t <= a.t and c.committed is not None):
            return REWIND, f"committed offset went back from {a.committed:,} to {b.committed:,} at t={b.t:.0f}s"
    # Rule 3 (STOP): silent for longer than the window spanned, unless caught up a moment ago
    span = last.t - commits[0].t
    # Burrow keeps a short ring of recent log-end offsets; here: the polls since the last commit
    recently_caught_up = any(e.end <= last.committed for e in recent if e.t >= last.t)
    if now - last.t > span and not recently_caught_up:
        return STOP, (f"no committed offset for {now - last.t:.0f}s (window spanned {span:.0f}s), "
                      f"last {last.committed:,}, lag {current_lag:,}")
    # Rule 1: lag zero anywhere in the window
    if any(e.lag == 0 for e in commits):
        return OK, "lag was zero in the window"
    # Rule 4 (STALL): offsets do not move
    if all(e.committed == commits[0].committed for e in commits):
        return STALL, (f"committed offset stuck at {last.committed:,} for {len(commits)} polls "
                       f"({span:.0f}s) while lag went {commits[0].lag:,} -> {current_lag:,}")
    # Rule 5 (WARN): offsets move, lag never decreases
    if all(b.lag >= a.lag for a, b in zip(commits, commits[1:])):
        return WARN, f"lag never decreased over {len(commits)} polls ({commits[0].lag:,} -> {last.lag:,})"
    return OK, "consuming"


def partition_statuses(events, window: int = 10) -> dict[str, list[PartitionStatus]]:
    """Burrow's status of every partition evaluated at every successful poll."""
    samples = kafka_samples(events)
    hist = partition_history(samples)
    out: dict[str, list[PartitionStatus]] = {}
    for name, entries in hist.items():
        res = []
        commits: deque[Entry] = deque(maxlen=window)
        recent: deque[Entry] = deque(maxlen=window)
        for e in entries:  # only what the rules look at: the last `window` commits and polls
            recent.append(e)
            if e.committed is not None:
                commits.append(e)
            seen = {id(x) for x in recent}
            tail = sorted([x for x in commits if id(x) not in seen] + list(recent), key=lambda x: x.t)
            st, why = evaluate_window(tail, e.t, window)
            res.append(PartitionStatus(name, e.t, st, why))
        out[name] = res
    return out


def group_status(statuses: Iterable[PartitionStatus]) -> int:
    """Worst partition status (Burrow's group status); ERR when any partition is in error."""
    worst = _max((s.status for s in statuses), default=OK)
    return ERR if worst in ERRORS else worst
