"""The CoAP-over-DTLS row of ``make bench-load`` (its ``coap`` phase): Hono's CoAP device flow (DTLS with PSK;
telemetry, events, command queries and command responses by the default legs 6:2:2) against monsoon's own DTLS sink
(``monsoon-loadgen coap-sink``, one thread; a command to every query, so every third message of a device is a
two-request round trip).

* ``cpu_us_per_request``: CPU seconds of the generator per CoAP request (every leg's request: a command round trip
  is two), ``native`` (:class:`~monsoon.load.native.NativeHonoCoapFleet`, one worker: the engine's own CPU over
  the load, from its start to its drain, handshakes excluded) beside ``python``
  (:class:`~monsoon.load.coap.HonoCoapFleet`, aiocoap + tinydtls, in a child process: ``getrusage`` around the
  run, after the handshakes; left out with the reason when DTLSSocket is not installed).
* ``sessions``: ``--coap-sessions`` PSK devices (2,500) doing their DTLS handshakes, then holding the sessions
  through a low rate for ``--coap-hold`` s: ``held`` = the lowest connected count over the hold, ``rss_mb`` the
  worker's peak VmRSS, ``connect_s`` how long the handshakes took.

:class:`CoapSink` starts the sink for the benchmark and for the tests.
"""
from __future__ import annotations

import json
import resource
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from monsoon.load.coap import HonoCoapFleet, dtls_missing
from monsoon.load.native import NativeHonoCoapFleet
from monsoon.load.shapes import Steady
from monsoon.stack.provision import Device
from monsoon.selftest.procfs import proc_rss_mb


__all__ = ["CoapSink", "child_python_coap", "coap_devices", "phase_coap", "run_native_coap"]


def coap_devices(n: int, prefix: str = "coap") -> list[Device]:
    """``n`` Hono-style PSK devices: identity ``<name>@DEFAULT_TENANT``, secret ``secret-<name>``."""
    return [Device(f"{prefix}-{i:05d}", f"{prefix}-{i:05d}@DEFAULT_TENANT", f"secret-{prefix}-{i:05d}")
            for i in range(n)]


