"""Whether a Kubernetes cluster is configured, and its API client: read by the faults (Chaos Mesh, Litmus), the
collectors (pod restarts) and ``monsoon heal``, so it lives below them all."""
from __future__ import annotations

import os
from pathlib import Path

from monsoon.stack.cluster import Cluster


def env_kubeconfig() -> Path | None:
    """KUBECONFIG's first file, None when KUBECONFIG is unset."""
    kc = os.environ.get("KUBECONFIG")
    return Path(kc.split(os.pathsep)[0]) if kc else None


def kubeconfig_file() -> Path | None:
    """The kubeconfig the faults, the collectors and ``heal`` use: KUBECONFIG's first file; else, while monsoon's own
    cluster runs (``monsoon cluster up``), its kubeconfig, as the pods of ``provider: kubernetes`` use it
    (:func:`monsoon.stack.pods.kubeconfig_path`); else ``~/.kube/config`` when there; else None."""
    named = env_kubeconfig()
    if named is not None:
        return named
    own = Cluster()
    if own.api_port() is not None and own.kubeconfig.is_file():
        return own.kubeconfig
    home = Path.home() / ".kube" / "config"
    return home if home.is_file() else None


def cluster_configured() -> bool:
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return True
    kc = os.environ.get("KUBECONFIG")
    if kc:
        return any(Path(p).is_file() for p in kc.split(os.pathsep) if p)
    return kubeconfig_file() is not None


def kube_client(error: type[Exception] = RuntimeError):
    """The ``kubernetes.client`` module, configured in-cluster or from the kubeconfig."""
    try:
        # optional dependency (extra "kube"): the Kubernetes client, needed only when a cluster is configured
        from kubernetes import client, config
    except ImportError:
        raise error("a Kubernetes cluster is configured but the Python client is missing: "
                    "pip install kubernetes") from None
    try:
        config.load_incluster_config()
    except config.ConfigException:
        # KUBECONFIG as the client reads it (several files merged); else the file kubeconfig_file finds
        own = None if os.environ.get("KUBECONFIG") else kubeconfig_file()
        config.load_kube_config(config_file=str(own) if own else None)
    return client
