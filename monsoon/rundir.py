"""The run directory: its file names, run ids and ``runs/latest`` (the one owner of each).

Every run writes ``runs/<run-id>/<stack>--<experiment>/`` with the files named here; checks, the report and
``monsoon analyze`` read only these, so they cannot tell a bare-process stack from a container or the real
ThingsBoard.
"""
from __future__ import annotations

import csv
import os
import secrets
import time
from pathlib import Path

TIMELINE_FILE = "timeline.jsonl"   # typed events: meta, samples, phases, faults, ops (monsoon.timeline.store)
ACKED_FILE = "acked.csv"           # every acked message: device, seq, intended_ms, acked_ms (the fleet)
STORED_FILE = "stored.csv"         # what the platform stored (a monsoon.observe.storage StoredSource), read last
STORED_AT_DRAIN_FILE = "stored-at-drain.csv"   # the read-back at the drain's end (stored.csv: after the platform stopped)
SENT_FILE = "sent.csv"             # the highest sequence number handed out per device
THREAD_DUMP_DIR = "thread-dumps"   # JVM thread dumps taken while ingestion stalled (monsoon.observe.threaddump)
LATENCY_FILE = "latency.hlog"      # per-second HdrHistograms of ack latency (monsoon.timeline.hdrlog)
RESULT_FILE = "result.json"        # the experiment's verdicts and figures


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


def point_latest(run_dir: Path) -> None:
    """Point ``<runs>/latest`` at ``run_dir`` (atomically; a failure to do so is not an error)."""
    latest = run_dir.parent / "latest"
    tmp = run_dir.parent / f".latest-{os.getpid()}"
    try:
        if tmp.is_symlink():
            tmp.unlink()
        tmp.symlink_to(run_dir.name)
        os.replace(tmp, latest)
    except OSError:
        pass


def write_sent(path: Path, last_seq: dict[str, int]) -> None:
    """``sent.csv``: the highest sequence number handed out per device (the fleet's ``last_seq``)."""
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
