"""The reference platform's Hono-style dependencies on real servers: a Mongo device registry (FerretDB 1.24)
behind an Infinispan 15.2 cache (Hot Rod), with telemetry stored in Postgres.

Devices are provisioned through the TB REST API and must land in Mongo (and, as the storage-side entity, in
Postgres' ``device`` table so the loss query resolves names); MQTT messages go through the lookup chain
near cache -> Infinispan -> Mongo and the lookup metrics show it.
"""
from __future__ import annotations

import glob
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import psycopg
import pytest
import requests

from monsoon.stack.provision import TbRestProvisioner, device_names
from monsoon.paths import REPO
from monsoon.spec.stack import load_stack
from monsoon.stack.supervisor import Stack
from monsoon.stack.ports import StackError
from monsoon.stack.reaper import find_leftovers

pytestmark = pytest.mark.integration

CACHE = Path(os.environ.get("MONSOON_CACHE", REPO / ".cache"))
JAR = REPO / "stacks/reference-platform/target/reference-platform.jar"
LOSS_QUERY = ("SELECT d.name AS device, kv.long_v AS seq FROM ts_kv kv JOIN key_dictionary k ON k.key_id = kv.key"
              " JOIN device d ON d.id = kv.entity_id WHERE k.key = 'seq'")

STACK = """\
name: registry-test
ports: {mongo_debug: auto}
services:
  postgres:
    command: ["{repo}/stacks/bin/run-postgres", "{dir}", "{port:postgres}"]
    ready: {tcp: "127.0.0.1:{port:postgres}", timeout: 30}
    stop_signal: SIGINT
  mongo:
    command: ["{repo}/stacks/bin/run-ferretdb", "{dir}", "{port:mongo}", "{port:mongo_debug}"]
    ready: {tcp: "127.0.0.1:{port:mongo}", timeout: 30}
  infinispan:
    command: ["{repo}/stacks/bin/run-infinispan", "{dir}", "{port:infinispan}"]
    ready: {http: "http://127.0.0.1:{port:infinispan}/rest/v2/container/health/status", timeout: 120}
  platform:
    command: ["{repo}/stacks/reference-platform/bin/reference-platform"]
    depends_on: [postgres, mongo, infinispan]
    env:
      MQTT_BIND_PORT: "{port:mqtt}"
      HTTP_BIND_PORT: "{port:http}"
      DATABASE_URL: "jdbc:postgresql://127.0.0.1:{port:postgres}/postgres"
      REGISTRY_TYPE: mongo
      CACHE_TYPE: infinispan
      MONGO_URL: "mongodb://127.0.0.1:{port:mongo}/monsoon"
      INFINISPAN_SERVER: "127.0.0.1:{port:infinispan}"
      DEVICE_CACHE_TTL_MS: "100"          # short near cache: messages 300 ms apart go to Infinispan
      INFINISPAN_LIFESPAN_MS: "120000"    # entries outlive the test, so the REST check cannot race expiry
      TB_HEAP: 128m
    ready: {http: "http://127.0.0.1:{port:http}/health", timeout: 90}
devices: {port: "{port:mqtt}"}
provisioning: {kind: none}
storage: {dsn: "postgresql://postgres@127.0.0.1:{port:postgres}/postgres", loss_query: "select 1"}
"""


def _missing() -> list[str]:
    out = []
    if shutil.which("java") is None:
        out.append("java (apt-get install -y openjdk-17-jdk-headless)")
    if not JAR.exists():
        out.append(f"{JAR} (make setup)")
    if not glob.glob("/usr/lib/postgresql/*/bin/postgres"):
        out.append("PostgreSQL server (apt-get install -y postgresql)")
    if not os.access(CACHE / "bin/ferretdb", os.X_OK):
        out.append(f"{CACHE}/bin/ferretdb (tools/install-ferretdb)")
    if not glob.glob(str(CACHE / "infinispan/lib/infinispan-server-runtime-*-loader.jar")):
        out.append(f"{CACHE}/infinispan/lib (tools/install-infinispan)")
    return out


# ---------------------------------------------------------------- a minimal Mongo client (OP_MSG + BSON subset)
# pymongo is not a monsoon dependency; FerretDB speaks the wire protocol, so a `find` is a few bytes.

def _cstr(s: str) -> bytes:
    return s.encode() + b"\0"


def _bson(doc: dict) -> bytes:
    body = b""
    for k, v in doc.items():
        if isinstance(v, bool):
            body += b"\x08" + _cstr(k) + (b"\x01" if v else b"\x00")
        elif isinstance(v, int):
            body += b"\x12" + _cstr(k) + struct.pack("<q", v)
        elif isinstance(v, str):
            e = v.encode()
            body += b"\x02" + _cstr(k) + struct.pack("<i", len(e) + 1) + e + b"\0"
        elif isinstance(v, dict):
            body += b"\x03" + _cstr(k) + _bson(v)
        else:
            raise TypeError(f"unsupported BSON value {v!r}")
    return struct.pack("<i", len(body) + 5) + body + b"\0"


