"""Kubernetes faults: render Chaos Mesh and Litmus objects; apply them only when a cluster is configured.

The reasoning, sources and measurements behind it: docs/design.md, "monsoon/faults/kube.py"."""
from __future__ import annotations

import gzip
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Iterable

import yaml

from monsoon.faults.base import FaultContext, FaultError, Handle, Landing
from monsoon.spec.fault import FaultSpec, KubeSelector, LatencyParams, MemoryPressureParams, PodFailureParams, \
    PodKillParams
from monsoon.stack.cluster import Cluster, ClusterError, chaos_daemon_missing, daemon_pid, ensure_chaos_daemon
from monsoon.stack.kubeapi import cluster_configured, kube_client
from monsoon.stack.litmus import RUNNER_IMAGE as LITMUS_RUNNER_IMAGE
from monsoon.stack.litmus import engine_experiment as litmus_engine_experiment
from monsoon.stack.pods import kubeconfig_path
from monsoon.stack.reaper import RUN_LABEL, _dns_name, _short, check_run_id
from monsoon.timeline.views import KILL_KINDS


FAULT_LABEL = "monsoon.io/fault"
CHAOS_MESH = ("chaos-mesh.org", "v1alpha1")
LITMUS = ("litmuschaos.io", "v1alpha1")
PLURALS = {"PodChaos": "podchaos", "NetworkChaos": "networkchaos", "StressChaos": "stresschaos",
           "Schedule": "schedules", "ChaosEngine": "chaosengines"}
LATENCY_KINDS = ("network-latency", "mongo-slowdown", "infinispan-slowdown", "cassandra-slowdown")
# what chaos-daemon serves on the node (the controller alone serves pod-kill, pod-failure)
DAEMON_KINDS = ("container-kill", "memory-pressure")
# chaos-mesh controllers/common: AnnotationCleanFinalizer / AnnotationCleanFinalizerForced
CLEAN_FINALIZER = "chaos-mesh.chaos-mesh.org/cleanFinalizer"
CLEAN_FINALIZER_FORCED = "forced"
FORCE_WAIT_S = 15.0     # after the forced annotation (and after removing the finalizers): how long to wait for the gone
# litmus chaos-operator api/litmuschaos/v1alpha1: status.experiments[].status (ExperimentStatus)
LITMUS_RAN = ("running", "completed", "execution successful")
LITMUS_FAILED = ("chaosexperiment not found", "forcefully aborted", "skipped")


class NamespaceNotAllowed(FaultError):
    pass


def _dur(seconds: float) -> str:
    """A Go duration; sub-second parts in whole milliseconds (rounded, at least 1: 1.001 s is 1001ms, not 1000ms)."""
    return f"{int(seconds)}s" if float(seconds).is_integer() else f"{max(1, round(seconds * 1000))}ms"


def _whole_seconds(seconds: float) -> int:
    """Litmus reads its durations as whole seconds (strconv.Atoi); 0 would mean no chaos at all, so round up."""
    return max(1, math.ceil(seconds))


def _meta(fault: FaultSpec, run_id: str, kind_tag: str) -> dict:
    ns = kube_target(fault).namespace
    meta = {"name": _dns_name("monsoon", fault.name, run_id, kind_tag), "namespace": ns,
            "labels": {RUN_LABEL: check_run_id(run_id), FAULT_LABEL: _short(fault.name),
                       "app.kubernetes.io/managed-by": "monsoon"}}
    if len(fault.name) > 63:  # a label value has at most 63 characters: keep the whole name beside it
        meta["annotations"] = {FAULT_LABEL: fault.name}
    return meta


def kernel_config(path: str = "/proc/config.gz") -> dict[str, str]:
    """The running kernel's build configuration (``CONFIG_X: y|m``; a "not set" option is absent), {} unreadable."""
    try:
        with gzip.open(path, "rt") as fh:
            return dict(ln.strip().split("=", 1) for ln in fh if ln.startswith("CONFIG_") and "=" in ln)
    except OSError:
        return {}


def netem_missing(*, config: str = "/proc/config.gz", modules: str = "/proc/modules",
                  lib_modules: str | None = None) -> str | None:
    """Why this kernel cannot delay packets (NetworkChaos ``delay`` is ``tc qdisc ... netem``), or None when it can:
    ``sch_netem`` built in, loaded, or on disk to load."""
    cfg = kernel_config(config)
    if cfg.get("CONFIG_NET_SCH_NETEM") == "y":
        return None
    try:
        if any(ln.split()[0] == "sch_netem" for ln in Path(modules).read_text().splitlines() if ln.strip()):
            return None
    except OSError:
        pass
    lib = Path(lib_modules or f"/lib/modules/{os.uname().release}")
    if any(lib.rglob("sch_netem.ko*")) if lib.is_dir() else False:
        return None
    try:
        if "sch_netem.ko" in (lib / "modules.builtin").read_text():
            return None
    except OSError:
        pass
    where = ("CONFIG_NET_SCH_NETEM is not set in /proc/config.gz" if cfg else "not in /proc/modules")
    return f"{where}, and no sch_netem.ko under {lib}"


