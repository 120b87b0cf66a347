"""Hono's command flow without Hono: the kind cycle, the backend's command for a command query, the hono-http
fleet's four legs against a fake HTTP adapter (aiohttp, loopback) and the leg_objective check on the run files
it writes. The real adapter: tests/integration/test_hono.py and pytest/test_hono.py."""
from __future__ import annotations

import asyncio
import json
import threading
from collections import Counter

import pytest
from aiohttp import web

from monsoon.checks.legs import leg_objective
from monsoon.checks.base import RunData
from monsoon.load.fleet import build_fleet
from monsoon.load.hono import LEGS, NO_COMMAND, HonoHttpFleet, leg_cycle
from monsoon.load.shapes import Steady
from monsoon.observe.kafka_store import command_for
from monsoon.rundir import LEG_LATENCY_FILE, LEGS_FILE, TIMELINE_FILE
from monsoon.stack.provision import Device


def test_the_cycle_follows_the_weights_evenly_spread() -> None:
    c = leg_cycle({"telemetry": 6, "event": 2, "command": 2})
    assert Counter(c) == {"telemetry": 60, "event": 20, "command": 20}
    assert all("command" in c[i:i + 5] for i in range(0, 100, 5))       # spread, not bunched at the end
    assert set(leg_cycle({"telemetry": 1})) == {"telemetry"}
    assert Counter(leg_cycle(None)) == {"telemetry": 60, "event": 20, "command": 20}
    for bad, words in (({"query": 1}, "unknown kind 'query'"), ({"event": -1}, "event must be a number >= 0"),
                       ({"event": 0}, "at least one weight")):
        with pytest.raises(ValueError, match=words):
            leg_cycle(bad)


def test_a_command_query_gets_a_request_response_command_and_other_records_none() -> None:
    hdrs = [("device_id", b"d1"), ("ttd", b"5"), ("content-type", b"application/json")]
    topic, key, headers, value = command_for("hono.telemetry.acme", hdrs, 7)
    h = dict(headers)
    assert (topic, key) == ("hono.command.acme", "d1")
    assert h["device_id"] == b"d1" and h["response-required"] == b"true" and h["subject"] == b"monsoon"
    assert h["correlation-id"] == b"d1-7" and json.loads(value) == {"corr": "d1-7"}
    assert command_for("hono.event.acme", hdrs, 1)[0] == "hono.command.acme"
    assert command_for("hono.telemetry.acme", [("device_id", b"d1")], 1) is None            # no ttd
    assert command_for("hono.telemetry.acme", [("device_id", b"d1"), ("ttd", b"-1")], 1) is None
    assert command_for("hono.command_response.acme", hdrs, 1) is None
    assert command_for("other", hdrs, 1) is None


class FakeAdapter:
    """Hono's HTTP adapter as the device sees it: 202 for telemetry/events, a command (200) for every second
    command query and 202 for the others, 202 for a command response; 503 for every device ``bad``."""

    def __init__(self, bad: str | None = None) -> None:
        self.bad = bad
        self.seen: Counter[str] = Counter()
        self.queries = 0
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._runner: web.AppRunner | None = None
        self._t = threading.Thread(target=self._serve, daemon=True)

    async def _handle(self, req: web.Request) -> web.Response:
        user = req.headers.get("Authorization", "")
        await req.read()
        path = req.path
        kind = "command_response" if path.startswith("/command/res/") else (
            "command_request" if "hono-ttd" in req.headers else path.strip("/"))
        self.seen[kind] += 1
        if self.bad and self.bad in user:
            return web.Response(status=503)
        if kind == "command_request":
            self.queries += 1
            if self.queries % 2:
                return web.Response(status=200, headers={"hono-command": "monsoon",
                                                         "hono-cmd-req-id": f"r{self.queries}"}, body=b"{}")
        if kind == "command_response":
            assert req.query["hono-cmd-status"] == "200"
        return web.Response(status=202)

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        self.loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self.loop.run_forever()

    def __enter__(self) -> "FakeAdapter":
        self._t.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._runner is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._t.join(10)


