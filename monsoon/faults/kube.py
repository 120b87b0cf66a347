"""Kubernetes faults: render Chaos Mesh and Litmus objects; apply them only when a cluster is configured.

Rendering needs nothing but PyYAML.  Applying needs the ``kubernetes`` Python
client (pinned in requirements.txt; the ``kube`` extra), imported only when a
cluster is configured (``KUBECONFIG``, ``~/.kube/config`` or in-cluster service
variables); otherwise the backend runs *dry*: it writes the manifests to
``<out_dir>/kube/*.yaml`` and reports landing as unmeasured.

Every object carries the label ``monsoon.io/run-id`` (so ``heal_all``/``census``
find a run's objects with a label selector, and ``run_ids`` the runs that have
any) and only namespaces on the allow-list may be targeted (an empty allow-list
allows none).

Rendered kinds:
* Chaos Mesh (``chaos-mesh.org/v1alpha1``): PodChaos ``pod-kill``, NetworkChaos
  ``delay``, StressChaos memory, and a ``Schedule`` wrapping any of them when the
  fault repeats.
* Litmus (``litmuschaos.io/v1alpha1``): ChaosEngine with ``pod-delete``,
  ``pod-network-latency`` or ``pod-memory-hog``.

``tests/integration/test_manifest_contract.py`` checks every rendered kind with
the upstream Chaos Mesh API types and webhooks (``tests/contract``).
"""
from __future__ import annotations

import hashlib
import math
import os
import re
from pathlib import Path
from typing import Any, Iterable

import yaml

from .base import FaultContext, FaultError, Handle, Landing, check_run_id
from .spec import FaultSpec, LatencyParams, MemoryPressureParams, PodKillParams

RUN_LABEL = "monsoon.io/run-id"
FAULT_LABEL = "monsoon.io/fault"
CHAOS_MESH = ("chaos-mesh.org", "v1alpha1")
LITMUS = ("litmuschaos.io", "v1alpha1")
PLURALS = {"PodChaos": "podchaos", "NetworkChaos": "networkchaos", "StressChaos": "stresschaos",
           "Schedule": "schedules", "ChaosEngine": "chaosengines"}
LATENCY_KINDS = ("network-latency", "mongo-slowdown", "infinispan-slowdown")
KILL_KINDS = ("pod-kill", "kafka-broker-restart")


class NamespaceNotAllowed(FaultError):
    pass


def _short(s: str, limit: int = 63) -> str:
    """``s`` cut to ``limit`` characters; a cut one ends in a hash of the whole, so distinct inputs stay distinct."""
    if len(s) <= limit:
        return s
    return s[:limit - 9].rstrip("-_.") + "-" + hashlib.sha256(s.encode()).hexdigest()[:8]


