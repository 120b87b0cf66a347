"""monsoon's single-node Kubernetes cluster for real (make k8s; monsoon cluster up|down): the node gets Ready, a
Deployment's pod runs and comes back with a new UID when deleted, a pod over its 32Mi limit is OOMKilled (exit 137),
Chaos Mesh's controller kills a pod for a PodChaos that monsoon's chaos-mesh backend creates and heals. One cluster
for this module and test_kubernetes_story.py, which runs right after it (the name keeps them adjacent: the session
stops the cluster after the last test marked kubernetes in a row, and test_kubernetes_story.py's last tests take it
down and check that down leaves nothing behind)."""
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from monsoon.faults.base import FaultContext
from monsoon.faults.kube import KubeBackend
from monsoon.spec.fault import FaultSpec
from monsoon.stack import cluster
from monsoon.stack.pods import ClusterUnavailable, cluster_for_session

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes]

NS = "monsoon-it"


def wait(what, probe, timeout=90.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        v = probe()
        if v:
            return v
        time.sleep(0.5)
    pytest.fail(f"{what}: not within {timeout:.0f}s")


@pytest.fixture(scope="module")
def kube(request):
    t0 = time.monotonic()
    try:
        c = cluster_for_session(request.config, (NS,))
    except ClusterUnavailable as e:
        pytest.skip(str(e))
    print(f"\ncluster (Chaos Mesh included) ready in {time.monotonic() - t0:.1f}s")
    api = c.api()
    api.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})
    try:
        yield c, api, None
    finally:
        api.call("DELETE", f"/api/v1/namespaces/{NS}?gracePeriodSeconds=0")


def pods(api, selector: str) -> list[dict]:
    code, body = api.call("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector={selector}")
    assert code == 200, body
    return body["items"]


def running_uid(api, selector: str, not_uid: str | None = None) -> str | None:
    for p in pods(api, selector):
        if (p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
                and p["metadata"]["uid"] != not_uid):
            return p["metadata"]["uid"]
    return None


def test_node_ready_and_kubectl_reaches_it(kube):
    c, api, _ = kube
    assert cluster.node_ready(api)
    rss = sum(int(ln.split()[1]) for p in cluster._tagged(c.dir)
              for ln in Path(f"/proc/{p}/status").read_text().splitlines() if ln.startswith("VmRSS:"))
    print(f"cluster idle RSS (daemons, shims, forwarder): {rss / 1024:.0f} MB")
    if shutil.which("kubectl"):
        out = subprocess.run(["kubectl", "--kubeconfig", str(c.kubeconfig), "get", "nodes", "-o", "name"],
                             capture_output=True, text=True, timeout=30)
        assert out.stdout.strip() == f"node/{cluster.NODE}", out.stderr
    assert {"registry.k8s.io/pause:3.6", "monsoon.local/busybox:1"} <= {i.split("docker.io/")[-1] for i in c.images()}


def test_forward_mirrors_a_port_bound_inside_the_namespace(kube):
    """What hostNetwork pods bind is on the namespace's loopback: c.forward() reaches it from the host's."""
    c, _, _ = kube
    port = 18089
    server = subprocess.Popen([*c.nsenter_prefix(), sys.executable, "-m", "http.server", str(port), "--bind",
                               "127.0.0.1", "--directory", str(c.dir / "pki")],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with c.forward([port]) as fwd:
            assert list(fwd.ports) == [port]

            def fetch():
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/ca.crt", timeout=2) as r:
                        return r.read()
                except OSError:
                    return None
            body = wait("the server inside the namespace, through the forwarder", fetch, 30)
            assert body == (c.dir / "pki" / "ca.crt").read_bytes()
        assert not fwd.alive()
    finally:
        server.kill()
        server.wait()


def deployment(name: str) -> dict:
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}}, "spec": {
                         "terminationGracePeriodSeconds": 1,
                         "containers": [{"name": "main", "image": cluster.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
                                         "command": ["sleep", "3600"]}]}}}}


def test_deployment_pod_runs_and_a_deleted_pod_comes_back_with_a_new_uid(kube):
    _, api, _ = kube
    code, body = api.call("POST", f"/apis/apps/v1/namespaces/{NS}/deployments", deployment("sleeper"))
    assert code == 201, body
    uid = wait("the Deployment's pod Running", lambda: running_uid(api, "app=sleeper"))
    (pod,) = [p for p in pods(api, "app=sleeper") if p["metadata"]["uid"] == uid]
    assert pod["status"]["podIP"].startswith("10.244.0.")          # from the CNI bridge, not hostNetwork
    code, _ = api.call("DELETE", f"/api/v1/namespaces/{NS}/pods/{pod['metadata']['name']}")
    assert code == 200
    new = wait("a replacement pod Running", lambda: running_uid(api, "app=sleeper", not_uid=uid))
    assert new != uid


def test_pod_over_its_memory_limit_is_oom_killed(kube):
    _, api, _ = kube
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hog", "namespace": NS, "labels": {"app": "hog"}},
           "spec": {"restartPolicy": "Never", "containers": [{
               "name": "main", "image": cluster.BUSYBOX_IMAGE, "imagePullPolicy": "Never",
               "command": ["tail", "/dev/zero"], "resources": {"limits": {"memory": "32Mi"}}}]}}
    code, body = api.call("POST", f"/api/v1/namespaces/{NS}/pods", pod)
    assert code == 201, body

    def terminated():
        (p,) = pods(api, "app=hog")
        st = (p["status"].get("containerStatuses") or [{}])[0].get("state", {})
        return st.get("terminated")
    t = wait("the pod over 32Mi terminated", terminated)
    assert (t["reason"], t["exitCode"]) == ("OOMKilled", 137)


def test_chaos_mesh_pod_kill_lands_and_heals(kube, monkeypatch):
    c, api, _ = kube
    monkeypatch.setenv("KUBECONFIG", str(c.kubeconfig))
    # Chaos Mesh's `mode: one` picks among every pod the selector matches, a Terminating one too (seen here: it
    # "killed" the pod the previous test deleted, and nothing was replaced): wait until only the live one is left
    uid = wait("one sleeper pod, Running",
               lambda: len(pods(api, "app=sleeper")) == 1 and running_uid(api, "app=sleeper"))
    fault = FaultSpec(name="kill-sleeper", kind="pod-kill", backend="chaos-mesh",
                      target={"namespace": NS, "labelSelector": {"app": "sleeper"}}, params={},
                      schedule={"at": 0, "duration": 10})
    backend = KubeBackend("chaos-mesh", [NS], inject_timeout=60, heal_timeout=60, poll_interval=0.5)
    assert backend.apply, "KUBECONFIG set: the backend must apply, not render dry"
    handle = backend.inject(fault, FaultContext(run_id="cluster-it"))
    try:
        landing = backend.verify(handle)
        assert landing.landed is not False, landing.evidence
        # landed by its effect: the controller deleted the pod and the Deployment made a new one
        new = wait("a new pod after the PodChaos", lambda: running_uid(api, "app=sleeper", not_uid=uid))
        assert new != uid
    finally:
        backend.heal(handle)
    healed = backend.verify(handle)
    assert healed.landed is True, healed.evidence
    code, body = api.call("GET", f"/apis/chaos-mesh.org/v1alpha1/namespaces/{NS}/podchaos")
    assert code == 200 and body["items"] == []
