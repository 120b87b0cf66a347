"""Accounting of every (device, seq) over a run's ``sent``, ``acked`` and ``stored`` datasets (Parquet parts,
or an older run's CSV files): lost, duplicated, unexpected, reordered (numpy over int columns; one pass per
dataset). Used by the checks (:mod:`monsoon.checks.base`, :mod:`monsoon.checks.faults`) only.

:func:`account` is four parts, each testable alone: :func:`read` (sent, acked, stored and the drain's read-back
into one key space), :func:`join` (each key's outcome: lost, duplicated, never acked, late), :func:`tally` and
:func:`tally_times` (the counts; reordering and latency), :func:`explain` (the keys a verdict names)."""
from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from monsoon.rundir import ACKED_DATA, SENT_DATA, STORED_AT_DRAIN_DATA, STORED_DATA, legacy_csv, read_sent
from monsoon.timeline.columnar import has_parts, parts_dir, read_parts, run_file_exists, schema_columns
from monsoon.timeline.tail import tail_end

if TYPE_CHECKING:       # numpy is imported in the functions that use it: naming a check must not load it
    import numpy as np


MISSING = -(1 << 63)                  # np.iinfo(np.int64).min: an empty optional field (e.g. stored_ms NULL)


_CHUNK = 2 << 20                      # bytes per parsed chunk (~40k rows): bounds the temporaries


_INT32_MIN = -(1 << 31)               # np.iinfo(np.int32).min
_EMPTY32, _EMPTY64 = (1 << 31) - 1, (1 << 63) - 1    # np.iinfo(np.int32 / int64).max: "no stored copy" in first_ms
_BLOCK = 1 << 22                      # keys per step of the first-copy pass


class _Names:
    """Device name <-> small int code; names are hashed in bulk, decoded once per new name."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.code: dict[str, int] = {}
        self.by_hash: dict[int, tuple[bytes, int]] = {}    # hash -> (name bytes, code)

    def get(self, name: str) -> int:
        c = self.code.get(name)
        if c is None:
            c = self.code[name] = len(self.names)
            self.names.append(name)
        return c


@cache
def _tables() -> tuple[np.ndarray, np.ndarray]:
    """Made once, when first parsing (numpy is not imported before): the powers of P for the name hash (sum of
    64-bit word i * P**(i+1) mod 2**64, odd P; only a fast path, verified row by row), and the powers of ten
    of an int64."""
    import numpy as np
    return np.cumprod(np.full(64, 1099511628211, dtype=np.uint64)), 10 ** np.arange(19, dtype=np.int64)


def _fast_chunk(data: bytes, ncol: int, want: list[int], required: list[bool], names: _Names, dev_col: int):
    """Parse complete ``\\n``-terminated lines of exactly ``ncol`` plain fields; None if that is not so."""
    import numpy as np
    pows, tens = _tables()
    if b'"' in data:
        return None
    buf = np.frombuffer(data + bytes(520), dtype=np.uint8)   # padded: a gather past the end reads zeros
    nl = np.flatnonzero(buf == 10)
    rows = len(nl)
    if rows == 0:
        return None
    commas: np.ndarray = np.flatnonzero(buf == 44)
    k = ncol - 1
    if len(commas) != rows * k:
        return None
    starts = np.empty(rows, dtype=np.int64)
    starts[0] = 0
    starts[1:] = nl[:-1] + 1
    if k:
        commas = commas.reshape(rows, k)
        if (commas[:, 0] < starts).any() or (commas[:, -1] >= nl).any():
            return None
        fs = [starts] + [commas[:, j] + 1 for j in range(k)]
        fe = [commas[:, j] for j in range(k)] + [nl]
    else:
        fs, fe = [starts], [nl]
    # device names -> codes: hash each name's bytes as 64-bit words, then check every row against the
    # name its hash stands for, so a collision cannot merge two devices (it takes the slow path instead)
    s, ln = fs[dev_col], fe[dev_col] - fs[dev_col]
    maxl = int(ln.max())
    if maxl > 512 or int(ln.min()) == 0:
        return None
    w = (maxl + 7) // 8 * 8
    ar = np.arange(w)
    g = buf[s[:, None] + ar]
    g[ar >= ln[:, None]] = 0
    words = g.view(np.uint64)
    h = words @ pows[:w // 8]
    h ^= ln.astype(np.uint64) << np.uint64(56)
    uniq, first, inv = np.unique(h, return_index=True, return_inverse=True)
    inv = inv.reshape(-1)
    if not (words == words[first[inv]]).all():
        return None
    lut = np.empty(len(uniq), dtype=np.int32)
    for i, (hv, fi) in enumerate(zip(uniq.tolist(), first.tolist())):
        raw = data[int(s[fi]):int(s[fi] + ln[fi])]
        known = names.by_hash.get(hv)
        if known is None:
            known = names.by_hash[hv] = (raw, names.get(raw.decode("utf-8", "replace")))
        elif known[0] != raw:
            return None
        lut[i] = known[1]
    codes = lut[inv]
    cols = []
    drop = None
    for j, req in zip(want, required):
        e, ln = fe[j], fe[j] - fs[j]
        if req and int(ln.min()) == 0:       # a row without its seq: skipped, as the slow path does
            drop = (ln == 0) if drop is None else drop | (ln == 0)
        maxl = int(ln.max())
        if maxl > 18:
            return None
        if maxl == 0:
            cols.append(np.full(rows, MISSING, dtype=np.int64))
            continue
        ar = np.arange(maxl)
        # right-aligned digits: column i holds the digit worth 10**(maxl-1-i); absent leading digits are 0
        d = buf[e[:, None] - maxl + ar].astype(np.int64) - 48    # (a negative index is masked below)
        d[ar < maxl - ln[:, None]] = 0
        if ((d < 0) | (d > 9)).any():
            return None
        v = d @ tens[maxl - 1::-1]
        v[ln == 0] = MISSING
        cols.append(v)
    if drop is not None:
        keep = ~drop
        codes, cols = codes[keep], [c[keep] for c in cols]
    return codes, cols


def _int(x: str) -> int:
    x = x.strip()
    if not x:
        return MISSING
    try:
        return int(x)
    except ValueError:
        return int(float(x))


def _slow_chunk(text: str, ncol: int, want: list[int], required: list[bool], names: _Names, dev_col: int):
    """The csv module's way, one row at a time: skips rows that are torn or malformed."""
    import numpy as np
    codes: list[int] = []
    cols: list[list[int]] = [[] for _ in want]
    for row in csv.reader(io.StringIO(text)):
        if len(row) < ncol or not row[dev_col]:
            continue
        try:
            vals = [_int(row[j]) for j in want]
        except (ValueError, OverflowError):
            continue
        if any(r and v == MISSING for r, v in zip(required, vals)):
            continue
        codes.append(names.get(row[dev_col]))
        for c, v in zip(cols, vals):
            c.append(v)
    return np.array(codes, dtype=np.int32), [np.array(c, dtype=np.int64) for c in cols]


