"""Ack latency on disk as an HdrHistogram interval log, one interval per load second (``latency.hlog``).

The fleet records every PUBACK latency (microseconds from the message's *intended* send time, so no
coordinated omission) into one HdrHistogram per second.  At the end of each second that saw acks it
appends one line, so the hot path gains nothing per message (one ``encode()``, ~0.1 ms, per second)::

    #[monsoon ack latency: us from the intended send time to the PUBACK, one interval per load second]
    #[StartTime: 1700000000.000 (seconds since epoch)]
    "StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"
    12.000,1.000,83.455,HISTFAAAA...

``StartTimestamp`` is the fleet's second index (seconds since the load started, the ``sec`` of the
timeline's ``load`` events), ``Interval_Max`` is in ms and the payload is ``HdrHistogram.encode()``
(base64 of the compressed V2 encoding): the jHiccup / HdrHistogram log format, so HdrHistogram's own
tools (HistogramLogAnalyzer, ``hdrh.log.HistogramLogReader``) read it too.

Checks add the intervals up per phase (:func:`phase_histograms`).  A second belongs to the phase that
holds its middle (phases are taken relative to the first phase's start, which is the load start);
seconds after the last phase (the fleet waiting for the last PUBACKs) belong to the last phase.  An
ack is attributed to the second it *arrived* in, whereas ``acked.csv`` knows each message's intended
time: around a phase boundary the two can differ by the latency itself.  A 24 h run at 400 msg/s
writes ~35 MB; summing it back costs ~0.15 ms per second of load.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import IO, Iterable, Iterator

from hdrh.histogram import HdrHistogram

HIST_MAX_US = 3_600_000_000      # 1 h: what the fleet's histograms can hold
HIST_DIGITS = 2                  # significant digits: values are exact to within 1/128 (< 0.8 %)


def new_histogram() -> HdrHistogram:
    """The fleet's latency histogram: 1 us .. 1 h, 2 significant digits."""
    return HdrHistogram(1, HIST_MAX_US, HIST_DIGITS)


class IntervalLogWriter:
    """Appends one interval line per second; the caller owns the clock (no thread, no timer)."""

    def __init__(self, path: Path, start_wall_s: float | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh: IO[str] | None = open(self.path, "w")  # noqa: SIM115 - closed by close()
        start = time.time() if start_wall_s is None else start_wall_s
        self._fh.write("#[monsoon ack latency: us from the intended send time to the PUBACK, "
                       "one interval per load second]\n")
        self._fh.write(f"#[StartTime: {start:.3f} (seconds since epoch)]\n")
        self._fh.write('"StartTimestamp","Interval_Length","Interval_Max","Interval_Compressed_Histogram"\n')
        self._fh.flush()

    def write(self, sec: float, hist: HdrHistogram, length: float = 1.0) -> None:
        """One interval (skipped when the histogram is empty)."""
        if self._fh is None or hist.get_total_count() == 0:
            return
        self._fh.write(f"{sec:.3f},{length:.3f},{hist.get_max_value() / 1000.0:.3f},"
                       f"{hist.encode().decode('ascii')}\n")
        self._fh.flush()   # once a second: an interrupted run keeps what it measured

    def flush(self) -> None:
        if self._fh is not None:
            self._fh.flush()

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def read_intervals(path: Path) -> Iterator[tuple[float, float, str]]:
    """(start second, length, encoded histogram) of every interval; a torn or foreign line is skipped (a last
    line without its newline too: the fleet was cut off writing it, ``monsoon.timeline.tail``)."""
    with open(path) as fh:
        for line in fh:
            if not line or line[0] in "#\"" or not line.endswith("\n"):
                continue
            parts = line.rstrip("\n").split(",")
            if len(parts) == 5 and parts[0].startswith("Tag="):
                parts = parts[1:]
            if len(parts) != 4 or not parts[3].startswith("HIST"):
                continue
            try:
                yield float(parts[0]), float(parts[1]), parts[3]
            except ValueError:
                continue


def phase_histograms(path: Path, phases: Iterable[dict]) -> dict[str, HdrHistogram]:
    """One summed histogram per phase (timeline ``phase`` events: name, start, end), plus ``all``."""
    ph = sorted(((p["name"], float(p["start"]), float(p["end"])) for p in phases), key=lambda p: p[1])
    t0 = ph[0][1] if ph else 0.0
    rel = [(n, a - t0, b - t0) for n, a, b in ph]
    out = {n: new_histogram() for n, _, _ in rel}
    out["all"] = new_histogram()
    for sec, length, payload in read_intervals(path):
        try:
            h = HdrHistogram.decode(payload)
        except Exception:   # noqa: BLE001 - a corrupt interval is skipped, like a torn line
            continue
        out["all"].add(h)
        mid = sec + length / 2.0
        name = next((n for n, a, b in rel if a <= mid < b), None)
        if name is None and rel and mid >= rel[-1][2]:
            name = rel[-1][0]          # the drain after the load: the last phase's own messages
        if name is not None:
            out[name].add(h)
    return out


def count_within(h: HdrHistogram, threshold_us: float) -> int:
    """How many recorded values are <= ``threshold_us``; a bucket counts only when its highest equivalent
    value is within the threshold (so a value may be called slow by up to the bucket width, < 0.8 %)."""
    n = 0
    for it in h.get_recorded_iterator():
        if it.value_iterated_to > threshold_us:
            break
        n += it.count_at_value_iterated_to
    return n


def good_per_second(path: Path, threshold_ms: float) -> dict[int, int]:
    """Per load second (``sec``), how many acks arrived within ``threshold_ms`` of their intended time."""
    out: dict[int, int] = {}
    for sec, _length, payload in read_intervals(path):
        try:
            h = HdrHistogram.decode(payload)
        except Exception:   # noqa: BLE001 - a corrupt interval is skipped, like a torn line
            continue
        out[int(round(sec))] = out.get(int(round(sec)), 0) + count_within(h, threshold_ms * 1000.0)
    return out


def percentile_ms(h: HdrHistogram, q: float) -> float:
    """The ``q`` percentile in ms (the bucket's highest equivalent value, as HdrHistogram reports it)."""
    return round(h.get_value_at_percentile(q) / 1000.0, 3)


def max_ms(h: HdrHistogram) -> float:
    return round(h.get_max_value() / 1000.0, 3)
