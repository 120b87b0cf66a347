"""Storage read-back (``StoredSource``): what the platform stored, exported to ``stored.csv`` after the drain."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Callable, Protocol, runtime_checkable
import psycopg
from psycopg import pq

from monsoon.observe.cassandra_store import CassandraSource


@runtime_checkable
class StoredSource(Protocol):
    """Reads back every stored message of a run into ``stored.csv``, after the drain.

    ``export(path)`` writes a CSV whose header names the columns: ``device``, ``seq`` and, when the
    storage can tell when a row became durable, ``stored_ms`` (epoch milliseconds); one row per stored
    copy (a duplicate is two rows); it returns the number of rows.  Write to a temporary file and rename,
    so a failed export leaves no half file.  The accounting reads nothing else, so another store only
    needs its own source.  A Cassandra source would be::

        class CassandraSource:
            def __init__(self, contact_points, port, cql):   # e.g. "SELECT device, seq,
                ...                                           #  toUnixTimestamp(stored_at) AS stored_ms
                                                              #  FROM monsoon.telemetry"
            def export(self, path):
                session = Cluster(contact_points, port=port).connect()
                rows = session.execute(SimpleStatement(self.cql, fetch_size=20000))   # paged
                return write_stored_csv(path, rows.column_names, rows)

    and ``StorageSpec.kind: cassandra`` would pick it in :data:`SOURCES`.
    """

    def export(self, path: Path) -> int: ...

    def check(self) -> None:
        """Raise ValueError saying what is wrong if the export cannot work (run before the load starts)."""


def write_stored_csv(path: Path, columns: list[str], rows) -> int:
    """Write ``rows`` (iterables in ``columns`` order) to ``path`` via a temporary file; returns the count."""
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    n = 0
    try:
        with open(tmp, "w", newline="") as fh:
            w = csv.writer(fh, lineterminator="\n")
            w.writerow(columns)
            for row in rows:
                w.writerow(row)
                n += 1
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    tmp.replace(path)
    return n


class PostgresSource:
    """``storage.kind: postgres``: streams the stack's ``loss_query`` out of the server with
    ``COPY (query) TO STDOUT (FORMAT csv, HEADER)`` straight into the file, whatever columns it returns (name
    them with ``AS``): the server writes the CSV, Python only moves its blocks (no row is materialised
    here, where a cursor and the csv module built a tuple and a line per row)."""

    def __init__(self, dsn: str, query: str, itersize: int = 20000):
        self.dsn, self.query, self.itersize = dsn, query, itersize

    def export(self, path: Path) -> int:
        path = Path(path)
        tmp = path.with_suffix(path.suffix + ".tmp")
        query = self.query.strip().rstrip(";")
        lines = 0
        try:
            with psycopg.connect(self.dsn, connect_timeout=5) as conn, conn.cursor() as cur, open(tmp, "wb") as fh:
                with cur.copy(f"COPY ({query}) TO STDOUT WITH (FORMAT csv, HEADER true)") as copy:
                    for block in copy:
                        fh.write(block)
                        lines += bytes(block).count(b"\n")
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        tmp.replace(path)
        return max(0, lines - 1)          # (a device name holding a newline would be counted twice)

    def check(self) -> None:
        """Prepare the query (parsed and planned by the server, not run) and read its columns: broken SQL, a
        missing table or a query without ``device`` and ``seq`` columns is found before the load, not after a
        24-hour soak."""
        query = self.query.strip().rstrip(";")
        try:
            with psycopg.connect(self.dsn, connect_timeout=5) as conn:
                res = conn.pgconn.prepare(b"monsoon_check", query.encode())
                if res.status != pq.ExecStatus.COMMAND_OK:
                    raise ValueError(_pg_error(res.error_message))
                desc = conn.pgconn.describe_prepared(b"monsoon_check")
                columns = [desc.fname(i).decode() for i in range(desc.nfields)]
        except psycopg.Error as e:
            raise ValueError(" ".join(str(e).split())) from None
        missing = [c for c in ("device", "seq") if c not in columns]
        if missing:
            raise ValueError(f"returns the columns {', '.join(columns) or 'none'}: it needs {' and '.join(missing)} "
                             "(name them with AS)")


def _pg_error(message: bytes) -> str:
    """Postgres's first line, without its ``ERROR:`` prefix: ``syntax error at or near "SELEC"``."""
    first = message.decode(errors="replace").strip().splitlines()[0] if message else "the query was refused"
    return first.split(":", 1)[1].strip() if first.startswith(("ERROR:", "FATAL:")) else first


SOURCES: dict[str, Callable[..., StoredSource]] = {
    "postgres": lambda storage, endpoint: PostgresSource(endpoint(storage.dsn), storage.loss_query),
    "cassandra": lambda storage, endpoint: _cassandra_source(storage, endpoint),
}


def _cassandra_source(storage, endpoint: Callable[[str], str]) -> StoredSource:
    return CassandraSource([endpoint(p) for p in storage.contact_points], storage.keyspace, storage.cql,
                           write=write_stored_csv, fetch_size=storage.fetch_size,
                           names_dsn=endpoint(storage.dsn) if storage.dsn else None, names_query=storage.names_query)


def stored_source(storage, endpoint: Callable[[str], str] = lambda s: s) -> StoredSource:
    """The :class:`StoredSource` for a stack's ``storage`` spec (``endpoint`` resolves ``{port:..}``)."""
    try:
        make = SOURCES[storage.kind]
    except KeyError:
        raise ValueError(f"no stored-message source for storage kind {storage.kind!r} "
                         f"(known: {', '.join(sorted(SOURCES))})") from None
    return make(storage, endpoint)