def _unbson(b: bytes, i: int = 0) -> tuple[dict, int]:
    end = i + struct.unpack_from("<i", b, i)[0]
    i += 4
    out: dict = {}
    while b[i] != 0:
        t = b[i]
        j = b.index(b"\0", i + 1)
        k = b[i + 1:j].decode()
        i = j + 1
        if t == 0x01:
            out[k] = struct.unpack_from("<d", b, i)[0]; i += 8
        elif t == 0x02:
            n = struct.unpack_from("<i", b, i)[0]; out[k] = b[i + 4:i + 3 + n].decode(); i += 4 + n
        elif t in (0x03, 0x04):
            d, i = _unbson(b, i)
            out[k] = list(d.values()) if t == 0x04 else d
        elif t == 0x08:
            out[k] = b[i] == 1; i += 1
        elif t == 0x0A:
            out[k] = None
        elif t == 0x10:
            out[k] = struct.unpack_from("<i", b, i)[0]; i += 4
        elif t in (0x11, 0x12, 0x09):
            out[k] = struct.unpack_from("<q", b, i)[0]; i += 8
        elif t == 0x07:
            out[k] = b[i:i + 12].hex(); i += 12
        else:
            raise ValueError(f"unsupported BSON type {t:#x} for {k!r}")
    return out, end


def mongo_find(port: int, collection: str, filter_: dict, db: str = "monsoon") -> list[dict]:
    msg = struct.pack("<I", 0) + b"\0" + _bson({"find": collection, "filter": filter_, "$db": db})
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(struct.pack("<iiii", 16 + len(msg), 1, 0, 2013) + msg)
        head = b""
        while len(head) < 16:
            head += s.recv(16 - len(head))
        n = struct.unpack_from("<i", head)[0]
        data = b""
        while len(data) < n - 16:
            data += s.recv(n - 16 - len(data))
    reply, _ = _unbson(data, 5)  # flagBits (4) + section kind 0 (1)
    assert reply.get("ok") == 1, reply
    return reply["cursor"]["firstBatch"]


# ---------------------------------------------------------------- helpers

def metrics(url: str) -> dict[str, float]:
    out = {}
    for line in requests.get(url, timeout=10).text.splitlines():
        if line.startswith("tb_"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def ispn_get(port: int, cache: str, key: str) -> requests.Response:
    return requests.get(f"http://127.0.0.1:{port}/rest/v2/caches/{cache}/{key}",
                        headers={"Accept": "text/plain"}, timeout=10)


def connack(port: int, token: str) -> str:
    got: list[str] = []
    c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"probe-{time.time_ns()}")
    c.username_pw_set(token)
    c.on_connect = lambda cl, u, flags, rc, props: got.append(str(rc))
    c.connect("127.0.0.1", port)
    c.loop_start()
    try:
        deadline = time.time() + 10
        while not got and time.time() < deadline:
            time.sleep(0.05)
    finally:
        c.disconnect()
        c.loop_stop()
    return got[0] if got else "no CONNACK"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    missing = _missing()
    if missing:
        pytest.skip("needs " + "; ".join(missing))
    tmp = tmp_path_factory.mktemp("registry")
    (tmp / "registry-test.yaml").write_text(STACK)
    spec = load_stack(tmp / "registry-test.yaml")
    st = Stack(spec, tmp / "run", run_id="reg-it")
    try:
        st.start()
    except StackError as e:
        logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((tmp / "run/logs").glob("*.log")))
        pytest.fail(f"{e}\n{logs}")
    try:
        yield st
    finally:
        st.stop()
        assert find_leftovers("reg-it") == []


