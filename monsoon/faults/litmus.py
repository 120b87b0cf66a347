"""Litmus for real: what a ChaosEngine needs besides itself, and its landing and heal judged on the cluster.

:class:`LitmusBackend` is :class:`~monsoon.faults.kube.KubeBackend` ("litmus") plus, in the fault's namespace and
labelled with the run (``monsoon.io/run-id``):

* a ServiceAccount, Role and RoleBinding named as the engine (``chaosServiceAccount``; namespaced rights only, no
  cluster-scoped object: the chart's ``permissions`` when it has them), and the ChaosExperiment: a ChaosHub
  chart's ``fault.yaml`` (``litmus: {chart: container-kill}``: ``faults/kubernetes/<name>/fault.yaml`` of the
  chaos-charts directory, :func:`charts_dir`) applied unchanged apart from its image (the one ``tools/build-litmus``
  made, :data:`monsoon.stack.litmus.EXPERIMENT_IMAGE`, ``imagePullPolicy: IfNotPresent``: no registry here), or
  monsoon's own for a litmus-go experiment by name (``experiments -name <it>``; pod-delete by default);
* the engine's env for that experiment (:func:`engine_experiment`): the window's TOTAL_CHAOS_DURATION, the helper
  image (LIB_IMAGE), CONTAINER_RUNTIME=containerd and SOCKET_PATH (the cluster's containerd socket) for the
  experiments whose helper pods talk to the runtime, then the profile's ``litmus.env``;
* evidence: the ChaosResult's ``experimentStatus.phase`` and ``verdict`` at the inject's check and again just
  before the heal (Litmus sets the verdict to Pass right after injecting, before its post-checks: a verdict is
  evidence, not proof). Each fault lands by its effect: pod-delete by a new pod UID, container-kill by the same
  pod's container under a new ID with its restart count up, pod-memory-hog by the target container's memory
  cgroup usage rising by at least half the hog during the window (:func:`hog_effect`);
* the heal: ``engineState: stop``, the engine deleted, then the runner pod and the experiment's Job (label
  ``chaosUID``) polled until gone, and the ServiceAccount, Role, RoleBinding, ChaosExperiment and ChaosResult
  deleted. An engine stuck in deletion (its finalizer needs the operator, which may be gone) gets its finalizers
  removed, and the evidence says so.

What this cluster cannot serve is refused in one line before the load (:func:`refusal`): network experiments
(tc and the kernel's sch_netem), a helper tool the built image lacks (``tools/build-litmus-helpers``), a chart
that is not there or names another experiment.
"""
from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, Iterable

import yaml

from monsoon import settings
from monsoon.faults.base import FaultContext, FaultError, Handle, Landing
from monsoon.faults.kube import LATENCY_KINDS, LITMUS, KubeBackend, kube_client, kube_target, local_cluster, \
    netem_missing, one_window, render
from monsoon.paths import CACHE
from monsoon.spec.fault import FaultSpec
from monsoon.stack import litmus as built
from monsoon.stack.litmus import (DEFAULT_SOCKET, EXPERIMENT_IMAGE, HELPER_TOOLS, RUNTIME_EXPERIMENTS,  # noqa: F401
                                   VERSION, engine_experiment, experiment_of)
from monsoon.stack.reaper import RUN_LABEL, check_run_id

EXPERIMENT = "pod-delete"
FINALIZER = "chaosengine.litmuschaos.io/finalizer"
RESULT_WAIT_S = 30.0
CHARTS_ENV = "MONSOON_CHAOS_CHARTS"
CHARTS_HINT = (f"git clone --branch {VERSION} --depth 1 https://github.com/litmuschaos/chaos-charts <dir> and set "
               f"{CHARTS_ENV}=<dir> (default <cache>/litmus/chaos-charts)")
NETWORK_PREFIXES = ("pod-network-", "pod-dns-", "pod-http-")
HOG_LANDED_FRACTION = 0.5       # pod-memory-hog landed: the target's memory usage up by at least half the hog
HOG_POLL_S = 2.0
# the rights monsoon's own experiments use in their namespace (upstream's experiment RBAC, namespaced): pods, their
# owners, its own Litmus objects, events
RULES = [
    {"apiGroups": [""], "resources": ["pods", "pods/log", "pods/exec", "events", "configmaps", "secrets",
                                      "services"],
     "verbs": ["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"]},
    {"apiGroups": ["apps"], "resources": ["deployments", "statefulsets", "replicasets", "daemonsets"],
     "verbs": ["get", "list", "watch"]},
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch", "create", "delete",
                                                              "deletecollection"]},
    {"apiGroups": ["litmuschaos.io"], "resources": ["chaosengines", "chaosexperiments", "chaosresults"],
     "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]},
]


