"""Eclipse Hono's device side of the command flow, over its HTTP adapter: :class:`HonoHttpFleet`; what Hono's
transports share (the kinds, the legs, their files and outcomes): :class:`HonoLegs` (CoAP: monsoon.load.coap).

Each scheduled message is one of three kinds, picked per device by the weights ``FleetOptions.legs`` (default
telemetry 6 : event 2 : command 2), deterministically (a smooth weighted round robin over the device's
sequence numbers):

* ``telemetry``: ``POST /telemetry`` with ``qos-level: 1`` (Hono answers 202 only after Kafka took it);
* ``event``: ``POST /event`` (always at least once);
* ``command``: a command query, ``POST /telemetry`` with ``hono-ttd``: the adapter holds the request until the
  business application's command arrives (200 with ``hono-command`` and ``hono-cmd-req-id``) or the ttd ends
  (202, no command); the device then answers ``POST /command/res/<req-id>?hono-cmd-status=200``.

Four legs are measured as Hono's CoAP write-up does (``...SendTelemetry``, ``...Event``, ``...CommandRequest``,
``...CommandResponse``): each leg's round trip from its request to its answer in per-second HdrHistograms
(``legs-<leg>.hlog``) and its outcomes per second by code (``legs.json``: ``ok``, ``http 503``, ``timeout``,
``no command`` for a 202 after the ttd, ...). A message is acked when Hono accepted it (any 2xx of its first
request: it is in Kafka), whatever its command legs did; those count in their legs only. Devices authenticate
with HTTP basic auth as ``<auth-id>@<tenant>`` (``Device.token``) and their password.
"""
from __future__ import annotations

import base64
import contextvars
import json
import math
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from hdrh.histogram import HdrHistogram
from yarl import URL

from monsoon.load.aio import AsyncFleet, RequestTotals, _Dev
from monsoon.load.base import FleetOptions
from monsoon.load.http import HttpFleet
from monsoon.load.stats import SecondStats
from monsoon.rundir import LEG_LATENCY_FILE, LEGS_FILE
from monsoon.stack.provision import Device
from monsoon.timeline.hdrlog import HIST_MAX_US, IntervalLogWriter, new_histogram


__all__ = ["DEFAULT_LEGS", "KINDS", "LEGS", "NO_COMMAND", "HonoHttpFleet", "HonoLegs", "HonoTotals", "LegRecorder",
           "leg_cycle"]

KINDS = ("telemetry", "event", "command")                                  # what a message is
LEGS = ("telemetry", "event", "command_request", "command_response")       # what is measured
DEFAULT_LEGS: Mapping[str, float] = {"telemetry": 6, "event": 2, "command": 2}
CYCLE_LEN = 100
NO_COMMAND = "no command"      # a command query answered 202: the ttd ended before a command came

_KIND: contextvars.ContextVar[str] = contextvars.ContextVar("monsoon_hono_kind", default="telemetry")


def leg_cycle(weights: Mapping[str, float] | None, length: int = CYCLE_LEN) -> tuple[str, ...]:
    """The kinds of ``length`` consecutive messages for ``weights`` (kind -> weight >= 0), by smooth weighted
    round robin: each kind's share within 1/length of its weight's, evenly spread. Raises ``ValueError``
    naming a bad kind or weight."""
    w = dict(DEFAULT_LEGS if weights is None else weights)
    for k, v in w.items():
        if k not in KINDS:
            raise ValueError(f"legs: unknown kind {k!r} (use: {', '.join(KINDS)})")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"legs: the weight of {k} must be a number >= 0, got {v!r}")
    total = float(sum(w.values()))
    if total <= 0:
        raise ValueError("legs: at least one weight must be > 0")
    current = dict.fromkeys(w, 0.0)
    out = []
    for _ in range(length):
        for k in w:
            current[k] += w[k]
        pick = max(w, key=lambda k: current[k])
        current[pick] -= total
        out.append(pick)
    return tuple(out)


class _Leg:
    __slots__ = ("name", "hist_sec", "hist_total", "ok", "codes", "sec_codes", "seconds", "hlog")

    def __init__(self, name: str) -> None:
        self.name = name
        self.hist_sec = new_histogram()
        self.hist_total = new_histogram()
        self.ok = 0
        self.codes: Counter[str] = Counter()        # the run's outcomes other than ok
        self.sec_codes: Counter[str] = Counter()    # this second's outcomes, ok included
        self.seconds: list[list[Any]] = []          # [sec, {outcome: n}] for every second with an outcome
        self.hlog: IntervalLogWriter | None = None


