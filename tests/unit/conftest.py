"""Unit tests run with no cluster configured, whatever ran before them in the same session.

`make test` runs `pytest tests`: the integration modules first, and the Kubernetes ones hold monsoon's cluster for
the whole session (`pods.cluster_for_session`), with KUBECONFIG and MONSOON_KUBE_NAMESPACES pointed at it until the
session ends. A unit test that needs either sets it itself."""
import pytest


@pytest.fixture(autouse=True)
def _no_cluster_from_the_session(monkeypatch):
    for name in ("KUBECONFIG", "MONSOON_KUBE_NAMESPACES", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
