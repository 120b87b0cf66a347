"""What the benchmarks read of a process from /proc."""
from __future__ import annotations

from pathlib import Path


def proc_rss_mb(pid: int) -> float:
    """A process's resident set (VmRSS), MB (0 when it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0
