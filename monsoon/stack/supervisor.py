"""Run a stack (a deployment under test) as supervised local processes.

``Stack`` starts the services of a :class:`~monsoon.spec.stack.StackSpec` in
dependency order on free 127.0.0.1 ports, waits for each to be ready, keeps
each service's output in ``<stack_dir>/logs/<service>.log``, restarts services
whose policy says so, reports every start/ready/exit/restart through an
``on_event`` callback, and tears everything down on every exit path
(``__exit__`` also undoes a half-started stack).

Every process gets ``MONSOON_RUN_ID`` in its environment and its own process
group, so a leftover can be found (``find_leftovers``) and killed as a group;
``MONSOON_OWNER_PID`` beside it names the monsoon process that started it, so
``monsoon heal --all`` can tell a live run from one whose monsoon was killed.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Mapping
from typing import Any, Callable, Protocol, Sequence, cast

from monsoon.paths import CACHE, REPO
from monsoon.spec.stack import ServiceSpec, StackSpec, TEMPLATE_RE
from monsoon.stack.kernel import oom_kill_line
from monsoon.stack.ports import StackError, allocate_ports
from monsoon.stack.ready import START_HEADER, _ready_once, this_start
from monsoon.stack.reaper import OWNER_ENV
from monsoon.stack import containers as ctr
from monsoon.stack import cpubudget
from monsoon.stack import cluster
from monsoon.stack import pods as kpods
from monsoon.stack import helm as khelm
from monsoon.timeline.events import (OP, OP_BEFORE_STOP, OP_NAMESPACE, OP_STACK_RETRY,
                                     OP_STACK_START, SERVICE, SVC_DONE, SVC_EXIT, SVC_READY, SVC_RESTART,
                                     SVC_RESTART_FAILED, SVC_START, SVC_STOP)


OOM_PATTERNS = (re.compile(r"java\.lang\.OutOfMemoryError"), re.compile(r"Out of memory", re.I))

EventSink = Callable[..., Any]


# what a server prints when its port is taken: Python, the JVM, Go, Postgres, mosquitto
PORT_TAKEN = re.compile(r"Address already in use|BindException|EADDRINUSE|could not bind", re.I)
START_ATTEMPTS = 3


def _noop(*_a: Any, **_k: Any) -> None:
    return None


# ----------------------------------------------------------------- templates

def render(value: str, ctx: dict[str, str], ports: dict[str, int]) -> str:
    def sub(m: re.Match) -> str:
        name, arg = m.group(1), m.group(2)
        if name == "port":
            return str(ports[arg])
        if name == "host":     # a Service's name on the pod network (ctx["host:NAME"]), else this host's loopback
            return ctx.get(f"host:{arg}", "127.0.0.1")
        return ctx[name]
    return TEMPLATE_RE.sub(sub, value)


# ----------------------------------------------------------------- readiness


# ------------------------------------------------------------------ services

class Proc(Protocol):
    """What the supervisor reads of every service's handle: a ``subprocess.Popen`` (a process), a
    ``containers.ContainerProc`` (provider: docker) or a ``pods.PodProc`` (provider: kubernetes, helm)."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass
class Service:
    name: str
    spec: ServiceSpec
    command: list[str]
    env: dict[str, str]
    dir: Path
    log_path: Path
    proc: Proc | None = None
    starts: int = 0
    exits: list[dict] = field(default_factory=list)
    supervisor: threading.Thread | None = None
    sent: int | None = None     # the last terminating signal monsoon sent the running process (Stack.kill)
    started: float | None = None  # time.monotonic() of the last spawn (the kernel log is read from there on)
    started_pid: int = 0        # the host pid it started with (a container's reads 0 once it has exited)
    container: bool = False     # provider: docker (proc is a containers.ContainerProc)
    pod: bool = False           # provider: kubernetes (proc is a pods.PodProc; kubelet restarts it)
    stopped: bool = False       # monsoon stopped it (Stack.stop_service or Stack.stop): no restart, no second stop

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc and self.proc.poll() is None else None

    # the handle as what it is; the flags say which (``container``, ``pod``, else a process's Popen)
    @property
    def container_proc(self) -> "ctr.ContainerProc":
        return cast("ctr.ContainerProc", self.proc)

    @property
    def pod_proc(self) -> "kpods.PodProc":
        return cast("kpods.PodProc", self.proc)


