"""The run directory: every name in it, run ids and ``runs/latest`` (the one owner of each).

A run writes ``runs/<run-id>/`` (the report files) and one ``<stack>--<experiment>/`` per experiment (the
files below); checks, the report and ``monsoon analyze`` read only these names.
"""
from __future__ import annotations

import csv
import os
import secrets
import time
from pathlib import Path

# --- in runs/<run-id>/
SUMMARY_FILE = "summary.json"      # every experiment's verdicts and figures (monsoon.report.checklist.summary)
CHECKLIST_FILE = "checklist.md"    # the sign-off checklist
REPORT_FILE = "report.html"        # the HTML report with plots
LATEST_LINK = "latest"             # runs/latest -> the newest run directory

# --- in runs/<run-id>/<stack>--<experiment>/
TIMELINE_FILE = "timeline.jsonl"   # typed events: meta, samples, phases, faults, ops (monsoon.timeline.store)
RESULT_FILE = "result.json"        # the experiment's verdicts and figures
THREAD_DUMP_DIR = "thread-dumps"   # JVM thread dumps taken while ingestion stalled (monsoon.observe.threaddump)
LATENCY_FILE = "latency.hlog"      # per-second HdrHistograms of ack latency (monsoon.timeline.hdrlog)
SWEEP_FILE = "sweep.json"          # a size sweep's record (monsoon sweep), with SWEEP_PLOT beside it
SWEEP_PLOT = "sweep.png"

# The run data are Parquet datasets: each a directory ``<name>.parquet`` of closed parts (DATASET_SUFFIX,
# monsoon.timeline.columnar). Code names a dataset by its CSV name below, which is also the file a run made
# before the Parquet change holds instead (still read) and what ``monsoon export --csv`` writes back;
# :func:`dataset_dir` gives the directory a run writes.
DATASET_SUFFIX = ".parquet"
ACKED_FILE = "acked.csv"           # every acked message: device, seq, intended_ms, acked_ms (the fleet)
STORED_FILE = "stored.csv"         # what the platform stored (a monsoon.observe.storage StoredSource), read last
STORED_AT_DRAIN_FILE = "stored-at-drain.csv"   # the read-back at the drain's end (stored: after the platform stopped)
SENT_FILE = "sent.csv"             # the highest sequence number handed out per device
DATASETS = (ACKED_FILE, STORED_FILE, STORED_AT_DRAIN_FILE, SENT_FILE)
REPORT_FILES = (RESULT_FILE, SUMMARY_FILE, CHECKLIST_FILE, REPORT_FILE)   # what analysis (re)writes


def dataset_dir(name: str | Path) -> Path:
    """``acked.csv`` (or ``<dir>/acked.csv``) -> ``acked.parquet``: the directory of a dataset's parts."""
    p = Path(name)
    return p.with_name(p.stem + DATASET_SUFFIX)

def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def point_latest(run_dir: Path) -> None:
    """Point ``<runs>/latest`` at ``run_dir`` (atomically; a failure to do so is not an error)."""
    latest = run_dir.parent / LATEST_LINK
    tmp = run_dir.parent / f".latest-{os.getpid()}"
    try:
        if tmp.is_symlink():
            tmp.unlink()
        tmp.symlink_to(run_dir.name)
        os.replace(tmp, latest)
    except OSError:
        pass


def write_sent(path: Path, last_seq: dict[str, int]) -> None:
    """A legacy ``sent.csv`` (:data:`SENT_FILE`): the highest sequence number handed out per device (the fleet's ``last_seq``)."""
    with open(path, "w", newline="") as fh:
        fh.write("device,last_seq\n")
        w = csv.writer(fh, lineterminator="\n")
        for name, seq in last_seq.items():
            w.writerow([name, int(seq)])


def read_sent(path: Path) -> dict[str, int] | None:
    if not Path(path).exists():
        return None
    out: dict[str, int] = {}
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            try:
                out[row["device"]] = int(row["last_seq"])
            except (KeyError, TypeError, ValueError):
                continue
    return out
