"""MqttFleet against a real Mosquitto broker on a random 127.0.0.1 port.

Skips only if the ``mosquitto`` binary is absent (``apt-get install -y
mosquitto``). Nothing here mocks the broker.
"""

from __future__ import annotations

import gc
import json
import os
import resource
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest

from monsoon.stack.provision import Device
from monsoon.load.stats import FleetConnectError
from monsoon.load.stats import FleetTotals, SecondStats
from monsoon.load.mqtt import MqttFleet
from monsoon.load.shapes import Steady
from monsoon.timeline.columnar import iter_dicts

MOSQUITTO = shutil.which("mosquitto") or (
    "/usr/sbin/mosquitto" if os.access("/usr/sbin/mosquitto", os.X_OK) else None
)
pytestmark = pytest.mark.skipif(
    MOSQUITTO is None, reason="mosquitto binary not found (apt-get install -y mosquitto)"
)
TOPIC = "v1/devices/me/telemetry"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tcp_sockets(port: int) -> dict[str, int]:
    """Count TCP sockets in this network namespace touching ``port``:
    ``server`` = broker side ESTABLISHED, ``client`` = client side not yet
    closed (anything but LISTEN/TIME_WAIT/CLOSE)."""
    out = {"server": 0, "client": 0}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = line.split()
        lport = int(f[1].split(":")[1], 16)
        rport = int(f[2].split(":")[1], 16)
        state = f[3]
        if lport == port and state == "01":
            out["server"] += 1
        if rport == port and state not in ("0A", "06", "07"):
            out["client"] += 1
    return out


def own_socket_fds() -> int:
    gc.collect()  # sockets of earlier tests' dead objects must not count
    n = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                n += 1
        except OSError:
            pass
    return n


class Broker:
    def __init__(self, workdir: Path, port: int, *, anonymous: bool = True, password_file: Path | None = None) -> None:
        self.port = port
        self.conf = workdir / f"mosquitto-{port}.conf"
        self.log = workdir / f"mosquitto-{port}.log"
        self.conf.write_text(
            f"listener {port} 127.0.0.1\n"
            f"allow_anonymous {'true' if anonymous else 'false'}\n"
            # run as root, mosquitto drops to user mosquitto before it reads the password file (in a 0700 tmp dir)
            + (f"password_file {password_file}\n" + ("user root\n" if os.geteuid() == 0 else "")
               if password_file else "") +
            "persistence false\n"
            "max_queued_messages 0\n"
            "log_type error\nlog_type warning\nlog_type notice\n"
            f"log_dest file {self.log}\n"
        )
        self.proc: subprocess.Popen | None = None

    def start(self, timeout: float = 10.0) -> None:
        assert MOSQUITTO is not None
        stderr = self.log.with_suffix(".stderr")
        with stderr.open("ab") as err_f:
            self.proc = subprocess.Popen(
                [MOSQUITTO, "-c", str(self.conf)], stdout=subprocess.DEVNULL, stderr=err_f
            )
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                err = stderr.read_text(errors="replace")
                raise RuntimeError(f"mosquitto exited with {self.proc.returncode}: {err}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"mosquitto not listening on {self.port} after {timeout}s")
                time.sleep(0.02)

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(5)

    def stop(self) -> None:
        p = self.proc
        if p is None or p.poll() is not None:
            return
        try:
            p.send_signal(signal.SIGCONT)
            p.terminate()
            p.wait(5)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


@pytest.fixture
def broker(tmp_path: Path):
    b = Broker(tmp_path, free_port())
    try:
        b.start()
        yield b
    finally:
        b.stop()


def make_devices(n: int) -> list[Device]:
    return [Device(f"dev-{i:05d}", f"tok-{i:05d}") for i in range(n)]


def read_acked(path: Path) -> list[dict]:
    """The fleet's acked dataset (Parquet parts beside ``path``), every row with the CSV header's names."""
    rows = list(iter_dicts(path))
    assert all(list(r) == ["device", "seq", "intended_ms", "acked_ms"] for r in rows[:1])
    return [{k: (v if k == "device" else int(v)) for k, v in r.items()} for r in rows]


def assert_invariants(t: FleetTotals, secs: list[SecondStats]) -> None:
    assert t.scheduled == t.sent + t.failed + t.dropped
    assert t.sent == t.acked + t.unacked
    assert 0 <= t.late <= t.sent
    # per-second figures add up to the totals
    assert [s.t for s in secs] == list(range(len(secs)))
    for name in ("scheduled", "sent", "acked", "failed", "late"):
        assert sum(getattr(s, name) for s in secs) == getattr(t, name), name


def assert_nothing_left(
    port: int, threads_before: set[threading.Thread] | None = None, fds_before: int | None = None
) -> None:
    """No thread or socket of ours left, and the broker holds no connection."""
    if threads_before is not None:
        leaked = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
        assert leaked == []
    if fds_before is not None:
        assert own_socket_fds() == fds_before
    deadline = time.monotonic() + 5
    while True:
        counts = tcp_sockets(port)
        if counts == {"server": 0, "client": 0} or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert counts == {"server": 0, "client": 0}


class Subscriber:
    """An independent QoS1 subscriber: what did the broker really accept?"""

    def __init__(self, port: int) -> None:
        self.got: list[dict] = []
        self.c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="verifier")
        self.c.on_message = lambda c, u, m: self.got.append(json.loads(m.payload))
        self.c.connect("127.0.0.1", port)
        self.c.loop_start()
        r = self.c.subscribe(TOPIC, qos=1)
        assert r[0] == 0
        time.sleep(0.3)

    def wait_for(self, n: int, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.got) < n and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # and a little longer, to catch duplicates/extras

    def close(self) -> None:
        self.c.disconnect()
        self.c.loop_stop()


