"""Rows for the history from a run's results (the plugin's result hook, ``monsoon analyze``) and from
scheduled runs that did not run (skipped, missed).

A result is the dict a run writes (``ExperimentResult.to_dict()``, a ``summary.json`` result): its checks
become one row each, and the experiment itself a row whose check is ``*`` with the headline figures. The
provenance of a row: the project's git commit, the stack file's sha256 and the sha256 of the jars the stack
requires (the reference platform's), the host, its class and CPU count; the times come from the experiment's
timeline (the ``meta`` event's wall clock and the last event's ``t``).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import socket
import subprocess
import time
from pathlib import Path

from monsoon.history.store import EXPERIMENT, HistoryStore, Row
from monsoon import settings
from monsoon.rundir import TIMELINE_FILE, experiment_dir_name
from monsoon.spec.stack import jar_sha256, load_stack
from monsoon.spec.yamlio import SpecError
from monsoon.timeline.events import META
from monsoon.timeline.tail import TAIL_CHUNK


def git_commit() -> str | None:
    """The HEAD commit of the user's project (the settings' project directory), or None outside git."""
    return _git_commit(str(settings.current().project_dir))


@functools.lru_cache(maxsize=8)
def _git_commit(project: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", project, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def host_class() -> str:
    """Runs are compared only within a host class: the machine's architecture and CPU count."""
    return f"{platform.machine() or 'unknown'}-{os.cpu_count() or 0}cpu"


def sha256_file(path: Path) -> str | None:
    try:
        h = hashlib.sha256()
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        return h.hexdigest()
    except OSError:
        return None


def timeline_span(timeline: Path) -> tuple[dict, float | None, float | None]:
    """(meta event, start wall clock, end wall clock) of an experiment's timeline: the first line and the last
    complete one, without reading the file in between."""
    meta: dict = {}
    try:
        with open(timeline, "rb") as fh:
            first = fh.readline()
            meta = json.loads(first) if first.strip() else {}
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - TAIL_CHUNK))
            lines = [x for x in fh.read().split(b"\n") if x.strip()]
    except (OSError, ValueError):
        return {}, None, None
    if meta.get("type") != META:
        return {}, None, None
    start = meta.get("wall")
    last_t = None
    for raw in reversed(lines):
        try:
            last_t = json.loads(raw).get("t")
            break
        except ValueError:   # a torn last line
            continue
    end = start + float(last_t) if isinstance(start, (int, float)) and isinstance(last_t, (int, float)) else None
    return meta, start, end


def _provenance(meta: dict) -> dict:
    out: dict[str, str | None] = {"stack_sha256": None, "platform_sha256": None}
    src = meta.get("stack_source")
    if src and Path(src).is_file():
        out["stack_sha256"] = sha256_file(Path(src))
        try:
            sums = jar_sha256(load_stack(src))
        except SpecError:
            sums = {}
        out["platform_sha256"] = ",".join(f"{name}:{h}" for name, h in sorted(sums.items())) or None
    return out


def rows_for_result(run_id: str, profile: str, result: dict, run_dir: Path, now: float | None = None) -> list[Row]:
    """One row per check of ``result`` and one (check ``*``) for the experiment itself."""
    exp_dir = Path(result["dir"]) if result.get("dir") else run_dir / experiment_dir_name(result['stack'], result['experiment'])
    meta, start, end = timeline_span(exp_dir / TIMELINE_FILE)
    common = dict(run_id=run_id, stack=result["stack"], experiment=result["experiment"], profile=profile,
                  host=socket.gethostname(), host_class=host_class(), cpu_count=os.cpu_count(),
                  git_commit=git_commit(), started_at=start, ended_at=end,
                  duration_s=(end - start) if start is not None and end is not None else None,
                  run_dir=str(run_dir), recorded_at=now if now is not None else time.time(), **_provenance(meta))
    rows = [Row(check_name=EXPERIMENT, verdict=result["verdict"], message=result.get("error"),
                figures=result.get("figures", {}), **common)]
    for c in result.get("checks", []):
        rows.append(Row(check_name=c["name"], verdict=c["verdict"], message=c.get("message"),
                        figures=c.get("figures", {}), **common))
    return rows


def record_results(store: HistoryStore, run_id: str, profile: str, results: list[dict], run_dir: Path) -> int:
    """Upsert every (non dry-run) result of a run; returns the number of rows written."""
    rows = [row for r in results if r.get("verdict") != "skipped"
            for row in rows_for_result(run_id, profile, r, Path(run_dir))]
    return store.upsert(rows)


def record_not_run(store: HistoryStore, run_id: str, schedule: str, status: str, reason: str,
                   now: float | None = None, profile: str | None = None) -> None:
    """A scheduled run that did not start: ``skipped`` (another still running) or ``missed`` (past its
    deadline), with the reason. Its stack is ``-`` and its experiment the schedule's name."""
    now = time.time() if now is None else now
    store.upsert([Row(run_id=run_id, stack="-", experiment=schedule, check_name=EXPERIMENT, verdict=status,
                      status=status, message=reason, profile=profile, host=socket.gethostname(),
                      host_class=host_class(), cpu_count=os.cpu_count(), git_commit=git_commit(), started_at=now,
                      ended_at=now, duration_s=0.0, recorded_at=now)])
