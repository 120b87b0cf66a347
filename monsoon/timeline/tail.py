"""Where a line file of a run ends: a torn tail (a writer killed mid-line) found from the file's end.

Every line file of a run directory is written a line at a time (``timeline.jsonl``, ``latency.hlog``, and
an older run's ``acked.csv``, ``stored.csv`` and ``sent.csv``), each line ending with ``\\n``.  A run killed mid-write
leaves a file that ends mid-line: its last line is a fragment (``d7,12`` of ``d7,1234,...``), which a
reader must not take for data.  :func:`tail_end` finds that out from the end of the file alone (a seek
and one chunk read, however large the file: a 24 h soak's acked CSV held ~35M rows), and
:class:`Tear` says so in a sentence (``note``) for ``monsoon analyze``, the report and the checks.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

TAIL_CHUNK = 1 << 16       # bytes read per step backwards from the end, looking for the last newline


@dataclass(frozen=True)
class Tear:
    """A damaged spot of a run file: its ``tail`` (the file ends mid-line) or a ``line`` that is not data.

    ``byte`` is where the file ends for a tail (its size), where the bad line starts for a line; ``start``
    and ``end`` are the bad line's bytes ``[start, end)`` (for a tail, ``start`` is where the cut-off
    line begins: what comes before it is kept); ``line`` its 1-based number when known (the timeline's,
    found while parsing it; not counted for a CSV, which would take a pass over it); ``t`` the timeline
    time of the last good event before it (timeline only)."""

    file: str
    kind: str                  # "tail" or "line"
    byte: int
    start: int
    end: int
    note: str
    line: int | None = None
    t: float | None = None


def secs(t: float) -> str:
    """A timeline time the way the timeline writes it (ms precision, no trailing zeros)."""
    return f"{t:.3f}".rstrip("0").rstrip(".")


def tail_end(path: Path) -> tuple[int, int]:
    """``(size, end)``: the file's size and where its last complete line ends (just after its ``\\n``).
    ``end == size`` for a file that ends with a newline (or is empty); ``end < size`` for a torn tail,
    whose fragment is bytes ``[end, size)``; ``end == 0`` when not even the first line is complete.

    Reads from the end only: one chunk, more only while the fragment is longer than a chunk."""
    with open(path, "rb") as fh:
        size = fh.seek(0, os.SEEK_END)
        if size == 0:
            return 0, 0
        fh.seek(size - 1)
        if fh.read(1) == b"\n":
            return size, size
        pos = size
        while pos > 0:
            step = min(TAIL_CHUNK, pos)
            pos -= step
            fh.seek(pos)
            cut = fh.read(step).rfind(b"\n")
            if cut >= 0:
                return size, pos + cut + 1
        return size, 0


def line_file_tear(path: Path, what: str = "row") -> Tear | None:
    """The torn tail of a line file (CSV, interval log), or None when it ends with a newline (or is missing).
    A torn last line is never data: its readers leave it out (``what``: how the note calls a line)."""
    path = Path(path)
    try:
        size, end = tail_end(path)
    except OSError:
        return None
    if end == size:
        return None
    if end == 0:
        note = f"{path.name} ends mid-line at byte {size}, inside its first line: nothing in it can be read"
    else:
        note = (f"{path.name} ends mid-line at byte {size}: the partial {what} from byte {end} "
                f"({size - end} bytes) is not counted")
    return Tear(path.name, "tail", size, end, size, note)
