"""The run timeline: append-only typed events in a JSON-lines file.

The reasoning, sources and measurements behind it: docs/design.md, "monsoon/timeline/store.py"."""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Iterator, Self

from monsoon.timeline.events import META, PHASE, SAMPLE, check
from monsoon.timeline.tail import Tear, secs


class Timeline:
    def __init__(self, path: Path, clock=time.monotonic, wall=time.time):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._clock, self._wall = clock, wall
        self._t0 = clock()
        self._lock = threading.Lock()
        self._fh = open(self.path, "a", buffering=1)

    def now(self) -> float:
        return self._clock() - self._t0

    def add(self, type: str, **fields: Any) -> dict:
        """Write one event; its type and field names must be declared in :mod:`monsoon.timeline.events`
        (:class:`~monsoon.timeline.events.UndeclaredEvent` otherwise, before anything is written)."""
        check(type, fields)
        ev = {"type": type, "t": round(self.now(), 3), "wall": round(self._wall(), 3), **fields}
        line = json.dumps(ev, default=str)
        with self._lock:
            if not self._fh.closed:
                self._fh.write(line + "\n")
        return ev

    def close(self) -> None:
        with self._lock:
            self._fh.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def read_events(path: Path) -> list[dict]:
    """Read a saved timeline's events (what :func:`read_timeline` reads, without saying what was damaged)."""
    return read_timeline(path)[0]


_NOTED_LINES = 5     # bad lines in the middle noted one by one; the rest are counted in one more note


def read_timeline(path: Path) -> tuple[list[dict], list[Tear], int | None]:
    """Read a saved timeline: ``(events, tears, damage_at)``.

    A timeline is written one whole line per event.  When the run was killed mid-write the file ends
    mid-line: the partial last line is left out (the events before it are kept) and a :class:`Tear` says
    ``timeline.jsonl ends mid-line at byte N: the run was cut off at t=T`` (``T``: the last good event's
    ``t``).  A last line that is complete JSON but lacks its newline is kept (JSON cannot be cut into
    valid JSON), and the file still ends mid-line: the writer died there.  A last line that is not JSON
    is the cut too.  A line in the middle that is not JSON (or not an object) is an event missing:
    ``line K is not JSON``.  ``damage_at`` is the index in ``events`` of the first event after the first
    damage (``len(events)`` when only the tail is torn), None for an intact timeline: a check that reads
    the run up to an event at a lower index read all it needed.

    Same events as ever for an intact file, in one pass (a 24 h timeline holds ~500k events)."""
    out: list[dict] = []
    bad: list[tuple[int, int, int, int, str]] = []   # (line, start, end, index in out, why): the first few
    nbad = 0
    last_bad = prev_bad = None                       # the last bad line, and the one before it
    pos = lineno = last_data = 0                     # last_data: the number of the last non-blank line
    terminated = True
    with open(path, "rb") as fh:
        while block := fh.readlines(_BLOCK_BYTES):
            whole = _whole_block(block)
            if whole is not None:          # the common case: every line one event, read in one json.loads
                out.extend(whole)
                lineno += len(block)
                pos += sum(map(len, block))
                last_data, terminated = lineno, True
                continue
            for raw in block:
                lineno += 1
                start, pos = pos, pos + len(raw)
                terminated = raw.endswith(b"\n")
                line = raw.strip()
                if not line:
                    continue
                last_data = lineno
                try:
                    ev = json.loads(line.decode())
                except ValueError:       # JSONDecodeError, or bytes that are not UTF-8 (UnicodeDecodeError)
                    why = "is not JSON"
                else:
                    if isinstance(ev, dict):
                        out.append(ev)
                        continue
                    why = "is not a JSON object"
                nbad += 1
                prev_bad, last_bad = last_bad, (lineno, start, pos, len(out), why)
                if len(bad) <= _NOTED_LINES:
                    bad.append(last_bad)
    size = pos
    name = Path(path).name
    tail = None
    if last_bad is not None and last_bad[0] == last_data:       # the last line is not data: the cut
        tail, last_bad = last_bad, prev_bad
        nbad -= 1
        bad = bad[:nbad]
    elif not terminated and last_data == lineno:                # complete JSON cut before its newline: kept
        tail = (lineno, size, size, len(out), "")
    tears: list[Tear] = []
    for ln, a, b, at, why in bad[:_NOTED_LINES]:
        tears.append(Tear(name, "line", a, a, b, f"{name} line {ln} {why} (bytes {a}-{b}): an event "
                          f"{_between(out, at)} is missing", ln, _t_before(out, at)))
    if nbad > _NOTED_LINES:
        assert last_bad is not None     # nbad > 0: last_bad is the last of the counted bad lines
        ln, a, b, at, _ = bad[_NOTED_LINES]
        tears.append(Tear(name, "line", a, a, b, f"{name}: {nbad - _NOTED_LINES} more line(s), from line {ln} to "
                          f"line {last_bad[0]}, are not JSON events either", ln, _t_before(out, at)))
    if tail is not None:
        ln, a, b, at, why = tail
        t = _t_before(out, len(out))
        when = f"at t={secs(t)}s" if t is not None else "before its first event"
        if terminated and why:       # a whole last line that is not an event
            tears.append(Tear(name, "tail", a, a, b, f"{name} ends with a line that is not JSON (line {ln}, bytes "
                              f"{a}-{b}): the run was cut off {when}", ln, t))
        else:
            tears.append(Tear(name, "tail", size, a, size,
                              f"{name} ends mid-line at byte {size}: the run was cut off {when}", ln, t))
    damage = [bad[0][3]] if bad else []
    if tail is not None:
        damage.append(len(out))
    return out, tears, (min(damage) if damage else None)