def _dns_name(*parts: str) -> str:
    # 63, not the 253 a name may have: Chaos Mesh and Litmus copy the name into label values of what they create
    return _short(re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-"))


def _dur(seconds: float) -> str:
    """A Go duration; sub-second parts in whole milliseconds (rounded, at least 1: 1.001 s is 1001ms, not 1000ms)."""
    return f"{int(seconds)}s" if float(seconds).is_integer() else f"{max(1, round(seconds * 1000))}ms"


def _whole_seconds(seconds: float) -> int:
    """Litmus reads its durations as whole seconds (strconv.Atoi); 0 would mean no chaos at all, so round up."""
    return max(1, math.ceil(seconds))


def _meta(fault: FaultSpec, run_id: str, kind_tag: str) -> dict:
    ns = fault.target.kube.namespace
    meta = {"name": _dns_name("monsoon", fault.name, run_id, kind_tag), "namespace": ns,
            "labels": {RUN_LABEL: check_run_id(run_id), FAULT_LABEL: _short(fault.name),
                       "app.kubernetes.io/managed-by": "monsoon"}}
    if len(fault.name) > 63:  # a label value has at most 63 characters: keep the whole name beside it
        meta["annotations"] = {FAULT_LABEL: fault.name}
    return meta


def check_namespace(fault: FaultSpec, allowed: Iterable[str]) -> str:
    if fault.target.kube is None:
        raise FaultError(f"{fault.name}: Kubernetes backends need a target {{namespace, labelSelector}}")
    ns = fault.target.kube.namespace
    allowed = set(allowed)
    if ns not in allowed:
        raise NamespaceNotAllowed(f"{fault.name}: namespace {ns!r} is not on the allow-list "
                                  f"({', '.join(sorted(allowed)) or 'empty: no namespace allowed'})")
    return ns


# ------------------------------------------------------------------ Chaos Mesh

def _cm_selector(fault: FaultSpec) -> dict:
    k = fault.target.kube
    return {"namespaces": [k.namespace], "labelSelectors": dict(k.label_selector)}


def chaos_mesh_spec(fault: FaultSpec) -> tuple[str, dict]:
    """(kind, spec) of the Chaos Mesh object for one injection (no schedule)."""
    p, dur = fault.params, _dur(fault.schedule.duration)
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
        if fault.target.kube.container:
            spec["containerNames"] = [fault.target.kube.container]
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
                  service_account: str = "litmus-admin", app_kind: str = "deployment") -> list[dict]:
    check_namespace(fault, allowed_namespaces)
    p, k, sch = fault.params, fault.target.kube, fault.schedule
    env: dict[str, Any] = {"TOTAL_CHAOS_DURATION": _whole_seconds(sch.duration)}
    if fault.kind in KILL_KINDS:
        exp = "pod-delete"
        env.update(CHAOS_INTERVAL=_whole_seconds(sch.repeat_every or sch.duration),
                   FORCE="true" if p.grace_period == 0 else "false")
    elif fault.kind in LATENCY_KINDS:
        exp = "pod-network-latency"
        env.update(NETWORK_LATENCY=p.latency_ms, JITTER=p.jitter_ms)
    elif fault.kind == "memory-pressure":
        exp = "pod-memory-hog"
        env.update(MEMORY_CONSUMPTION=p.hog_mb, NUMBER_OF_WORKERS=p.workers)
    else:
        raise FaultError(f"{fault.name}: litmus cannot render {fault.kind}")
    if k.container:
        env["TARGET_CONTAINER"] = k.container
    group, version = LITMUS
    return [{"apiVersion": f"{group}/{version}", "kind": "ChaosEngine", "metadata": _meta(fault, run_id, exp),
             # components.runner and experiments[].spec.rank: required by the operator's generated CRD
             # (config/crd/bases); the empty/zero values are what the operator assumes when they are absent
             "spec": {"engineState": "active",
                      "appinfo": {"appns": k.namespace, "applabel": k.selector_string(), "appkind": app_kind},
                      "chaosServiceAccount": service_account,
                      "components": {"runner": {}},
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

def cluster_configured() -> bool:
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return True
    kc = os.environ.get("KUBECONFIG")
    paths = kc.split(os.pathsep) if kc else [str(Path.home() / ".kube" / "config")]
    return any(Path(p).is_file() for p in paths if p)


def kube_client(error: type[Exception] = RuntimeError):
    """The ``kubernetes.client`` module, configured in-cluster or from the kubeconfig."""
    try:
        from kubernetes import client, config  # type: ignore[import-not-found]
    except ImportError:
        raise error("a Kubernetes cluster is configured but the Python client is missing: "
                    "pip install kubernetes") from None
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    return client


class KubeBackend:
    """chaos-mesh / litmus: one class, ``flavor`` picks the renderer."""

    def __init__(self, flavor: str, allowed_namespaces: Iterable[str], *, out_dir: Path | None = None,
                 apply: bool | None = None):
        if flavor not in ("chaos-mesh", "litmus"):
            raise ValueError(f"flavor must be chaos-mesh or litmus, not {flavor!r}")
        self.name = flavor
        self.allowed = tuple(allowed_namespaces)
        self.out_dir = out_dir
        self.apply = cluster_configured() if apply is None else apply
        self._api = None
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
        handle = Handle(fault, self.name, ctx.run_id, {"objects": objs, "dry_run": not self.apply})
        out = ctx.out_dir or self.out_dir
        if out is not None:
            d = Path(out) / "kube"
            d.mkdir(parents=True, exist_ok=True)
            f = d / f"{handle.id}.yaml"
            f.write_text(to_yaml(objs))
            handle.data["file"] = str(f)
        if self.apply:
            group, version = self._gv()
            api = self._custom()
            for o in objs:
                api.create_namespaced_custom_object(group, version, o["metadata"]["namespace"],
                                                    PLURALS[o["kind"]], o)
        self._handles[handle.id] = handle
        return handle

    def heal(self, handle: Handle) -> None:
        if not handle.data.get("dry_run"):
            self._delete(handle.data["objects"])
        handle.healed = True
        self._handles.pop(handle.id, None)

    def _delete(self, objs: list[dict]) -> None:
        group, version = self._gv()
        api = self._custom()
        for o in objs:
            try:
                api.delete_namespaced_custom_object(group, version, o["metadata"]["namespace"], PLURALS[o["kind"]],
                                                    o["metadata"]["name"])
            except Exception as e:  # kubernetes.client.ApiException; 404 = already gone
                if getattr(e, "status", None) != 404:
                    raise

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
                res = api.list_namespaced_custom_object(group, version, ns, PLURALS[kind], label_selector=selector)
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
        self._delete(objs) if objs else None
        return [f"{o['kind']} {o['metadata']['namespace']}/{o['metadata']['name']} deleted" for o in objs]

    def census(self, run_id: str) -> list[str]:
        return [f"{o['kind']} {o['metadata']['namespace']}/{o['metadata']['name']}" for o in self._listed(run_id)]

    def verify(self, handle: Handle) -> Landing:
        if handle.data.get("dry_run"):
            return Landing(None, {"method": "dry-run", "file": handle.data.get("file"),
                                  "objects": [f"{o['kind']}/{o['metadata']['name']}" for o in handle.data["objects"]]})
        group, version = self._gv()
        api = self._custom()
        o = handle.data["objects"][0]
        try:
            live = api.get_namespaced_custom_object(group, version, o["metadata"]["namespace"], PLURALS[o["kind"]],
                                                    o["metadata"]["name"])
        except Exception as e:
            if getattr(e, "status", None) == 404:
                return Landing(handle.healed, {"method": "api", "present": False})
            raise
        if handle.healed:
            return Landing(False, {"method": "api", "present": True})
        conds = {c.get("type"): c.get("status") for c in (live.get("status", {}).get("conditions") or [])}
        ev = {"method": "api", "present": True, "conditions": conds}
        if "AllInjected" in conds:
            return Landing(conds["AllInjected"] == "True", ev)
        return Landing(None, ev)
