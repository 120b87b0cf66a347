"""Run data in columns: ``acked``, ``stored`` and ``sent`` as zstd Parquet, written a part at a time.

The reasoning, sources and measurements behind it: docs/design.md, "monsoon/timeline/columnar.py"."""
from __future__ import annotations

import csv
import ctypes
import importlib
import io
import json
import os
import shutil
import time
from contextlib import contextmanager
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from monsoon.rundir import dataset_dir, legacy_csv
from monsoon.timeline.tail import tail_end

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

# numpy and pyarrow (~0.5 s of CPU to import) are imported in the functions that use them, so that what only
# names this module (``monsoon validate``, through the check registry) does not load them.
_LAZY = {"np": "numpy", "pa": "pyarrow", "pc": "pyarrow.compute", "pcsv": "pyarrow.csv", "pq": "pyarrow.parquet"}

if not TYPE_CHECKING:
    def __getattr__(name: str):
        """``columnar.pq`` (and ``np``, ``pa``, ``pc``, ``pcsv``) as before they were imported lazily: the
        module itself, for whoever patches it (the tests)."""
        if name in _LAZY:
            return importlib.import_module(_LAZY[name])
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

CLOSED = "_closed.json"
PART_GLOB = "part-*.parquet"
MISSING_INT = -(1 << 63)     # np.iinfo(np.int64).min: a NULL (e.g. stored_ms), as the CSV readers call an empty field
FLUSH_S = 30.0            # a run's writers close a part this often: what a kill -9 can lose at most
FLUSH_ROWS = 1 << 18      # ... or this many rows (~30 MB of Python rows buffered), whichever comes first
INT_COLUMNS = ("seq", "intended_ms", "acked_ms", "stored_ms", "last_seq")   # what a run dataset may hold
SHARD_OFFSETS_KEY = "monsoon.shard_offsets"   # a part's footer: {shard file name: bytes of it now in parts}


# A dataset is named by its path, ``<dir>/acked.parquet`` (monsoon.rundir); every function below also takes the
# legacy spelling ``<dir>/acked.csv`` and reads the one CSV file an older run holds in place of the parts.

def parts_dir(path: Path) -> Path:
    """``acked.parquet`` (or ``acked.csv``) -> ``acked.parquet``, the directory of parts: :func:`monsoon.rundir.dataset_dir`."""
    return dataset_dir(path)


def has_parts(path: Path) -> bool:
    """Whether the run holds this dataset as Parquet parts (and not as an older run's CSV)."""
    return not legacy_csv(path).exists() and parts_dir(path).is_dir()


def run_file_exists(path: Path) -> bool:
    """The dataset's parts, or an older run's CSV of it."""
    return legacy_csv(path).exists() or parts_dir(path).is_dir()


