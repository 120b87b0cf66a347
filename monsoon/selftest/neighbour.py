"""A busy neighbour: one process burning one core beside a run, as another tenant of a shared machine would.

Used by ``make story-budgets`` (its ``neighbour`` budget) and ``make defects`` (``--neighbour``), so that a
story or a seeded defect is shown to hold when the machine is not idle, not only under a CPU quota."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process, from /proc/<pid>/stat; None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def busy_neighbour(entry: dict[str, Any]) -> Iterator[int]:
    """Run a busy loop (its own session) for the block; yield its pid. Records ``neighbour_pid`` and, at the end,
    ``neighbour_cores`` (its CPU seconds over the block's wall time: about 1.0 when it got its core) in
    ``entry``. The loop is SIGKILLed and reaped on every way out of the block, Ctrl-C included."""
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"], stdin=subprocess.DEVNULL,
                            start_new_session=True)
    entry["neighbour_pid"] = proc.pid
    t0 = time.monotonic()
    try:
        yield proc.pid
    finally:
        cpu = cpu_seconds(proc.pid)
        wall = time.monotonic() - t0
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        if cpu is not None and wall > 0:
            entry["neighbour_cores"] = round(cpu / wall, 3)
