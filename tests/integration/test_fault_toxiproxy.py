"""Toxiproxy backend against a REAL toxiproxy-server and a tiny echo server.

Latency is measured, not assumed: a probe round trip through the proxy before,
during and after the fault.  The crash test drops the backend without healing
and heals from a fresh instance that only knows the run id.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import requests

from monsoon.faults.base import FaultContext, FaultError
from monsoon.faults.plan import FaultPlan
from monsoon.spec.fault import FaultSpec
from monsoon.faults.toxiproxy import PROBE_PAYLOADS, ToxiproxyBackend, can_connect, floor_rtt, proxy_name, run_prefix
from monsoon.paths import REPO
from monsoon.timeline.store import Timeline, read_events

CACHE = Path(os.environ.get("MONSOON_CACHE", REPO / ".cache"))
SERVER = shutil.which("toxiproxy-server") or str(CACHE / "bin" / "toxiproxy-server")
pytestmark = pytest.mark.skipif(not os.access(SERVER, os.X_OK),
                                reason="toxiproxy-server not installed: run tools/install-toxiproxy")
ECHO = PROBE_PAYLOADS["echo"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def toxiproxy(tmp_path):
    port = free_port()
    log = open(tmp_path / "toxiproxy.log", "wb")
    proc = subprocess.Popen([SERVER, "-host", "127.0.0.1", "-port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    api = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                requests.get(api + "/version", timeout=0.5)
                break
            except requests.RequestException:
                assert proc.poll() is None, (tmp_path / "toxiproxy.log").read_text()
                assert time.monotonic() < deadline, "toxiproxy-server not ready in 10 s"
                time.sleep(0.02)
        yield api
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
        log.close()


def tcp_server(serve):
    """A local TCP server handing each connection to ``serve(conn)`` on its own thread: (address, close)."""
    srv = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                c, _ = srv.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=serve, args=(c,), daemon=True).start()
    t = threading.Thread(target=accept, daemon=True)
    t.start()

    def close():
        stop.set()
        t.join(2)
        srv.close()
    return f"127.0.0.1:{srv.getsockname()[1]}", close


def received(conn):
    """What a connection receives, chunk by chunk, until the peer closes it (or it breaks)."""
    with conn:
        while True:
            try:
                data = conn.recv(65536)
            except OSError:
                return
            if not data:
                return
            yield data


@pytest.fixture
def echo_server():
    def serve(conn):
        for data in received(conn):
            conn.sendall(data)
    address, close = tcp_server(serve)
    yield address
    close()


RUN = "t-20250101-abcd"


@pytest.fixture
def routed(toxiproxy, echo_server):
    be = ToxiproxyBackend(toxiproxy, probe_samples=5)
    listen = f"127.0.0.1:{free_port()}"
    proxy = be.route(RUN, ("platform", "echo"), listen, echo_server)
    host, port = proxy.listen.rsplit(":", 1)
    return be, (host, int(port))


def fault(kind, params, **sched):
    return FaultSpec(name=f"{kind}-t", kind=kind, target="platform->echo", backend="toxiproxy",
                     params={**params, "probe": "echo"}, schedule={"at": 0, "duration": 30, **sched})


def test_latency_lands_measured_and_heals(routed):
    be, addr = routed
    ctx = FaultContext(run_id=RUN)
    before = floor_rtt(addr, ECHO)
    h = be.inject(fault("network-latency", {"latency_ms": 200}), ctx)
    during = floor_rtt(addr, ECHO)
    land = be.verify(h)
    print(f"\nlatency 200 ms: rtt before {before:.2f} ms, during {during:.2f} ms, "
          f"verify evidence {land.evidence}")
    assert 195 <= during - before <= 300
    assert land.landed is True and 190 <= land.evidence["added_ms"] <= 300
    assert land.evidence["toxics_present"] and all(t.startswith(run_prefix(RUN)) for t in land.evidence["toxics_present"])
    assert be.census(RUN)
    be.heal(h)
    after = floor_rtt(addr, ECHO)
    heal_land = be.verify(h)
    print(f"after heal: rtt {after:.2f} ms; heal evidence {heal_land.evidence}")
    assert after < before + 50
    assert heal_land.landed is True and be.census(RUN) == []


def test_latency_both_ways_doubles_and_jitter_spreads(routed):
    be, addr = routed
    h = be.inject(fault("mongo-slowdown", {"latency_ms": 100, "stream": "both"}), FaultContext(run_id=RUN))
    rtt = floor_rtt(addr, ECHO)
    assert 195 <= rtt <= 300, rtt
    assert be.verify(h).landed is True
    be.heal(h)
    h = be.inject(fault("network-latency", {"latency_ms": 100, "jitter_ms": 80}), FaultContext(run_id=RUN))
    samples = [floor_rtt(addr, ECHO, n=1) for _ in range(12)]
    be.heal(h)
    assert max(samples) - min(samples) > 30, samples        # jitter really varies the delay
    assert all(15 <= s <= 200 for s in samples), samples


def test_verify_detects_a_toxic_removed_behind_its_back(routed):
    be, addr = routed
    h = be.inject(fault("network-latency", {"latency_ms": 200}), FaultContext(run_id=RUN))
    for t in h.data["toxics"]:
        be.client.remove_toxic(h.data["proxy"], t)
    land = be.verify(h)
    assert land.landed is False and land.evidence["added_ms"] < 100


def test_dependency_down_refuses_connects_until_healed(routed):
    be, addr = routed
    assert can_connect(addr)
    h = be.inject(fault("dependency-down", {"mode": "disable"}), FaultContext(run_id=RUN))
    assert not can_connect(addr)
    with pytest.raises(OSError):
        socket.create_connection(addr, timeout=1).close()
    land = be.verify(h)
    assert land.landed is True and land.evidence["connect_ok"] is False
    assert any("disabled" in x for x in be.census(RUN))
    be.heal(h)
    assert can_connect(addr) and floor_rtt(addr, ECHO) < 50
    assert be.verify(h).landed is True and be.census(RUN) == []


def test_dependency_down_reset_peer(routed):
    be, addr = routed
    h = be.inject(fault("dependency-down", {"mode": "reset_peer"}), FaultContext(run_id=RUN))
    land = be.verify(h)
    assert land.landed is True and land.evidence["outcome"] in ("reset", "closed")
    be.heal(h)
    assert be.verify(h).landed is True


def test_bandwidth_limits_throughput(routed):
    be, addr = routed
    h = be.inject(fault("bandwidth", {"rate_kbps": 64}), FaultContext(run_id=RUN))
    land = be.verify(h)
    print(f"\nbandwidth 64 KiB/s: {land.evidence}")
    assert land.landed is True and land.evidence["kib_s"] <= 96
    be.heal(h)
    healed = be.verify(h)
    assert healed.landed is True and healed.evidence["kib_s"] > 1000


def framed_server(reply_size: int, one_reply_per_connection: bool = False):
    """A request/response server with Kafka's framing (4-byte big-endian size, then the body): every framed
    request gets a ``reply_size``-byte framed reply, pipelined requests one after the other."""
    body = b"r" * (reply_size - 4)
    reply = len(body).to_bytes(4, "big") + body

    def serve(conn):
        buf = b""
        for data in received(conn):
            buf += data
            while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
                buf = buf[4 + int.from_bytes(buf[:4], "big"):]
                try:
                    conn.sendall(reply)
                except OSError:   # the probe has what it needed and hung up
                    return
                if one_reply_per_connection:
                    return
    return tcp_server(serve)


@pytest.mark.parametrize("stream", ["downstream", "upstream"])
def test_bandwidth_is_measured_through_the_proxy_on_a_request_reply_upstream(toxiproxy, stream):
    """The shipped bandwidth profile probes Kafka: its pipelined requests are timed, not just the API read."""
    upstream, close = framed_server(reply_size=400 if stream == "downstream" else 8)
    try:
        be = ToxiproxyBackend(toxiproxy)
        be.route(RUN, ("platform", "kafka"), f"127.0.0.1:{free_port()}", upstream)
        f = FaultSpec(name="bw", kind="bandwidth", target="platform->kafka", backend="toxiproxy",
                      params={"rate_kbps": 16, "stream": stream, "probe": "kafka"}, schedule={"at": 0, "duration": 30})
        h = be.inject(f, FaultContext(run_id=RUN))
        plan = h.data["bandwidth"]
        assert "why" not in plan and plan["baseline_kib_s"] > 48, plan
        land = be.verify(h)
        print(f"\nbandwidth 16 KiB/s {stream} through a kafka-framed upstream: {land.evidence}")
        assert land.landed is True and land.evidence["method"] == "probe:kafka-throughput"
        assert land.evidence["kib_s"] <= 24 and land.evidence["direction"] == stream[:-len("stream")]
        be.heal(h)
        healed = be.verify(h)
        assert healed.landed is True and healed.evidence["kib_s"] > 24 and be.census(RUN) == []
    finally:
        close()


def test_bandwidth_on_an_upstream_too_small_to_time_says_so(toxiproxy):
    upstream, close = framed_server(reply_size=40, one_reply_per_connection=True)
    try:
        be = ToxiproxyBackend(toxiproxy)
        be.route(RUN, ("platform", "kafka"), f"127.0.0.1:{free_port()}", upstream)
        f = FaultSpec(name="bw", kind="bandwidth", target="platform->kafka", backend="toxiproxy",
                      params={"rate_kbps": 64, "probe": "kafka"}, schedule={"at": 0, "duration": 30})
        h = be.inject(f, FaultContext(run_id=RUN))
        land = be.verify(h)
        assert land.landed is None and land.evidence["toxics_present"]
        assert land.evidence["error"].startswith("throughput not measured: ") and "too little to time" in \
            land.evidence["error"]
        be.heal(h)
        assert be.census(RUN) == []
    finally:
        close()


def test_missing_proxy_is_a_clear_error(toxiproxy):
    be = ToxiproxyBackend(toxiproxy)
    with pytest.raises(FaultError, match="no Toxiproxy proxy .* for hop platform->echo"):
        be.inject(fault("network-latency", {"latency_ms": 5}), FaultContext(run_id=RUN))


def test_heal_all_after_a_crash_removes_everything_of_the_run_only(routed, echo_server):
    be, addr = routed
    other = "other-run"
    be.route(other, ("platform", "echo"), f"127.0.0.1:{free_port()}", echo_server)
    be.inject(fault("network-latency", {"latency_ms": 300}), FaultContext(run_id=other))
    be.inject(fault("network-latency", {"latency_ms": 300}), FaultContext(run_id=RUN))
    be.inject(fault("bandwidth", {"rate_kbps": 10}), FaultContext(run_id=RUN))
    be.inject(fault("dependency-down", {"mode": "disable"}), FaultContext(run_id=RUN))
    del be                                                # "crash": no handles survive
    fresh = ToxiproxyBackend(routed[0].client.api)
    assert len(fresh.census(RUN)) == 3
    healed = fresh.heal_all(RUN)
    assert len(healed) == 3
    assert fresh.census(RUN) == []
    p = fresh.client.proxy(proxy_name(RUN, ("platform", "echo")))
    assert p.enabled and p.toxics == ()
    assert floor_rtt(addr, ECHO) < 50
    assert len(fresh.census(other)) == 1                  # another run's fault is not touched
    assert fresh.unroute(RUN) == [proxy_name(RUN, ("platform", "echo"))]
    assert proxy_name(other, ("platform", "echo")) in fresh.client.proxies()


def test_plan_on_real_toxiproxy_writes_measured_events(routed, tmp_path):
    be, addr = routed
    faults = [fault("network-latency", {"latency_ms": 150}, at=0.2, duration=1.5),
              fault("dependency-down", {"mode": "disable"}, at=2.2, duration=1.0)]
    tl = Timeline(tmp_path / "timeline.jsonl")
    with FaultPlan(faults, {"toxiproxy": be}, tl, ctx=FaultContext(run_id=RUN), horizon=10,
                   handle_sigterm=False) as plan:
        time.sleep(4.0)
    tl.close()
    evs = sorted((e for e in read_events(tl.path) if e["type"] == "fault"), key=lambda e: e["intended"])
    assert [(e["kind"], e["phase"], e["landed"]) for e in evs] == [
        ("network-latency", "inject", True), ("network-latency", "heal", True),
        ("dependency-down", "inject", True), ("dependency-down", "heal", True)]
    for e in evs:
        assert 0 <= e["effective"] - e["intended"] < 0.5, e
    assert 140 <= evs[0]["evidence"]["added_ms"] <= 250
    assert plan.leftovers == {} and be.census(RUN) == []


SIGTERM_SCRIPT = textwrap.dedent("""
    import sys, time
    from monsoon.faults.base import FaultContext
    from monsoon.faults.plan import FaultPlan
    from monsoon.spec.fault import FaultSpec
    from monsoon.faults.toxiproxy import ToxiproxyBackend
    from monsoon.timeline.store import Timeline
    api, run, tl_path = sys.argv[1:4]
    f = FaultSpec(name="lat", kind="network-latency", target="platform->echo", backend="toxiproxy",
                  params={"latency_ms": 250, "probe": "echo"}, schedule={"at": 0, "duration": 3600})
    tl = Timeline(tl_path)
    with FaultPlan([f], {"toxiproxy": ToxiproxyBackend(api)}, tl, ctx=FaultContext(run_id=run), horizon=7200):
        print("injecting", flush=True)
        time.sleep(600)
""")


def test_sigterm_during_a_plan_heals_everything(routed, tmp_path):
    be, addr = routed
    tl_path = tmp_path / "tl.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", SIGTERM_SCRIPT, be.client.api, RUN, str(tl_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not be.census(RUN):
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the plan never injected"
            time.sleep(0.05)
        assert floor_rtt(addr, ECHO) >= 240
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert be.census(RUN) == []
    assert floor_rtt(addr, ECHO) < 50
    evs = read_events(tl_path)
    assert [e["phase"] for e in evs if e["type"] == "fault"][-1] == "heal"
    census = [e for e in evs if e["type"] == "fault-census"]
    assert census and census[0]["leftovers"] == {}
