"""A stack that is a Helm release (``provider: helm``, the stack's ``helm:`` section).

monsoon installs the chart (``helm install --wait``, with monsoon's kubeconfig, the release labelled
``monsoon.io/run-id`` and ``monsoon.io/owner-pid``) into a namespace it creates for the run, finds each service's
pods by label (:class:`ReleasePod`: a :class:`~monsoon.stack.pods.PodProc` that adopts pods instead of creating a
Deployment) and uninstalls the release, then deletes the namespace, when the stack stops: on every exit path, the
supervisor's stop being the one way out. A release monsoon did not install (``install: false``) is only found:
never upgraded, uninstalled or deleted.

Helm keeps a release as Secrets (``owner=helm``, ``name``, ``status``, ``version`` and the release's own labels) in
its namespace: the census and ``monsoon heal --all`` list releases by reading those Secrets' labels
(:func:`releases_from_secrets`, pure), so they need no Helm binary to see a dead run's release, only to uninstall it.

The argv builders (:func:`install_argv`, :func:`uninstall_argv`) and the value rendering (:func:`render_values`)
are pure.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml

from monsoon.paths import CACHE
from monsoon.spec.base import label_selector
from monsoon.spec.stack import TEMPLATE_RE, StackSpec, helm_path
from monsoon.stack import cluster
from monsoon.stack import pods as kpods
from monsoon.stack.ports import StackError
from monsoon.stack.reaper import RUN_LABEL, check_run_id
from monsoon.timeline.events import OP, OP_HELM_RELEASE, OP_NAMESPACE

OWNER_LABEL = kpods.OWNER_POD_LABEL
#: the labels Helm itself sets on a release's Secrets (``helm list --selector`` reads the release's own beside them)
HELM_SECRET_LABELS = ("owner", "name", "status", "version", "createdAt", "modifiedAt")
HELM_VERSION = "v3.22.0"
log = logging.getLogger(__name__)


class HelmError(StackError):
    pass


# ------------------------------------------------------------------ the binary

def helm_binary() -> Path | None:
    """monsoon's Helm (``make k8s`` builds it into the cache's k8s/bin), else ``helm`` on PATH; None: neither."""
    own = CACHE / "k8s" / "bin" / "helm"
    if own.is_file() and os.access(own, os.X_OK):
        return own
    found = shutil.which("helm")
    return Path(found) if found else None


def not_built() -> str | None:
    """One line when there is no Helm to run, else None."""
    if helm_binary() is None:
        return f"helm: not built ({CACHE / 'k8s' / 'bin' / 'helm'}, and none on PATH): run make k8s"
    return None


def helm_env(kubeconfig: Path) -> dict[str, str]:
    """Helm's environment: monsoon's kubeconfig, and its cache, config and data under monsoon's cache (never the
    user's ~/.config/helm)."""
    home = CACHE / "k8s" / "helm"
    return {**os.environ, "KUBECONFIG": str(kubeconfig), "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"), "HELM_DATA_HOME": str(home / "data"),
            "HELM_NO_PLUGINS": "1"}


# ------------------------------------------------------------------ pure parts

def release_labels(run_id: str, owner_pid: int) -> dict[str, str]:
    """The release's labels (``helm install --labels``): the run and the monsoon process that owns it."""
    return {RUN_LABEL: check_run_id(run_id), OWNER_LABEL: str(owner_pid)}


def install_argv(helm: Path | str, *, release: str, chart: Path | str, namespace: str, kubeconfig: Path | str,
                 values_files: Sequence[Path] = (), labels: dict[str, str] | None = None,
                 timeout: float = 300.0) -> list[str]:
    """``helm install``: waits until every workload is ready (``--wait``, ``--timeout``); the values files in
    order (a later one wins); no ``--create-namespace`` (monsoon creates the run's namespace, labelled)."""
    argv = [str(helm), "install", release, str(chart), "--namespace", namespace, "--kubeconfig", str(kubeconfig),
            "--wait", "--timeout", f"{max(1, int(timeout))}s"]
    if labels:
        argv += ["--labels", label_selector(labels)]
    for f in values_files:
        argv += ["--values", str(f)]
    return argv


def uninstall_argv(helm: Path | str, *, release: str, namespace: str, kubeconfig: Path | str,
                   timeout: float = 120.0) -> list[str]:
    """``helm uninstall`` that waits for the release's resources to be gone; a release already gone is no error."""
    return [str(helm), "uninstall", release, "--namespace", namespace, "--kubeconfig", str(kubeconfig),
            "--wait", "--timeout", f"{max(1, int(timeout))}s", "--ignore-not-found"]