def test_the_fleet_measures_every_leg_and_counts_errors_by_code(tmp_path) -> None:
    import base64
    devs = [Device(f"d{i}", f"d{i}@acme", f"pw{i}") for i in range(4)]
    bad = base64.b64encode(b"d3@acme:pw3").decode()     # d3's requests are all refused with 503
    with FakeAdapter(bad=bad) as fake:
        fleet = build_fleet("hono-http", devs, "127.0.0.1", fake.port, shape=Steady(rate=200, duration=2),
                            acked_path=tmp_path / "acked.csv", legs={"telemetry": 2, "event": 1, "command": 2})
        assert isinstance(fleet, HonoHttpFleet)
        with fleet:
            totals = fleet.run(threading.Event())
    legs = totals.legs    # type: ignore[attr-defined]
    assert set(legs) == set(LEGS)
    # d3 got 503 on its first requests; the others were acked (their command legs aside)
    assert totals.failures == {"http 503": totals.failed} and totals.failed > 0
    assert totals.acked + totals.failed == totals.sent + totals.failed == totals.scheduled == 400
    assert all(legs[k]["errors"].get("http 503", 0) > 0 for k in ("telemetry", "event", "command_request"))
    # half the good queries got a command (200, then a response: 202), the other half none (202 after the ttd)
    cr = legs["command_request"]
    assert cr["ok"] == legs["command_response"]["ok"] > 0 and legs["command_response"]["failed"] == 0
    assert abs(cr["ok"] - cr["errors"][NO_COMMAND]) <= 1
    assert fake.seen["command_response"] == cr["ok"]
    for leg in ("telemetry", "event", "command_request"):
        assert legs[leg]["p50_ms"] is not None and legs[leg]["p50_ms"] <= legs[leg]["p999_ms"] <= legs[leg]["max_ms"]
    # the run files: legs.json's seconds add up to the summary, one hlog per leg
    doc = json.loads((tmp_path / LEGS_FILE).read_text())["legs"]
    for leg in LEGS:
        per_sec: Counter[str] = Counter()
        for _, outcomes in doc[leg]["seconds"]:
            per_sec.update(outcomes)
        assert per_sec["ok"] == legs[leg]["ok"] and per_sec[NO_COMMAND] == legs[leg]["errors"].get(NO_COMMAND, 0)
    assert (tmp_path / LEG_LATENCY_FILE.format(leg="command_request")).stat().st_size > 100

    # leg_objective on those files, with a timeline whose load seconds end at t = sec + 1
    secs = {s for leg in LEGS for s, _ in doc[leg]["seconds"]}
    (tmp_path / TIMELINE_FILE).write_text("".join(
        json.dumps({"type": "load", "t": s + 1.0, "sec": s}) + "\n" for s in sorted(secs)))
    run = RunData(tmp_path)
    v = leg_objective(run, "command_request", max_ms=60_000, max_errors=10_000)
    assert v.verdict == "pass" and v.figures["ok"] == cr["ok"] and v.figures["errors.http_503"] > 0
    assert v.name == "leg_objective[command_request]" and "p99.9" in v.message
    v = leg_objective(run, "command_request", max_errors=0)
    assert v.verdict == "fail" and "failed > 0" in v.message
    v = leg_objective(run, "command_request", max_ms=0.0001)
    assert v.verdict == "fail" and "p99.9" in v.message
    v = leg_objective(run, "event", during="faults")
    assert v.verdict == "unknown" and "no fault window" in v.message
    assert leg_objective(run, "nope").verdict == "unknown"
    v = leg_objective(run, "command_request")        # no max_ms, no max_errors: it cannot fail, it reports
    assert v.verdict == "info" and "no max_ms or max_errors set" in v.message