# ---------------------------------------------------------------------------


def test_steady_load_every_message_acked_and_recorded(broker: Broker, tmp_path: Path) -> None:
    sub = Subscriber(broker.port)
    threads_before = set(threading.enumerate())
    fds_before = own_socket_fds()
    acked_path = tmp_path / "acked.csv"
    devices = make_devices(20)
    fleet = MqttFleet(devices, "127.0.0.1", broker.port, shape=Steady(1000, 3), acked_path=acked_path)
    secs: list[SecondStats] = []
    try:
        fleet.connect()
        assert fleet.connected == 20
        totals = fleet.run(threading.Event(), secs.append)
    finally:
        fleet.close()
        fleet.close()  # idempotent
    # the fleet left no thread and no socket of its own (the verifier's are older)
    assert [t for t in threading.enumerate() if t not in threads_before] == []
    assert own_socket_fds() == fds_before
    sub.wait_for(totals.acked)
    sub.close()

    assert totals.scheduled == 3000
    assert totals.sent == 3000
    assert totals.failed == totals.dropped == 0
    assert totals.acked == 3000 and totals.unacked == 0
    assert_invariants(totals, secs)
    assert all(s.connected == 20 for s in secs)
    assert secs[0].target_rate == 1000.0
    assert totals.p50_ms is not None and totals.p50_ms <= totals.p99_ms <= totals.max_ms

    rows = read_acked(acked_path)
    keys = [(r["device"], r["seq"]) for r in rows]
    assert len(keys) == totals.acked == len(set(keys))
    by_dev: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_dev[r["device"]].append(r)
    assert set(by_dev) == {d.name for d in devices}
    for name, rs in by_dev.items():
        rs.sort(key=lambda r: r["seq"])
        assert [r["seq"] for r in rs] == list(range(150))  # round robin: 3000/20
        assert totals.last_seq[name] == 149
        ts = [r["intended_ms"] for r in rs]
        assert all(b > a for a, b in zip(ts, ts[1:])), "ts must strictly increase per device"

    # the broker delivered exactly those messages, in TB's payload format
    got = {(m["values"]["device"], m["values"]["seq"]): m for m in sub.got}
    assert len(got) == len(sub.got)
    assert set(got) == set(keys)
    intended = {(r["device"], r["seq"]): r["intended_ms"] for r in rows}
    for key, m in got.items():
        assert set(m) == {"ts", "values"}
        v = m["values"]
        assert set(v) == {"device", "seq", "sent_ms", "temperature", "humidity"}
        assert isinstance(v["temperature"], float) and isinstance(v["humidity"], int)
        assert m["ts"] == intended[key]
        assert v["sent_ms"] >= m["ts"] - 5  # sent at (or after) its intended time
    assert_nothing_left(broker.port)  # fleet and verifier gone: the broker sees no client


