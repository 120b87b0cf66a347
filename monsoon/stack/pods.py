"""Services as pods (``provider: kubernetes``): a one-replica Deployment per service in the stack's namespace.

Rendering (:func:`namespace_manifest`, :func:`deployment_manifest`, :func:`readiness_probe`) is pure. A
:class:`PodProc` stands where a ``subprocess.Popen`` stands for a process service (``pid``, ``poll``, ``wait``,
``returncode``): an *instance* is one (pod UID, container restartCount); an instance ends when kubelet restarts
the container (``restartCount`` grows: ``lastState.terminated`` says why, ``OOMKilled`` included) or when the pod
goes (deleted: a pod kill; the Deployment makes a new pod with a new UID). Kubelet restarts, not monsoon
(``restartPolicy: Always``): after an exit the supervisor waits for the next instance (:meth:`PodProc.resume`)
and writes the same exit/start/restart events it writes for processes and containers.

By default the pods run with ``hostNetwork: true`` on the cluster's node, so they bind 127.0.0.1 ports inside the
node's network namespace, on the ports the stack allocated; the cluster's port mirror makes each reachable at the
same 127.0.0.1 port on the host (the load, the collectors, provisioning and the read-back do not change). With
``kubernetes.host_network: false`` they run on the pod network (an IP of their own from the CNI bridge, a new one
for each new pod): each service gets a ClusterIP Service of its name (:func:`service_manifest`) for the ports it
listens on (:func:`port_owners`), the services reach each other by that name (``{host:NAME}``, resolved by the
cluster's CoreDNS), and the mirror maps host 127.0.0.1:P to the Service's ClusterIP:P (kube-proxy's rules in the
node's namespace). The service's work dir is a hostPath at its own path, so ``{dir}`` means the same inside and
out.

Everything carries ``monsoon.io/run-id``; the namespace also the owner's PID, so ``monsoon heal --all`` can
tell a dead run's namespace (deleted) from a live one's (skipped).
"""
from __future__ import annotations

import logging
import os
import re
import subprocess
from contextlib import ExitStack, contextmanager
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable, Iterator
from urllib.parse import urlsplit

import pytest

from monsoon import settings
from monsoon.spec.stack import SERVICE_POD_LABEL, ReadySpec
from monsoon.stack import cluster, dockerd
from monsoon.stack.cluster import Cluster, image_ref
from monsoon.stack.containers import mem_bytes
from monsoon.stack.kubeapi import env_kubeconfig
from monsoon.stack.ports import StackError
from monsoon.stack.reaper import RUN_LABEL, check_run_id
from monsoon.timeline.events import OP, OP_IMAGE_IMPORT

OWNER_POD_LABEL = "monsoon.io/owner-pid"
MANAGED = {"app.kubernetes.io/managed-by": "monsoon"}
POLL_S = 0.5


class PodError(StackError):
    pass


# ------------------------------------------------------------------ rendering (pure)

def k8s_quantity(size: str) -> str:
    """``256m`` (Docker's reading: MiB) -> ``256Mi``; a size not in whole MiB stays in bytes."""
    n = mem_bytes(size)
    return f"{n >> 20}Mi" if n % (1 << 20) == 0 else str(n)


def readiness_probe(ready: ReadySpec | None, render: Callable[[str], str], host_network: bool = True) -> dict | None:
    """The pod's readiness probe from the stack's ``ready:`` (rendered): tcp/cql -> tcpSocket, http -> httpGet;
    a log pattern has no probe (monsoon reads the log it follows). On the pod network the probe has no host:
    kubelet probes the pod's own IP (the ``127.0.0.1`` of ``ready:`` would be the node's)."""
    if ready is None or ready.log:
        return None
    base = {"periodSeconds": 1, "timeoutSeconds": 2, "failureThreshold": 3}
    if ready.http:
        u = urlsplit(render(ready.http))
        path = (u.path or "/") + (f"?{u.query}" if u.query else "")
        get = {"host": u.hostname or "127.0.0.1", "port": u.port or (443 if u.scheme == "https" else 80),
               "path": path, "scheme": (u.scheme or "http").upper()}
        if not host_network:
            del get["host"]
        return {"httpGet": get, **base}
    host, _, port = render(ready.tcp or ready.cql or "").rpartition(":")
    sock: dict[str, Any] = {"host": host or "127.0.0.1", "port": int(port)}
    if not host_network:
        del sock["host"]
    return {"tcpSocket": sock, **base}


