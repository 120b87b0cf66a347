"""The native engine: :class:`NativeFleet` drives ``monsoon-loadgen`` (Rust, ``monsoon/load/loadgen``) in
``workers`` processes, worker i the devices ``[i*D/n, (i+1)*D/n)`` (``--shard i/n``) of the same global schedule
as :class:`~monsoon.load.mqtt.MqttFleet`. Each worker speaks JSON lines on stdin/stdout (``connected``,
``start <unix_ms>``, one line a second with its histogram, ``stop``, ``totals``); the seconds and histograms
of all workers are summed into one :class:`~monsoon.load.stats.SecondStats` a second. See docs for the protocol.
"""
from __future__ import annotations

import dataclasses
import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow
from hdrh.histogram import HdrHistogram

from monsoon.load.base import FleetBase, FleetOptions
from monsoon.load.hono import LegRecorder, leg_cycle
from monsoon.load.loadgen_build import CRATE_DIR, LoadgenBuildError, ensure_loadgen
from monsoon.load.payloads import Payload
from monsoon.load.schedule import Schedule
from monsoon.load.stats import ACKED_CSV_HEADER, FleetConnectError, FleetTotals, SecondStats, _pct_ms
from monsoon.spec.experiment import PER_SOURCE, workers_problem
from monsoon.stack.provision import Device
from monsoon.timeline.columnar import FLUSH_S, PartWriter, csv_block_table, release, shard_block, shard_path


__all__ = ["CRATE_DIR", "LoadgenBuildError", "NativeFleet", "NativeHonoCoapFleet", "ensure_loadgen", "loadgen_config",
           "loopback_sources", "shard_range"]

SLICE_BYTES = 16 << 20   # the most of one shard's CSV turned into a part at once (~330,000 acks): bounded memory


def shard_range(n_devices: int, i: int, n: int) -> tuple[int, int]:
    """Device index range ``[lo, hi)`` of shard ``i`` of ``n`` (the binary's ``--shard i/n``)."""
    if n < 1 or not 0 <= i < n:
        raise ValueError(f"shard {i}/{n}: need 0 <= i < n")
    return i * n_devices // n, (i + 1) * n_devices // n


def loadgen_config(devices: Sequence[Device], host: str, port: int, options: FleetOptions | None = None, /, *,
                   shard_csv: str | None = None, connect_timeout_s: float = 30.0, hist: bool = True,
                   client_id_prefix: str = "", step: float = 0.1, **fields: Any) -> dict[str, Any]:
    """The binary's JSON config for a fleet of ``options`` (or the :class:`FleetOptions` ``fields``): segments from
    ``Schedule(shape).segments()``, each worker's acks into ``shard_csv`` (``{shard}`` its index; None = none).
    ``batch_ms``: due messages are written at most once per this many ms, all of a connection's in one write
    (None = the engine's default, 5 ms, never more than a quarter of the late tolerance; 0 = at every wake-up)."""
    o = options if options is not None else FleetOptions(**fields)
    segs = [[float(a), float(b), float(r)] for a, b, r in Schedule(o.shape, step=step).segments()]
    extra = {} if o.batch_ms is None else {"batch_ms": float(o.batch_ms)}
    return {**extra,
        "host": host,
        "port": int(port),
        "qos": int(o.qos),
        "topic": o.topic,
        "client_id_prefix": client_id_prefix,
        "devices": [{"name": d.name, "token": d.token, **({"password": d.password} if d.password else {})}
                    for d in devices],
        "segments": segs,
        "late_tolerance_ms": o.late_tolerance_s * 1000.0,
        "payload": (o.payload or Payload()).native_spec(),
        "acked_path": shard_csv,
        "source_addrs": list(o.source_addrs),
        "connect_rate": float(o.connect_rate),
        "keepalive_s": int(o.keepalive),
        "drain_timeout_s": float(o.drain_timeout_s),
        "connect_timeout_s": float(connect_timeout_s),
        "hist": bool(hist),
    }


