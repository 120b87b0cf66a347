"""``python -m monsoon.selftest.bench`` (``make bench-load``): the native load core against baselines.

One run, one sink, phases one after the other (the machine has 2 cores: nothing else of
the bench runs during a measured phase):

1. **CPU per acked QoS1 message** of the generator process(es) only (utime + stime):
   ``monsoon`` (native core, ``NativeFleet``, 1 worker, ``--devices`` 50; whole process from ``wait4``;
   its batching tick at the engine's default, 5 ms), ``monsoon_unbatched`` (the same with ``batch_ms`` 0:
   every wake-up writes what is due, the engine before issue 29), ``floor`` / ``floor_unbatched`` (the
   physical floor: ``monsoon-loadgen floor``, pre-encoded 146-byte publishes written ``batch`` at a time
   on as many connections to the same sink, no schedule, no payload work, no accounting, at the batch
   the engine run achieved: ``ratio_floor`` = monsoon / floor), ``floor_paced`` (the same floor on the engine's
   clock: ``--rate`` = the engine's rate, a wake-up every tick of ``batch_ms``, writing what is due; what pacing
   itself costs, without monsoon's schedule, payloads or accounting: ``ratio_floor_paced`` = monsoon / it),
   ``paho`` (a plain paho-mqtt 2.2 client in a subprocess publishing QoS1 as fast as it can,
   large ``max_inflight``, until every PUBACK; measured by ``getrusage`` around connect +
   publish + acks, so interpreter start-up does not count) and ``monsoon_python`` (the
   Python :class:`~monsoon.load.mqtt.MqttFleet`, same measure), and ``locust`` (a load tool users run
   themselves: Locust's own MQTT user, ``--devices`` users as fast as they go, in its own virtualenv
   installed into the cache on first use; its CPU is a ``--peer-long`` run's minus a ``--peer-short``
   run's, so start-up does not count; ``ratio_locust`` = monsoon / locust; ``--skip-peer`` leaves it out).
   ``ratio`` = monsoon / paho (goal <= 0.1),
   ``monsoon`` itself goal <= 2 us; ``msgs_per_write`` says how many publishes each write carried.
2. **Connections held**: ``--connections`` devices (default 50,000) over several worker
   processes (``--shard``; a 20,000 open-file hard limit per process) and source addresses
   127.0.0.2.., publishing a low rate for ``--hold`` s; ``max_connections`` is the lowest
   connected count over the hold, ``rss_mb`` the workers' summed RSS (VmRSS), its maximum.
   ``--many``: 250,000 connections, 19,000 per worker (the open-file hard limit here is 20,000 and
   cannot be raised without CAP_SYS_RESOURCE), 25 source addresses (``--per-source`` 10,000), opened at ``--connect-rate``
   10,000/s, kept alive with PINGREQs (keep-alive 20 s), against one sink process per 15,000. ``--million``:
   1,000,000 connections the same way (53 workers, 100 source addresses, 67 sinks) at 8,000/s, keep-alive 300 s,
   held 30 s; goal: the workers' RSS under 2 GB.
3. **Pacing**: ``--pacing-rate`` msg/s (20,000) for ``--pacing-duration`` s (60):
   ``pacing_error_pct`` = |sent - target| / target over the whole seconds of the target window
   (messages the generator handed to the socket in seconds ``0 <= s < duration``, against the
   schedule's per-second target; what it only sent afterwards, working off a backlog, does not
   count: sent/duration would be 0 % by construction, both engines send the whole schedule),
   ``worst_second_error_pct`` the same for the worst single second, and ``late_p99_ms`` = p99 of
   how late messages were handed to the socket vs their intended time; ``generator_cores`` the
   engine's own CPU seconds per second (``gen_cpu_s``), as every run reports it.
4. **CoAP over DTLS** (``coap``): Hono's CoAP device flow (PSK) against ``monsoon-loadgen coap-sink``: CPU per
   request of the native engine beside the Python ``HonoCoapFleet`` (goal <= 50 us native), and ``--coap-sessions``
   (2,500) devices holding their DTLS sessions (their RSS); see :mod:`monsoon.selftest.coap_bench`.

The sink is ``monsoon-loadgen sink`` (ack-only MQTT 3.1.1, SO_REUSEPORT): one process (one
thread) for the CPU phase, like one broker; ``--sinks`` processes sharing the same port from
the connections phase on (a process holds < 20,000 sockets). Per phase its CPU seconds are
reported, and its utilisation: CPU seconds / elapsed seconds of each sink process (one thread
each, so 1.0 would be a saturated sink; well below it, the sink was not the bottleneck).
(Spreading 20 connections over 4 sink processes makes the acks come back in smaller batches,
which costs the native generator ~2x CPU per message: batching, not a fixed cost.) Progress goes to stderr; the last
line on stdout is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt

from monsoon.load.mqtt import MqttFleet
from monsoon.load.native import NativeFleet, ensure_loadgen
from monsoon.load.payloads import Payload
from monsoon.load.shapes import Steady
from monsoon.load.stats import machine_cpus
from monsoon.stack.provision import Device
from monsoon.selftest.coap_bench import child_python_coap, phase_coap
from monsoon.selftest.procfs import proc_rss_mb
from monsoon.selftest.peer import LOCUST_VERSION, PeerUnavailable, measure_locust


CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def proc_cpu_s(pid: int) -> float:
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12])) / CLK_TCK


class Sinks:
    """``n`` sink processes sharing one port (SO_REUSEPORT)."""

    def __init__(self, binary: Path, n: int, threads: int = 1) -> None:
        self.port = free_port()
        self.binary = binary
        self.procs: list[subprocess.Popen] = []
        self.threads = threads
        self.add(n)

    def add(self, n: int) -> None:
        """Start ``n`` more sink processes on the same port."""
        binary, threads = self.binary, self.threads
        try:
            for _ in range(n):
                p = subprocess.Popen([str(binary), "sink", "--port", str(self.port), "--threads", str(threads)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                self.procs.append(p)
                line = p.stdout.readline() if p.stdout else ""
                if '"listening"' not in line:
                    raise RuntimeError(f"sink did not start: {line!r} {p.stderr.read() if p.stderr else ''}")
        except BaseException:
            self.close()
            raise

    @property
    def n(self) -> int:
        return len(self.procs)

    def cpu_each(self) -> list[float]:
        """CPU seconds (utime + stime) of each sink process so far, in start order."""
        return [proc_cpu_s(p.pid) for p in self.procs]

    def cpu_s(self) -> float:
        return sum(self.cpu_each())

    def mark(self) -> tuple[list[float], float]:
        """Start of a measured window: for :meth:`usage`."""
        return self.cpu_each(), time.monotonic()

    def usage(self, mark: tuple[list[float], float]) -> dict:
        """The sinks' CPU since ``mark``: ``sink_cpu_s`` in all, and ``sink_utilisation`` = CPU
        seconds / elapsed seconds of each sink process (processes started since count from 0)."""
        return sink_usage(mark[0], self.cpu_each(), time.monotonic() - mark[1])

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
            for f in (p.stdout, p.stderr):
                if f is not None:
                    f.close()


def sink_usage(before: list[float], after: list[float], elapsed_s: float) -> dict:
    """Sink CPU over a window of ``elapsed_s`` from per-process CPU seconds at its start and end."""
    d = [a - (before[i] if i < len(before) else 0.0) for i, a in enumerate(after)]
    util = [round(x / elapsed_s, 3) for x in d] if elapsed_s > 0 else []
    return {"sink_cpu_s": round(sum(d), 3), "sink_elapsed_s": round(elapsed_s, 3),
            "sink_utilisation": util, "sink_utilisation_max": max(util, default=None)}


def pacing_figures(seconds: list[Any], duration: float) -> dict:
    """Pacing of a run from its per-second stats (:class:`~monsoon.load.stats.SecondStats`), inside the
    target window only: the whole seconds ``0 <= t < duration``. ``sent`` is what the generator
    handed to the socket in that second, ``target_rate`` what the schedule asked for in it."""
    window = [s for s in seconds if 0 <= s.t and s.t + 1 <= duration + 1e-9]
    target = sum(s.target_rate for s in window)
    sent = sum(s.sent for s in window)
    errs = [abs(s.sent - s.target_rate) / s.target_rate for s in window if s.target_rate > 0]
    return {"window_s": len(window), "target_in_window": round(target, 1), "sent_in_window": sent,
            "achieved_rate": round(sent / len(window), 2) if window else None,
            "pacing_error_pct": round(abs(sent - target) / target * 100, 4) if target > 0 else None,
            "worst_second_error_pct": round(max(errs) * 100, 3) if errs else None}


# ------------------------------------------------------------------ children
def child_paho(port: int, messages: int, inflight: int) -> dict:
    """A plain paho-mqtt 2.2 client: publish ``messages`` QoS1 as fast as it can with up to
    ``inflight`` un-acked (paho's ``max_inflight_messages``), until every PUBACK arrived.

    One thread drives ``client.loop()`` and publishes whenever the window has room (on this
    machine paho's best mode: with ``loop_start()`` and a publishing main thread it is ~40 %
    slower, and paho's per-PUBACK cost grows with the number in flight: 65,535 in flight
    costs ~10x more CPU per message than 100)."""


    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    acked = [0]

    def on_publish(client, userdata, mid, rc, props):
        acked[0] += 1

    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="paho-bench", protocol=mqtt.MQTTv311)
    c.max_inflight_messages_set(inflight)
    c.max_queued_messages_set(0)
    c.on_publish = on_publish
    c.connect("127.0.0.1", port, keepalive=60)
    render = Payload().renderer(0, "paho-bench")
    t_pub = time.monotonic()
    deadline = t_pub + 300
    seq = 0
    topic = "v1/devices/me/telemetry"
    while acked[0] < messages and time.monotonic() < deadline:
        while seq < messages and seq - acked[0] < inflight:
            now_ms = int(time.time() * 1000)
            c.publish(topic, render(seq, now_ms, now_ms), qos=1)
            seq += 1
        c.loop(0.01)
    t_end = time.monotonic()
    c.disconnect()
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    return {"acked": acked[0], "complete": acked[0] >= messages, "inflight": inflight,
            "elapsed_s": round(t_end - t_pub, 3),
            "cpu_s": round((ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime), 3)}


def child_python(port: int, rate: float, duration: float, devices: int, workdir: str) -> dict:

    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    devs = [Device(f"py-{i:05d}", "") for i in range(devices)]
    with MqttFleet(devs, "127.0.0.1", port, shape=Steady(rate=rate, duration=duration),
                   acked_path=Path(workdir) / "acked-python.parquet") as f:
        f.connect()
        t = f.run(threading.Event())
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    return {"acked": t.acked, "sent": t.sent, "scheduled": t.scheduled, "late": t.late,
            "elapsed_s": t.elapsed_s, "cpu_s": (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)}


CHILD_MODULE = "monsoon.selftest.bench"   # this module, as ``python -m`` starts it for each measured child


def run_child(args: list[str]) -> dict:
    p = subprocess.run([sys.executable, "-m", CHILD_MODULE, "--child", *args],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"bench child {args[0]} failed ({p.returncode}): {p.stderr[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def run_floor(binary: Path, port: int, connections: int, messages: int, batch: int,
              rate: float = 0.0, tick_ms: float = 5.0) -> dict:
    """``monsoon-loadgen floor``: pre-encoded QoS 1 publishes, ``batch`` per write, on ``connections``
    sockets to the sink until ``messages`` are acked: the transport's cost alone (its own getrusage). ``rate``
    > 0: paced at that rate, a wake-up every ``tick_ms`` (the batch is then what each tick made due)."""
    pace = ["--rate", f"{rate:g}", "--tick-ms", f"{tick_ms:g}"] if rate > 0 else []
    p = subprocess.run([str(binary), "floor", "--port", str(port), "--connections", str(connections),
                        "--messages", str(messages), "--batch", str(batch), *pace],
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"monsoon-loadgen floor failed ({p.returncode}): {p.stderr[-2000:]}")
    f = json.loads(p.stdout.strip().splitlines()[-1])["floor"]
    return {"acked": f["messages"], "cpu_s": round(f["cpu_s"], 3), "elapsed_s": round(f["elapsed_s"], 3),
            "batch": f["batch"], "connections": f["connections"], "writes": f["writes"], "reads": f["reads"],
            "payload_bytes": f["payload_bytes"]}


def paced_tick_ms(a: argparse.Namespace) -> float:
    """The engine's wake-up period in the CPU runs: --batch-ms, else its default tick (5 ms)."""
    return a.batch_ms if a.batch_ms is not None else 5.0


def run_floor_paced(a: argparse.Namespace, sinks: Sinks, binary: Path, messages: int) -> dict:
    """The paced floor at the native run's rate and tick, ``messages`` of them (what that run acked)."""
    return run_floor(binary, sinks.port, a.devices, messages, 1, rate=a.native_rate, tick_ms=paced_tick_ms(a))


def run_native(a: argparse.Namespace, sinks: Sinks, workdir: Path, batch_ms: float | None, name: str) -> dict:
    """The native engine at ``--native-rate`` for ``--cpu-duration`` s, ``--devices`` connections, one worker:
    its whole process's CPU (``wait4``) and the engine's own counters (writes, reads, wake-ups)."""
    m0 = sinks.mark()
    devs = [Device(f"nat-{i:05d}", "") for i in range(a.devices)]
    with NativeFleet(devs, "127.0.0.1", sinks.port, shape=Steady(rate=a.native_rate, duration=a.cpu_duration),
                     acked_path=workdir / f"acked-{name}.parquet", workers=1, batch_ms=batch_ms) as f:
        f.connect()
        t = f.run(threading.Event())
        cpu = f.extra["workers"][0]["cpu_s"]
        eng = f.extra["engine"]
    return {"acked": t.acked, "sent": t.sent, "scheduled": t.scheduled, "late": t.late,
            "elapsed_s": round(t.elapsed_s, 3), "cpu_s": round(cpu, 3), "batch_ms": batch_ms,
            "load_cpu_s": round(eng["cpu_s"], 3), "writes": int(eng["writes"]), "reads": int(eng["reads"]),
            "wakeups": int(eng["wakeups"]),
            "msgs_per_write": round(t.acked / eng["writes"], 2) if eng["writes"] else None,
            "send_late_p99_ms": f.extra.get("send_late_p99_ms"), "ack_p50_ms": t.p50_ms, "ack_p99_ms": t.p99_ms,
            **sinks.usage(m0)}


# ------------------------------------------------------------------- phases
def phase_cpu(a: argparse.Namespace, sinks: Sinks, workdir: Path, binary: Path | None = None) -> dict:

    out: dict[str, Any] = {}
    # native: batched (the engine's default tick), then one write per wake-up (batch_ms 0, the engine before)
    log(f"cpu: monsoon (native) {a.native_rate:g} msg/s QoS1 for {a.cpu_duration:g}s, {a.devices} devices")
    out["monsoon"] = run_native(a, sinks, workdir, a.batch_ms, "native")
    log(f"  -> {out['monsoon']}")
    if not a.skip_unbatched:
        log("cpu: monsoon (native) unbatched: batch_ms 0 (every wake-up writes what is due, as before issue 29)")
        out["monsoon_unbatched"] = run_native(a, sinks, workdir, 0.0, "native-unbatched")
        log(f"  -> {out['monsoon_unbatched']}")
    # the physical floor: the transport alone, at the batch each engine run achieved
    if binary is not None:
        for key, run in (("floor", "monsoon"), ("floor_unbatched", "monsoon_unbatched")):
            r = out.get(run)
            if not r or not r.get("msgs_per_write"):
                continue
            batch = max(1, round(r["msgs_per_write"]))
            log(f"cpu: floor ({run}'s batch): {a.devices} connections, {batch} pre-encoded publishes per write")
            m0 = sinks.mark()
            f = run_floor(binary, sinks.port, a.devices, max(r["acked"], 10_000), batch)
            f.update(sinks.usage(m0))
            out[key] = f
            log(f"  -> {f}")
        r = out.get("monsoon")
        if r and r.get("acked"):
            log(f"cpu: floor paced: {a.native_rate:g} msg/s on {a.devices} connections, a wake-up every "
                f"{paced_tick_ms(a):g} ms")
            m0 = sinks.mark()
            f = run_floor_paced(a, sinks, binary, r["acked"])
            f.update(sinks.usage(m0))
            out["floor_paced"] = f
            log(f"  -> {f}")
    # paho
    log(f"cpu: paho-mqtt 2.2 baseline, {a.paho_messages} QoS1 messages as fast as possible")
    m0 = sinks.mark()
    r = run_child(["paho", str(sinks.port), str(a.paho_messages), str(a.paho_inflight)])
    r.update(sinks.usage(m0))
    out["paho"] = r
    log(f"  -> {r}")
    # monsoon python
    if not a.skip_python:
        log(f"cpu: monsoon_python (MqttFleet) {a.python_rate:g} msg/s for {a.cpu_duration:g}s, {a.devices} devices")
        m0 = sinks.mark()
        r = run_child(["python", str(sinks.port), str(a.python_rate), str(a.cpu_duration), str(a.devices),
                       str(workdir)])
        r.update(sinks.usage(m0))
        out["monsoon_python"] = r
        log(f"  -> {r}")
    # a load tool users run themselves: Locust's MQTT user (its own virtualenv in the cache)
    if not a.skip_peer:
        log(f"cpu: locust {LOCUST_VERSION} MqttUser, {a.devices} users as fast as they go "
            f"(CPU of a {a.peer_long}s run minus a {a.peer_short}s run)")
        m0 = sinks.mark()
        try:
            r = measure_locust(sinks.port, users=a.devices, short_s=a.peer_short, long_s=a.peer_long, log=log)
            r["elapsed_s"] = r["seconds"]
            r.update(sinks.usage(m0))
            out["locust"] = r
            log(f"  -> {r}")
        except PeerUnavailable as e:
            out["locust"] = {"unavailable": str(e)}
            log(f"  -> locust unavailable: {e}")
    return out


def phase_floor_rounds(a: argparse.Namespace, sinks: Sinks, workdir: Path, binary: Path) -> dict:
    """``--floor-rounds N``: N more (monsoon, paced floor) pairs, run alternately, each pair's ratio, and the
    medians: one run's floor moves by more than the goal's margin on a shared machine, its median over pairs
    does not. Each pair's floor sends what that pair's monsoon run acked."""
    rows = []
    for i in range(a.floor_rounds):
        m = run_native(a, sinks, workdir, a.batch_ms, f"round-{i}")
        f = run_floor_paced(a, sinks, binary, m["acked"])
        rows.append({"monsoon": per_msg(m), "floor_paced": per_msg(f), "late": m["late"]})
        log(f"cpu: floor round {i + 1}/{a.floor_rounds}: {rows[-1]}")
    return floor_rounds_summary(rows)


def floor_rounds_summary(rows: list[dict]) -> dict:
    """Each round's ratio monsoon / paced floor and the medians of the three (pure)."""
    for r in rows:
        r["ratio_floor_paced"] = round(r["monsoon"] / r["floor_paced"], 4) if r["monsoon"] and r["floor_paced"] else None

    def med(k: str) -> float | None:
        xs = [r[k] for r in rows if r.get(k) is not None]
        return round(statistics.median(xs), 4) if xs else None
    return {"rounds": rows, "median_monsoon": med("monsoon"), "median_floor_paced": med("floor_paced"),
            "median_ratio_floor_paced": med("ratio_floor_paced")}


def phase_connections(a: argparse.Namespace, sinks: Sinks, workdir: Path) -> dict:

    n = a.connections
    workers = max(1, -(-n // a.per_worker))
    # connect() takes its ephemeral port from the even half of the range first (~14,000 of ~28,000 here),
    # and past it each connect() searches the odd half: the first run stalled at 13 x 14,100 connections
    srcs = [f"127.0.0.{2 + i}" for i in range(-(-n // a.per_source))] if n > a.per_source else ["127.0.0.1"]
    log(f"connections: {n} devices in {workers} workers from {srcs[0]}..{srcs[-1]}, hold {a.hold:g}s "
        f"at {a.hold_rate:g} msg/s")
    devs = [Device(f"c-{i:06d}", "") for i in range(n)]
    seconds: list[tuple[int, int]] = []
    rss_max = [0.0]
    per_worker_rate = a.connect_rate / workers if a.connect_rate else 0.0
    fleet = NativeFleet(devs, "127.0.0.1", sinks.port, shape=Steady(rate=a.hold_rate, duration=a.hold),
                        acked_path=workdir / "acked-conns.parquet", workers=workers, source_addrs=srcs,
                        keepalive=a.keepalive, drain_timeout_s=5, connect_rate=per_worker_rate)

    def on_second(s: Any) -> None:
        seconds.append((s.t, s.connected))
        rss = sum(proc_rss_mb(p) for p in fleet.pids)
        rss_max[0] = max(rss_max[0], rss)
        if s.t % 10 == 0:
            log(f"  t={s.t}s connected={s.connected} acked={s.acked} rss={rss:.0f} MB")

    m0 = sinks.mark()
    t_c = time.monotonic()
    with fleet:
        fleet.connect(timeout=a.connect_timeout)
        connect_s = time.monotonic() - t_c
        log(f"  all {fleet.connected} connected in {connect_s:.1f}s; rss={sum(proc_rss_mb(p) for p in fleet.pids):.0f} MB")
        t = fleet.run(threading.Event(), on_second)
    held = [c for sec, c in seconds if sec < a.hold]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return {"target": n, "max_connections": min(held) if held else 0, "workers": workers,
            "source_addrs": len(srcs), "connect_s": round(connect_s, 2), "connect_rate": a.connect_rate or None,
            "rss_mb": round(rss_max[0], 1), "rss_kb_per_connection": round(rss_max[0] * 1024 / n, 2),
            "keepalive_s": a.keepalive, "pings_per_connection": int(a.hold // max(a.keepalive / 2, 0.5)),
            "acked": t.acked, "sent": t.sent, "failed": t.failed, "reconnects": t.reconnects,
            "sinks": sinks.n, "nofile": [soft, hard], **sinks.usage(m0)}


def phase_pacing(a: argparse.Namespace, sinks: Sinks, workdir: Path) -> dict:

    log(f"pacing: {a.pacing_rate:g} msg/s for {a.pacing_duration:g}s, {a.pacing_devices} devices")
    devs = [Device(f"p-{i:05d}", "") for i in range(a.pacing_devices)]
    secs: list[Any] = []
    m0 = sinks.mark()
    with NativeFleet(devs, "127.0.0.1", sinks.port, shape=Steady(rate=a.pacing_rate, duration=a.pacing_duration),
                     acked_path=workdir / "acked-pacing.parquet", workers=1) as f:
        f.connect()
        t = f.run(threading.Event(), secs.append)
        extra = f.extra
    usage = sinks.usage(m0)
    gen_cpu = sum(w["cpu_s"] or 0.0 for w in extra["workers"])
    return {"target_rate": a.pacing_rate, **pacing_figures(secs, a.pacing_duration),
            "late_p99_ms": extra.get("send_late_p99_ms"), "late_max_ms": extra.get("send_late_max_ms"),
            "late": t.late, "scheduled": t.scheduled, "sent": t.sent, "acked": t.acked,
            "ack_p99_ms": t.p99_ms, "generator_cpu_s": round(gen_cpu, 3),
            **generator_cores(secs, a.pacing_duration), **usage}


def generator_cores(seconds: list[Any], duration: float) -> dict:
    """The generator's own CPU from its per-second ``gen_cpu_s``, over the target window: cores busy on
    average and at most, and CPU per message sent (what every run's ``load_valid`` reports)."""
    window = [s for s in seconds if 0 <= s.t < duration and getattr(s, "gen_cpu_s", None) is not None]
    if not window:
        return {}
    cpu, sent = sum(s.gen_cpu_s for s in window), sum(s.sent for s in window)
    return {"generator_cores": round(cpu / len(window), 4), "generator_cores_max": round(max(s.gen_cpu_s for s in window), 4),
            "generator_us_per_msg": round(cpu / sent * 1e6, 3) if sent else None,
            "cpus": machine_cpus()}


def per_msg(r: dict | None) -> float | None:
    if not r or not r.get("acked"):
        return None
    return round(r["cpu_s"] / r["acked"] * 1e6, 3)


def rate(r: dict | None) -> float | None:
    return None if not r or not r.get("elapsed_s") else round(r["acked"] / r["elapsed_s"], 1)


def cpu_ratios(us: dict) -> dict:
    """The CPU-per-message columns side by side: monsoon against paho (goal <= 0.1) and against the physical
    floor at its own batch (1.0 = the engine costs no more than the transport it uses)."""
    def r(a: str, b: str) -> float | None:
        return round(us[a] / us[b], 4) if us.get(a) and us.get(b) else None
    return {"ratio": r("monsoon", "paho"), "ratio_python": r("monsoon_python", "paho"),
            "ratio_locust": r("monsoon", "locust"),
            "ratio_floor": r("monsoon", "floor"), "ratio_floor_paced": r("monsoon", "floor_paced"),
            "ratio_unbatched_floor": r("monsoon_unbatched", "floor_unbatched"),
            "batching_gain": r("monsoon_unbatched", "monsoon")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {CHILD_MODULE}", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--quick", action="store_true", help="a smoke test: short phases, 2,000 connections")
    ap.add_argument("--only", choices=["cpu", "connections", "pacing", "coap"], action="append",
                    help="run only these phases (repeatable)")
    ap.add_argument("--cpu-duration", type=float, help="seconds of the native and MqttFleet CPU runs (10)")
    ap.add_argument("--native-rate", type=float, default=100_000, help="native CPU-run rate, msg/s (100000)")
    ap.add_argument("--python-rate", type=float, default=10_000, help="MqttFleet CPU-run rate, msg/s (10000)")
    ap.add_argument("--paho-messages", type=int, help="messages of the paho baseline (200000)")
    ap.add_argument("--paho-inflight", type=int, default=100,
                    help="paho's max_inflight_messages (100: its fastest here; larger windows slow paho down)")
    ap.add_argument("--devices", type=int, default=50, help="devices (connections) of the CPU runs (50)")
    ap.add_argument("--batch-ms", type=float, default=None,
                    help="the native engine's batching tick in ms (default: the engine's, 5; 0 = a write per wake-up)")
    ap.add_argument("--floor-rounds", type=int, default=0,
                    help="N more (monsoon, paced floor) pairs run alternately after the cpu phase, with the median "
                         "of their ratios (floor_rounds); the goal's margin is smaller than one run's spread (0)")
    ap.add_argument("--skip-python", action="store_true", help="no monsoon_python column")
    ap.add_argument("--skip-peer", action="store_true",
                    help="no locust column (Locust's MQTT user; installed on first use into the cache, ~60 s)")
    ap.add_argument("--peer-short", type=int, help="seconds of the shorter locust run (5)")
    ap.add_argument("--peer-long", type=int, help="seconds of the longer locust run (20)")
    ap.add_argument("--skip-unbatched", action="store_true",
                    help="no monsoon_unbatched column (the engine with batch_ms 0) nor its floor")
    ap.add_argument("--connections", type=int, help="connections to hold (50000)")
    ap.add_argument("--hold", type=float, help="seconds to hold them (60)")
    ap.add_argument("--hold-rate", type=float, default=1000.0, help="msg/s while holding (1000)")
    ap.add_argument("--per-worker", type=int, default=12_500,
                    help="connections per worker process (12500; at most 19,900 under a 20,000 open-file limit)")
    ap.add_argument("--per-source", type=int, default=10_000,
                    help="connections per 127.0.0.x source address (10000: within the even half of the "
                         "ephemeral port range connect() searches first)")
    ap.add_argument("--connect-rate", type=float, default=0.0,
                    help="new connections per second over all workers (0 = as fast as they open)")
    ap.add_argument("--keepalive", type=int, default=60,
                    help="MQTT keep-alive of the held connections, s (60: a PINGREQ every 30 s of silence)")
    ap.add_argument("--many", action="store_true",
                    help="the 250,000-connection mode: --only connections --connections 250000 --per-worker 19000 "
                         "--connect-rate 10000 --keepalive 20 (each flag may still be given)")
    ap.add_argument("--million", action="store_true",
                    help="the 1,000,000-connection mode: --many with --connections 1000000 (53 workers, 100 source "
                         "addresses, 67 sinks) --connect-rate 8000 --keepalive 300 --hold 30 --connect-timeout 240; "
                         "goal: the workers' RSS under 2 GB (needs ~2.1 M open files machine-wide: fs.file-max)")
    ap.add_argument("--connect-timeout", type=float, default=180.0, help="seconds to connect them all (180)")
    ap.add_argument("--pacing-rate", type=float, default=20_000.0, help="msg/s of the pacing run (20000)")
    ap.add_argument("--pacing-duration", type=float, help="seconds of the pacing run (60)")
    ap.add_argument("--pacing-devices", type=int, default=200, help="devices of the pacing run (200)")
    ap.add_argument("--sinks", type=int, default=4,
                    help="sink processes sharing the port from the connections phase on (4; the CPU phase "
                         "runs first against one sink process, like one broker)")
    ap.add_argument("--coap-devices", type=int, default=50, help="PSK devices of the CoAP CPU runs (50)")
    ap.add_argument("--coap-rate", type=float, default=5_000.0, help="native hono-coap CPU-run rate, msg/s (5000)")
    ap.add_argument("--coap-python-rate", type=float, default=300.0,
                    help="Python HonoCoapFleet CPU-run rate, msg/s (300)")
    ap.add_argument("--coap-sessions", type=int, default=2_500, help="PSK devices holding DTLS sessions (2500)")
    ap.add_argument("--coap-hold", type=float, help="seconds they hold them (10)")
    ap.add_argument("--coap-hold-rate", type=float, default=250.0, help="msg/s while holding them (250)")
    ap.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.child:
        kind, *rest = a.child
        if kind == "paho":
            r = child_paho(int(rest[0]), int(rest[1]), int(rest[2]))
        elif kind == "hono-coap":
            r = child_python_coap(int(rest[0]), float(rest[1]), float(rest[2]), int(rest[3]), rest[4])
        else:
            r = child_python(int(rest[0]), float(rest[1]), float(rest[2]), int(rest[3]), rest[4])
        print(json.dumps(r), flush=True)
        return 0
    q = a.quick
    if a.million:
        a.many = True
        a.connections = a.connections or 1_000_000
        a.connect_rate = a.connect_rate or 8_000.0
        a.keepalive = 300 if a.keepalive == 60 else a.keepalive
        a.hold = a.hold or 30.0
        a.connect_timeout = 240.0 if a.connect_timeout == 180.0 else a.connect_timeout
    if a.many:
        a.only = a.only or ["connections"]
        a.connections = a.connections or 250_000
        a.per_worker = 19_000 if a.per_worker == 12_500 else a.per_worker
        a.connect_rate = a.connect_rate or 10_000.0
        a.keepalive = 20 if a.keepalive == 60 else a.keepalive
    a.cpu_duration = a.cpu_duration or (3.0 if q else 10.0)
    a.paho_messages = a.paho_messages or (30_000 if q else 200_000)
    a.peer_short = a.peer_short or (3 if q else 5)
    a.peer_long = a.peer_long or (8 if q else 20)
    a.connections = a.connections or (2_000 if q else 50_000)
    a.hold = a.hold or (5.0 if q else 60.0)
    a.pacing_duration = a.pacing_duration or (5.0 if q else 60.0)
    a.coap_hold = a.coap_hold or (3.0 if q else 10.0)
    if q:
        a.hold_rate = min(a.hold_rate, 200.0)
    phases = a.only or ["cpu", "connections", "pacing", "coap"]


    log("building/locating monsoon-loadgen (cargo build --release --locked on first use)")
    binary = ensure_loadgen()
    result: dict[str, Any] = {"bench": "load", "quick": q}
    with tempfile.TemporaryDirectory(prefix="monsoon-bench-") as tmp:
        workdir = Path(tmp)
        sinks = Sinks(binary, 1)
        log(f"sink: `monsoon-loadgen sink` on 127.0.0.1:{sinks.port} (1 process, 1 thread)")
        try:
            if "cpu" in phases:
                cpu = phase_cpu(a, sinks, workdir, binary)
                us = {k: per_msg(cpu.get(k)) for k in ("monsoon", "monsoon_unbatched", "floor", "floor_unbatched",
                                                       "floor_paced", "paho", "monsoon_python", "locust")}
                result["cpu_us_per_msg"] = {**us, **cpu_ratios(us)}
                result["msgs_per_write"] = {k: (cpu[k].get("msgs_per_write") if k.startswith("monsoon")
                                                else cpu[k].get("batch"))
                                            for k in ("monsoon", "monsoon_unbatched", "floor", "floor_unbatched",
                                                      "floor_paced")
                                            if k in cpu}
                result["msgs_per_s"] = {k: rate(cpu.get(k)) for k in ("monsoon", "paho", "monsoon_python", "locust")}
                result["cpu_runs"] = cpu
                if a.floor_rounds > 0:
                    result["floor_rounds"] = phase_floor_rounds(a, sinks, workdir, binary)
            if "connections" in phases:
                # a sink process holds < 20,000 sockets, and SO_REUSEPORT spreads connections by hash,
                # not evenly: one sink process per 15,000 connections leaves room for the imbalance
                a.sinks = max(a.sinks, -(-a.connections // 15_000))
                if a.sinks > sinks.n:
                    log(f"sink: +{a.sinks - sinks.n} sink processes on the same port (open-file limit per process)")
                    sinks.add(a.sinks - sinks.n)
                c = phase_connections(a, sinks, workdir)
                result["max_connections"] = c["max_connections"]
                result["rss_mb"] = c["rss_mb"]
                result["connections"] = c
            if "pacing" in phases:
                pc = phase_pacing(a, sinks, workdir)
                result["pacing_error_pct"] = pc["pacing_error_pct"]
                result["worst_second_error_pct"] = pc["worst_second_error_pct"]
                result["late_p99_ms"] = pc["late_p99_ms"]
                result["pacing"] = pc
            if "coap" in phases:
                co = phase_coap(a, binary, workdir, log, run_child, free_port)
                result["coap_cpu_us_per_request"] = co["cpu_us_per_request"]
                result["coap_sessions_held"] = co["sessions"]["held_min"]
                result["coap_sessions_rss_mb"] = co["sessions"]["rss_mb"]
                result["coap"] = co
            runs = [*result.get("cpu_runs", {}).values(), result.get("connections"), result.get("pacing")]
            result["sink"] = {"kind": "monsoon-loadgen sink (ack-only MQTT 3.1.1, SO_REUSEPORT)",
                              "processes": sinks.n, "threads_each": 1, "cpu_s_total": round(sinks.cpu_s(), 3),
                              # CPU s / elapsed s of the busiest sink process in any phase (1.0 = saturated)
                              "utilisation_max": max((r["sink_utilisation_max"] for r in runs
                                                      if r and r.get("sink_utilisation_max") is not None),
                                                     default=None),
                              "cpu_us_per_msg_native_run": (
                                  round(result["cpu_runs"]["monsoon"]["sink_cpu_s"]
                                        / result["cpu_runs"]["monsoon"]["acked"] * 1e6, 3)
                                  if result.get("cpu_runs", {}).get("monsoon", {}).get("acked") else None)}
        finally:
            sinks.close()
    result["third_party"] = (result.get("cpu_runs", {}).get("locust", {}).get("tool")
                             or result.get("cpu_runs", {}).get("locust", {}).get("unavailable")
                             or "not measured (--skip-peer)")
    goals = {}
    if "cpu_us_per_msg" in result and result["cpu_us_per_msg"]["ratio"] is not None:
        goals["ratio<=0.1"] = result["cpu_us_per_msg"]["ratio"] <= 0.1
    if result.get("cpu_us_per_msg", {}).get("monsoon") is not None:
        goals["monsoon<=2us"] = result["cpu_us_per_msg"]["monsoon"] <= 2.0
    if "max_connections" in result:
        goals[f"connections>={a.connections}"] = result["max_connections"] >= a.connections
        if a.million:
            goals["rss<2GB"] = result["rss_mb"] < 2048
        else:
            goals["rss<1GB"] = result["rss_mb"] < 1024
    if "pacing_error_pct" in result:
        goals["pacing<1%"] = result["pacing_error_pct"] is not None and result["pacing_error_pct"] < 1.0
        goals["late_p99<10ms"] = result["late_p99_ms"] is not None and result["late_p99_ms"] < 10.0
    if result.get("coap_cpu_us_per_request", {}).get("native") is not None:
        goals["coap<=50us"] = result["coap_cpu_us_per_request"]["native"] <= 50.0
    if "coap_sessions_held" in result:
        goals[f"coap_sessions>={a.coap_sessions}"] = result["coap_sessions_held"] >= a.coap_sessions
    result["goals_met"] = goals
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
