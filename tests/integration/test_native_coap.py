"""The native Hono CoAP fleet (``monsoon-loadgen run`` with ``transport: hono-coap``: OpenSSL DTLS with PSK) against
monsoon's own DTLS sink (``monsoon-loadgen coap-sink``), real UDP sockets on loopback, no mocks; and the Python
``HonoCoapFleet`` against the same sink where aiocoap's tinydtls transport is installed. No timed assertions."""
from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

import pytest

from monsoon.load.fleet import build_fleet
from monsoon.load.native import LoadgenBuildError, NativeHonoCoapFleet, ensure_loadgen
from monsoon.load.shapes import Steady
from monsoon.load.stats import FleetConnectError
from monsoon.rundir import LEG_LATENCY_FILE, LEGS_FILE
from monsoon.selftest.coap_bench import CoapSink, coap_devices
from monsoon.stack.provision import Device


@pytest.fixture(scope="module")
def loadgen() -> Path:
    try:
        return ensure_loadgen()
    except LoadgenBuildError as e:
        pytest.skip(str(e))


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def native(devs: list[Device], port: int, tmp_path: Path, rate: float = 100.0, duration: float = 2.0,
           **kw: object) -> NativeHonoCoapFleet:
    f = build_fleet("hono-coap", devs, "127.0.0.1", port, shape=Steady(rate=rate, duration=duration),
                    acked_path=tmp_path / "acked.parquet", engine="native", **kw)
    assert isinstance(f, NativeHonoCoapFleet)
    return f


def test_telemetry_events_and_command_round_trips_over_dtls(loadgen: Path, tmp_path: Path) -> None:
    devs = coap_devices(12)
    with CoapSink(loadgen, devs, tmp_path, free_udp_port()) as sink:
        with native(devs, sink.port, tmp_path, workers=2) as f:
            f.connect(timeout=30)
            assert f.connected == 12
            t = f.run(threading.Event())
            legs, errors = f.extra["legs"], f.extra["errors"]
        counts = sink.close()
    assert t.scheduled == 200
    assert (t.acked, t.failed, t.dropped) == (200, 0, 0), (t, errors)
    assert errors == {}
    # every message is one of the kinds (default legs 6:2:2); the sink sends a command to every query, which the
    # device answers
    firsts = legs["telemetry"]["ok"] + legs["event"]["ok"] + legs["command_request"]["ok"]
    assert firsts == 200, legs
    assert min(legs["telemetry"]["ok"], legs["event"]["ok"], legs["command_request"]["ok"]) > 0, legs
    assert legs["command_response"]["ok"] == legs["command_request"]["ok"], legs
    assert legs["telemetry"]["ok"] > legs["event"]["ok"], legs
    assert all(v["failed"] == 0 for v in legs.values()), legs
    assert legs["command_response"]["p50_ms"] is not None
    # every device did its own handshake, and the sink saw every request of every leg
    assert counts["handshakes"] == 12 and counts["failed_handshakes"] == 0, counts
    assert counts["commands"] == legs["command_request"]["ok"], counts
    assert counts["requests"] == 200 + legs["command_response"]["ok"], counts
    # the legs' files, as the Python fleets write them: outcomes per second, round trips per second
    doc = json.loads((tmp_path / LEGS_FILE).read_text())["legs"]
    for leg, summary in legs.items():
        assert doc[leg]["summary"] == summary
        assert sum(int(o.get("ok", 0)) for _, o in doc[leg]["seconds"]) == summary["ok"], doc[leg]
        assert (tmp_path / LEG_LATENCY_FILE.format(leg=leg)).stat().st_size > 0


def test_error_answers_count_by_code_and_a_query_without_command(loadgen: Path, tmp_path: Path) -> None:
    devs = coap_devices(5)
    with CoapSink(loadgen, devs, tmp_path, free_udp_port(), command_every=0, fail_every=4) as sink:
        with native(devs, sink.port, tmp_path, rate=50.0, duration=2.0, legs={"telemetry": 1, "command": 1}) as f:
            f.connect()
            t = f.run(threading.Event())
            legs, errors = f.extra["legs"], f.extra["errors"]
    assert t.scheduled == 100
    assert errors == {"coap 5.03": 25}, errors          # every 4th POST, and no command response POSTs
    assert (t.acked, t.failed) == (75, 25)
    assert t.scheduled == t.sent + t.failed + t.dropped
    assert legs["command_response"]["ok"] + legs["command_response"]["failed"] == 0
    assert legs["command_request"]["errors"].get("no command", 0) > 0, legs
    assert legs["command_request"]["ok"] == 0