def memory_cgroup_missing(cgroup_root: str = "/sys/fs/cgroup", proc: str = "/proc") -> str | None:
    """Why chaos-daemon cannot charge a memory stressor to a container's cgroup here, or None when it can. It
    moves memStress into the target's cgroups: on cgroup v1 (or hybrid) through the v1 ``memory`` hierarchy, on
    v2 (unified) by writing the target's ``cgroup.procs`` from PID 1's cgroup namespace (``nsenter -C -t 1``)."""
    root = Path(cgroup_root)
    ctl = root / "cgroup.controllers"
    if ctl.is_file():      # unified: cgroup v2 only
        try:
            controllers = ctl.read_text().split()
        except OSError as e:
            return f"{ctl} is unreadable ({e.strerror})"
        if "memory" not in controllers:
            return f"cgroup v2 without its memory controller ({ctl}: {' '.join(controllers) or 'empty'})"
        if not Path(proc, "1", "ns", "cgroup").exists():
            return (f"cgroup v2 without cgroup namespaces ({proc}/1/ns/cgroup is absent): chaos-daemon enters PID "
                    f"1's to attach memStress")
        return None
    if (root / "memory" / "memory.limit_in_bytes").is_file():
        return None
    return (f"no memory cgroup controller under {root} (neither v2's cgroup.controllers nor v1's "
            f"memory/memory.limit_in_bytes)")


def kernel_refusal(fault: FaultSpec, **where: str) -> str | None:
    """One line refusing a Chaos Mesh fault this machine cannot serve (None: it can): NetworkChaos delay without
    sch_netem; container-kill and StressChaos without chaos-daemon built; StressChaos memory without a memory
    cgroup controller. ``where`` overrides the paths read (tests): config, modules, lib_modules, cgroup_root,
    proc, and ``daemon_missing`` (the reason chaos-daemon is absent, "" when built)."""
    if fault.backend != "chaos-mesh":
        return None
    if fault.kind in LATENCY_KINDS:
        why = netem_missing(**{k: v for k, v in where.items() if k in ("config", "modules", "lib_modules")})
        if why:
            return (f"{fault.name}: NetworkChaos delay needs the kernel module sch_netem, which this kernel lacks "
                    f"({why}): refused before the load; delay the hop through Toxiproxy instead (backend: toxiproxy)")
    if fault.kind in DAEMON_KINDS:
        what = "PodChaos container-kill" if fault.kind == "container-kill" else "StressChaos memory"
        daemon = where["daemon_missing"] if "daemon_missing" in where else chaos_daemon_missing()
        if daemon:
            return f"{fault.name}: {what} needs Chaos Mesh's chaos-daemon on the node: {daemon}: refused before the load"
        if fault.kind == "memory-pressure":
            why = memory_cgroup_missing(**{k: v for k, v in where.items() if k in ("cgroup_root", "proc")})
            if why:
                return (f"{fault.name}: StressChaos memory needs a memory cgroup chaos-daemon can charge memStress "
                        f"to: {why}: refused before the load")
    return None


def check_namespace(fault: FaultSpec, allowed: Iterable[str]) -> str:
    if fault.target.kube is None:
        raise FaultError(f"{fault.name}: Kubernetes backends need a target {{namespace, labelSelector}}")
    ns = fault.target.kube.namespace
    allowed = set(allowed)
    if ns not in allowed:
        raise NamespaceNotAllowed(f"{fault.name}: namespace {ns!r} is not on the allow-list "
                                  f"({', '.join(sorted(allowed)) or 'empty: no namespace allowed'})")
    return ns


def kube_target(fault: FaultSpec) -> KubeSelector:
    """The fault's pod selector (``target: {namespace, labelSelector}``); a fault without one is refused, as
    :func:`check_namespace` refuses it before anything is rendered."""
    if fault.target.kube is None:
        raise FaultError(f"{fault.name}: Kubernetes backends need a target {{namespace, labelSelector}}")
    return fault.target.kube


# ------------------------------------------------------------------ Chaos Mesh

def _cm_selector(fault: FaultSpec) -> dict:
    k = kube_target(fault)
    return {"namespaces": [k.namespace], "labelSelectors": dict(k.label_selector)}


