"""Hono's command flow over CoAP without Hono: the hono-coap fleet's four legs against a fake CoAP adapter (an
aiocoap server on loopback UDP; plain coap://, the DTLS layer is the real adapter's, in pytest/test_hono.py), the
Location-Path a device answers a command at, the one-line refusal without DTLSSocket, and load.transport picking
one of a stack's device endpoints."""
from __future__ import annotations

import asyncio
import base64
import json
import threading
from collections import Counter
from pathlib import Path

import aiocoap
import aiocoap.resource as resource
import pytest
from aiocoap import CHANGED, SERVICE_UNAVAILABLE, Message

from monsoon.load.coap import DTLS_HINT, HonoCoapFleet, command_response_path, dtls_missing
from monsoon.load.fleet import build_fleet
from monsoon.load.hono import LEGS, NO_COMMAND
from monsoon.load.shapes import Steady
from monsoon.load.stats import FleetConnectError
from monsoon.rundir import LEGS_FILE
from monsoon.spec.experiment import load_experiment
from monsoon.spec.stack import load_stack
from monsoon.spec.yamlio import SpecError
from monsoon.run.validate import validate
from monsoon.stack.provision import Device, psk_credential, psk_key

REPO = Path(__file__).resolve().parents[2]


class _Telemetry(resource.Resource):
    def __init__(self, fake: "FakeCoapAdapter") -> None:
        super().__init__()
        self.fake = fake

    async def render_post(self, request: Message) -> Message:
        q = list(request.opt.uri_query)
        if any(x.startswith("hono-ttd=") for x in q):
            self.fake.seen["command_request"] += 1
            self.fake.queries += 1
            if self.fake.queries % 2:      # every second query gets a command, the others none (2.04 at the ttd)
                return Message(code=CHANGED, payload=b"{}", location_path=("command_response", f"r{self.fake.queries}"),
                               location_query=("hono-command=monsoon",))
            return Message(code=CHANGED)
        self.fake.seen["telemetry"] += 1
        return Message(code=CHANGED)


class _Event(resource.Resource):
    def __init__(self, fake: "FakeCoapAdapter") -> None:
        super().__init__()
        self.fake = fake

    async def render_post(self, request: Message) -> Message:
        self.fake.seen["event"] += 1
        return Message(code=SERVICE_UNAVAILABLE)     # every event refused: counted as coap 5.03


class _Responses(resource.Resource, resource.PathCapable):
    def __init__(self, fake: "FakeCoapAdapter") -> None:
        super().__init__()
        self.fake = fake

    async def render_post(self, request: Message) -> Message:
        assert list(request.opt.uri_query) == ["hono-cmd-status=200"]
        self.fake.answered.append(request.opt.uri_path[-1])
        return Message(code=CHANGED)


