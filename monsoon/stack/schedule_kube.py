"""``monsoon schedule --target kubernetes --install|--uninstall``: the scheduled run's CronJob, and the
ServiceAccount/Role/RoleBinding its pod reads the CronJob's events with, created in (or removed from) the cluster
through the Python client (KUBECONFIG, else monsoon's own cluster). Rendering is
:mod:`monsoon.history.schedule`'s; this is the part that talks to the API server."""
from __future__ import annotations

from typing import Any, Callable

from monsoon.stack.pods import PodError, api_client


def _apis(client: Any) -> dict[str, Any]:
    # optional dependency (extra "kube"): api_client() has said so in one line when it is missing
    from kubernetes import client as k
    return {"batch": k.BatchV1Api(client), "core": k.CoreV1Api(client), "rbac": k.RbacAuthorizationV1Api(client)}


_CALLS = {   # kind -> (api, create, read, replace, delete) method names
    "CronJob": ("batch", "create_namespaced_cron_job", "read_namespaced_cron_job", "replace_namespaced_cron_job",
                "delete_namespaced_cron_job"),
    "ServiceAccount": ("core", "create_namespaced_service_account", "read_namespaced_service_account",
                       "replace_namespaced_service_account", "delete_namespaced_service_account"),
    "Role": ("rbac", "create_namespaced_role", "read_namespaced_role", "replace_namespaced_role",
             "delete_namespaced_role"),
    "RoleBinding": ("rbac", "create_namespaced_role_binding", "read_namespaced_role_binding",
                    "replace_namespaced_role_binding", "delete_namespaced_role_binding"),
}


def apply(objs: list[dict], client: Any = None, say: Callable[[str], None] = lambda s: None) -> list[str]:
    """Create each object, or replace it when it is there already; ``Kind/namespace/name`` of each."""
    # optional dependency (extra "kube"): api_client() has said so in one line when it is missing
    from kubernetes.client.rest import ApiException
    apis = _apis(client or api_client())
    done = []
    for obj in objs:
        api, create, read, replace, _ = _CALLS[obj["kind"]]
        ns, name = obj["metadata"]["namespace"], obj["metadata"]["name"]
        try:
            getattr(apis[api], create)(ns, obj)
            verb = "created"
        except ApiException as e:
            if e.status != 409:
                raise PodError(f"creating {obj['kind']} {ns}/{name}: {e.status} {e.reason}") from None
            cur = getattr(apis[api], read)(name, ns)
            body = {**obj, "metadata": {**obj["metadata"], "resourceVersion": cur.metadata.resource_version}}
            getattr(apis[api], replace)(name, ns, body)
            verb = "replaced"
        done.append(f"{obj['kind']}/{ns}/{name}")
        say(f"{verb} {obj['kind']} {ns}/{name}")
    return done


def uninstall(name: str, namespace: str, client: Any = None, say: Callable[[str], None] = lambda s: None) \
        -> list[str]:
    """Delete schedule ``name``'s CronJob (its Jobs and their pods with it: background propagation) and its
    ServiceAccount, Role and RoleBinding; ``Kind/namespace/name`` of each that was there."""
    # optional dependency (extra "kube"): api_client() has said so in one line when it is missing
    from kubernetes.client.rest import ApiException
    apis = _apis(client or api_client())
    gone = []
    for kind in ("CronJob", "RoleBinding", "Role", "ServiceAccount"):
        api, *_, delete = _CALLS[kind]
        try:
            getattr(apis[api], delete)(f"monsoon-{name}", namespace, propagation_policy="Background")
        except ApiException as e:
            if e.status == 404:
                continue
            raise PodError(f"deleting {kind} {namespace}/monsoon-{name}: {e.status} {e.reason}") from None
        gone.append(f"{kind}/{namespace}/monsoon-{name}")
        say(f"deleted {kind} {namespace}/monsoon-{name}")
    # the Jobs the controller made (and any made from its template) carry the schedule's label
    jobs = apis["batch"].list_namespaced_job(namespace, label_selector=f"monsoon.io/schedule={name}")
    for j in jobs.items:
        try:
            apis["batch"].delete_namespaced_job(j.metadata.name, namespace, propagation_policy="Background")
        except ApiException as e:
            if e.status != 404:
                raise PodError(f"deleting Job {namespace}/{j.metadata.name}: {e.status} {e.reason}") from None
    return gone