def chaos_mesh_spec(fault: FaultSpec) -> tuple[str, dict]:
    """(kind, spec) of the Chaos Mesh object for one injection (no schedule)."""
    p, dur = fault.params, _dur(fault.schedule.duration)
    if fault.kind == "pod-failure":
        # the controller swaps every container's image for its pause image and puts them back when the object
        # goes (or after `duration`, its own backstop should monsoon die)
        return "PodChaos", {"action": "pod-failure", "mode": "one", "selector": _cm_selector(fault), "duration": dur}
    if fault.kind == "container-kill":
        # chaos-daemon kills the container's task (containerd); kubelet starts it again in the same pod
        assert isinstance(p, PodKillParams)
        if not kube_target(fault).container:
            raise FaultError(f"{fault.name}: container-kill needs target.container (which container of the pod)")
        return "PodChaos", {"action": "container-kill", "mode": "one", "selector": _cm_selector(fault),
                            "containerNames": [kube_target(fault).container]}
    if fault.kind in KILL_KINDS:
        assert isinstance(p, PodKillParams)
        return "PodChaos", {"action": "pod-kill", "mode": "one", "selector": _cm_selector(fault),
                            "gracePeriod": p.grace_period}
    if fault.kind in LATENCY_KINDS:
        assert isinstance(p, LatencyParams)
        # Without a `target` selector NetworkChaos can only delay what the selected pods send (direction "to");
        # its webhook rejects "from"/"both" there.  Traffic *into* the selected pods is the clients' egress.
        if p.stream != "downstream":
            raise FaultError(f"{fault.name}: chaos-mesh delays only what the selected pods send (stream: downstream); "
                             f"for stream {p.stream!r} select the client pods instead and use stream: downstream")
        # no containerNames: NetworkChaos has none (a pod's containers share one network namespace)
        spec = {"action": "delay", "mode": "all", "selector": _cm_selector(fault),
                "delay": {"latency": f"{p.latency_ms}ms", "jitter": f"{p.jitter_ms}ms", "correlation": "0"},
                "direction": "to", "duration": dur}
        return "NetworkChaos", spec
    if fault.kind == "memory-pressure":
        assert isinstance(p, MemoryPressureParams) and p.hog_mb
        spec = {"mode": "all", "selector": _cm_selector(fault),
                "stressors": {"memory": {"workers": p.workers, "size": f"{p.hog_mb}MB"}}, "duration": dur}
        if kube_target(fault).container:
            spec["containerNames"] = [kube_target(fault).container]
        return "StressChaos", spec
    raise FaultError(f"{fault.name}: chaos-mesh cannot render {fault.kind}")


def render_chaos_mesh(fault: FaultSpec, run_id: str, allowed_namespaces: Iterable[str]) -> list[dict]:
    check_namespace(fault, allowed_namespaces)
    kind, spec = chaos_mesh_spec(fault)
    group, version = CHAOS_MESH
    sch = fault.schedule
    if sch.repeat_every is None:
        return [{"apiVersion": f"{group}/{version}", "kind": kind, "metadata": _meta(fault, run_id, kind),
                 "spec": spec}]
    # a repeating fault: a Schedule object; the embedded spec keeps its own duration
    field = kind[0].lower() + kind[1:]          # PodChaos -> podChaos
    return [{"apiVersion": f"{group}/{version}", "kind": "Schedule", "metadata": _meta(fault, run_id, "schedule"),
             "spec": {"schedule": f"@every {_dur(sch.repeat_every)}", "historyLimit": 5,
                      "concurrencyPolicy": "Forbid", "type": kind, field: spec}}]


# ---------------------------------------------------------------------- Litmus

def _env(d: dict[str, Any]) -> list[dict]:
    return [{"name": k, "value": str(v)} for k, v in d.items()]


