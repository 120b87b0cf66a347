"""The CoAP fleet: a confirmable POST per message (Hono-style adapter) on the shared async schedule."""
from __future__ import annotations

import asyncio
from typing import Any

import aiocoap
from aiocoap import GET, POST, Message, Reliable, Unreliable

from monsoon.load.aio import AsyncFleet, _Dev
from monsoon.load.base import FleetOptions
from monsoon.load.http import telemetry_path
from monsoon.load.stats import FleetConnectError
from monsoon.stack.provision import Device


class CoapFleet(AsyncFleet):
    """Devices posting confirmable CoAP requests (aiocoap), each device its own client context (UDP
    socket): one CoAP endpoint per device, as real devices are.

    ``max_inflight`` defaults to 1: CoAP's NSTART = 1 allows one outstanding confirmable exchange per
    endpoint pair and aiocoap queues the rest inside the library, which would hide the wait from the
    late count. ``confirmable=False`` sends non-confirmable requests (the answer still acks)."""

    transport = "coap"
    DEFAULT_MAX_INFLIGHT = 1
    CONTENT_FORMAT_JSON = 50

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
        return f"coap://{host}:{self.port}"

    async def _open(self) -> None:

        self._ctxs = list(await asyncio.gather(*(
            aiocoap.Context.create_client_context(loggername=f"coap-{d.device.name}", transports=["udp6"])
            for d in self._devs)))
        self._post, self._tuning = POST, (Reliable if self.confirmable else Unreliable)
        for d, ctx in zip(self._devs, self._ctxs):
            m = Message(code=POST, uri=self.uri_base + telemetry_path(d.device.token))
            # [context, Uri-Path, remote]: the remote is resolved by the first request, then reused
            # (aiocoap would otherwise resolve and route-check host:port for every message)
            d.target = [ctx, m.opt.uri_path, m.remote]
        # the endpoint must answer something (any code): a GET of /.well-known/core
        probe = Message(code=GET, transport_tuning=Reliable, uri=self.uri_base + "/.well-known/core")
        try:
            async with asyncio.timeout(self.connect_timeout_s):
                await self._ctxs[0].request(probe).response
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
