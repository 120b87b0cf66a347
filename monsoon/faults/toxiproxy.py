"""Network faults through Toxiproxy: a small typed HTTP client and the backend.

Every proxy this module creates is named ``m_<run-id>__<client>__<server>``
and every toxic ``m_<run-id>__<fault>__<n>__<stream>``, so ``heal_all`` and
``census`` find a run's leftovers on the server even after monsoon itself was
killed.  The PyPI client (toxiproxy-python) is unmaintained; the API is small.

Route a stack's hops through proxies that live as long as the stack:

    python -m monsoon.faults.toxiproxy route --api http://127.0.0.1:8474 \\
        platform->postgres=127.0.0.1:15432>127.0.0.1:5432

creates the proxies (run id from ``MONSOON_RUN_ID``), prints ``routed``, and
deletes them again on SIGTERM/SIGINT.
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import socket
import struct
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable

import requests

from monsoon.faults.base import FaultContext, FaultError, Handle, Landing
from monsoon.spec.fault import BandwidthParams, DependencyDownParams, FaultSpec, LatencyParams
from monsoon.stack.reaper import check_run_id


DEFAULT_API = "http://127.0.0.1:8474"


# ------------------------------------------------------------------- client

class ToxiproxyError(RuntimeError):
    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(f"toxiproxy: HTTP {status}: {message}")


@dataclass(frozen=True)
class Toxic:
    name: str
    type: str
    stream: str = "downstream"
    toxicity: float = 1.0
    attributes: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_json(cls, d: dict) -> "Toxic":
        return cls(d["name"], d["type"], d.get("stream", "downstream"), float(d.get("toxicity", 1.0)),
                   dict(d.get("attributes") or {}))


@dataclass(frozen=True)
class Proxy:
    name: str
    listen: str
    upstream: str
    enabled: bool
    toxics: tuple[Toxic, ...] = ()

    @classmethod
    def from_json(cls, d: dict) -> "Proxy":
        return cls(d["name"], d["listen"], d["upstream"], bool(d["enabled"]),
                   tuple(Toxic.from_json(t) for t in d.get("toxics") or ()))

    @property
    def address(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return (host if host not in ("", "[::]", "0.0.0.0") else "127.0.0.1"), int(port)


class ToxiproxyClient:
    """``/version``, ``/proxies``, ``/proxies/{p}``, ``/proxies/{p}/toxics[/{t}]``, ``/reset``."""

    def __init__(self, api: str = DEFAULT_API, timeout: float = 5.0):
        self.api = api.rstrip("/")
        self.timeout = timeout
        self.http = requests.Session()

    def _call(self, method: str, path: str, json: Any = None, ok: Iterable[int] = (200, 201, 204)) -> Any:
        try:
            r = self.http.request(method, self.api + path, json=json, timeout=self.timeout)
        except requests.RequestException as e:
            raise FaultError(f"toxiproxy at {self.api} is not reachable ({e.__class__.__name__}); "
                             "is toxiproxy-server running? (install: tools/install-toxiproxy)") from None
        if r.status_code not in ok:
            try:
                msg = r.json().get("error", r.text)
            except ValueError:
                msg = r.text
            raise ToxiproxyError(r.status_code, f"{method} {path}: {msg.strip()}")
        return r.json() if r.content else None

    def version(self) -> str:
        r = self.http.get(self.api + "/version", timeout=self.timeout)
        r.raise_for_status()
        try:
            return r.json()["version"]
        except (ValueError, KeyError, TypeError):
            return r.text.strip()

    def proxies(self) -> dict[str, Proxy]:
        return {n: Proxy.from_json(p) for n, p in (self._call("GET", "/proxies") or {}).items()}

    def proxy(self, name: str) -> Proxy | None:
        try:
            return Proxy.from_json(self._call("GET", f"/proxies/{name}"))
        except ToxiproxyError as e:
            if e.status == 404:
                return None
            raise

    def create_proxy(self, name: str, listen: str, upstream: str, enabled: bool = True) -> Proxy:
        return Proxy.from_json(self._call("POST", "/proxies",
                                          {"name": name, "listen": listen, "upstream": upstream, "enabled": enabled}))

    def set_enabled(self, name: str, enabled: bool) -> Proxy:
        return Proxy.from_json(self._call("POST", f"/proxies/{name}", {"enabled": enabled}))

    def _delete(self, path: str) -> bool:
        """DELETE ``path``; False when it was already gone (404)."""
        try:
            self._call("DELETE", path)
            return True
        except ToxiproxyError as e:
            if e.status == 404:
                return False
            raise

    def delete_proxy(self, name: str) -> bool:
        return self._delete(f"/proxies/{name}")

    def toxics(self, proxy: str) -> list[Toxic]:
        return [Toxic.from_json(t) for t in self._call("GET", f"/proxies/{proxy}/toxics") or ()]

    def add_toxic(self, proxy: str, toxic: Toxic) -> Toxic:
        return Toxic.from_json(self._call("POST", f"/proxies/{proxy}/toxics", {
            "name": toxic.name, "type": toxic.type, "stream": toxic.stream,
            "toxicity": toxic.toxicity, "attributes": toxic.attributes}))

    def remove_toxic(self, proxy: str, name: str) -> bool:
        return self._delete(f"/proxies/{proxy}/toxics/{name}")

    def reset(self) -> None:
        """Enable every proxy and remove every toxic — of *every* run: prefer ``heal_all``."""
        self._call("POST", "/reset")


# ------------------------------------------------------------------- naming

def run_prefix(run_id: str) -> str:
    return f"m_{check_run_id(run_id)}__"


def run_ids_on(backend: "ToxiproxyBackend") -> set[str]:
    """Run ids that have proxies or toxics on a Toxiproxy server (names ``m_<run-id>__...``)."""
    ids = set()
    for name, proxy in backend.client.proxies().items():
        for n in [name, *(t.name for t in proxy.toxics)]:
            if n.startswith("m_") and "__" in n:
                ids.add(n[2:].split("__", 1)[0])
    return ids


def proxy_name(run_id: str, hop: tuple[str, str]) -> str:
    return f"{run_prefix(run_id)}{hop[0]}__{hop[1]}"


def toxic_name(run_id: str, fault: str, n: int, stream: str) -> str:
    return f"{run_prefix(run_id)}{fault}__{n}__{stream}"


# ------------------------------------------------------------------- probes

def _bson_hello() -> bytes:
    def cstr(s: str) -> bytes:
        return s.encode() + b"\0"
    body = b"\x10" + cstr("hello") + struct.pack("<i", 1) + b"\x02" + cstr("$db") + struct.pack("<i", 6) + cstr("admin")
    doc = struct.pack("<i", len(body) + 5) + body + b"\0"
    msg = struct.pack("<I", 0) + b"\0" + doc                       # flagBits, section kind 0
    return struct.pack("<iiii", 16 + len(msg), 1, 0, 2013) + msg   # OP_MSG header


PROBE_PAYLOADS: dict[str, bytes] = {
    "echo": b"monsoon-probe\n",
    "postgres": struct.pack("!II", 8, 80877103),          # SSLRequest -> 'S' or 'N'
    "http": b"HEAD / HTTP/1.0\r\nHost: monsoon-probe\r\n\r\n",
    "kafka": bytes.fromhex("0000000a" "0012" "0000" "00000001" "ffff"),   # ApiVersions v0
    "mongo": _bson_hello(),
    "redis": b"PING\r\n",
    "cql": bytes.fromhex("04" "00" "0001" "05" "00000000"),   # CQL v4 OPTIONS -> SUPPORTED
}
AUTO_PROBES = (("postgres", "postgres"), ("pg", "postgres"), ("kafka", "kafka"), ("mongo", "mongo"),
               ("ferret", "mongo"), ("redis", "redis"), ("cassandra", "cql"), ("infinispan", "http"), ("http", "http"),
               ("echo", "echo"))


def pick_probe(probe: str, upstream_service: str) -> str:
    if probe != "auto":
        return probe
    s = upstream_service.lower()
    return next((p for key, p in AUTO_PROBES if key in s), "none")


class ProbeFailed(Exception):
    def __init__(self, what: str, elapsed_ms: float):
        self.what, self.elapsed_ms = what, elapsed_ms
        super().__init__(f"{what} after {elapsed_ms:.0f} ms")


def probe_rtt(addr: tuple[str, int], payload: bytes, timeout: float = 5.0) -> float:
    """Milliseconds from sending ``payload`` on a fresh connection to the first byte back."""
    with socket.create_connection(addr, timeout=timeout) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        try:
            s.sendall(payload)
            data = s.recv(1)
        except socket.timeout:
            raise ProbeFailed("timeout", (time.perf_counter() - t0) * 1000) from None
        except ConnectionResetError:
            raise ProbeFailed("reset", (time.perf_counter() - t0) * 1000) from None
        ms = (time.perf_counter() - t0) * 1000
        if not data:
            raise ProbeFailed("closed", ms)
        return ms


def floor_rtt(addr: tuple[str, int], payload: bytes, n: int = 5, timeout: float = 5.0) -> float:
    """The least of ``n`` probe round trips. A latency toxic delays every reply, so it moves the floor by at least
    its latency less its jitter; what a busy or CPU-starved upstream adds (scheduling, GC) only ever adds, and
    the floor leaves it out where a median takes it in: under a 0.5-core quota a healed Cassandra hop probed
    84 ms by its median against a baseline of 10, and its heal was judged not verified."""
    return min(probe_rtt(addr, payload, timeout) for _ in range(n))


def can_connect(addr: tuple[str, int], timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection(addr, timeout=timeout):
            return True
    except OSError:
        return False


def throughput_kib_s(addr: tuple[str, int], nbytes: int, timeout: float = 30.0) -> float:
    """Send ``nbytes`` to an echo upstream and time how fast they come back (KiB/s)."""
    with socket.create_connection(addr, timeout=timeout) as s:
        t0 = time.perf_counter()
        sender = threading.Thread(target=s.sendall, args=(b"x" * nbytes,), daemon=True)
        sender.start()
        got = 0
        while got < nbytes:
            chunk = s.recv(65536)
            if not chunk:
                break
            got += len(chunk)
        sender.join(timeout)
        return got / 1024 / max(time.perf_counter() - t0, 1e-6)


# Bandwidth through a proxy to an upstream that is not an echo server: the upstream's own protocol probe,
# pipelined.  N requests back to back on one connection make N replies (a Kafka ApiVersions reply is a few
# hundred bytes, a Mongo hello as much): enough bytes that the toxic's rate decides how long they take.
BURST_SAMPLE = 32          # requests of the first, sizing burst
BURST_TARGET_S = 0.5       # size the measured burst to take about this long at the limit
BURST_MIN_S = 0.25         # a transfer shorter than this at the limit cannot be told apart by one timed burst
BURST_MAX_REQUESTS = 4096
BURST_MARGIN = 3.0         # the unlimited path must be this many times faster than the limit to judge it


@dataclass(frozen=True)
class Burst:
    requests: int
    sent: int
    received: int
    seconds: float         # first byte sent -> last byte received
    closed: bool           # the peer closed the connection (it answers one request per connection)


def _send_quietly(s: socket.socket, data: bytes) -> None:
    try:
        s.sendall(data)
    except OSError:
        pass   # the peer closed early: what came back says so


def burst_transfer(addr: tuple[str, int], payload: bytes, n: int, *, expect: int | None = None,
                   idle: float = 0.3, timeout: float = 10.0) -> Burst:
    """``payload`` ``n`` times back to back on one connection; read the replies until ``expect`` bytes came
    (without ``expect``: until the peer closes or stays quiet ``idle`` s after its first byte), timed from the
    first byte sent to the last byte received."""
    data = payload * n
    with socket.create_connection(addr, timeout=timeout) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        t0 = time.perf_counter()
        deadline = t0 + timeout
        sender = threading.Thread(target=_send_quietly, args=(s, data), daemon=True)
        sender.start()
        got, t_last, closed = 0, t0, False
        while expect is None or got < expect:
            left = deadline - time.perf_counter()
            if left <= 0:
                break
            s.settimeout(min(left, idle) if expect is None and got else left)
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            except OSError:
                closed = True
                break
            if not chunk:
                closed = True
                break
            got += len(chunk)
            t_last = time.perf_counter()
        sender.join(1.0)
    return Burst(n, len(data), got, max(t_last - t0, 1e-6), closed)


def bandwidth_plan(addr: tuple[str, int], probe: str, rate_kbps: float, stream: str) -> dict:
    """Before the toxic: how many pipelined ``probe`` requests the limit would visibly slow, and how fast the
    unlimited path moves them.  ``{"why": ...}`` when no honest measure is possible for this upstream."""
    payload = PROBE_PAYLOADS.get(probe)
    if payload is None:
        return {"why": f"probe {probe!r}: no request to time for this upstream (only the toxic in the API is seen)"}
    try:
        first = burst_transfer(addr, payload, BURST_SAMPLE)
    except OSError as e:
        return {"why": f"the {probe} probe could not connect through the proxy before the fault: {e}"}
    if first.received == 0:
        return {"why": f"the upstream answered nothing to {BURST_SAMPLE} pipelined {probe} requests"}
    down = first.received if first.closed else first.received / first.requests   # bytes per request
    up = len(payload)
    direction = "up" if stream == "upstream" or (stream == "both" and up > down) else "down"
    rate = rate_kbps * 1024
    if first.closed:   # it answers once per connection: the burst cannot grow
        n = first.requests
    else:
        n = max(1, min(BURST_MAX_REQUESTS, math.ceil(rate * BURST_TARGET_S / (down if direction == "down" else up))))
    try:
        base = burst_transfer(addr, payload, n)
    except OSError as e:
        return {"why": f"the {probe} probe failed before the fault: {e}"}
    moved = base.received if direction == "down" else base.sent
    plan: dict[str, Any] = {"requests": n, "expect": base.received, "direction": direction, "bytes": moved,
            "baseline_kib_s": round(moved / 1024 / base.seconds, 1)}
    at_limit = moved / rate
    if base.received == 0 or at_limit < BURST_MIN_S:
        what = "one reply per connection" if first.closed else f"at most {BURST_MAX_REQUESTS} requests"
        plan["why"] = (f"the {probe} upstream moves only {moved} bytes {direction} for {n} pipelined request(s) "
                       f"({what}): {at_limit * 1000:.0f} ms at {rate_kbps} KiB/s, too little to time")
    elif plan["baseline_kib_s"] < BURST_MARGIN * rate_kbps:
        plan["why"] = (f"without the fault the {probe} upstream already moves only {plan['baseline_kib_s']} KiB/s "
                       f"through the proxy: too close to the {rate_kbps} KiB/s limit to tell them apart")
    return plan


# ------------------------------------------------------------------ backend

class ToxiproxyBackend:
    """network-latency / mongo-slowdown / infinispan-slowdown / cassandra-slowdown (latency+jitter), bandwidth,
    dependency-down / cassandra-down."""
    name = "toxiproxy"

    def __init__(self, api: str = DEFAULT_API, *, probe_samples: int = 5, probe_timeout: float = 5.0):
        self.client = ToxiproxyClient(api)
        self.samples = probe_samples
        self.probe_timeout = probe_timeout
        self._handles: dict[str, Handle] = {}

    # --- routing (the stack's side: proxies live as long as the stack)
    def route(self, run_id: str, hop: tuple[str, str], listen: str, upstream: str) -> Proxy:
        name = proxy_name(run_id, hop)
        existing = self.client.proxy(name)
        if existing is not None:
            if (existing.listen, existing.upstream) != (listen, upstream) and not listen.endswith(":0"):
                self.client.delete_proxy(name)
            else:
                return existing
        return self.client.create_proxy(name, listen, upstream)

    def unroute(self, run_id: str) -> list[str]:
        """Delete every proxy of a run (at stack stop)."""
        prefix = run_prefix(run_id)
        gone = [n for n in self.client.proxies() if n.startswith(prefix)]
        for n in gone:
            self.client.delete_proxy(n)
        return gone

    def _proxy_for(self, fault: FaultSpec, run_id: str) -> Proxy:
        if fault.target.hop is None:
            raise FaultError(f"{fault.name}: the toxiproxy backend needs a hop target 'client->server'")
        name = proxy_name(run_id, fault.target.hop)
        p = self.client.proxy(name)
        if p is None:
            raise FaultError(f"{fault.name}: no Toxiproxy proxy {name!r} for hop {fault.target} on "
                             f"{self.client.api}; route the hop through Toxiproxy in the stack "
                             "(python -m monsoon.faults.toxiproxy route ...)")
        return p

    def _probe_name(self, handle: Handle) -> str:
        params = handle.fault.params
        hop = handle.fault.target.hop
        assert hop is not None      # inject's _proxy_for refused a fault without one
        return pick_probe(getattr(params, "probe", "none"), hop[1])

    def _measure(self, addr: tuple[str, int], probe: str) -> float | None:
        if probe == "none":
            return None
        try:
            return round(floor_rtt(addr, PROBE_PAYLOADS[probe], self.samples, self.probe_timeout), 2)
        except (OSError, ProbeFailed):
            return None

    # --- FaultBackend
    def inject(self, fault: FaultSpec, ctx: FaultContext) -> Handle:
        proxy = self._proxy_for(fault, ctx.run_id)
        handle = Handle(fault, self.name, ctx.run_id, {"proxy": proxy.name, "listen": proxy.listen, "toxics": []})
        probe = self._probe_name(handle)
        handle.data["probe"] = probe
        p = fault.params
        if isinstance(p, LatencyParams) or isinstance(p, BandwidthParams):
            handle.data["baseline_ms"] = self._measure(proxy.address, probe)
            if isinstance(p, BandwidthParams) and probe != "echo":   # sized and timed before the toxic
                handle.data["bandwidth"] = bandwidth_plan(proxy.address, probe, p.rate_kbps, p.stream)
            streams = ("downstream", "upstream") if p.stream == "both" else (p.stream,)
            if isinstance(p, LatencyParams):
                ttype, attrs = "latency", {"latency": p.latency_ms, "jitter": p.jitter_ms}
            else:
                ttype, attrs = "bandwidth", {"rate": p.rate_kbps}
            n = sum(1 for h in self._handles.values() if h.fault.name == fault.name) + 1
            for stream in streams:
                t = Toxic(toxic_name(ctx.run_id, fault.name, n, stream), ttype, stream, 1.0, attrs)
                handle.data["toxics"].append(t.name)      # before the call: a half-done inject still heals
                self.client.add_toxic(proxy.name, t)
        elif isinstance(p, DependencyDownParams):
            if p.mode == "disable":
                handle.data["disabled"] = True
                self.client.set_enabled(proxy.name, False)
            else:
                ttype = "reset_peer" if p.mode == "reset_peer" else "timeout"
                n = sum(1 for h in self._handles.values() if h.fault.name == fault.name) + 1
                t = Toxic(toxic_name(ctx.run_id, fault.name, n, "downstream"), ttype, "downstream", 1.0,
                          {"timeout": p.timeout_ms})
                handle.data["toxics"].append(t.name)
                self.client.add_toxic(proxy.name, t)
        else:
            raise FaultError(f"{fault.name}: the toxiproxy backend cannot do {fault.kind}")
        self._handles[handle.id] = handle
        return handle

    def heal(self, handle: Handle) -> None:
        proxy = handle.data["proxy"]
        for t in handle.data.get("toxics", ()):
            try:
                self.client.remove_toxic(proxy, t)
            except ToxiproxyError as e:
                if e.status != 404:
                    raise
        if handle.data.get("disabled"):
            try:
                self.client.set_enabled(proxy, True)
            except ToxiproxyError as e:
                if e.status != 404:
                    raise
        handle.healed = True
        self._handles.pop(handle.id, None)

    def heal_all(self, run_id: str) -> list[str]:
        """Remove every toxic of the run (on any proxy) and re-enable the run's proxies."""
        prefix = run_prefix(run_id)
        healed = []
        for name, proxy in self.client.proxies().items():
            for t in proxy.toxics:
                if t.name.startswith(prefix):
                    self.client.remove_toxic(name, t.name)
                    healed.append(f"toxic {name}/{t.name}")
            if name.startswith(prefix) and not proxy.enabled:
                self.client.set_enabled(name, True)
                healed.append(f"proxy {name} re-enabled")
        for h in list(self._handles.values()):
            if h.run_id == run_id:
                h.healed = True
                self._handles.pop(h.id, None)
        return healed

    def census(self, run_id: str, *, routed: bool = False) -> list[str]:
        """What of the run is still on the server: its toxics, its disabled proxies and, with ``routed``
        (after the run's proxies were to be deleted), any proxy of the run at all."""
        prefix = run_prefix(run_id)
        left = []
        for name, proxy in self.client.proxies().items():
            left += [f"toxic {name}/{t.name} ({t.type} {t.attributes})" for t in proxy.toxics if t.name.startswith(prefix)]
            if name.startswith(prefix) and not proxy.enabled:
                left.append(f"proxy {name} disabled")
            elif name.startswith(prefix) and routed:
                left.append(f"proxy {name} on {self.client.api} not deleted")
        return left

    def verify(self, handle: Handle) -> Landing:
        p = handle.fault.params
        proxy = self.client.proxy(handle.data["proxy"])
        if proxy is None:
            return Landing(False, {"method": "api", "error": f"proxy {handle.data['proxy']} is gone"})
        present = sorted(t.name for t in proxy.toxics if t.name in handle.data.get("toxics", ()))
        api = {"proxy": proxy.name, "enabled": proxy.enabled, "toxics_present": present}
        probe = handle.data.get("probe", "none")
        if isinstance(p, DependencyDownParams):
            return self._verify_down(handle, proxy, p, api)
        base = handle.data.get("baseline_ms")
        if isinstance(p, LatencyParams):
            now = self._measure(proxy.address, probe)
            ev = {"method": f"probe:{probe}", **api, "baseline_ms": base, "rtt_ms": now,
                  "added_ms": None if now is None or base is None else round(now - base, 2)}
            if now is None or base is None:
                ev["method"] = "api"
                want_present = not handle.healed
                return Landing(None if want_present == bool(present) else False, ev)
            per_way = p.latency_ms - p.jitter_ms
            expect = per_way * (2 if p.stream == "both" else 1)
            ev["expected_min_ms"] = expect
            if handle.healed:   # the heal landed when the added latency is gone
                return Landing(now - base < 0.5 * expect and not present, ev)
            return Landing(now - base >= 0.8 * expect and len(present) == len(handle.data["toxics"]), ev)
        if isinstance(p, BandwidthParams):
            return self._verify_bandwidth(handle, proxy, p, probe, api, bool(present))
        return Landing(None, {"method": "none", **api})

    @staticmethod
    def _verify_bandwidth(handle: Handle, proxy: Proxy, p: BandwidthParams, probe: str, api: dict,
                          present: bool) -> Landing:
        """Throughput through the proxy: at most 1.5x the limit while the fault is on, above it once healed
        (echo: a timed echo; another upstream: the pipelined probe burst sized at the inject)."""
        ev: dict[str, Any] = {"method": "api", **api}
        want = not handle.healed   # the toxics are in place and throughput is limited (healed: neither)
        if probe == "echo":
            nbytes = max(4096, int(p.rate_kbps * 1024 * 0.5))   # ~0.5 s at the limit
            kib_s = throughput_kib_s(proxy.address, nbytes)
            ev.update(method="probe:echo-throughput")
        else:
            plan = handle.data.get("bandwidth") or {"why": "no throughput baseline was taken at the inject"}
            if "why" in plan:   # say so: only the API was looked at
                ev["error"] = f"throughput not measured: {plan['why']}"
                return Landing(None if present == want else False, ev)
            try:
                m = burst_transfer(proxy.address, PROBE_PAYLOADS[probe], plan["requests"],
                                   expect=max(1, int(plan["expect"] * 0.95)),   # replies may vary by a few bytes
                                   timeout=max(10.0, 4 * plan["bytes"] / (p.rate_kbps * 1024)))
            except OSError as e:
                ev["error"] = f"throughput probe {probe} failed: {e}"
                return Landing(None if present == want else False, ev)
            moved = m.received if plan["direction"] == "down" else m.sent
            kib_s = moved / 1024 / m.seconds
            ev.update(method=f"probe:{probe}-throughput", baseline_kib_s=plan["baseline_kib_s"],
                      requests=plan["requests"], bytes=moved, direction=plan["direction"], seconds=round(m.seconds, 3))
        ev.update(kib_s=round(kib_s, 1), limit_kib_s=p.rate_kbps)
        limited = kib_s <= p.rate_kbps * 1.5
        return Landing(limited == want and present == want, ev)

    def _verify_down(self, handle: Handle, proxy: Proxy, p: DependencyDownParams, api: dict) -> Landing:
        addr = proxy.address
        if p.mode == "disable":
            ok = can_connect(addr)
            ev = {"method": "connect", **api, "connect_ok": ok}
            return Landing(ok if handle.healed else (not ok and not proxy.enabled), ev)
        probe = handle.data.get("probe", "none")
        payload = PROBE_PAYLOADS.get(probe, b"\0")
        wait = max(2.0, p.timeout_ms / 1000 + 1.0)
        try:
            ms = probe_rtt(addr, payload, timeout=wait)
            ev = {"method": f"probe:{probe}", **api, "outcome": "reply", "rtt_ms": round(ms, 2)}
            failed = False
        except ProbeFailed as e:
            ev = {"method": f"probe:{probe}", **api, "outcome": e.what, "after_ms": round(e.elapsed_ms, 1)}
            failed = True
        except OSError as e:
            ev = {"method": "connect", **api, "outcome": f"connect failed: {e}"}
            failed = True
        if probe == "none":   # without a protocol probe a 'failure' proves nothing about the heal
            return Landing(None if not failed or handle.healed else True, ev)
        return Landing(not failed if handle.healed else failed, ev)


