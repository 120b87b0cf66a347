"""The load as a Kubernetes Indexed Job: each pod runs ``monsoon-loadgen --shard auto/N`` (``i`` from
``JOB_COMPLETION_INDEX``) on a ConfigMap of the load, both labelled with the run id. :class:`KubeJobFleet` (engine
``kubernetes``, ``load.kubernetes: {shards: N}``) is a :class:`~monsoon.load.native.NativeFleet` whose workers are
the pods of such a Job in monsoon's own cluster, each relayed by a local process (``python -m
monsoon.load.kube_job relay``) speaking the workers' protocol; the Job's namespace is deleted at close.
"""
from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from monsoon.load.base import FleetOptions
from monsoon.load.loadgen_build import ensure_loadgen
from monsoon.load.native import NativeFleet, loadgen_config
from monsoon.load.stats import FleetConnectError, FleetTotals, SecondStats
from monsoon.load.payloads import build_payload
from monsoon.load.shapes import build_shape
from monsoon.spec.experiment import ExperimentSpec
from monsoon.stack import cluster
from monsoon.stack.imagetar import busybox_files, write_image_archive
from monsoon.stack.pods import Kube
from monsoon.stack.provision import Device, device_names
from monsoon.stack.reaper import RUN_ID_RE, RUN_LABEL, _dns_name, check_run_id
from monsoon.timeline.events import META


__all__ = ["CONFIG_KEY", "CONFIG_PATH", "KubeJobFleet", "LoadJobError", "render_load_job"]

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
                            payload=build_payload(exp.load.payload), shard_csv="/tmp/acked-{shard}.csv")
    return render_load_job(config, experiment=exp.name, run_id=run_id, shards=shards, image=image,
                           namespace=namespace, allowed_namespaces=allowed_namespaces)


# ------------------------------------------------------------------ the Job in monsoon's cluster

IMAGE_BINARY = "/usr/local/bin/monsoon-loadgen"
LIB_PATH = "/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu:/lib64:/usr/lib64"


def linked_libraries(binary: Path) -> list[str]:
    """The shared objects ``binary`` loads (ldd's absolute paths, the dynamic loader included)."""
    r = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
    if r.returncode != 0:          # "not a dynamic executable": a static build needs nothing
        return []
    out = []
    for ln in r.stdout.splitlines():
        for word in ln.split():
            if word.startswith("/"):
                out.append(word)
                break
    return out


def loadgen_image(binary: Path, c: cluster.Cluster) -> str:
    """The image ``monsoon.local/loadgen:<sha of the binary>`` in the cluster's containerd (written and imported
    unless it is there): monsoon-loadgen, the libraries it links, busybox for the pod's shell."""
    digest = hashlib.sha256(binary.read_bytes()).hexdigest()[:12]
    tag = f"monsoon.local/loadgen:{digest}"
    if any(i.endswith(tag) for i in c.images()):
        return tag
    files: list = [(IMAGE_BINARY.lstrip("/"), str(binary), None)]
    files += [(lib.lstrip("/"), os.path.realpath(lib), None) for lib in linked_libraries(binary)]
    files += busybox_files()
    images = c.bindir.parent / "images"
    images.mkdir(parents=True, exist_ok=True)
    for old in images.glob("loadgen-*.tar*"):
        if not old.name.startswith(f"loadgen-{digest}.tar"):
            old.unlink(missing_ok=True)
    tar = images / f"loadgen-{digest}.tar"
    write_image_archive(str(tar), tag, files, [IMAGE_BINARY])
    c.import_archive(tar)
    return tag


def run_meta(workdir: Path) -> tuple[str, str]:
    """(run id, experiment) as the run's timeline says them (its ``meta`` line), else a run id made of this
    process's PID and the experiment ``load``."""
    try:
        with open(workdir / "timeline.jsonl") as f:
            for line in f:
                ev = json.loads(line)
                if ev.get("type") == META and RUN_ID_RE.match(str(ev.get("run_id", ""))):
                    return str(ev["run_id"]), str(ev.get("experiment") or "load")
    except (OSError, ValueError):
        pass
    return f"load-{os.getpid()}", "load"


