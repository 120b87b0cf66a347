"""Evidence at the moment it matters: JVM thread dumps of the service under test, taken while ingestion stalls.

:class:`ThreadDumper` watches the fleet's seconds; when the acked rate falls below ``min_rate_fraction`` of the
target (or the p99 ack latency passes ``max_latency_ms``) it runs ``jcmd <pid> Thread.print`` in the background and
saves the output as ``thread-dumps/t<second>.txt`` in the run directory, with an ``op: thread-dump`` event on the
timeline. At most ``max_dumps`` per run, ``min_gap_s`` apart, none in the first ``settle_s`` seconds. The
``no_ingest_stall`` check names the most common blocking frame across the dumps."""
from __future__ import annotations

import shutil
import subprocess
import threading
from pathlib import Path
from typing import Callable

from monsoon.rundir import THREAD_DUMP_DIR
from monsoon.timeline.store import Timeline
from monsoon.timeline.events import OP, OP_THREAD_DUMP



class ThreadDumper:
    def __init__(self, pid_of: Callable[[], int | None], out_dir: Path, tl: Timeline, *, min_rate_fraction: float = 0.5,
                 max_latency_ms: float = 2000, max_dumps: int = 6, min_gap_s: float = 3, settle_s: float = 5,
                 jcmd: str | None = None):
        self.pid_of, self.dir, self.tl = pid_of, Path(out_dir) / THREAD_DUMP_DIR, tl
        self.frac, self.max_latency_ms = min_rate_fraction, max_latency_ms
        self.max_dumps, self.min_gap_s, self.settle_s = max_dumps, min_gap_s, settle_s
        self.jcmd = jcmd or shutil.which("jcmd")
        self.taken, self._last, self._busy = 0, None, threading.Lock()
        self._threads: list[threading.Thread] = []

    def stalled(self, f: dict) -> bool:
        target = float(f.get("target_rate") or 0)
        return target > 0 and (float(f.get("acked") or 0) < self.frac * target
                               or float(f.get("p99_ms") or 0) > self.max_latency_ms)

    def on_second(self, f: dict) -> None:
        """One second of the fleet (``sec``, ``target_rate``, ``acked``, ``p99_ms``): dump if it stalled."""
        sec = f.get("sec", 0)
        if self.jcmd is None or self.taken >= self.max_dumps or sec < self.settle_s or not self.stalled(f):
            return
        if self._last is not None and sec - self._last < self.min_gap_s:
            return
        pid = self.pid_of()
        if pid is None or not self._busy.acquire(blocking=False):
            return
        self.taken, self._last = self.taken + 1, sec
        t = threading.Thread(target=self._dump, args=(pid, sec, f), name="monsoon-thread-dump", daemon=True)
        self._threads.append(t)
        t.start()

    def _dump(self, pid: int, sec: int, f: dict) -> None:
        try:
            assert self.jcmd is not None     # on_second starts a dump only with jcmd found
            out = subprocess.run([self.jcmd, str(pid), "Thread.print"], capture_output=True, text=True, timeout=20)
            if out.returncode != 0:
                self.tl.add(OP, op=OP_THREAD_DUMP, pid=pid, sec=sec, error=(out.stderr or out.stdout).strip()[:300])
                return
            self.dir.mkdir(parents=True, exist_ok=True)
            path = self.dir / f"t{int(sec):06d}.txt"
            path.write_text(out.stdout)
            self.tl.add(OP, op=OP_THREAD_DUMP, pid=pid, sec=sec, path=f"{THREAD_DUMP_DIR}/{path.name}",
                        acked=f.get("acked"), target_rate=f.get("target_rate"), p99_ms=f.get("p99_ms"))
        except (OSError, subprocess.TimeoutExpired) as e:
            self.tl.add(OP, op=OP_THREAD_DUMP, pid=pid, sec=sec, error=str(e)[:300])
        finally:
            self._busy.release()

    def close(self, timeout: float = 25) -> None:
        for t in self._threads:
            t.join(timeout)