EXTRA_KINDS = {"ChaosResult": (*LITMUS, "chaosresults"), "ChaosExperiment": (*LITMUS, "chaosexperiments"),
               "RoleBinding": ("rbac.authorization.k8s.io", "v1", "rolebindings"),
               "Role": ("rbac.authorization.k8s.io", "v1", "roles")}


def _labels(run_id: str) -> dict[str, str]:
    return {RUN_LABEL: check_run_id(run_id), "app.kubernetes.io/managed-by": "monsoon"}


# ---------------------------------------------------------------------------------------- which experiment (pure)

def charts_dir() -> Path:
    """The chaos-charts directory ``litmus: {chart: <name>}`` is looked up in."""
    return Path(settings.env(CHARTS_ENV) or Path(CACHE) / "litmus" / "chaos-charts").expanduser()


def chart_path(fault: FaultSpec, charts: Path | None = None) -> Path | None:
    """The chart's ``fault.yaml`` (None: the fault names no chart). A name is
    ``<charts>/faults/kubernetes/<name>/fault.yaml``; a relative path is under ``<charts>``."""
    lit = fault.litmus
    if lit is None or lit.chart is None:
        return None
    charts = charts or charts_dir()
    name = lit.chart_name()
    if name is not None:
        return charts / "faults" / "kubernetes" / name / "fault.yaml"
    p = Path(lit.chart).expanduser()
    return p if p.is_absolute() else charts / p


def load_chart(path: Path, experiment: str) -> dict:
    """The chart's ChaosExperiment (one line of FaultError when it is missing, unreadable, or another one)."""
    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    except FileNotFoundError:
        raise FaultError(f"chart {path} not found: {CHARTS_HINT}") from None
    except (OSError, yaml.YAMLError) as e:
        raise FaultError(f"chart {path}: unreadable ({type(e).__name__}: {str(e).splitlines()[0][:160]})") from None
    exps = [d for d in docs if isinstance(d, dict) and d.get("kind") == "ChaosExperiment"]
    if not exps:
        raise FaultError(f"chart {path}: no ChaosExperiment in it")
    x = exps[0]
    name = (x.get("metadata") or {}).get("name")
    if name != experiment:
        raise FaultError(f"chart {path} is ChaosExperiment {name!r}, not {experiment!r} (litmus.experiment)")
    if not isinstance((x.get("spec") or {}).get("definition"), dict):
        raise FaultError(f"chart {path}: ChaosExperiment {name} has no spec.definition")
    return x


def chart_experiment(chart: dict, namespace: str, run_id: str) -> dict:
    """The chart's ChaosExperiment as applied here: unchanged but for its image (the one built here, not pulled),
    its namespace and the run's labels on its metadata."""
    x = copy.deepcopy(chart)
    meta = x.setdefault("metadata", {})
    meta["namespace"] = namespace
    meta["labels"] = {**(meta.get("labels") or {}), **_labels(run_id)}
    d = x["spec"]["definition"]
    d["image"], d["imagePullPolicy"] = EXPERIMENT_IMAGE, "IfNotPresent"
    return x


def own_experiment(name: str, namespace: str, run_id: str) -> dict:
    """monsoon's ChaosExperiment for litmus-go's ``experiments -name <name>`` in the image built here."""
    group, version = LITMUS
    return {"apiVersion": f"{group}/{version}", "kind": "ChaosExperiment",
            "metadata": {"name": name, "namespace": namespace, "labels": _labels(run_id)},
            "spec": {"definition": {
                "scope": "Namespaced", "permissions": RULES, "image": EXPERIMENT_IMAGE,
                "imagePullPolicy": "IfNotPresent", "command": ["/usr/local/bin/experiments"],
                "args": ["-name", name],
                "env": [{"name": k, "value": v} for k, v in (
                    ("TOTAL_CHAOS_DURATION", "15"), ("RAMP_TIME", ""), ("FORCE", "true"), ("CHAOS_INTERVAL", "5"),
                    ("PODS_AFFECTED_PERC", ""), ("TARGET_CONTAINER", ""), ("TARGET_PODS", ""),
                    ("DEFAULT_HEALTH_CHECK", "false"), ("NODE_LABEL", ""), ("SEQUENCE", "parallel"),
                    # litmus-go 3.18.0 built against chaos-operator 3.18.0 links both gnostic packages, whose
                    # extension.proto clash at init ("already registered": a panic before main)
                    ("GOLANG_PROTOBUF_REGISTRATION_CONFLICT", "warn"))],
                # the runner adds chaosUID to these (a nil map would panic it) and puts them on the Job
                "labels": {"name": name, "app.kubernetes.io/part-of": "litmus",
                           "app.kubernetes.io/component": "experiment-job", "app.kubernetes.io/version": VERSION,
                           **_labels(run_id)}}}}