class LegRecorder:
    """The legs of a request/response flow: each leg's round trips (µs, into per-second HdrHistograms written to
    ``legs-<leg>.hlog``) and outcomes by code per second; ``summary()`` for the run, ``write()`` for
    ``legs.json``. ``second()`` closes one load second (the fleet's ticker calls it through its flush)."""

    def __init__(self, legs: tuple[str, ...] = LEGS) -> None:
        self.legs = {n: _Leg(n) for n in legs}
        self.sec = 0
        self.dir: Path | None = None

    def open(self, out_dir: Path, start_wall_s: float) -> None:
        self.dir = Path(out_dir)
        for leg in self.legs.values():
            leg.hlog = IntervalLogWriter(self.dir / LEG_LATENCY_FILE.format(leg=leg.name), start_wall_s)

    def ok(self, leg: str, seconds: float) -> None:
        lg = self.legs[leg]
        us = int(seconds * 1_000_000)
        lg.hist_sec.record_value(1 if us < 1 else (us if us < HIST_MAX_US else HIST_MAX_US))
        lg.ok += 1
        lg.sec_codes["ok"] += 1

    def error(self, leg: str, code: str) -> None:
        lg = self.legs[leg]
        lg.codes[code] += 1
        lg.sec_codes[code] += 1

    def add(self, leg: str, ok: int, codes: Mapping[str, int], hist: HdrHistogram | None) -> None:
        """Outcomes recorded elsewhere (a native worker's second): ``ok`` answers with their round trips in
        ``hist``, and the errors by code."""
        lg = self.legs[leg]
        lg.ok += ok
        if ok:
            lg.sec_codes["ok"] += ok
        for code, n in codes.items():
            lg.codes[code] += n
            lg.sec_codes[code] += n
        if hist is not None:
            lg.hist_sec.add(hist)

    def second(self) -> None:
        s = self.sec
        self.sec += 1
        for lg in self.legs.values():
            if lg.hist_sec.get_total_count():
                if lg.hlog is not None:
                    lg.hlog.write(s, lg.hist_sec)
                lg.hist_total.add(lg.hist_sec)
                lg.hist_sec.reset()
            if lg.sec_codes:
                lg.seconds.append([s, dict(lg.sec_codes)])
                lg.sec_codes.clear()

    def summary(self) -> dict[str, dict[str, Any]]:
        """Per leg: ``ok``, ``failed``, ``errors`` by code and the round trip's p50/p99/p99.9/max in ms (None
        without a success)."""
        out: dict[str, dict[str, Any]] = {}
        for lg in self.legs.values():
            h = new_histogram()
            h.add(lg.hist_total)
            h.add(lg.hist_sec)
            n = h.get_total_count()
            pct = {f"{k}_ms": (round(h.get_value_at_percentile(q) / 1000.0, 3) if n else None)
                   for k, q in (("p50", 50), ("p99", 99), ("p999", 99.9))}
            out[lg.name] = {"ok": lg.ok, "failed": sum(lg.codes.values()), "errors": dict(lg.codes), **pct,
                            "max_ms": round(h.get_max_value() / 1000.0, 3) if n else None}
        return out

    def write(self) -> None:
        """``legs.json`` (the summary and every second's outcomes); the hlogs closed. Idempotent."""
        if self.dir is None:
            return
        doc = {"legs": {name: {"summary": s, "seconds": self.legs[name].seconds}
                        for name, s in self.summary().items()}}
        tmp = self.dir / (LEGS_FILE + ".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(self.dir / LEGS_FILE)
        for lg in self.legs.values():
            if lg.hlog is not None:
                lg.hlog.close()
                lg.hlog = None


@dataclass
class HonoTotals(RequestTotals):
    """:class:`~monsoon.load.aio.RequestTotals` plus each leg's :meth:`LegRecorder.summary`."""

    legs: dict[str, dict[str, Any]] = field(default_factory=dict)


class HonoLegs(AsyncFleet):
    """What Hono's device transports share (HTTP here, CoAP in :mod:`monsoon.load.coap`): each message's kind from
    ``legs`` (:func:`leg_cycle`), the legs' :class:`LegRecorder` and files, and the outcome of one leg's request.
    A subclass puts it before its transport's fleet (``class HonoHttpFleet(HonoLegs, HttpFleet)``) and implements
    ``_deliver`` with :data:`_KIND`'s kind."""

    TTD_S = 5               # hono-ttd of a command query: how long the adapter holds it for a command

    def __init__(self, devices: list[Device], host: str, port: int, options: FleetOptions | None = None,
                 **fields: Any) -> None:
        super().__init__(devices, host, port, options, **fields)
        self.cycle = leg_cycle(self.options.legs)
        self.recorder = LegRecorder()
        self.leg_timeout_s = self.request_timeout_s
        # the whole message (a query held up to the ttd, then the response) within one outer timeout
        self.request_timeout_s = 2 * self.leg_timeout_s + self.TTD_S

    def _launch(self, dev: _Dev, seq: int, intended: float, ts: int, payload: bytes) -> None:
        # the message's kind, for _deliver (a task runs in a copy of the context it was created in)
        _KIND.set(self.cycle[(seq + dev.idx) % len(self.cycle)])
        super()._launch(dev, seq, intended, ts, payload)

    def _outcome(self, leg: str, t0: float, code: str, success: bool, command: bool = False) -> None:
        """One leg's answer into its leg: ``success`` (a 2xx / 2.xx ``code``) is ok, except a command query
        answered without a command (:data:`NO_COMMAND`); anything else counts under ``code``."""
        if success and (command or leg != "command_request"):
            self.recorder.ok(leg, self._clock() - t0)
        else:
            self.recorder.error(leg, NO_COMMAND if success else code)

    # ---------------------------------------------------------------- the legs' files
    def _open_hlog(self, start_wall_s: float) -> None:
        super()._open_hlog(start_wall_s)
        self.recorder.open(self.acked_path.parent, start_wall_s)

    def _flush_acked(self) -> None:
        super()._flush_acked()
        self.recorder.second()     # once per load second (the ticker's flush; the last flush adds an empty one)

    def _run(self, stop: Any, on_second: Callable[[SecondStats], None] | None) -> HonoTotals:
        try:
            totals = super()._run(stop, on_second)
        finally:
            self.recorder.write()
        self.extra["legs"] = legs = self.recorder.summary()
        return HonoTotals(**vars(totals), legs=legs)


class HonoHttpFleet(HonoLegs, HttpFleet):
    """Devices on Hono's HTTP adapter sending telemetry, events and command queries (see the module)."""

    transport = "hono-http"
    # a query without a command holds its slot for the whole ttd: at 1 query/s per device 8 slots ran full
    # (hono-cold-warm: a third of the messages left late)
    DEFAULT_MAX_INFLIGHT = 16

    def __init__(self, devices: list[Device], host: str, port: int, options: FleetOptions | None = None,
                 **fields: Any) -> None:
        super().__init__(devices, host, port, options, **fields)
        self._auth: list[str] = []
        self._urls: dict[str, URL] = {}

    async def _open(self) -> None:
        await super()._open()
        base = URL.build(scheme="http", host=self.host, port=self.port)
        self._urls = {"telemetry": base / "telemetry", "event": base / "event"}
        self._auth = ["Basic " + base64.b64encode(f"{d.device.token}:{d.device.password or ''}".encode()).decode()
                      for d in self._devs]

    async def _post(self, leg: str, url: URL | str, headers: dict[str, str], payload: bytes,
                    timeout: float) -> tuple[int | str, Any]:
        """One leg's request, recorded in the leg: (status, response headers), or (cause, None) when it got no
        answer (``timeout``, ``connection <error>``: recorded, not raised)."""
        t0 = self._clock()
        try:
            async with self._session.post(url, data=payload, headers=headers,
                                          timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
                await resp.read()
                status, rh = resp.status, resp.headers
        except TimeoutError:
            self.recorder.error(leg, "timeout")
            return "timeout", None
        except aiohttp.ClientError as e:
            cause = f"connection {type(e).__name__}"
            self.recorder.error(leg, cause)
            return cause, None
        self._outcome(leg, t0, f"http {status}", 200 <= status < 300, command=status == 200)
        return status, rh

    async def _deliver(self, dev: _Dev, payload: bytes) -> str | None:
        kind = _KIND.get()
        auth = self._auth[dev.idx]
        headers = {"Content-Type": "application/json", "Authorization": auth}
        if kind == "event":
            r = await self._post("event", self._urls["event"], headers, payload, self.leg_timeout_s)
        elif kind == "telemetry":
            headers["QoS-Level"] = "1"
            r = await self._post("telemetry", self._urls["telemetry"], headers, payload, self.leg_timeout_s)
        else:
            headers["QoS-Level"] = "1"
            headers["hono-ttd"] = str(self.TTD_S)
            r = await self._post("command_request", self._urls["telemetry"], headers, payload,
                                 self.leg_timeout_s + self.TTD_S)
            req_id = r[1].get("hono-cmd-req-id") if r[0] == 200 else None
            if req_id:
                url = URL.build(scheme="http", host=self.host, port=self.port,
                                path=f"/command/res/{req_id}", query={"hono-cmd-status": "200"})
                await self._post("command_response", url, {"Content-Type": "application/json",
                                                            "Authorization": auth},
                                 b'{"done": true}', self.leg_timeout_s)
        status = r[0]
        if isinstance(status, str):
            return status
        return None if 200 <= status < 300 else f"http {status}"