class PartWriter:
    """Append rows; every ``flush_s`` seconds (``maybe_flush``) or ``flush_rows`` rows they become one closed
    Parquet file.  ``columns``: the CSV header (``device`` first, then int columns).

    ``background=True`` (the fleets, whose one thread also paces the sends): each ``maybe_flush`` (a fleet calls
    it every second) turns the rows appended since into Arrow arrays, so that cost is spread over the seconds,
    and a part is compressed and written by one writer thread, in order.  Writing a 30 s part of 262,144 rows
    in the caller took 80-280 ms here, a stall of every send due meanwhile (``late`` after 50 ms).  A write's
    error is raised by the next ``maybe_flush`` or ``close``."""

    def __init__(self, dir: Path, columns: tuple[str, ...], flush_s: float = FLUSH_S, flush_rows: int = FLUSH_ROWS,
                 clock=time.monotonic, background: bool = False):
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet  # here, not first in the writer thread while a fleet paces sends
        self.dir = Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.columns = tuple(columns)
        self.flush_s, self.flush_rows, self._clock = flush_s, flush_rows, clock
        self.schema = pa.schema([pa.field(self.columns[0], pa.dictionary(pa.int32(), pa.string()))]
                                + [pa.field(c, pa.int64()) for c in self.columns[1:]])
        self.parts = 1 + max((int(q.name[5:11]) for q in self.dir.glob(PART_GLOB)), default=-1)   # after the last
        self.rows = 0
        self._buf: list[list] = [[] for _ in self.columns]
        self._n = 0                       # rows in the lists
        self._sealed: list[list] = []     # rows already turned into arrays: [device strings, int64 arrays...]
        self._sealed_n = 0
        self._last = clock()
        self._bg = ThreadPoolExecutor(1, thread_name_prefix="parquet-parts") if background else None
        self._writes: list[Future] = []
        if not self.parts:         # part 0 holds no rows, only the schema: a dataset cut off (or left empty)
            self.write_part(np.zeros(0, np.int32), [], *([np.zeros(0, np.int64)] * (len(self.columns) - 1)))

    def append(self, *row) -> None:
        for col, v in zip(self._buf, row):
            col.append(v)
        self._n += 1
        if self._n + self._sealed_n >= self.flush_rows:
            self._cut()

    def maybe_flush(self) -> None:
        if self._bg is not None:
            self._seal()
            self._raise_failed()
        if (self._n or self._sealed_n) and self._clock() - self._last >= self.flush_s:
            self._cut()

    def flush(self) -> None:
        """Everything appended so far becomes a part, written when this returns."""
        self._cut()
        self._wait()

    def _seal(self) -> None:
        import pyarrow as pa
        if not self._n:
            return
        self._sealed.append([pa.array(self._buf[0], type=pa.string())]
                            + [pa.array(c, type=pa.int64()) for c in self._buf[1:]])   # None: a NULL
        self._sealed_n += self._n
        self._buf = [[] for _ in self.columns]
        self._n = 0

    def _cut(self) -> None:
        import pyarrow as pa
        self._seal()
        self._last = self._clock()
        if not self._sealed_n:
            return
        chunks, self._sealed, self._sealed_n = self._sealed, [], 0
        part = self._next_part()

        def write() -> None:
            cols = [pa.concat_arrays([c[k] for c in chunks]) for k in range(len(self.columns))]
            self._write(cols[0].dictionary_encode(), cols[1:], part)

        if self._bg is None:
            write()
        else:
            self._writes.append(self._bg.submit(write))

    def _raise_failed(self) -> None:
        while self._writes and self._writes[0].done():
            self._writes.pop(0).result()

    def _wait(self) -> None:
        while self._writes:
            self._writes.pop(0).result()

    def _next_part(self) -> int:
        self.parts += 1                   # numbered when cut, so parts stay in order whoever writes them
        return self.parts - 1

    def write_part(self, codes: np.ndarray, dictionary: list[str], *cols: np.ndarray) -> None:
        """One part straight from columns: device ``codes`` into ``dictionary`` (no string per row)."""
        import numpy as np
        import pyarrow as pa
        dev = pa.DictionaryArray.from_arrays(pa.array(np.asarray(codes, dtype=np.int32)),
                                             pa.array(dictionary, type=pa.string()))
        self._write(dev, [np.asarray(c, dtype=np.int64) for c in cols], self._next_part())

    def write_table(self, table: pa.Table, shard_offsets: dict[str, int] | None = None) -> None:
        """One part from a table with this writer's columns (:func:`csv_block_table`); nothing for no rows.
        ``shard_offsets``: how far each CSV shard the rows came from is now in parts (:func:`salvage_shards`),
        kept in the part's own footer, so it is durable exactly when the rows are."""
        import pyarrow as pa
        if len(table):
            dev = table.column(0).combine_chunks()
            if not pa.types.is_dictionary(dev.type):
                dev = dev.dictionary_encode()
            self._write(dev, [table.column(c).combine_chunks() for c in self.columns[1:]], self._next_part(),
                        shard_offsets)

    def _write(self, dev, cols: list, part: int, shard_offsets: dict[str, int] | None = None) -> None:
        import numpy as np
        import pyarrow as pa
        import pyarrow.parquet as pq
        schema = self.schema
        if shard_offsets is not None:
            schema = schema.with_metadata({SHARD_OFFSETS_KEY: json.dumps(shard_offsets, sort_keys=True)})
        table = pa.Table.from_arrays([dev] + [pa.array(c) if isinstance(c, np.ndarray) else c for c in cols],
                                     schema=schema)
        final = self.dir / f"part-{part:06d}.parquet"
        tmp = final.with_name(final.name + ".tmp")
        pq.write_table(table, tmp, compression="zstd", row_group_size=max(1, len(table)))
        os.replace(tmp, final)            # a reader sees a whole part or none
        self.rows += len(table)

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self._bg is not None:
                self._bg.shutdown(wait=True)
        (self.dir / CLOSED).write_text(json.dumps({"parts": self.parts, "rows": self.rows}) + "\n")


_FALLOC_PUNCH = 0x01 | 0x02        # FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE (linux/falloc.h)


