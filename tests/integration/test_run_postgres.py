"""stacks/bin/run-postgres on a real PostgreSQL: a deep run directory must not matter (TCP only, no Unix socket)."""
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import psycopg
import pytest

from tests.integration.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_run_postgres_serves_tcp_from_a_directory_deeper_than_the_unix_socket_limit(tmp_path):
    deep = tmp_path / ("d" * 60) / ("e" * 60) / "services" / "postgres"
    assert len(str(deep / ".s.PGSQL.65535").encode()) > 107   # a socket here could not be bound
    port = free_port()
    proc = subprocess.Popen([str(REPO / "stacks/bin/run-postgres"), str(deep), str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        def connects():
            if proc.poll() is not None:
                pytest.fail(f"run-postgres exited {proc.returncode}:\n{proc.stdout.read()}")
            try:
                with psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/postgres", connect_timeout=2) as c:
                    return c.execute("show unix_socket_directories").fetchone()[0] == ""
            except psycopg.OperationalError:
                return False
        assert wait_for(connects, 60, "postgres on a deep run directory to accept TCP")
        assert not list(deep.rglob(".s.PGSQL.*"))
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(30)


def test_the_loss_query_is_checked_on_a_real_postgres_before_any_load(tmp_path):
    """PostgresSource.check (the preflight's storage probe): broken SQL, a missing table and a query without
    device/seq columns are refused with Postgres's own words; a good query (with a trailing ;) passes."""
    from monsoon.observe.storage import PostgresSource
    from monsoon.timeline.columnar import iter_dicts
    port = free_port()
    proc = subprocess.Popen([str(REPO / "stacks/bin/run-postgres"), str(tmp_path / "pg"), str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    try:
        def connects():
            try:
                with psycopg.connect(dsn, connect_timeout=2) as c:
                    c.execute("CREATE TABLE IF NOT EXISTS t (name text, n bigint)")
                    return True
            except psycopg.OperationalError:
                return False
        assert wait_for(connects, 60, "postgres to accept TCP")
        PostgresSource(dsn, "SELECT name AS device, n AS seq FROM t;").check()
        # the read-back streams with COPY: every row, NULLs empty, as the CSV readers expect; rows/s printed
        with psycopg.connect(dsn) as c:
            c.execute("CREATE TABLE m (device text, seq bigint, stored_ms bigint)")
            c.execute("INSERT INTO m SELECT 'dev-' || (i % 50), i / 50, CASE WHEN i = 7 THEN NULL ELSE i END "
                      "FROM generate_series(0, 199999) AS i")
        t = time.perf_counter()
        n = PostgresSource(dsn, "SELECT device, seq, stored_ms FROM m ORDER BY seq, device;").export(tmp_path / "s.csv")
        dt = time.perf_counter() - t
        rows = list(iter_dicts(tmp_path / "s.csv"))
        assert n == 200_000 == len(rows) and list(rows[0]) == ["device", "seq", "stored_ms"]
        assert {"device": "dev-7", "seq": 0, "stored_ms": None} in rows[:50]
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("s.")) == ["s.parquet"]   # no .tmp
        print(f"\n[stored read-back, COPY -> Parquet] {n:,} rows in {dt:.2f} s: {n / dt:,.0f} rows/s")
        # the storage collector on the same table: incremental while the load runs, exact from the drain
        from monsoon.observe.collectors import ProbeFailed, SqlCountCollector
        inc = SqlCountCollector(dsn, "SELECT count(*) FROM m",
                                "SELECT count(*), max(seq) FROM m WHERE seq > coalesce(%(since)s, -1)")
        inc.probe()
        assert inc.sample() == {"stored": 200_000, "counted": "incremental"} and inc.since == 3999
        with psycopg.connect(dsn, autocommit=True) as c:
            c.execute("INSERT INTO m SELECT 'dev-' || i, 4000, 1 FROM generate_series(0, 99) AS i")
            c.execute("ANALYZE m")
        assert inc.sample() == {"stored": 200_100, "counted": "incremental"}
        inc.drain_begins()
        assert inc.sample() == {"stored": 200_100, "counted": "exact"}
        inc.close()
        est = SqlCountCollector(dsn, "SELECT count(*) FROM m",
                                "SELECT reltuples::bigint FROM pg_class WHERE oid = 'm'::regclass")
        got = est.sample()
        assert got["counted"] == "estimate" and abs(got["stored"] - 200_100) < 2_000
        est.close()
        bad = SqlCountCollector(dsn, "SELECT count(*) FROM m", "SELECT count(*) FROM nope")
        with pytest.raises(ProbeFailed, match='relation "nope" does not exist') as e:
            bad.probe()
        assert e.value.key == "storage.running_count_query" and isinstance(e.value.cause, psycopg.Error)
        bad.close()
        for query, words in [("SELEC name FROM t", 'syntax error at or near "SELEC"'),
                             ("SELECT name AS device, n AS seq FROM nope", 'relation "nope" does not exist'),
                             ("SELECT name AS device FROM t", "returns the columns device: it needs seq"),
                             ("SELECT name AS device, n / 2.0 AS seq FROM t",
                              "seq is numeric, not an integer: cast it in the query"),
                             ("SELECT name AS device, n AS seq, now() AS stored_ms FROM t",
                              "stored_ms is timestamp with time zone, not an integer")]:
            with pytest.raises(ValueError, match=words):
                PostgresSource(dsn, query).check()
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(30)
