"""TbRestProvisioner against a small in-process HTTP server speaking the
subset of ThingsBoard's REST API the provisioner uses (login, refresh, device profile,
device lookup/create/credentials/delete), with real TB 4.2.1's behaviours: a device of a type
without a profile creates the profile inside the request, and concurrent such creates race on
device_profile_name_unq_key (500 "Database error"); a REST rate limit answers 429."""

from __future__ import annotations

import json
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from monsoon.stack.provision import Device
from monsoon.stack.provision import NoProvisioner, ProvisionError, TbRestProvisioner, device_names


class FakeTb:
    def __init__(self) -> None:
        self.devices: dict[str, dict] = {}  # name -> {"id", "token"}
        self.valid_tokens: set[str] = set()
        self.calls: list[tuple[str, str]] = []
        self.lock = threading.Lock()
        self.logins = 0
        self.refreshes = 0
        self.profiles: dict[str, dict] = {}   # name -> profile
        self.creating_profile: set[str] = set()
        self.throttle = 0                     # the next N authenticated calls answer 429
        fake = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _send(self, code: int, body: object | None = None) -> None:
                data = b"" if body is None else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authed(self) -> bool:
                h = self.headers.get("X-Authorization", "")
                if h.startswith("Bearer ") and h[7:] in fake.valid_tokens:
                    with fake.lock:
                        if fake.throttle > 0:
                            fake.throttle -= 1
                            self._send(429, {"status": 429, "message": "Too many requests for current tenant!",
                                             "errorCode": 33})
                            return False
                    return True
                self._send(401, {"status": 401, "message": "Token has expired", "errorCode": 11})
                return False

            def _json(self) -> dict:
                n = int(self.headers.get("Content-Length", 0))
                return json.loads(self.rfile.read(n) or b"{}")

            def do_POST(self) -> None:
                u = urlparse(self.path)
                with fake.lock:
                    fake.calls.append(("POST", u.path))
                if u.path == "/api/auth/login":
                    b = self._json()
                    if (b.get("username"), b.get("password")) != ("tenant@thingsboard.org", "tenant"):
                        return self._send(401, {"status": 401, "message": "Authentication failed", "errorCode": 10})
                    with fake.lock:
                        fake.logins += 1
                        tok = f"jwt-{uuid.uuid4()}"
                        fake.valid_tokens.add(tok)
                    return self._send(200, {"token": tok, "refreshToken": "refresh-" + tok})
                if u.path == "/api/auth/token":
                    b = self._json()
                    with fake.lock:
                        fake.refreshes += 1
                        tok = f"jwt-{uuid.uuid4()}"
                        fake.valid_tokens.add(tok)
                    return self._send(200, {"token": tok, "refreshToken": "refresh-" + tok})
                if u.path == "/api/deviceProfile":
                    if not self._authed():
                        return
                    b = self._json()
                    for k, what in (("type", "type"), ("transportType", "transport type")):
                        if not b.get(k):
                            return self._send(400, {"status": 400, "errorCode": 31,
                                                    "message": f"Device profile {what} should be specified!"})
                    with fake.lock:
                        if b["name"] in fake.profiles:
                            return self._send(400, {"status": 400, "errorCode": 31,
                                                    "message": "Device profile with such name already exists!"})
                        fake.profiles[b["name"]] = dict(b, id={"entityType": "DEVICE_PROFILE", "id": str(uuid.uuid4())})
                    return self._send(200, fake.profiles[b["name"]])
                if u.path == "/api/device":
                    if not self._authed():
                        return
                    b = self._json()
                    token = parse_qs(u.query)["accessToken"][0]
                    with fake.lock:   # TB's findOrCreateDeviceProfile: no guard against a concurrent creator
                        race = b["type"] not in fake.profiles and b["type"] in fake.creating_profile
                        new_type = b["type"] not in fake.profiles and not race
                        if new_type:
                            fake.creating_profile.add(b["type"])
                    if race:
                        return self._send(500, {"status": 500, "message": "Database error", "errorCode": 2})
                    if new_type:
                        time.sleep(0.05)
                        with fake.lock:
                            fake.profiles[b["type"]] = {"name": b["type"]}
                            fake.creating_profile.discard(b["type"])
                    with fake.lock:
                        if b["name"] in fake.devices:
                            return self._send(400, {"status": 400, "message": "Device with such name already exists!"})
                        d = {"id": str(uuid.uuid4()), "token": token, "type": b["type"]}
                        fake.devices[b["name"]] = d
                    return self._send(200, {"id": {"entityType": "DEVICE", "id": d["id"]}, "name": b["name"]})
                self._send(404, {"message": "no route"})

            def do_GET(self) -> None:
                u = urlparse(self.path)
                with fake.lock:
                    fake.calls.append(("GET", u.path))
                if not self._authed():
                    return
                if u.path == "/api/deviceProfiles":
                    q = parse_qs(u.query).get("textSearch", [""])[0]
                    return self._send(200, {"data": [p for n, p in fake.profiles.items() if q.lower() in n.lower()],
                                            "totalPages": 1, "totalElements": len(fake.profiles), "hasNext": False})
                if u.path == "/api/tenant/devices":
                    name = parse_qs(u.query)["deviceName"][0]
                    d = fake.devices.get(name)
                    if d is None:
                        return self._send(404, {"status": 404, "message": "Requested item wasn't found!"})
                    return self._send(200, {"id": {"entityType": "DEVICE", "id": d["id"]}, "name": name})
                if u.path.startswith("/api/device/") and u.path.endswith("/credentials"):
                    dev_id = u.path.split("/")[3]
                    for d in fake.devices.values():
                        if d["id"] == dev_id:
                            return self._send(200, {"credentialsType": "ACCESS_TOKEN", "credentialsId": d["token"]})
                    return self._send(404, {"message": "no device"})
                self._send(404, {"message": "no route"})

            def do_DELETE(self) -> None:
                u = urlparse(self.path)
                with fake.lock:
                    fake.calls.append(("DELETE", u.path))
                if not self._authed():
                    return
                dev_id = u.path.split("/")[3]
                with fake.lock:
                    for name, d in list(fake.devices.items()):
                        if d["id"] == dev_id:
                            del fake.devices[name]
                            return self._send(200)
                self._send(404, {"message": "no device"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


@pytest.fixture
def tb():
    f = FakeTb()
    try:
        yield f
    finally:
        f.close()


def test_device_names_are_deterministic() -> None:
    a = device_names("monsoon", 3)
    assert [n for n, _ in a] == ["monsoon-00000", "monsoon-00001", "monsoon-00002"]
    assert a == device_names("monsoon", 3)
    assert len({t for _, t in a}) == 3
    assert device_names("other", 1)[0][1] != a[0][1]


def test_no_provisioner_token_is_name() -> None:
    p = NoProvisioner()
    assert p.ensure_devices([("a", "x"), ("b", "y")]) == [Device("a", "a"), Device("b", "b")]


def test_ensure_devices_creates_then_is_idempotent(tb: FakeTb) -> None:
    wanted = device_names("dev", 20)
    with TbRestProvisioner(tb.url, "tenant@thingsboard.org", "tenant") as p:
        p.login()
        got = p.ensure_devices(wanted)
        assert got == [Device(n, t) for n, t in wanted]
        assert len(tb.devices) == 20
        creates = sum(1 for m, path in tb.calls if (m, path) == ("POST", "/api/device"))
        assert creates == 20
        # a device that exists with a different token: its real token comes back
        tb.devices["dev-00003"]["token"] = "real-token"
        again = p.ensure_devices(wanted)
        assert again[3] == Device("dev-00003", "real-token")
        assert sum(1 for m, path in tb.calls if (m, path) == ("POST", "/api/device")) == 20


def test_expired_jwt_is_refreshed_once_and_retried(tb: FakeTb) -> None:
    with TbRestProvisioner(tb.url, "tenant@thingsboard.org", "tenant") as p:
        p.login()
        tb.valid_tokens.clear()  # every JWT expires at once
        got = p.ensure_devices(device_names("x", 16))
        assert len(got) == 16
        assert tb.refreshes == 1  # 8 threads hit 401 together; one refresh
        assert tb.logins == 1


def test_delete_devices(tb: FakeTb) -> None:
    with TbRestProvisioner(tb.url, "tenant@thingsboard.org", "tenant") as p:
        p.ensure_devices(device_names("d", 5))
        p.delete_devices(["d-00000", "d-00001", "not-there"])
        assert sorted(tb.devices) == ["d-00002", "d-00003", "d-00004"]


def test_login_failure_names_url_status_and_message(tb: FakeTb) -> None:
    p = TbRestProvisioner(tb.url, "tenant@thingsboard.org", "wrong")
    with pytest.raises(ProvisionError) as ei:
        p.login()
    assert str(ei.value) == f"login to {tb.url} failed: 401 Authentication failed"


def test_unreachable_server_is_a_provision_error() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = TbRestProvisioner(f"http://127.0.0.1:{port}", "u", "p", timeout=2)
    with pytest.raises(ProvisionError, match=rf"login to http://127.0.0.1:{port}/api/auth/login failed: ConnectionError"):
        p.login()


def test_the_profile_is_created_once_before_the_devices(tb: FakeTb) -> None:
    """Real TB 4.2.1 makes a missing profile inside each device create, and 8 concurrent creates of a new type
    race on device_profile_name_unq_key (7 of 8 got 500 "Database error"): the profile comes first, once."""
    wanted = device_names("race", 40)
    with TbRestProvisioner(tb.url, "tenant@thingsboard.org", "tenant", workers=8) as p:
        got = p.ensure_devices(wanted)
        assert [d.token for d in got] == [t for _, t in wanted]
        p.ensure_devices(wanted)
    assert tb.calls.count(("POST", "/api/deviceProfile")) == 1 and set(tb.profiles) == {"monsoon"}
    assert tb.profiles["monsoon"]["type"] == "DEFAULT" and tb.profiles["monsoon"]["transportType"] == "DEFAULT"


def test_the_fake_races_as_tb_does_without_the_profile_first(tb: FakeTb) -> None:
    """The fake is honest: without the profile first, concurrent creates fail as they did on real TB."""
    with TbRestProvisioner(tb.url, "tenant@thingsboard.org", "tenant", workers=8) as p:
        p.ensure_profile = lambda: None
        with pytest.raises(ProvisionError, match="500 Database error"):
            p.ensure_devices(device_names("race2", 16))


def test_a_rate_limited_call_waits_and_retries(tb: FakeTb, monkeypatch) -> None:
    import monsoon.stack.provision as prov
    monkeypatch.setattr(prov, "RATE_LIMIT_WAITS", (0.01, 0.01, 0.01))
    with TbRestProvisioner(tb.url, "tenant@thingsboard.org", "tenant", workers=1) as p:
        p.login()
        tb.throttle = 3
        assert [d.name for d in p.ensure_devices(device_names("slow", 2))] == ["slow-00000", "slow-00001"]
        tb.throttle = 4
        with pytest.raises(ProvisionError, match="429 Too many requests for current tenant!"):
            p.ensure_devices(device_names("slow", 1))
