"""``build_fleet``: the fleet for a stack's transport (MQTT, HTTP, CoAP) and engine (python, native)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from monsoon.load.coap import CoapFleet
from monsoon.load.http import HttpFleet
from monsoon.load.kube_job import KubeJobFleet
from monsoon.load.mqtt import MqttFleet
from monsoon.load.native import NativeFleet
from monsoon.load.payloads import Payload
from monsoon.load.shapes import LoadShape
from monsoon.stack.provision import Device


TRANSPORTS = ("mqtt", "http", "coap")


def build_fleet(
    transport: str,
    devices: list[Device],
    host: str,
    port: int,
    *,
    topic: str = "v1/devices/me/telemetry",
    qos: int = 1,
    shape: LoadShape,
    acked_path: Path,
    latency_log_path: Path | None = None,
    payload: Payload | None = None,
    engine: str = "python",
    workers: int = 1,
    **kw: Any,
) -> Any:
    """The fleet for a stack's ``devices.transport``: ``mqtt`` (``topic``, ``qos``), ``http`` or ``coap``
    (both ignore ``topic`` and ``qos``: a request is always answered). MQTT has three engines: ``python``
    (:class:`~monsoon.load.mqtt.MqttFleet`) and ``native`` (:class:`~monsoon.load.native.NativeFleet`, ``workers``
    processes) and ``kubernetes`` (:class:`~monsoon.load.kube_job.KubeJobFleet`: ``workers`` pods of an Indexed
    Job in monsoon's cluster)."""
    common = dict(shape=shape, acked_path=acked_path, latency_log_path=latency_log_path, payload=payload, **kw)
    if transport == "mqtt" and engine == "native":
        return NativeFleet(devices, host, port, topic=topic, qos=qos, workers=workers, **common)
    if transport == "mqtt" and engine == "kubernetes":
        return KubeJobFleet(devices, host, port, topic=topic, qos=qos, workers=workers, **common)
    if engine != "python":
        raise ValueError(f"engine {engine!r} drives MQTT only (use one of: python, native, kubernetes for mqtt)")
    if workers != 1:
        raise ValueError("workers > 1 needs engine: native")
    if transport == "mqtt":
        return MqttFleet(devices, host, port, topic=topic, qos=qos, **common)
    if transport == "http":
        return HttpFleet(devices, host, port, **common)
    if transport == "coap":
        return CoapFleet(devices, host, port, **common)
    raise ValueError(f"unknown device transport {transport!r} (use one of: {', '.join(TRANSPORTS)})")