def run_id_of(workdir: Path) -> str:
    return run_meta(workdir)[0]


def shard_paths(prefix: Path, i: int | str) -> dict[str, str]:
    """A pod's stdin (a FIFO), stdout, stderr and exit code, in the run directory."""
    return {k: f"{prefix}{i}.{k}" for k in ("ctl", "out", "err", "rc")}


def job_in_cluster(config: dict, *, config_path: Path, workdir: Path, prefix: Path, experiment: str, run_id: str,
                   shards: int, image: str, namespace: str, memory: str = "512Mi") -> dict:
    """The Indexed Job that runs ``config`` in monsoon's cluster: hostNetwork, the run directory mounted at its
    own path, each pod's stdin/stdout/stderr/exit code as files there (:func:`shard_paths`)."""
    _, job = render_load_job(config, experiment=experiment, run_id=run_id, shards=shards, image=image,
                             namespace=namespace, allowed_namespaces=[namespace], memory=memory)
    p = shard_paths(prefix, "$i")
    q = {k: shlex.quote(v).replace("$i", "'\"$i\"'") for k, v in p.items()}
    script = (f"i=$JOB_COMPLETION_INDEX; {IMAGE_BINARY} run --config {shlex.quote(str(config_path))} "
              f"--shard auto/{shards} --wait-start <{q['ctl']} >{q['out']} 2>{q['err']}; "
              f"echo $? >{q['rc']}.tmp && mv {q['rc']}.tmp {q['rc']}")
    spec = job["spec"]["template"]["spec"]
    ctr = spec["containers"][0]
    ctr.update(command=["/bin/sh", "-c", script], imagePullPolicy="Never",
               env=[{"name": "LD_LIBRARY_PATH", "value": LIB_PATH}],
               resources={"requests": {"cpu": "50m", "memory": "32Mi"}, "limits": {"memory": memory}},
               volumeMounts=[{"name": "run", "mountPath": str(workdir)}])
    spec.update(hostNetwork=True, dnsPolicy="ClusterFirstWithHostNet", terminationGracePeriodSeconds=5,
                enableServiceLinks=False,
                volumes=[{"name": "run", "hostPath": {"path": str(workdir), "type": "Directory"}}])
    return job


