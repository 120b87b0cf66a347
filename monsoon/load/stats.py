"""Per-second stats and run totals of a fleet, the acked dataset's writer and the latency histograms' helpers."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable
from pathlib import Path
from hdrh.histogram import HdrHistogram

from monsoon.timeline.columnar import PartWriter, fresh


ACKED_CSV_HEADER = ("device", "seq", "intended_ms", "acked_ms")


def acked_parts(acked_path: Path) -> PartWriter:
    """A fleet's acked dataset, started afresh: Parquet parts beside ``acked_path`` (``acked.parquet/``), a part
    every :data:`monsoon.timeline.columnar.FLUSH_S` seconds (:func:`flush_acked` each second decides)."""
    return PartWriter(fresh(acked_path), ACKED_CSV_HEADER, background=True)


def flush_acked(parts: PartWriter | None, rows: list[tuple]) -> None:
    """Hand the second's acked rows ``(device, seq, intended_ms, acked_ms)`` to ``parts``; a part is written
    when its time has come."""
    if parts is None:
        return
    for row in rows:
        parts.append(*row)
    rows.clear()
    parts.maybe_flush()


@dataclass
class SecondStats:
    """What happened during one second of the run (events are attributed to
    the second in which they happened: a message is ``scheduled`` when the
    pacer takes it off the schedule, ``acked`` when its PUBACK arrives).
    ``target_rate`` is what the schedule asks for in this second
    (:meth:`Schedule.expected_per_second`), 0 after its end.
    Latency is PUBACK time minus *intended* send time, in ms."""

    t: int
    target_rate: float
    scheduled: int
    sent: int
    acked: int
    failed: int
    late: int
    connected: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    #: CPU seconds the generator used in this second (the native workers' own, summed; an in-process
    #: fleet's: monsoon's whole process, an upper bound); None = not measured
    gen_cpu_s: float | None = None
    #: of ``late``, the sends that waited for a request slot of their device: the platform held every slot
    #: (it answers slower than it is sent to), not the generator falling behind (the request fleets count it)
    held: int = 0


def machine_cpus() -> int:
    """CPUs this process may run on (what the generator and a local platform share)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass
class FleetTotals:
    scheduled: int
    sent: int
    acked: int
    failed: int
    late: int
    dropped: int
    unacked: int
    last_seq: dict[str, int]
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    # extras, not in the original brief
    reconnects: int = 0
    elapsed_s: float = 0.0
    lost_in_flight: int = 0  # sent on a connection that then dropped, before its PUBACK
    cpus: int = field(default_factory=machine_cpus)   # the generator machine's CPUs (load_valid's "of N")


def _pct_ms(h: HdrHistogram | None) -> tuple[float | None, float | None, float | None]:
    """p50, p99 and max of a latency histogram in ms (Nones when it is empty or absent)."""
    if h is None or h.get_total_count() == 0:
        return None, None, None
    return (
        h.get_value_at_percentile(50) / 1000.0,
        h.get_value_at_percentile(99) / 1000.0,
        h.get_max_value() / 1000.0,
    )


class FleetConnectError(RuntimeError):
    """The fleet could not connect (names host:port, the device and the cause)."""


class SecondTicker:
    """The one per-second stats writer of the in-process fleets (MQTT, HTTP, CoAP).

    At every second boundary it writes that second: the fleet's counters as deltas since the previous one
    (``counters()`` -> scheduled, sent, acked, failed, late[, held]), the second's latency histogram into the interval
    log and the run's total (then resets it), the acked log flushed, and one :class:`SecondStats` to
    ``on_second``. ``catch_up(now)`` writes every second that has ended by ``now``; ``finish(now)`` also
    writes the last, partial one, so per-second sums equal the totals. ``next_at`` is when the current
    second ends (a fleet's poll wakes up then)."""

    def __init__(self, t0: float, targets: list[float], counters: Callable[[], tuple[int, ...]],
                 connected: Callable[[], int], hist_sec: HdrHistogram, hist_total: HdrHistogram, hlog: Any,
                 flush: Callable[[], None], on_second: Callable[[SecondStats], None] | None):
        self.t0, self.targets, self.counters, self.connected = t0, targets, counters, connected
        self.hist_sec, self.hist_total, self.hlog, self.flush, self.on_second = hist_sec, hist_total, hlog, flush, on_second
        self.sec = 0
        self.next_at = t0 + 1.0
        self._prev: tuple[int, ...] = (0, 0, 0, 0, 0, 0)
        self._cpu = time.process_time()

    def _emit(self, s: int) -> None:
        cur = self.counters()
        d = [c - p for c, p in zip(cur, self._prev)]
        self._prev = cur
        p50, p99, mx = _pct_ms(self.hist_sec)
        if self.hist_sec.get_total_count():
            if self.hlog is not None:
                self.hlog.write(s, self.hist_sec)   # once per second: one encode(), ~0.1 ms
            self.hist_total.add(self.hist_sec)
            self.hist_sec.reset()
        self.flush()
        cpu, self._cpu = self._cpu, time.process_time()
        if self.on_second is not None:
            self.on_second(SecondStats(
                t=s, target_rate=self.targets[s] if s < len(self.targets) else 0.0, scheduled=d[0], sent=d[1],
                acked=d[2], failed=d[3], late=d[4], connected=self.connected(), p50_ms=p50, p99_ms=p99, max_ms=mx,
                gen_cpu_s=round(self._cpu - cpu, 4), held=d[5] if len(d) > 5 else 0,
            ))

    def catch_up(self, now: float) -> None:
        while now >= self.next_at:
            self._emit(self.sec)
            self.sec += 1
            self.next_at = self.t0 + self.sec + 1

    def finish(self, now: float) -> None:
        self.catch_up(now)
        self._emit(self.sec)
