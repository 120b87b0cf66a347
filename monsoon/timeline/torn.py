"""A saved run's torn files, said out loud: what ``monsoon analyze``, the report and the checks read.

A run killed mid-write leaves files that end mid-line.  Each reader leaves the cut-off line out (the
timeline: :func:`monsoon.timeline.store.read_timeline`, which also notes a line in the middle that is not
JSON; the datasets: :mod:`monsoon.checks.accounting`; the latency log: :mod:`monsoon.timeline.hdrlog`), and
:func:`run_tears` lists what was cut, one :class:`~monsoon.timeline.tail.Tear` per damage with its
sentence (``note``), e.g. ``timeline.jsonl ends mid-line at byte 48213: the run was cut off at t=131.4s``
or ``acked.csv ends mid-line at byte 9012: the partial row from byte 8990 (22 bytes) is not counted``.

Cheap: the timeline's damage is found while it is parsed (it is anyway), every other file's by reading
its last bytes (:func:`monsoon.timeline.tail.tail_end`), never a pass over it.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from monsoon.rundir import ACKED_DATA, LATENCY_FILE, SENT_DATA, STORED_DATA, TIMELINE_FILE, legacy_csv
from monsoon.timeline.store import Events
from monsoon.timeline.columnar import dataset_state, has_parts, parts_dir
from monsoon.timeline.tail import Tear, line_file_tear

# the datasets (Parquet parts, or an older run's CSV) and the line files besides the timeline, with what a line
# (or row) of each is called
DATASET_FILES = ((ACKED_DATA, "row"), (STORED_DATA, "row"), (SENT_DATA, "row"))
LINE_FILES = ((LATENCY_FILE, "interval"),)


def run_tears(run_dir: Path, events: Events | None = None) -> list[Tear]:
    """Every torn spot of an experiment's run directory: the timeline's first (``events``, when already
    loaded with :meth:`Events.load`; else it is read), then the ``acked``, ``stored`` and ``sent``
    datasets and ``latency.hlog``.  Empty for an intact run; missing files are not torn."""
    run_dir = Path(run_dir)
    if events is None and (run_dir / TIMELINE_FILE).exists():
        events = Events.load(run_dir / TIMELINE_FILE)
    out = list(events.tears) if events is not None else []
    for name, what in DATASET_FILES:          # a tear is named by the dataset: the checks' rules are per dataset
        if has_parts(run_dir / name):        # Parquet parts: cut off when never closed (no pass over the data)
            d = parts_dir(run_dir / name)
            note = dataset_state(d).note(d.name)
            if note is not None:
                out.append(Tear(name, "tail", 0, 0, 0, note))
            continue
        t = line_file_tear(legacy_csv(run_dir / name), what)     # an older run's CSV, torn mid-line
        if t is not None:
            out.append(replace(t, file=name))
    for name, what in LINE_FILES:
        t = line_file_tear(run_dir / name, what)
        if t is not None:
            out.append(t)
    return out


def torn_notes(run_dir: Path, events: Events | None = None) -> list[str]:
    """The sentences of :func:`run_tears`: what ``monsoon analyze`` prints and puts under ``"torn"``."""
    return [t.note for t in run_tears(run_dir, events)]