_HOST_PORT_RE = re.compile(r"\{host:([A-Za-z0-9_.-]+)\}:\{port:([A-Za-z0-9_.-]+)\}")
_PORT_RE = re.compile(r"\{port:([A-Za-z0-9_.-]+)\}")


def port_owners(texts: dict[str, list[str]]) -> dict[str, str]:
    """Which service listens on each ``{port:NAME}``, from each pod service's strings (command, env values,
    ready): ``{host:S}:{port:NAME}`` says S listens on NAME; a ``{port:NAME}`` not so prefixed, that the service
    itself does. A port two services claim is an error (one line); a port nobody claims has no owner."""
    owners: dict[str, str] = {}

    def claim(port: str, service: str) -> None:
        if owners.setdefault(port, service) != service:
            raise PodError(f"{{port:{port}}} is claimed by services {owners[port]!r} and {service!r}: on the pod "
                           f"network one service listens on a port (write {{host:SERVICE}}:{{port:{port}}} where "
                           "another service connects to it)")
    for service, strings in texts.items():
        for text in strings:
            for m in _HOST_PORT_RE.finditer(text):
                claim(m.group(2), m.group(1))
            for m in _PORT_RE.finditer(_HOST_PORT_RE.sub("", text)):
                claim(m.group(1), service)
    return owners


def service_manifest(*, namespace: str, run_id: str, service: str, ports: dict[str, int]) -> dict:
    """A ClusterIP Service named after the stack's service, selecting its pod, for the ports it listens on (port and
    targetPort the same number, named after the port with ``_`` as ``-``)."""
    labels = labels_for(run_id, service)
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": service, "namespace": namespace, "labels": labels},
            "spec": {"type": "ClusterIP", "selector": {RUN_LABEL: labels[RUN_LABEL], SERVICE_POD_LABEL: service},
                     "ports": [{"name": name.replace("_", "-").lower()[:15].strip("-"), "port": p, "targetPort": p,
                                "protocol": "TCP"} for name, p in sorted(ports.items(), key=lambda x: x[1])]}}


def import_images(images: list[str], on_event: Callable[..., None]) -> None:
    """Import each image the cluster's containerd does not hold yet, or holds from another Docker image of the same
    name (rebuilt by make images since), one ``image-import`` event each."""
    c = Cluster()       # the cluster monsoon starts (monsoon cluster up)
    have = c.image_ids()
    for image in sorted(set(images)):
        ref = image_ref(image)
        if ref in have and have[ref] == (cluster.docker_image_id(image) or have[ref]):
            continue        # held, and from the same Docker image (or Docker cannot say: kept as it is)
        t0 = time.monotonic()
        try:
            c.import_image(image)
        except Exception as e:
            raise StackError(f"image {image} cannot be imported into the cluster: {e}") from None
        on_event(OP, op=OP_IMAGE_IMPORT, image=image, seconds=round(time.monotonic() - t0, 3))


def labels_for(run_id: str, service: str) -> dict[str, str]:
    return {RUN_LABEL: check_run_id(run_id), SERVICE_POD_LABEL: service, **MANAGED}


def namespace_manifest(namespace: str, run_id: str, owner_pid: int | None = None) -> dict:
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": namespace, "labels": {RUN_LABEL: check_run_id(run_id), **MANAGED,
                                                       OWNER_POD_LABEL: str(owner_pid or os.getpid())}}}