def render_values(value: Any, render: Callable[[str], str]) -> Any:
    """Values with every string's placeholders rendered; a string that is only ``{port:NAME}`` becomes the port's
    number (a chart's ``containerPort`` is an integer)."""
    if isinstance(value, dict):
        return {k: render_values(v, render) for k, v in value.items()}
    if isinstance(value, list):
        return [render_values(v, render) for v in value]
    if isinstance(value, str):
        m = TEMPLATE_RE.fullmatch(value)
        out = render(value)
        return int(out) if m is not None and m.group(1) == "port" and out.isdigit() else out
    return value


def service_targets(services: list[dict], ports: Sequence[int], protocol: str = "TCP") -> dict[int, str]:
    """Port -> the ClusterIP of the Service that exposes it over ``protocol`` (a Service port's ``protocol``,
    TCP when unset; ``UDP``: e.g. Hono's CoAP adapter), for the stack's ``ports`` (a release on the pod network:
    the mirror takes host 127.0.0.1:P to that Service, kube-proxy to whichever pod is behind it)."""
    out: dict[int, str] = {}
    for svc in services:
        spec = svc.get("spec") or {}
        ip = spec.get("clusterIP")
        if not ip or ip == "None":
            continue
        for p in spec.get("ports") or []:
            if p.get("port") in ports and (p.get("protocol") or "TCP") == protocol:
                out.setdefault(int(p["port"]), ip)
    return out


@dataclass(frozen=True)
class ReleaseRef:
    """A release as its newest Secret says: name, namespace, status, revision and monsoon's labels on it."""
    name: str
    namespace: str
    status: str
    version: int
    run_id: str | None
    owner_pid: int | None

    def __str__(self) -> str:
        return f"helm release {self.namespace}/{self.name} ({self.status}, revision {self.version})"


def releases_from_secrets(secrets: list[dict]) -> list[ReleaseRef]:
    """Helm's release Secrets (``type: helm.sh/release.v1``, labels ``owner=helm``, ``name``, ``version``,
    ``status`` and the release's own) -> one :class:`ReleaseRef` per release, its newest revision, sorted."""
    newest: dict[tuple[str, str], ReleaseRef] = {}
    for s in secrets:
        meta = s.get("metadata") or {}
        lab = meta.get("labels") or {}
        if lab.get("owner") != "helm" or not lab.get("name"):
            continue
        try:
            version = int(lab.get("version") or 0)
        except ValueError:
            version = 0
        owner = lab.get(OWNER_LABEL, "")
        ref = ReleaseRef(lab["name"], meta.get("namespace") or "?", lab.get("status") or "?", version,
                         lab.get(RUN_LABEL), int(owner) if owner.isdigit() else None)
        key = (ref.namespace, ref.name)
        if key not in newest or newest[key].version < version:
            newest[key] = ref
    return [newest[k] for k in sorted(newest)]


# ------------------------------------------------------------------ the cluster's side

def _run(argv: list[str], kubeconfig: Path, timeout: float, log_path: Path | None = None) -> subprocess.CompletedProcess:
    """Run helm; its output appended to ``log_path`` (and kept in the result). In a session of its own: a Ctrl-C
    at the terminal reaches monsoon only (a second one during the teardown cannot cut an uninstall short); an
    exception here (KeyboardInterrupt during an install) kills it."""
    res = subprocess.run(argv, env=helm_env(kubeconfig), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                         timeout=timeout, start_new_session=True)
    if log_path is not None:
        with open(log_path, "a") as f:
            f.write(f"$ {' '.join(argv)}\n{res.stdout}{res.stderr}[exit {res.returncode}]\n")
    return res


def _first_error(res: subprocess.CompletedProcess) -> str:
    lines = [x for x in (res.stderr or res.stdout or "").splitlines() if x.strip()]
    return (lines[-1] if lines else f"exit {res.returncode}").removeprefix("Error: ")


def list_releases(run_id: str | None = None, kube: kpods.Kube | None = None) -> list[ReleaseRef]:
    """Releases labelled by a run (one run's, or every run's), from Helm's Secrets; [] when no cluster answers."""
    kube = kube or _kube_or_none()
    if kube is None:
        return []
    selector = "owner=helm," + (f"{RUN_LABEL}={run_id}" if run_id else RUN_LABEL)
    try:
        res = kube.core.list_secret_for_all_namespaces(label_selector=selector, _request_timeout=5)
    except Exception:   # no cluster answers: nothing of it to list (the cluster's census says why)
        return []
    return releases_from_secrets([{"metadata": kube.plain(s.metadata)} for s in res.items])


