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
LEGS_FILE = "legs.json"            # a request/response flow's legs (Hono's command flow): per-second counts, codes
LEG_LATENCY_FILE = "legs-{leg}.hlog"   # per-second HdrHistograms of one leg's round trip (LEGS_FILE names the legs)
SWEEP_FILE = "sweep.json"          # a size sweep's record (monsoon sweep), with SWEEP_PLOT beside it
SWEEP_PLOT = "sweep.png"

# The run data: datasets, each a directory of Parquet parts (monsoon.timeline.columnar). A run made before the
# Parquet change holds each as one CSV file instead, :func:`legacy_csv` of the name (still read; also what
# ``monsoon export --csv`` writes back beside the directory).
DATASET_SUFFIX = ".parquet"
LEGACY_SUFFIX = ".csv"
ACKED_DATA = "acked.parquet"       # every acked message: device, seq, intended_ms, acked_ms (the fleet)
STORED_DATA = "stored.parquet"     # what the platform stored (a monsoon.observe.storage StoredSource), read last
STORED_AT_DRAIN_DATA = "stored-at-drain.parquet"   # the read-back at the drain's end (stored: after the platform stopped)
STORED_FINAL_TMP = "stored-final.parquet"          # the last read-back, while it is written (then it becomes stored)
SENT_DATA = "sent.parquet"         # the highest sequence number handed out per device
DATASETS = (ACKED_DATA, STORED_DATA, STORED_AT_DRAIN_DATA, SENT_DATA)
REPORT_FILES = (RESULT_FILE, SUMMARY_FILE, CHECKLIST_FILE, REPORT_FILE)   # what analysis (re)writes


def dataset_dir(path: str | Path) -> Path:
    """``<dir>/acked.parquet`` (or a legacy ``<dir>/acked.csv``) -> ``<dir>/acked.parquet``: the dataset's parts."""
    p = Path(path)
    return p.with_name(p.stem + DATASET_SUFFIX)


def legacy_csv(path: str | Path) -> Path:
    """``<dir>/acked.parquet`` -> ``<dir>/acked.csv``: the one CSV file an older run holds instead of the parts
    (and what ``monsoon export --csv`` writes)."""
    p = Path(path)
    return p.with_name(p.stem + LEGACY_SUFFIX)


EXPERIMENT_DIR_SEP = "--"           # runs/<run-id>/<stack>--<experiment>[-N]/


def experiment_dir_name(stack: str, experiment: str, n: int = 1) -> str:
    """``<stack>--<experiment>``: an experiment's directory in a run directory (``-<n>`` for its n-th run there,
    n > 1: the same experiment run again in one session)."""
    return f"{stack}{EXPERIMENT_DIR_SEP}{experiment}" + (f"-{n}" if n > 1 else "")


CALIBRATE_DIR_PREFIX = "calibrate-"  # runs/<run-id>/calibrate-<stack>[-N]/: a calibration's own run
CALIBRATION_RECORD = "calibration.json"   # in it: the calibration's record (also saved to the user's cache)
GC_LOG = "gc.log"                   # services/<service>/gc.log: a JVM's GC log (the stacks' -Xlog:gc*:file={dir}/gc.log)


def calibrate_dir_name(stack: str, n: int = 1) -> str:
    """``calibrate-<stack>``: a calibration's directory in a run directory (``-<n>`` for the n-th, n > 1)."""
    return f"{CALIBRATE_DIR_PREFIX}{stack}" + (f"-{n}" if n > 1 else "")


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
    """A legacy ``sent.csv`` (:func:`legacy_csv` of :data:`SENT_DATA`): the highest sequence number handed out per device (the fleet's ``last_seq``)."""
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
