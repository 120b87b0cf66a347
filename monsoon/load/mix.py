"""A request mix's non-write operations (Eclipse Ditto's READ_THINGS, SEARCH_THINGS and MODIFY_THINGS), sent on
an open-model schedule beside the fleet's device writes.

* the HTTP operations, each a request form (``load.mix.requests``, rendered by :func:`render_request`) sent with
  the JWT of ``POST /api/auth/login``; by default
  **read**: ``GET /api/plugins/telemetry/DEVICE/{id}/values/timeseries?keys=..`` (ThingsBoard's latest telemetry
  of one device, by id: the platform's registry and its store) and
  **search**: ``GET /api/tenant/devices?textSearch=..&type=..`` (devices by a filter: a name substring that
  matches about ten devices, and the device type); an experiment adds others (a time-series range, ThingsBoard's
  entity query ``POST /api/entitiesQuery/find``);
* **modify**: a message into the platform's Kafka topic (``observe.kafka.topic``), shaped as the reference
  platform's queue carries telemetry (``{id, d, n, t, ts, p}``, keyed by the device id), so the platform
  applies it as it applies a device's write; its latency is the broker's acknowledgement.

:class:`MixClient` runs them in one asyncio loop on its own thread.  Each second of ``rates`` (ops/s of the
whole mix) it schedules each operation's share evenly over the second, and sends each at its intended time
whether or not earlier ones have answered (open model); latency is answer time minus *intended* time, into
HdrHistograms (per operation and second, and per operation in all).  An operation with ``max_in_flight``
requests outstanding does not send: that request counts as refused ("too many in-flight requests", Ditto's
words) among the errors.  :meth:`MixClient.warm_up` first touches every device (its id by name, then one read)
and keeps those numbers apart.  :func:`judge_ops` (pure) says whether one step's window kept up.
"""
from __future__ import annotations

import asyncio
import json
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Iterable

import aiohttp
from confluent_kafka import Producer
from hdrh.histogram import HdrHistogram

from monsoon.spec.mix import DEFAULT_REQUESTS, NOT_HTTP, PLACEHOLDER_RE

LATE_S = 0.1               # a request sent this much after its intended time is late
TIMEOUT_S = 10.0           # an HTTP request not answered by then is an error


def _hist() -> HdrHistogram:
    return HdrHistogram(1, 60_000_000, 2)      # microseconds, 1 us .. 60 s


def pct_ms(h: HdrHistogram) -> dict[str, float | None]:
    """p50 / p99 / p99.9 / max of a latency histogram in ms (None when empty)."""
    if h.get_total_count() == 0:
        return {"p50_ms": None, "p99_ms": None, "p999_ms": None, "max_ms": None}
    return {"p50_ms": round(h.get_value_at_percentile(50) / 1000, 2),
            "p99_ms": round(h.get_value_at_percentile(99) / 1000, 2),
            "p999_ms": round(h.get_value_at_percentile(99.9) / 1000, 2),
            "max_ms": round(h.get_max_value() / 1000, 2)}


@dataclass
class OpSecond:
    """One operation's counts in one second (by the second it was scheduled in; ``ok``/``errors`` and the
    histogram by the second it was answered in)."""
    scheduled: int = 0
    sent: int = 0
    ok: int = 0
    errors: int = 0
    refused: int = 0       # not sent: max_in_flight outstanding (counted in errors too)
    timeouts: int = 0      # not answered within TIMEOUT_S (counted in errors too)
    late: int = 0
    hist: HdrHistogram = field(default_factory=_hist)