def csv_header(path: Path) -> list[str]:
    with open(path, "rb") as fh:
        head = fh.readline().decode("utf-8", "replace").strip("\r\n")
    return next(csv.reader([head]), []) if head else []


def read_columns(path: Path, columns: list[str], optional: tuple[str, ...] = (), names: _Names | None = None
                 ) -> tuple[list[str], Iterator[tuple[np.ndarray, list[np.ndarray]]]]:
    """Stream a CSV with a ``device`` column and integer ``columns`` in chunks of numpy arrays.

    Returns the columns found (``columns`` then the ``optional`` ones the header has) and an iterator of
    ``(device codes, [int64 array per column found])``.  A header that does not name ``device`` and the
    first column is read by position (device, then ``columns``, then ``optional``): a query whose columns
    were not named with ``AS``.
    """
    names = names if names is not None else _Names()
    if has_parts(path):                       # the run holds it as Parquet parts (monsoon.timeline.columnar)
        return _read_parts_columns(parts_dir(path), columns, optional, names)
    path = legacy_csv(path)                   # an older run's CSV (or a query's, named so)
    header = csv_header(path)
    if "device" in header and columns[0] in header:
        idx = {h: i for i, h in enumerate(header)}
    else:
        idx = {n: i for i, n in enumerate(["device", *columns, *optional][:len(header)])}
    present = [c for c in columns if c in idx] + [c for c in optional if c in idx]
    if "device" not in idx or any(c not in idx for c in columns):
        return present, iter(())
    ncol, dev = len(header), idx["device"]
    want = [idx[c] for c in present]
    required = [c in columns for c in present]

    def chunks() -> Iterator[tuple[np.ndarray, list[np.ndarray]]]:
        with open(path, "rb") as fh:
            fh.readline()
            rest = b""
            while True:
                block = fh.read(_CHUNK)
                if not block:
                    break
                data = rest + block
                cut = data.rfind(b"\n")
                if cut < 0:
                    rest = data
                    continue
                rest, data = data[cut + 1:], data[:cut + 1]
                if b"\r" in data:
                    data = data.replace(b"\r", b"")
                out = _fast_chunk(data, ncol, want, required, names, dev)
                if out is None:
                    out = _slow_chunk(data.decode("utf-8", "replace"), ncol, want, required, names, dev)
                yield out
            # a last line without its newline is a row cut off by an interrupted writer (``d7,12`` of
            # ``d7,1234``): not data, whatever it parses as (``monsoon.timeline.tail`` says so out loud)

    return present, chunks()