def test_a_sha256_secret_is_what_honos_digest_encoder_checks() -> None:
    import base64
    import hashlib
    from monsoon.stack.provision import password_secret
    assert password_secret("pw") == {"pwd-plain": "pw"}
    s = password_secret("pw", "sha-256", salt=b"12345678")
    assert s["hash-function"] == "sha-256" and base64.b64decode(s["salt"]) == b"12345678"
    # Hono's MessageDigestPasswordEncoder: Base64(SHA-256(salt bytes + UTF-8 password))
    assert base64.b64decode(s["pwd-hash"]) == hashlib.sha256(b"12345678pw").digest()
    assert password_secret("pw", "sha-256")["salt"] != password_secret("pw", "sha-256")["salt"]


def test_the_toxiproxy_stack_routes_the_command_routers_cache_and_the_registry_through_proxies() -> None:
    from monsoon.paths import REPO
    from monsoon.spec.stack import load_stack
    from monsoon.stack.provision import HonoRegistryProvisioner, provisioner_for
    spec = load_stack(REPO / "stacks/hono-kafka-toxiproxy.yaml")
    assert spec.devices.transport == "hono-http" and spec.provisioning.password_hash == "sha-256"
    routes = " ".join(spec.services["routes"].command)
    assert "command-router->infinispan=" in routes and "adapters->registry=" in routes
    assert spec.services["command-router"].env["HN_INFINISPAN"] == "127.0.0.1:{port:infinispan_proxy}"
    for adapter in ("http-adapter", "mqtt-adapter"):
        assert spec.services[adapter].env["HN_REGISTRY_AMQP_PORT"] == "{port:hono_registry_amqp_proxy}"
    assert "--commands" in spec.services["backend"].command and spec.chaos.toxiproxy
    prov = provisioner_for(spec.provisioning, lambda s: s)
    assert isinstance(prov, HonoRegistryProvisioner) and prov.password_hash == "sha-256"


def test_leg_objective_judges_a_phase_or_a_window_around_the_faults(tmp_path) -> None:
    # legs.json by hand: command_request 10 ok/s in seconds 0-9, 3 x 503 in seconds 3 and 4
    secs = [[s, {"ok": 10} if s not in (3, 4) else {"ok": 7, "http 503": 3}] for s in range(10)]
    (tmp_path / LEGS_FILE).write_text(json.dumps({"legs": {"command_request": {"summary": {}, "seconds": secs}}}))
    ev = [{"type": "phase", "t": 0.0, "name": "cold", "start": 0.0, "end": 5.0},
          {"type": "phase", "t": 0.0, "name": "warm", "start": 5.0, "end": 10.0},
          {"type": "fault-plan", "t": 0.0},
          {"type": "fault", "t": 3.5, "effective": 3.5, "phase": "inject", "name": "slow",
           "kind": "infinispan-slowdown", "target": "x", "window": 0, "landed": True},
          {"type": "fault", "t": 5.5, "effective": 5.5, "phase": "heal", "name": "slow",
           "kind": "infinispan-slowdown", "target": "x", "window": 0, "landed": True}]
    ev += [{"type": "load", "t": s + 1.0, "sec": s} for s in range(10)]
    (tmp_path / TIMELINE_FILE).write_text("".join(json.dumps(e) + "\n" for e in ev))
    run = RunData(tmp_path)
    cold = leg_objective(run, "command_request", during="cold", max_errors=0)
    warm = leg_objective(run, "command_request", during="warm", max_errors=0)
    assert cold.verdict == "fail" and cold.figures["errors.http_503"] == 6 and cold.figures["ok"] == 44
    assert warm.verdict == "pass" and warm.figures == {"ok": 50, "errors": 0}
    faults = leg_objective(run, "command_request", during="faults")      # seconds 3-5 overlap (3.5, 5.5)
    assert faults.figures == {"ok": 24, "errors": 6, "errors.http_503": 6}
    assert faults.name == "leg_objective[command_request,faults]"
    before = leg_objective(run, "command_request", during="before_faults", max_errors=0)
    assert before.verdict == "pass" and before.figures["ok"] == 30      # seconds 0-2 (ending at t = 1..3)
    after = leg_objective(run, "command_request", during="after_faults", max_errors=0)
    assert after.verdict == "unknown" or after.figures["ok"] == 0       # 10 s after the heal: past the load
    assert leg_objective(run, "command_request", during="nope").verdict == "unknown"
