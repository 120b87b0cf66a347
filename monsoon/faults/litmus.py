"""Litmus for real: what a ChaosEngine needs besides itself, and its landing and heal judged on the cluster.

:class:`LitmusBackend` is :class:`~monsoon.faults.kube.KubeBackend` ("litmus") plus, in the fault's namespace and
labelled with the run (``monsoon.io/run-id``):

* a ServiceAccount, Role and RoleBinding named as the engine (``chaosServiceAccount``; namespaced rights only, no
  cluster-scoped object), and the ``pod-delete`` ChaosExperiment whose image is the one ``tools/build-litmus``
  made (:data:`monsoon.stack.litmus.EXPERIMENT_IMAGE`, ``imagePullPolicy: IfNotPresent``: no registry here);
* evidence: the ChaosResult's ``experimentStatus.phase`` and ``verdict`` at the inject's check and again just
  before the heal (Litmus sets the verdict to Pass right after injecting, before its post-checks: a verdict is
  evidence, not proof; the kill lands by its effect, a new pod UID, as Chaos Mesh's does);
* the heal: ``engineState: stop``, the engine deleted, then the runner pod and the experiment's Job (label
  ``chaosUID``) polled until gone, and the ServiceAccount, Role, RoleBinding, ChaosExperiment and ChaosResult
  deleted. An engine stuck in deletion (its finalizer needs the operator, which may be gone) gets its finalizers
  removed, and the evidence says so.

Only ``pod-delete`` (pod-kill) has an experiment here; the other Litmus kinds need helper images (tc,
stress-ng) monsoon does not build: refused in one line, before anything is created.
"""
from __future__ import annotations

from typing import Any, Iterable

from monsoon.faults.base import FaultContext, FaultError, Handle, Landing
from monsoon.faults.kube import LITMUS, KubeBackend, kube_client, one_window, render
from monsoon.spec.fault import FaultSpec
from monsoon.stack.litmus import EXPERIMENT_IMAGE, VERSION
from monsoon.stack.reaper import RUN_LABEL, check_run_id
from monsoon.timeline.views import KILL_KINDS

EXPERIMENT = "pod-delete"
FINALIZER = "chaosengine.litmuschaos.io/finalizer"
RESULT_WAIT_S = 30.0
# the rights pod-delete uses in its namespace (upstream's experiment RBAC, namespaced): pods, their owners, its
# own Litmus objects, events
RULES = [
    {"apiGroups": [""], "resources": ["pods", "pods/log", "events", "configmaps", "secrets", "services"],
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


def pod_delete_experiment(namespace: str, run_id: str) -> dict:
    """The ``pod-delete`` ChaosExperiment: litmus-go's ``experiments -name pod-delete`` in the image built here."""
    group, version = LITMUS
    return {"apiVersion": f"{group}/{version}", "kind": "ChaosExperiment",
            "metadata": {"name": EXPERIMENT, "namespace": namespace, "labels": _labels(run_id)},
            "spec": {"definition": {
                "scope": "Namespaced", "permissions": RULES, "image": EXPERIMENT_IMAGE,
                "imagePullPolicy": "IfNotPresent", "command": ["/usr/local/bin/experiments"],
                "args": ["-name", EXPERIMENT],
                "env": [{"name": k, "value": v} for k, v in (
                    ("TOTAL_CHAOS_DURATION", "15"), ("RAMP_TIME", ""), ("FORCE", "true"), ("CHAOS_INTERVAL", "5"),
                    ("PODS_AFFECTED_PERC", ""), ("TARGET_CONTAINER", ""), ("TARGET_PODS", ""),
                    ("DEFAULT_HEALTH_CHECK", "false"), ("NODE_LABEL", ""), ("SEQUENCE", "parallel"),
                    # litmus-go 3.18.0 built against chaos-operator 3.18.0 links both gnostic packages, whose
                    # extension.proto clash at init ("already registered": a panic before main)
                    ("GOLANG_PROTOBUF_REGISTRATION_CONFLICT", "warn"))],
                # the runner adds chaosUID to these (a nil map would panic it) and puts them on the Job
                "labels": {"name": EXPERIMENT, "app.kubernetes.io/part-of": "litmus",
                           "app.kubernetes.io/component": "experiment-job", "app.kubernetes.io/version": VERSION,
                           **_labels(run_id)}}}}


def rbac(name: str, namespace: str, run_id: str) -> list[dict]:
    """ServiceAccount, Role and RoleBinding ``name`` in ``namespace`` (the engine's ``chaosServiceAccount``)."""
    meta = {"name": name, "namespace": namespace, "labels": _labels(run_id)}
    return [{"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": meta, "rules": RULES},
            {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": meta,
             "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
             "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": namespace}]}]


def refusal(fault: FaultSpec) -> str | None:
    if fault.kind in KILL_KINDS:
        return None
    return (f"{fault.name}: litmus {fault.kind} needs litmus-go's helper image (tc, stress-ng), which monsoon does "
            f"not build; only pod-delete (pod-kill) runs here: use backend chaos-mesh or a local backend")


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

    def _extras(self, engine: dict, run_id: str) -> list[dict]:
        ns = engine["metadata"]["namespace"]
        return [*rbac(engine["spec"]["chaosServiceAccount"], ns, run_id), pod_delete_experiment(ns, run_id)]

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
        name = f"{engine['metadata']['name']}-{EXPERIMENT}"
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
        why = refusal(fault)
        if why:
            raise FaultError(why)
        if not self.apply:
            return super().inject(fault, ctx)
        engine = render(one_window(fault), ctx.run_id, self.allowed)[0]
        extras = self._extras(engine, ctx.run_id)
        for o in extras:
            self._op("create", o)
        try:
            handle = super().inject(fault, ctx)
        except BaseException:
            for o in reversed(extras):
                self._op("delete", o)
            raise
        handle.data["extras"] = extras
        live = self._get(engine) or {}
        handle.data["engine_uid"] = (live.get("metadata") or {}).get("uid")
        return handle

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
            ev["chaosresult"] = self._result(engine)
            return Landing(landed, ev)
        ev["chaosresult"] = handle.data.get("result_at_heal")
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
