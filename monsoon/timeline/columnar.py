"""Run data in columns: ``acked``, ``stored`` and ``sent`` as zstd Parquet, written a part at a time.

Why Parquet through pyarrow (not DuckDB's own file): a run directory must stay readable by anything
(pandas, Polars, DuckDB, Spark, ``pyarrow.dataset`` all read a directory of Parquet files), and a
run killed with ``kill -9`` must keep what it wrote.  A Parquet file is only readable once its footer is
written, so one file per flush is the unit of durability: a :class:`PartWriter` buffers rows and every
``flush_s`` seconds (or ``flush_rows`` rows) writes them as one row group to ``part-NNNNNN.parquet.tmp``,
then renames it into place.  Bounded memory (one flush's rows), and a run cut off mid-way keeps every part
renamed before the cut; a ``.tmp`` left behind is the part being written, never read.  ``close()`` writes
``_closed.json`` (parts, rows): a dataset without it was cut off, and :func:`dataset_state` says where
its data ends.  DuckDB measured no compute gain over numpy here, and its single-file database is
neither appendable by several processes nor readable after a crash mid-checkpoint without its WAL.

Layout: ``acked.parquet/`` beside where ``acked.csv`` would be (``stored.parquet/``, ``sent.parquet/``),
columns ``device`` (string, dictionary-encoded) and int64 ``seq``, ``intended_ms``, ``acked_ms`` /
``stored_ms`` / ``last_seq``, the same names as the CSV headers.  Readers take whichever the run has
(:func:`parts_dir`): old CSV run directories stay readable, and ``monsoon export RUN --csv`` writes the
CSVs back for people who want them.  zstd Parquet costs ~3 B per acked message where CSV costs ~60.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import pyarrow.parquet as pq

PARTS_SUFFIX = ".parquet"
CLOSED = "_closed.json"
PART_GLOB = "part-*.parquet"
MISSING_INT = np.iinfo(np.int64).min     # a NULL (e.g. stored_ms), as the CSV readers call an empty field


def parts_dir(csv_path: Path) -> Path:
    """``acked.csv`` -> ``acked.parquet`` (a directory of parts)."""
    csv_path = Path(csv_path)
    return csv_path.with_name(csv_path.stem + PARTS_SUFFIX)


def has_parts(csv_path: Path) -> bool:
    """Whether the run holds this file as Parquet parts (and not as the CSV itself)."""
    return not Path(csv_path).exists() and parts_dir(csv_path).is_dir()


def run_file_exists(csv_path: Path) -> bool:
    """The CSV, or its Parquet parts."""
    return Path(csv_path).exists() or parts_dir(csv_path).is_dir()


class PartWriter:
    """Append rows; every ``flush_s`` seconds (``maybe_flush``) or ``flush_rows`` rows they become one closed
    Parquet file.  ``columns``: the CSV header (``device`` first, then int columns)."""

    def __init__(self, dir: Path, columns: tuple[str, ...], flush_s: float = 60.0, flush_rows: int = 1 << 20,
                 clock=time.monotonic):
        self.dir = Path(dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.columns = tuple(columns)
        self.flush_s, self.flush_rows, self._clock = flush_s, flush_rows, clock
        self.schema = pa.schema([pa.field(self.columns[0], pa.dictionary(pa.int32(), pa.string()))]
                                + [pa.field(c, pa.int64()) for c in self.columns[1:]])
        self.parts = len(list(self.dir.glob(PART_GLOB)))
        self.rows = 0
        self._buf: list[list] = [[] for _ in self.columns]
        self._n = 0
        self._last = clock()

    def append(self, *row) -> None:
        for col, v in zip(self._buf, row):
            col.append(v)
        self._n += 1
        if self._n >= self.flush_rows:
            self.flush()

    def append_csv(self, text: str) -> None:
        """Complete ``\\n``-terminated CSV lines of plain fields (what the fleets buffer each second)."""
        for line in text.splitlines():
            parts = line.split(",")
            if len(parts) != len(self.columns):
                continue
            try:
                self.append(parts[0], *(int(x) for x in parts[1:]))
            except ValueError:
                continue

    def maybe_flush(self) -> None:
        if self._n and self._clock() - self._last >= self.flush_s:
            self.flush()

    def flush(self) -> None:
        self._last = self._clock()
        if not self._n:
            return
        dev = pa.array(self._buf[0], type=pa.string()).dictionary_encode()
        self._write(dev, [np.asarray(c, dtype=np.int64) for c in self._buf[1:]])
        self._buf = [[] for _ in self.columns]
        self._n = 0

    def write_part(self, codes: np.ndarray, dictionary: list[str], *cols: np.ndarray) -> None:
        """One part straight from columns: device ``codes`` into ``dictionary`` (no string per row)."""
        dev = pa.DictionaryArray.from_arrays(pa.array(np.asarray(codes, dtype=np.int32)),
                                             pa.array(dictionary, type=pa.string()))
        self._write(dev, [np.asarray(c, dtype=np.int64) for c in cols])

    def _write(self, dev, cols: list[np.ndarray]) -> None:
        table = pa.Table.from_arrays([dev] + [pa.array(c) for c in cols], schema=self.schema)
        final = self.dir / f"part-{self.parts:06d}.parquet"
        tmp = final.with_name(final.name + ".tmp")
        pq.write_table(table, tmp, compression="zstd", row_group_size=max(1, len(table)))
        os.replace(tmp, final)            # a reader sees a whole part or none
        self.parts += 1
        self.rows += len(table)

    def close(self) -> None:
        self.flush()
        (self.dir / CLOSED).write_text(json.dumps({"parts": self.parts, "rows": self.rows}) + "\n")


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


def read_parts(dir: Path, columns: list[str]) -> Iterator[tuple[list[str], list[np.ndarray]]]:
    """``(device names, [int64 array per column])`` per row group of every closed part, in part order;
    a column a part lacks is left out of the lists (the caller checks the schema first)."""
    for p in sorted(Path(dir).glob(PART_GLOB)):
        f = pq.ParquetFile(p, read_dictionary=["device"])
        have = [c for c in columns if c in f.schema_arrow.names]
        for rg in range(f.num_row_groups):
            t = f.read_row_group(rg, columns=["device", *have])
            dev = t.column("device").combine_chunks()
            yield dev, [pc.fill_null(t.column(c), MISSING_INT).to_numpy().astype(np.int64, copy=False) for c in have]


def schema_columns(dir: Path) -> list[str]:
    """The column names of a dataset (from its first part; empty when it has none)."""
    parts = sorted(Path(dir).glob(PART_GLOB))
    return list(pq.ParquetFile(parts[0]).schema_arrow.names) if parts else []


def export_csv(dir: Path, out: Path) -> int:
    """Write a dataset back as the CSV it stands for (same header); returns the rows written."""
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
