"""The one type of every load engine: :class:`Fleet` (what a run drives), :class:`FleetOptions` (what a fleet
is asked to do, one dataclass for every engine) and :class:`FleetBase` (the lifecycle they share: validation,
``run`` once, ``close``, the acked dataset's writer, the latency log). :class:`PacedFleet` adds what the
in-process engines (paho MQTT, HTTP, CoAP) share: a :class:`~monsoon.load.schedule.Pacer` on their own clock,
the per-second :class:`~monsoon.load.stats.SecondTicker` and the latency histograms."""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

from monsoon.load.payloads import Payload
from monsoon.load.schedule import Pacer, Schedule
from monsoon.load.shapes import LoadShape
from monsoon.load.stats import FleetTotals, SecondStats, SecondTicker, _pct_ms, acked_parts, flush_acked
from monsoon.stack.provision import Device
from monsoon.timeline.columnar import PartWriter
from monsoon.timeline.hdrlog import HIST_MAX_US, IntervalLogWriter, new_histogram


__all__ = ["Fleet", "FleetBase", "FleetOptions", "PacedFleet"]


class Fleet(Protocol):
    """What the harness, the calibration and the benchmarks drive: ``connect()`` every device, ``run()`` the
    shape once (one :class:`SecondStats` per second to ``on_second``), ``close()`` (idempotent, from any
    thread). ``extra``: an engine's own results of the run (the native workers' CPU, send lateness)."""

    devices: list[Device]
    acked_path: Path
    extra: dict[str, Any]

    @property
    def connected(self) -> int: ...

    @property
    def endpoint(self) -> str: ...

    def connect(self, timeout: float = 30) -> None: ...

    def run(self, stop: threading.Event, on_second: Callable[[SecondStats], None] | None = None) -> FleetTotals: ...

    def close(self, timeout: float = 30.0) -> None: ...


@dataclass(frozen=True)
class FleetOptions:
    """What a fleet is asked to do. The first fields apply to every engine; the rest to the engines named in
    their comments (the others ignore them). ``clock``/``wall`` are the in-process engines' (the native workers
    keep their own time)."""

    shape: LoadShape
    acked_path: Path | None = None                  # the acked dataset (required by every fleet)
    topic: str = "v1/devices/me/telemetry"          # MQTT
    qos: int = 1                                    # MQTT: 0 or 1 (a request is always answered)
    latency_log_path: Path | None = None            # per-second HdrHistograms of ack latency (latency.hlog)
    payload: Payload | None = None                  # None: the minimal payload
    late_tolerance_s: float = 0.05
    drain_timeout_s: float = 5.0
    keepalive: int = 15                             # MQTT
    clock: Callable[[], float] = time.monotonic     # in-process engines
    wall: Callable[[], float] = time.time           # in-process engines
    # HTTP and CoAP
    max_inflight: int | None = None                 # per device; None = the engine's DEFAULT_MAX_INFLIGHT
    request_timeout_s: float = 10.0
    connect_timeout_s: float = 10.0
    confirmable: bool = True                        # CoAP
    # Hono's command flow (hono-http): weights of the message kinds telemetry, event, command (monsoon.load.hono)
    legs: Mapping[str, float] | None = None
    # native and kubernetes (monsoon-loadgen)
    workers: int = 1
    source_addrs: Sequence[str] = ()
    connect_rate: float = 0.0
    binary: Path | None = None
    batch_ms: float | None = None
    max_pending_connects: int | None = None
    run_id: str | None = None                       # kubernetes
    experiment: str | None = None                   # kubernetes