class OpStats:
    """Per-second and total counts and latencies of one operation."""

    def __init__(self, name: str):
        self.name = name
        self.seconds: dict[int, OpSecond] = {}
        self.total = _hist()
        self.in_flight = 0
        self.first_error: str | None = None
        self.error_kinds: dict[str, int] = {}

    def at(self, sec: int) -> OpSecond:
        s = self.seconds.get(sec)
        if s is None:
            s = self.seconds[sec] = OpSecond()
        return s

    def answered(self, sec: int, latency_s: float, error: str | None, *, timeout: bool = False) -> None:
        s = self.at(sec)
        if error is None:
            s.ok += 1
            us = max(1, min(int(latency_s * 1e6), 60_000_000))
            s.hist.record_value(us)
            self.total.record_value(us)
        else:
            self.error(sec, error, timeout=timeout)

    def error(self, sec: int, error: str, *, timeout: bool = False) -> None:
        s = self.at(sec)
        s.errors += 1
        s.timeouts += timeout
        self.first_error = self.first_error or error
        kind = error.split(":")[0][:60]
        self.error_kinds[kind] = self.error_kinds.get(kind, 0) + 1

    def window(self, a: int, b: int) -> dict[str, Any]:
        """Counts, rates and percentiles over seconds ``[a, b)``."""
        h = _hist()
        out: dict[str, Any] = {"scheduled": 0, "sent": 0, "ok": 0, "errors": 0, "refused": 0, "timeouts": 0,
                               "late": 0}
        for s in range(a, b):
            x = self.seconds.get(s)
            if x is None:
                continue
            for k in out:
                out[k] += getattr(x, k)
            h.add(x.hist)
        n = max(1, b - a)
        out.update(seconds=b - a, ok_rate=round(out["ok"] / n, 1), sched_rate=round(out["scheduled"] / n, 1),
                   **pct_ms(h))
        return out

    def totals(self, seconds: float) -> dict[str, Any]:
        out = self.window(min(self.seconds, default=0), max(self.seconds, default=-1) + 1)
        out.update(pct_ms(self.total), seconds=round(seconds, 1),
                   ok_rate=round(out["ok"] / seconds, 1) if seconds > 0 else 0.0,
                   error_kinds=dict(self.error_kinds), first_error=self.first_error)
        return out


@dataclass(frozen=True)
class MixDevice:
    name: str
    id: str | None = None          # the platform's id (the warm-up finds it)
    type: str = "default"


def schedule_second(counts: dict[str, int]) -> list[tuple[float, str]]:
    """``[(offset in the second, op)]``: each op's ``counts[op]`` sends spread evenly over the second,
    interleaved by time (pure)."""
    out = [((i + 0.5) / n, op) for op, n in counts.items() if n > 0 for i in range(n)]
    return sorted(out)


def per_second_counts(rate: float, shares: dict[str, float], carry: dict[str, float]) -> dict[str, int]:
    """Whole sends of each op this second at ``rate`` ops/s of the mix; fractions carry over (``carry``
    is updated), so a 0.3/s op sends once every ~3 s."""
    out = {}
    for op, share in shares.items():
        x = rate * share + carry.get(op, 0.0)
        n = int(x + 1e-9)             # 0.3 x 10 is 2.9999...: still three sends
        carry[op] = x - n
        out[op] = n
    return out


#: The request forms of :data:`monsoon.spec.mix.DEFAULT_REQUESTS`, as plain data (what a MixClient is given).
DEFAULT_FORMS: dict[str, dict[str, Any]] = {op: f.model_dump(exclude_none=True) for op, f in DEFAULT_REQUESTS.items()}


def _fill(x: Any, values: dict[str, str]) -> Any:
    if isinstance(x, str):
        return PLACEHOLDER_RE.sub(lambda m: values.get(m.group(1), m.group(0)), x)
    if isinstance(x, dict):
        return {k: _fill(v, values) for k, v in x.items()}
    if isinstance(x, list):
        return [_fill(v, values) for v in x]
    return x


def render_request(form: dict[str, Any], dev: MixDevice, *, keys: str = "seq", now_ms: int = 0,
                   range_s: float = 60.0) -> tuple[str, str, dict[str, str], Any]:
    """``(method, path, params, body)`` of a request form for ``dev`` at ``now_ms``: its placeholders filled
    (``{id}``, ``{name}``, ``{name_prefix}``: the name but its last character, ``{type}``, ``{keys}``,
    ``{now_ms}``, ``{since_ms}``: ``range_s`` before now) (pure)."""
    values = {"id": dev.id or "", "name": dev.name, "name_prefix": dev.name[:-1] if len(dev.name) > 1 else dev.name,
              "type": dev.type, "keys": keys, "now_ms": str(now_ms), "since_ms": str(now_ms - int(range_s * 1000))}
    return (form.get("method", "GET"), _fill(form["path"], values), _fill(dict(form.get("params") or {}), values),
            _fill(form.get("body"), values))


def check_answer(op: str, form: dict[str, Any], data: Any) -> None:
    """RuntimeError when a 200 answer is not what ``form`` expects: a JSON object, whose ``expect`` key (when
    the form names one) is non-empty (pure)."""
    if not isinstance(data, dict):
        raise RuntimeError(f"{op}: not a JSON object: {str(data)[:80]}")
    key = form.get("expect")
    if key and not data.get(key):
        raise RuntimeError(f"{op}: nothing in {key!r} of the answer: {json.dumps(data)[:120]}")