def _read_parts_columns(dir: Path, columns: list[str], optional: tuple[str, ...], names: _Names
                        ) -> tuple[list[str], Iterator[tuple[np.ndarray, list[np.ndarray]]]]:
    """:func:`read_columns` over a Parquet dataset: device names come dictionary-encoded, so a row group's
    codes are its dictionary's codes (one look-up per name and row group) indexed by its indices."""
    import numpy as np
    have = schema_columns(dir)
    present = [c for c in columns if c in have] + [c for c in optional if c in have]
    if "device" not in have or any(c not in have for c in columns):
        return present, iter(())

    def chunks() -> Iterator[tuple[np.ndarray, list[np.ndarray]]]:
        seen: list = []
        lut = np.zeros(0, dtype=np.int32)
        for dev, cols in read_parts(dir, present):
            d = dev.dictionary.to_pylist()
            if d[:len(seen)] != seen or len(d) != len(seen):      # a new dictionary: map its new names
                if d[:len(seen)] != seen:
                    seen, lut = [], np.zeros(0, dtype=np.int32)
                lut = np.concatenate([lut, np.array([names.get(x) for x in d[len(seen):]], dtype=np.int32)])
                seen = d
            codes = lut[dev.indices.to_numpy(zero_copy_only=False)]
            keep = np.ones(len(codes), dtype=bool)
            for c, col in zip(present, cols):
                if c in columns:
                    keep &= col != MISSING             # a row without a required value is skipped, as in CSV
            if not keep.all():
                codes, cols = codes[keep], [c[keep] for c in cols]
            yield codes, cols

    return present, chunks()


@dataclass
class Accounting:
    """The outcome of every (device, seq); ``None`` where the inputs cannot tell."""

    devices: int = 0
    acked: int = 0                      # distinct acked keys
    stored: int = 0                     # stored rows (copies)
    acked_lost: int = 0
    lost_sample: list[tuple[str, int]] = field(default_factory=list)
    lost_keys: list[tuple[str, int]] | None = None   # every lost (device, seq): account(..., keep_lost=True)
    duplicates: int = 0                 # copies beyond the first
    duplicate_keys: int = 0
    dup_sample: list[tuple[str, int, int]] = field(default_factory=list)   # (device, seq, copies)
    stored_unacked: int = 0             # distinct stored keys never acked (recovered + unexpected)
    stored_late: int | None = None      # distinct keys in the last read-back that the drain's lacked (needs both)
    stored_vanished: int | None = None  # distinct keys in the drain's read-back that the last one lacked
    sent: int | None = None             # messages handed out (sum of last_seq + 1), from the sent dataset
    recovered: int | None = None
    unexpected: int | None = None
    unexpected_devices: int | None = None
    unexpected_sample: list[tuple[str, int]] = field(default_factory=list)
    reordered: int | None = None
    e2e_samples: int = 0
    e2e_ms: dict[str, float] | None = None   # p50, p99, p999, max, min

    def figures(self) -> dict[str, float]:
        f: dict[str, float] = {"acked": self.acked, "acked_lost": self.acked_lost, "duplicates": self.duplicates,
                               "stored": self.stored, "stored_unacked": self.stored_unacked}
        if self.stored_late is not None:
            f["stored_late"] = self.stored_late
        if self.stored_vanished:
            f["stored_vanished"] = self.stored_vanished
        if self.recovered is not None:
            f["recovered"] = self.recovered
        if self.unexpected is not None:
            f["unexpected"] = self.unexpected
        if self.reordered is not None:
            f["reordered"] = self.reordered
        if self.e2e_ms is not None:
            f["e2e_samples"] = self.e2e_samples
            f.update({f"e2e_{k}_ms": v for k, v in self.e2e_ms.items()})
        return f


