"""``storage.kind: cassandra``: stored messages read back from Cassandra through cassandra-driver, in pages.

The CQL returns ``device`` (or ``entity_id``), ``seq`` and optionally ``stored_ms`` for every stored value, e.g.
on ThingsBoard's ``ts_kv_cf``::

    SELECT entity_id, long_v AS seq, writetime(long_v) AS stored_us FROM thingsboard.ts_kv_cf
    WHERE key = 'seq' ALLOW FILTERING

(``stored_us``, the write time in microseconds, is turned into ``stored_ms``). Cassandra cannot join: when the
rows carry entity ids, ``names_query`` (SQL on ``dsn``, the Postgres of TB's hybrid mode) maps them to device
names; a row whose entity id has no name keeps the id, so the accounting counts it as an unexpected device
rather than hiding it."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable, Iterator

import psycopg
from monsoon.extras import need
from monsoon.stack.ready import cql_cluster


def _query():
    """cassandra-driver's query module, imported when a Cassandra store is read (``monsoon[cassandra]``)."""
    return need("cassandra.query", "cassandra", "storage.kind: cassandra")


def split_contact_points(points: Iterable[str]) -> tuple[list[str], int]:
    """``["127.0.0.1:9042", ...]`` -> (hosts, port); cassandra-driver takes one port for every node."""
    hosts, ports = [], set()
    for p in points:
        host, sep, port = p.rpartition(":")
        if not sep:
            host, port = p, "9042"
        hosts.append(host)
        ports.add(int(port))
    if len(ports) != 1:
        raise ValueError(f"contact points must share one port, got {sorted(ports)}")
    return hosts, ports.pop()


class CassandraSource:
    """Exports a CQL query's rows to the run's ``stored`` dataset (a :class:`~monsoon.observe.storage.StoredSource`);
    ``write`` is :func:`monsoon.observe.storage.write_stored` (passed in: that module picks this one)."""

    def __init__(self, contact_points: Iterable[str], keyspace: str, cql: str, *, write: Callable[..., int],
                 fetch_size: int = 5000, names_dsn: str | None = None, names_query: str | None = None,
                 timeout: float = 30.0):
        self.write = write
        self.hosts, self.port = split_contact_points(contact_points)
        self.keyspace, self.cql, self.fetch_size = keyspace, cql.strip().rstrip(";"), fetch_size
        self.names_dsn, self.names_query, self.timeout = names_dsn, names_query, timeout

    def _cluster(self):
        return cql_cluster(self.hosts, self.port, timeout=self.timeout, row_factory=_query().tuple_factory)

    def _names(self) -> dict[str, str]:
        if not self.names_query:
            return {}
        if self.names_dsn is None:
            raise ValueError("names_query needs names_dsn (the Postgres it runs on)")
        with psycopg.connect(self.names_dsn, connect_timeout=5) as conn:
            return {str(eid): name for eid, name in conn.execute(self.names_query)}

    def export(self, path: Path) -> int:
        names = self._names()
        cluster = self._cluster()
        try:
            session = cluster.connect(self.keyspace)
            rs = session.execute(_query().SimpleStatement(self.cql, fetch_size=self.fetch_size))
            columns = list(rs.column_names)
            return self.write(path, *_rows(columns, rs, names))
        finally:
            cluster.shutdown()

    def check(self) -> None:
        """Prepare the CQL (parsed by the server, not run) and read its columns: a typo, a missing table or a query
        without the device and seq columns is found before the load."""
        try:
            cluster = self._cluster()
            try:
                session = cluster.connect(self.keyspace)
                columns = [c[2] for c in session.prepare(self.cql).result_metadata]   # (keyspace, table, name, type)
            finally:
                cluster.shutdown()
        except Exception as e:   # the driver's errors name what is wrong
            raise ValueError(" ".join(str(e).split())) from None
        missing = [c for c, alts in (("device", ("device", "entity_id")), ("seq", ("seq",)))
                   if not any(a in columns for a in alts)]
        if missing:
            raise ValueError(f"returns the columns {', '.join(columns) or 'none'}: it needs "
                             f"{' and '.join(missing)} (device may be entity_id; name them with AS)")


def _rows(columns: list[str], rows: Iterable[tuple], names: dict[str, str]) -> tuple[list[str], Iterator]:
    """The header and rows of the stored dataset: entity_id -> device (named), stored_us -> stored_ms."""
    out = list(columns)
    ent = out.index("entity_id") if "entity_id" in out and "device" not in out else None
    us = out.index("stored_us") if "stored_us" in out and "stored_ms" not in out else None
    if ent is not None:
        out[ent] = "device"
    if us is not None:
        out[us] = "stored_ms"
    if ent is None and us is None:
        return out, iter(rows)

    def gen():
        for r in rows:
            r = list(r)
            if ent is not None:
                key = str(r[ent])
                r[ent] = names.get(key, key)
            if us is not None and r[us] is not None:
                r[us] = r[us] // 1000
            yield r
    return out, gen()
