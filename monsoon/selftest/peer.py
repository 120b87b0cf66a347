"""A load tool users run themselves, beside monsoon's engine in ``make bench-load``: Locust's own MQTT user.

Locust (``locust.contrib.mqtt.MqttUser``: paho-mqtt under gevent, one client per user) is installed on first
use into its own virtualenv in the cache (``<cache>/bench/locust-<version>``), so it is not a dependency of
monsoon. It publishes the same 146-byte QoS 1 payload to the same ack-only sink. Its CPU per acked message is
the difference of two runs (``short_s`` and ``long_s``), so Locust's start-up and stop do not count."""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from monsoon.paths import CACHE

LOCUST_VERSION = "2.47.0"
PAHO_VERSION = "2.2.0"    # what locust.contrib.mqtt imports; not a dependency of locust itself

LOCUSTFILE = """\
import os
from locust import constant_throughput, task
from locust.contrib.mqtt import MqttUser

PAYLOAD = "x" * int(os.environ["PEER_PAYLOAD_BYTES"])


class Device(MqttUser):
    port = int(os.environ["PEER_PORT"])
    wait_time = constant_throughput(float(os.environ["PEER_RATE_PER_USER"]))

    @task
    def publish(self):
        self.client.publish("v1/devices/me/telemetry", PAYLOAD, qos=1)
"""


class PeerUnavailable(RuntimeError):
    pass


def locust_venv(cache: Path = CACHE) -> Path:
    return cache / "bench" / f"locust-{LOCUST_VERSION}"


def ensure_locust(cache: Path = CACHE, log=print) -> Path:
    """The ``locust`` executable of the cached virtualenv, installed from PyPI the first time (~60 s)."""
    venv = locust_venv(cache)
    exe, done = venv / "bin" / "locust", venv / ".installed"
    want = f"locust=={LOCUST_VERSION} paho-mqtt=={PAHO_VERSION}\n"
    if exe.exists() and done.exists() and done.read_text() == want:
        return exe
    log(f"peer: installing locust {LOCUST_VERSION} into {venv} (once, ~60 s)")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    p = subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                        f"locust=={LOCUST_VERSION}", f"paho-mqtt=={PAHO_VERSION}"], capture_output=True, text=True)
    if p.returncode != 0:
        raise PeerUnavailable(f"pip install locust=={LOCUST_VERSION} failed: {p.stderr.strip()[-300:]}")
    done.write_text(want)
    return exe


def run_locust(exe: Path, port: int, users: int, rate_per_user: float, seconds: int, payload_bytes: int,
               workdir: Path) -> dict:
    """One headless Locust run: acked publishes (successful QoS 1 ``publish`` requests), failures, and the
    process's CPU seconds (utime + stime from ``wait4``)."""
    f = workdir / "locustfile.py"
    f.write_text(LOCUSTFILE)
    env = {**os.environ, "PEER_PORT": str(port), "PEER_RATE_PER_USER": str(rate_per_user),
           "PEER_PAYLOAD_BYTES": str(payload_bytes)}
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.monotonic()
    p = subprocess.Popen([str(exe), "-f", str(f), "--headless", "-u", str(users), "-r", str(users),
                          "--run-time", f"{seconds}s", "--host", "127.0.0.1", "--only-summary", "--json",
                          "--stop-timeout", "3", "--loglevel", "WARNING"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=workdir)
    try:
        out, err = p.communicate(timeout=seconds + 120)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise PeerUnavailable(f"locust did not finish within {seconds + 120} s") from None
    elapsed = time.monotonic() - t0
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)   # the locust process, reaped by communicate()
    try:
        stats = json.loads(out)
    except json.JSONDecodeError:
        raise PeerUnavailable(f"locust printed no statistics (exit {p.returncode}): {err.strip()[-300:]}") from None
    pub = [s for s in stats if s["name"].startswith("publish:1:")]
    acked = sum(s["num_requests"] - s["num_failures"] for s in pub)
    failures = sum(s["num_failures"] for s in stats)
    cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    return {"acked": acked, "failures": failures, "elapsed_s": round(elapsed, 3), "cpu_s": round(cpu, 3)}


def measure_locust(port: int, users: int = 50, rate_per_user: float = 10_000.0, short_s: int = 5,
                   long_s: int = 20, payload_bytes: int = 146, cache: Path = CACHE, log=print) -> dict:
    """Locust's CPU per acked QoS 1 message, as fast as it goes (``rate_per_user`` is a ceiling): the
    difference of a ``long_s`` and a ``short_s`` run, so start-up and stop cancel out."""
    exe = ensure_locust(cache, log)
    with tempfile.TemporaryDirectory(prefix="monsoon-peer-") as tmp:
        a = run_locust(exe, port, users, rate_per_user, short_s, payload_bytes, Path(tmp))
        b = run_locust(exe, port, users, rate_per_user, long_s, payload_bytes, Path(tmp))
    acked = b["acked"] - a["acked"]
    if acked <= 0:
        raise PeerUnavailable(f"locust acked nothing more in its longer run ({a} / {b})")
    cpu = b["cpu_s"] - a["cpu_s"]
    return {"tool": f"locust {LOCUST_VERSION} (locust.contrib.mqtt.MqttUser, paho-mqtt under gevent)",
            "users": users, "payload_bytes": payload_bytes, "acked": acked, "cpu_s": round(cpu, 3),
            "seconds": long_s - short_s, "msgs_per_s": round(acked / (long_s - short_s), 1),
            "failures": a["failures"] + b["failures"], "runs": [a, b]}
