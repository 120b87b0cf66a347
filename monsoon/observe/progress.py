"""Live progress of a running load: what the generator asked and achieved, and what the stack did with it.

On a terminal, a rich panel refreshed in place every second (target and achieved rate, acks, errors,
late, p99 from the intended send time, connected devices, the generator's own CPU (cores busy and
microseconds per message sent), backlog, heap, restarts). Anywhere else (CI
logs, a pipe, pytest's captured output) one plain line every ``every`` seconds through the caller's
``progress`` callback, the same numbers in the same order.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TextIO
from rich.panel import Panel
from rich.text import Text
from rich.console import Console
from rich.live import Live

__all__ = ["LoadProgress", "generator_cpu", "progress_fields"]
Progress = Callable[[str], None]   # where a run says what it is doing (print, or the pytest terminal)


def progress_fields(t: float, phase: str, st: Any, sample: Callable[[str, str], Any], restarts: int) -> dict:
    """The numbers of one second, in display order (None = not measured on this stack)."""
    heap, hmax = sample("metrics", "heap_used"), sample("metrics", "heap_max")
    return {
        "t": f"{t:.0f}s", "phase": phase,
        "target/s": f"{st.target_rate:,.0f}", "sent/s": f"{st.sent:,}", "acked/s": f"{st.acked:,}",
        "errors": f"{st.failed:,}", "late": f"{st.late:,}",
        "p99": None if st.p99_ms is None else f"{st.p99_ms:,.0f}ms",
        "connected": f"{st.connected:,}",
        **generator_cpu(st),
        "lag": _num(sample("kafka", "lag")), "queue": _num(sample("metrics", "queue_depth")),
        "heap": None if heap is None or not hmax else f"{heap / 2**20:.0f}/{hmax / 2**20:.0f}MB",
        "restarts": str(restarts),
    }


def generator_cpu(st: Any) -> dict:
    """The generator's CPU in this second: cores busy (CPU seconds per second) and CPU per message sent."""
    cpu = getattr(st, "gen_cpu_s", None)
    if cpu is None:
        return {"gen_cpu": None, "gen_us/msg": None}
    return {"gen_cpu": f"{cpu:.2f}cores",
            "gen_us/msg": f"{cpu / st.sent * 1e6:,.1f}" if st.sent else None}


def _num(v: Any) -> str | None:
    return None if v is None else f"{v:,.0f}"


class LoadProgress:
    """``update(fields)`` once per second of load; a context manager around the load."""

    def __init__(self, label: str, progress: Callable[[str], None], *, live: TextIO | None = None,
                 every: float = 5.0, clock: Callable[[], float] = time.monotonic):
        self.label, self.progress, self.every, self.clock = label, progress, every, clock
        self._live_file = live if live is not None and _isatty(live) else None
        self._live: Live | None = None
        self._last: dict | None = None
        self._last_line = -float("inf")

    def __enter__(self) -> "LoadProgress":
        if self._live_file is not None:
            self._live = Live(console=Console(file=self._live_file), refresh_per_second=2, transient=True,
                              auto_refresh=True)
            self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
        if self._last is not None:       # the last second stays in the log, live or not
            self.progress(self.line(self._last))

    def line(self, fields: dict) -> str:
        return f"[{self.label}] " + " ".join(f"{k}={v}" if k not in ("t", "phase") else str(v)
                                            for k, v in fields.items() if v is not None)

    def update(self, fields: dict) -> None:
        self._last = fields
        if self._live is not None:
            self._live.update(self._table(fields))
            return
        now = self.clock()
        if now - self._last_line >= self.every:
            self._last_line = now
            self.progress(self.line(fields))

    def _table(self, fields: dict):
        text = Text()
        for i, (k, v) in enumerate((k, v) for k, v in fields.items() if v is not None):
            if i:
                text.append("  ")
            if k in ("t", "phase"):
                text.append(str(v), style="bold")
            else:
                text.append(f"{k} ", style="dim")
                text.append(str(v), style="bold")
        return Panel(text, title=f"monsoon {self.label}", title_align="left", expand=False)


def _isatty(f: TextIO) -> bool:
    try:
        return f.isatty()
    except (AttributeError, ValueError):
        return False
