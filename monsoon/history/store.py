"""The history store: SQLite under the runs directory by default, Postgres when ``MONSOON_HISTORY_URL`` is set.

Plain DB-API (``sqlite3`` from the standard library, ``psycopg``, already a dependency) rather than SQLAlchemy:
one table, one upsert and a few SELECTs are the same SQL on both (``INSERT ... ON CONFLICT ... DO UPDATE`` is in
SQLite since 3.24 and in Postgres), so the only difference is the parameter marker (``?`` against ``%s``),
which :meth:`HistoryStore._sql` swaps. A row is one run x stack x experiment x check; the experiment's own
verdict and headline figures are the row whose check is ``*``; a scheduled run that was skipped or missed is a
row with ``status`` ``skipped``/``missed``.
"""
from __future__ import annotations

import json
import sqlite3
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from monsoon import settings

HISTORY_FILE = "history.sqlite"     # under the runs directory
ENV_URL = "MONSOON_HISTORY_URL"     # postgresql://user@host:port/db: a shared Postgres instead
EXPERIMENT = "*"                    # the check name of an experiment's own row (its verdict, headline figures)

COLUMNS = ("run_id", "stack", "experiment", "check_name", "verdict", "status", "message", "figures", "profile",
           "host", "host_class", "cpu_count", "git_commit", "stack_sha256", "platform_sha256", "started_at",
           "ended_at", "duration_s", "run_dir", "recorded_at")
KEY = ("run_id", "stack", "experiment", "check_name")
# what a re-analysis may change; the provenance (commit, hashes, host) stays as the run recorded it
UPDATED = ("verdict", "status", "message", "figures", "started_at", "ended_at", "duration_s", "run_dir",
           "recorded_at")

SCHEMA = """
CREATE TABLE IF NOT EXISTS monsoon_history (
    run_id TEXT NOT NULL, stack TEXT NOT NULL, experiment TEXT NOT NULL, check_name TEXT NOT NULL,
    verdict TEXT NOT NULL, status TEXT NOT NULL DEFAULT 'ran', message TEXT, figures TEXT NOT NULL DEFAULT '{}',
    profile TEXT, host TEXT, host_class TEXT, cpu_count INTEGER, git_commit TEXT, stack_sha256 TEXT,
    platform_sha256 TEXT, started_at DOUBLE PRECISION, ended_at DOUBLE PRECISION, duration_s DOUBLE PRECISION,
    run_dir TEXT, recorded_at DOUBLE PRECISION,
    PRIMARY KEY (run_id, stack, experiment, check_name)
)"""
INDEX = "CREATE INDEX IF NOT EXISTS monsoon_history_by_exp ON monsoon_history (stack, experiment, started_at)"


@dataclass
class Row:
    run_id: str
    stack: str
    experiment: str
    check_name: str
    verdict: str
    status: str = "ran"              # ran | skipped | missed
    message: str | None = None
    figures: dict = field(default_factory=dict)
    profile: str | None = None
    host: str | None = None
    host_class: str | None = None
    cpu_count: int | None = None
    git_commit: str | None = None
    stack_sha256: str | None = None
    platform_sha256: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    duration_s: float | None = None
    run_dir: str | None = None
    recorded_at: float | None = None

    def values(self) -> tuple:
        d = asdict(self)
        d["figures"] = json.dumps(self.figures, sort_keys=True, default=str)
        return tuple(d[c] for c in COLUMNS)

    @classmethod
    def from_db(cls, values) -> "Row":
        d = dict(zip(COLUMNS, values))
        d["figures"] = json.loads(d["figures"] or "{}")
        return cls(**d)


def default_location(runs_dir: Path) -> str:
    """Where the history is: ``MONSOON_HISTORY_URL`` or ``<runs_dir>/history.sqlite``."""
    return settings.env(ENV_URL) or str(Path(runs_dir) / HISTORY_FILE)


class HistoryStore:
    """One connection to the history; ``location`` is a postgresql:// URL or a SQLite file path."""

    def __init__(self, location: str | Path):
        self.location = str(location)
        self.postgres = self.location.startswith(("postgresql://", "postgres://"))
        self.conn: Any      # a psycopg or a sqlite3 connection: the methods branch on self.postgres
        if self.postgres:
            self.conn = psycopg.connect(self.location, autocommit=True, connect_timeout=10)
        else:
            Path(self.location).parent.mkdir(parents=True, exist_ok=True)
            self.conn = sqlite3.connect(self.location, timeout=30, isolation_level=None)
        self._exec(SCHEMA)
        self._exec(INDEX)

    @classmethod
    def for_runs(cls, runs_dir: Path) -> "HistoryStore":
        return cls(default_location(runs_dir))

    def __enter__(self) -> "HistoryStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.conn.close()

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.postgres else sql

    def _exec(self, sql: str, params: tuple | list = ()):
        return self.conn.execute(self._sql(sql), params)

    def upsert(self, rows: list[Row]) -> int:
        """Insert rows; a row already there (same run, stack, experiment, check) is updated, never duplicated."""
        if not rows:
            return 0
        cols = ", ".join(COLUMNS)
        marks = ", ".join("?" for _ in COLUMNS)
        sets = ", ".join(f"{c} = excluded.{c}" for c in UPDATED)
        sql = (f"INSERT INTO monsoon_history ({cols}) VALUES ({marks}) "
               f"ON CONFLICT ({', '.join(KEY)}) DO UPDATE SET {sets}")
        if self.postgres:
            with self.conn.transaction():
                with self.conn.cursor() as cur:
                    cur.executemany(self._sql(sql), [r.values() for r in rows])
        else:
            self.conn.execute("BEGIN")
            try:
                self.conn.executemany(sql, [r.values() for r in rows])
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                raise
        return len(rows)

    def rows(self, *, stack: str | None = None, experiment: str | None = None, check: str | None = None,
             run_id: str | None = None, since: float | None = None) -> list[Row]:
        """Rows, oldest run first (by start time, then run id)."""
        where: list[str] = []
        params: list[str | float] = []
        for col, val in (("stack", stack), ("experiment", experiment), ("check_name", check), ("run_id", run_id)):
            if val is not None:
                where.append(f"{col} = ?")
                params.append(val)
        if since is not None:
            where.append("started_at >= ?")
            params.append(since)
        sql = f"SELECT {', '.join(COLUMNS)} FROM monsoon_history"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY started_at, run_id, stack, experiment, check_name"
        return [Row.from_db(v) for v in self._exec(sql, params).fetchall()]

    def prune(self, before: float) -> list[tuple[str, str | None]]:
        """Delete every row of runs that started before ``before`` (epoch s); returns (run_id, run_dir) pruned."""
        old = self._exec("SELECT DISTINCT run_id, run_dir FROM monsoon_history WHERE started_at < ?",
                         (before,)).fetchall()
        self._exec("DELETE FROM monsoon_history WHERE started_at < ?", (before,))
        return [(r[0], r[1]) for r in old]
