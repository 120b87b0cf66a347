"""The load as a Kubernetes Indexed Job: when one machine is not enough, each pod runs one shard.

The Job runs ``monsoon-loadgen run --config /etc/monsoon/load.json --shard auto/N`` in every pod: the
same binary and the same shard arithmetic as the local worker processes (``--shard i/N``), with ``i``
read from ``JOB_COMPLETION_INDEX``, which Kubernetes sets in each pod of an Indexed Job. The load
config (devices, schedule segments, payload, endpoint) goes into a ConfigMap next to it.

Both objects carry the run id as the label ``monsoon.io/run-id`` (as the chaos backends' objects do),
and a namespace must be on the allow-list like any other Kubernetes target.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable

from monsoon.load.native import loadgen_config
from monsoon.load.payloads import build_payload
from monsoon.load.shapes import build_shape
from monsoon.spec.experiment import ExperimentSpec
from monsoon.stack.provision import Device, device_names
from monsoon.stack.reaper import RUN_LABEL, _dns_name, check_run_id


__all__ = ["CONFIG_KEY", "CONFIG_PATH", "LoadJobError", "render_load_job"]

CONFIG_KEY = "load.json"
CONFIG_PATH = "/etc/monsoon"
MANAGED = {"app.kubernetes.io/managed-by": "monsoon", "app.kubernetes.io/component": "load"}
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
MAX_INDEXED_COMPLETIONS = 100_000          # the API server's limit for completionMode: Indexed


class LoadJobError(ValueError):
    """The Job can't be rendered as asked (names what, and why)."""


def render_load_job(config: dict, *, experiment: str, run_id: str, shards: int, image: str, namespace: str,
                    allowed_namespaces: Iterable[str], cpu: str = "1", memory: str = "1Gi",
                    binary: str = "monsoon-loadgen") -> list[dict]:
    """[ConfigMap, Job]: ``shards`` pods, each ``--shard auto/shards`` of the devices in ``config``."""
    if not isinstance(shards, int) or isinstance(shards, bool) or not 1 <= shards <= MAX_INDEXED_COMPLETIONS:
        raise LoadJobError(f"shards must be an integer in 1..{MAX_INDEXED_COMPLETIONS:,}, got {shards!r}")
    n_dev = len(config.get("devices") or [])
    if n_dev and shards > n_dev:
        raise LoadJobError(f"{shards} shards for {n_dev} devices: every shard needs at least one device")
    if not image or any(c.isspace() for c in image):
        raise LoadJobError(f"image must be a container image reference, got {image!r}")
    allowed = set(allowed_namespaces)
    if namespace not in allowed:
        raise LoadJobError(f"namespace {namespace!r} is not on the allow-list "
                           f"({', '.join(sorted(allowed)) or 'empty: no namespace allowed'})")
    if not _DNS_LABEL.match(namespace):
        raise LoadJobError(f"namespace {namespace!r} is not a DNS label")
    name = _dns_name("monsoon-load", experiment, run_id)
    labels = {RUN_LABEL: check_run_id(run_id), **MANAGED}
    meta = {"name": name, "namespace": namespace, "labels": labels}
    configmap = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": dict(meta),
                 "data": {CONFIG_KEY: json.dumps(config, separators=(",", ":"))}}
    job = {
        "apiVersion": "batch/v1", "kind": "Job", "metadata": dict(meta),
        "spec": {
            "completionMode": "Indexed",
            "completions": shards,
            "parallelism": shards,       # every shard at once: the load is one schedule, split by device
            "backoffLimit": 0,           # a re-run shard would send its messages twice: fail instead
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{
                        "name": "loadgen",
                        "image": image,
                        "command": [binary, "run", "--config", f"{CONFIG_PATH}/{CONFIG_KEY}",
                                    "--shard", f"auto/{shards}"],
                        "resources": {"requests": {"cpu": cpu, "memory": memory},
                                      "limits": {"memory": memory}},
                        "volumeMounts": [{"name": "load-config", "mountPath": CONFIG_PATH, "readOnly": True}],
                    }],
                    "volumes": [{"name": "load-config", "configMap": {"name": name}}],
                },
            },
        },
    }
    return [configmap, job]


def job_for_experiment(exp: ExperimentSpec, *, host: str, port: int, profile: str, shards: int, image: str,
                       namespace: str, allowed_namespaces: Iterable[str], run_id: str,
                       base_rate: float | None = None, topic: str = "v1/devices/me/telemetry") -> list[dict]:
    """[ConfigMap, Job] that run ``experiment``'s load (shape, payload, devices) against ``host:port``.

    The devices are monsoon's own names and tokens (:func:`monsoon.stack.provision.device_names`, what its
    ThingsBoard provisioner creates): provision them first. ``base_rate`` overrides the experiment's
    (required when it says ``auto``: a Job can't calibrate a deployment it has not measured)."""
    rate = base_rate if base_rate is not None else exp.load.base_rate
    if rate == "auto":
        raise LoadJobError(f"{exp.name} says base_rate: auto; give the x1 rate (--base-rate), e.g. from "
                           "monsoon calibrate's capacity x base_fraction")
    if not rate or rate <= 0:
        raise LoadJobError(f"base rate must be > 0 msg/s, got {rate!r}")
    shape = build_shape(exp.load.shape, float(rate), exp.durations(profile), profile)
    devices = [Device(n, t) for n, t in device_names(exp.load.device_prefix, exp.load.devices)]
    config = loadgen_config(devices, host, port, shape=shape, topic=topic, qos=exp.load.qos,
                            payload=build_payload(exp.load.payload), acked_path="/tmp/acked-{shard}.csv")
    return render_load_job(config, experiment=exp.name, run_id=run_id, shards=shards, image=image,
                           namespace=namespace, allowed_namespaces=allowed_namespaces)