@dataclass(frozen=True)
class MixCriteria:
    """When a step's mix operations did not keep up (beside the writes' own criteria and GC)."""
    error_fraction: float = 0.01     # errors (refusals included) / scheduled
    late_fraction: float = 0.5       # late sends / scheduled: generator-bound
    latency_k: float = 5.0           # p99 > k x the first step's p99 ...
    latency_floor_ms: float = 250.0  # ... and above this


def ops_failures(window: dict[str, dict], baseline: dict[str, dict] | None,
                 crit: MixCriteria = MixCriteria()) -> list[tuple[str, str]]:
    """``[(criterion, reason)]``: every criterion a step's ``window`` (op -> :meth:`OpStats.window`) failed,
    one entry each, in this order: ``generator`` (late sends), ``errors`` (more than ``error_fraction`` failed,
    timed out or were refused), ``latency-knee`` (p99 past ``latency_k`` x the ``baseline`` step's and the
    floor); each reason names every operation that failed it. ``[]`` when every one kept up (pure)."""
    late, errors, slow = [], [], []
    for op, w in window.items():
        n = w.get("scheduled", 0)
        if n and w.get("late", 0) / n > crit.late_fraction:
            late.append(f"{op}: {w['late']:,} of {n:,} sends late")
        if n and w.get("errors", 0) / n > crit.error_fraction:
            kinds = [f"{w[k]:,} {what}" for k, what in (("timeouts", f"timed out ({TIMEOUT_S:g} s)"),
                                                         ("refused", "refused: too many in-flight requests"))
                     if w.get(k)]
            errors.append(f"{op}: {w['errors']:,} of {n:,} failed ({w['errors'] / n:.0%}"
                          + "".join(f", {k}" for k in kinds) + ")")
        base = (baseline or {}).get(op, {}).get("p99_ms")
        p99 = w.get("p99_ms")
        if p99 is not None and base and p99 > crit.latency_k * base and p99 > crit.latency_floor_ms:
            slow.append(f"{op}: p99 {p99:,.0f} ms > {crit.latency_k:g} x the first step's {base:,.0f} ms")
    out = []
    if late:
        out.append(("generator", "; ".join(late) + ": the mix client cannot keep its schedule"))
    if errors:
        out.append(("errors", "; ".join(errors) + f" (> {crit.error_fraction:.0%})"))
    if slow:
        out.append(("latency-knee", "; ".join(slow) + f" (and > {crit.latency_floor_ms:g} ms)"))
    return out


def judge_ops(window: dict[str, dict], baseline: dict[str, dict] | None,
              crit: MixCriteria = MixCriteria()) -> tuple[str | None, str]:
    """The first of :func:`ops_failures` (``(None, "")`` when every operation kept up) (pure)."""
    fails = ops_failures(window, baseline, crit)
    return fails[0] if fails else (None, "")


