"""The HTTP fleet: ``POST /api/v1/{token}/telemetry`` per message on the shared async schedule."""
from __future__ import annotations

import asyncio
from typing import Any
from urllib.parse import quote

import aiohttp
from yarl import URL

from monsoon.load.aio import AsyncFleet, _Dev
from monsoon.load.base import FleetOptions
from monsoon.load.stats import FleetConnectError
from monsoon.stack.provision import Device


def telemetry_path(token: str) -> str:
    """ThingsBoard's device telemetry path for ``token`` (percent-encoded: a token is one path segment)."""
    return f"/api/v1/{quote(token, safe='')}/telemetry"


class HttpFleet(AsyncFleet):
    """Devices posting to ThingsBoard's device HTTP API over keep-alive connections (aiohttp).

    At most ``max_inflight`` requests per device at a time (HTTP/1.1 without pipelining: one connection
    each); the connections live in one pool of ``devices x max_inflight``, reused across devices."""

    transport = "http"
    DEFAULT_MAX_INFLIGHT = 8
    KEEPALIVE_S = 15.0     # below the JDK HttpServer's 30 s idle timeout: the client closes idle ones first

    def __init__(self, devices: list[Device], host: str, port: int, options: FleetOptions | None = None,
                 **fields: Any) -> None:
        super().__init__(devices, host, port, options, **fields)
        self._session: Any = None
        self._headers = {"Content-Type": "application/json"}

    async def _open(self) -> None:

        try:
            async with asyncio.timeout(self.connect_timeout_s):
                _, w = await asyncio.open_connection(self.host, self.port)
            w.close()
            await w.wait_closed()
        except TimeoutError:
            raise FleetConnectError(f"HTTP endpoint {self.endpoint}: connect timed out after "
                                    f"{self.connect_timeout_s:g}s") from None
        except ConnectionRefusedError:
            raise FleetConnectError(f"HTTP endpoint {self.endpoint}: nothing listening (connection refused)") from None
        except OSError as e:
            raise FleetConnectError(f"HTTP endpoint {self.endpoint}: {type(e).__name__}: {e}") from None
        for d in self._devs:
            d.target = URL.build(scheme="http", host=self.host, port=self.port,
                                 path=telemetry_path(d.device.token), encoded=True)
        conn = aiohttp.TCPConnector(limit=len(self._devs) * self.max_inflight, limit_per_host=0,
                                    keepalive_timeout=self.KEEPALIVE_S)
        self._session = aiohttp.ClientSession(
            connector=conn, timeout=aiohttp.ClientTimeout(total=None, sock_connect=self.connect_timeout_s),
            skip_auto_headers=("User-Agent",), auto_decompress=False)

    async def _deliver(self, dev: _Dev, payload: bytes) -> str | None:
        async with self._session.post(dev.target, data=payload, headers=self._headers) as resp:
            await resp.read()
            return None if 200 <= resp.status < 300 else f"http {resp.status}"

    async def _shut(self) -> None:
        s, self._session = self._session, None
        if s is not None:
            await s.close()