def _first_copies(first_ms: np.ndarray, s_base: int, intended_of: np.ndarray | None, base: int,
                  acked: np.ndarray, dev_of, ndev: int) -> tuple[int, np.ndarray | None, np.ndarray | None]:
    """``(reordered, e2e latency values, their counts)`` from every key's first stored time (``first_ms``,
    offsets from ``s_base``; the dtype's max where the key has no timed copy), a block of keys at a time.

    Reordered: a first copy stored after a later seq of its device (ties in seq order), i.e. one whose
    stored time is above the minimum over the device's later keys.  That is a suffix minimum, taken from
    the end of the key space over ``device << shift | time``: keys are device-major, so every earlier
    device's values lie below the later ones' and the minimum restarts at each device by itself, without
    a sort or a loop per device.  The same count as sorting each device's first copies by stored time
    and counting the keys below the running maximum."""
    import numpy as np
    empty = np.iinfo(first_ms.dtype).max
    if first_ms.dtype == np.int32:
        lo, shift = _INT32_MIN, 32
    else:
        present = first_ms[first_ms != empty]
        lo, hi = int(present.min()), int(present.max())
        shift = max(1, (hi - lo).bit_length())
        del present
        if shift + max(1, ndev.bit_length()) > 62:
            raise ValueError("stored times span too long to account for (more than 2**62 ms with the devices)")
    carry = np.iinfo(np.int64).max
    reordered = 0
    lats: list[tuple[np.ndarray, np.ndarray]] = []
    n = len(first_ms)
    for b in range(n, 0, -_BLOCK):
        a = max(0, b - _BLOCK)
        fm = first_ms[a:b]
        has = fm != empty
        if not has.any():
            continue
        keys = np.flatnonzero(has) + a
        ms = fm[has].astype(np.int64)
        if intended_of is not None:
            ok = acked[keys]
            if ok.any():
                lat = (ms[ok] + s_base) - (intended_of[keys[ok]].astype(np.int64) + base)
                lats.append(np.unique(lat, return_counts=True))
        v = (dev_of(keys) << np.int64(shift)) | (ms - lo)
        suf = np.minimum.accumulate(v[::-1])[::-1]
        after = np.empty_like(suf)                  # the minimum over the keys after each one
        after[:-1] = suf[1:]
        after[-1] = carry
        np.minimum(after, carry, out=after)
        reordered += int(np.count_nonzero(v > after))
        carry = min(carry, int(suf[0]))
    if not lats:
        return reordered, None, None
    vals = np.concatenate([x for x, _ in lats])
    cnts = np.concatenate([c for _, c in lats])
    lat_v, inv = np.unique(vals, return_inverse=True)
    return reordered, lat_v, np.bincount(inv.reshape(-1), weights=cnts, minlength=len(lat_v)).astype(np.int64)


def _pct_counts(values: np.ndarray, counts: np.ndarray, q: float) -> float:
    """Nearest-rank percentile of a (sorted values, counts) distribution."""
    import numpy as np
    cum = np.cumsum(counts)
    rank = max(1, math.ceil(round(q / 100.0 * int(cum[-1]), 9)))   # round: 99.9 % of 1000 is 999, not 999.0000001
    return float(values[min(len(values) - 1, int(np.searchsorted(cum, rank)))])


def _read_sent(path: Path) -> dict[str, int] | None:
    """The sent dataset (its Parquet parts, or an older run's CSV read as :func:`monsoon.rundir.read_sent` but
    without a last row cut off mid-line: ``d7,12`` of ``d7,1234`` would bound the device far too low).  The file is small (one row per device)."""
    if has_parts(path):
        out: dict[str, int] = {}
        for dev, (last,) in read_parts(parts_dir(path), ["last_seq"]):
            for name, v in zip(dev.to_pylist(), last.tolist()):
                out[name] = v
        return out
    path = legacy_csv(path)
    try:
        size, end = tail_end(path)
    except OSError:
        return read_sent(path)
    if end == size:
        return read_sent(path)
    out = {}
    with open(path, "rb") as fh:
        text = fh.read(end).decode("utf-8", "replace")
    for row in csv.DictReader(io.StringIO(text, newline="")):
        try:
            out[row["device"]] = int(row["last_seq"])
        except (KeyError, TypeError, ValueError):
            continue
    return out


# ------------------------------------------------------------------ read: the datasets into one key space

@dataclass
class Keys:
    """The key space of a run: every device's dense seq range ``0 .. max(last sent, last acked)`` laid end to
    end, so ``key = offset[device] + seq``, and what acked says of each key."""

    names: _Names                       # device name <-> code (stored and the drain's read-back add codes)
    sent: dict[str, int] | None         # each device's last sent seq, None without a sent dataset
    ndev: int                           # devices with a code when the key space was laid (sent or acked)
    bound: np.ndarray                   # last sent seq per device (-1: none), int64[ndev]
    dense: np.ndarray                   # keys per device, int64[ndev]
    offset: np.ndarray                  # first key of each device, int64[ndev + 1]; offset[-1] is the key count
    acked: np.ndarray                   # bool per key: acked
    timed: bool                         # stored has a stored_ms column: intended times are kept
    intended_of: np.ndarray | None = None   # timed: each acked key's intended time, offset from ``base``
    base: int = 0

    @property
    def nkeys(self) -> int:
        return int(self.offset[-1])

    def dev_of(self, keys: np.ndarray) -> np.ndarray:
        """The device code of each dense key (a device with an empty range holds none)."""
        import numpy as np
        return np.searchsorted(self.offset, keys, side="right") - 1