class FleetBase:
    """The lifecycle every engine shares. ``Fleet(devices, host, port, options)`` or, the same,
    ``Fleet(devices, host, port, shape=..., acked_path=..., ...)`` (the fields of :class:`FleetOptions`).

    An engine implements ``_ready()`` (connected?), ``connect()``, ``_run(stop, on_second)`` and
    ``_teardown()`` (what ``close()`` stops); ``run()`` and ``close()`` are here."""

    def __init__(self, devices: list[Device], host: str, port: int, options: FleetOptions | None = None,
                 **fields: Any) -> None:
        if options is None:
            options = FleetOptions(**fields)
        elif fields:
            options = dataclasses.replace(options, **fields)
        if not devices:
            raise ValueError("devices must not be empty")
        names = [d.name for d in devices]
        if len(set(names)) != len(names):
            raise ValueError("device names must be unique")
        if options.acked_path is None:
            raise ValueError("acked_path is required (the acked dataset)")
        if options.qos not in (0, 1):
            raise ValueError(f"qos must be 0 or 1, got {options.qos!r}")
        self.options = options
        self.devices = list(devices)
        self.host = host
        self.port = int(port)
        self.topic = options.topic
        self.qos = options.qos
        self.shape = options.shape
        self.acked_path = Path(options.acked_path)
        self.latency_log_path = None if options.latency_log_path is None else Path(options.latency_log_path)
        self.payload = options.payload if options.payload is not None else Payload()
        self.late_tolerance_s = options.late_tolerance_s
        self.keepalive = options.keepalive
        self.drain_timeout_s = options.drain_timeout_s
        #: an engine's own results of the last run (native: send lateness, worker pids and CPU)
        self.extra: dict[str, Any] = {}
        self._n_connected = 0
        self._lock = threading.Lock()
        self._closing = False
        self._closed = False
        self._ran = False
        self._idle = threading.Event()
        self._idle.set()
        self._acked_rows: list[tuple] = []          # this second's acks, handed to the parts each second
        self._acked_parts: PartWriter | None = None
        self._hlog: IntervalLogWriter | None = None

    # ---------------------------------------------------------------- props
    @property
    def connected(self) -> int:
        return self._n_connected

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    # ------------------------------------------------------------ the engine's
    def _ready(self) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def connect(self, timeout: float = 30) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _run(self, stop: threading.Event, on_second: Callable[[SecondStats], None] | None) -> FleetTotals:
        raise NotImplementedError  # pragma: no cover - abstract

    def _teardown(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    # ------------------------------------------------------------ lifecycle
    def _check_open(self) -> None:
        if self._closed or self._closing:
            raise RuntimeError("fleet is closed")

    def run(self, stop: threading.Event, on_second: Callable[[SecondStats], None] | None = None) -> FleetTotals:
        """Run the shape to its end (or until ``stop`` is set), then wait up to ``drain_timeout_s`` for the
        acks still outstanding. One run per fleet; connects first if ``connect()`` was not called."""
        with self._lock:
            self._check_open()
            if self._ran:
                raise RuntimeError(f"{type(self).__name__}.run() can only be called once")
            self._ran = True
            self._idle.clear()
        try:
            if not self._ready():
                self.connect()
            return self._run(stop, on_second)
        finally:
            self._idle.set()

    def close(self, timeout: float = 30.0) -> None:
        """Stop a running ``run()`` (waiting for it), then what the engine holds (connections, workers).
        Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closing = True
        if not self._idle.wait(timeout):
            raise RuntimeError(f"{type(self).__name__}.run() did not stop within {timeout:g}s")
        try:
            self._teardown()
        finally:
            self._closing = True
            self._closed = True
            self._close_writers()

    def __enter__(self) -> FleetBase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------ the run's files
    def _open_acked(self) -> PartWriter:
        """The acked dataset, started afresh."""
        self.acked_path.parent.mkdir(parents=True, exist_ok=True)
        self._acked_parts = acked_parts(self.acked_path)
        return self._acked_parts

    def _open_hlog(self, start_wall_s: float) -> None:
        """The latency log (when asked for), its intervals counted from ``start_wall_s``."""
        if self.latency_log_path is not None:
            self._hlog = IntervalLogWriter(self.latency_log_path, start_wall_s)

    def _flush_acked(self) -> None:
        flush_acked(self._acked_parts, self._acked_rows)

    def _close_writers(self) -> None:
        """The acks not yet written as a last part, both files closed (every exit path: idempotent)."""
        try:
            if self._acked_parts is not None:
                self._flush_acked()
                self._acked_parts.close()
                self._acked_parts = None
        finally:
            if self._hlog is not None:
                self._hlog.close()
                self._hlog = None


class PacedFleet(FleetBase):
    """An in-process engine: a :class:`Pacer` over the schedule on ``clock``, a :class:`SecondTicker` writing
    each second, latency from the *intended* send time into per-second histograms."""

    MAX_BATCH: ClassVar[int] = 500      # messages taken off the schedule before the loop lets acks in

    def __init__(self, devices: list[Device], host: str, port: int, options: FleetOptions | None = None,
                 **fields: Any) -> None:
        super().__init__(devices, host, port, options, **fields)
        self._clock = self.options.clock
        self._wall = self.options.wall
        self._acked = 0
        self._t0 = 0.0
        self._wall0_ms = 0.0
        self._hist_sec = new_histogram()
        self._hist_total = new_histogram()

    def _start_pacing(self) -> tuple[Pacer, list[float]]:
        """The run's start: the writers open, ``t0`` taken, the pacer and each second's target."""
        self._open_acked()
        schedule = Schedule(self.shape)
        targets = schedule.expected_per_second()   # before t0: it walks the shape
        self._t0 = t0 = self._clock()
        self._wall0_ms = self._wall() * 1000.0
        self._open_hlog(self._wall0_ms / 1000.0)
        return Pacer(schedule, t0, clock=self._clock, late_tolerance=self.late_tolerance_s), targets

    def _ticker(self, targets: list[float], counters: Callable[[], tuple[int, ...]],
                on_second: Callable[[SecondStats], None] | None) -> SecondTicker:
        return SecondTicker(self._t0, targets, counters, lambda: self._n_connected, self._hist_sec,
                            self._hist_total, self._hlog, self._flush_acked, on_second)

    def _stamp(self, dev: Any, intended: float) -> int:
        """The message's ``ts`` (wall ms of its intended time), strictly increasing per device."""
        ts = int(self._wall0_ms + (intended - self._t0) * 1000.0)
        if ts <= dev.last_ts:
            ts = dev.last_ts + 1
        dev.last_ts = ts
        return ts

    def _record_ack(self, name: str, seq: int, intended: float, ts: int, now: float) -> None:
        """One ack: counted, its latency from the intended time, its row for the acked dataset."""
        self._acked += 1
        us = int((now - intended) * 1_000_000)
        self._hist_sec.record_value(1 if us < 1 else (us if us < HIST_MAX_US else HIST_MAX_US))
        self._acked_rows.append((name, seq, ts, int(self._wall() * 1000)))

    def _latency_ms(self) -> tuple[float | None, float | None, float | None]:
        """p50, p99 and max of the whole run (the last second's histogram added)."""
        if self._hist_sec.get_total_count():
            self._hist_total.add(self._hist_sec)
            self._hist_sec.reset()
        return _pct_ms(self._hist_total)