def exit_cause(code: int, log_tail: str, sent: int | None = None, kernel_line: str | None = None) -> tuple[str, bool]:
    """Human cause of an exit and whether it was an out-of-memory death, on evidence only: an
    OutOfMemoryError in the service's log, or the kernel's OOM-kill line naming its pid (``kernel_line``).
    A SIGKILL with neither is a kill, not an OOM (the cgroup's oom_kill counter may still say otherwise:
    the checks weigh that).

    ``sent`` is the signal monsoon itself sent the service (a pod-kill fault): an exit by that
    signal is named as monsoon's kill, not guessed at (an OutOfMemoryError in the log still wins)."""
    oom_in_log = any(p.search(log_tail) for p in OOM_PATTERNS)
    if code == 3 and oom_in_log:
        return "java.lang.OutOfMemoryError (JVM exit 3)", True
    if code == 137 and kernel_line:
        return f"SIGKILL (exit 137) by the kernel OOM killer: {kernel_line}", True
    if sent is not None and code == 128 + sent and not oom_in_log:
        return f"killed by monsoon with {signal.Signals(sent).name} (exit {code})", False
    if code == 137:
        return ("SIGKILL (exit 137) after OutOfMemoryError in log" if oom_in_log
                else "SIGKILL (exit 137), not sent by monsoon"), oom_in_log
    if oom_in_log:
        return f"exit {code} with OutOfMemoryError in log", True
    if code > 128:
        try:
            return f"killed by {signal.Signals(code - 128).name} (exit {code})", False
        except ValueError:
            pass
    return f"exit {code}", False


def _tail(path: Path, nbytes: int = 65536) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - nbytes))
            return fh.read().decode(errors="replace")
    except FileNotFoundError:
        return ""