def _hist_sum(lines: list[dict], key: str) -> HdrHistogram | None:
    """The histograms (HdrHistogram V2, base64) under ``key`` of the workers' ``lines``, added up (None: none)."""
    total = None
    for ln in lines:
        b64 = ln.get(key)
        if not b64:
            continue
        h = HdrHistogram.decode(b64)
        if total is None:
            total = h
        else:
            total.add(h)
    return total


@dataclass
class _Worker:
    index: int
    proc: subprocess.Popen
    shard_csv: Path
    lines: queue.Queue = field(default_factory=queue.Queue)
    reader: threading.Thread | None = None
    connected: dict | None = None
    totals: dict | None = None
    rusage: Any = None     # resource.struct_rusage once reaped
    stderr_path: Path | None = None
    last_t: int = -1
    shard_off: int = 0     # bytes of shard_csv already turned into parts (the header included)


def loopback_sources(host: str, n_devices: int) -> list[str]:
    """For a loopback target with more devices than one source address can connect (emqtt-bench's
    ``--ifaddr``): 127.0.0.2, 127.0.0.3, ... one per 20,000 devices; none otherwise (the kernel picks)."""
    if n_devices <= PER_SOURCE or not host.startswith("127."):
        return []
    return [f"127.0.0.{2 + i}" for i in range(-(-n_devices // PER_SOURCE))]


class NativeFleet(FleetBase):
    """A fleet of MQTT devices publishing an open-model load from native worker processes.

    Options as :class:`~monsoon.load.mqtt.MqttFleet` (``clock``/``wall`` do not apply: the workers keep time),
    plus ``workers`` (processes; each holds at most ~19,900 connections under a 20,000 open-file hard limit),
    ``source_addrs`` (127.0.0.x addresses client sockets are bound to, round-robin, for more than ~28k
    connections to one port), ``connect_rate`` (new connections/s per worker, 0 = unlimited), ``batch_ms`` (the
    engine's batching tick: due messages go out at most once per tick, all of a connection's in one write; None =
    the engine's 5 ms, 0 = at every wake-up), ``max_pending_connects`` (handshakes in flight per worker; None =
    the engine's 512). Each second's :class:`~monsoon.load.stats.SecondStats` carries ``gen_cpu_s``, the
    workers' own CPU seconds.
    """

    ENDPOINT = "MQTT broker"     # what the fleet's connect errors call the endpoint

    def __init__(self, devices: list[Device], host: str, port: int, options: FleetOptions | None = None,
                 **fields: Any) -> None:
        super().__init__(devices, host, port, options, **fields)
        o = self.options
        if not 1 <= int(o.workers) <= len(self.devices):
            raise ValueError(f"workers must be from 1 to the number of devices, got {o.workers!r}")
        self.n_workers = int(o.workers)
        self.source_addrs = list(o.source_addrs) or loopback_sources(host, len(self.devices))
        problem = workers_problem(len(self.devices), self.n_workers)
        if problem:
            raise ValueError(problem)
        self._binary = o.binary
        self._workers: list[_Worker] = []

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers]

    def config(self, *, connect_timeout_s: float = 30.0) -> dict[str, Any]:
        mpc = self.options.max_pending_connects
        extra = {} if mpc is None else {"max_pending_connects": int(mpc)}
        return extra | loadgen_config(
            self.devices, self.host, self.port, dataclasses.replace(self.options, source_addrs=self.source_addrs),
            shard_csv=str(shard_path(self.acked_path, "{shard}")), connect_timeout_s=connect_timeout_s, hist=True)

    def _ready(self) -> bool:
        return bool(self._workers)

    # -------------------------------------------------------------- connect
    def connect(self, timeout: float = 30) -> None:
        """Start the workers; returns once every device has its CONNACK.

        Raises :class:`~monsoon.load.stats.FleetConnectError` (and stops every worker) otherwise.
        """
        self._check_open()
        if self._workers:
            return
        binary = self._binary or ensure_loadgen()
        self.acked_path.parent.mkdir(parents=True, exist_ok=True)
        cfg_path = self.acked_path.with_name(f".{self.acked_path.name}.loadgen.json")
        cfg_path.write_text(json.dumps(self.config(connect_timeout_s=timeout)))
        try:
            for i in range(self.n_workers):
                err = self.acked_path.with_name(f".{self.acked_path.name}.worker{i}.stderr")
                with open(err, "wb") as ef:
                    proc = subprocess.Popen(
                        [str(binary), "run", "--config", str(cfg_path), "--shard",
                         f"{i}/{self.n_workers}", "--wait-start"],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=ef,
                        text=True, bufsize=1,
                    )
                w = _Worker(i, proc, shard_path(self.acked_path, i),
                            stderr_path=err)
                w.reader = threading.Thread(target=self._read_lines, args=(w,), daemon=True,
                                            name=f"loadgen-{i}-reader")
                w.reader.start()
                self._workers.append(w)
            deadline = time.monotonic() + timeout + 5
            for w in self._workers:
                while w.connected is None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise FleetConnectError(f"{self.ENDPOINT} {self.endpoint}: worker {w.index} did not "
                                                f"connect its devices within {timeout:g}s")
                    try:
                        msg = w.lines.get(timeout=min(left, 0.5))
                    except queue.Empty:
                        continue
                    if msg is None:
                        raise FleetConnectError(
                            f"{self.ENDPOINT} {self.endpoint}: load worker {w.index} exited "
                            f"({w.proc.poll()}) before connecting: {self._stderr(w)}")
                    if "error" in msg:
                        raise FleetConnectError(f"{self.ENDPOINT} {self.endpoint}: {msg['error']}")
                    if msg.get("event") == "connected":
                        w.connected = msg
            done = [w.connected for w in self._workers if w.connected]
            self._n_connected = sum(c["connected"] for c in done)
            # how the connect went (the harness's `connected` event): its seconds, and handshakes begun again
            self.extra["connect"] = {"seconds": round(max(float(c.get("connect_s") or 0) for c in done), 2)} | (
                {"handshake_restarts": sum(int(c["handshake_restarts"]) for c in done)}
                if any("handshake_restarts" in c for c in done) else {})
        except BaseException:
            self._kill_all()
            raise

    def _stderr(self, w: _Worker) -> str:
        try:
            return (w.stderr_path.read_text(errors="replace").strip() if w.stderr_path else "")[-2000:]
        except OSError:
            return ""

    def _read_lines(self, w: _Worker) -> None:
        assert w.proc.stdout is not None
        for line in w.proc.stdout:
            line = line.strip()
            if not line:
                continue
            try:
                w.lines.put(json.loads(line))
            except ValueError:
                continue
        w.lines.put(None)

    # ------------------------------------------------------------------ run
    def _send(self, w: _Worker, text: str) -> None:
        try:
            assert w.proc.stdin is not None
            w.proc.stdin.write(text)
            w.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def _run(self, stop: threading.Event, on_second: Callable[[SecondStats], None] | None) -> FleetTotals:
        targets = Schedule(self.shape).expected_per_second()   # the per-second target, as in MqttFleet
        start_wall = time.time() + (0.05 if self.n_workers > 1 else 0.0)
        self._open_hlog(start_wall)
        start_ms = int(start_wall * 1000)
        parts = self._open_acked()
        next_part = time.monotonic() + FLUSH_S
        for w in self._workers:
            self._send(w, f"start {start_ms}\n")
        pending: dict[int, list[dict]] = {}   # second -> lines of the workers so far
        done: set[int] = set()
        emitted = -1
        stop_sent = False
        n = len(self._workers)
        conn_by_worker: dict[int, int] = {}

        def emit(sec: int, lines: list[dict]) -> None:
            self._second_extra(sec, lines)
            h = _hist_sum(lines, "hist")
            if h is not None and self._hlog is not None:
                self._hlog.write(sec, h)
            p50, p99, mx = _pct_ms(h)
            for ln in lines:   # a worker without a line for this second keeps its last count
                conn_by_worker[ln["_w"]] = ln["connected"]
            self._n_connected = sum(conn_by_worker.values())
            if on_second is not None:
                on_second(SecondStats(
                    t=sec, target_rate=targets[sec] if sec < len(targets) else 0.0,
                    scheduled=sum(ln["scheduled"] for ln in lines),
                    sent=sum(ln["sent"] for ln in lines), acked=sum(ln["acked"] for ln in lines),
                    failed=sum(ln["failed"] for ln in lines), late=sum(ln["late"] for ln in lines),
                    held=sum(int(ln.get("held") or 0) for ln in lines),   # the CoAP engine's (NSTART = 1)
                    connected=self._n_connected, p50_ms=p50, p99_ms=p99, max_ms=mx,
                    gen_cpu_s=round(sum(float(ln.get("cpu_s") or 0.0) for ln in lines), 4),
                ))

        try:
            while len(done) < n:
                if not stop_sent and (stop.is_set() or self._closing):
                    for w in self._workers:
                        self._send(w, "stop\n")
                    stop_sent = True
                got = False
                for w in self._workers:
                    if w.index in done:
                        continue
                    try:
                        msg = w.lines.get_nowait()
                    except queue.Empty:
                        continue
                    got = True
                    if msg is None:
                        done.add(w.index)
                        continue
                    if "totals" in msg:
                        w.totals = msg["totals"]
                        continue
                    if "t" in msg:
                        w.last_t = int(msg["t"])
                        msg["_w"] = w.index
                        pending.setdefault(w.last_t, []).append(msg)
                    elif "error" in msg:
                        raise RuntimeError(f"load worker {w.index}: {msg['error']}")
                # emit every second all live workers have reported
                while True:
                    sec = emitted + 1
                    lines = pending.get(sec)
                    if lines is None:
                        break
                    if any(w.last_t < sec and w.totals is None and w.index not in done
                           for w in self._workers):
                        break   # a worker has not finished its second `sec` yet
                    emit(sec, pending.pop(sec))
                    emitted = sec
                if time.monotonic() >= next_part:   # the shards are flushed up to each worker's last second
                    self._shards_to_parts(parts)
                    next_part = time.monotonic() + FLUSH_S
                if not got:
                    time.sleep(0.01)
            for sec in sorted(pending):
                emit(sec, pending.pop(sec))
        finally:
            if self._hlog is not None:
                self._hlog.close()
                self._hlog = None
            self._reap()
            try:
                self._shards_to_parts(parts, last=True)
            finally:
                self._close_writers()
        missing = [w.index for w in self._workers if w.totals is None]
        if missing:
            raise RuntimeError(f"load worker(s) {missing} ended without totals: "
                               + "; ".join(self._stderr(self._workers[i]) for i in missing))
        tots = [w.totals for w in self._workers if w.totals is not None]
        p50, p99, mx = _pct_ms(_hist_sum(tots, "hist"))
        lp50, lp99, lmx = _pct_ms(_hist_sum(tots, "send_late_hist"))
        last_seq: dict[str, int] = {}
        for t in tots:
            last_seq.update(t["last_seq"])

        def s(k: str) -> int:
            return sum(int(t[k]) for t in tots)

        self.extra |= {
            "send_late_p50_ms": lp50, "send_late_p99_ms": lp99, "send_late_max_ms": lmx,
            # the engine's own account of the load (its start to its drain): CPU seconds and syscalls
            "engine": {k: sum(float(t.get(k) or 0) for t in tots) for k in ("cpu_s", "writes", "reads", "wakeups")},
            "workers": [{"pid": w.proc.pid, "range": (w.totals or {}).get("range"),
                         "cpu_s": (w.rusage.ru_utime + w.rusage.ru_stime) if w.rusage else None,
                         "maxrss_mb": (w.rusage.ru_maxrss / 1024.0) if w.rusage else None}
                        for w in self._workers],
        }
        self._totals_extra(tots)
        return FleetTotals(
            scheduled=s("scheduled"), sent=s("sent"), acked=s("acked"), failed=s("failed"),
            late=s("late"), dropped=s("dropped"), unacked=s("unacked"), last_seq=last_seq,
            p50_ms=p50, p99_ms=p99, max_ms=mx, reconnects=s("reconnects"),
            elapsed_s=max(float(t["elapsed_s"]) for t in tots), lost_in_flight=s("lost_in_flight"),
        )

    def _totals_extra(self, tots: list[dict]) -> None:
        """What a transport adds to ``extra`` from the workers' totals lines (none for MQTT)."""

    def _second_extra(self, sec: int, lines: list[dict]) -> None:
        """What a transport takes from second ``sec``'s lines of the workers (nothing for MQTT)."""

    def _reap(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        for w in self._workers:
            if w.rusage is not None:
                continue
            p = w.proc
            try:
                if p.stdin is not None:
                    p.stdin.close()
            except OSError:
                pass
            while True:
                pid, status, ru = os.wait4(p.pid, os.WNOHANG)
                if pid:
                    w.rusage = ru
                    p.returncode = os.waitstatus_to_exitcode(status)
                    break
                if time.monotonic() > deadline:
                    p.send_signal(signal.SIGKILL)
                    deadline = time.monotonic() + 5
                time.sleep(0.01)
            if w.reader is not None:
                w.reader.join(5)

    def _shards_to_parts(self, parts: PartWriter, last: bool = False) -> None:
        """The workers' complete CSV lines since the last call, as one Parquet part (parsed by Arrow) whose footer
        says how far each shard is now in parts (what :func:`~monsoon.timeline.columnar.salvage_shards` starts
        from after a ``kill -9``); only then, the part durable, are the bytes taken released from the shards (a
        hole punched, so the disk holds the parts, not a day of CSV).  ``last``: the run is over and the shards
        are removed (a line cut off by a killed worker is not data)."""
        while True:    # in slices of at most SLICE_BYTES per shard: the memory it takes does not grow with the rate
            blocks, taken = [], []
            for w in self._workers:
                try:
                    block, end = shard_block(w.shard_csv, w.shard_off, limit=SLICE_BYTES)
                except FileNotFoundError:
                    continue
                blocks.append(block)
                taken.append((w, end))
            data = b"".join(blocks)
            if data:
                parts.write_table(csv_block_table(data, ACKED_CSV_HEADER),
                                  shard_offsets={w.shard_csv.name: end for w, end in taken})
            more = False
            for w, end in taken:
                more = more or end - w.shard_off >= SLICE_BYTES // 2   # a full slice: there may be more behind it
                w.shard_off = end
                try:
                    with open(w.shard_csv, "rb+") as f:
                        release(f.fileno(), end)
                except FileNotFoundError:
                    pass
            del blocks, data
            if not more:
                break
        # Arrow's allocator (mimalloc) keeps the freed pages of the slices' tables: hand them back, so the process's
        # RSS between two parts is what it holds, not the high-water mark of the last burst of parsing
        pyarrow.default_memory_pool().release_unused()
        if last:
            for w in self._workers:
                w.shard_csv.unlink(missing_ok=True)

    # ---------------------------------------------------------------- close
    def _kill_all(self) -> None:
        for w in self._workers:
            if w.proc.poll() is None and w.rusage is None:
                try:
                    w.proc.send_signal(signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 5
        for w in self._workers:
            if w.rusage is not None:
                continue
            try:
                w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait(5)
            for f in (w.proc.stdin, w.proc.stdout):
                try:
                    if f is not None:
                        f.close()
                except OSError:
                    pass
            try:
                w.shard_csv.unlink()
            except OSError:
                pass
        self._workers = []
        self._n_connected = 0

    def _teardown(self) -> None:
        """Every worker process stopped; their config and empty stderr files removed."""
        try:
            self._kill_all()
        finally:
            self._cleanup_files()

    def _cleanup_files(self) -> None:
        """Remove the worker config and empty worker stderr files (a non-empty one is kept: it
        explains a failure)."""
        stem = f".{self.acked_path.name}"
        for p in self.acked_path.parent.glob(f"{stem}.*"):
            try:
                if p.name.endswith(".loadgen.json") or (p.name.endswith(".stderr") and p.stat().st_size == 0):
                    p.unlink()
            except OSError:
                pass


class NativeHonoCoapFleet(NativeFleet):
    """Devices on Eclipse Hono's CoAP adapter over DTLS with a pre-shared key, from native workers
    (``monsoon-loadgen run`` with ``transport: hono-coap``, OpenSSL's DTLS): what
    :class:`~monsoon.load.coap.HonoCoapFleet` does (PSK identity ``Device.token``, key
    ``psk_key(Device.password)``; telemetry, events, command queries ``?hono-ttd=5`` and command responses by
    ``legs``; every request confirmable, one outstanding per device), each device holding its DTLS session
    through the run. The legs are recorded as the Python fleets do (:class:`~monsoon.load.hono.LegRecorder`: each
    second's outcomes and round trips from the workers' lines into ``legs.json`` and ``legs-<leg>.hlog``, the
    summary in ``extra["legs"]``); the failed messages by cause (``coap 5.03``, ``timeout``, ...) are in
    ``extra["errors"]``."""

    transport = "hono-coap"
    ENDPOINT = "CoAP/DTLS endpoint"
    TTD_S = 5

    def config(self, *, connect_timeout_s: float = 30.0) -> dict[str, Any]:
        return super().config(connect_timeout_s=connect_timeout_s) | {
            "transport": "hono-coap", "kinds": list(leg_cycle(self.options.legs)), "ttd_s": self.TTD_S,
            "leg_timeout_s": float(self.options.request_timeout_s)}

    def __init__(self, devices: list[Device], host: str, port: int, options: FleetOptions | None = None,
                 **fields: Any) -> None:
        super().__init__(devices, host, port, options, **fields)
        self.recorder = LegRecorder()

    def _open_hlog(self, start_wall_s: float) -> None:
        super()._open_hlog(start_wall_s)
        self.recorder.open(self.acked_path.parent, start_wall_s)

    def _second_extra(self, sec: int, lines: list[dict]) -> None:
        for ln in lines:
            for leg, d in (ln.get("legs") or {}).items():
                self.recorder.add(leg, int(d.get("ok") or 0), {c: int(n) for c, n in (d.get("codes") or {}).items()},
                                  HdrHistogram.decode(d["hist"]) if d.get("hist") else None)
        self.recorder.sec = sec
        self.recorder.second()

    def _run(self, stop: threading.Event, on_second: Callable[[SecondStats], None] | None) -> FleetTotals:
        try:
            return super()._run(stop, on_second)
        finally:
            self.recorder.write()

    def _totals_extra(self, tots: list[dict]) -> None:
        self.extra["legs"] = self.recorder.summary()
        errors: dict[str, int] = {}
        for t in tots:
            for cause, n in (t.get("errors") or {}).items():
                errors[cause] = errors.get(cause, 0) + int(n)
        self.extra["errors"] = errors
        # DTLS flights sent again on a handshake's timer, and handshakes given up (5 s without completing) and
        # begun again on a new socket, connect phase included
        self.extra["dtls"] = {k: sum(int(t.get(f"dtls_handshake_{k}") or 0) for t in tots)
                              for k in ("retransmits", "restarts")}