@dataclass
class Copies:
    """What the stored dataset holds of each key: copy counts, first stored times, rows off the key space."""

    rows: int                           # stored rows (copies)
    timed_rows: int                     # ... with a stored time
    count: np.ndarray | None            # copies per key, uint16 (:func:`join` releases it)
    first_ms: np.ndarray | None         # earliest stored time per key, offset from s_base; the dtype's max: none
    s_base: int
    sparse: list[np.ndarray]            # ``code << 40 | seq`` of rows outside their device's dense range
    sparse_bad: int                     # ... whose seq cannot be keyed (negative or huge)


@dataclass
class Reading:
    """Everything :func:`read` takes from a run directory: the key space, the stored copies and the drain's
    read-back (one bool per key, None when the run read storage only once; :func:`join` releases it)."""

    keys: Keys
    copies: Copies
    early: np.ndarray | None


def read_acked(dir: Path, sent: dict[str, int] | None, timed: bool) -> Keys:
    """Lay out the key space from ``sent`` and the acked dataset, and mark each acked key.

    Acked is read twice: first each device's highest seq (and the span of intended times), then each row
    scattered straight into the key space (no per-row columns are held: 12 B per acked row saved).  Rows a
    file still being written added between the two passes are not read.  A key acked twice keeps its last
    intended time, as one scatter would.  ``timed``: keep intended times (4 B per key, 8 when they span more
    than int32 can), else one bool per key."""
    import numpy as np
    names = _Names()
    if sent is not None:
        for name in sent:
            names.get(name)
    bound_of = {names.code[n]: last for n, last in (sent or {}).items()}

    def acked_chunks():
        _, it = read_columns(dir / ACKED_DATA, ["seq", "intended_ms"], (), names)
        for codes, (seq, intended) in it:
            keep = (seq >= 0) & (seq < (1 << 31))  # the fleet's seqs; a garbled row must not size an array
            if not keep.all():
                codes, seq, intended = codes[keep], seq[keep], intended[keep]
            yield codes, seq, intended

    top = np.full(0, -1, dtype=np.int64)               # the highest acked seq per device
    n_acked_rows = 0
    base: int | None = None                            # intended times are kept as offsets from the first
    wide = False                                       # ... int64 when they span more than int32 can
    for codes, seq, intended in acked_chunks():
        if len(codes) == 0:
            continue
        if len(names.names) > len(top):
            top = np.concatenate([top, np.full(len(names.names) - len(top), -1, dtype=np.int64)])
        np.maximum.at(top, codes, seq)
        n_acked_rows += len(codes)
        if timed and not wide:
            if base is None:
                base = int(intended[0])
            off = intended - base
            wide = bool(off.min() <= _INT32_MIN or off.max() > np.iinfo(np.int32).max)
    ndev = len(names.names)
    if len(top) < ndev:
        top = np.concatenate([top, np.full(ndev - len(top), -1, dtype=np.int64)])
    bound = np.full(ndev, -1, dtype=np.int64)
    for c, last in bound_of.items():
        bound[c] = last
    has_bound = np.zeros(ndev, dtype=bool)
    has_bound[list(bound_of)] = True
    in_count = has_bound | (top >= 0)                   # devices with a dense range (sent or acked)
    dense = np.where(in_count, np.maximum(bound + 1, top + 1), 0)
    offset = np.zeros(ndev + 1, dtype=np.int64)
    np.cumsum(dense, out=offset[1:])
    nkeys = int(offset[-1])
    base = base or 0
    intended_of = None
    if timed:
        none = MISSING if wide else _INT32_MIN
        intended_of = np.full(nkeys, none, dtype=np.int64 if wide else np.int32)
    else:
        acked = np.zeros(nkeys, dtype=bool)
    left = n_acked_rows                 # rows a file still being written added since the first pass: not read
    for codes, seq, intended in acked_chunks():
        if left <= 0:
            break
        if len(codes) > left:
            codes, seq, intended = codes[:left], seq[:left], intended[:left]
        left -= len(codes)
        key = offset[codes] + seq
        if intended_of is not None:
            intended_of[key] = intended - base
        else:
            acked[key] = True
    if intended_of is not None:
        acked = intended_of != none
    return Keys(names=names, sent=sent, ndev=ndev, bound=bound, dense=dense, offset=offset, acked=acked,
                timed=timed, intended_of=intended_of, base=base)


