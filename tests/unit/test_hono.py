"""Hono's pieces that are pure logic: the Kafka read-back's record parsing, the new spec keys (storage kind kafka,
provisioning kind hono-registry), the provisioner choice, HonoRegistryProvisioner's calls (against a small
in-process HTTP server speaking the part of Hono's Device Registry Management API it uses), tools/build-hono's
argument errors, and that every Hono component the stack runs is one tools/build-hono caches."""
from __future__ import annotations

import base64

import json
import re
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from monsoon.observe.kafka_store import parse_record
from monsoon.observe.storage import stored_source
from monsoon.spec.stack import load_stack
from monsoon.spec.yamlio import SpecError
from monsoon.stack.provision import (psk_key, HonoRegistryProvisioner, NoProvisioner, ProvisionError, TbRestProvisioner,
                                     device_names, provisioner_for)

REPO = Path(__file__).resolve().parents[2]


def test_parse_record_reads_monsoon_payloads_and_skips_the_rest():
    body = json.dumps({"ts": 1, "values": {"device": "d-00001", "seq": 7, "sent_ms": 3}}).encode()
    assert parse_record(body, [("device_id", b"other")]) == ("d-00001", 7)
    # a template payload without "values", and a device only in Hono's device_id header
    assert parse_record(b'{"seq": "12"}', [("device_id", b"d-2")]) == ("d-2", 12)
    for value in (None, b"", b"not json", b"[1]", b'{"values": {"device": "x"}}', b'{"seq": true}',
                  b'{"seq": "x1"}'):
        assert parse_record(value, [("device_id", b"d")]) is None
    assert parse_record(b'{"seq": 1}', None) is None      # no device anywhere


def test_shipped_hono_stack_reads_back_from_its_topics():
    spec = load_stack(REPO / "stacks/hono-kafka.yaml")
    assert spec.storage.kind == "kafka" and "hono.telemetry.monsoon" in spec.storage.topics
    src = stored_source(spec.storage, lambda s: s.replace("{port:kafka}", "9092"))
    assert src.bootstrap == "127.0.0.1:9092" and src.topics == spec.storage.topics
    prov = provisioner_for(spec.provisioning, lambda s: s.replace("{port:hono_registry}", "8080"))
    assert isinstance(prov, HonoRegistryProvisioner)
    assert prov.base_url == "http://127.0.0.1:8080" and prov.tenant == "monsoon"


def test_every_hono_component_is_one_the_build_caches():
    script = (REPO / "tools/build-hono").read_text()
    built = set(re.findall(r"([a-z-]+)=(?:services|adapters)/", script))
    spec = load_stack(REPO / "stacks/hono-kafka.yaml")
    used = {s.command[1] for s in spec.services.values() if s.command and s.command[0].endswith("/run-hono")}
    assert used and used <= built


def _stack(tmp_path, storage: str, provisioning: str) -> Path:
    p = tmp_path / "s.yaml"
    p.write_text(f"""name: s
services:
  kafka: {{command: ["true"], ready: {{tcp: "127.0.0.1:{{port:kafka}}"}}}}
  registry: {{command: ["true"], ready: {{tcp: "127.0.0.1:{{port:reg}}"}}}}
devices: {{port: "{{port:kafka}}"}}
provisioning: {provisioning}
storage: {storage}
""")
    return p


@pytest.mark.parametrize("storage, provisioning, msg", [
    ('{kind: kafka, contact_points: ["127.0.0.1:{port:kafka}"]}',
     '{kind: hono-registry, url: "http://127.0.0.1:{port:reg}", tenant: t}', "storage kind kafka needs topics"),
    ("{kind: kafka, topics: [a]}",
     '{kind: hono-registry, url: "http://127.0.0.1:{port:reg}", tenant: t}', "needs contact_points"),
    ('{kind: kafka, contact_points: ["127.0.0.1:{port:kafka}"], topics: [a]}',
     '{kind: hono-registry, url: "http://127.0.0.1:{port:reg}"}', "hono-registry provisioning needs url and tenant"),
])
def test_hono_spec_keys_are_checked(tmp_path, storage, provisioning, msg):
    with pytest.raises(SpecError, match=msg):
        load_stack(_stack(tmp_path, storage, provisioning))


