"""``build_fleet``: the :class:`~monsoon.load.base.Fleet` for a stack's transport (MQTT, HTTP, CoAP) and engine
(python, native, kubernetes)."""
from __future__ import annotations

import dataclasses
from typing import Any

from monsoon.load.base import Fleet, FleetOptions
from monsoon.load.coap import CoapFleet, HonoCoapFleet
from monsoon.load.hono import HonoHttpFleet
from monsoon.load.http import HttpFleet
from monsoon.load.kube_job import KubeJobFleet
from monsoon.load.mqtt import MqttFleet
from monsoon.load.native import NativeFleet, NativeHonoCoapFleet
from monsoon.stack.provision import Device


__all__ = ["TRANSPORTS", "Fleet", "FleetOptions", "build_fleet"]

TRANSPORTS = ("mqtt", "http", "coap", "hono-http", "hono-coap")


def build_fleet(transport: str, devices: list[Device], host: str, port: int, options: FleetOptions | None = None,
                /, *, engine: str = "python", **fields: Any) -> Fleet:
    """The fleet for a stack's ``devices.transport``, of ``options`` (or the :class:`FleetOptions` ``fields``):
    ``mqtt`` (``topic``, ``qos``), ``http`` or ``coap`` (both ignore ``topic`` and ``qos``: a request is always
    answered), ``hono-http`` (Hono's HTTP adapter: telemetry, events and command round trips by ``legs``),
    ``hono-coap`` (the same over Hono's CoAP adapter, DTLS with PSK). MQTT
    has three engines: ``python`` (:class:`~monsoon.load.mqtt.MqttFleet`), ``native``
    (:class:`~monsoon.load.native.NativeFleet`, ``workers`` processes) and ``kubernetes``
    (:class:`~monsoon.load.kube_job.KubeJobFleet`: ``workers`` pods of an Indexed Job in monsoon's cluster);
    ``hono-coap`` two: ``python`` and ``native`` (:class:`~monsoon.load.native.NativeHonoCoapFleet`)."""
    if options is None:
        options = FleetOptions(**fields)
    elif fields:
        options = dataclasses.replace(options, **fields)
    if transport == "mqtt" and engine == "native":
        return NativeFleet(devices, host, port, options)
    if transport == "hono-coap" and engine == "native":
        return NativeHonoCoapFleet(devices, host, port, options)
    if transport == "mqtt" and engine == "kubernetes":
        return KubeJobFleet(devices, host, port, options)
    if engine != "python":
        raise ValueError(f"engine {engine!r} drives MQTT only, and native hono-coap too (use one of: python, native, "
                         "kubernetes for mqtt; python or native for hono-coap)")
    if options.workers != 1:
        raise ValueError("workers > 1 needs engine: native")
    if transport == "mqtt":
        return MqttFleet(devices, host, port, options)
    if transport == "http":
        return HttpFleet(devices, host, port, options)
    if transport == "coap":
        return CoapFleet(devices, host, port, options)
    if transport == "hono-http":
        return HonoHttpFleet(devices, host, port, options)
    if transport == "hono-coap":
        return HonoCoapFleet(devices, host, port, options)
    raise ValueError(f"unknown device transport {transport!r} (use one of: {', '.join(TRANSPORTS)})")