def read_stored(dir: Path, keys: Keys) -> Copies:
    """A copy count per key and, when ``keys.timed``, each key's first (earliest) stored time, a chunk at a
    time; rows outside their device's dense range (or of a device acked and sent never named) are kept
    sparse, as ``code << 40 | seq``."""
    import numpy as np
    names, ndev, dense, offset, timed = keys.names, keys.ndev, keys.dense, keys.offset, keys.timed
    nkeys = keys.nkeys
    count = np.zeros(nkeys, dtype=np.uint16)
    first_ms: np.ndarray | None = None      # ms offsets from s_base; the dtype's max where none was stored
    s_base = 0
    sparse: list[np.ndarray] = []
    sparse_bad = 0
    n_stored = n_timed = 0
    _, it = read_columns(dir / STORED_DATA, ["seq"], ("stored_ms",) if timed else (), names)
    for codes, cols in it:
        seq = cols[0]
        n_stored += len(seq)
        n = np.zeros(len(codes), dtype=np.int64)
        known = codes < ndev                 # a device first seen in stored has no dense range
        n[known] = dense[codes[known]]
        inside = (seq >= 0) & (seq < n)
        if not inside.all():
            out, oc = seq[~inside], codes[~inside].astype(np.int64)
            ok = (out >= 0) & (out < (1 << 40))
            sparse_bad += int((~ok).sum())
            sparse.append((oc[ok] << np.int64(40)) | out[ok])
            codes, seq = codes[inside], seq[inside]
            if timed:
                cols = [cols[0][inside], cols[1][inside]]
        if len(seq) == 0:
            continue
        key = offset[codes] + seq
        u, copies = np.unique(key, return_counts=True)     # (np.add.at is slower)
        count[u] += copies.astype(np.uint16)
        if timed:
            ms = cols[1]
            has = ms != MISSING
            if not has.all():
                key, ms = key[has], ms[has]
            if len(key) == 0:
                continue
            n_timed += len(key)
            if first_ms is None:
                s_base = int(ms[0])
                first_ms = np.full(nkeys, _EMPTY32, dtype=np.int32)
            off = ms - s_base
            if first_ms.dtype == np.int32 and (off.min() <= _INT32_MIN or off.max() >= _EMPTY32):
                wider = first_ms.astype(np.int64)
                wider[first_ms == _EMPTY32] = _EMPTY64
                first_ms = wider
            o = np.lexsort((off, key))                 # this chunk's earliest copy of each key ...
            key, off = key[o], off[o]
            f = np.ones(len(key), dtype=bool)
            f[1:] = key[1:] != key[:-1]
            key, off = key[f], off[f]
            first_ms[key] = np.minimum(first_ms[key], off)     # ... against the earliest so far
    return Copies(rows=n_stored, timed_rows=n_timed, count=count, first_ms=first_ms, s_base=s_base,
                  sparse=sparse, sparse_bad=sparse_bad)


def read_drain(dir: Path, keys: Keys) -> np.ndarray | None:
    """The drain's read-back (storage read at the drain's end, before the platform stopped), one bool per
    dense key; None when the run has none (storage was read once).  Rows off the key space tell nothing
    here and are skipped."""
    import numpy as np
    if not run_file_exists(dir / STORED_AT_DRAIN_DATA):
        return None
    early = np.zeros(keys.nkeys, dtype=bool)
    _, it = read_columns(dir / STORED_AT_DRAIN_DATA, ["seq"], (), keys.names)
    for codes, (seq,) in it:
        known = codes < keys.ndev
        codes, seq = codes[known], seq[known]
        inside = (seq >= 0) & (seq < keys.dense[codes])
        early[keys.offset[codes[inside]] + seq[inside]] = True
    return early


def read(dir: Path, sent_file: str = SENT_DATA) -> Reading:
    """Read a saved run: sent (which devices, their last seq), acked into the key space, then stored, then
    the drain's read-back.  Only key-sized arrays and chunk-sized temporaries are held, never a row each."""
    dir = Path(dir)
    stored_cols, _ = read_columns(dir / STORED_DATA, ["seq"], ("stored_ms",))
    keys = read_acked(dir, _read_sent(dir / sent_file), timed="stored_ms" in stored_cols)
    copies = read_stored(dir, keys)
    return Reading(keys, copies, read_drain(dir, keys))


# ------------------------------------------------------------------ join: each key's outcome

@dataclass
class Joined:
    """Each key's outcome, as the sets of keys the verdicts count and name (dense keys, ascending)."""

    lost: np.ndarray                    # acked, in neither read of storage
    dup: np.ndarray                     # stored more than once ...
    dup_copies: np.ndarray              # ... with so many copies
    unacked: np.ndarray                 # stored, never acked
    beyond: np.ndarray | None           # of ``unacked``: past its device's last sent seq (None: no sent)
    stored_late: int | None             # in the last read-back, not the drain's (None: no drain read-back)
    stored_vanished: int | None         # in the drain's read-back, not the last one
    sparse_keys: np.ndarray             # distinct ``code << 40 | seq`` stored outside the key space ...
    sparse_copies: np.ndarray           # ... with so many copies
    sparse_bad: int                     # stored rows whose seq cannot be keyed