def deployment_manifest(*, namespace: str, run_id: str, service: str, image: str, command: list[str],
                        env: dict[str, str], workdir: Path, mem_limit: str | None = None, cpus: float | None = None,
                        volumes: Sequence[str] = (), probe: dict | None = None, stop_timeout: float = 15.0,
                        host_network: bool = True) -> dict:
    """A one-replica Deployment (Recreate: never two instances at once) of one stack service; on the node's network
    (``host_network``), else on the pod network with the cluster's DNS (``ClusterFirst``)."""
    labels = labels_for(run_id, service)
    selector = {RUN_LABEL: labels[RUN_LABEL], SERVICE_POD_LABEL: service}
    mounts: list[dict[str, Any]] = [{"name": "workdir", "mountPath": str(workdir)}]     # readOnly is a bool
    vols: list[dict] = [{"name": "workdir", "hostPath": {"path": str(workdir), "type": "DirectoryOrCreate"}}]
    for i, v in enumerate(volumes):
        parts = v.split(":")
        mounts.append({"name": f"vol{i}", "mountPath": parts[1] if len(parts) > 1 else parts[0],
                       "readOnly": len(parts) > 2 and parts[2] == "ro"})
        vols.append({"name": f"vol{i}", "hostPath": {"path": parts[0]}})
    env_list: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in env.items()]   # valueFrom nests
    env_list += [{"name": "MONSOON_POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
                 {"name": "MONSOON_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    container: dict[str, Any] = {"name": service, "image": image, "imagePullPolicy": "Never", "env": env_list,
                                 "workingDir": str(workdir), "volumeMounts": mounts}
    if command:
        container["command"] = list(command)
    limits: dict[str, str] = {}
    if mem_limit:
        limits["memory"] = k8s_quantity(mem_limit)    # over it the kernel kills the container: OOMKilled, exit 137
    if cpus:
        limits["cpu"] = f"{int(cpus * 1000)}m"
    if limits:
        container["resources"] = {"limits": limits, "requests": dict(limits)}
    if probe:
        container["readinessProbe"] = probe
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": service, "namespace": namespace, "labels": labels},
            "spec": {"replicas": 1, "strategy": {"type": "Recreate"}, "selector": {"matchLabels": selector},
                     "template": {"metadata": {"labels": labels},
                                  "spec": {"hostNetwork": host_network,
                                           "dnsPolicy": "ClusterFirstWithHostNet" if host_network else "ClusterFirst",
                                           "restartPolicy": "Always", "enableServiceLinks": False,
                                           "terminationGracePeriodSeconds": max(1, int(stop_timeout)),
                                           "containers": [container], "volumes": vols}}}}


# ------------------------------------------------------------------ the cluster's API

def kubeconfig_path() -> Path:
    """KUBECONFIG's first file, else the one ``monsoon cluster up`` writes."""
    return env_kubeconfig() or Cluster().kubeconfig


def api_client():
    """A ``kubernetes`` ApiClient of :func:`kubeconfig_path` (no process-wide configuration)."""
    try:
        # optional dependency (extra "kube"): the Kubernetes client, needed only for provider: kubernetes
        from kubernetes import config
    except ImportError:
        raise PodError("provider: kubernetes needs the Python client: pip install kubernetes") from None
    path = kubeconfig_path()
    if not path.is_file():
        raise PodError(f"provider: kubernetes needs a cluster: no kubeconfig at {path} (run `monsoon cluster up`, "
                       "or set KUBECONFIG)")
    return config.new_client_from_config(config_file=str(path))


class Kube:
    """The CoreV1 and AppsV1 APIs of one client, and the calls the stack makes."""

    def __init__(self, client=None):
        # optional dependency (extra "kube"): api_client() has said so in one line when it is missing
        from kubernetes import client as k
        self.api_client = client or api_client()
        self.core, self.apps = k.CoreV1Api(self.api_client), k.AppsV1Api(self.api_client)

    def plain(self, obj) -> dict:
        return self.api_client.sanitize_for_serialization(obj)

    def pods(self, namespace: str, selector: str) -> list[dict]:
        res = self.core.list_namespaced_pod(namespace, label_selector=selector, _request_timeout=5)
        return [self.plain(p) for p in res.items]

    def namespace(self, name: str) -> dict | None:
        try:
            return self.plain(self.core.read_namespace(name, _request_timeout=5))
        except Exception as e:
            if getattr(e, "status", None) == 404:
                return None
            raise

    def node_pressure(self) -> list[str]:
        """What keeps pods off the cluster's nodes (:func:`cluster.node_pressure`), "node: ..." each; [] when the
        nodes cannot be read."""
        try:
            nodes = self.core.list_node(_request_timeout=5).items
        except Exception as e:     # the diagnosis of a failure must not hide it
            logging.getLogger(__name__).debug("nodes not readable: %s", e)
            return []
        return [f"node {n.metadata.name}: {why}" for n in nodes for why in cluster.node_pressure(self.plain(n))]

    def not_running(self, namespace: str) -> list[str]:
        """Each pod of ``namespace`` that does not run yet, with why (:func:`pending_reason`)."""
        try:
            pods = self.pods(namespace, "")
        except Exception as e:     # the diagnosis of a failure must not hide it
            logging.getLogger(__name__).debug("pods of %s not readable: %s", namespace, e)
            return []
        return [f"pod {p['metadata']['name']}: {pending_reason(p)}" for p in pods
                if (p.get("status") or {}).get("phase") != "Running"
                or not all(c.get("ready") for c in (p.get("status") or {}).get("containerStatuses") or [])]

    def why_not_running(self, namespace: str) -> str:
        """One phrase for an error: the pods that do not run and what the nodes report, or ''."""
        parts = self.not_running(namespace)[:3] + self.node_pressure()
        return "; ".join(parts)

    def ensure_namespace(self, name: str, run_id: str, timeout: float = 120.0) -> None:
        """Create the run's namespace; one left by a dead run of monsoon is deleted first (and waited for). On
        monsoon's own cluster, a disk too full for kubelet is refused here, before anything starts."""
        if kubeconfig_path() == Cluster().kubeconfig and (why := cluster.disk_refusal()):
            raise PodError(why)
        ns = self.namespace(name)
        if ns is not None:
            labels = (ns.get("metadata") or {}).get("labels") or {}
            rid, owner = labels.get(RUN_LABEL), labels.get(OWNER_POD_LABEL, "")
            if rid is None:
                raise PodError(f"namespace {name!r} exists and is not monsoon's (no {RUN_LABEL} label): give the "
                               "stack another kubernetes.namespace")
            if rid != run_id and owner.isdigit() and _alive(int(owner)) and int(owner) != os.getpid():
                raise PodError(f"namespace {name!r} is in use by run {rid} (monsoon pid {owner} is alive)")
            self.delete_namespace(name, timeout)
        self.core.create_namespace(namespace_manifest(name, run_id), _request_timeout=10)

    def delete_namespace(self, name: str, timeout: float = 120.0) -> bool:
        """Delete a namespace and wait until it is gone (True) or ``timeout`` passed (False)."""
        try:
            self.core.delete_namespace(name, grace_period_seconds=0, propagation_policy="Background",
                                       _request_timeout=10)
        except Exception as e:
            if getattr(e, "status", None) != 404:
                raise
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.namespace(name) is None:
                return True
            time.sleep(0.5)
        return False


def _alive(pid: int) -> bool:
    try:
        st = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return st not in ("Z", "X")


# ------------------------------------------------------------------ one service's pod

def _cs(pod: dict, container: str) -> dict:
    return next((c for c in ((pod.get("status") or {}).get("containerStatuses") or []) if c.get("name") == container),
                {})


def pending_reason(pod: dict, container: str | None = None) -> str:
    """Why a pod does not run, in one phrase: a container's waiting reason and message (ContainerCreating,
    ImagePullBackOff, CrashLoopBackOff...), else the scheduler's message when it has not placed the pod ("0/1
    nodes are available: 1 node(s) had untolerated taint {node.kubernetes.io/disk-pressure: }"), else the phase."""
    st = pod.get("status") or {}
    for cs in st.get("containerStatuses") or []:
        if container is not None and cs.get("name") != container:
            continue
        w = (cs.get("state") or {}).get("waiting") or {}
        if w.get("reason"):
            return w["reason"] + (f": {w['message']}" if w.get("message") else "")
    for c in st.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return f"{st.get('phase') or 'Pending'}, not scheduled: {c.get('message') or c.get('reason') or '?'}"
    return st.get("phase") or "?"


def _instance_of(pod: dict, container: str) -> tuple[str, int]:
    return (pod["metadata"]["uid"], int(_cs(pod, container).get("restartCount") or 0))


def termination(term: dict | None) -> dict:
    t = term or {}
    reason = t.get("reason")
    return {"finished_at": t.get("finishedAt"), "exit_code": int(t.get("exitCode", 137)),
            "oom_killed": 1 if reason == "OOMKilled" else 0, "reason": reason}


def judge(pod: dict | None, instance: tuple[str, int], container: str) -> dict | None:
    """How the watched instance ended, from its pod as listed now (None: it runs, or has not started yet).

    ``pod`` is the pod whose UID is the instance's, None when that pod is gone (deleted: a pod kill)."""
    if pod is None:
        return {"finished_at": None, "exit_code": 137, "oom_killed": 0, "reason": "pod deleted"}
    cs = _cs(pod, container)
    state, last = cs.get("state") or {}, cs.get("lastState") or {}
    if int(cs.get("restartCount") or 0) > instance[1]:
        return termination(last.get("terminated"))
    if state.get("terminated"):
        return termination(state["terminated"])
    if state.get("waiting") and last.get("terminated"):    # ended, and kubelet holds the restart back (back-off)
        return termination(last["terminated"])
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return {"finished_at": None, "exit_code": 137, "oom_killed": 0, "reason": "pod deleted"}
    return None


class PodProc:
    """One service's Deployment, looking like a Popen to the supervisor."""

    def __init__(self, *, kube: Kube, namespace: str, run_id: str, service: str, manifest: dict, log_path: Path,
                 start_timeout: float = 120.0):
        self.kube, self.namespace, self.run_id, self.service = kube, namespace, run_id, service
        self.manifest, self.log_path, self.start_timeout = manifest, log_path, start_timeout
        self.selector = f"{RUN_LABEL}={run_id},{SERVICE_POD_LABEL}={service}"
        self.returncode: int | None = None
        self.terminations: list[dict] = []
        self.instance: tuple[str, int] | None = None
        self.name = ""                     # the current pod's name
        self.ip: str | None = None         # the current pod's IP (the node's with hostNetwork)
        self._pod: dict | None = None
        self._checked = 0.0
        self._pid: int | None = None
        self._lock = threading.Lock()
        self._follower: threading.Thread | None = None
        self.created = False

    # --- lifecycle
    def start(self) -> "PodProc":
        if not self.created:
            self.kube.apps.create_namespaced_deployment(self.namespace, self.manifest, _request_timeout=10)
            self.created = True
        self._await_instance(lambda inst: True, None)
        return self

    def resume(self, stopping: threading.Event | None = None) -> bool:
        """After an exit: wait for kubelet's (or the Deployment's) next instance; False when stopping first."""
        old = self.instance
        return self._await_instance(lambda inst: inst != old, stopping)

    def _await_instance(self, new: Callable[[tuple[str, int]], bool], stopping: threading.Event | None) -> bool:
        deadline = time.monotonic() + self.start_timeout
        last = ""
        while time.monotonic() < deadline:
            if stopping is not None and stopping.is_set():
                return False
            for pod in self.kube.pods(self.namespace, self.selector):
                if (pod.get("metadata") or {}).get("deletionTimestamp"):
                    continue
                cs = _cs(pod, self.service)
                state = cs.get("state") or {}
                waiting = (state.get("waiting") or {}).get("reason")
                last = pending_reason(pod, self.service)
                if waiting in ("ErrImageNeverPull", "InvalidImageName", "CreateContainerConfigError"):
                    raise PodError(f"service {self.service!r}: pod {pod['metadata']['name']} cannot start: "
                                   f"{waiting}: {(state.get('waiting') or {}).get('message', '')}")
                inst = _instance_of(pod, self.service)
                if state.get("running") and new(inst):
                    with self._lock:
                        self.instance, self.name, self._pod = inst, pod["metadata"]["name"], pod
                        self.ip = (pod.get("status") or {}).get("podIP")
                        self.returncode, self._pid, self._checked = None, None, time.monotonic()
                    self._follow(pod["metadata"]["name"])
                    return True
            time.sleep(POLL_S)
        nodes = "; ".join(self.kube.node_pressure())
        raise PodError(f"service {self.service!r}: no running pod after {self.start_timeout:.0f}s in namespace "
                       f"{self.namespace} (last: {last or 'no pod'})" + (f"; {nodes}" if nodes else ""))

    def _follow(self, pod: str) -> None:
        def run() -> None:
            try:
                resp = self.kube.core.read_namespaced_pod_log(pod, self.namespace, container=self.service,
                                                              follow=True, _preload_content=False)
                with open(self.log_path, "ab", buffering=0) as log:
                    for chunk in resp.stream(4096):
                        log.write(chunk)
            except Exception:   # the container or pod is gone: its log ends here
                pass
        self._follower = threading.Thread(target=run, name=f"podlog-{self.service}", daemon=True)
        self._follower.start()

    def ready(self) -> bool:
        """The pod's own Ready condition (kubelet ran the readiness probe inside the node's network)."""
        pod = self._refresh(force=True)
        conds = {c.get("type"): c.get("status") for c in ((pod or {}).get("status") or {}).get("conditions") or []}
        return conds.get("Ready") == "True"

    def _refresh(self, force: bool = False) -> dict | None:
        """The pod of the current instance as listed now (cached for POLL_S); None when it is gone."""
        if self.instance is None:
            return None
        now = time.monotonic()
        if force or now - self._checked >= POLL_S:
            pods = self.kube.pods(self.namespace, self.selector)
            self._pod = next((p for p in pods if p["metadata"]["uid"] == self.instance[0]), None)
            self._checked = now
        return self._pod

    def poll(self) -> int | None:
        with self._lock:
            if self.returncode is not None or self.instance is None:
                return self.returncode
            try:
                pod = self._refresh()
            except Exception:      # the API hiccupped: ask again next time
                return None
            end = judge(pod, self.instance, self.service)
            if end is None:
                return None
            self.terminations.append(end)
            self.returncode = end["exit_code"]
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (rc := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.name, timeout or 0.0)
            time.sleep(POLL_S / 2)
        if self._follower is not None:
            self._follower.join(timeout=2)
        return rc

    @property
    def oom_killed(self) -> bool:
        return bool(self.terminations and self.terminations[-1].get("oom_killed"))

    @property
    def uid(self) -> str | None:
        return self.instance[0] if self.instance else None

    @property
    def pid(self) -> int:
        """The host PID of the container's first process (found by the pod UID in its environment), 0 if none."""
        uid = self.uid
        if not uid:
            return 0
        if self._pid and _env_has(self._pid, uid):
            return self._pid
        self._pid = find_pid(uid) or None
        return self._pid or 0

    # --- capabilities the faults use
    def signal(self, sig: int) -> None:
        if self.pid:
            os.kill(self.pid, sig)

    def pause(self) -> None:
        self.signal(19)

    def unpause(self) -> None:
        self.signal(18)

    def stop(self, timeout: float) -> None:
        """Delete the Deployment (its pods get ``timeout`` seconds) and wait until its pods are gone."""
        if not self.created:
            return
        try:
            self.kube.apps.delete_namespaced_deployment(self.service, self.namespace, propagation_policy="Foreground",
                                                        grace_period_seconds=max(0, int(timeout)), _request_timeout=10)
        except Exception as e:   # said; the namespace's deletion (at stack stop, or `monsoon heal`) takes its pods
            logging.getLogger(__name__).warning("monsoon: the Deployment %s/%s was not deleted: %s: %s",
                                                self.namespace, self.service, type(e).__name__, e)
        deadline = time.monotonic() + timeout + 15
        while time.monotonic() < deadline:
            try:
                if not self.kube.pods(self.namespace, self.selector):
                    break
            except Exception:
                break
            time.sleep(POLL_S)
        self.poll()


def _env_has(pid: int, uid: str) -> bool:
    try:
        return f"MONSOON_POD_UID={uid}".encode() in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def find_pid(uid: str) -> int | None:
    """The oldest process whose environment holds ``MONSOON_POD_UID=<uid>`` (the container's first process)."""
    found: list[int] = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and _env_has(int(d.name), uid):
            found.append(int(d.name))
    if not found:
        return None
    pids = set(found)
    tops = []
    for p in found:
        try:
            ppid = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid not in pids:
            tops.append(p)
    return min(tops or found)


# ------------------------------------------------------------------ reaper

def _kube_or_none() -> Kube | None:
    if not kubeconfig_path().is_file():
        return None
    try:
        return Kube()
    except Exception:
        return None


def run_namespaces(run_id: str | None = None, kube: Kube | None = None) -> list[dict]:
    """Namespaces labelled with a run id (one run's, or every run's); [] when no cluster answers."""
    kube = kube or _kube_or_none()
    if kube is None:
        return []
    try:
        res = kube.core.list_namespace(label_selector=f"{RUN_LABEL}={run_id}" if run_id else RUN_LABEL,
                                       _request_timeout=5)
    except Exception:
        return []
    return [kube.plain(n) for n in res.items]


def namespace_owners() -> dict[str, int | None]:
    """Run id -> the PID of the monsoon process that created its namespace (``heal --all`` skips live ones)."""
    out: dict[str, int | None] = {}
    for ns in run_namespaces():
        lab = ns["metadata"].get("labels") or {}
        owner = lab.get(OWNER_POD_LABEL, "")
        out[lab.get(RUN_LABEL, "?")] = int(owner) if owner.isdigit() else None
    return out


def reap_namespaces(run_id: str | None = None, timeout: float = 120.0) -> list[str]:
    """Delete every namespace of a run (or of every run) and wait for each to go; returns their names."""
    kube = _kube_or_none()
    if kube is None:
        return []
    gone = []
    for ns in run_namespaces(run_id, kube):
        name = ns["metadata"]["name"]
        try:
            kube.delete_namespace(name, timeout)
            gone.append(name)
        except Exception as e:   # said; the next namespace is still tried, and namespace_census names this one
            logging.getLogger(__name__).warning("monsoon: namespace %s was not deleted: %s: %s",
                                                name, type(e).__name__, e)
    return gone


def namespace_census(run_id: str) -> list[str]:
    return [f"namespace {ns['metadata']['name']} ({(ns.get('status') or {}).get('phase', '?')})"
            for ns in run_namespaces(run_id)]


# ------------------------------------------------------------------ the cluster for the stories

class ClusterUnavailable(Exception):
    """The cluster cannot run here (one line naming what is missing: scenarios skip with it)."""


SESSION_ENV = ("KUBECONFIG", "MONSOON_KUBE_NAMESPACES")


def _add_namespaces(namespaces: tuple[str, ...]) -> None:
    """Add ``namespaces`` to MONSOON_KUBE_NAMESPACES (kept in order, no repeats)."""
    have = [x.strip() for x in (settings.env("MONSOON_KUBE_NAMESPACES") or "").split(",") if x.strip()]
    os.environ["MONSOON_KUBE_NAMESPACES"] = ",".join(dict.fromkeys([*have, *namespaces]))


def _restore_env(saved: dict[str, str | None]) -> None:
    """Put the variables back as they were (unset where they were unset)."""
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@contextmanager
def cluster_for_stacks(namespaces: tuple[str, ...] = ()) -> Iterator[Cluster]:
    """The cluster (with Chaos Mesh) for stacks in Kubernetes form, started here when it is not running and
    stopped on the way out if it was; monsoon's Docker daemon for importing images; ``KUBECONFIG`` pointed at
    the cluster and ``namespaces`` added to ``MONSOON_KUBE_NAMESPACES`` meanwhile (both put back after)."""
    why = cluster.skip_reason(chaos_mesh=True)
    if why:
        raise ClusterUnavailable(why)
    saved = {k: os.environ.get(k) for k in SESSION_ENV}
    with ExitStack() as stack:
        try:
            stack.enter_context(dockerd.ensure())
        except dockerd.DockerdError as e:
            raise ClusterUnavailable(f"no Docker daemon to import images from: {str(e).splitlines()[0]}") from None
        started = cluster.ensure_up(chaos_mesh=True)
        if started:
            stack.callback(cluster.down, True)
        c = cluster.Cluster()
        os.environ["KUBECONFIG"] = str(c.kubeconfig)
        _add_namespaces(namespaces)
        try:
            yield c
        finally:
            _restore_env(saved)



class _SessionCluster:
    """The cluster a pytest session holds (one per session, on its Config): started by the first test module that
    asks, released after the last test that needs it (:meth:`pytest_runtest_teardown`), started again if a later
    module asks again."""

    def __init__(self) -> None:
        self.cm: Any = None
        self.held: Cluster | ClusterUnavailable | None = None
        self.saved: dict[str, str | None] = {}

    def acquire(self, namespaces: tuple[str, ...]) -> Cluster:
        if isinstance(self.held, Cluster) and not cluster.running(self.held):
            self.release()      # taken down since (a test of `cluster down`): the module asking gets it started again
        if self.held is None:
            self.saved = {k: os.environ.get(k) for k in SESSION_ENV}
            cm = cluster_for_stacks(namespaces)
            try:
                self.held, self.cm = cm.__enter__(), cm
            except ClusterUnavailable as e:
                self.held = e
        if isinstance(self.held, ClusterUnavailable):
            raise self.held
        _add_namespaces(namespaces)
        return self.held

    def release(self) -> None:
        """Stop the cluster if this session started it, and put KUBECONFIG and MONSOON_KUBE_NAMESPACES back."""
        cm, self.cm, self.held, saved, self.saved = self.cm, None, None, self.saved, {}
        try:
            if cm is not None:
                cm.__exit__(None, None, None)
        finally:
            _restore_env(saved)

    @staticmethod
    def needs(item: Any) -> bool:
        """A test needs the cluster when it is marked ``kubernetes`` or its module uses cluster_for_session."""
        return (item.get_closest_marker("kubernetes") is not None
                or getattr(getattr(item, "module", None), "cluster_for_session", None) is cluster_for_session)

    # trylast: after pytest's own teardown, which tears the module's fixtures down when the module ends
    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: Any, nextitem: Any) -> None:
        """After a test's teardown (its module's fixtures included when the module ends): release the cluster
        unless the next test is of the same module or needs it too (:meth:`needs`)."""
        if self.held is None:
            return
        if nextitem is None or (nextitem.path != item.path and not self.needs(nextitem)):
            self.release()

    def pytest_unconfigure(self, config: Any) -> None:
        self.release()


def cluster_for_session(config: Any, namespaces: tuple[str, ...] = ()) -> Cluster:
    """:func:`cluster_for_stacks` held by a pytest session (``config``: pytest's Config): the first test module
    that asks starts the cluster (unless it runs); it is stopped (if it was started here) and the environment put
    back right after the last test that needs it, the last one of a run of modules marked ``kubernetes`` or
    importing this function; a module asking later starts it again. Later modules add their ``namespaces``. Raises
    :class:`ClusterUnavailable` (the same line each time)."""
    sc = getattr(config, "_monsoon_k8s_session", None)
    if sc is None:
        sc = config._monsoon_k8s_session = _SessionCluster()
        config.pluginmanager.register(sc, "monsoon-k8s-session")
    return sc.acquire(namespaces)