def test_separate_responses_are_acked_and_count_as_answers(loadgen: Path, tmp_path: Path) -> None:
    devs = coap_devices(4)
    # every 3rd POST: an empty ACK first, then the response as a confirmable message (Hono past its ACK timeout)
    with CoapSink(loadgen, devs, tmp_path, free_udp_port(), separate_every=3) as sink:
        with native(devs, sink.port, tmp_path, rate=60.0, duration=2.0) as f:
            f.connect()
            t = f.run(threading.Event())
            legs = f.extra["legs"]
        counts = sink.close()
    assert counts["separate"] == counts["requests"] // 3 > 0, counts
    assert (t.scheduled, t.acked, t.failed) == (120, 120, 0), f.extra["errors"]
    assert legs["command_response"]["ok"] == legs["command_request"]["ok"] > 0, legs


def test_a_wrong_pre_shared_key_is_one_clear_line_before_the_load(loadgen: Path, tmp_path: Path) -> None:
    devs = coap_devices(3)
    wrong = [Device(d.name, d.token, "not-the-secret") for d in devs]
    with CoapSink(loadgen, devs, tmp_path, free_udp_port()) as sink:
        with native(wrong, sink.port, tmp_path) as f:
            with pytest.raises(FleetConnectError) as e:
                f.connect(timeout=4)
        counts = sink.close()
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"CoAP/DTLS endpoint 127.0.0.1:{sink.port}: DTLS handshake of device coap-0000"), msg
    assert "@DEFAULT_TENANT" in msg and "pre-shared key" in msg, msg
    assert counts["handshakes"] == 0, counts


def test_no_endpoint_is_one_clear_line(loadgen: Path, tmp_path: Path) -> None:
    port = free_udp_port()    # nothing listens there: the kernel answers port unreachable
    with native(coap_devices(2), port, tmp_path) as f:
        with pytest.raises(FleetConnectError) as e:
            f.connect(timeout=5)
    msg = str(e.value)
    assert "\n" not in msg and f"127.0.0.1:{port}" in msg, msg
    assert "refused" in msg.lower() or "no handshake answer" in msg, msg


def test_the_python_fleet_speaks_to_the_same_sink(loadgen: Path, tmp_path: Path) -> None:
    from monsoon.load.coap import HonoCoapFleet, dtls_missing

    missing = dtls_missing()
    if missing:
        pytest.skip(missing)
    devs = coap_devices(3)
    with CoapSink(loadgen, devs, tmp_path, free_udp_port()) as sink:
        with HonoCoapFleet(devs, "127.0.0.1", sink.port, shape=Steady(rate=20, duration=2),
                           acked_path=tmp_path / "acked-py.parquet") as f:
            f.connect(timeout=30)
            t = f.run(threading.Event())
            legs = f.extra["legs"]
        counts = sink.close()
    assert (t.scheduled, t.acked, t.failed) == (40, 40, 0), legs
    assert legs["command_response"]["ok"] == legs["command_request"]["ok"] > 0, legs
    # aiocoap's tinydtls transport may open a device's session more than once over a run (seen: 7 for 3 devices)
    assert counts["handshakes"] >= 3 and counts["failed_handshakes"] == 0, counts


def test_sends_that_wait_behind_a_stalled_exchange_count_as_held(loadgen: Path, tmp_path: Path) -> None:
    """SIGSTOP the sink ~2 s under load: each device's exchange waits (CoAP retransmits at 2 s), and the sends due
    meanwhile queue behind it (NSTART = 1). They go out late, and are counted ``held`` too: the endpoint's
    lateness, which load_valid and the calibration do not take for the generator's."""
    import os
    import signal
    import time

    devs = coap_devices(6)
    seconds: list = []
    with CoapSink(loadgen, devs, tmp_path, free_udp_port()) as sink:
        with native(devs, sink.port, tmp_path, rate=60.0, duration=6.0) as f:
            f.connect()
            box: dict = {}
            th = threading.Thread(target=lambda: box.update(t=f.run(threading.Event(), on_second=seconds.append)))
            th.start()
            time.sleep(1.5)
            os.kill(sink.pid, signal.SIGSTOP)
            try:
                time.sleep(2.0)
            finally:
                os.kill(sink.pid, signal.SIGCONT)
            th.join(timeout=60)
            t = box["t"]
    held = sum(s.held for s in seconds)
    assert t.late > 0, t
    assert 0 < held <= t.late, (held, t)
    assert t.acked == t.scheduled, t        # nothing lost: every held send went out and was answered