def join(reading: Reading) -> Joined:
    """Join acked, stored, the drain's read-back and sent, key by key.

    A key is stored when either read of storage had it (the stored set only grows: a key once read back
    is not lost): lost = acked and not stored; unacked = stored and not acked, and of those, the ones past
    their device's last sent seq were never sent (unexpected), the others recovered.  Stored late: in the
    last read-back only; vanished: in the drain's only.  Keys off the key space are made distinct.

    Releases ``reading.copies.count``, ``reading.early`` and ``reading.copies.sparse`` as soon as they are
    folded in (two bytes and one bool a key, 8 B a row off the key space), so nothing is held twice; a
    reading is joined once."""
    import numpy as np
    keys, copies = reading.keys, reading.copies
    count = copies.count
    if count is None:
        raise RuntimeError("a reading is joined once: an earlier join released its copy counts")
    copies.count = None
    st = count > 0
    late = vanished = None
    if reading.early is not None:
        early = reading.early
        reading.early = None
        late = int(np.count_nonzero(st & ~early))
        vanished = int(np.count_nonzero(early & ~st))
        st |= early
        del early
    lost = np.flatnonzero(keys.acked & ~st)
    dup = np.flatnonzero(count > 1)
    dup_copies = count[dup]
    del count
    unacked = np.flatnonzero(st & ~keys.acked)
    del st
    beyond = None
    if keys.sent is not None:
        d = keys.dev_of(unacked)
        beyond = (unacked - keys.offset[d]) > keys.bound[d]
        del d
    if copies.sparse:
        parts, copies.sparse = copies.sparse, []
        flat = np.concatenate(parts)
        del parts
        sparse_keys, sparse_copies = np.unique(flat, return_counts=True)
        del flat
    else:
        sparse_keys, sparse_copies = np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return Joined(lost=lost, dup=dup, dup_copies=dup_copies, unacked=unacked, beyond=beyond, stored_late=late,
                  stored_vanished=vanished, sparse_keys=sparse_keys, sparse_copies=sparse_copies,
                  sparse_bad=copies.sparse_bad)


# ------------------------------------------------------------------ tally: the counts

def tally(reading: Reading, joined: Joined) -> Accounting:
    """The counts of an :class:`Accounting` from the joined outcomes (its samples and times left empty).

    Keys off the key space were never acked: each is stored unacked, unexpected when sent says it was never
    sent, and its copies beyond the first are duplicates; a row whose seq cannot be keyed counts as one
    stored unacked (unexpected) key.  Without a sent dataset, sent, recovered and unexpected are None."""
    import numpy as np
    keys, j = reading.keys, joined
    acc = Accounting(stored=reading.copies.rows, devices=len(keys.names.names))
    acc.stored_late, acc.stored_vanished = j.stored_late, j.stored_vanished
    acc.acked = int(keys.acked.sum())
    acc.acked_lost = len(j.lost)
    sparse_dup = j.sparse_copies > 1
    acc.duplicate_keys = len(j.dup) + int(sparse_dup.sum())
    acc.duplicates = (int(j.dup_copies.sum()) - len(j.dup)
                      + int(j.sparse_copies[sparse_dup].sum() - sparse_dup.sum()))
    acc.stored_unacked = len(j.unacked) + len(j.sparse_keys) + j.sparse_bad
    if keys.sent is not None and j.beyond is not None:
        dense_unexpected = int(np.count_nonzero(j.beyond))
        acc.sent = sum(max(0, v + 1) for v in keys.sent.values())
        acc.recovered = len(j.unacked) - dense_unexpected
        acc.unexpected = dense_unexpected + len(j.sparse_keys) + j.sparse_bad
        devs = set(np.unique(keys.dev_of(j.unacked[j.beyond])).tolist())
        devs.update(np.unique(j.sparse_keys >> np.int64(40)).tolist())
        acc.unexpected_devices = len(devs)
    return acc


