"""The request/response engines' base, :class:`AsyncFleet`: HTTP and CoAP devices posting to ThingsBoard's
``/api/v1/{token}/telemetry`` on the shared schedule, one asyncio loop **in the calling thread**, at most
``max_inflight`` requests in flight per device (a full device keeps its due messages in a backlog; they go out
late). ``failed`` counts refusals, error answers, timeouts and lost connections, broken down by cause in
:class:`RequestTotals`; ``scheduled == sent + failed + dropped`` and ``sent == acked + unacked``.
"""
from __future__ import annotations

import asyncio
import logging
import threading
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from monsoon.load.base import FleetOptions, PacedFleet
from monsoon.load.stats import FleetTotals, SecondStats
from monsoon.stack.provision import Device


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


class AsyncFleet(PacedFleet):
    """Base of the request/response fleets; subclasses implement the transport hooks
    ``_open`` (create clients, check the endpoint), ``_deliver`` (one request) and ``_shut``."""

    transport = "?"
    DEFAULT_MAX_INFLIGHT = 8
    POLL_S = 0.1             # longest sleep: how fast stop / close() are noticed

    def __init__(self, devices: list[Device], host: str, port: int, options: FleetOptions | None = None,
                 **fields: Any) -> None:
        super().__init__(devices, host, port, options, **fields)
        o = self.options
        max_inflight = self.DEFAULT_MAX_INFLIGHT if o.max_inflight is None else o.max_inflight
        if isinstance(max_inflight, bool) or not isinstance(max_inflight, int) or max_inflight < 1:
            raise ValueError(f"max_inflight must be an integer >= 1, got {max_inflight!r}")
        if not o.request_timeout_s > 0:
            raise ValueError(f"request_timeout_s must be > 0, got {o.request_timeout_s!r}")
        self.max_inflight = max_inflight
        self.request_timeout_s = float(o.request_timeout_s)
        self.connect_timeout_s = float(o.connect_timeout_s)
        self._devs = [_Dev(i, d, self.payload.renderer(i, d.name)) for i, d in enumerate(self.devices)]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()
        self._waiter: asyncio.Future | None = None
        self._wake_on_empty = False       # the drain waits for the last answer
        self._inflight = 0
        self._queued = 0                  # messages in the devices' backlogs
        self._started = 0                 # requests started
        self._late = 0
        self._held = 0      # late sends that waited in their device's backlog for a free slot
        self._backlog_dropped = 0
        self._draining = False            # stop set / gave up: backlogs are no longer worked off
        self._failed_async = 0
        self._failures: Counter[str] = Counter()
        self._n_connected = len(self._devs)   # devices whose last request got an answer (or that sent nothing yet)
        self._opened = False

    # ------------------------------------------------------------ transport hooks
    async def _open(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    async def _deliver(self, dev: _Dev, payload: bytes) -> str | None:  # pragma: no cover - abstract
        """Send one message; None when acked, else the failure's cause (e.g. ``"http 401"``).
        Raising counts as a connection failure; the caller applies the request timeout."""
        raise NotImplementedError

    async def _shut(self) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    # -------------------------------------------------------------------- connect
    def _ensure_loop(self) -> asyncio.AbstractEventLoop:
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop

    def connect(self, timeout: float | None = None) -> None:
        """Create the clients and check the endpoint answers; raises :class:`FleetConnectError`
        naming the endpoint (and leaves nothing open) when it does not."""
        self._check_open()
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
    def _ready(self) -> bool:
        return self._opened

    def _run(self, stop: threading.Event, on_second: Callable[[SecondStats], None] | None) -> RequestTotals:
        assert self._loop is not None
        return self._loop.run_until_complete(self._run_async(stop, on_second))

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

    def _start(self, dev: _Dev, intended: float, waited: bool = False) -> None:
        """Send one message of ``dev`` now: its seq, payload and request (counted late if overdue; ``waited``:
        it waited in the device's backlog for a free slot, so its lateness is the platform's, counted held too)."""
        now = self._clock()
        if now - intended > self.late_tolerance_s:
            self._late += 1
            if waited:
                self._held += 1
        self._started += 1
        seq = dev.next_seq
        dev.next_seq = seq + 1
        ts = self._stamp(dev, intended)
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
            self._start(dev, dev.backlog.popleft(), waited=True)
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
            except Exception as e:  # any transport error fails this one message
                cause, conn_ok = f"connection {type(e).__name__}", False
                log.debug("%s request of %s failed: %r", self.transport, dev.device.name, e)
            now = self._clock()
            if conn_ok != dev.up:
                dev.up = conn_ok
                self._n_connected += 1 if conn_ok else -1
            if cause is None:
                self._record_ack(dev.device.name, seq, intended, ts, now)
            else:
                self._failed_async += 1
                self._failures[cause] += 1
        finally:
            if cancelled:
                dev.inflight -= 1
                self._inflight -= 1
            else:
                self._finish(dev)

    async def _run_async(self, stop: threading.Event,
                         on_second: Callable[[SecondStats], None] | None) -> RequestTotals:
        clock = self._clock
        pacer, targets = self._start_pacing()
        t0 = self._t0
        tick = self._ticker(targets, lambda: (pacer.scheduled, self._started - self._failed_async, self._acked,
                                              pacer.failed + self._failed_async, self._late, self._held),
                            on_second)

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
            self._close_writers()

        p50, p99, mx = self._latency_ms()
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
    def _teardown(self) -> None:
        """Every request cancelled, every connection and the event loop closed."""
        try:
            if self._loop is not None and not self._loop.is_closed():
                try:
                    self._loop.run_until_complete(self._cancel_inflight())
                    self._loop.run_until_complete(self._shut())
                finally:
                    self._loop.run_until_complete(self._loop.shutdown_asyncgens())
                    self._loop.close()
        finally:
            self._opened = False