class CoapSink:
    """``monsoon-loadgen coap-sink`` on 127.0.0.1:``port`` knowing ``devices``' keys; :meth:`close` returns its
    counts (handshakes, failed_handshakes, requests, commands, failed)."""

    def __init__(self, binary: Path, devices: list[Device], workdir: Path, port: int, *, command_every: int = 1,
                 fail_every: int = 0, separate_every: int = 0, threads: int = 1) -> None:
        self.port = port
        keys = Path(workdir) / f"coap-sink-{port}.json"
        keys.write_text(json.dumps([{"token": d.token, "password": d.password or ""} for d in devices]))
        self.proc = subprocess.Popen(
            [str(binary), "coap-sink", "--port", str(port), "--keys", str(keys), "--threads", str(threads),
             "--command-every", str(command_every), "--fail-every", str(fail_every),
             "--separate-every", str(separate_every)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if '"listening"' not in line:
            err = self.proc.stderr.read() if self.proc.stderr else ""
            self.proc.kill()
            raise RuntimeError(f"coap-sink did not start: {line!r} {err}")
        self.counts: dict[str, Any] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> dict[str, Any]:
        if self.counts is not None:
            return self.counts
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate(timeout=5)
        self.counts = {}
        for line in (out or "").splitlines():
            if line.startswith('{"sink"'):
                self.counts = json.loads(line)["sink"]
        return self.counts

    def __enter__(self) -> "CoapSink":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _requests(legs: dict[str, dict[str, Any]]) -> int:
    return sum(int(v.get("ok") or 0) + int(v.get("failed") or 0) for v in legs.values())


def run_native_coap(devices: list[Device], port: int, rate: float, duration: float, workdir: Path,
                    rss_probe: bool = False) -> dict[str, Any]:
    """The native fleet on ``devices`` at ``rate`` msg/s for ``duration`` s: its counts, its legs, the engine's
    load CPU per request, and (``rss_probe``) the lowest connected count and the worker's peak RSS over the run."""
    held: list[int] = []
    rss: list[float] = []
    f = NativeHonoCoapFleet(devices, "127.0.0.1", port, shape=Steady(rate=rate, duration=duration),
                            acked_path=workdir / f"acked-coap-native-{len(devices)}.parquet", workers=1)
    with f:
        t0 = time.monotonic()
        f.connect(timeout=120)
        connect_s = time.monotonic() - t0

        def second(s: Any) -> None:
            held.append(s.connected)
            if rss_probe:
                rss.extend(proc_rss_mb(p) for p in f.pids)

        t = f.run(threading.Event(), on_second=second)
        legs, eng, workers = f.extra["legs"], f.extra["engine"], f.extra["workers"]
        errors = f.extra.get("errors", {})
    n = _requests(legs)
    return {"devices": len(devices), "rate": rate, "duration_s": duration, "connect_s": round(connect_s, 3),
            "scheduled": t.scheduled, "acked": t.acked, "failed": t.failed, "late": t.late, "requests": n,
            "errors": errors, "load_cpu_s": round(eng["cpu_s"], 3), "process_cpu_s": workers[0]["cpu_s"],
            "cpu_us_per_request": round(eng["cpu_s"] / n * 1e6, 2) if n else None,
            "ack_p50_ms": t.p50_ms, "ack_p99_ms": t.p99_ms,
            "legs": {k: {"ok": v["ok"], "failed": v["failed"], "p50_ms": v["p50_ms"]} for k, v in legs.items()},
            "held_min": min(held) if held else 0, "rss_mb": round(max(rss), 1) if rss else None,
            "maxrss_mb": workers[0]["maxrss_mb"]}


def child_python_coap(port: int, rate: float, duration: float, devices: int, workdir: str) -> dict[str, Any]:
    """The Python :class:`~monsoon.load.coap.HonoCoapFleet` (in a child process), measured by ``getrusage``."""
    missing = dtls_missing()
    if missing:
        return {"unavailable": missing}
    devs = coap_devices(devices)
    with HonoCoapFleet(devs, "127.0.0.1", port, shape=Steady(rate=rate, duration=duration),
                       acked_path=Path(workdir) / "acked-coap-python.parquet") as f:
        f.connect(timeout=60)
        ru0 = resource.getrusage(resource.RUSAGE_SELF)    # the load only, as the native figure (handshakes apart)
        t = f.run(threading.Event())
        legs = f.extra["legs"]
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    n = _requests(legs)
    return {"devices": devices, "rate": rate, "duration_s": duration, "scheduled": t.scheduled, "acked": t.acked,
            "failed": t.failed, "late": t.late, "requests": n, "cpu_s": round(cpu, 3),
            "cpu_us_per_request": round(cpu / n * 1e6, 2) if n else None, "ack_p50_ms": t.p50_ms,
            "ack_p99_ms": t.p99_ms}


def phase_coap(a: Any, binary: Path, workdir: Path, log: Any, run_child: Any, free_port: Any) -> dict[str, Any]:
    """The ``coap`` phase: CPU per request native vs Python against one sink, then the sessions held."""
    out: dict[str, Any] = {}
    devs = coap_devices(max(a.coap_devices, a.coap_sessions))
    cpu_devs = devs[:a.coap_devices]
    with CoapSink(binary, devs, workdir, free_port()) as sink:
        log(f"coap: native hono-coap {a.coap_rate:g} msg/s for {a.cpu_duration:g}s, {a.coap_devices} PSK devices "
            f"against coap-sink :{sink.port}")
        out["native"] = run_native_coap(cpu_devs, sink.port, a.coap_rate, a.cpu_duration, workdir)
        log(f"  -> {out['native']}")
        if a.skip_python:
            out["python"] = {"unavailable": "--skip-python"}
        else:
            log(f"coap: Python HonoCoapFleet {a.coap_python_rate:g} msg/s for {a.cpu_duration:g}s")
            try:
                out["python"] = run_child(["hono-coap", str(sink.port), str(a.coap_python_rate),
                                           str(a.cpu_duration), str(a.coap_devices), str(workdir)])
            except RuntimeError as e:
                out["python"] = {"unavailable": str(e)[-500:]}
            log(f"  -> {out['python']}")
        log(f"coap: {a.coap_sessions} PSK devices holding DTLS sessions for {a.coap_hold:g}s "
            f"({a.coap_hold_rate:g} msg/s)")
        out["sessions"] = run_native_coap(devs[:a.coap_sessions], sink.port, a.coap_hold_rate, a.coap_hold, workdir,
                                          rss_probe=True)
        log(f"  -> {out['sessions']}")
        out["sink"] = sink.close()
    nat, py = out["native"].get("cpu_us_per_request"), out["python"].get("cpu_us_per_request")
    out["cpu_us_per_request"] = {"native": nat, "python": py,
                                 "ratio": round(nat / py, 4) if nat and py else None}
    return out
