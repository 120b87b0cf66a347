"""monsoon.transports without a network: the in-flight hold on a fake clock, the factory, the spec's
``devices.transport``, and the CoAP adapter's status mapping."""
from __future__ import annotations

import importlib.machinery
import importlib.util
import textwrap

import pytest

from monsoon.stack.provision import Device
from monsoon.load.mqtt import MqttFleet
from monsoon.load.schedule import Pacer, Schedule
from monsoon.load.shapes import Steady
from monsoon.paths import REPO
from monsoon.spec.stack import load_stack
from monsoon.load.fleet import TRANSPORTS, build_fleet
from monsoon.load.aio import AsyncFleet
from monsoon.load.coap import CoapFleet
from monsoon.load.http import HttpFleet, telemetry_path
from monsoon.spec.yamlio import SpecError


class FakeClock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class RecordingFleet(AsyncFleet):
    """AsyncFleet whose requests are recorded instead of sent (no event loop); ``answer`` ends one."""

    def __init__(self, n: int, cap: int, clock: FakeClock, tmp_path) -> None:
        super().__init__([Device(f"d{i}", f"t{i}") for i in range(n)], "127.0.0.1", 1, max_inflight=cap,
                         shape=Steady(rate=10, duration=10), acked_path=tmp_path / "a.csv", clock=clock,
                         wall=lambda: 1_700_000_000.0)
        self._t0 = clock.t
        self._wall0_ms = 1_700_000_000_000.0
        self.launched: list[tuple[str, int, float]] = []   # (device, seq, intended)

    def _launch(self, dev, seq, intended, ts, payload) -> None:
        self.launched.append((dev.device.name, seq, intended))

    def answer(self, idx: int) -> None:
        self._finish(self._devs[idx])


def _pacer(clock: FakeClock, rate: float = 10, duration: float = 10) -> Pacer:
    return Pacer(Schedule(Steady(rate=rate, duration=duration)), clock.t, clock=clock)


def test_a_full_device_queues_its_messages_and_sends_them_late_when_a_slot_frees(tmp_path) -> None:
    clock = FakeClock()
    f = RecordingFleet(2, 1, clock, tmp_path)
    pacer = _pacer(clock)
    t0 = clock.t
    assert pacer.pump(clock.t, f._send) == 1                  # message 0 (d0) at t=0: on time
    clock.t += 1.0                                             # the server stalls for 1 s: nothing answered
    assert pacer.pump(clock.t, f._send) == 10                  # 1..10 are due and all taken off the schedule
    # d1 had a free slot for message 1 (late); everything else waits in its device's backlog
    assert f.launched == [("d0", 0, t0), ("d1", 0, t0 + 0.1)]
    assert (f._started, f._late, f._queued) == (2, 1, 9)
    assert [len(d.backlog) for d in f._devs] == [5, 4]
    f.answer(0)                                                # d0's answer: its next message goes out, late
    assert f.launched[-1] == ("d0", 1, t0 + 0.2)
    assert (f._started, f._late, f._queued) == (3, 2, 8)
    # seqs follow each device's send order; stop: the rest of the backlogs is dropped, never sent
    f._drop_backlogs()
    f.answer(1)
    assert f._started == 3 and f._backlog_dropped == 8 and f._queued == 0
    assert pacer.scheduled == f._started + f._backlog_dropped + pacer.failed + pacer.dropped


def test_a_device_with_room_is_not_held_back_by_a_full_one(tmp_path) -> None:
    clock = FakeClock()
    f = RecordingFleet(2, 1, clock, tmp_path)
    pacer = _pacer(clock)
    t0 = clock.t
    pacer.pump(clock.t, f._send)                               # message 0 -> d0, never answered
    for i in range(1, 10):                                     # d1 answers at once, d0 stays stuck
        clock.t = t0 + i / 10 + 0.01
        pacer.pump(clock.t, f._send)
        if f._devs[1].inflight:
            f.answer(1)
    d1 = [x for x in f.launched if x[0] == "d1"]
    assert [seq for _, seq, _ in d1] == [0, 1, 2, 3, 4]        # every d1 message on time
    assert f._late == 0 and len(f._devs[0].backlog) == 4


def test_the_payload_carries_device_seq_and_the_intended_time(tmp_path) -> None:
    clock = FakeClock()
    got: list[bytes] = []
    f = RecordingFleet(1, 5, clock, tmp_path)
    f._launch = lambda dev, seq, intended, ts, payload: got.append(payload)
    pacer = _pacer(clock)
    clock.t += 0.25
    pacer.pump(clock.t, f._send)
    import json
    msgs = [json.loads(p) for p in got]
    assert [m["values"]["seq"] for m in msgs] == [0, 1, 2]
    assert [m["ts"] for m in msgs] == [1_700_000_000_000, 1_700_000_000_100, 1_700_000_000_200]
    assert {m["values"]["device"] for m in msgs} == {"d0"}


