"""Ack latency on disk as an HdrHistogram interval log, one interval per load second (``latency.hlog``).

The reasoning, sources and measurements behind it: docs/design.md, "monsoon/timeline/hdrlog.py"."""
from __future__ import annotations

import time
from pathlib import Path
from typing import IO, Iterable, Iterator

import numpy as np
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
        self._fh: IO[str] | None = open(self.path, "w")  # closed by close()
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


class LatencyLog:
    """A ``latency.hlog`` decoded once: every interval's non-zero buckets as flat numpy columns.

    ``interval`` (which interval a bucket belongs to), ``index`` (the bucket's index in the fleet's
    :func:`new_histogram` counts array) and ``count``; ``secs`` and ``lengths`` per interval.  Every query
    is then a vectorised count over these columns (``monsoon analyze`` reads the log once and shares it
    between ``error_budget``, ``latency_objective`` and the report): a day of 1 s intervals at ~30 buckets
    each is ~2.6 M entries, ~30 MB.  An interval whose histogram is not the fleet's shape is re-recorded
    into one (HdrHistogram's own ``add``), so the columns always index one bucket layout."""

    def __init__(self, secs: np.ndarray, lengths: np.ndarray, interval: np.ndarray, index: np.ndarray,
                 count: np.ndarray):
        self.secs, self.lengths, self.interval, self.index, self.count = secs, lengths, interval, index, count
        self.decoded = 0          # intervals decoded (a test bounds it: once per interval, whatever is asked)

    @classmethod
    def read(cls, path: Path) -> "LatencyLog":
        template = new_histogram()
        n_buckets = template.counts_len
        secs: list[float] = []
        lengths: list[float] = []
        idx_parts: list[np.ndarray] = []
        cnt_parts: list[np.ndarray] = []
        for sec, length, payload in read_intervals(path):
            try:
                h = HdrHistogram.decode(payload)
            except Exception:   # a corrupt interval is skipped, like a torn line
                continue
            if (h.bucket_count, h.sub_bucket_count, h.unit_magnitude) != \
                    (template.bucket_count, template.sub_bucket_count, template.unit_magnitude):
                same = new_histogram()
                same.add(h)
                h = same
            c = np.ctypeslib.as_array(h.counts)[:min(n_buckets, h.encoder.payload.counts_len)]
            nz = np.flatnonzero(c)
            idx_parts.append(nz.astype(np.int32))
            cnt_parts.append(c[nz].astype(np.int64))
            secs.append(sec)
            lengths.append(length)
        sizes = np.fromiter((len(x) for x in idx_parts), dtype=np.int64, count=len(idx_parts))
        out = cls(np.array(secs, dtype=np.float64), np.array(lengths, dtype=np.float64),
                  np.repeat(np.arange(len(secs), dtype=np.int64), sizes),
                  np.concatenate(idx_parts) if idx_parts else np.zeros(0, dtype=np.int32),
                  np.concatenate(cnt_parts) if cnt_parts else np.zeros(0, dtype=np.int64))
        out.decoded = len(secs)
        return out

    def histogram(self, which: np.ndarray | None = None) -> HdrHistogram:
        """The intervals selected by the boolean mask ``which`` (all: None) summed into one histogram."""
        sel = slice(None) if which is None else which[self.interval]
        return histogram_from_counts(np.bincount(self.index[sel], weights=self.count[sel],
                                                 minlength=_N_BUCKETS).astype(np.int64))

    def phase_histograms(self, phases: Iterable[dict]) -> dict[str, HdrHistogram]:
        """One summed histogram per phase (timeline ``phase`` events: name, start, end), plus ``all``.
        A second belongs to the phase that holds its middle; after the last phase, to the last phase."""
        ph = sorted(((p["name"], float(p["start"]), float(p["end"])) for p in phases), key=lambda p: p[1])
        t0 = ph[0][1] if ph else 0.0
        mid = self.secs + self.lengths / 2.0
        of = np.full(len(mid), -1, dtype=np.int64)          # phase number of every interval (-1: none)
        for k, (_n, a, b) in enumerate(ph):
            of[(of < 0) & (mid >= a - t0) & (mid < b - t0)] = k
        if ph:
            of[(of < 0) & (mid >= ph[-1][2] - t0)] = len(ph) - 1     # the drain after the load
        out = {n: new_histogram() for n, _, _ in ph}
        for k, (n, _a, _b) in enumerate(ph):
            if (of == k).any() and out[n].get_total_count() == 0:
                out[n] = self.histogram(of == k)
            elif (of == k).any():        # two phases of one name: add up
                out[n].add(self.histogram(of == k))
        out["all"] = self.histogram()
        return out

    def good_per_second(self, threshold_ms: float) -> dict[int, int]:
        """Per load second (``sec``), how many acks arrived within ``threshold_ms`` of their intended time
        (a bucket counts when its highest equivalent value is within the threshold, as :func:`count_within`)."""
        good = _HIGHEST[self.index] <= threshold_ms * 1000.0
        per = np.bincount(self.interval[good], weights=self.count[good], minlength=len(self.secs)).astype(np.int64)
        out: dict[int, int] = {}
        for sec, n in zip(np.rint(self.secs).astype(np.int64).tolist(), per.tolist()):
            out[sec] = out.get(sec, 0) + n
        return out


def _bucket_highest() -> np.ndarray:
    """The highest equivalent value (us) of every bucket of the fleet's histogram layout."""
    h = new_histogram()
    return np.array([h.get_highest_equivalent_value(h.get_value_from_index(i)) for i in range(h.counts_len)],
                    dtype=np.float64)


_HIGHEST = _bucket_highest()
_N_BUCKETS = len(_HIGHEST)


def histogram_from_counts(counts: np.ndarray) -> HdrHistogram:
    """A fleet-shaped HdrHistogram holding ``counts`` (one per bucket of :func:`new_histogram`'s layout)."""
    h = new_histogram()
    np.ctypeslib.as_array(h.counts)[:len(counts)] = counts
    nz = np.flatnonzero(counts)
    if len(nz):
        h.set_internal_tacking_values(int(nz[0]), int(nz[-1]), int(counts.sum()))
    return h


def phase_histograms(path: Path, phases: Iterable[dict]) -> dict[str, HdrHistogram]:
    """One summed histogram per phase (timeline ``phase`` events: name, start, end), plus ``all``
    (:meth:`LatencyLog.phase_histograms` of the log read once)."""
    return LatencyLog.read(path).phase_histograms(phases)


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
    return LatencyLog.read(path).good_per_second(threshold_ms)


def percentile_ms(h: HdrHistogram, q: float) -> float:
    """The ``q`` percentile in ms (the bucket's highest equivalent value, as HdrHistogram reports it)."""
    return round(h.get_value_at_percentile(q) / 1000.0, 3)


def max_ms(h: HdrHistogram) -> float:
    return round(h.get_max_value() / 1000.0, 3)
