"""The CoAP fleets: :class:`CoapFleet`, a confirmable POST per message (ThingsBoard's device path) on the shared
async schedule, and :class:`HonoCoapFleet`, Eclipse Hono's CoAP adapter over DTLS with a pre-shared key:
telemetry, events and command round trips measured leg by leg (:class:`~monsoon.load.hono.HonoLegs`)."""
from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import aiocoap
import aiocoap.defaults
from aiocoap import GET, POST, Message, Reliable, Unreliable

from monsoon.load.aio import AsyncFleet, _Dev
from monsoon.load.base import FleetOptions
from monsoon.load.hono import _KIND, HonoLegs
from monsoon.load.http import telemetry_path
from monsoon.load.stats import FleetConnectError
from monsoon.stack.provision import Device, psk_key


__all__ = ["DTLS_HINT", "CoapFleet", "HonoCoapFleet", "command_response_path", "dtls_missing"]

#: how to get CoAP over DTLS when aiocoap's tinydtls transport cannot load
DTLS_HINT = ("CoAP over DTLS needs the DTLSSocket package (aiocoap's tinydtls transport, built from source: "
             "apt-get install -y autoconf automake, then: make dtls, or pip install DTLSSocket==0.2.3)")


def dtls_missing() -> str | None:
    """None when aiocoap can speak coaps:// with a PSK here, else one line saying what is missing and how to get it."""
    missing = aiocoap.defaults.dtls_missing_modules()
    return f"{DTLS_HINT} (missing: {', '.join(missing)})" if missing else None


class CoapFleet(AsyncFleet):
    """Devices posting confirmable CoAP requests (aiocoap), each device its own client context (UDP
    socket): one CoAP endpoint per device, as real devices are.

    ``max_inflight`` defaults to 1: CoAP's NSTART = 1 allows one outstanding confirmable exchange per
    endpoint pair and aiocoap queues the rest inside the library, which would hide the wait from the
    late count. ``confirmable=False`` sends non-confirmable requests (the answer still acks)."""

    transport = "coap"
    DEFAULT_MAX_INFLIGHT = 1
    CONTENT_FORMAT_JSON = 50
    SCHEME = "coap"
    CLIENT_TRANSPORTS = ["udp6"]
    PROBE_EVERY_DEVICE = False      # True: every device's context answers the probe (its DTLS handshake first)

    def __init__(self, devices: list[Device], host: str, port: int, options: FleetOptions | None = None,
                 **fields: Any) -> None:
        super().__init__(devices, host, port, options, **fields)
        self.confirmable = self.options.confirmable
        self._ctxs: list[Any] = []
        self._post: Any = None
        self._tuning: Any = None

    @property
    def uri_base(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.SCHEME}://{host}:{self.port}"

    async def _context(self, dev: _Dev) -> Any:
        """One device's client context (its own socket)."""
        return await aiocoap.Context.create_client_context(loggername=f"coap-{dev.device.name}",
                                                           transports=self.CLIENT_TRANSPORTS)

    def _targets(self) -> None:
        for d, ctx in zip(self._devs, self._ctxs):
            m = Message(code=POST, uri=self.uri_base + telemetry_path(d.device.token))
            # [context, Uri-Path, remote]: the remote is resolved by the first request, then reused
            # (aiocoap would otherwise resolve and route-check host:port for every message)
            d.target = [ctx, m.opt.uri_path, m.remote]

    async def _open(self) -> None:
        self._ctxs = list(await asyncio.gather(*(self._context(d) for d in self._devs)))
        self._post, self._tuning = POST, (Reliable if self.confirmable else Unreliable)
        self._targets()
        await self._probe(self._ctxs if self.PROBE_EVERY_DEVICE else self._ctxs[:1])

    async def _probe(self, ctxs: list[Any]) -> None:
        """The endpoint answers each of ``ctxs`` something (any code): a GET of /.well-known/core (over DTLS,
        the handshake with each device's key first)."""
        async def one(ctx: Any) -> None:
            await ctx.request(Message(code=GET, transport_tuning=Reliable,
                                      uri=self.uri_base + "/.well-known/core")).response
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await asyncio.gather(*(one(c) for c in ctxs))
        except TimeoutError:
            raise FleetConnectError(f"CoAP endpoint {self.uri_base}: no answer within {self.connect_timeout_s:g}s") from None
        except aiocoap.error.Error as e:
            raise FleetConnectError(f"CoAP endpoint {self.uri_base}: {type(e).__name__}: {e}") from None

    async def _deliver(self, dev: _Dev, payload: bytes) -> str | None:

        target = dev.target
        msg = Message(code=self._post, payload=payload, transport_tuning=self._tuning,
                      uri_path=target[1], content_format=self.CONTENT_FORMAT_JSON)
        msg.remote = target[2]
        req = target[0].request(msg)
        try:
            resp = await req.response
        except asyncio.CancelledError:
            req.response.cancel()
            raise
        if target[2] is not msg.remote:
            target[2] = msg.remote           # now the resolved UDP endpoint
        code = resp.code
        return None if code.is_successful() else f"coap {code.dotted}"

    async def _shut(self) -> None:
        ctxs, self._ctxs = self._ctxs, []
        if ctxs:
            await asyncio.gather(*(c.shutdown() for c in ctxs), return_exceptions=True)