def test_broker_killed_and_restarted_fleet_reconnects(broker: Broker, tmp_path: Path) -> None:
    threads_before = set(threading.enumerate())
    fds_before = own_socket_fds()
    acked_path = tmp_path / "acked.csv"
    fleet = MqttFleet(make_devices(20), "127.0.0.1", broker.port, shape=Steady(500, 6), acked_path=acked_path)
    secs: list[SecondStats] = []
    marks: dict[str, float] = {}
    chaos_err: list[BaseException] = []

    def chaos() -> None:
        try:
            time.sleep(1.5)
            marks["freeze"] = time.time()
            broker.signal(signal.SIGSTOP)  # in-flight messages pile up un-acked
            time.sleep(0.5)
            broker.kill()  # ... and die with the broker
            marks["dead"] = time.time()
            time.sleep(1.0)
            broker.start()  # same port
            marks["restarted"] = time.time()
        except BaseException as e:  # noqa: BLE001
            chaos_err.append(e)

    t = threading.Thread(target=chaos)
    try:
        fleet.connect()
        t.start()
        totals = fleet.run(threading.Event(), secs.append)
    finally:
        t.join()
        fleet.close()
    assert not chaos_err

    assert totals.scheduled == 3000
    assert_invariants(totals, secs)
    assert totals.failed > 0, "publishes while disconnected must count as failed"
    assert totals.acked < totals.scheduled
    assert totals.unacked > 0, "messages in flight at the kill must stay un-acked"
    assert totals.unacked == totals.lost_in_flight
    assert totals.reconnects >= 20
    assert min(s.connected for s in secs) < 20
    assert secs[-1].connected == 20
    # the load continued after the restart: acks in the last two seconds
    assert sum(s.acked for s in secs if s.t >= 4) > 500
    # nothing was queued while down: failures ~ gap length x rate, not 0
    assert totals.failed >= 250

    rows = read_acked(acked_path)
    keys = [(r["device"], r["seq"]) for r in rows]
    assert len(keys) == totals.acked == len(set(keys))
    # nothing published while the broker was frozen/dead was ever acked
    freeze_ms, restart_ms = marks["freeze"] * 1000 + 50, marks["restarted"] * 1000
    assert not [r for r in rows if freeze_ms < r["intended_ms"] < restart_ms - 1000]
    for name, last in totals.last_seq.items():
        seqs = sorted(r["seq"] for r in rows if r["device"] == name)
        assert seqs and seqs[-1] <= last
    assert_nothing_left(broker.port, threads_before, fds_before)


def test_stop_event_ends_run_and_counts_dropped(broker: Broker, tmp_path: Path) -> None:
    fleet = MqttFleet(make_devices(5), "127.0.0.1", broker.port, shape=Steady(200, 60),
                      acked_path=tmp_path / "acked.csv")
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    t0 = time.monotonic()
    try:
        totals = fleet.run(stop, None)  # connects by itself
    finally:
        fleet.close()
    assert time.monotonic() - t0 < 4.0
    assert 100 <= totals.scheduled <= 400
    assert totals.scheduled == totals.sent + totals.failed + totals.dropped
    assert totals.acked == totals.sent


def test_connect_nothing_listening_names_endpoint(tmp_path: Path) -> None:
    port = free_port()
    fds_before = own_socket_fds()
    fleet = MqttFleet(make_devices(3), "127.0.0.1", port, shape=Steady(10, 1), acked_path=tmp_path / "a.csv")
    with pytest.raises(FleetConnectError) as ei:
        fleet.connect(timeout=5)
    msg = str(ei.value)
    assert f"127.0.0.1:{port}" in msg and "dev-00000" in msg and "nothing listening" in msg
    fleet.close()
    assert own_socket_fds() == fds_before


def test_connect_refused_by_broker_names_device_and_reason(tmp_path: Path) -> None:
    b = Broker(tmp_path, free_port(), anonymous=False)  # no password file: refuses all
    fds_before = own_socket_fds()
    try:
        b.start()
        fleet = MqttFleet(make_devices(3), "127.0.0.1", b.port, shape=Steady(10, 1), acked_path=tmp_path / "a.csv")
        with pytest.raises(FleetConnectError) as ei:
            fleet.connect(timeout=5)
        msg = str(ei.value)
        assert f"127.0.0.1:{b.port}" in msg and "dev-0000" in msg and "Not authorized" in msg
        fleet.close()
        assert own_socket_fds() == fds_before
    finally:
        b.stop()


@pytest.mark.skipif(not os.environ.get("MONSOON_BENCH"), reason="benchmark: set MONSOON_BENCH=1")
@pytest.mark.parametrize("rate", [2000, 5000, 8000, 10000, 12000])
def test_throughput_report(broker: Broker, tmp_path: Path, rate: int) -> None:
    """Not a pass/fail test: prints what 100 devices sustain at QoS1."""
    fleet = MqttFleet(make_devices(100), "127.0.0.1", broker.port, shape=Steady(rate, 10),
                      acked_path=tmp_path / "acked.csv")
    try:
        fleet.connect()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        totals = fleet.run(threading.Event(), None)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
    finally:
        fleet.close()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    print(
        f"\nBENCH target={rate}/s acked={totals.acked} in {totals.elapsed_s:.2f}s "
        f"-> {totals.acked / totals.elapsed_s:.0f}/s late={totals.late} "
        f"p50={totals.p50_ms}ms p99={totals.p99_ms}ms cpu/1k={cpu / totals.acked * 1000:.3f}s"
    )