class KubeJobFleet(NativeFleet):
    """A :class:`NativeFleet` whose ``workers`` are the pods of an Indexed Job in monsoon's cluster (see the
    module's doc). Extra: ``run_id`` and ``experiment`` (the labels and names; read from the run's timeline when
    not given)."""

    NAMESPACE_PREFIX = "monsoon-load"

    def __init__(self, devices: list[Device], host: str, port: int, options: FleetOptions | None = None,
                 **fields: Any) -> None:
        super().__init__(devices, host, port, options, **fields)
        self.run_id, self.experiment = self.options.run_id, self.options.experiment
        self.namespace: str | None = None
        self.job_name: str | None = None
        self._kube: Kube | None = None
        self._prefix = self.acked_path.with_name(f".{self.acked_path.name}.pod")
        self._created = False

    def connect(self, timeout: float = 30) -> None:
        if self._workers:
            return
        c = cluster.Cluster()
        if not cluster.running(c):
            raise FleetConnectError("load.kubernetes: monsoon's cluster is not running (monsoon cluster up)")
        if not c.answers_inside(self.host, self.port):
            raise FleetConnectError(f"load.kubernetes: the MQTT endpoint {self.endpoint} does not answer inside "
                                    f"the cluster's network namespace {c.netns}: the stack must run in monsoon's "
                                    "cluster (provider: kubernetes)")
        binary = self._binary or ensure_loadgen()
        image = loadgen_image(Path(binary), c)
        workdir = self.acked_path.parent
        workdir.mkdir(parents=True, exist_ok=True)
        run_id, experiment = run_meta(workdir)
        run_id, experiment = self.run_id or run_id, self.experiment or experiment
        for i in range(self.n_workers):
            paths = shard_paths(self._prefix, i)
            for k in ("out", "err", "rc", "ctl"):
                Path(paths[k]).unlink(missing_ok=True)
            os.mkfifo(paths["ctl"], 0o600)
        relay = self.acked_path.with_name(f".{self.acked_path.name}.relay")
        relay.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m monsoon.load.kube_job relay "
                         f"{shlex.quote(str(self._prefix))} {int(timeout) + 60} \"$@\"\n")
        relay.chmod(0o755)
        self._binary = relay        # the fleet's workers: one relay per pod
        cfg_path = self.acked_path.with_name(f".{self.acked_path.name}.loadgen.json")
        self._kube = Kube()
        self.namespace = _dns_name(self.NAMESPACE_PREFIX, run_id)
        job = job_in_cluster(self.config(connect_timeout_s=timeout), config_path=cfg_path, workdir=workdir,
                             prefix=self._prefix, experiment=experiment, run_id=run_id,
                             shards=self.n_workers, image=image, namespace=self.namespace)
        self.job_name = job["metadata"]["name"]
        try:
            self._kube.ensure_namespace(self.namespace, run_id)
            self._created = True
            self._batch().create_namespaced_job(self.namespace, job, _request_timeout=10)
            try:
                super().connect(timeout)
            except FleetConnectError as e:        # say what the pods were doing (an image, a schedule, a crash)
                raise FleetConnectError(f"{e}; the Job's pods: {self._pod_states()}") from None
        except BaseException:
            self._delete()
            raise

    def _pod_states(self) -> str:
        try:
            assert self.namespace is not None     # connect names it before it asks
            pods = self._kube.pods(self.namespace, f"job-name={self.job_name}") if self._kube else []
        except Exception as e:
            return f"cannot list them ({type(e).__name__})"
        out = []
        for p in pods:
            cs = ((p.get("status") or {}).get("containerStatuses") or [{}])[0]
            st = cs.get("state") or {}
            why = (st.get("waiting") or st.get("terminated") or {}).get("reason")
            out.append(f"{p['metadata']['name']} {(p.get('status') or {}).get('phase')}" + (f" ({why})" if why else ""))
        return ", ".join(out) or "none created"

    def _batch(self):
        # optional dependency (extra "kube"): Kube() has said so in one line when it is missing
        from kubernetes import client as k
        assert self._kube is not None
        return k.BatchV1Api(self._kube.api_client)

    def pods(self) -> list[dict]:
        """The Job's pods as listed now (index, name, phase, exit code)."""
        if self._kube is None or self.namespace is None:
            return []
        out = []
        for p in self._kube.pods(self.namespace, f"job-name={self.job_name}"):
            ann = p["metadata"].get("annotations") or {}
            cs = ((p.get("status") or {}).get("containerStatuses") or [{}])[0]
            term = (cs.get("state") or {}).get("terminated") or {}
            out.append({"index": int(ann.get("batch.kubernetes.io/job-completion-index", -1)),
                        "pod": p["metadata"]["name"], "uid": p["metadata"]["uid"],
                        "phase": (p.get("status") or {}).get("phase"), "exit_code": term.get("exitCode")})
        return sorted(out, key=lambda x: x["index"])

    def run(self, stop: threading.Event, on_second: Callable[[SecondStats], None] | None = None) -> FleetTotals:
        totals = super().run(stop, on_second)
        pods = {p["index"]: p for p in self._pods_when_done()}
        shards = []
        for w in self._workers:
            t = w.totals or {}
            sched = int(t.get("scheduled", 0))
            shards.append({"shard": w.index, "range": t.get("range"), "scheduled": sched,
                           "sent": t.get("sent"), "acked": t.get("acked"), "late": t.get("late"),
                           "late_pct": round(100.0 * int(t.get("late", 0)) / sched, 3) if sched else None,
                           "send_late_p99_ms": t.get("send_late_p99_ms"), "send_late_max_ms": t.get("send_late_max_ms"),
                           "elapsed_s": t.get("elapsed_s"), **pods.get(w.index, {})})
        self.extra["shards"] = shards
        self.extra["namespace"], self.extra["job"] = self.namespace, self.job_name
        (self.acked_path.parent / "load-shards.json").write_text(json.dumps(
            {"namespace": self.namespace, "job": self.job_name, "shards": shards}, indent=1))
        return totals

    def _pods_when_done(self, timeout: float = 20.0) -> list[dict]:
        deadline = time.monotonic() + timeout
        pods: list[dict] = []
        while time.monotonic() < deadline:
            try:
                pods = self.pods()
            except Exception:   # the cluster stopped answering: the pods seen last are read as they are
                return pods
            if pods and all(p["phase"] in ("Succeeded", "Failed") for p in pods):
                break
            time.sleep(0.5)
        return pods

    def _delete(self) -> None:
        if self._created and self._kube is not None and self.namespace:
            try:
                self._kube.delete_namespace(self.namespace, timeout=60)
            except Exception as e:   # said; the namespace carries the run's label: `monsoon heal` deletes it
                logging.getLogger(__name__).warning("monsoon: the load job's namespace %s was not deleted: %s: %s",
                                                    self.namespace, type(e).__name__, e)
            self._created = False

    def close(self, timeout: float = 30.0) -> None:
        try:
            super().close(timeout)
        finally:
            self._delete()
            for i in range(self.n_workers):
                paths = shard_paths(self._prefix, i)
                for k in ("ctl", "rc", "out"):
                    Path(paths[k]).unlink(missing_ok=True)
                try:
                    if os.path.getsize(paths["err"]) == 0:
                        os.unlink(paths["err"])
                except OSError:
                    pass
            self.acked_path.with_name(f".{self.acked_path.name}.relay").unlink(missing_ok=True)