def release(fd: int, end: int) -> bool:
    """Give the disk blocks of bytes ``[0, end)`` of a file still being appended to back to the file system
    (``fallocate`` punching a hole: the file keeps its size and offsets, those bytes read as zeros).  False
    where the file system cannot (nothing changes then)."""
    global _fallocate
    end -= end % 4096
    if end <= 0:
        return True
    if _fallocate is None:
        libc = ctypes.CDLL(None, use_errno=True)
        _fallocate = libc.fallocate
        _fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
    return _fallocate(fd, _FALLOC_PUNCH, 0, end) == 0


_fallocate: Any = None


def shard_path(path: Path, shard: int | str) -> Path:
    """Where native worker ``shard`` appends its CSV lines of dataset ``path`` (hidden, beside it:
    ``.acked.csv.shard0``)."""
    return legacy_csv(path).with_name(f".{legacy_csv(path).name}.shard{shard}")


def shard_offsets(dir: Path) -> dict[str, int]:
    """How far each shard had been turned into parts, from the newest part that says (footers only)."""
    import pyarrow.parquet as pq
    for p in sorted(Path(dir).glob(PART_GLOB), reverse=True):
        md = pq.read_schema(p).metadata or {}
        if SHARD_OFFSETS_KEY.encode() in md:
            return {k: int(v) for k, v in json.loads(md[SHARD_OFFSETS_KEY.encode()]).items()}
    return {}


def shard_block(path: Path, start: int, limit: int | None = None) -> tuple[bytes, int]:
    """The complete CSV lines of shard ``path`` from byte ``start`` (its header line left out when ``start``
    is 0) and where they end: at most ``limit`` bytes of them (cut after the last whole line within it; the
    rest is for the next call), so that a fast run's 30 s of acks are never one transient of hundreds of MB.
    Bytes a hole was punched in read as zeros: a line with one in it (only a part that never became durable
    can leave that) is not data."""
    _, end = tail_end(path)
    n = max(0, end - start)
    with open(path, "rb") as f:
        f.seek(start)
        block = f.read(n if limit is None else min(n, limit))
    if len(block) < n:                      # cut by the limit: up to its last whole line
        block = block[:block.rfind(b"\n") + 1]
        end = start + len(block)
    if start == 0:
        block = block[block.find(b"\n") + 1:]
    if b"\0" in block:
        nl = block.find(b"\n", block.rfind(b"\0"))
        block = block[nl + 1:] if nl >= 0 else b""
    return block, max(end, start)


def open_by(paths: list[Path]) -> list[int]:
    """PIDs of live processes that hold one of ``paths`` open (``/proc/*/fd``)."""
    want = {str(Path(p).resolve()) for p in paths}
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            if any(os.readlink(fd) in want for fd in (d / "fd").iterdir()):
                pids.append(int(d.name))
        except OSError:
            continue
    return pids


def salvage_shards(path: Path) -> int | None:
    """A native fleet cut off (``kill -9``) leaves the acks its workers wrote since the last part in hidden CSV
    shards beside dataset ``path``: up to :data:`FLUSH_S` seconds.  They become one more part of the dataset
    (from where the newest part's footer says each shard was taken), and the shards are removed; the
    dataset stays unclosed.  Returns the rows recovered (0: no shard, or a dataset closed by its run), or
    None while a live process (a worker still draining) holds a shard open: nothing is touched then."""
    path = Path(path)
    d = parts_dir(path)
    shards = sorted(path.parent.glob(shard_path(path, "*").name))
    if not shards or not d.is_dir() or (d / CLOSED).exists() or not (columns := schema_columns(d)):
        return 0
    if open_by(shards):
        return None
    offsets = shard_offsets(d)
    blocks, ends = [], dict(offsets)
    for sh in shards:
        block, ends[sh.name] = shard_block(sh, offsets.get(sh.name, 0))
        blocks.append(block)
    data = b"".join(blocks)
    rows = 0
    if data:
        table = csv_block_table(data, tuple(columns))
        PartWriter(d, tuple(columns)).write_table(table, shard_offsets=ends)
        rows = len(table)
    for sh in shards:
        sh.unlink()
    return rows


def fresh(path: Path) -> Path:
    """Make room for a new dataset ``path``: the CSV or parts an earlier run left there are removed (a
    reader takes the CSV over the parts, so a stale one would hide the new data).  Returns the parts directory."""
    legacy_csv(path).unlink(missing_ok=True)
    d = parts_dir(path)
    if d.is_dir():
        shutil.rmtree(d)
    return d


