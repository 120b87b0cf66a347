"""The real Eclipse Hono 2.6.0 (stack hono-kafka) end to end, without the load engine: every component starts
with Hono's own configuration, a tenant, devices and hashed-password credentials are created through Hono's
Device Registry Management API, QoS 1 telemetry and an event over MQTT are acked by the adapter, the backend
simulator's group drains, the Kafka read-back returns exactly what was acked, and the registry deletes it all.

Skips in one line without Hono's build (tools/build-hono <a clone of github.com/eclipse-hono/hono at tag 2.6.0>).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from monsoon.observe.kafka_store import KafkaSource
from monsoon.settings import cache_dir
from monsoon.spec.stack import load_stack
from monsoon.stack.provision import HonoRegistryProvisioner, device_names
from monsoon.stack.supervisor import Stack
from monsoon.timeline.columnar import iter_dicts
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
SPEC = load_stack(REPO / "stacks/hono-kafka.yaml")


def _unbuilt() -> str | None:
    for svc in SPEC.services.values():
        for req in svc.requires:
            if req.path and "/hono/" in req.path:
                path = Path(req.path.replace("{cache}", str(cache_dir())))
                if not path.exists():
                    return f"Hono 2.6.0 is not built ({path} missing): {req.hint}"
    return None


def _publish(devs, port: int, topic: str, n: int) -> list[tuple[str, int]]:
    """n QoS 1 messages per device on ``topic``; the (device, seq) pairs the adapter acked."""
    import paho.mqtt.client as mqtt
    acked = []
    for d in devs:
        c = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=d.name)
        c.username_pw_set(d.token, d.password)
        c.connect("127.0.0.1", port)
        c.loop_start()
        try:
            assert wait_for(c.is_connected, 20, f"{d.name} to connect to Hono's MQTT adapter")
            for seq in range(n):
                body = json.dumps({"ts": int(time.time() * 1000), "values": {"device": d.name, "seq": seq}})
                info = c.publish(topic, body, qos=1)
                info.wait_for_publish(10)
                if info.is_published():
                    acked.append((d.name, seq))
        finally:
            c.loop_stop()
            c.disconnect()
    return acked


def test_hono_stack_provisions_acks_stores_and_deprovisions(tmp_path):
    reason = _unbuilt()
    if reason:
        pytest.skip(reason)
    with Stack(SPEC, tmp_path / "stack", run_id="hono-it") as st:
        prov = HonoRegistryProvisioner(st.endpoint(SPEC.provisioning.url), "it-tenant")
        src = KafkaSource(st.endpoint(SPEC.storage.contact_points[0]), ["hono.telemetry.it-tenant",
                                                                         "hono.event.it-tenant"])
        src.check()
        devs = prov.ensure_devices(device_names("hono-it", 3))
        port = int(st.endpoint(SPEC.devices.port))
        acked = _publish(devs, port, "telemetry", 20) + _publish(devs[:1], port, "event", 5)
        assert len(acked) == 3 * 20 + 5
        rows = src.export(tmp_path / "stored.csv")
        stored = sorted((r["device"], int(r["seq"])) for r in iter_dicts(tmp_path / "stored.csv"))
        assert rows == len(acked) and stored == sorted(acked)      # what was acked is what reached the topics
        prov.delete_devices([d.name for d in devs])
        with pytest.raises(Exception, match="404"):
            prov._call("GET", f"/v1/devices/it-tenant/{devs[0].name}", (200,))