class Stack:
    def __init__(self, spec: StackSpec, stack_dir: Path, *, run_id: str, on_event: EventSink = _noop,
                 ready_timeout_scale: float = 1.0, profile: str = "quick",
                 env_overrides: dict[str, dict[str, str]] | None = None,
                 restart_overrides: Mapping[str, str] | None = None):
        self.spec = spec
        self.profile = profile
        unknown = sorted(set(env_overrides or {}) - set(spec.services))
        if unknown:
            raise StackError(f"env for unknown service(s) {', '.join(unknown)} of stack {spec.name!r} "
                             f"(it has: {', '.join(spec.services)})")
        self.env_overrides = env_overrides or {}
        unknown = sorted(set(restart_overrides or {}) - set(spec.services))
        if unknown:
            raise StackError(f"restart policy for unknown service(s) {', '.join(unknown)} of stack {spec.name!r} "
                             f"(it has: {', '.join(spec.services)})")
        self.restart_overrides = dict(restart_overrides or {})
        self.dir = Path(stack_dir)
        self.run_id = run_id
        self.on_event = on_event
        self.scale = ready_timeout_scale
        self.ports: dict[str, int] = {}
        self.ctx: dict[str, str] = {}
        self.services: dict[str, Service] = {}
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._kube: "kpods.Kube | None" = None      # provider: kubernetes: the cluster's API
        self._mirror: Any = None                     # the cluster's port mirror (host 127.0.0.1:P -> node 127.0.0.1:P)
        self._namespace: str | None = None           # the namespace this stack created (stop deletes only that)
        self._release: "khelm.Release | None" = None  # provider: helm: the stack's release (stop uninstalls it)
        self._before_stop: list[Callable[[], None]] = []   # before_stop(): run once while the services still run

    # --- templates
    def render(self, value: str, service_dir: Path | None = None) -> str:
        ctx = dict(self.ctx)
        if service_dir is not None:
            ctx["dir"] = str(service_dir)
        return render(value, ctx, self.ports)

    def endpoint(self, value: str) -> str:
        """Render a stack-level template (devices.port, storage.dsn, ...)."""
        return self.render(value)

    # --- lifecycle
    def _base_ctx(self) -> dict[str, str]:
        """What the placeholders stand for (``monsoon.spec.stack.PLACEHOLDERS``): {run_dir} and {stack_dir} are
        this stack's directory in the run; {stack_file_dir} is the folder of the stack's YAML file (the current
        directory for a spec built in code, which has no file)."""
        stack_file_dir = Path(self.spec.source).resolve().parent if self.spec.source else Path.cwd()
        ctx = {"repo": str(REPO), "cache": str(CACHE), "python": sys.executable, "run_dir": str(self.dir),
               "stack_dir": str(self.dir), "stack_file_dir": str(stack_file_dir)}
        if self._pod_network():    # {host:NAME}: the Service of that name (pods reach it through the cluster's DNS)
            ctx.update({f"host:{n}": n for n in self.spec.pods()})
        return ctx

    def _pod_network(self) -> bool:
        """provider: kubernetes with kubernetes.host_network: false (pods on the pod network, behind Services); and
        monsoon's own pods beside a Helm release (a helm stack's provider: kubernetes services: the release's pods
        reach them by their Services' names, e.g. a chart pointed at monsoon's Kafka)."""
        if not self.spec.pods():
            return False
        if self.spec.helm is not None:
            return True
        return self.spec.kubernetes is not None and not self.spec.kubernetes.host_network

    def _services_on_pod_network(self, ns: str) -> dict[int, str]:
        """A ClusterIP Service per pod service for the ports it listens on; {port: its Service's ClusterIP}."""
        texts = {}
        for n in self.spec.pods():
            sp = self.spec.services[n]
            ready = [v for v in (sp.ready.tcp, sp.ready.http, sp.ready.cql) if v] if sp.ready else []
            texts[n] = [*sp.command, *[str(v) for v in sp.env_for(self.profile).values()], *ready]
        owners = kpods.port_owners(texts)
        targets: dict[int, str] = {}
        for n in self.spec.pods():
            ports = {p: self.ports[p] for p, o in owners.items() if o == n and p in self.ports}
            if not ports:
                continue
            body = kpods.service_manifest(namespace=ns, run_id=self.run_id, service=n, ports=ports)
            assert self._kube is not None    # made by preflight (_preflight_pods), which start() runs first
            try:
                svc = self._kube.core.create_namespaced_service(ns, body, _request_timeout=10)
            except Exception as e:
                raise StackError(f"service {n!r}: its Service cannot be created: {type(e).__name__}: "
                                 f"{str(e)[:200]}") from None
            ip = svc.spec.cluster_ip
            targets.update({p: ip for p in ports.values()})
            self.on_event(OP, op=OP_NAMESPACE, namespace=ns, event="service", service=n, cluster_ip=ip,
                          ports=sorted(ports.values()))
        return targets

    def preflight(self) -> None:
        """Check every declared requirement before touching anything."""
        problems = []
        ctx = self._base_ctx()
        for name, svc in self.spec.services.items():
            for req in svc.requires:
                if req.binary and shutil.which(req.binary) is None:
                    problems.append(f"service {name!r} needs `{req.binary}` on PATH: {req.hint or 'install it'}")
                if req.path and not Path(render(req.path, ctx, {})).exists():
                    problems.append(f"service {name!r} needs {render(req.path, ctx, {})}: {req.hint or 'missing'}")
        problems += self._preflight_containers()
        problems += self._preflight_pods()
        if self.spec.helm is not None:       # provider: helm: Helm built, the chart there, the cluster answering
            problems += self._helm_release().problems()
        problems += cpubudget.problems()     # MONSOON_SERVICE_CPUS: its cgroup made (once) before anything starts
        if problems:
            raise StackError(f"stack {self.spec.name!r} cannot start:\n  " + "\n  ".join(problems))

    def _preflight_containers(self) -> list[str]:
        names = self.spec.containers()
        if not names:
            return []
        try:
            cl = ctr.client()
            cl.ping()
        except Exception as e:
            return [f"services {', '.join(names)} run as containers but no Docker daemon answers "
                    f"({type(e).__name__}): start one with `monsoon dockerd start` (or set DOCKER_HOST)"]
        problems = []
        for n in names:
            image = self.spec.services[n].image
            try:
                cl.images.get(image)
            except Exception:   # not there (or not readable): the finding is that the image is missing
                problems.append(f"service {n!r} needs image {image}: build monsoon's images with `make images`")
        return problems

    def _preflight_pods(self) -> list[str]:
        names = self.spec.pods()
        if not names:
            return []
        try:
            self._kube = self._kube or kpods.Kube()
            self._kube.core.list_namespace(limit=1, _request_timeout=5)
        except Exception as e:
            why = str(e).splitlines()[0] if isinstance(e, StackError) else f"the API server does not answer ({type(e).__name__})"
            return [f"services {', '.join(names)} run as pods but {why}; start the cluster with `monsoon cluster up`"]
        return []

    def _helm_release(self, mirrored: Sequence[int] = (), namespace_ready: bool = False) -> "khelm.Release":
        return khelm.Release(self.spec, self.dir, run_id=self.run_id, render=self.render,
                             ports=[p for p in self.ports.values() if p not in mirrored], on_event=self.on_event,
                             scale=self.scale, namespace_ready=namespace_ready)

    def _start_pods(self) -> None:
        """Images into the cluster, the run's namespace, and the port mirror for every port of the stack."""
        if self.spec.helm is not None:       # a Helm release: installed (or found) here, uninstalled by _stop_pods
            mirrored: list[int] = []
            if self.spec.pods():             # monsoon's own pods beside the release, and what needs nothing of
                # the release (StackSpec.before_release): up and ready before it
                self._start_own_pods()
                mirrored = list(getattr(self._mirror, "ports", []) or [])
                for name in self.spec.before_release():
                    self._start_service(name)
            self._release = self._helm_release(mirrored, namespace_ready=self._namespace is not None)
            self._release.start()
            return
        self._start_own_pods()

    def _start_own_pods(self) -> None:
        """monsoon's own Deployments (provider: kubernetes): images, the namespace, Services, the port mirror."""
        if not self.spec.pods():
            return
        images = []
        for n in self.spec.pods():
            image = self.spec.services[n].image
            assert image is not None    # StackSpec._runnable: a kubernetes service has an image
            images.append(image)
        kpods.import_images(images, self.on_event)
        ns = self.spec.kube_namespace()
        assert self._kube is not None   # made by preflight (_preflight_pods), which start() runs first
        try:
            self._kube.ensure_namespace(ns, self.run_id)
            self._namespace = ns
        except kpods.PodError:
            raise
        except Exception as e:
            raise StackError(f"namespace {ns} cannot be created: {type(e).__name__}: {e}") from None
        self.on_event(OP, op=OP_NAMESPACE, namespace=ns, event="created")
        targets = self._services_on_pod_network(ns) if self._pod_network() else None
        if self.spec.helm is not None and not targets:
            return      # beside a release: only the ports of these pods' Services (the release mirrors its own)
        try:
            self._mirror = cluster.Cluster().forward(sorted(self.ports.values()), targets)
        except Exception as e:
            raise StackError(f"the ports {sorted(self.ports.values())} cannot be mirrored into the cluster's node: "
                             f"{e}") from None

    def _stop_pods(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            release.stop()
        mirror, self._mirror = self._mirror, None
        if mirror is not None:
            try:
                mirror.stop()
            except Exception as e:   # said; the stack goes on stopping: the namespace below is what holds the run
                logging.getLogger(__name__).warning("monsoon: the cluster's port mirror did not stop: %s: %s",
                                                    type(e).__name__, e)
        ns, self._namespace = self._namespace, None
        if self._kube is None or ns is None:
            return
        t0 = time.monotonic()
        try:
            gone = self._kube.delete_namespace(ns)
        except Exception as e:
            gone = False
            self.on_event(OP, op=OP_NAMESPACE, namespace=ns, event="delete-failed", error=str(e)[:200])
        self.on_event(OP, op=OP_NAMESPACE, namespace=ns, event="deleted" if gone else "still-there",
                      seconds=round(time.monotonic() - t0, 3))

    def start(self) -> "Stack":
        """Start every service in dependency order, each once ready.

        Ports are chosen free, then released for the services to bind: another process can take one in
        between. A service that dies at start-up saying its address is in use makes the stack stop and
        start again on new ports (up to START_ATTEMPTS times in all, each with its own stack-start event)."""
        self.preflight()
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "logs").mkdir(exist_ok=True)
        attempt = 0
        while True:
            attempt += 1
            self.ports = allocate_ports(self.spec)
            self.ctx = self._base_ctx()
            self.on_event(OP, op=OP_STACK_START, stack=self.spec.name, ports=self.ports, attempt=attempt)
            try:
                self._start_pods()
                for name in self.spec.start_order():
                    if name not in self.services:    # (a helm stack's own pods started before its release)
                        self._start_service(name)
                return self
            except BaseException as e:
                self.stop()
                if not getattr(e, "port_taken", False) or attempt == START_ATTEMPTS:
                    raise
                self.on_event(OP, op=OP_STACK_RETRY, stack=self.spec.name, attempt=attempt,
                              reason=str(e).splitlines()[0])
                self.services = {}
                self._stopping.clear()

    def __enter__(self) -> "Stack":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def _build(self, name: str) -> Service:
        spec = self.spec.services[name]
        sdir = self.dir / "services" / name
        sdir.mkdir(parents=True, exist_ok=True)
        container = self.spec.provider_of(name) == "docker"
        pod = self.spec.provider_of(name) in ("kubernetes", "helm")
        env = {} if container or pod else dict(os.environ)    # a container has its image's environment, not ours
        if env:   # a process's (not a container's or pod's): stacks/bin/run-* find monsoon's cache here, installed or not
            env.setdefault("MONSOON_CACHE", str(CACHE))
        try:
            env.update({k: self.render(v, sdir) for k, v in spec.env_for(self.profile).items()})
            env.update({k: self.render(v, sdir) for k, v in self.env_overrides.get(name, {}).items()})
        except ValueError as e:
            raise StackError(f"service {name!r}: {e} (in {self.spec.source})") from None
        env["MONSOON_RUN_ID"] = self.run_id
        env[OWNER_ENV] = str(os.getpid())     # the monsoon process that owns the run (heal --all skips live runs)
        env["MONSOON_SERVICE"] = name
        cmd = [self.render(c, sdir) for c in spec.command]
        return Service(name, spec, cmd, env, sdir, self.dir / "logs" / f"{name}.log", container=container, pod=pod)

    def _volumes(self, svc: Service) -> list[str]:
        """The service's volumes with their placeholders rendered (a container's binds, a pod's hostPaths)."""
        try:
            return [self.render(v, svc.dir) for v in svc.spec.volumes]
        except KeyError as e:
            raise StackError(f"service {svc.name!r}: unknown placeholder in volumes: {e}") from None

    def _podproc(self, svc: Service) -> "kpods.PodProc":
        if self._release is not None and self.spec.provider_of(svc.name) == "helm":
            return self._release.podproc(svc.name, svc.log_path)     # the release's pod, found by its labels
        spec, volumes = svc.spec, self._volumes(svc)
        ns = self.spec.kube_namespace()
        assert spec.image is not None   # StackSpec._runnable: a kubernetes service has an image
        assert self._kube is not None   # made by preflight (_preflight_pods), which start() runs first
        manifest = kpods.deployment_manifest(
            namespace=ns, run_id=self.run_id, service=svc.name, image=spec.image, command=svc.command, env=svc.env,
            workdir=svc.dir, mem_limit=spec.mem_limit_for(self.profile), cpus=spec.cpus, volumes=volumes,
            probe=kpods.readiness_probe(spec.ready, lambda v: self.render(v, svc.dir), not self._pod_network()),
            stop_timeout=spec.stop_timeout, host_network=not self._pod_network())
        timeout = self.spec.kubernetes.ready_timeout if self.spec.kubernetes else 120.0
        return kpods.PodProc(kube=self._kube, namespace=ns, run_id=self.run_id, service=svc.name, manifest=manifest,
                             log_path=svc.log_path, start_timeout=timeout * self.scale)

    def _container(self, svc: Service) -> "ctr.ContainerProc":
        spec, volumes = svc.spec, self._volumes(svc)
        assert spec.image is not None   # StackSpec._runnable: a docker service has an image
        return ctr.ContainerProc(image=spec.image, command=svc.command, env=svc.env,
                                 name=ctr.container_name(self.run_id, svc.name),
                                 labels=ctr.labels_for(self.run_id, svc.name), log_path=svc.log_path,
                                 workdir=svc.dir, mem_limit=spec.mem_limit_for(self.profile), cpus=spec.cpus,
                                 volumes=volumes, stop_signal=spec.stop_signal)

    def _spawn(self, svc: Service) -> None:
        with open(svc.log_path, "ab") as log:
            log.write(f"{START_HEADER}{svc.starts + 1} of {svc.name}: {' '.join(svc.command)}\n".encode())
            log.flush()
            if svc.pod:
                if svc.proc is None:        # kept before it starts: stop() deletes a half-started Deployment
                    svc.proc = self._podproc(svc)
                try:
                    svc.pod_proc.start()
                except StackError:
                    raise
                except Exception as e:
                    raise StackError(f"service {svc.name!r}: pod did not start: {type(e).__name__}: {e}") from None
            elif svc.container:
                if svc.proc is None:        # kept before it starts: stop() removes a half-started container
                    svc.proc = self._container(svc)
                try:
                    svc.container_proc.start()
                except Exception as e:
                    raise StackError(f"service {svc.name!r}: container did not start: {e}") from None
            else:
                try:
                    svc.proc = subprocess.Popen(svc.command, env=svc.env, cwd=svc.dir, stdout=log,
                                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                start_new_session=True, preexec_fn=cpubudget.service_preexec())
                except FileNotFoundError:
                    raise StackError(f"service {svc.name!r}: command not found: {svc.command[0]}") from None
                except PermissionError:
                    raise StackError(f"service {svc.name!r}: not executable: {svc.command[0]}") from None
        svc.starts += 1
        svc.started = time.monotonic()
        svc.started_pid = svc.proc.pid
        svc.sent = None
        extra: dict[str, Any] = {"container": svc.container_proc.name, "image": svc.spec.image} if svc.container else {}
        if svc.pod:
            pod = svc.pod_proc
            extra = {"pod": pod.name, "uid": pod.uid, "ip": pod.ip, "image": svc.spec.image}
        self.on_event(SERVICE, service=svc.name, event=SVC_START, pid=svc.proc.pid, n=svc.starts, **extra)

    def _start_service(self, name: str) -> None:
        svc = self._build(name)
        self.services[name] = svc
        self._spawn(svc)
        if svc.spec.oneshot:
            self._wait_done(svc)
            return
        self._wait_ready(svc)
        svc.supervisor = threading.Thread(target=self._supervise, args=(svc,), name=f"supervise-{name}",
                                          daemon=True)
        svc.supervisor.start()

    def _wait_ready(self, svc: Service, first: bool = True) -> bool:
        assert svc.proc is not None     # _spawn made it (it is never unset)
        ready = svc.spec.ready
        t0 = time.monotonic()
        if ready is None:
            time.sleep(0.2)
            if svc.proc.poll() is not None and first:
                raise self._died(svc, t0)
            self.on_event(SERVICE, service=svc.name, event=SVC_READY, after_s=0.0)
            return True
        deadline = t0 + ready.timeout * self.scale
        while time.monotonic() < deadline:
            if self._stopping.is_set():
                return False
            if svc.proc.poll() is not None:
                if first:
                    raise self._died(svc, t0)
                return False
            if (not svc.pod or ready.log or svc.pod_proc.ready()) and \
                    _ready_once(ready, svc.log_path, lambda v: self.render(v, svc.dir)):
                self.on_event(SERVICE, service=svc.name, event=SVC_READY, after_s=round(time.monotonic() - t0, 3))
                return True
            time.sleep(0.1)
        if first:
            what = ready.tcp or ready.http or (f"CQL at {ready.cql}" if ready.cql else f"log /{ready.log}/")
            raise StackError(f"service {svc.name!r} not ready after {ready.timeout * self.scale:.0f}s "
                             f"(waiting for {self.render(what, svc.dir)}); last log lines of {svc.log_path}:\n"
                             + _last_lines(svc.log_path))
        return False

    def _wait_done(self, svc: Service) -> None:
        """A oneshot service (an installer, a migration): wait for it to exit; 0 is done, anything else fails
        the start. Its end is a ``done`` event, not an ``exit``: it is no crash of the stack."""
        assert svc.proc is not None     # _spawn made it (it is never unset)
        t0 = time.monotonic()
        deadline = t0 + svc.spec.oneshot_timeout * self.scale
        while svc.proc.poll() is None:
            if self._stopping.is_set():
                return
            if time.monotonic() > deadline:
                raise StackError(f"oneshot service {svc.name!r} still running after "
                                 f"{svc.spec.oneshot_timeout * self.scale:.0f}s (oneshot_timeout); last log lines of "
                                 f"{svc.log_path}:\n" + _last_lines(svc.log_path))
            time.sleep(0.1)
        code = _norm(svc.proc.returncode)
        after = round(time.monotonic() - t0, 3)
        if code != 0:
            raise StackError(f"oneshot service {svc.name!r} exited with code {code} after {after:.1f}s; "
                             f"last log lines of {svc.log_path}:\n" + _last_lines(svc.log_path))
        self.on_event(SERVICE, service=svc.name, event=SVC_DONE, code=code, after_s=after)

    def _died(self, svc: Service, t0: float) -> StackError:
        assert svc.proc is not None     # _spawn made it (it is never unset)
        code = _norm(svc.proc.returncode)
        taken = PORT_TAKEN.search(this_start(_tail(svc.log_path))) is not None
        err = StackError(f"service {svc.name!r} exited with code {code} during start-up "
                         f"after {time.monotonic() - t0:.1f}s" + (" (its address was in use)" if taken else "")
                         + f"; last log lines of {svc.log_path}:\n" + _last_lines(svc.log_path))
        err.port_taken = taken
        return err

    def _supervise(self, svc: Service) -> None:
        while not self._stopping.is_set():
            proc = svc.proc
            assert proc is not None     # _spawn made it (it is never unset)
            code = _norm(proc.wait())
            if self._stopping.is_set() or svc.stopped:
                return
            # the kernel's word: a process's own pid; a container's first process (Docker's State.OOMKilled can
            # miss a kill on cgroup v2, when the container's exit is reported before its OOM event)
            pid = svc.started_pid if svc.container else proc.pid
            kernel, unreadable = oom_kill_line(pid, since=svc.started) if code == 137 and not svc.pod and pid > 0 \
                else (None, None)
            cause, oom = exit_cause(code, _tail(svc.log_path), svc.sent, kernel)
            ev = {"code": code, "cause": cause, "oom": oom, "pid": proc.pid}
            if svc.container:
                cproc = cast("ctr.ContainerProc", proc)
                ev.update(container_exit(cproc, code, svc.sent, cause, oom, kernel))
                if ev.get("kernel_log") and cproc.terminations:   # the kernel's word, where Docker's missed it:
                    cproc.terminations[-1].update(oom_killed=1, reason="OOMKilled (kernel log)")   # in the samples too
            elif svc.pod:
                ev.update(pod_exit(cast("kpods.PodProc", proc), code, svc.sent, cause, oom))
            elif code == 137:   # what the kernel log said: its OOM line, none, or why it could not be read
                ev["kernel_log"] = kernel or unreadable or "no OOM-kill line for this pid"
            svc.exits.append(ev)
            self.on_event(SERVICE, service=svc.name, event=SVC_EXIT, **ev)
            if svc.pod:     # kubelet restarts it (restartPolicy: Always), or the Deployment makes a new pod
                self._await_pod(svc)
                continue
            policy = self.restart_overrides.get(svc.name, svc.spec.restart)
            if policy == "no" or (policy == "on-failure" and code == 0):
                return
            if self._stopping.wait(svc.spec.restart_delay):
                return
            with self._lock:
                if self._stopping.is_set() or svc.stopped:
                    return
                try:
                    self._spawn(svc)
                except StackError as e:
                    self.on_event(SERVICE, service=svc.name, event=SVC_RESTART_FAILED, error=str(e))
                    return
            self.on_event(SERVICE, service=svc.name, event=SVC_RESTART, n=svc.starts)
            self._wait_ready(svc, first=False)

    def _await_pod(self, svc: Service) -> None:
        """After a pod's exit: its next instance (kubelet's restart, or a new pod), reported as start + restart."""
        pod = svc.pod_proc
        try:
            if not pod.resume(self._stopping):
                return
        except Exception as e:
            self.on_event(SERVICE, service=svc.name, event=SVC_RESTART_FAILED, error=str(e)[:300])
            self._stopping.wait(5)
            return
        assert pod.instance is not None     # resume() found the next instance
        with open(svc.log_path, "ab") as log:
            log.write(f"{START_HEADER}{svc.starts + 1} of {svc.name}: pod {pod.name} "
                      f"(uid {pod.uid}, restartCount {pod.instance[1]})\n".encode())
        svc.starts += 1
        svc.started = time.monotonic()
        svc.sent = None
        self.on_event(SERVICE, service=svc.name, event=SVC_START, pid=pod.pid, n=svc.starts, pod=pod.name,
                      uid=pod.uid, ip=pod.ip, restart_count=pod.instance[1], image=svc.spec.image)
        self.on_event(SERVICE, service=svc.name, event=SVC_RESTART, n=svc.starts, by="kubelet")
        self._wait_ready(svc, first=False)

    # --- capabilities
    def pid(self, service: str) -> int | None:
        return self.services[service].pid

    def kill(self, service: str, sig: int = signal.SIGKILL) -> None:
        svc = self.services[service]
        if svc.proc and svc.proc.poll() is None:
            if sig not in (signal.SIGSTOP, signal.SIGCONT):
                svc.sent = int(sig)
            if not svc.container:           # a process, or a pod's first process (its host pid: 0 when not found,
                if svc.proc.pid <= 0:       # and os.killpg(0, ...) would signal monsoon's own process group)
                    raise StackError(f"service {service!r}: no process to signal (pid {svc.proc.pid})")
                os.killpg(svc.proc.pid, sig)
            elif sig == signal.SIGSTOP:     # a container is frozen whole (the cgroup freezer), not signalled
                svc.container_proc.pause()
            elif sig == signal.SIGCONT:
                svc.container_proc.unpause()
            else:
                svc.container_proc.signal(sig)

    def container(self, service: str) -> "ctr.ContainerProc | None":
        """The container of a ``provider: docker`` service (None for a process service)."""
        svc = self.services.get(service)
        return svc.container_proc if svc is not None and svc.container else None

    def container_history(self) -> dict[str, dict]:
        """Service -> the exits of its container that the supervisor inspected, and how often it restarted it."""
        return {n: {"terminations": list(s.container_proc.terminations), "restarts": max(0, s.starts - 1)}
                for n, s in self.services.items() if s.container and s.proc is not None}

    def container_names(self) -> dict[str, str]:
        """Service -> container name, for every container service of the stack."""
        return {n: ctr.container_name(self.run_id, n) for n in self.spec.containers()}

    def log_path(self, service: str) -> Path:
        return self.services[service].log_path

    def stop_service(self, name: str) -> None:
        """Stop one service now (its stop_signal, then SIGKILL after stop_timeout), and never restart it: the
        platform before a last read of its storage. Its ``stop`` event carries the exit code (a death while
        stopping, e.g. exit 3 of an OutOfMemoryError, is recorded like any other)."""
        self._stop_one(self.services[name])

    def before_stop(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` once when the stack stops, before any service does, whatever ended the stack's ``with``
        block (e.g. deleting what a run provisioned in the platform's registry, which must still answer)."""
        self._before_stop.append(fn)

    def stop(self) -> None:
        """Stop every service, newest first: SIGTERM to its group, then SIGKILL after stop_timeout. The
        ``before_stop`` callbacks run first (an error in one is an event, never stops the stop)."""
        while self._before_stop:
            fn = self._before_stop.pop()
            try:
                fn()
            except Exception as e:
                self.on_event(OP, op=OP_BEFORE_STOP, ok=False, error=f"{type(e).__name__}: {e}")
        with self._lock:
            self._stopping.set()
        for name in reversed(list(self.services)):
            self._stop_one(self.services[name])
        self._stop_pods()
        for svc in self.services.values():
            if svc.supervisor and svc.supervisor is not threading.current_thread():
                svc.supervisor.join(timeout=5)
            if svc.spec.ephemeral:
                shutil.rmtree(svc.dir, ignore_errors=True)

    def _stop_one(self, svc: Service) -> None:
        with self._lock:        # a restart in progress finishes first, and none starts after this
            if svc.stopped or svc.proc is None:
                return
            svc.stopped = True
        if svc.container or svc.pod:
            (svc.container_proc if svc.container else svc.pod_proc).stop(svc.spec.stop_timeout)
            self.on_event(SERVICE, service=svc.name, event=SVC_STOP, code=svc.proc.returncode)
            return
        _terminate_group(svc.proc, svc.spec.stop_timeout, getattr(signal, svc.spec.stop_signal))
        self.on_event(SERVICE, service=svc.name, event=SVC_STOP, code=_norm(svc.proc.returncode))


def container_exit(proc: "ctr.ContainerProc", code: int, sent: int | None, cause: str, oom: bool,
                   kernel: str | None = None) -> dict:
    """What a container's exit adds to the process fields: Docker's own word on OOM (State.OOMKilled) wins; when
    Docker says no, the kernel's OOM-kill line naming the container's first process (``kernel``) still does."""
    ev: dict[str, Any] = {"container": proc.name}
    if code > 128:
        try:
            ev["signal"] = signal.Signals(code - 128).name
        except ValueError:
            pass
    if proc.oom_killed:
        ev.update(oom=True, cause=f"OOMKilled: the kernel killed the container over its memory limit (exit {code})")
    elif kernel is not None and code == 137:
        ev.update(oom=True, kernel_log=kernel,
                  cause=f"OOMKilled: the kernel killed the container over its memory limit (exit {code}; its OOM-kill "
                        "line, though Docker's State.OOMKilled is false)")
    elif code == 137 and not oom and sent is None:
        ev["cause"] = "SIGKILL (exit 137), not by the OOM killer (State.OOMKilled false)"
    return ev


def pod_exit(proc: "kpods.PodProc", code: int, sent: int | None, cause: str, oom: bool) -> dict:
    """What a pod's exit adds to the process fields: the pod's own word (lastState.terminated.reason) wins."""
    t = proc.terminations[-1] if proc.terminations else {}
    ev: dict[str, Any] = {"pod": proc.name, "uid": proc.uid, "reason": t.get("reason")}
    if code > 128:
        try:
            ev["signal"] = signal.Signals(code - 128).name
        except ValueError:
            pass
    if t.get("oom_killed"):
        ev.update(oom=True, cause=f"OOMKilled: the kernel killed the pod's container over its memory limit (exit {code})")
    elif t.get("reason") == "pod deleted":
        ev["cause"] = "the pod was deleted (its Deployment makes a new one)"
    elif code == 137 and not oom and sent is None:
        ev["cause"] = "SIGKILL (exit 137), not by the OOM killer (reason not OOMKilled)"
    return ev


def _norm(code: int | None) -> int:
    if code is None:
        return -1
    return 128 - code if code < 0 else code


def _terminate_group(proc: Proc, timeout: float, sig: int = signal.SIGTERM) -> None:
    pgid = proc.pid
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    # the leader may be gone while children of its group linger: kill the group regardless
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _last_lines(path: Path, n: int = 25) -> str:
    lines = _tail(path).splitlines()[-n:]
    return "\n".join("    " + ln for ln in lines) or "    (empty log)"