def render_litmus(fault: FaultSpec, run_id: str, allowed_namespaces: Iterable[str], *,
                  service_account: str | None = None, app_kind: str = "deployment") -> list[dict]:
    """The ChaosEngine; its ``chaosServiceAccount`` is named as the engine unless given (faults/litmus.py makes
    that ServiceAccount, its Role and the ChaosExperiment)."""
    check_namespace(fault, allowed_namespaces)
    k = kube_target(fault)
    try:   # the experiment (the profile's litmus:, else the kind's) and its env; the node's containerd socket
        exp, env = litmus_engine_experiment(fault, str(Cluster().socket) if local_cluster() else None)
    except ValueError as e:
        raise FaultError(str(e)) from None
    group, version = LITMUS
    meta = _meta(fault, run_id, exp)
    return [{"apiVersion": f"{group}/{version}", "kind": "ChaosEngine", "metadata": meta,
             # components.runner and experiments[].spec.rank: required by the operator's generated CRD
             # (config/crd/bases). The runner: the image tools/build-litmus made (no registry: IfNotPresent), the
             # run's label on its pod (the experiment's Job gets the engine's labels); the Job deleted when done
             "spec": {"engineState": "active",
                      "appinfo": {"appns": k.namespace, "applabel": k.selector_string(), "appkind": app_kind},
                      "chaosServiceAccount": service_account or meta["name"],
                      "jobCleanUpPolicy": "delete",
                      "components": {"runner": {"image": LITMUS_RUNNER_IMAGE, "imagePullPolicy": "IfNotPresent",
                                                "runnerLabels": {RUN_LABEL: run_id}}},
                      "experiments": [{"name": exp, "spec": {"rank": 0, "components": {"env": _env(env)}}}]}}]


def one_window(fault: FaultSpec) -> FaultSpec:
    """The fault without its repetition: what one window of a FaultPlan applies."""
    if fault.schedule.repeat_every is None:
        return fault
    return fault.model_copy(update={"schedule": fault.schedule.model_copy(update={"repeat_every": None, "times": None})})


def render(fault: FaultSpec, run_id: str, allowed_namespaces: Iterable[str]) -> list[dict]:
    if fault.backend == "chaos-mesh":
        return render_chaos_mesh(fault, run_id, allowed_namespaces)
    if fault.backend == "litmus":
        return render_litmus(fault, run_id, allowed_namespaces)
    raise FaultError(f"{fault.name}: backend {fault.backend!r} is not a Kubernetes backend")


def to_yaml(objs: list[dict]) -> str:
    return yaml.safe_dump_all(objs, sort_keys=False)


# --------------------------------------------------------------------- backend

def local_cluster() -> bool:
    """The configured cluster is the one ``monsoon cluster up`` runs on this machine (its node's kernel is ours)."""
    kc = os.environ.get("KUBECONFIG")      # the cluster the faults are applied to (cluster_configured)
    return bool(kc) and kubeconfig_path().resolve() == Cluster().kubeconfig.resolve() and kubeconfig_path().is_file()