def test_provisioner_choice():
    spec = load_stack(REPO / "stacks/kafka.yaml")
    assert isinstance(provisioner_for(spec.provisioning, lambda s: s),
                      NoProvisioner if spec.provisioning.kind == "none" else TbRestProvisioner)


class FakeHonoRegistry:
    """Tenants, devices and credentials as Hono's management API answers them: 201 / 409 on create, 204 on
    credentials set and deletes, 404 for what is not there."""

    def __init__(self) -> None:
        self.tenants: set[str] = set()
        self.devices: dict[tuple[str, str], list] = {}
        self.lock = threading.Lock()
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code: int) -> None:
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _body(self):
                n = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(n) or b"null")

            def do_POST(self):
                parts = self.path.strip("/").split("/")
                self._body()
                with fake.lock:
                    if parts[:2] == ["v1", "tenants"]:
                        code = 409 if parts[2] in fake.tenants else 201
                        fake.tenants.add(parts[2])
                    elif parts[:2] == ["v1", "devices"] and parts[2] in fake.tenants:
                        key = (parts[2], parts[3])
                        code = 409 if key in fake.devices else 201
                        fake.devices.setdefault(key, [])
                    else:
                        code = 404
                self._send(code)

            def do_PUT(self):
                parts = self.path.strip("/").split("/")
                body = self._body()
                with fake.lock:
                    key = (parts[2], parts[3])
                    if parts[:2] != ["v1", "credentials"] or key not in fake.devices:
                        return self._send(404)
                    fake.devices[key] = body
                self._send(204)

            def do_DELETE(self):
                parts = self.path.strip("/").split("/")
                with fake.lock:
                    if parts[1] == "devices":
                        found = fake.devices.pop((parts[2], parts[3]), None) is not None
                    else:
                        found = parts[2] in fake.tenants
                        fake.tenants.discard(parts[2])
                self._send(204 if found else 404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def registry():
    fake = FakeHonoRegistry()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def test_hono_provisioner_creates_tenant_devices_and_credentials_then_deletes_them(registry):
    prov = HonoRegistryProvisioner(registry.url, "t1", workers=4)
    wanted = device_names("h", 5)
    devs = prov.ensure_devices(wanted)
    assert [d.name for d in devs] == [n for n, _ in wanted]
    assert devs[0].token == "h-00000@t1" and devs[0].password == wanted[0][1]
    assert registry.tenants == {"t1"} and len(registry.devices) == 5
    cred = registry.devices[("t1", "h-00003")]
    # the password for MQTT and HTTP, and the same secret as the CoAP devices' pre-shared key (Base64)
    psk = base64.urlsafe_b64encode(psk_key(wanted[3][1])).decode()
    assert cred == [{"type": "hashed-password", "auth-id": "h-00003", "secrets": [{"pwd-plain": wanted[3][1]}]},
                    {"type": "psk", "auth-id": "h-00003", "secrets": [{"key": psk}]}]
    assert prov.ensure_devices(wanted) == devs       # idempotent: 409s are fine
    prov.delete_devices([n for n, _ in wanted] + ["never-made"])
    assert registry.devices == {} and registry.tenants == set()
    prov.close()


def test_hono_provisioner_says_what_failed(registry):
    prov = HonoRegistryProvisioner(registry.url + "/nope", "t1")
    with pytest.raises(ProvisionError, match=r"POST .*/nope/v1/tenants/t1 failed: 404"):
        prov.ensure_devices(device_names("h", 1))


@pytest.mark.parametrize("args, msg", [
    ([], "usage: tools/build-hono SRC_DIR"),
    (["/"], "is not Hono 2.6.0's source"),
])
def test_build_hono_refuses_without_the_source(tmp_path, args, msg):
    r = subprocess.run([str(REPO / "tools/build-hono"), *args], capture_output=True, text=True,
                       env={"PATH": "/usr/bin:/bin", "MONSOON_CACHE": str(tmp_path)})
    assert r.returncode == 2 and msg in r.stderr


class _Tl:
    def __init__(self):
        self.events = []

    def add(self, type_, **fields):
        self.events.append((type_, fields))


class _Registry:
    delete_after_run = True

    def __init__(self, fail=False):
        self.deleted, self.closed, self.fail = [], 0, fail

    def delete_devices(self, names):
        if self.fail:
            raise ProvisionError("DELETE http://127.0.0.1:1/v1/devices/t/d failed: ConnectionError")
        self.deleted.append(list(names))

    def close(self):
        self.closed += 1


def test_a_run_deletes_what_the_registry_created_once_and_says_when_it_could_not():
    from monsoon.run.harness import LoadHarness
    tl, ok, gone = _Tl(), _Registry(), _Registry(fail=True)
    h = LoadHarness(tl)
    h.created = [(ok, ["d1", "d2"]), (gone, ["d3"])]
    h.deprovision()
    h.close()                                   # after the run's own deprovision: nothing twice
    assert ok.deleted == [["d1", "d2"]] and ok.closed == 1 and gone.closed == 1
    ops = [f for t, f in tl.events if t == "op"]
    assert ops[0] == {"op": "deprovisioned", "devices": 2}
    assert ops[1]["op"] == "deprovisioned" and ops[1]["ok"] is False and "ConnectionError" in ops[1]["error"]
    assert len(ops) == 2


# A registry that is one of the stack's services (as Hono's is): it dies with the stack, so a deletion that comes
# after the stack's stop fails as on the real Hono. It answers the management API's calls and writes the devices
# it holds to a file after each one; a credentials PUT for the device named in argv[3] gets a 400.
_REGISTRY_SERVICE = """\
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
state, devices, bad = sys.argv[2], set(), sys.argv[3]
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def _done(self, code):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        open(state, "w").write(json.dumps(sorted(devices)))
        self.send_response(code); self.send_header("Content-Length", "0"); self.end_headers()
    def do_POST(self):
        p = self.path.strip("/").split("/")
        if p[1] == "devices": devices.add(p[3])
        self._done(201)
    def do_PUT(self):
        self._done(400 if self.path.endswith("/" + bad) else 204)
    def do_DELETE(self):
        p = self.path.strip("/").split("/")
        if p[1] == "devices": devices.discard(p[3])
        self._done(204)
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


@pytest.mark.parametrize("bad", [
    "none",         # every device made, then the fleet's connect fails
    "d-00002",      # a 400 part-way through provisioning: what was made before it
], ids=["connect-fails", "provisioning-fails"])
def test_what_provisioning_made_is_deleted_before_the_stack_stops_whatever_failed(tmp_path, bad):
    import sys
    from monsoon.run.harness import LoadHarness
    from monsoon.stack.supervisor import Stack
    (tmp_path / "reg.py").write_text(_REGISTRY_SERVICE)
    state = tmp_path / "devices.json"
    p = tmp_path / "s.yaml"
    p.write_text(f"""\
name: s
services:
  registry:
    command: ["{sys.executable}", "{tmp_path / 'reg.py'}", "{{port:reg}}", "{state}", "{bad}"]
    ready: {{tcp: "127.0.0.1:{{port:reg}}", timeout: 20}}
devices: {{port: "1"}}
provisioning: {{kind: hono-registry, url: "http://127.0.0.1:{{port:reg}}", tenant: t}}
storage: {{dsn: "postgresql://x", loss_query: "select 1"}}
""")
    tl = _Tl()
    h = LoadHarness(tl)
    with pytest.raises((RuntimeError, ProvisionError)):
        with Stack(load_stack(p), tmp_path / "run", run_id="deprov", on_event=tl.add) as stack:
            h.provision(stack, "d", 5)                 # as LoadHarness.start does
            raise RuntimeError("connect failed")       # the fleet's connect (not reached when provisioning fails)
    h.close()                                          # the run's finally: nothing left to delete, nothing twice
    assert json.loads(state.read_text()) == []         # every device made was deleted
    kinds = [(f.get("op"), f.get("event")) for _, f in tl.events if f.get("op") or f.get("event") in ("stop",)]
    assert kinds.index(("deprovisioned", None)) < kinds.index((None, "stop"))   # while the registry still ran
    assert [f for _, f in tl.events if f.get("op") == "deprovisioned"] == [{"op": "deprovisioned", "devices": 5}]
