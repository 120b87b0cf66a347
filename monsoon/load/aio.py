"""HTTP and CoAP device fleets: the open-model load of :mod:`monsoon.load` over request/response transports.

Both speak ThingsBoard's device API path, ``POST /api/v1/{token}/telemetry``:

* :class:`HttpFleet` — aiohttp, one ``ClientSession`` whose keep-alive connection pool the devices share;
  a 2xx answer acks the message, anything else (non-2xx, connection error, timeout) fails it.
* :class:`CoapFleet` — aiocoap, one client context (UDP socket, so one CoAP endpoint) per device, a
  confirmable POST to ``coap://HOST:PORT/api/v1/{token}/telemetry``; 2.xx acks, 4.xx/5.xx/timeout fail.
  CoAP allows one outstanding confirmable exchange per endpoint pair (NSTART = 1; aiocoap would queue
  the rest out of sight), hence the default of one request in flight per device.

They share :class:`AsyncFleet`: the same interface as :class:`~monsoon.load.mqtt.MqttFleet` (``connect()``,
``run(stop, on_second) -> FleetTotals``, ``close()``, context manager), the same
:class:`~monsoon.load.schedule.Schedule` / :class:`~monsoon.load.Pacer` (intended send times on an absolute
schedule), the same ``acked`` dataset, ``latency.hlog`` and per-second :class:`~monsoon.load.stats.SecondStats`,
and payloads from :mod:`monsoon.load.payloads`. One asyncio event loop, driven **in the thread that calls
connect()/run()/close()** (no thread of its own).

Open model with a bounded number of requests in flight per device (``max_inflight``): the pacer
takes every message off the schedule when it is due (message k belongs to device k mod n); a device
whose window is full keeps it in its own backlog and sends it the moment an answer frees a slot. A
request is counted ``late`` when it goes out more than ``late_tolerance_s`` after its intended time, so
a stalled server shows as late sends (and latency) instead of slowing the schedule down; one slow
device does not hold the others back. What is still in a backlog when ``stop`` is set, or
``drain_timeout_s`` after the schedule's end, is ``dropped`` (never sent).

Latency is the answer's arrival minus the message's *intended* send time (coordinated omission
corrected), as for MQTT.

Accounting (request/response: an error answer arrives after the message left): ``failed`` counts
messages refused locally plus those answered with an error, timed out or lost with their connection;
``sent`` counts the other requests, so ``scheduled == sent + failed + dropped`` and ``sent == acked +
unacked`` (``unacked``: still unanswered when the drain ended). Per second, ``scheduled`` counts what
the pacer took off the schedule, ``sent`` the requests started (a message in a backlog is sent when it
leaves it) and ``failed`` the errors that arrived, which are also taken off that second's ``sent``: the
per-second sums equal the totals (a second with more errors than new requests has a negative
``sent``). The totals' ``failures`` break the failures down by cause (``http 401``, ``coap 4.01``,
``timeout``, ``connection ClientOSError``: the exception's class, ...).
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monsoon.load.payloads import Payload
from monsoon.load.schedule import Pacer, Schedule
from monsoon.load.shapes import LoadShape
from monsoon.load.stats import FleetTotals, SecondStats, SecondTicker, _pct_ms, acked_parts, flush_acked
from monsoon.stack.provision import Device
from monsoon.timeline.columnar import PartWriter
from monsoon.timeline.hdrlog import HIST_MAX_US, IntervalLogWriter, new_histogram


__all__ = ["AsyncFleet", "RequestTotals"]

log = logging.getLogger("monsoon.transports")


@dataclass
class RequestTotals(FleetTotals):
    """:class:`~monsoon.load.stats.FleetTotals` plus the failures by cause (``"http 401"``, ``"timeout"``, ...)."""

    failures: dict[str, int] = field(default_factory=dict)


class _Dev:
    """One device: its sequence state, its requests in flight, its request target."""

    __slots__ = ("idx", "device", "render", "next_seq", "last_ts", "inflight", "backlog", "up", "target")

    def __init__(self, idx: int, device: Device, render: Callable[[int, int, int], bytes]) -> None:
        self.idx = idx
        self.device = device
        self.render = render
        self.next_seq = 0
        self.last_ts = -1
        self.inflight = 0
        self.backlog: deque[float] = deque()   # intended times of due messages waiting for a free slot
        self.up = True          # False after a connection error / timeout, True again on any answer
        self.target: Any = None


class AsyncFleet:
    """Base of the request/response fleets; subclasses implement the transport hooks
    ``_open`` (create clients, check the endpoint), ``_deliver`` (one request) and ``_shut``."""

    transport = "?"
    DEFAULT_MAX_INFLIGHT = 8
    MAX_BATCH = 500          # messages taken off the schedule before the loop lets answers in
    POLL_S = 0.1             # longest sleep: how fast stop / close() are noticed

    def __init__(
        self,
        devices: list[Device],
        host: str,
        port: int,
        *,
        shape: LoadShape,
        acked_path: Path,
        latency_log_path: Path | None = None,
        payload: Payload | None = None,
        max_inflight: int | None = None,
        request_timeout_s: float = 10.0,
        connect_timeout_s: float = 10.0,
        late_tolerance_s: float = 0.05,
        drain_timeout_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if not devices:
            raise ValueError("devices must not be empty")
        names = [d.name for d in devices]
        if len(set(names)) != len(names):
            raise ValueError("device names must be unique")
        max_inflight = self.DEFAULT_MAX_INFLIGHT if max_inflight is None else max_inflight
        if isinstance(max_inflight, bool) or not isinstance(max_inflight, int) or max_inflight < 1:
            raise ValueError(f"max_inflight must be an integer >= 1, got {max_inflight!r}")
        if not request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0, got {request_timeout_s!r}")
        self.devices = list(devices)
        self.host = host
        self.port = int(port)
        self.shape = shape
        self.acked_path = Path(acked_path)
        self.latency_log_path = None if latency_log_path is None else Path(latency_log_path)
        self.payload = payload if payload is not None else Payload()
        self.max_inflight = max_inflight
        self.request_timeout_s = float(request_timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.late_tolerance_s = late_tolerance_s
        self.drain_timeout_s = drain_timeout_s
        self._clock = clock
        self._wall = wall
        self._devs = [_Dev(i, d, self.payload.renderer(i, d.name)) for i, d in enumerate(self.devices)]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()
        self._waiter: asyncio.Future | None = None
        self._wake_on_empty = False       # the drain waits for the last answer
        self._inflight = 0
        self._queued = 0                  # messages in the devices' backlogs
        self._started = 0                 # requests started
        self._late = 0
        self._backlog_dropped = 0
        self._draining = False            # stop set / gave up: backlogs are no longer worked off
        self._acked = 0
        self._failed_async = 0
        self._failures: Counter[str] = Counter()
        self._n_up = len(self._devs)
        self._opened = False
        self._closing = False
        self._closed = False
        self._ran = False
        self._idle = threading.Event()
        self._idle.set()
        self._lock = threading.Lock()
        self._acked_rows: list[tuple] = []          # this second's acks, handed to the parts each second
        self._acked_parts: PartWriter | None = None
        self._hlog: Any = None
        self._hist_sec = new_histogram()
        self._hist_total = new_histogram()
        self._t0 = 0.0
        self._wall0_ms = 0.0

    # ------------------------------------------------------------ transport hooks
    async def _open(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    async def _deliver(self, dev: _Dev, payload: bytes) -> str | None:  # pragma: no cover - abstract
        """Send one message; None when acked, else the failure's cause (e.g. ``"http 401"``).
        Raising counts as a connection failure; the caller applies the request timeout."""
        raise NotImplementedError

    async def _shut(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    # ---------------------------------------------------------------------- props
    @property
    def connected(self) -> int:
        """Devices whose last request got an answer (or that sent nothing yet)."""
        return self._n_up

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    # -------------------------------------------------------------------- connect
    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop

    def connect(self, timeout: float | None = None) -> None:
        """Create the clients and check the endpoint answers; raises :class:`FleetConnectError`
        naming the endpoint (and leaves nothing open) when it does not."""
        if self._closed or self._closing:
            raise RuntimeError("fleet is closed")
        if self._opened:
            return
        if timeout is not None:
            self.connect_timeout_s = float(timeout)
        loop = self._ensure_loop()
        try:
            loop.run_until_complete(self._open())
        except BaseException:
            loop.run_until_complete(self._shut())
            raise
        self._opened = True

    # ------------------------------------------------------------------------ run
    def run(self, stop: threading.Event, on_second: Callable[[SecondStats], None] | None = None) -> RequestTotals:
        """Run the shape to its end (or until ``stop`` is set), then wait up to ``drain_timeout_s`` for the
        answers still outstanding. One run per fleet; connects first if ``connect()`` was not called."""
        with self._lock:
            if self._closed or self._closing:
                raise RuntimeError("fleet is closed")
            if self._ran:
                raise RuntimeError(f"{type(self).__name__}.run() can only be called once")
            self._ran = True
            self._idle.clear()
        try:
            if not self._opened:
                self.connect()
            assert self._loop is not None
            return self._loop.run_until_complete(self._run(stop, on_second))
        finally:
            self._idle.set()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def _sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``; an answer wakes it early when a wake flag is set."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._waiter = fut
        h = loop.call_later(max(0.0, seconds), self._wake)
        try:
            await fut
        finally:
            h.cancel()
            self._waiter = None

    def _send(self, k: int, intended: float) -> bool:
        """Pacer sink: message ``k`` is due; start it, or queue it while its device's window is full."""
        if self._closing:
            return False
        dev = self._devs[k % len(self._devs)]
        if dev.inflight < self.max_inflight and not dev.backlog:
            self._start(dev, intended)
        else:
            dev.backlog.append(intended)
            self._queued += 1
        return True

    def _start(self, dev: _Dev, intended: float) -> None:
        """Send one message of ``dev`` now: its seq, payload and request (counted late if overdue)."""
        now = self._clock()
        if now - intended > self.late_tolerance_s:
            self._late += 1
        self._started += 1
        seq = dev.next_seq
        dev.next_seq = seq + 1
        ts = int(self._wall0_ms + (intended - self._t0) * 1000.0)
        if ts <= dev.last_ts:
            ts = dev.last_ts + 1
        dev.last_ts = ts
        payload = dev.render(seq, ts, int(self._wall() * 1000))
        dev.inflight += 1
        self._inflight += 1
        self._launch(dev, seq, intended, ts, payload)

    def _launch(self, dev: _Dev, seq: int, intended: float, ts: int, payload: bytes) -> None:
        assert self._loop is not None
        task = self._loop.create_task(self._request(dev, seq, intended, ts, payload))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _finish(self, dev: _Dev) -> None:
        """A request of ``dev`` ended: free its slot for the next message of its backlog."""
        dev.inflight -= 1
        self._inflight -= 1
        if dev.backlog and not self._draining and not self._closing:
            self._queued -= 1
            self._start(dev, dev.backlog.popleft())
        if self._wake_on_empty and self._inflight == 0:
            self._wake()

    def _drop_backlogs(self) -> None:
        """Stop working off the backlogs: what is left was never sent (dropped)."""
        self._draining = True
        for dev in self._devs:
            if dev.backlog:
                self._backlog_dropped += len(dev.backlog)
                self._queued -= len(dev.backlog)
                dev.backlog.clear()

    async def _request(self, dev: _Dev, seq: int, intended: float, ts: int, payload: bytes) -> None:
        cancelled = False
        try:
            try:
                async with asyncio.timeout(self.request_timeout_s):
                    cause = await self._deliver(dev, payload)
                conn_ok = True
            except TimeoutError:
                cause, conn_ok = "timeout", False
            except asyncio.CancelledError:
                cancelled = True              # end of the drain / close(): unacked, not failed
                raise
            except Exception as e:  # noqa: BLE001 - any transport error fails this one message
                cause, conn_ok = f"connection {type(e).__name__}", False
                log.debug("%s request of %s failed: %r", self.transport, dev.device.name, e)
            now = self._clock()
            if conn_ok != dev.up:
                dev.up = conn_ok
                self._n_up += 1 if conn_ok else -1
            if cause is None:
                self._acked += 1
                us = int((now - intended) * 1_000_000)
                self._hist_sec.record_value(1 if us < 1 else (us if us < HIST_MAX_US else HIST_MAX_US))
                self._acked_rows.append((dev.device.name, seq, ts, int(self._wall() * 1000)))
            else:
                self._failed_async += 1
                self._failures[cause] += 1
        finally:
            if cancelled:
                dev.inflight -= 1
                self._inflight -= 1
            else:
                self._finish(dev)

    def _flush_acked(self) -> None:
        flush_acked(self._acked_parts, self._acked_rows)

    async def _run(self, stop: threading.Event, on_second: Callable[[SecondStats], None] | None) -> RequestTotals:
        clock = self._clock
        self.acked_path.parent.mkdir(parents=True, exist_ok=True)
        self._acked_parts = acked_parts(self.acked_path)
        schedule = Schedule(self.shape)
        targets = schedule.expected_per_second()   # before t0: it walks the shape
        self._t0 = t0 = clock()
        self._wall0_ms = self._wall() * 1000.0
        if self.latency_log_path is not None:

            self._hlog = IntervalLogWriter(self.latency_log_path, self._wall0_ms / 1000.0)
        pacer = Pacer(schedule, t0, clock=clock, late_tolerance=self.late_tolerance_s)
        tick = SecondTicker(t0, targets, lambda: (pacer.scheduled, self._started - self._failed_async, self._acked,
                                                  pacer.failed + self._failed_async, self._late),
                            lambda: self._n_up, self._hist_sec, self._hist_total, self._hlog, self._flush_acked, on_second)

        try:
            # --- load phase: take every due message off the schedule (a full device queues it)
            while True:
                now = clock()
                if stop.is_set() or self._closing:
                    pacer.stop(now)
                    self._drop_backlogs()
                    break
                tick.catch_up(now)
                n = pacer.pump(now, self._send, self.MAX_BATCH)
                if pacer.exhausted:
                    break
                if n >= self.MAX_BATCH:
                    await asyncio.sleep(0)       # let answers in while working off a backlog
                    continue
                nd = pacer.next_due
                assert nd is not None
                await self._sleep(min(nd, tick.next_at, now + self.POLL_S) - clock())
            # --- drain: work off the backlogs, wait for the answers still outstanding
            deadline = clock() + self.drain_timeout_s
            self._wake_on_empty = True
            while (self._inflight > 0 or self._queued > 0) and not self._closing:
                now = clock()
                if now >= deadline:
                    break
                if stop.is_set():
                    self._drop_backlogs()
                tick.catch_up(now)
                await self._sleep(min(deadline, tick.next_at, now + self.POLL_S) - clock())
            self._wake_on_empty = False
            self._drop_backlogs()              # never sent: dropped
            await self._cancel_inflight()      # never answered: unacked
            now = clock()
            tick.finish(now)                   # the final (partial) second: per-second sums equal the totals
            elapsed = clock() - t0
        finally:
            self._wake_on_empty = False
            self._flush_acked()
            if self._acked_parts is not None:
                self._acked_parts.close()
                self._acked_parts = None
            if self._hlog is not None:
                self._hlog.close()
                self._hlog = None

        if self._hist_sec.get_total_count():
            self._hist_total.add(self._hist_sec)
            self._hist_sec.reset()
        p50, p99, mx = _pct_ms(self._hist_total)
        sent = self._started - self._failed_async
        return RequestTotals(
            scheduled=pacer.scheduled, sent=sent, acked=self._acked, failed=pacer.failed + self._failed_async,
            late=self._late, dropped=pacer.dropped + self._backlog_dropped, unacked=sent - self._acked,
            last_seq={d.device.name: d.next_seq - 1 for d in self._devs},
            p50_ms=p50, p99_ms=p99, max_ms=mx, elapsed_s=elapsed, failures=dict(self._failures),
        )

    async def _cancel_inflight(self) -> None:
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # ---------------------------------------------------------------------- close
    def close(self, timeout: float = 30.0) -> None:
        """Stop a running ``run()`` (waiting for it), close every connection and the event loop. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closing = True
        if not self._idle.wait(timeout):
            raise RuntimeError(f"{type(self).__name__}.run() did not stop within {timeout:g}s")
        try:
            if self._loop is not None and not self._loop.is_closed():
                try:
                    self._loop.run_until_complete(self._cancel_inflight())
                    self._loop.run_until_complete(self._shut())
                finally:
                    self._loop.run_until_complete(self._loop.shutdown_asyncgens())
                    self._loop.close()
        finally:
            self._closed = True
            self._opened = False
            if self._acked_parts is not None:
                self._flush_acked()
                self._acked_parts.close()
                self._acked_parts = None

    def __enter__(self) -> AsyncFleet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------------------ HTTP


# ------------------------------------------------------------------------------ CoAP


# ------------------------------------------------------------------------------ factory