def test_devices_handshake_again_when_their_endpoint_forgets_their_sessions(loadgen: Path, tmp_path: Path) -> None:
    """The sink is killed under load and a new one takes its port, knowing none of the sessions (a pod killed
    behind a Service: the new pod drops the records it cannot authenticate, as DTLS does). Each device's exchange
    then times out without even a CoAP ACK; the device drops its session and handshakes again (``reconnects``),
    and what came due meanwhile goes out on the new session: acked after the restart, nothing acked lost."""
    import signal
    import time

    devs = coap_devices(6)
    seconds: list = []
    port = free_udp_port()
    (tmp_path / "a").mkdir()
    first = CoapSink(loadgen, devs, tmp_path / "a", port)
    second = None
    try:
        with native(devs, port, tmp_path, rate=30.0, duration=9.0, request_timeout_s=2.5) as f:
            f.connect()
            box: dict = {}
            th = threading.Thread(target=lambda: box.update(t=f.run(threading.Event(), on_second=seconds.append)))
            th.start()
            time.sleep(1.5)
            first.proc.send_signal(signal.SIGKILL)
            first.proc.wait(timeout=10)
            (tmp_path / "b").mkdir()
            second = CoapSink(loadgen, devs, tmp_path / "b", port)     # the same port, no session known
            th.join(timeout=90)
            t = box["t"]
    finally:
        first.close()
        counts = second.close() if second is not None else {}
    assert t.reconnects >= len(devs), t                  # every device had a session on the killed sink
    assert counts.get("handshakes", 0) >= len(devs), counts     # ... and made one with the new sink
    assert counts.get("requests", 0) > 0, counts                 # ... and was answered there
    assert sum(s.acked for s in seconds[4:]) > 0, [s.acked for s in seconds]
    assert t.acked + t.failed == t.scheduled and t.failed > 0, t    # what the dead sink held failed, counted


class _ForgetfulRelay:
    """A UDP relay to the sink that drops every datagram of the first client address it sees, both ways: a
    server that lost the handshake state of one 5-tuple (a cold adapter, a pod gone behind a Service)."""

    def __init__(self, upstream_port: int) -> None:
        import selectors

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.upstream = ("127.0.0.1", upstream_port)
        self.sel = selectors.DefaultSelector()
        self.sel.register(self.sock, selectors.EVENT_READ, None)
        self.ups: dict[tuple, socket.socket] = {}
        self.forgotten: tuple | None = None
        self.dropped = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        import selectors

        while not self.stop.is_set():
            for key, _ in self.sel.select(timeout=0.1):
                if key.data is None:
                    data, addr = self.sock.recvfrom(65535)
                    if self.forgotten is None:
                        self.forgotten = addr
                    if addr == self.forgotten:
                        self.dropped += 1
                        continue
                    up = self.ups.get(addr)
                    if up is None:
                        up = self.ups[addr] = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                        up.connect(self.upstream)
                        self.sel.register(up, selectors.EVENT_READ, addr)
                    up.send(data)
                else:
                    try:
                        self.sock.sendto(key.fileobj.recv(65535), key.data)
                    except OSError:
                        pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        for s in [self.sock, *self.ups.values()]:
            s.close()


def test_a_handshake_that_stalls_starts_again_on_a_new_socket(loadgen: Path, tmp_path: Path) -> None:
    """One device's first socket is never answered (the relay forgets its address): its handshake would wait out
    OpenSSL's doubling timer (retransmits at 1, 3, 7, 15, 31 s: past the connect timeout). It gives up after
    5 s and begins again from a new socket, which is answered: every device connects, and the load is acked."""
    devs = coap_devices(3)
    with CoapSink(loadgen, devs, tmp_path, free_udp_port()) as sink:
        relay = _ForgetfulRelay(sink.port)
        try:
            with native(devs, relay.port, tmp_path, rate=30.0, duration=2.0) as f:
                f.connect(timeout=25)
                assert f.connected == 3
                assert f.extra["connect"]["handshake_restarts"] >= 1, f.extra    # (the `connected` event's)
                t = f.run(threading.Event())
                dtls = f.extra["dtls"]
        finally:
            relay.close()
        counts = sink.close()
    assert relay.dropped > 1, relay.dropped          # the first socket's flights, sent again, were all dropped
    assert dtls["restarts"] >= 1, dtls
    assert counts["handshakes"] == 3, counts
    assert (t.scheduled, t.acked, t.failed) == (60, 60, 0), t
