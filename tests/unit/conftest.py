"""Unit tests run with no cluster configured, whatever ran before them in the same session and whatever the shell
exports.

The Kubernetes integration modules point KUBECONFIG and MONSOON_KUBE_NAMESPACES at monsoon's cluster while they
run (`pods.cluster_for_session`) and put them back after the last of them; a KUBECONFIG in the user's shell would
still reach a unit test that reads it. A unit test that needs either sets it itself."""
import pytest


@pytest.fixture(autouse=True)
def _no_cluster_from_the_session(monkeypatch):
    for name in ("KUBECONFIG", "MONSOON_KUBE_NAMESPACES", "KUBERNETES_SERVICE_HOST"):
        monkeypatch.delenv(name, raising=False)
