"""Whether a Kubernetes cluster is configured, and its API client: read by the faults (Chaos Mesh, Litmus), the
collectors (pod restarts) and ``monsoon heal``, so it lives below them all."""
from __future__ import annotations

import os
from pathlib import Path


def cluster_configured() -> bool:
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return True
    kc = os.environ.get("KUBECONFIG")
    paths = kc.split(os.pathsep) if kc else [str(Path.home() / ".kube" / "config")]
    return any(Path(p).is_file() for p in paths if p)


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
        config.load_kube_config()
    return client