# --------------------------------------------------------------------- CLI

def _parse_route(s: str) -> tuple[tuple[str, str], str, str]:
    hop, _, addrs = s.partition("=")
    src, _, dst = hop.partition("->")
    listen, _, upstream = addrs.partition(">")
    if not (src and dst and listen and upstream):
        raise argparse.ArgumentTypeError(f"expected client->server=LISTEN>UPSTREAM, got {s!r}")
    return (src.strip(), dst.strip()), listen.strip(), upstream.strip()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m monsoon.faults.toxiproxy")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("route", help="create the run's proxies, keep them until SIGTERM, then delete them")
    r.add_argument("--api", default=DEFAULT_API)
    r.add_argument("--run-id", default=os.environ.get("MONSOON_RUN_ID"))
    r.add_argument("--wait", type=float, default=10.0, help="seconds to wait for the Toxiproxy API")
    r.add_argument("routes", nargs="+", type=_parse_route, metavar="client->server=LISTEN>UPSTREAM")
    h = sub.add_parser("heal-all", help="heal every fault of a run and print what was left")
    h.add_argument("--api", default=DEFAULT_API)
    h.add_argument("--run-id", required=True)
    args = ap.parse_args(argv)
    if not args.run_id:
        ap.error("--run-id or MONSOON_RUN_ID is required")
    backend = ToxiproxyBackend(args.api)
    if args.cmd == "heal-all":
        for line in backend.heal_all(args.run_id):
            print("healed", line)
        return 0
    deadline = time.monotonic() + args.wait
    while True:
        try:
            backend.client.version()
            break
        except requests.RequestException:
            if time.monotonic() > deadline:
                print(f"toxiproxy API {args.api} not reachable after {args.wait}s", file=sys.stderr)
                return 1
            time.sleep(0.05)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        for hop, listen, upstream in args.routes:
            p = backend.route(args.run_id, hop, listen, upstream)
            print(f"proxy {p.name}: {p.listen} -> {p.upstream}", flush=True)
        print("routed", flush=True)
        stop.wait()
    finally:
        try:
            backend.heal_all(args.run_id)
            backend.unroute(args.run_id)
        except FaultError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