class MixClient:
    """Reads, searches and modifications on an open-model schedule (module docstring); one loop thread."""

    def __init__(self, base_url: str, username: str, password: str, devices: Iterable[MixDevice], *,
                 shares: dict[str, float], keys: str = "seq", forms: dict[str, dict[str, Any]] | None = None,
                 range_s: float = 60.0, kafka_bootstrap: str | None = None,
                 kafka_topic: str | None = None, max_in_flight: int = 64, seed: int = 1):
        self.base_url = base_url.rstrip("/")
        self.username, self.password = username, password
        self.devices = list(devices)
        self.forms = dict(forms if forms is not None else DEFAULT_FORMS)
        if "read" not in self.forms:
            raise ValueError("the warm-up reads every device with the request form 'read'")
        unknown = [op for op, s in shares.items() if s > 0 and op not in NOT_HTTP and op not in self.forms]
        if unknown:
            raise ValueError(f"no request form for {', '.join(unknown)}")
        self.shares = {op: s for op, s in shares.items() if op != "write" and s > 0}
        self.keys, self.range_s = keys, range_s
        self.kafka_bootstrap, self.kafka_topic = kafka_bootstrap, kafka_topic
        if "modify" in self.shares and not (kafka_bootstrap and kafka_topic):
            raise ValueError("modify needs the stack's Kafka topic (observe.kafka)")
        self.max_in_flight = max_in_flight
        self.rng = random.Random(seed)
        self.stats = {op: OpStats(op) for op in self.shares}
        self.warmup: dict[str, Any] | None = None
        self._jwt: str | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._producer: Any = None
        self.t0: float | None = None
        self.elapsed = 0.0
        self.error: str | None = None

    # ------------------------------------------------------------- HTTP

    async def _login(self, session: aiohttp.ClientSession) -> None:
        async with session.post(f"{self.base_url}/api/auth/login",
                                json={"username": self.username, "password": self.password}) as r:
            if r.status != 200:
                raise RuntimeError(f"login at {self.base_url} answered {r.status}: {(await r.text())[:200]}")
            self._jwt = (await r.json())["token"]

    async def _get(self, session: aiohttp.ClientSession, path: str, params: dict[str, str], *,
                   method: str = "GET", body: Any = None) -> Any:
        """The JSON of a 200 answer; raises RuntimeError naming the status otherwise."""
        async with session.request(method, f"{self.base_url}{path}", params=params, json=body,
                                   headers={"X-Authorization": f"Bearer {self._jwt}"}) as r:
            data = await r.read()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {data[:120].decode(errors='replace')}")
            return json.loads(data) if data else None

    async def _request(self, session: aiohttp.ClientSession, op: str, dev: MixDevice) -> None:
        """One HTTP operation: its form rendered for ``dev``, sent, its answer checked."""
        form = self.forms[op]
        method, path, params, body = render_request(form, dev, keys=self.keys, now_ms=int(time.time() * 1000),
                                                    range_s=self.range_s)
        check_answer(op, form, await self._get(session, path, params, method=method, body=body))

    async def _read(self, session: aiohttp.ClientSession, dev: MixDevice) -> None:
        await self._request(session, "read", dev)

    async def _lookup(self, session: aiohttp.ClientSession, dev: MixDevice) -> MixDevice:
        data = await self._get(session, "/api/tenant/devices", {"deviceName": dev.name})
        return MixDevice(dev.name, data["id"]["id"], data.get("type") or "default")

    # ------------------------------------------------------------- warm-up

    def warm_up(self, concurrency: int = 8) -> dict[str, Any]:
        """Touch every device once, before the ramp: its id by name (the registry), then one read by id;
        ``{entities, seconds, lookup: {...}, read: {...}}`` (kept apart from the ramp's numbers).  Raises
        RuntimeError when a device cannot be found (the mix cannot address it)."""
        return asyncio.run(self._warm_up(concurrency))

    async def _warm_up(self, concurrency: int) -> dict[str, Any]:
        lookup, read = OpStats("lookup"), OpStats("read")
        sem = asyncio.Semaphore(concurrency)
        t0 = time.monotonic()
        found: list[MixDevice | None] = [None] * len(self.devices)

        async def one(i: int, dev: MixDevice, session: aiohttp.ClientSession) -> None:
            async with sem:
                lookup.at(0).scheduled += 1
                t = time.monotonic()
                try:
                    found[i] = d = await self._lookup(session, dev)
                    lookup.answered(0, time.monotonic() - t, None)
                except Exception as e:
                    lookup.error(0, f"{type(e).__name__}: {e}")
                    return
                read.at(0).scheduled += 1
                t = time.monotonic()
                try:
                    await self._read(session, d)
                    read.answered(0, time.monotonic() - t, None)
                except Exception as e:
                    read.error(0, f"{type(e).__name__}: {e}")

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as session:
            await self._login(session)
            await asyncio.gather(*(one(i, d, session) for i, d in enumerate(self.devices)))
        secs = time.monotonic() - t0
        missing = [d.name for d, f in zip(self.devices, found) if f is None]
        self.warmup = {"entities": len(self.devices), "found": len(self.devices) - len(missing),
                       "seconds": round(secs, 2), "lookup": lookup.totals(secs), "read": read.totals(secs)}
        if missing:
            raise RuntimeError(f"warm-up: {len(missing)} of {len(self.devices)} devices not found by name "
                               f"(first {missing[0]}: {lookup.first_error})")
        self.devices = [f for f in found if f is not None]
        return self.warmup

    # ------------------------------------------------------------- the schedule

    def start(self, rates: list[float]) -> None:
        """Send the mix's share of ``rates[s]`` ops/s in second ``s`` (from now), on the loop thread."""
        if self._thread is not None:
            raise RuntimeError("MixClient already started")
        if self.shares.get("modify"):
            self._producer = Producer({"bootstrap.servers": self.kafka_bootstrap, "acks": 1, "linger.ms": 2,
                                       "log_level": 0})
        self.t0 = time.monotonic()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run(list(rates))), name="monsoon-mix",
                                        daemon=True)
        self._thread.start()

    def join(self, timeout: float | None = None) -> None:
        """Wait until the schedule has been sent and answered (or ``timeout``)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def stop(self, timeout: float = TIMEOUT_S + 5) -> None:
        """Stop scheduling; wait for what is in flight (up to ``timeout``)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._producer is not None:
            self._producer.flush(5)
            self._producer.poll(0)

    def second(self, now: float | None = None) -> int:
        return int(((now or time.monotonic()) - (self.t0 or 0)))

    async def _run(self, rates: list[float]) -> None:
        tasks: set[asyncio.Task] = set()
        carry: dict[str, float] = {}
        conn = aiohttp.TCPConnector(limit=self.max_in_flight * len(self.shares))
        try:
            async with aiohttp.ClientSession(connector=conn, timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as session:
                await self._login(session)
                t0 = self.t0 or time.monotonic()
                for s, rate in enumerate(rates):
                    if self._stop.is_set():
                        break
                    for off, op in schedule_second(per_second_counts(rate, self.shares, carry)):
                        intended = t0 + s + off
                        delay = intended - time.monotonic()
                        if delay > 0:
                            await asyncio.sleep(delay)
                        if self._stop.is_set():
                            break
                        self._fire(op, s, intended, session, tasks)
                    if self._producer is not None:
                        self._producer.poll(0)
                end = time.monotonic() + TIMEOUT_S
                while tasks and time.monotonic() < end:
                    await asyncio.sleep(0.05)
                    if self._producer is not None:
                        self._producer.poll(0)
        except Exception as e:    # said in the record; the ramp's judge sees the missing answers
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self.elapsed = time.monotonic() - (self.t0 or time.monotonic())

    def _fire(self, op: str, s: int, intended: float, session: aiohttp.ClientSession, tasks: set) -> None:
        st = self.stats[op]
        sec = st.at(s)
        sec.scheduled += 1
        if time.monotonic() - intended > LATE_S:
            sec.late += 1
        if st.in_flight >= self.max_in_flight:
            sec.refused += 1
            st.error(s, "refused: too many in-flight requests")
            return
        dev = self.devices[self.rng.randrange(len(self.devices))]
        sec.sent += 1
        st.in_flight += 1
        if op == "modify":
            self._modify(st, dev, intended)
            return
        task = asyncio.get_running_loop().create_task(self._http(op, st, dev, intended, session))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        if self._producer is not None:
            self._producer.poll(0)

    async def _http(self, op: str, st: OpStats, dev: MixDevice, intended: float,
                    session: aiohttp.ClientSession) -> None:
        err, timed_out = None, False
        try:
            await self._request(session, op, dev)
        except Exception as e:
            err = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            timed_out = isinstance(e, asyncio.TimeoutError)   # aiohttp's timeouts are TimeoutErrors too
        finally:
            st.in_flight -= 1
        now = time.monotonic()
        st.answered(self.second(now), now - intended, err, timeout=timed_out)

    def _modify(self, st: OpStats, dev: MixDevice, intended: float) -> None:
        now_ms = int(time.time() * 1000)
        value = json.dumps({"id": str(uuid.uuid4()), "d": dev.id, "n": dev.name, "t": dev.type, "ts": now_ms,
                            "p": json.dumps({"mod": now_ms})}).encode()

        def delivered(err, _msg) -> None:
            st.in_flight -= 1
            now = time.monotonic()
            st.answered(self.second(now), now - intended, None if err is None else f"KafkaError: {err}")
        try:
            self._producer.produce(self.kafka_topic, value, key=(dev.id or dev.name).encode(), on_delivery=delivered)
        except BufferError as e:
            st.in_flight -= 1
            st.error(self.second(), f"BufferError: {e}")

    # ------------------------------------------------------------- results

    def window(self, a: int, b: int) -> dict[str, dict]:
        """Each operation's counts and latencies over the schedule's seconds ``[a, b)``."""
        return {op: st.window(a, b) for op, st in self.stats.items()}

    def totals(self) -> dict[str, dict]:
        return {op: st.totals(self.elapsed) for op, st in self.stats.items()}