def pod_delete_experiment(namespace: str, run_id: str) -> dict:
    """The ``pod-delete`` ChaosExperiment monsoon writes (no chart named)."""
    return own_experiment(EXPERIMENT, namespace, run_id)


def rbac(name: str, namespace: str, run_id: str, rules: list[dict] | None = None) -> list[dict]:
    """ServiceAccount, Role and RoleBinding ``name`` in ``namespace`` (the engine's ``chaosServiceAccount``)."""
    meta = {"name": name, "namespace": namespace, "labels": _labels(run_id)}
    return [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta,
             "rules": rules or RULES},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
             "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]}]


# ---------------------------------------------------------------------------------------------- refusals

def image_tools(h: Path | None = None) -> set[str] | None:
    """The helper tools in the experiment image this machine built (None: Litmus is not built here)."""
    h = h or built.home()
    if not (h / "BUILT").is_file():
        return None
    have = {"experiments"} | ({"helpers"} if (h / "bin" / "helpers").is_file() else set())
    files = h / "helper-tools" / "files"
    img = h / "images" / "litmus-go.tar"
    try:
        if files.is_file() and img.is_file() and img.stat().st_mtime >= files.stat().st_mtime:
            have |= {os.path.basename(line.split("=", 1)[0]) for line in files.read_text().splitlines() if "=" in line}
    except OSError:
        pass
    return have


def refusal(fault: FaultSpec, *, where: bool | None = None, h: Path | None = None,
            charts: Path | None = None) -> str | None:
    """One line refusing a litmus fault this cluster cannot serve (None: it can). Always: network experiments
    (tc in the helper image and the kernel's sch_netem), a signal container-kill does not send. When the cluster is
    this machine's (``where``, default :func:`~monsoon.faults.kube.local_cluster`): a helper tool missing from the
    image built here, and a chart that is not there or is another experiment."""
    exp = experiment_of(fault)
    if fault.kind in LATENCY_KINDS or exp.startswith(NETWORK_PREFIXES):
        why = netem_missing()
        return (f"{fault.name}: litmus {exp} needs tc in its helper image (monsoon's image has none) and the kernel "
                f"module sch_netem ({why or 'present here'}): refused before the load; delay the hop through "
                f"Toxiproxy instead (backend: toxiproxy)")
    sig = getattr(fault.params, "signal", "SIGKILL")
    if exp == "container-kill" and sig not in ("SIGKILL", "SIGTERM"):
        return (f"{fault.name}: litmus container-kill sends SIGKILL or SIGTERM only, not {sig}: "
                f"refused before the load")
    local = local_cluster() if where is None else where
    if not local:
        return None
    have = image_tools(h)
    if have is not None:
        lack = [t for t in HELPER_TOOLS.get(exp, ()) if t not in have]
        if lack:
            return (f"{fault.name}: litmus {exp}'s helper pod needs {', '.join(lack)} in {EXPERIMENT_IMAGE}, which "
                    f"this build lacks: run tools/build-litmus (helpers) and tools/build-litmus-helpers <test-tools> "
                    f"(github.com/litmuschaos/test-tools at {VERSION}); refused before the load")
    path = chart_path(fault, charts)
    if path is not None:
        try:
            load_chart(path, exp)
        except FaultError as e:
            return f"{fault.name}: litmus {e}; refused before the load"
    return None


# ---------------------------------------------------------------------------------------- memory usage (pure)

