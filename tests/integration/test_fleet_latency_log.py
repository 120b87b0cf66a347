"""The fleet's per-second latency histograms (latency.hlog) against a real Mosquitto broker: one interval
per second that saw acks, adding up to every PUBACK, and the per-phase sums the checks read.

Skips only if the ``mosquitto`` binary is absent.
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from monsoon.timeline.hdrlog import phase_histograms, read_intervals
from monsoon.stack.provision import Device
from monsoon.load.mqtt import MqttFleet
from monsoon.load.shapes import Steady

MOSQUITTO = shutil.which("mosquitto") or shutil.which("/usr/sbin/mosquitto")
pytestmark = pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto binary not found")


@pytest.fixture
def broker_port(tmp_path: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                    "max_queued_messages 0\nlog_type error\n")
    proc = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, "mosquitto did not start"
                time.sleep(0.02)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def test_the_fleet_writes_one_histogram_per_second_adding_up_to_every_ack(broker_port, tmp_path):
    devices = [Device(f"dev-{i}", f"tok-{i}") for i in range(5)]
    fleet = MqttFleet(devices, "127.0.0.1", broker_port, shape=Steady(200, 3), acked_path=tmp_path / "acked.csv",
                      latency_log_path=tmp_path / "latency.hlog")
    try:
        totals = fleet.run(threading.Event())
    finally:
        fleet.close()
    assert totals.acked == 600
    intervals = list(read_intervals(tmp_path / "latency.hlog"))
    assert 3 <= len(intervals) <= 5 and all(n == 1.0 for _, n, _ in intervals)
    assert [s for s, _, _ in intervals] == sorted({s for s, _, _ in intervals})
    hs = phase_histograms(tmp_path / "latency.hlog", [{"name": "steady", "start": 0, "end": 3}])
    assert hs["all"].get_total_count() == hs["steady"].get_total_count() == totals.acked
    assert hs["all"].get_max_value() / 1000 == pytest.approx(totals.max_ms, rel=0.01)