class FakeCoapAdapter:
    """Hono's CoAP adapter as a device sees it: 2.04 for telemetry, 5.03 for events, a command (2.04 with its
    Location-Path, as Hono 2.6.0 answers) for every second command query and 2.04 for the others, 2.04 for a command response."""

    def __init__(self) -> None:
        self.seen: Counter[str] = Counter()
        self.queries = 0
        self.answered: list[str] = []
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ctx: aiocoap.Context | None = None
        self._ready = threading.Event()
        self._t = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        site = resource.Site()
        site.add_resource(["telemetry"], _Telemetry(self))
        site.add_resource(["event"], _Event(self))
        site.add_resource(["command_response"], _Responses(self))
        self._ctx = self.loop.run_until_complete(aiocoap.Context.create_server_context(
            site, bind=("127.0.0.1", 0), transports=["udp6"]))
        ep = self._ctx.request_interfaces[0].token_interface.message_interface   # type: ignore[attr-defined]
        self.port = ep.transport.get_extra_info("socket").getsockname()[1]
        self._ready.set()
        self.loop.run_forever()

    def __enter__(self) -> "FakeCoapAdapter":
        self._t.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._ctx is not None
        asyncio.run_coroutine_threadsafe(self._ctx.shutdown(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._t.join(10)


class PlainHonoCoapFleet(HonoCoapFleet):
    """The hono-coap fleet over plain coap:// (the fake has no DTLS)."""
    SCHEME = "coap"
    CLIENT_TRANSPORTS = ["udp6"]


def test_the_coap_fleet_measures_every_leg_and_counts_errors_by_coap_code(tmp_path) -> None:
    devs = [Device(f"d{i}", f"d{i}@acme", f"pw{i}") for i in range(3)]
    with FakeCoapAdapter() as fake:
        fleet = PlainHonoCoapFleet(devs, "127.0.0.1", fake.port, shape=Steady(rate=60, duration=2),
                                   acked_path=tmp_path / "acked.csv", legs={"telemetry": 2, "event": 1, "command": 2})
        with fleet:
            totals = fleet.run(threading.Event())
    legs = totals.legs    # type: ignore[attr-defined]
    assert set(legs) == set(LEGS)
    assert totals.scheduled == totals.sent + totals.failed == 120
    # every event refused with 5.03: the message failed, counted by its CoAP code, in the fleet and in its leg
    assert legs["event"]["ok"] == 0 and legs["event"]["errors"] == {"coap 5.03": fake.seen["event"]} and fake.seen["event"] > 0
    assert totals.failures == {"coap 5.03": fake.seen["event"]}
    assert legs["telemetry"]["ok"] == fake.seen["telemetry"] > 0 and legs["telemetry"]["failed"] == 0
    # half the queries got a command (2.04 with a Location-Path) and were answered at its Location-Path; the others none (2.04)
    cr = legs["command_request"]
    assert cr["ok"] + cr["errors"][NO_COMMAND] == fake.seen["command_request"] and abs(cr["ok"] - cr["errors"][NO_COMMAND]) <= 1
    assert legs["command_response"]["ok"] == cr["ok"] == len(fake.answered) and set(fake.answered) <= {
        f"r{i}" for i in range(1, fake.queries + 1, 2)}
    assert cr["p50_ms"] is not None and cr["p50_ms"] <= cr["p999_ms"] <= cr["max_ms"]
    assert json.loads((tmp_path / LEGS_FILE).read_text())["legs"]["event"]["summary"]["errors"] == {
        "coap 5.03": fake.seen["event"]}


def test_a_psk_is_16_bytes_derived_from_the_devices_secret() -> None:
    # tinydtls answers a key longer than 16 bytes with a fatal internal-error alert (seen against Hono's adapter)
    k = psk_key("86d8714d00fb8c8df8ab")
    assert len(k) == 16 and k == psk_key("86d8714d00fb8c8df8ab") and k != psk_key("86d8714d00fb8c8df8ac")
    # the registry reads the key as Vert.x reads binary JSON: Base64url (a standard "+" or "/" got a 400)
    keys = [psk_credential("d", f"secret-{i}")["secrets"][0]["key"] for i in range(200)]
    assert not any(set(key) & set("+/") for key in keys)
    assert base64.urlsafe_b64decode(keys[7]) == psk_key("secret-7")


def test_a_device_answers_a_command_at_its_location_path_only_when_it_expects_an_answer() -> None:
    assert command_response_path(("command_response", "abc-1")) == "command_response/abc-1"
    assert command_response_path(["cr", "a/b"]) == "cr/a%2Fb"
    assert command_response_path(("command",)) is None         # a one-way command
    assert command_response_path(()) is None
    assert command_response_path(("command_response", "")) is None


def test_without_dtlssocket_the_coap_fleet_refuses_in_one_line_saying_how_to_get_it(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(aiocoap.defaults, "dtls_missing_modules", lambda: ["DTLSSocket"])
    why = dtls_missing()
    assert why is not None and why.startswith(DTLS_HINT) and "\n" not in why and "DTLSSocket" in why
    fleet = build_fleet("hono-coap", [Device("d0", "d0@acme", "pw")], "127.0.0.1", 1, shape=Steady(rate=1, duration=1),
                        acked_path=tmp_path / "acked.csv")
    assert isinstance(fleet, HonoCoapFleet)
    with pytest.raises(FleetConnectError, match="needs the DTLSSocket package"):
        fleet.connect()
    fleet.close()


def test_load_transport_picks_one_of_the_stacks_device_endpoints(tmp_path) -> None:
    stack = load_stack(REPO / "stacks/hono-kafka-toxiproxy.yaml")
    assert stack.devices.offers() == ("hono-http", "hono-coap")
    assert stack.devices.port_of(None) == ("hono-http", "{port:http}")
    assert stack.devices.port_of("hono-coap") == ("hono-coap", "{port:coaps}")
    assert "coap-adapter" in stack.services and "coap-adapter" in load_stack(REPO / "stacks/hono-kafka.yaml").services
    exp = load_experiment(REPO / "experiments/hono-coap-commands.yaml")
    assert exp.load.transport == "hono-coap"
    validate(stack, exp, "quick")
    other = load_stack(REPO / "stacks/kafka.yaml")
    with pytest.raises(SpecError, match=r"load.transport: stack 'kafka' offers no hono-coap devices \(it has: mqtt"):
        validate(other, exp, "quick")