def _kube_or_none() -> kpods.Kube | None:
    if not kpods.kubeconfig_path().is_file():
        return None
    try:
        return kpods.Kube()
    except Exception:    # no client or no cluster: there is nothing to list
        return None


def release_owners() -> dict[str, int | None]:
    """Run id -> the PID of the monsoon process that installed its release (``heal --all`` skips live ones)."""
    return {r.run_id: r.owner_pid for r in list_releases() if r.run_id}


def uninstall(release: str, namespace: str, timeout: float = 120.0, log_path: Path | None = None) -> None:
    """``helm uninstall --wait``; a release already gone is no error. Raises HelmError with helm's last line."""
    helm = helm_binary()
    if helm is None:
        raise HelmError(not_built() or "helm: not built")
    kc = kpods.kubeconfig_path()
    res = _run(uninstall_argv(helm, release=release, namespace=namespace, kubeconfig=kc, timeout=timeout), kc,
               timeout + 30, log_path)
    if res.returncode != 0:
        raise HelmError(f"helm uninstall {namespace}/{release}: {_first_error(res)}")


def reap_releases(run_id: str | None = None, timeout: float = 120.0) -> list[str]:
    """Uninstall every release of a run (or of every run); returns them as namespace/name."""
    gone = []
    for r in list_releases(run_id):
        try:
            uninstall(r.name, r.namespace, timeout)
            gone.append(f"{r.namespace}/{r.name}")
        except Exception as e:   # said; the next release is still tried, and release_census names this one
            log.warning("monsoon: helm release %s/%s was not uninstalled: %s: %s", r.namespace, r.name,
                        type(e).__name__, e)
    return gone


def release_census(run_id: str) -> list[str]:
    return [str(r) for r in list_releases(run_id)]


# ------------------------------------------------------------------ one service's pods in the release

class ReleasePod(kpods.PodProc):
    """A service's pod in a Helm release: found by ``selector`` (never created or deleted here: the release owns
    it), watched like a pod of monsoon's own Deployment (instances, exits, kubelet's restarts, the followed log).
    ``container`` is the container that is the service."""

    def __init__(self, *, kube: kpods.Kube, namespace: str, run_id: str, container: str, selector: dict[str, str],
                 log_path: Path, start_timeout: float):
        super().__init__(kube=kube, namespace=namespace, run_id=run_id, service=container, manifest={},
                         log_path=log_path, start_timeout=start_timeout)
        self.selector = label_selector(selector)
        self.created = True     # the release's: PodProc.start does not create a Deployment

    def stop(self, timeout: float) -> None:
        """Nothing to delete: the release's uninstall (or, for someone's own release, nobody) removes its pods."""
        self.poll()


# ------------------------------------------------------------------ the stack's release