def test_provision_publish_and_the_lookup_chain(stack):
    p = stack.ports
    base = f"http://127.0.0.1:{p['http']}"
    before = metrics(base + "/metrics")
    with TbRestProvisioner(base, "tenant@thingsboard.org", "tenant") as prov:
        devices = prov.ensure_devices(device_names("regit", 2))

        # the registry is Mongo: one device document and one credentials document each
        docs = {d["name"]: d for d in mongo_find(p["mongo"], "devices", {})}
        assert set(docs) == {"regit-00000", "regit-00001"}
        for dev in devices:
            doc = docs[dev.name]
            cred = mongo_find(p["mongo"], "credentials", {"deviceId": doc["_id"]})
            assert [c["authId"] for c in cred] == [dev.token] and cred[0]["type"] == "ACCESS_TOKEN"
        # ... and the storage-side entity is in Postgres, without credentials
        dsn = f"postgresql://postgres@127.0.0.1:{p['postgres']}/postgres"
        with psycopg.connect(dsn, autocommit=True) as db:
            rows = dict(db.execute("SELECT name, id::text FROM device").fetchall())
            assert rows == {n: d["_id"] for n, d in docs.items()}
            assert db.execute("SELECT count(*) FROM device_credentials").fetchone()[0] == 0

        # publish 5 QoS1 messages per device, 300 ms apart (> the 100 ms near-cache TTL)
        for dev in devices:
            c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=dev.name)
            c.username_pw_set(dev.token)
            c.connect("127.0.0.1", p["mqtt"])
            c.loop_start()
            try:
                for seq in range(5):
                    info = c.publish("v1/devices/me/telemetry",
                                     json.dumps({"ts": int(time.time() * 1000) + seq, "values": {"seq": seq}}), qos=1)
                    info.wait_for_publish(10)
                    assert info.is_published()
                    time.sleep(0.3)
            finally:
                c.disconnect()
                c.loop_stop()

        # stored in Postgres, and the loss query resolves the names
        deadline = time.time() + 20
        while time.time() < deadline:
            with psycopg.connect(dsn, autocommit=True) as db:
                got = sorted(db.execute(LOSS_QUERY).fetchall())
            if len(got) == 10:
                break
            time.sleep(0.2)
        assert got == sorted((d.name, s) for d in devices for s in range(5))

        # Infinispan holds both entries (text keys and values, readable over REST)
        for dev in devices:
            dev_id = docs[dev.name]["_id"]
            r = ispn_get(p["infinispan"], "credentials", dev.token)
            assert r.status_code == 200 and dev_id in r.text, r.text
            r = ispn_get(p["infinispan"], "devices", dev_id)
            assert r.status_code == 200 and dev.name in r.text, r.text

        # the lookups went near -> infinispan -> mongo, without errors
        m = metrics(base + "/metrics")

        def delta(k):
            return m.get(k, 0) - before.get(k, 0)

        assert delta('tb_registry_lookups_total{result="hit",source="mongo"}') >= 4    # 2 tokens + 2 devices
        assert delta('tb_registry_lookups_total{result="hit",source="infinispan"}') >= 4  # near TTL expired
        assert delta('tb_registry_lookups_total{result="hit",source="near"}') >= 1
        assert delta('tb_registry_lookup_seconds_count{source="mongo"}') >= 4
        assert m['tb_registry_lookup_seconds{source="infinispan",quantile="0.5"}'] > 0
        assert sum(v for k, v in m.items() if k.startswith("tb_registry_errors_total")) == 0
        assert delta("tb_messages_acked_total") == 10 and delta("tb_messages_stored_total") == 10

        # delete: gone from Mongo, Postgres and Infinispan; the token no longer connects
        gone = devices[0]
        gone_id = docs[gone.name]["_id"]
        prov.delete_devices([gone.name])
        assert mongo_find(p["mongo"], "devices", {"_id": gone_id}) == []
        assert mongo_find(p["mongo"], "credentials", {"deviceId": gone_id}) == []
        with psycopg.connect(dsn, autocommit=True) as db:
            assert db.execute("SELECT count(*) FROM device WHERE name = %s", (gone.name,)).fetchone()[0] == 0
        deadline = time.time() + 10
        while ispn_get(p["infinispan"], "credentials", gone.token).status_code != 404 and time.time() < deadline:
            time.sleep(0.1)
        assert ispn_get(p["infinispan"], "credentials", gone.token).status_code == 404
        assert ispn_get(p["infinispan"], "devices", gone_id).status_code == 404
        assert connack(p["mqtt"], gone.token) == "Not authorized"
        assert connack(p["mqtt"], devices[1].token) == "Success"


def test_unreachable_infinispan_fails_startup_with_a_clear_message(stack, tmp_path):
    dead = socket.socket()
    dead.bind(("127.0.0.1", 0))  # bound, never listening: connection refused
    ports = []
    for _ in range(2):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        ports.append(s.getsockname()[1])
        s.close()
    env = dict(os.environ, REGISTRY_TYPE="sql", CACHE_TYPE="infinispan", TB_STARTUP_TIMEOUT="3",
               INFINISPAN_SERVER=f"127.0.0.1:{dead.getsockname()[1]}", TB_HEAP="64m",
               MQTT_BIND_PORT=str(ports[0]), HTTP_BIND_PORT=str(ports[1]),
               DATABASE_URL=f"jdbc:postgresql://127.0.0.1:{stack.ports['postgres']}/postgres")
    try:
        t0 = time.time()
        res = subprocess.run([str(REPO / "stacks/reference-platform/bin/reference-platform")], env=env,
                             capture_output=True, text=True, timeout=60)
    finally:
        dead.close()
    assert res.returncode == 1, res.stdout + res.stderr
    assert time.time() - t0 < 45
    assert re.search(r"startup failed: cannot reach Infinispan \(Hot Rod\) at 127\.0\.0\.1:\d+ within 3 s", res.stderr)
    # no stack-trace spam from the Hot Rod client
    assert res.stdout.count("\tat ") == 0, res.stdout[-3000:]
