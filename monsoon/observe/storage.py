"""Storage read-back (``StoredSource``): what the platform stored, read back after the drain into the run's
``stored`` dataset (Parquet parts in ``stored.parquet/``, :mod:`monsoon.timeline.columnar`)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Protocol, runtime_checkable
import psycopg
from psycopg import pq

from monsoon.observe.cassandra_store import CassandraSource
from monsoon.observe.kafka_store import KafkaSource
from monsoon.spec.stack import TEMPLATE_RE
from monsoon.timeline.columnar import INT_COLUMNS, CsvParts, write_rows

_PG_INTEGERS = (20, 21, 23)      # int8, int2, int4: what the read-back's int64 columns take


@runtime_checkable
class StoredSource(Protocol):
    """Reads back every stored message of a run into its ``stored`` dataset, after the drain.

    ``export(path)`` (``path``: ``<run>/stored.parquet``, :data:`monsoon.rundir.STORED_DATA`) writes the dataset of that path: the
    columns ``device``, ``seq`` and, when the storage can tell when a row became durable, ``stored_ms``
    (epoch milliseconds); one row per stored copy (a duplicate is two rows); it returns the number of rows.
    :func:`write_stored` and :class:`~monsoon.timeline.columnar.CsvParts` write beside it and rename, so a
    failed export leaves no half dataset.  The accounting reads nothing else, so another store only needs
    its own source.  A Cassandra source would be::

        class CassandraSource:
            def __init__(self, contact_points, port, cql):   # e.g. "SELECT device, seq,
                ...                                           #  toUnixTimestamp(stored_at) AS stored_ms
                                                              #  FROM monsoon.telemetry"
            def export(self, path):
                session = Cluster(contact_points, port=port).connect()
                rows = session.execute(SimpleStatement(self.cql, fetch_size=20000))   # paged
                return write_stored(path, rows.column_names, rows)

    and ``StorageSpec.kind: cassandra`` would pick it in :data:`SOURCES`.
    """

    def export(self, path: Path) -> int: ...

    def check(self) -> None:
        """Raise ValueError saying what is wrong if the export cannot work (run before the load starts)."""


def write_stored(path: Path, columns: list[str], rows) -> int:
    """``rows`` (iterables in ``columns`` order) as the stored dataset of ``path``, all or nothing; the count."""
    return write_rows(path, tuple(columns), rows)


class PostgresSource:
    """``storage.kind: postgres``: streams the stack's ``loss_query`` out of the server with
    ``COPY (query) TO STDOUT (FORMAT csv, HEADER)``, whatever columns it returns (name them with ``AS``): the
    server writes the CSV, Arrow parses it 32 MB at a time into Parquet parts (:class:`CsvParts`); no row is
    materialised in Python."""

    def __init__(self, dsn: str, query: str, itersize: int = 20000):
        self.dsn, self.query, self.itersize = dsn, query, itersize

    def export(self, path: Path) -> int:
        query = self.query.strip().rstrip(";")
        out = CsvParts(path)
        try:
            with psycopg.connect(self.dsn, connect_timeout=5) as conn, conn.cursor() as cur:
                with cur.copy(f"COPY ({query}) TO STDOUT WITH (FORMAT csv, HEADER true)") as copy:
                    for block in copy:
                        out.write(block)
            return out.commit()
        except BaseException:
            out.abort()
            raise

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
                columns = [(desc.fname(i) or b"").decode() for i in range(desc.nfields)]
                types = {c: desc.ftype(i) for i, c in enumerate(columns)}
                not_int = {c: types[c] for c in INT_COLUMNS if c in types and types[c] not in _PG_INTEGERS}
                names: dict[int, str] = dict(conn.execute("SELECT oid::int, format_type(oid, NULL) FROM pg_type WHERE oid = ANY(%s)",
                                          [list(not_int.values())]).fetchall()) if not_int else {}
        except psycopg.Error as e:
            raise ValueError(" ".join(str(e).split())) from None
        missing = [c for c in ("device", "seq") if c not in columns]
        if missing:
            raise ValueError(f"returns the columns {', '.join(columns) or 'none'}: it needs {' and '.join(missing)} "
                             "(name them with AS)")
        for c, oid in not_int.items():       # the read-back parses them as int64: found now, not after the load
            raise ValueError(f"{c} is {names.get(oid, f'type oid {oid}')}, not an integer: cast it in the query "
                             f"(e.g. ...::bigint AS {c})")


def _pg_error(message: bytes) -> str:
    """Postgres's first line, without its ``ERROR:`` prefix: ``syntax error at or near "SELEC"``."""
    first = message.decode(errors="replace").strip().splitlines()[0] if message else "the query was refused"
    return first.split(":", 1)[1].strip() if first.startswith(("ERROR:", "FATAL:")) else first


SOURCES: dict[str, Callable[..., StoredSource]] = {
    "postgres": lambda storage, endpoint: PostgresSource(endpoint(storage.dsn), storage.loss_query),
    "cassandra": lambda storage, endpoint: _cassandra_source(storage, endpoint),
    "kafka": lambda storage, endpoint: KafkaSource(",".join(endpoint(p) for p in storage.contact_points),
                                                   storage.topics),
}


def _cassandra_source(storage, endpoint: Callable[[str], str]) -> StoredSource:
    return CassandraSource([endpoint(p) for p in storage.contact_points], storage.keyspace, storage.cql,
                           write=write_stored, fetch_size=storage.fetch_size,
                           names_dsn=endpoint(storage.dsn) if storage.dsn else None, names_query=storage.names_query)


def stored_source(storage, endpoint: Callable[[str], str] = lambda s: s) -> StoredSource:
    """The :class:`StoredSource` for a stack's ``storage`` spec (``endpoint`` resolves ``{port:..}``)."""
    try:
        make = SOURCES[storage.kind]
    except KeyError:
        raise ValueError(f"no stored-message source for storage kind {storage.kind!r} "
                         f"(known: {', '.join(sorted(SOURCES))})") from None
    return make(storage, endpoint)


def storage_services(spec) -> set[str]:
    """The services of stack ``spec`` that the read-back reads from, with what they depend on: for each
    ``{port:NAME}`` of the storage's ``dsn`` and ``contact_points``, the service whose readiness names that port
    (else whose command does, else the service called NAME). These stop last, after the final read-back; a
    storage outside the stack gives none."""
    st = spec.storage
    text = " ".join(x for x in (st.dsn, *st.contact_points) if x)
    owners: set[str] = set()
    for m in TEMPLATE_RE.finditer(text):
        if m.group(1) != "port":
            continue
        tag = "{port:%s}" % m.group(2)
        ready = [n for n, s in spec.services.items()
                 if s.ready is not None and tag in " ".join(filter(None, (s.ready.tcp, s.ready.http, s.ready.cql)))]
        command = [n for n, s in spec.services.items() if any(tag in c for c in s.command)]
        owners.update(ready or command or ([m.group(2)] if m.group(2) in spec.services else []))
    todo, out = list(owners), set()
    while todo:
        n = todo.pop()
        if n not in out:
            out.add(n)
            todo.extend(spec.services[n].depends_on)
    return out