# ------------------------------------------------------------------ the relay (one local process per pod)

def _open_fifo(path: str, rc: str, timeout: float) -> int:
    """Open the pod's stdin FIFO for writing once the pod has it open for reading."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as e:
            if e.errno != errno.ENXIO:
                raise
        else:
            os.set_blocking(fd, True)
            return fd
        if os.path.exists(rc) or time.monotonic() > deadline:
            raise TimeoutError(f"the load pod did not start within {timeout:g}s" if not os.path.exists(rc)
                               else "the load pod ended before it read its stdin")
        time.sleep(0.05)


def relay(prefix: str, timeout: float, argv: list[str]) -> int:
    """Stand in for a local worker: this process's stdin goes to pod ``i``'s stdin FIFO, the pod's stdout file
    comes back on this process's stdout, and its exit code is this process's."""
    i = None
    for a, b in zip(argv, argv[1:]):
        if a == "--shard":
            i = b.split("/")[0]
    if i is None:
        print(json.dumps({"error": "relay: no --shard i/n"}), flush=True)
        return 3
    p = shard_paths(Path(prefix), i)
    try:
        fd = _open_fifo(p["ctl"], p["rc"], timeout)
    except (OSError, TimeoutError) as e:
        print(json.dumps({"error": f"load shard {i}: {e}"}), flush=True)
        return 3

    def pump() -> None:
        try:
            for line in sys.stdin:
                os.write(fd, line.encode())
        except OSError:
            pass
        finally:
            try:
                os.close(fd)
            except OSError:
                pass
    threading.Thread(target=pump, daemon=True).start()
    out = sys.stdout.buffer
    buf, f = b"", None
    while True:
        if f is None:
            try:
                f = open(p["out"], "rb")
            except FileNotFoundError:
                time.sleep(0.05)
                continue
        chunk = f.read(65536)
        if chunk:
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for ln in lines:
                out.write(ln + b"\n")
            out.flush()
            continue
        if os.path.exists(p["rc"]):
            rest = f.read()
            if rest or buf:
                out.write(buf + rest + (b"" if (buf + rest).endswith(b"\n") else b"\n"))
                out.flush()
            try:
                return int(open(p["rc"]).read().strip() or 1)
            except ValueError:
                return 1
        time.sleep(0.05)


def main(argv: list[str]) -> int:
    if len(argv) >= 3 and argv[0] == "relay":
        return relay(argv[1], float(argv[2]), argv[3:])
    print("usage: python -m monsoon.load.kube_job relay PREFIX TIMEOUT run --config F --shard i/n --wait-start",
          file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