def csv_block_table(data: bytes, columns: tuple[str, ...], header: bool = False) -> pa.Table:
    """Complete CSV lines (``device`` first, then int columns; quoted fields allowed) as a table with
    ``columns``, parsed by Arrow (no Python object per row).  ``header``: the block starts with a header line,
    whose names are kept (a column the dataset does not hold is left out, one it lacks is an error)."""
    import pyarrow as pa
    import pyarrow.csv as pcsv
    names = None if header else list(columns)
    read = pcsv.ReadOptions(column_names=names, autogenerate_column_names=False, block_size=1 << 24)
    conv = pcsv.ConvertOptions(column_types={columns[0]: pa.string(), **{c: pa.int64() for c in columns[1:]}},
                               include_columns=list(columns), strings_can_be_null=False)
    return pcsv.read_csv(io.BytesIO(data), read_options=read, convert_options=conv)


class CsvParts:
    """A CSV stream (a header line, then rows, in blocks of any size: Postgres ``COPY ... TO STDOUT``) turned into
    parts as it comes, ``flush_bytes`` of CSV at a time, into ``<dataset>.tmp/``; :meth:`commit` renames it into
    place.  Columns: the header's names that a run dataset holds (``device`` and :data:`INT_COLUMNS`)."""

    def __init__(self, path: Path, flush_bytes: int = 32 << 20):
        self.path = Path(path)
        self.final = parts_dir(self.path)
        self.tmp = self.final.with_name(self.final.name + ".tmp")
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.flush_bytes = flush_bytes
        self._buf = bytearray()
        self._header: bytes | None = None
        self._writer: PartWriter | None = None

    def write(self, block) -> None:
        self._buf += block
        if self._header is None:
            nl = self._buf.find(b"\n")
            if nl < 0:
                return
            self._header = bytes(self._buf[:nl + 1])
            del self._buf[:nl + 1]
            names = [c.strip().strip('"') for c in self._header.decode().strip().split(",")]
            if "device" not in names:
                raise ValueError(f"the rows have no device column (columns: {', '.join(names)})")
            self._writer = PartWriter(self.tmp, ("device", *[c for c in INT_COLUMNS if c in names]),
                                      flush_s=float("inf"))
        if len(self._buf) >= self.flush_bytes:
            self._flush(final=False)

    def _flush(self, final: bool) -> None:
        end = len(self._buf) if final else self._buf.rfind(b"\n") + 1
        if end <= 0 or self._writer is None:
            return
        if self._header is None:            # commit() after bytes that never ended the header line
            raise ValueError("the rows end inside their header line: no whole header, no columns")
        self._writer.write_table(csv_block_table(self._header + bytes(self._buf[:end]), self._writer.columns,
                                                 header=True))
        del self._buf[:end]

    def commit(self) -> int:
        """Write what is left, close the dataset and put it in place of any earlier one; returns the rows."""
        if self._writer is None:            # not even a header: an empty dataset of the minimum columns
            self._writer = PartWriter(self.tmp, ("device", "seq"), flush_s=float("inf"))
        self._flush(final=True)
        self._writer.close()
        fresh(self.path)
        os.replace(self.tmp, self.final)
        return self._writer.rows

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