def test_fleet_arguments_are_checked(tmp_path) -> None:
    common = dict(shape=Steady(rate=1, duration=1), acked_path=tmp_path / "a.csv")
    with pytest.raises(ValueError, match="empty"):
        HttpFleet([], "127.0.0.1", 1, **common)
    with pytest.raises(ValueError, match="unique"):
        HttpFleet([Device("a", "1"), Device("a", "2")], "127.0.0.1", 1, **common)
    with pytest.raises(ValueError, match="max_inflight"):
        CoapFleet([Device("a", "1")], "127.0.0.1", 1, max_inflight=0, **common)
    assert HttpFleet([Device("a", "1")], "127.0.0.1", 1, **common).max_inflight == HttpFleet.DEFAULT_MAX_INFLIGHT
    assert CoapFleet([Device("a", "1")], "127.0.0.1", 1, **common).max_inflight == 1   # CoAP's NSTART


def test_build_fleet_picks_the_transport(tmp_path) -> None:
    common = dict(shape=Steady(rate=1, duration=1), acked_path=tmp_path / "a.csv")
    devs = [Device("a", "1")]
    assert isinstance(build_fleet("mqtt", devs, "127.0.0.1", 1883, qos=0, **common), MqttFleet)
    assert isinstance(build_fleet("http", devs, "127.0.0.1", 80, qos=1, **common), HttpFleet)
    assert isinstance(build_fleet("coap", devs, "127.0.0.1", 5683, **common), CoapFleet)
    with pytest.raises(ValueError, match="unknown device transport 'amqp'.*mqtt, http, coap"):
        build_fleet("amqp", devs, "127.0.0.1", 1, **common)
    assert TRANSPORTS == ("mqtt", "http", "coap", "hono-http", "hono-coap")


def test_telemetry_path_is_thingsboards_and_escapes_the_token() -> None:
    assert telemetry_path("A1b2C3") == "/api/v1/A1b2C3/telemetry"
    assert telemetry_path("a/b c?") == "/api/v1/a%2Fb%20c%3F/telemetry"


# ------------------------------------------------------------------ stack spec: devices.transport

STACK = """\
name: s
services:
  svc: {{command: ["true"]}}
devices:
{devices}
provisioning: {{kind: none}}
storage: {{dsn: "postgresql://x", loss_query: "select 1"}}
"""


def _stack(tmp_path, devices: str):
    p = tmp_path / "stacks" / "s.yaml"
    p.parent.mkdir(exist_ok=True)
    p.write_text(STACK.format(devices=textwrap.indent(textwrap.dedent(devices), "  ")))
    return p


def test_transport_defaults_to_mqtt_and_protocol_is_its_older_name(tmp_path) -> None:
    assert load_stack(_stack(tmp_path, 'port: "1883"')).devices.transport == "mqtt"
    assert load_stack(_stack(tmp_path, 'transport: coap\nport: "5683"')).devices.transport == "coap"
    assert load_stack(_stack(tmp_path, 'protocol: http\nport: "80"')).devices.transport == "http"
    with pytest.raises(SpecError, match="protocol .mqtt. and transport .http. differ"):
        load_stack(_stack(tmp_path, 'protocol: mqtt\ntransport: http\nport: "80"'))


def test_an_unknown_transport_names_file_line_and_key(tmp_path) -> None:
    p = _stack(tmp_path, 'port: "1"\ntransport: zigbee')
    with pytest.raises(SpecError) as ei:
        load_stack(p)
    e = ei.value
    assert (e.path, e.line, e.key) == (str(p), 6, "devices.transport")
    assert "'mqtt', 'http', 'coap', 'hono-http' or 'hono-coap'" in str(e)


@pytest.mark.parametrize("name,transport,port", [("inmemory-http", "http", "{port:http}"),
                                                  ("inmemory-coap", "coap", "{port:coap}")])
def test_shipped_transport_stacks(name, transport, port) -> None:
    spec = load_stack(name)
    assert (spec.devices.transport, spec.devices.port) == (transport, port)
    if transport == "coap":
        adapter = spec.services["coap-adapter"]
        assert "platform" in adapter.depends_on and any("coap-adapter" in c for c in adapter.command)
        assert spec.start_order()[-1] == "coap-adapter"


# ------------------------------------------------------------------ the CoAP adapter's pure parts

@pytest.fixture(scope="module")
def adapter():
    pytest.importorskip("aiocoap")
    path = REPO / "stacks/bin/coap-adapter"
    loader = importlib.machinery.SourceFileLoader("monsoon_coap_adapter", str(path))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("status,code", [(200, "2.04"), (204, "2.04"), (400, "4.00"), (401, "4.01"),
                                         (403, "4.03"), (404, "4.04"), (405, "4.05"), (413, "4.13"),
                                         (418, "4.00"), (500, "5.02"), (502, "5.02"), (503, "5.03"),
                                         (504, "5.04")])
def test_adapter_maps_http_status_to_coap(adapter, status, code) -> None:
    assert adapter.coap_code(status).dotted == code


def test_adapter_path_parsing(adapter) -> None:
    assert adapter.parse_path(("tok", "telemetry")) == ("tok", "telemetry")
    assert adapter.parse_path(["tok", "attributes"]) == ("tok", "attributes")
    for bad in ((), ("tok",), ("", "telemetry"), ("tok", "rpc"), ("tok", "telemetry", "x")):
        assert adapter.parse_path(bad) is None


def test_adapter_bind_argument(adapter) -> None:
    assert adapter._hostport("127.0.0.1:5683") == ("127.0.0.1", 5683)
    assert adapter._hostport("[::1]:5684") == ("::1", 5684)
    with pytest.raises(Exception, match="HOST:PORT"):
        adapter._hostport("5683")