_BLOCK_BYTES = 1 << 22   # lines read (and parsed at once) per block


def _whole_block(block: list[bytes]) -> list[dict] | None:
    """Every line of ``block`` parsed as one JSON array (``[line,line,...]``), or None when that is not the
    block's events one per line: a blank, unterminated or damaged line, or a line that is not one object.

    One ``json.loads`` per block instead of one per line: json shares the key strings within a call, so
    a day's timeline (~500k events with the same dozen keys) takes ~40 % less memory and loads faster.
    A block that is not line-for-line events is read again line by line (the tear notes come from there)."""
    if not block[-1].endswith(b"\n"):
        return None
    for raw in block:
        if raw[:1] != b"{" or raw[-2:-1] != b"}":     # a line json.dumps wrote: one object, then "\n"
            return None
    try:
        evs = json.loads(b"[" + b",".join(block) + b"]")
    except ValueError:
        return None
    if len(evs) != len(block) or not all(type(e) is dict for e in evs):
        return None
    return evs


def _t_before(events: list[dict], i: int) -> float | None:
    """``t`` of the last event before index ``i`` that has one."""
    for e in reversed(events[max(0, i - 50):i]):
        t = e.get("t")
        if isinstance(t, (int, float)) and not isinstance(t, bool):
            return float(t)
    return None


def _between(events: list[dict], i: int) -> str:
    a = _t_before(events, i)
    b = next((float(e["t"]) for e in events[i:i + 50]
              if isinstance(e.get("t"), (int, float)) and not isinstance(e.get("t"), bool)), None)
    if a is not None and b is not None:
        return f"between t={secs(a)}s and t={secs(b)}s"
    if a is not None:
        return f"after t={secs(a)}s"
    return f"before t={secs(b)}s" if b is not None else "of an unknown time"


class Events:
    """Query helpers over a loaded list of events (pure; used by checks and report)."""

    def __init__(self, events: list[dict], tears: list[Tear] | None = None, damage_at: int | None = None):
        self.events = events
        self.tears: list[Tear] = list(tears or [])   # what :func:`read_timeline` found damaged (none: intact)
        self.damage_at = damage_at                    # index of the first event after the first damage
        # one pass over the events: a 24 h run holds ~500k, and every check and plot asks for a few series
        self._by_type: dict[str | None, list[dict]] = {}     # None: events without a type
        self._samples: dict[str | None, list[dict]] = {}     # None: samples without a collector
        for e in events:
            self._by_type.setdefault(e.get("type"), []).append(e)
            if e.get("type") == SAMPLE:
                self._samples.setdefault(e.get("collector"), []).append(e)

    @classmethod
    def load(cls, path: Path) -> "Events":
        return cls(*read_timeline(path))

    def intact_until(self, event: dict | None) -> bool:
        """Whether every event up to ``event`` (one of ``self.events``) was read intact: no damage before it.
        For None (an event the timeline does not hold) only when nothing was damaged: it may be what was lost."""
        if event is None:
            return self.damage_at is None
        if self.damage_at is None or self.damage_at >= len(self.events):
            return True      # intact, or only the tail is torn: every event held came before the cut
        return next((i for i, e in enumerate(self.events) if e is event), len(self.events)) < self.damage_at

    def of(self, type: str, **match: Any) -> Iterator[dict]:
        pool = self._samples.get(match.get("collector"), []) if type == SAMPLE and "collector" in match \
            else self._by_type.get(type, [])
        for e in pool:
            if all(e.get(k) == v for k, v in match.items()):
                yield e

    def first(self, type: str, **match: Any) -> dict | None:
        return next(self.of(type, **match), None)

    def meta(self) -> dict:
        return self.first(META) or {}

    def phases(self) -> list[dict]:
        """Phases with absolute timeline times (``start``/``end`` shifted by the load start)."""
        return [e for e in self.of(PHASE)]

    def phase(self, name: str) -> dict | None:
        return next((p for p in self.phases() if p["name"] == name), None)

    def series(self, collector: str, field: str) -> list[tuple[float, float]]:
        """(t, value) for every sample of ``collector`` that has a numeric ``field``."""
        out = []
        for e in self.of(SAMPLE, collector=collector):
            v = e.get(field)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out.append((e["t"], float(v)))
        return out