class HonoCoapFleet(HonoLegs, CoapFleet):
    """Devices on Hono's CoAP adapter, as in Hono's own CoAP load test: DTLS with a pre-shared key (identity
    ``<auth-id>@<tenant>`` = ``Device.token``, key = ``psk_key(Device.password)``, the registry's ``psk`` credential),
    through aiocoap's tinydtls transport; every request confirmable (QoS 1: the adapter answers 2.04 only after
    Kafka took it).

    * ``telemetry``: ``POST /telemetry``; ``event``: ``POST /event``;
    * ``command``: ``POST /telemetry?hono-ttd=5``: 2.04 with the command and its ``Location-Path``
      (``command_response/<req-id>``), or 2.04 without one when the ttd ended (:data:`NO_COMMAND`): only the
      ``Location-Path`` tells them apart (Hono 2.6.0 answers CHANGED either way); the device then
      answers ``POST /command_response/<req-id>?hono-cmd-status=200``.

    Errors count by CoAP code (``coap 5.03``), ``timeout`` or ``connection <error>``. ``max_inflight`` defaults
    to 4 (measured on the real adapter: 16 made every leg's p50 ~4.5 s, the requests queueing inside aiocoap);
    a command query can hold its exchange up to the ttd; beyond NSTART = 1, aiocoap queues a device's
    confirmable requests until the adapter's ACK (piggybacked, or empty after its 500 ms ``timeoutToAck``), and
    that wait is in the leg's round trip."""

    transport = "hono-coap"
    DEFAULT_MAX_INFLIGHT = 4
    SCHEME = "coaps"
    CLIENT_TRANSPORTS = ["tinydtls"]
    PROBE_EVERY_DEVICE = True       # every device's DTLS handshake before the load, as MQTT devices connect first

    async def _context(self, dev: _Dev) -> Any:
        ctx = await super()._context(dev)
        d = dev.device
        ctx.client_credentials.load_from_dict({self.uri_base + "/*": {"dtls": {
            "psk": psk_key(d.password or ""), "client-identity": d.token.encode()}}})
        return ctx

    def _targets(self) -> None:
        for d, ctx in zip(self._devs, self._ctxs):
            d.target = ctx

    async def _open(self) -> None:
        missing = dtls_missing() if "tinydtls" in self.CLIENT_TRANSPORTS else None   # a plain coap:// twin needs none
        if missing:
            raise FleetConnectError(missing)
        await super()._open()

    async def _leg(self, dev: _Dev, leg: str, path: str, payload: bytes, timeout: float,
                   query: str = "") -> tuple[str | None, Any]:
        """One leg's confirmable POST, recorded in the leg: (None, response) on 2.xx, else (cause, response or
        None): ``coap 5.03``, ``timeout``, ``connection <error>``."""
        t0 = self._clock()
        uri = f"{self.uri_base}/{path}" + (f"?{query}" if query else "")
        req = dev.target.request(Message(code=POST, transport_tuning=Reliable, payload=payload, uri=uri,
                                         content_format=self.CONTENT_FORMAT_JSON))
        try:
            async with asyncio.timeout(timeout):
                resp = await req.response
        except TimeoutError:
            req.response.cancel()
            self.recorder.error(leg, "timeout")
            return "timeout", None
        except asyncio.CancelledError:
            req.response.cancel()
            raise
        except aiocoap.error.Error as e:
            cause = f"connection {type(e).__name__}"
            self.recorder.error(leg, cause)
            return cause, None
        code = resp.code
        label = f"coap {code.dotted}"
        self._outcome(leg, t0, label, code.is_successful(), command=bool(resp.opt.location_path))
        return (None if code.is_successful() else label), resp

    async def _deliver(self, dev: _Dev, payload: bytes) -> str | None:
        kind = _KIND.get()
        if kind != "command":
            return (await self._leg(dev, kind, kind, payload, self.leg_timeout_s))[0]
        cause, resp = await self._leg(dev, "command_request", "telemetry", payload, self.leg_timeout_s + self.TTD_S,
                                      f"hono-ttd={self.TTD_S}")
        where = command_response_path(resp.opt.location_path) if cause is None else None
        if where:
            await self._leg(dev, "command_response", where, b'{"done": true}', self.leg_timeout_s,
                            "hono-cmd-status=200")
        return cause


def command_response_path(location_path: tuple[str, ...] | list[str]) -> str | None:
    """Where a device answers the command in a CoAP response: its ``Location-Path``, ``command_response/<req-id>``
    (or ``cr/<req-id>``); None for a one-way command (``command``/``c``) or no command."""
    parts = list(location_path)
    if len(parts) == 2 and parts[0] in ("command_response", "cr") and parts[1]:
        return "/".join(quote(p, safe="") for p in parts)
    return None