def tally_times(reading: Reading) -> tuple[int | None, int, dict[str, float] | None]:
    """``(reordered, e2e samples, e2e percentiles in ms)`` over each key's first stored copy
    (:func:`_first_copies`): reordered counts first copies stored after a later seq of their device;
    the send->stored latency is a first copy's stored time less its acked intended time.  ``(None, 0, None)``
    when stored has no stored time (a column of NULLs tells nothing)."""
    keys, copies = reading.keys, reading.copies
    if not keys.timed or not copies.timed_rows or copies.first_ms is None:
        return None, 0, None
    reordered, lat_v, lat_c = _first_copies(copies.first_ms, copies.s_base, keys.intended_of, keys.base,
                                            keys.acked, keys.dev_of, keys.ndev)
    if lat_v is None:
        return reordered, 0, None
    assert lat_c is not None     # _first_copies gives the values and their counts together
    return reordered, int(lat_c.sum()), {
        "p50": _pct_counts(lat_v, lat_c, 50), "p99": _pct_counts(lat_v, lat_c, 99),
        "p999": _pct_counts(lat_v, lat_c, 99.9), "max": float(lat_v[-1]), "min": float(lat_v[0])}


# ------------------------------------------------------------------ explain: the keys a verdict names

@dataclass
class Explained:
    """The (device, seq) a verdict quotes, in device-name then seq order."""

    lost_sample: list[tuple[str, int]]
    lost_keys: list[tuple[str, int]] | None           # every lost key (``keep_lost``), else None
    dup_sample: list[tuple[str, int, int]]            # (device, seq, copies)
    unexpected_sample: list[tuple[str, int]]


def explain(reading: Reading, joined: Joined, *, keep_lost: bool = False, limit: int = 5) -> Explained:
    """Name the keys behind the counts: the first ``limit`` lost, duplicated (with their copies) and
    unexpected (device, seq), by device name then seq, and every lost key when ``keep_lost``.  These are
    what ``no_acked_loss``, ``no_duplicates`` and ``no_unexpected`` quote after "e.g.".

    The unexpected sample draws on the first ``limit`` keys within the key space by name and the first
    ``limit`` off it by device code, then keeps the first ``limit`` by name; duplicates off the key space
    are counted (:func:`tally`) but not sampled."""
    import numpy as np
    keys, j = reading.keys, joined
    dev_names = keys.names.names
    rank = np.empty(len(dev_names), dtype=np.int64)      # devices in name order
    rank[sorted(range(len(dev_names)), key=dev_names.__getitem__)] = np.arange(len(dev_names))

    def by_name(ks: np.ndarray, n: int | None) -> tuple[np.ndarray, list[tuple[str, int]]]:
        """(positions in ``ks``, (device, seq)) of dense keys ``ks`` in name then seq order (the first ``n``)."""
        d = keys.dev_of(ks)
        order = np.lexsort((ks, rank[d]))
        if n is not None:
            order = order[:n]
        return order, [(dev_names[int(x)], int(k - keys.offset[x]))
                       for x, k in zip(d[order].tolist(), ks[order].tolist())]

    _, lost = by_name(j.lost, None if keep_lost else limit)
    order, dups = by_name(j.dup, limit)
    dup_s = [(d, s, int(c)) for (d, s), c in zip(dups, j.dup_copies[order].tolist())]
    unexp: list[tuple[str, int]] = []
    if keys.sent is not None:
        if len(j.unacked):
            unexp = by_name(j.unacked[j.beyond], limit)[1]
        unexp.extend((dev_names[int(k >> 40)], int(k & ((1 << 40) - 1))) for k in j.sparse_keys[:limit].tolist())
    return Explained(lost_sample=sorted(lost)[:limit], lost_keys=lost if keep_lost else None,
                     dup_sample=sorted(dup_s)[:limit], unexpected_sample=sorted(unexp)[:limit])


# ------------------------------------------------------------------ the accounting, composed

def account(dir: Path, sent_file: str = SENT_DATA, *, keep_lost: bool = False) -> Accounting:
    """Account for every message of a saved run.  The acked and stored datasets must exist.
    ``keep_lost``: also list every lost (device, seq) in ``lost_keys`` (not only a sample).

    :func:`read` lays every device's dense seq range end to end in one key space, so acked, the stored copy
    counts, first stored times and the drain's read-back are flat numpy arrays (4 B per key for the intended
    time, 2 for the copy count, 4 for the first stored time, 1 for "acked", 1 for the drain's read-back;
    nothing per row); :func:`join` turns them into each key's outcome, :func:`tally` counts, :func:`explain`
    names the keys a verdict quotes, and :func:`tally_times` takes reordering and latency from the first
    copies, once the per-outcome key sets are dropped."""
    reading = read(Path(dir), sent_file)
    joined = join(reading)
    acc = tally(reading, joined)
    named = explain(reading, joined, keep_lost=keep_lost)
    del joined
    acc.lost_sample, acc.lost_keys = named.lost_sample, named.lost_keys
    acc.dup_sample, acc.unexpected_sample = named.dup_sample, named.unexpected_sample
    acc.reordered, acc.e2e_samples, acc.e2e_ms = tally_times(reading)
    return acc