@contextmanager
def replacing(path: Path, columns: tuple[str, ...], batch: int = FLUSH_ROWS) -> Iterator[PartWriter]:
    """A writer of the dataset ``path`` that builds it beside the old one and renames it into place when the
    block ends (all or nothing: an exception removes what was written, and the old dataset stays)."""
    final = parts_dir(path)
    tmp = final.with_name(final.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        w = PartWriter(tmp, tuple(columns), flush_s=float("inf"), flush_rows=batch)
        yield w
        w.close()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    fresh(path)
    os.replace(tmp, final)


def write_rows(path: Path, columns: tuple[str, ...], rows, batch: int = FLUSH_ROWS) -> int:
    """Rows (tuples in ``columns`` order: ``device`` first, then ints or None) as the dataset ``path``,
    a part per ``batch`` rows, written beside it and renamed into place (all or nothing); returns the rows."""
    with replacing(path, columns, batch) as w:
        for row in rows:
            w.append(str(row[0]), *(None if v is None else int(v) for v in row[1:]))
    return w.rows


def iter_dicts(path: Path) -> Iterator[dict]:
    """Every row of a run dataset as a dict (``device``: str, the other columns: int, or str from a CSV), from
    the CSV or from its parts, whichever the run holds: for tools and tests that want rows, not columns."""
    import pyarrow.parquet as pq
    if not has_parts(path):
        with open(legacy_csv(path), newline="") as fh:
            yield from csv.DictReader(fh)
        return
    for p in sorted(parts_dir(path).glob(PART_GLOB)):
        t = pq.read_table(p)
        cols = [t.column(0).cast("string").to_pylist()] + [t.column(i).to_pylist() for i in range(1, t.num_columns)]
        names = t.schema.names
        for row in zip(*cols):
            yield dict(zip(names, row))


@dataclass(frozen=True)
class DatasetState:
    parts: int
    rows: int
    closed: bool
    pending_bytes: int               # a part being written when the writer died (``.tmp``): not read
    last: dict[str, int]             # the last part's maximum of each int column

    def note(self, name: str) -> str | None:
        """What ``monsoon analyze`` says about a dataset that was cut off (None when it was closed)."""
        if self.closed and not self.pending_bytes:
            return None
        ends = ", ".join(f"{k} <= {v}" for k, v in self.last.items() if k.endswith("_ms")) or "nothing flushed"
        s = (f"{name} was not closed: the run was cut off; its data ends at the last flushed part "
             f"({self.parts} part(s), {self.rows:,} rows; {ends})")
        if self.pending_bytes:
            s += f"; a part being written ({self.pending_bytes:,} bytes) is not counted"
        return s


def dataset_state(dir: Path) -> DatasetState:
    """Parts, rows and where the data ends, from the parts' footers only (no pass over the data)."""
    import pyarrow.parquet as pq
    dir = Path(dir)
    parts = sorted(dir.glob(PART_GLOB))
    rows = 0
    last: dict[str, int] = {}
    for i, p in enumerate(parts):
        md = pq.ParquetFile(p).metadata
        rows += md.num_rows
        if i == len(parts) - 1:
            for rg in range(md.num_row_groups):
                g = md.row_group(rg)
                for c in range(g.num_columns):
                    col = g.column(c)
                    st = col.statistics
                    if st is not None and st.has_min_max and isinstance(st.max, int):
                        last[col.path_in_schema] = max(last.get(col.path_in_schema, st.max), st.max)
    pending = sum(p.stat().st_size for p in dir.glob("part-*.parquet.tmp"))
    return DatasetState(len(parts), rows, (dir / CLOSED).exists(), pending, last)


def read_parts(dir: Path, columns: list[str]) -> Iterator[tuple[pa.DictionaryArray, list[np.ndarray]]]:
    """``(device names (dictionary-encoded), [int64 array per column])`` per row group of every closed part, in part order;
    a column a part lacks is left out of the lists (the caller checks the schema first)."""
    import numpy as np
    import pyarrow.compute as pc
    import pyarrow.parquet as pq
    for p in sorted(Path(dir).glob(PART_GLOB)):
        f = pq.ParquetFile(p, read_dictionary=["device"])
        have = [c for c in columns if c in f.schema_arrow.names]
        for rg in range(f.num_row_groups):
            if not f.metadata.row_group(rg).num_rows:      # part 0: the schema alone
                continue
            t = f.read_row_group(rg, columns=["device", *have])
            dev = t.column("device").combine_chunks()
            yield dev, [pc.fill_null(t.column(c), MISSING_INT).to_numpy().astype(np.int64, copy=False) for c in have]


def schema_columns(dir: Path) -> list[str]:
    """The column names of a dataset (from its first part; empty when it has none)."""
    import pyarrow.parquet as pq
    parts = sorted(Path(dir).glob(PART_GLOB))
    return list(pq.ParquetFile(parts[0]).schema_arrow.names) if parts else []


def export_csv(dir: Path, out: Path) -> int:
    """Write a dataset back as the CSV it stands for (same header); returns the rows written."""
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq
    n = 0
    tmp = Path(out).with_name(Path(out).name + ".tmp")
    with open(tmp, "wb") as fh:
        first = True
        for p in sorted(Path(dir).glob(PART_GLOB)):
            t = pq.read_table(p)
            t = t.set_column(0, t.schema.field(0).name, t.column(0).cast("string"))
            if first:                      # the header as the CSV writers write it (unquoted)
                fh.write((",".join(t.schema.names) + "\n").encode())
                first = False
            pcsv.write_csv(t, fh, write_options=pcsv.WriteOptions(include_header=False, quoting_style="none"))
            n += len(t)
    os.replace(tmp, out)
    return n