def summary_usage(summary: dict, namespace: str, pods: Iterable[str], container: str | None) -> dict[str, int]:
    """``pod/container`` -> memory usage bytes from kubelet's ``/stats/summary`` (the containers of ``pods``)."""
    want = set(pods)
    out: dict[str, int] = {}
    for p in summary.get("pods") or []:
        ref = p.get("podRef") or {}
        if ref.get("namespace") != namespace or ref.get("name") not in want:
            continue
        for c in p.get("containers") or []:
            if container and c.get("name") != container:
                continue
            mem = c.get("memory") or {}
            v = mem.get("usageBytes", mem.get("workingSetBytes"))
            if v is not None:
                out[f"{ref['name']}/{c.get('name')}"] = int(v)
    return out


def cgroup_usage(container_id: str, root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """The memory usage of a container's cgroup on this node (cgroupfs driver: ``.../pod<uid>/<id>``; v1's memory
    hierarchy or v2), None when it is not found."""
    cid = container_id.split("://", 1)[-1]
    for base, usage in ((root / "memory", "memory.usage_in_bytes"), (root, "memory.current")):
        for top in ("kubepods", "kubepods.slice"):
            d = base / top
            if not d.is_dir():
                continue
            for dirpath, dirnames, _ in os.walk(d):
                if os.path.basename(dirpath) in (cid, f"cri-containerd-{cid}.scope"):
                    try:
                        return int((Path(dirpath) / usage).read_text().split()[0])
                    except (OSError, ValueError, IndexError):
                        return None
                dirnames[:] = [x for x in dirnames if x.startswith(("pod", "kubepods", "besteffort", "burstable"))
                               or cid in x]
    return None


def hog_effect(before: dict[str, int], samples: list[tuple[float, dict[str, int]]], hog_mb: int,
               fraction: float = HOG_LANDED_FRACTION) -> tuple[bool, dict]:
    """pod-memory-hog by its effect: a target container's memory usage up by at least ``fraction`` of the hog
    over its usage before the inject, in some sample of the window."""
    mib = 1 << 20
    peak: dict[str, int] = {}
    for _, use in samples:
        for key, v in use.items():
            peak[key] = max(peak.get(key, 0), v)
    rise = {key: round((peak[key] - before.get(key, peak[key])) / mib, 1) for key in peak if key in before}
    need = round(hog_mb * fraction, 1)
    hit = sorted(key for key, r in rise.items() if r >= need)
    return bool(hit), {"usage_before_mb": {key: round(v / mib, 1) for key, v in before.items()},
                       "usage_peak_mb": {key: round(v / mib, 1) for key, v in peak.items()},
                       "rise_mb": rise, "rise_needed_mb": need, "hogged": hit,
                       "samples": [[round(t, 1), {key: round(v / mib, 1) for key, v in use.items()}]
                                   for t, use in samples]}


class LitmusBackend(KubeBackend):
    """``KubeBackend("litmus")`` with the engine's ServiceAccount, RBAC and ChaosExperiment, its ChaosResult as
    evidence, and its runner pod and Job polled gone at the heal."""

    def __init__(self, allowed_namespaces: Iterable[str], **kw: Any):
        super().__init__("litmus", allowed_namespaces, **kw)

    # ---------------------------------------------------------------- objects besides the engine
    def _core_api(self):
        if self._core is None:
            self._core = kube_client(FaultError).CoreV1Api()
        return self._core

    def _batch(self):
        return kube_client(FaultError).BatchV1Api()

    def _extras(self, engine: dict, run_id: str, fault: FaultSpec | None = None) -> list[dict]:
        """The engine's ServiceAccount, Role (the chart's permissions, else monsoon's) and RoleBinding, and the
        ChaosExperiment: the chart's (unchanged but for its image) or monsoon's own."""
        ns = engine["metadata"]["namespace"]
        exp = engine["spec"]["experiments"][0]["name"]
        path = chart_path(fault) if fault is not None else None
        if path is None:
            x, rules = own_experiment(exp, ns, run_id), None
        else:
            assert fault is not None    # a chart path is only looked up for a fault
            try:
                x = chart_experiment(load_chart(path, exp), ns, run_id)
            except FaultError as e:
                raise FaultError(f"{fault.name}: litmus {e}") from None
            rules = [r for r in x["spec"]["definition"].get("permissions") or [] if isinstance(r, dict)] or None
        return [*rbac(engine["spec"]["chaosServiceAccount"], ns, run_id, rules), x]

    def _op(self, verb: str, o: dict) -> Any:
        """create/delete one extra object (409 on create and 404 on delete are fine)."""
        ns, name, kind = o["metadata"]["namespace"], o["metadata"]["name"], o["kind"]
        try:
            if kind == "ServiceAccount":
                api = self._core_api()
                return (api.create_namespaced_service_account(ns, o) if verb == "create"
                        else api.delete_namespaced_service_account(name, ns))
            group, version, plural = EXTRA_KINDS[kind]
            fn = getattr(self._custom(), f"{verb}_namespaced_custom_object")
            return fn(group, version, ns, plural, o) if verb == "create" else fn(group, version, ns, plural, name)
        except Exception as e:   # kubernetes.client.ApiException
            if getattr(e, "status", None) != (409 if verb == "create" else 404):
                raise
            return None

    def _result(self, engine: dict) -> dict:
        """The engine's ChaosResult: ``{name, phase, verdict}`` (``present: False`` when there is none yet)."""
        group, version = LITMUS
        name = f"{engine['metadata']['name']}-{engine['spec']['experiments'][0]['name']}"
        try:
            r = self._custom().get_namespaced_custom_object(group, version, engine["metadata"]["namespace"],
                                                            "chaosresults", name)
        except Exception as e:
            if getattr(e, "status", None) != 404:
                return {"name": name, "unreadable": f"{type(e).__name__}: {str(e)[:200]}"}
            return {"name": name, "present": False}
        st = (r.get("status") or {}).get("experimentStatus") or {}
        return {"name": name, "phase": st.get("phase"), "verdict": st.get("verdict"),
                "fail_step": st.get("failStep") or None}

    def _chaos_pods_and_jobs(self, ns: str, uid: str) -> list[str]:
        sel = f"chaosUID={uid}"
        pods = self._core_api().list_namespaced_pod(ns, label_selector=sel, _request_timeout=10).items
        jobs = self._batch().list_namespaced_job(ns, label_selector=sel, _request_timeout=10).items
        return [f"pod/{p.metadata.name}" for p in pods] + [f"job/{j.metadata.name}" for j in jobs]

    # ---------------------------------------------------------------- the fault's life
    def inject(self, fault: FaultSpec, ctx: FaultContext) -> Handle:
        why = refusal(fault, where=self.apply and local_cluster())
        if why:
            raise FaultError(why)
        if not self.apply:
            return super().inject(fault, ctx)
        engine = render(one_window(fault), ctx.run_id, self.allowed)[0]
        extras = self._extras(engine, ctx.run_id, fault)
        hog = engine["spec"]["experiments"][0]["name"] == "pod-memory-hog"
        before = self._usage(fault) if hog else None      # the target's memory before the engine exists
        for o in extras:
            self._op("create", o)
        try:
            handle = super().inject(fault, ctx)
        except BaseException:
            for o in reversed(extras):
                self._op("delete", o)
            raise
        handle.data["extras"] = extras
        if hog:        # judged on memory usage, not on an OOM kill (chaos-mesh's StressChaos judgement)
            handle.data.pop("containers_before", None)
            handle.data["usage_before"] = before
        live = self._get(engine) or {}
        handle.data["engine_uid"] = (live.get("metadata") or {}).get("uid")
        return handle

    def _usage(self, fault: FaultSpec) -> dict[str, Any]:
        """``pod/container`` -> memory usage bytes of the target's containers, and where it was read: this node's
        cgroups when the cluster is monsoon's, else kubelet's /stats/summary through the API server."""
        k = kube_target(fault)
        pods = self._live_pods(fault)
        if local_cluster():
            out = {}
            for p in pods:
                for cs in p.status.container_statuses or []:
                    if (k.container and cs.name != k.container) or not cs.container_id:
                        continue
                    v = cgroup_usage(cs.container_id)
                    if v is not None:
                        out[f"{p.metadata.name}/{cs.name}"] = v
            if out:
                return {"via": "cgroup", "usage": out}
        nodes = sorted({p.spec.node_name for p in pods if p.spec.node_name})
        out = {}
        for n in nodes:
            raw = self._core_api().connect_get_node_proxy_with_path(n, "stats/summary", _request_timeout=10)
            doc = raw if isinstance(raw, dict) else yaml.safe_load(raw)
            out.update(summary_usage(doc, k.namespace, [p.metadata.name for p in pods], k.container))
        return {"via": "stats/summary", "usage": out}

    def _hog_effect(self, handle: Handle) -> tuple[bool, dict]:
        """Sample the target's memory usage through the window until it is up by half the hog (or the window and
        a margin are over)."""
        fault = handle.fault
        before = handle.data.get("usage_before") or {}
        hog = int(getattr(fault.params, "hog_mb", 0) or 0)
        bound = min(fault.schedule.duration + 15.0, 110.0)
        t0 = self.clock()
        samples: list[tuple[float, dict[str, int]]] = []

        def probe() -> tuple[bool, dict]:
            samples.append((self.clock() - t0, self._usage(fault)["usage"]))
            return hog_effect(before.get("usage") or {}, samples, hog)
        landed, ev, polls, waited = self._poll(probe, bound)
        return landed, {**ev, "via": before.get("via"), "effect_polls": polls, "effect_waited_s": waited}

    def heal(self, handle: Handle) -> None:
        if not handle.data.get("dry_run"):
            # the experiment's own end (its TOTAL_CHAOS_DURATION is the window's) is near: give its ChaosResult up
            # to RESULT_WAIT_S to leave Running, so the verdict recorded is the experiment's, then stop it
            _, res, _, waited = self._poll(
                lambda: (str((r := self._result(handle.data["objects"][0])).get("phase") or "").lower()
                         not in ("running", "", "none"), r), min(self.heal_timeout, RESULT_WAIT_S))
            handle.data["result_at_heal"] = {**res, "waited_s": waited}
        super().heal(handle)

    def verify(self, handle: Handle) -> Landing:
        landing = super().verify(handle)
        if handle.data.get("dry_run"):
            return landing
        engine = handle.data["objects"][0]
        ev = dict(landing.evidence or {})
        landed = landing.landed
        if not handle.healed:
            if "usage_before" in handle.data:      # pod-memory-hog: the engine runs; its effect is the memory
                effect, more = self._hog_effect(handle)
                ev.update(more, method="api+memory-usage", experiment_running=landed)
                landed = bool(effect) if landed is not False else False
                if not effect:
                    ev["not_landed"] = (f"no target container's memory usage rose by "
                                        f"{more.get('rise_needed_mb')} MiB during the window")
            ev["chaosresult"] = self._result(engine)
            return Landing(landed, ev)
        ev["chaosresult"] = handle.data.get("result_at_heal")
        if "usage_before" in handle.data:         # pod-memory-hog: the memory back down once its engine is gone
            try:
                after = self._usage(handle.fault)["usage"]
                ev["usage_after_heal_mb"] = {key: round(v / (1 << 20), 1) for key, v in after.items()}
            except Exception as e:   # kubernetes.client.ApiException, OSError: evidence, not the verdict
                ev["usage_after_heal_mb"] = f"unreadable: {type(e).__name__}"
        if landed is False and ev.get("deletion_pending"):     # the operator did not remove its finalizer
            self._patch(engine, {"metadata": {"finalizers": None}})
            ev["finalizer_removed"] = FINALIZER
            gone, more = self._await_gone([engine])
            ev.update(more, finalizer_removed=FINALIZER)
            landed = gone
        uid, ns = handle.data.get("engine_uid"), engine["metadata"]["namespace"]
        if uid:   # the runner pod and the experiment's Job go with the engine (the operator deletes them)
            done, left, polls, waited = self._poll(lambda: (not (x := self._chaos_pods_and_jobs(ns, uid)), x),
                                                   self.heal_timeout)
            ev["runner_and_job_left"] = left
            ev["runner_and_job_waited_s"] = waited
            landed = bool(landed) and done
        res = handle.data.get("result_at_heal") or {}
        extras = [*handle.data.get("extras", []),
                  {"kind": "ChaosResult", "metadata": {"namespace": ns, "name": res.get("name", "")}}]
        for o in reversed(extras):
            if o["metadata"]["name"]:
                self._op("delete", o)
        ev["deleted_with_it"] = [f"{o['kind']}/{o['metadata']['name']}" for o in extras if o["metadata"]["name"]]
        return Landing(landed, ev)

    # ---------------------------------------------------------------- runs left in place (heal --all, census)
    def _extras_listed(self, run_id: str | None) -> list[dict]:
        """The run's Roles, RoleBindings, ChaosExperiments and ChaosResults by their label, and the
        ServiceAccounts its RoleBindings name (the API's generic path lists the first four)."""
        if not self.apply:
            return []
        sel = RUN_LABEL if run_id is None else f"{RUN_LABEL}={run_id}"
        out: list[dict] = []
        for ns in self.allowed:
            for kind, (group, version, plural) in EXTRA_KINDS.items():
                try:
                    items = self._custom().list_namespaced_custom_object(group, version, ns, plural,
                                                                         label_selector=sel).get("items", [])
                except Exception as e:
                    if getattr(e, "status", None) != 404:
                        raise
                    items = []
                for x in items:
                    out.append({"kind": kind, "metadata": x["metadata"]})
                    if kind == "RoleBinding":
                        out += [{"kind": "ServiceAccount", "metadata": {"name": sub["name"], "namespace": ns,
                                                                        "labels": x["metadata"].get("labels")}}
                                for sub in x.get("subjects") or [] if sub.get("kind") == "ServiceAccount"]
        return out

    def run_ids(self) -> set[str]:
        return super().run_ids() | {rid for o in self._extras_listed(None)
                                    if (rid := (o["metadata"].get("labels") or {}).get(RUN_LABEL))}

    def heal_all(self, run_id: str) -> list[str]:
        done = super().heal_all(run_id)
        for o in self._extras_listed(run_id):
            self._op("delete", o)
            done.append(f"{o['kind']} {o['metadata']['namespace']}/{o['metadata']['name']} deleted")
        return done

    def census(self, run_id: str) -> list[str]:
        return super().census(run_id) + [f"{o['kind']} {o['metadata']['namespace']}/{o['metadata']['name']}"
                                         for o in self._extras_listed(run_id)]


def charts_skip_reason(charts: tuple[str, ...] = ("pod-delete", "container-kill", "pod-memory-hog"),
                       h: Path | None = None) -> str | None:
    """Why the chart scenarios cannot run here (one line, saying how to get what is missing), or None."""
    why = built.skip_reason()
    if why:
        return why
    have = image_tools(h) or set()
    lack = sorted({t for c in charts for t in HELPER_TOOLS.get(c, ()) if t not in have})
    if lack:
        return (f"Litmus {VERSION}'s image lacks the helper tools {', '.join(lack)}: run tools/build-litmus (helpers) "
                f"and tools/build-litmus-helpers with github.com/litmuschaos/test-tools at {VERSION}")
    d = charts_dir()
    miss = [c for c in charts if not (d / "faults" / "kubernetes" / c / "fault.yaml").is_file()]
    if miss:
        return f"chaos-charts not fetched ({d} has no faults/kubernetes/{miss[0]}/fault.yaml): {CHARTS_HINT}"
    return None


def judge_effect(experiment: str, evidence: dict, hog_mb: int | None = None) -> tuple[bool, str]:
    """An inject's landing judged again from its recorded evidence (a kept run): pod-delete by a new pod UID,
    container-kill by the same pod's container under a new ID with more restarts, pod-memory-hog by the memory
    rise its samples show. (landed, one line saying why)."""
    ev = evidence or {}
    if experiment == "pod-delete":
        uids, new, killed = set(ev.get("uids_before") or []), ev.get("new_uids") or [], ev.get("killed_uids") or []
        ok = bool(killed) and bool(new) and uids.isdisjoint(new) and set(killed) <= uids
        return ok, f"pod UIDs {sorted(uids)} -> killed {killed}, new {new}"
    if experiment == "container-kill":
        rs = [r for r in ev.get("restarted") or []
              if r.get("id") and r.get("id") != r.get("id_before") and r.get("restarts", 0) > r.get("restarts_before", 0)
              and r.get("uid") in (ev.get("same_uids") or [r.get("uid")])]
        return bool(rs), "; ".join(f"{r['pod']}/{r['container']} restarts {r['restarts_before']}->{r['restarts']}, "
                                   f"id {str(r['id_before'])[-12:]}->{str(r['id'])[-12:]}" for r in rs) or "no restart"
    if experiment == "pod-memory-hog":
        mib = 1 << 20
        before = {k: int(v * mib) for k, v in (ev.get("usage_before_mb") or {}).items()}
        samples = [(t, {k: int(v * mib) for k, v in use.items()}) for t, use in ev.get("samples") or []]
        need = hog_mb if hog_mb is not None else int(round(float(ev.get("rise_needed_mb") or 0) / HOG_LANDED_FRACTION))
        ok, more = hog_effect(before, samples, need)
        return ok and need > 0, f"memory rise {more['rise_mb']} MiB (needed {more['rise_needed_mb']})"
    return False, f"no effect judgement for {experiment}"
