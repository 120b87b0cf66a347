"""The offline pipeline over a saved run directory: :func:`analyze` (every experiment's checks again, its
results and the run's report rewritten), :func:`export_csv` (Parquet run data back as CSV) and the writers
of results that the live session shares with it."""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from monsoon.checks.registry import evaluate
from monsoon.history.hooks import record as record_history
from monsoon.report import sweep as sweep_report
from monsoon.report.result import ExperimentResult
from monsoon.report.write import write as write_report
from monsoon.rundir import ACKED_DATA, DATASETS, REPORT_FILE, RESULT_FILE, TIMELINE_FILE, legacy_csv
from monsoon.timeline.columnar import dataset_state, export_csv as write_csv_of_parts, salvage_shards
from monsoon.timeline.store import Events
from monsoon.timeline.torn import torn_notes
from monsoon.timeline.events import OP, OP_INTERRUPTED, PLATFORM


def salvaged(sub: Path) -> list[str]:
    """The acks a cut-off native fleet left in its workers' shards, made a part of acked (said in a line)."""
    n = salvage_shards(sub / ACKED_DATA)
    if n is None:
        return [f"{ACKED_DATA}: the native fleet's workers still write their shards (a run still draining?): "
                "its last acks are not read; analyze again once they exit"]
    if n:
        return [f"{ACKED_DATA}: {n:,} acked rows recovered from the native fleet's shards "
                "(written after its last part, before the run was cut off)"]
    return []


def write_result(out_dir: Path, result: dict) -> None:
    """One experiment's ``result.json``."""
    (Path(out_dir) / RESULT_FILE).write_text(json.dumps(result, indent=2))


def write_results(run_dir: Path, run_id: str, profile: str, results: list[dict], events: dict | None = None,
                  interrupted: dict | None = None) -> tuple[dict, str]:
    """A run's ``summary.json``, ``checklist.md`` and ``report.html`` (:func:`monsoon.report.write.write`)."""
    return write_report(run_dir, run_id, profile, results, events, interrupted=interrupted)


def _judge(run_dir: Path, sub: Path, events: Events, meta: dict) -> dict:
    """One experiment of a saved run judged again: its ``result.json`` rewritten and returned."""
    res = ExperimentResult(meta.get("stack", "?"), meta.get("experiment", sub.name), meta.get("profile", "quick"),
                           sub)
    old = sub / RESULT_FILE
    if old.exists():
        res.error = json.loads(old.read_text()).get("error")
    torn = salvaged(sub) + torn_notes(sub, events)   # files cut off (a run killed mid-write), said out loud
    for note in torn:
        print(f"monsoon analyze: {run_dir.name}/{sub.name}: {note}", file=sys.stderr)
    res.checks = evaluate(sub, [(c["name"], c.get("params", {})) for c in meta.get("checks", [])], events=events)
    res.base_rate = meta.get("base_rate_auto")
    said = events.first(PLATFORM)
    res.platform = {k: v for k, v in said.items() if k not in ("type", "t", "wall")} if said else None
    cut = events.first(OP, op=OP_INTERRUPTED)    # a signal cut the run short: still partial, still unknown
    if cut is not None:
        res.interrupted = {k: cut[k] for k in ("signal", "t", "stage", "phase") if k in cut}
    result = res.to_dict()
    if torn:                              # only then: an intact run's result.json and summary.json are as before
        result["torn"] = torn
    write_result(sub, result)
    return result


def analyze(run_dir: Path) -> dict:
    """Re-run every check of every experiment in a saved run, offline; rewrite summary.json, checklist.md and
    report.html, and record the run in the history of the runs directory above it."""
    run_dir = Path(run_dir).resolve()
    if not run_dir.is_dir():
        raise SystemExit(f"monsoon analyze: {run_dir} is not a directory")
    results, run_id, profile = [], run_dir.name, "quick"
    loaded: dict[Path, Events] = {}           # each timeline is read once, for the checks and the report
    swept: dict[str, list[dict]] = {}         # monsoon sweep directories: their verdicts
    for sub in sorted(p for p in run_dir.iterdir() if (p / TIMELINE_FILE).exists()):
        events = loaded[sub] = Events.load(sub / TIMELINE_FILE)
        meta = events.meta()
        if meta.get("kind") == "calibration":   # a calibrate-<stack>/ ramp (base_rate: auto), not an experiment
            continue
        if meta.get("kind") == "size-sweep":    # monsoon sweep: its own checks and report
            swept[sub.name] = sweep_report.reanalyze(sub, events)
            for v in swept[sub.name]:
                print(f"monsoon analyze: {sub.name}: {v['verdict'].upper()} {v['name']}: {v['message']}")
            continue
        profile = meta.get("profile", profile)
        run_id = meta.get("run_id", run_id)
        results.append(_judge(run_dir, sub, events, {**meta, "profile": profile}))
    if not results and swept:
        return {"run_id": run_id, "profile": profile, "results": [], "sweeps": swept}
    if not results:
        raise SystemExit(f"monsoon analyze: no experiment timelines under {run_dir}")
    t = time.perf_counter()
    s, _ = write_results(run_dir, run_id, profile, results, loaded)
    page = run_dir / REPORT_FILE
    if page.exists():
        print(f"monsoon analyze: {REPORT_FILE} {page.stat().st_size / 2**20:.1f} MB, written in "
              f"{time.perf_counter() - t:.1f} s", file=sys.stderr)
    warning = record_history(run_dir.parent, run_id, profile, results, run_dir)   # an upsert: never duplicates
    if warning:
        print(warning, file=sys.stderr)
    return s


def export_csv(run_dir: Path) -> int:
    """``monsoon export RUN --csv``: every experiment's ``acked``, ``stored`` and ``sent`` Parquet datasets
    written back beside them as the CSV files older runs hold (:func:`monsoon.rundir.legacy_csv`)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        print(f"monsoon export: {run_dir} is not a directory", file=sys.stderr)
        return 2
    subs = [run_dir] if (run_dir / TIMELINE_FILE).exists() else sorted(p for p in run_dir.iterdir() if p.is_dir())
    n = 0
    for sub in subs:
        for name in DATASETS:
            d = sub / name
            if not d.is_dir():
                continue
            out = legacy_csv(d)
            rows = write_csv_of_parts(d, out)
            note = dataset_state(d).note(d.name)
            print(f"monsoon export: {sub.name}/{out.name}: {rows:,} rows" + (f" ({note})" if note else ""))
            n += 1
    if not n:
        print(f"monsoon export: no Parquet run data under {run_dir} (its CSVs are the run data already)",
              file=sys.stderr)
        return 1
    return 0