class Release:
    """The stack's Helm release for one stack start: :meth:`start` (images, namespace, install or find, the port
    mirror) and :meth:`stop` (uninstall, namespace, mirror), which is safe to call at any point of a start."""

    def __init__(self, spec: StackSpec, stack_dir: Path, *, run_id: str, render: Callable[[str], str],
                 ports: list[int], on_event: Callable[..., Any], scale: float = 1.0, namespace_ready: bool = False):
        assert spec.helm is not None
        self.spec, self.helm, self.dir, self.run_id = spec, spec.helm, Path(stack_dir), run_id
        self.render, self.ports, self.on_event, self.scale = render, ports, on_event, scale
        self.name, self.namespace = spec.helm_release(), spec.kube_namespace()
        self.kube: kpods.Kube | None = None
        self.mirror: Any = None
        self.installed = False          # helm install was called (stop uninstalls, whatever it answered)
        self.namespace_created = False
        # the namespace is there already, the run's (made for monsoon's own pods beside the release): the release
        # goes into it, and whoever made it deletes it
        self.namespace_ready = namespace_ready
        self.log_path = self.dir / "logs" / "helm.log"

    # --- before anything starts
    def problems(self) -> list[str]:
        """What stops the release before anything is touched: no Helm (install), no chart, no cluster."""
        out = []
        if self.helm.install:
            why = not_built()
            if why:
                out.append(why)
            chart = helm_path(self.helm.chart or "", self.spec.source or ".")
            if chart is None or not chart.exists():
                out.append(f"helm.chart: no such chart: {chart or self.helm.chart}")
        try:
            self.kube = self.kube or kpods.Kube()
            self.kube.core.list_namespace(limit=1, _request_timeout=5)
        except Exception as e:
            why = str(e).splitlines()[0] if isinstance(e, StackError) else \
                f"the API server does not answer ({type(e).__name__})"
            out.append(f"the Helm release {self.name} needs a cluster but {why}; start the cluster with "
                       "`monsoon cluster up`")
        return out

    def values_file(self) -> Path:
        """The run's values: the inline ``values`` rendered, and ``monsoon: {runId, ownerPid}`` (a chart may label
        its pods with the run)."""
        values = render_values(dict(self.helm.values), self.render)
        values["monsoon"] = {**(values.get("monsoon") or {}), "runId": self.run_id, "ownerPid": os.getpid()}
        path = self.dir / "helm-values.yaml"
        path.write_text(yaml.safe_dump(values, sort_keys=False))
        return path

    # --- start
    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        if self.kube is None:
            self.kube = kpods.Kube()
        if self.helm.install:
            self._import_images()
            self._install()
        else:
            self._find()
        if self.ports:
            tcp, udp = self._targets()
            try:
                c = cluster.Cluster()
                self.mirror = c.forward(sorted(self.ports), tcp, udp) if tcp or udp else c.forward(sorted(self.ports))
            except Exception as e:
                raise StackError(f"the ports {sorted(self.ports)} cannot be mirrored into the cluster's node: "
                                 f"{e}") from None

    def _targets(self) -> tuple[dict[int, str], dict[int, str]]:
        """({}, {}) when the release's pods run on the node's network (the plain mirror); else each port's Service:
        its TCP ports, and its UDP ones."""
        assert self.kube is not None
        pods = [p for s in self.spec.releases() for p in self.kube.pods(
            self.namespace, label_selector(self.helm.selector_of(s, self.name)))]
        if all((p.get("spec") or {}).get("hostNetwork") for p in pods):
            return {}, {}
        res = self.kube.core.list_namespaced_service(self.namespace, _request_timeout=5)
        services = [self.kube.plain(x) for x in res.items]
        return service_targets(services, self.ports), service_targets(services, self.ports, "UDP")

    def _import_images(self) -> None:
        kpods.import_images([s.image for n, s in self.spec.services.items()
                             if s.image and self.spec.provider_of(n) == "helm"], self.on_event)

    def _install(self) -> None:
        assert self.kube is not None
        helm = helm_binary()
        if helm is None:
            raise HelmError(not_built() or "helm: not built")
        if not self.namespace_ready:
            try:
                self.kube.ensure_namespace(self.namespace, self.run_id)
            except kpods.PodError:
                raise
            except Exception as e:
                raise StackError(f"namespace {self.namespace} cannot be created: {type(e).__name__}: {e}") from None
            self.namespace_created = True
            self.on_event(OP, op=OP_NAMESPACE, namespace=self.namespace, event="created")
        files = [p for f in self.helm.values_files for p in [helm_path(f, self.spec.source or ".")] if p is not None]
        chart = helm_path(self.helm.chart or "", self.spec.source or ".")
        kc = kpods.kubeconfig_path()
        timeout = self.helm.timeout * self.scale
        argv = install_argv(helm, release=self.name, chart=chart or "", namespace=self.namespace, kubeconfig=kc,
                            values_files=[*files, self.values_file()], labels=release_labels(self.run_id, os.getpid()),
                            timeout=timeout)
        t0 = time.monotonic()
        self.installed = True       # from here on, stop uninstalls (a half-done install included)
        res = _run(argv, kc, timeout + 60, self.log_path)
        if res.returncode != 0:
            why = self.kube.why_not_running(self.namespace)
            raise HelmError(f"helm install {self.namespace}/{self.name} failed after {time.monotonic() - t0:.0f}s: "
                            f"{_first_error(res)}" + (f" ({why})" if why else "")
                            + f" (the whole output: {self.log_path})")
        self.on_event(OP, op=OP_HELM_RELEASE, release=self.name, namespace=self.namespace, event="installed",
                      seconds=round(time.monotonic() - t0, 3))
        for service, n in self.helm.replicas.items():
            self._scale(service, n)

    def _scale(self, service: str, replicas: int) -> None:
        """The workload (Deployment or StatefulSet) labelled as ``service``'s pods are, scaled to ``replicas``
        (``kubectl scale``); returns once that many pods of it are ready, else HelmError."""
        assert self.kube is not None
        selector = label_selector(self.helm.selector_of(service, self.name))
        apps = self.kube.apps
        found = [(kind, w.metadata.name) for kind, ls in (
            ("deployment", apps.list_namespaced_deployment), ("statefulset", apps.list_namespaced_stateful_set))
            for w in ls(self.namespace, label_selector=selector, _request_timeout=10).items]
        if len(found) != 1:
            raise HelmError(f"helm.replicas.{service}: {len(found)} workloads labelled {selector} in "
                            f"{self.namespace} ({', '.join(f'{k}/{n}' for k, n in found) or 'none'}); one is scaled")
        kind, name = found[0]
        patch = apps.patch_namespaced_deployment_scale if kind == "deployment" else \
            apps.patch_namespaced_stateful_set_scale
        read = apps.read_namespaced_deployment if kind == "deployment" else apps.read_namespaced_stateful_set
        t0 = time.monotonic()
        patch(name, self.namespace, {"spec": {"replicas": replicas}}, _request_timeout=10)
        deadline = t0 + self.helm.timeout * self.scale
        while True:
            ready = read(name, self.namespace, _request_timeout=10).status.ready_replicas or 0
            if ready >= replicas:
                break
            if time.monotonic() > deadline:
                why = self.kube.why_not_running(self.namespace)
                raise HelmError(f"helm.replicas.{service}: {kind}/{name} has {ready} of {replicas} pods ready after "
                                f"{time.monotonic() - t0:.0f}s" + (f" ({why})" if why else ""))
            time.sleep(1.0)
        self.on_event(OP, op=OP_HELM_RELEASE, release=self.name, namespace=self.namespace, event="scaled",
                      service=service, workload=f"{kind}/{name}", replicas=replicas,
                      seconds=round(time.monotonic() - t0, 3))

    def _find(self) -> None:
        """Someone's own release: it must be there and deployed; nothing of it is changed."""
        helm = helm_binary()
        if helm is not None:
            kc = kpods.kubeconfig_path()
            res = _run([str(helm), "status", self.name, "--namespace", self.namespace, "--kubeconfig", str(kc),
                        "-o", "json"], kc, 60, self.log_path)
            if res.returncode != 0:
                raise HelmError(f"helm release {self.namespace}/{self.name} (install: false): {_first_error(res)}")
        self.on_event(OP, op=OP_HELM_RELEASE, release=self.name, namespace=self.namespace, event="found")

    # --- the services' pods
    def podproc(self, service: str, log_path: Path) -> ReleasePod:
        assert self.kube is not None
        p = self.helm.pods.get(service)
        return ReleasePod(kube=self.kube, namespace=self.namespace, run_id=self.run_id,
                          container=(p.container if p and p.container else service),
                          selector=self.helm.selector_of(service, self.name), log_path=log_path,
                          start_timeout=self.helm.timeout * self.scale)

    # --- stop
    def stop(self) -> None:
        """Uninstall (only what monsoon installed), delete the namespace it created, stop the port mirror. Every
        step runs whatever the one before did; what failed is an event and a warning."""
        mirror, self.mirror = self.mirror, None
        if mirror is not None:
            try:
                mirror.stop()
            except Exception as e:   # said; the release below is what holds the run
                log.warning("monsoon: the cluster's port mirror did not stop: %s: %s", type(e).__name__, e)
        if self.installed:
            self.installed = False
            t0 = time.monotonic()
            try:
                uninstall(self.name, self.namespace, self.helm.timeout, self.log_path)
                self.on_event(OP, op=OP_HELM_RELEASE, release=self.name, namespace=self.namespace,
                              event="uninstalled", seconds=round(time.monotonic() - t0, 3))
            except Exception as e:   # said; the namespace's deletion below takes the release's objects with it
                log.warning("monsoon: %s", e)
                self.on_event(OP, op=OP_HELM_RELEASE, release=self.name, namespace=self.namespace,
                              event="uninstall-failed", error=str(e)[:300])
        if self.namespace_created and self.kube is not None:
            self.namespace_created = False
            t0 = time.monotonic()
            try:
                gone = self.kube.delete_namespace(self.namespace)
            except Exception as e:
                gone = False
                self.on_event(OP, op=OP_NAMESPACE, namespace=self.namespace, event="delete-failed",
                              error=str(e)[:200])
            self.on_event(OP, op=OP_NAMESPACE, namespace=self.namespace, event="deleted" if gone else "still-there",
                          seconds=round(time.monotonic() - t0, 3))