class KubeBackend:
    """chaos-mesh / litmus: one class, ``flavor`` picks the renderer."""

    def __init__(self, flavor: str, allowed_namespaces: Iterable[str], *, out_dir: Path | None = None,
                 apply: bool | None = None, inject_timeout: float = 60.0, heal_timeout: float = 60.0,
                 poll_interval: float = 2.0, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], Any] = time.sleep):
        if flavor not in ("chaos-mesh", "litmus"):
            raise ValueError(f"flavor must be chaos-mesh or litmus, not {flavor!r}")
        self.name = flavor
        self.allowed = tuple(allowed_namespaces)
        self.out_dir = out_dir
        self.apply = cluster_configured() if apply is None else apply
        self.inject_timeout = inject_timeout
        self.heal_timeout = heal_timeout
        self.poll_interval = poll_interval
        self.clock = clock
        self.sleep = sleep
        self._api = None
        self._core: Any = None     # CoreV1Api: the pods a kill selects, before and after (its landing by effect)
        self._handles: dict[str, Handle] = {}

    def _custom(self):
        if self._api is None:
            self._api = kube_client(FaultError).CustomObjectsApi()
        return self._api

    def _kinds(self) -> list[str]:
        return ["ChaosEngine"] if self.name == "litmus" else ["PodChaos", "NetworkChaos", "StressChaos", "Schedule"]

    def _gv(self) -> tuple[str, str]:
        return LITMUS if self.name == "litmus" else CHAOS_MESH

    def inject(self, fault: FaultSpec, ctx: FaultContext) -> Handle:
        # the FaultPlan injects and heals every window itself: apply one window, not a Schedule whose
        # first run would only come one repeat interval after creation (i.e. after the heal deleted it)
        objs = render(one_window(fault), ctx.run_id, self.allowed)
        refusal = kernel_refusal(fault) if self.apply and local_cluster() else None
        if refusal:
            raise FaultError(refusal)
        handle = Handle(fault, self.name, ctx.run_id, {"objects": objs, "dry_run": not self.apply})
        out = ctx.out_dir or self.out_dir
        if out is not None:
            d = Path(out) / "kube"
            d.mkdir(parents=True, exist_ok=True)
            f = d / f"{handle.id}.yaml"
            f.write_text(to_yaml(objs))
            handle.data["file"] = str(f)
        if self.apply:
            if fault.kind in DAEMON_KINDS and self.name == "chaos-mesh" and local_cluster():
                try:     # the daemon runs only when a fault needs it (monsoon cluster down stops it)
                    handle.data["chaos_daemon_started"] = ensure_chaos_daemon()
                except ClusterError as e:
                    raise FaultError(f"{fault.name}: {e}") from None
            if fault.kind in DAEMON_KINDS:   # judged by its effect: each container's ID and restarts, before
                handle.data["containers_before"] = self._pod_states(fault)
            elif fault.kind == "pod-failure":   # judged by its effect: the images of the pods it may fail, before
                handle.data["pods_before"] = self._pod_states(fault)
            elif fault.kind in KILL_KINDS:   # judged by its effect: the UIDs of the pods it may kill, before
                try:
                    handle.data["uids_before"] = sorted(self._pod_uids(fault))
                except Exception as e:     # no pod list (RBAC, no core API): judged on AllInjected alone, said so
                    handle.data["uids_unreadable"] = f"{type(e).__name__}: {str(e)[:200]}"
            group, version = self._gv()
            api = self._custom()
            for o in objs:
                api.create_namespaced_custom_object(group, version, o["metadata"]["namespace"],
                                                    PLURALS[o["kind"]], o)
        self._handles[handle.id] = handle
        return handle

    def _live_pods(self, fault: FaultSpec) -> list:
        """The live (not deleting) pods the fault's selector matches."""
        k = kube_target(fault)
        if self._core is None:
            self._core = kube_client(FaultError).CoreV1Api()
        pods = self._core.list_namespaced_pod(k.namespace, label_selector=k.selector_string(),
                                              _request_timeout=5).items
        return [p for p in pods if p.metadata.deletion_timestamp is None]

    def _pod_uids(self, fault: FaultSpec) -> dict[str, str]:
        """UID -> phase of the live (not deleting) pods the fault's selector matches."""
        return {p.metadata.uid: p.status.phase for p in self._live_pods(fault)}

    def _pod_states(self, fault: FaultSpec) -> dict[str, dict]:
        """UID -> name, spec images, Ready, and each container's state of the live pods the selector matches."""
        out = {}
        for p in self._live_pods(fault):
            conds = {c.type: c.status for c in (p.status.conditions or [])}
            states = {}
            for cs in p.status.container_statuses or []:
                st = cs.state
                now = ("running" if st.running else f"waiting: {st.waiting.reason}" if st.waiting
                       else f"terminated: {st.terminated.reason} ({st.terminated.exit_code})" if st.terminated else "?")
                last = getattr(getattr(cs, "last_state", None), "terminated", None)   # V1ContainerStatus fields
                states[cs.name] = {"state": now, "image": cs.image, "restarts": cs.restart_count,
                                   "id": getattr(cs, "container_id", None),
                                   "last": f"{last.reason} ({last.exit_code})" if last else None}
            out[p.metadata.uid] = {"pod": p.metadata.name, "images": {c.name: c.image for c in p.spec.containers},
                                   "ready": conds.get("Ready") == "True", "containers": states}
        return out

    def _failure_effect(self, handle: Handle, healed: bool) -> tuple[bool, dict]:
        """pod-failure, by its effect. Injected: a selected pod (same UID) runs another image than before and is
        not Ready. Healed: every selected pod runs its own images again and is Ready."""
        fault, before = handle.fault, handle.data.get("pods_before") or {}
        p = fault.params
        bound = p.landing_timeout if isinstance(p, PodFailureParams) else 60.0

        def probe() -> tuple[bool, dict]:
            now = self._pod_states(fault)
            swapped = {u: x for u, x in now.items() if u in before and x["images"] != before[u]["images"]}
            if healed:
                back = [u for u, x in now.items() if u in before and x["images"] == before[u]["images"]]
                done = bool(now) and not swapped and all(x["ready"] for x in now.values())
                return done, {"pods": now, "images_back": bool(back) and not swapped}
            failed = [u for u, x in swapped.items() if not x["ready"]]
            return bool(failed), {"pods": now, "failed_uids": failed}
        done, ev, polls, waited = self._poll(probe, bound)
        # kubelet stops the container the image swap replaces with SIGTERM (its grace period): its exit may come late
        return done, {"pods_before": before, **ev, "signal": "SIGTERM", "effect_polls": polls,
                      "effect_waited_s": waited}

    def _container_effect(self, handle: Handle) -> tuple[bool, dict]:
        """container-kill and StressChaos memory, by their effect on the same pod (its UID kept): the container
        runs again under a new container ID with its restart count up. StressChaos memory: and its last
        termination says OOMKilled (the stressor took the container to its memory limit)."""
        fault, before = handle.fault, handle.data.get("containers_before") or {}
        p = fault.params
        bound = float(getattr(p, "restart_timeout", 0) or 0) or max(60.0, fault.schedule.duration + 30.0)
        name = kube_target(fault).container

        def probe() -> tuple[bool, dict]:
            now = self._pod_states(fault)
            restarted, oom = [], []
            for uid, x in now.items():
                for cname, c in x["containers"].items():
                    was = (before.get(uid) or {}).get("containers", {}).get(cname)
                    if was is None or (name and cname != name):
                        continue
                    if c["id"] and c["id"] != was["id"] and c["restarts"] > was["restarts"]:
                        restarted.append({"pod": x["pod"], "uid": uid, "container": cname, "id_before": was["id"],
                                          "id": c["id"], "restarts_before": was["restarts"],
                                          "restarts": c["restarts"], "last": c["last"], "state": c["state"]})
                        if str(c["last"] or "").startswith("OOMKilled"):
                            oom.append(f"{x['pod']}/{cname}")
            done = bool(oom) if fault.kind == "memory-pressure" else any(r["state"] == "running" for r in restarted)
            return done, {"restarted": restarted, "oom_killed": oom, "same_uids": sorted(set(now) & set(before))}
        done, ev, polls, waited = self._poll(probe, bound)
        return done, {**ev, "effect_polls": polls, "effect_waited_s": waited}

    def _kill_effect(self, handle: Handle) -> tuple[bool, dict]:
        """A pod kill landed when a pod it selected is gone and a new pod (a new UID) runs in its place."""
        fault, before = handle.fault, set(handle.data.get("uids_before") or [])
        bound = float(getattr(fault.params, "restart_timeout", 60.0) or 60.0)

        def probe() -> tuple[bool, dict]:
            now = self._pod_uids(fault)
            new = sorted(u for u, ph in now.items() if u not in before and ph == "Running")
            killed = sorted(before - set(now))
            return bool(killed and new), {"uids_before": sorted(before), "killed_uids": killed, "new_uids": new}
        done, ev, polls, waited = self._poll(probe, bound)
        return done, {**ev, "effect_polls": polls, "effect_waited_s": waited}

    def heal(self, handle: Handle) -> None:
        if not handle.data.get("dry_run"):
            self._stop_engines(handle.data["objects"])
            self._delete(handle.data["objects"])
        handle.healed = True
        self._handles.pop(handle.id, None)

    @staticmethod
    def _ref(o: dict) -> tuple[str, str, str]:
        return o["metadata"]["namespace"], PLURALS[o["kind"]], o["metadata"]["name"]

    def _call(self, verb: str, o: dict, *body: dict) -> Any:
        """``<verb>_namespaced_custom_object`` on one object; None when it is gone (404)."""
        group, version = self._gv()
        ns, plural, name = self._ref(o)
        try:
            return getattr(self._custom(), f"{verb}_namespaced_custom_object")(group, version, ns, plural, name,
                                                                              *body)
        except Exception as e:  # kubernetes.client.ApiException; 404 = already gone
            if getattr(e, "status", None) != 404:
                raise
            return None

    def _patch(self, o: dict, body: dict) -> None:
        """Merge-patch one object (nothing when it is already gone)."""
        self._call("patch", o, body)

    def _stop_engines(self, objs: list[dict]) -> None:
        """Litmus: ``spec.engineState: stop`` before the delete, so the operator aborts the running chaos."""
        for o in objs:
            if o["kind"] == "ChaosEngine":
                self._patch(o, {"spec": {"engineState": "stop"}})

    def _delete(self, objs: list[dict]) -> None:
        for o in objs:
            self._call("delete", o)

    def _get(self, o: dict) -> dict | None:
        """The live object; None when it is gone (404)."""
        return self._call("get", o)

    def _poll(self, probe: Callable[[], tuple[bool, Any]], timeout: float) -> tuple[bool, Any, int, float]:
        """Call ``probe`` -> (done, value) until done or ``timeout``: (done, last value, polls, seconds)."""
        t0 = self.clock()
        polls = 0
        while True:
            polls += 1
            done, value = probe()
            waited = self.clock() - t0
            if done or waited >= timeout:
                return done, value, polls, round(waited, 3)
            self.sleep(max(0.0, min(self.poll_interval, timeout - waited)))

    def _await_gone(self, objs: list[dict]) -> tuple[bool, dict]:
        """Poll until every object is gone; a Chaos Mesh object stuck in deletion gets its finalizer forced."""
        def present() -> list[tuple[dict, dict]]:
            return [(o, x) for o in objs if (x := self._get(o)) is not None]

        def name(o: dict) -> str:
            return f"{o['kind']}/{o['metadata']['name']}"
        down = self._controller_down()   # nobody will clear a finalizer: no use waiting for it, nor annotating
        first = min(self.heal_timeout, 2 * self.poll_interval) if down else self.heal_timeout
        gone, left, polls, waited = self._poll(lambda: (not (p := present()), p), first)
        ev: dict[str, Any] = {"method": "api", "present": not gone, "polls": polls, "waited_s": waited}
        if down:
            ev["controller"] = "chaos-controller-manager not running (monsoon's cluster)"
        if gone:
            return True, ev
        stuck = [(o, x) for o, x in left if (x.get("metadata") or {}).get("deletionTimestamp")]
        ev["deletion_pending"] = [name(o) for o, _ in stuck]
        ev["finalizers"] = sorted({f for _, x in stuck for f in (x["metadata"].get("finalizers") or [])})
        if len(stuck) < len(left):
            ev["not_deleting"] = [name(o) for o, x in left if not (x.get("metadata") or {}).get("deletionTimestamp")]
        if self.name != "chaos-mesh" or not stuck:
            return False, ev
        wait = min(self.heal_timeout, FORCE_WAIT_S)
        if not down:
            for o, _ in stuck:   # Chaos Mesh's documented way out of a finalizer that cannot recover its pods
                self._patch(o, {"metadata": {"annotations": {CLEAN_FINALIZER: CLEAN_FINALIZER_FORCED}}})
            ev["forced_finalizer"] = True
            gone, _, polls2, waited2 = self._poll(lambda: (not present(), None), wait)
            polls, waited = polls + polls2, waited + waited2
        if not gone:         # nobody acted on the annotation (no controller): take the finalizers off ourselves
            try:
                for o, _ in stuck:
                    self._patch(o, {"metadata": {"finalizers": None}})
                ev["finalizers_removed"] = True
            except Exception as e:   # kubernetes.client.ApiException (RBAC): say so; the census still sees it
                ev["finalizers_removed"] = f"refused: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
            gone, _, polls3, waited3 = self._poll(lambda: (not present(), None), wait)
            polls, waited = polls + polls3, waited + waited3
        ev.update(present=not gone, polls=polls, waited_s=round(waited, 3))
        return gone, ev

    def _controller_down(self) -> bool:
        """Chaos Mesh on monsoon's own cluster (``monsoon cluster up``) whose controller does not run."""
        return self.name == "chaos-mesh" and self.apply and local_cluster() and \
            daemon_pid("chaos-controller-manager") is None

    def _listed(self, run_id: str | None) -> list[dict]:
        """This flavour's objects of a run (of every run: ``None``) in the allowed namespaces, by their label."""
        if not self.apply:
            return []
        group, version = self._gv()
        api = self._custom()
        selector = RUN_LABEL if run_id is None else f"{RUN_LABEL}={run_id}"
        out = []
        for ns in self.allowed:
            for kind in self._kinds():
                try:
                    res = api.list_namespaced_custom_object(group, version, ns, PLURALS[kind],
                                                            label_selector=selector)
                except Exception as e:  # kubernetes.client.ApiException; 404: the cluster does not serve this
                    if getattr(e, "status", None) != 404:   # kind (its CRD is not installed), so none of it is there
                        raise
                    continue
                for item in res.get("items", []):
                    item.setdefault("kind", kind)
                    out.append(item)
        return out

    def run_ids(self) -> set[str]:
        """Run ids on the ``monsoon.io/run-id`` label of this flavour's objects (``monsoon heal --all``)."""
        return {rid for o in self._listed(None) if (rid := (o["metadata"].get("labels") or {}).get(RUN_LABEL))}

    def heal_all(self, run_id: str) -> list[str]:
        for h in list(self._handles.values()):
            if h.run_id == run_id:
                h.healed = True
                self._handles.pop(h.id, None)
        objs = self._listed(run_id)
        if not objs:
            return []
        self._stop_engines(objs)
        self._delete(objs)
        _, ev = self._await_gone(objs)
        forced = (" (finalizers removed)" if ev.get("finalizers_removed") is True
                  else " (finalizer forced)" if ev.get("forced_finalizer") else "")
        return [f"{o['kind']} {o['metadata']['namespace']}/{o['metadata']['name']} deleted{forced}" for o in objs]

    def census(self, run_id: str) -> list[str]:
        return [f"{o['kind']} {o['metadata']['namespace']}/{o['metadata']['name']}" for o in self._listed(run_id)]

    def verify(self, handle: Handle) -> Landing:
        if handle.data.get("dry_run"):
            return Landing(None, {"method": "dry-run", "file": handle.data.get("file"),
                                  "objects": [f"{o['kind']}/{o['metadata']['name']}" for o in handle.data["objects"]]})
        if handle.healed:   # the heal landed when every object is gone
            gone, ev = self._await_gone(handle.data["objects"])
            if gone and "pods_before" in handle.data:    # pod-failure: and its pod back on its own image, Ready
                back, more = self._failure_effect(handle, healed=True)
                ev.update(more, method="api+pod-image")
                if not back:
                    ev["not_healed"] = "the pod is not back on its own image and Ready in time"
                return Landing(back, ev)
            return Landing(gone, ev)
        o = handle.data["objects"][0]

        def probe() -> tuple[bool, tuple[bool | None, dict]]:
            live = self._get(o)
            if live is None:   # deleted behind monsoon's back, or refused
                return True, (False, {"present": False})
            landed, ev, done = self._litmus_state(live) if self.name == "litmus" else self._chaos_mesh_state(live)
            return done, (landed, ev)
        _, (landed, ev), polls, waited = self._poll(probe, self.inject_timeout)
        ev = {"method": "api", "present": ev.pop("present", True), **ev, "polls": polls, "waited_s": waited}
        if "pods_before" in handle.data:      # pod-failure: the pod must run another image, and not be Ready
            effect, more = self._failure_effect(handle, healed=False)
            ev.update(more, method="api+pod-image", all_injected=landed)
            landed = bool(effect) if landed is not False else False
            if not effect:
                ev["not_landed"] = "no selected pod ran another image and went not Ready in time"
        elif "containers_before" in handle.data:     # the same pod, its container restarted (and OOMKilled)
            effect, more = self._container_effect(handle)
            ev.update(more, method="api+container-id", all_injected=landed)
            landed = bool(effect) if landed is not False else False
            if not effect:
                ev["not_landed"] = ("no selected container was OOMKilled and restarted in time"
                                    if handle.fault.kind == "memory-pressure"
                                    else "no selected container runs again under a new ID with a restart in time")
        elif "uids_before" in handle.data:      # AllInjected is evidence, not proof: the pod must be replaced
            effect, more = self._kill_effect(handle)
            ev.update(more, method="api+pod-uid", all_injected=landed)
            landed = bool(effect) if landed is not False else False
            if not effect:
                ev["not_landed"] = "no selected pod was replaced by a new one (new UID) in time"
        elif "uids_unreadable" in handle.data:
            ev["pod_uids"] = f"unreadable ({handle.data['uids_unreadable']}): judged on AllInjected alone"
        return Landing(landed, ev)

    @staticmethod
    def _chaos_mesh_state(live: dict) -> tuple[bool | None, dict, bool]:
        """(landed, evidence, decided) of a Chaos Mesh object; an undecided one is polled again."""
        conds = {c.get("type"): c.get("status") for c in ((live.get("status") or {}).get("conditions") or [])}
        ev: dict[str, Any] = {"conditions": conds}
        if conds.get("AllInjected") == "True":
            return True, ev, True
        if "AllInjected" in conds:   # the controller works on it: not injected (yet)
            ev["pending"] = f"AllInjected is {conds['AllInjected']}"
            return False, ev, False
        ev["pending"] = "no AllInjected condition (is the Chaos Mesh controller running?)"
        return None, ev, False

    @staticmethod
    def _litmus_state(live: dict) -> tuple[bool | None, dict, bool]:
        """(landed, evidence, decided) of a Litmus ChaosEngine, from ``status.engineStatus`` and
        ``status.experiments[].status``/``verdict`` (it has no conditions)."""
        st = live.get("status") or {}
        engine = st.get("engineStatus")
        exps = [{"name": e.get("name"), "status": e.get("status"), "verdict": e.get("verdict")}
                for e in (st.get("experiments") or [])]
        ev: dict[str, Any] = {"engineStatus": engine, "experiments": exps}
        statuses = [str(e["status"] or "").lower() for e in exps]
        verdicts = [str(e["verdict"] or "").lower() for e in exps]
        if any(x in LITMUS_FAILED for x in statuses) or engine == "stopped":
            return False, ev, True
        if any(v in ("fail", "error") for v in verdicts):
            # a failed verdict may be a failed probe as well as a failed injection: the ChaosResult says which
            ev["pending"] = "an experiment has verdict Fail/Error (see its ChaosResult): chaos not proven"
            return None, ev, engine == "completed"
        if any(x in LITMUS_RAN for x in statuses) or engine == "completed":
            return True, ev, True
        ev["pending"] = ("the operator took the engine (initialized) but no experiment runs yet"
                         if engine == "initialized" else "no engineStatus (is the Litmus chaos-operator running?)")
        return None, ev, False
