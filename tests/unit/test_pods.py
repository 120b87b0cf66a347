"""Stacks in Kubernetes form (provider: kubernetes): the spec, the Deployments rendered from it, how a pod's
instance is judged ended, and the refusal of a NetworkChaos delay on a kernel without sch_netem. Pure logic:
no cluster (tests/integration/test_kubernetes_story.py runs them on one)."""
import gzip
import textwrap
from pathlib import Path

import pytest

from monsoon.faults.kube import kernel_refusal, netem_missing
from monsoon.spec.fault import FaultSpec
from monsoon.spec.stack import load_stack
from monsoon.spec.yamlio import SpecError
from monsoon.stack.pods import (deployment_manifest, image_ref, judge, k8s_quantity, namespace_manifest,
                                readiness_probe)
from monsoon.stack.reaper import RUN_LABEL


def render_of(ports):
    def r(v: str) -> str:
        for k, p in ports.items():
            v = v.replace("{port:" + k + "}", str(p))
        return v
    return r


def test_the_kubernetes_stacks_name_their_namespace_and_watch_the_platform_pod():
    for name, ns in (("inmemory-k8s", "monsoon-inmemory-k8s"), ("kafka-k8s", "monsoon-kafka-k8s")):
        s = load_stack(name)
        assert s.pods() == list(s.services) and s.kube_namespace() == ns
        # filled in: no_oom reads the platform pod's lastState.terminated.reason
        assert s.observe.kubernetes.namespace == ns
        assert s.observe.kubernetes.label_selector == {"monsoon.io/service": "platform"}


def test_a_deployment_from_the_inmemory_stack_has_the_limit_probe_and_restart_policy(tmp_path):
    s = load_stack("inmemory-k8s")
    svc = s.services["platform"]
    ports = {"mqtt": 1883, "http": 18080, "postgres": 15432}
    d = deployment_manifest(namespace=s.kube_namespace(), run_id="r-1", service="platform", image=svc.image,
                            command=list(svc.command), env={"TB_QUEUE_TYPE": "in-memory"}, workdir=tmp_path,
                            mem_limit=svc.mem_limit_for("quick"), probe=readiness_probe(svc.ready, render_of(ports)))
    assert d["kind"] == "Deployment" and d["spec"]["replicas"] == 1 and d["spec"]["strategy"]["type"] == "Recreate"
    pod = d["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert pod["restartPolicy"] == "Always" and pod["hostNetwork"] is True
    assert c["imagePullPolicy"] == "Never" and c["image"] == "monsoon/platform"
    assert c["resources"]["limits"]["memory"] == "200Mi"
    assert c["readinessProbe"]["httpGet"] == {"host": "127.0.0.1", "port": 18080, "path": "/health", "scheme": "HTTP"}
    assert d["spec"]["template"]["metadata"]["labels"][RUN_LABEL] == "r-1"
    assert d["spec"]["selector"]["matchLabels"] == {RUN_LABEL: "r-1", "monsoon.io/service": "platform"}
    assert {"name": "TB_QUEUE_TYPE", "value": "in-memory"} in c["env"]
    assert any(e["name"] == "MONSOON_POD_UID" and e["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.uid"
               for e in c["env"])
    assert c["workingDir"] == str(tmp_path) and pod["volumes"][0]["hostPath"]["path"] == str(tmp_path)
    ns = namespace_manifest("monsoon-inmemory-k8s", "r-1", owner_pid=42)
    assert ns["metadata"]["labels"][RUN_LABEL] == "r-1" and ns["metadata"]["labels"]["monsoon.io/owner-pid"] == "42"


def test_probes_quantities_and_image_references():
    from monsoon.spec.stack import ReadySpec
    r = render_of({"kafka": 9092})
    assert readiness_probe(ReadySpec(tcp="127.0.0.1:{port:kafka}"), r)["tcpSocket"] == {"host": "127.0.0.1",
                                                                                          "port": 9092}
    assert readiness_probe(ReadySpec(log="started"), r) is None
    assert readiness_probe(None, r) is None
    assert (k8s_quantity("256m"), k8s_quantity("1g"), k8s_quantity("1000k")) == ("256Mi", "1024Mi", "1024000")
    assert image_ref("monsoon/platform") == "docker.io/monsoon/platform:latest"
    assert image_ref("busybox:1") == "docker.io/library/busybox:1"
    assert image_ref("registry.k8s.io/pause:3.6") == "registry.k8s.io/pause:3.6"


def pod(uid, restarts, state=None, last=None, deleting=False):
    meta = {"uid": uid, "name": "platform-abc"}
    if deleting:
        meta["deletionTimestamp"] = "2026-11-26T18:00:00Z"
    return {"metadata": meta, "status": {"containerStatuses": [
        {"name": "platform", "restartCount": restarts, "state": state or {"running": {}}, "lastState": last or {}}]}}


def test_an_instance_ends_by_a_kubelet_restart_a_termination_or_its_pod_going():
    inst = ("u1", 0)
    assert judge(pod("u1", 0), inst, "platform") is None
    oom = judge(pod("u1", 1, last={"terminated": {"exitCode": 137, "reason": "OOMKilled",
                                                  "finishedAt": "2026-11-26T18:00:01Z"}}), inst, "platform")
    assert (oom["exit_code"], oom["oom_killed"], oom["reason"]) == (137, 1, "OOMKilled")
    crash = judge(pod("u1", 0, state={"terminated": {"exitCode": 1, "reason": "Error"}}), inst, "platform")
    assert (crash["exit_code"], crash["oom_killed"]) == (1, 0)
    backoff = judge(pod("u1", 0, state={"waiting": {"reason": "CrashLoopBackOff"}},
                        last={"terminated": {"exitCode": 137, "reason": "OOMKilled"}}), inst, "platform")
    assert (backoff["exit_code"], backoff["oom_killed"]) == (137, 1)
    for gone in (judge(None, inst, "platform"), judge(pod("u1", 0, deleting=True), inst, "platform")):
        assert (gone["exit_code"], gone["reason"]) == (137, "pod deleted")


def write_stack(tmp_path, body):
    p = tmp_path / "s.yaml"
    p.write_text(textwrap.dedent("""\
        name: s
        provider: kubernetes
        services:
        """) + body + textwrap.dedent("""\
        devices: {port: "{port:mqtt}"}
        provisioning: none
        storage: {dsn: "postgresql://x@127.0.0.1:{port:pg}/p", loss_query: "SELECT 1"}
        observe: {service: platform}
        """))
    return p


@pytest.mark.parametrize("body, key, words", [
    ("  platform:\n    command: [x, '{port:mqtt}', '{port:pg}']\n", "services.platform", "needs image"),
    ("  Platform_1:\n    image: i\n    command: [x, '{port:mqtt}', '{port:pg}']\n", "services.Platform_1",
     "DNS label"),
])
def test_a_bad_kubernetes_service_names_file_line_and_key(tmp_path, body, key, words):
    with pytest.raises(SpecError) as e:
        load_stack(write_stack(tmp_path, body))
    assert e.value.key.startswith(key) and words in str(e.value) and e.value.line is not None
    assert "\n" not in str(e.value)


def test_a_bad_namespace_names_its_line(tmp_path):
    p = write_stack(tmp_path, "  platform:\n    image: i\n    command: [x, '{port:mqtt}', '{port:pg}']\n")
    p.write_text(p.read_text().replace("provider: kubernetes\n", "provider: kubernetes\nkubernetes: {namespace: Bad_NS}\n"))
    with pytest.raises(SpecError) as e:
        load_stack(p)
    assert (e.value.line, e.value.key) == (3, "kubernetes.namespace") and "Bad_NS" in str(e.value)


def kernel(tmp_path: Path, config: str | None, modules: str = "") -> dict:
    cfg = tmp_path / "config.gz"
    if config is not None:
        with gzip.open(cfg, "wt") as f:
            f.write(config)
    (tmp_path / "modules").write_text(modules)
    (tmp_path / "lib").mkdir(exist_ok=True)
    return {"config": str(cfg), "modules": str(tmp_path / "modules"), "lib_modules": str(tmp_path / "lib")}


def latency_fault():
    return FaultSpec(name="delay", kind="network-latency", backend="chaos-mesh",
                     target={"namespace": "monsoon-kafka-k8s", "labelSelector": {"monsoon.io/service": "platform"}},
                     params={"latency_ms": 200, "jitter_ms": 10}, schedule={"at": 5, "duration": 20})


def test_network_chaos_delay_is_refused_in_one_line_naming_sch_netem_when_the_kernel_lacks_it(tmp_path):
    where = kernel(tmp_path, "CONFIG_NET_SCH_TBF=y\n# CONFIG_NET_SCH_NETEM is not set\n")
    line = kernel_refusal(latency_fault(), **where)
    assert line and "sch_netem" in line and "\n" not in line and line.startswith("delay:")
    # a pod kill needs no kernel module
    kill = FaultSpec(name="k", kind="pod-kill", backend="chaos-mesh", target=latency_fault().target.kube.model_dump(
        by_alias=True), schedule={"at": 5, "duration": 5})
    assert kernel_refusal(kill, **where) is None


@pytest.mark.parametrize("config, modules, lib_file", [
    ("CONFIG_NET_SCH_NETEM=y\n", "", None),                                   # built in
    ("CONFIG_NET_SCH_NETEM=m\n", "sch_netem 24576 0 - Live 0x0\n", None),     # loaded
    (None, "", "kernel/net/sched/sch_netem.ko.xz"),                           # on disk, loadable
])
def test_netem_is_found_built_in_loaded_or_on_disk(tmp_path, config, modules, lib_file):
    where = kernel(tmp_path, config, modules)
    if lib_file:
        f = tmp_path / "lib" / lib_file
        f.parent.mkdir(parents=True)
        f.write_bytes(b"")
    assert netem_missing(**where) is None
    assert kernel_refusal(latency_fault(), **where) is None


class FakeCore:
    """list_namespace / read_namespace / delete_namespace over a dict of namespaces (name -> labels)."""

    def __init__(self, namespaces):
        self.ns = dict(namespaces)

    def list_namespace(self, label_selector, **_):
        key, _, value = label_selector.partition("=")
        items = [{"metadata": {"name": n, "labels": lab}, "status": {"phase": "Active"}} for n, lab in self.ns.items()
                 if key in lab and (not value or lab[key] == value)]
        return type("L", (), {"items": items})()

    def read_namespace(self, name, **_):
        if name not in self.ns:
            raise type("E", (Exception,), {"status": 404})()
        return {"metadata": {"name": name, "labels": self.ns[name]}}

    def delete_namespace(self, name, **_):
        self.ns.pop(name, None)


def test_reap_deletes_the_namespaces_of_one_run_and_heal_all_sees_their_owners(monkeypatch):
    from monsoon.stack import pods
    core = FakeCore({"monsoon-kafka-k8s": {RUN_LABEL: "r-dead", "monsoon.io/owner-pid": "999999999"},
                     "monsoon-inmemory-k8s": {RUN_LABEL: "r-live", "monsoon.io/owner-pid": "1"},
                     "kube-system": {}})
    kube = pods.Kube.__new__(pods.Kube)
    kube.core, kube.plain = core, (lambda o: o)
    monkeypatch.setattr(pods, "_kube_or_none", lambda: kube)
    assert pods.namespace_owners() == {"r-dead": 999999999, "r-live": 1}
    assert pods.namespace_census("r-dead") == ["namespace monsoon-kafka-k8s (Active)"]
    assert pods.reap_namespaces("r-dead") == ["monsoon-kafka-k8s"]
    assert set(core.ns) == {"monsoon-inmemory-k8s", "kube-system"} and pods.namespace_census("r-dead") == []


def test_heal_all_on_a_cluster_without_litmus_finds_nothing_of_it_and_does_not_fail():
    """monsoon's own cluster serves Chaos Mesh's CRDs only: listing ChaosEngines answers 404 (no such resource).
    That is "none there" for the census and heal --all, not an error (it made heal --all exit 1)."""
    from kubernetes.client.exceptions import ApiException

    from monsoon.faults.kube import KubeBackend

    class NoLitmus:
        def list_namespaced_custom_object(self, group, version, namespace, plural, **kw):
            if group == "litmuschaos.io":
                raise ApiException(status=404, reason="Not Found")
            return {"items": []}

    class Broken:
        def list_namespaced_custom_object(self, *a, **kw):
            raise ApiException(status=403, reason="Forbidden")

    for flavor in ("litmus", "chaos-mesh"):
        be = KubeBackend(flavor, ["iot"], apply=True)
        be._api = NoLitmus()
        assert be.census("r1") == [] and be.heal_all("r1") == [] and be.run_ids() == set()
    be = KubeBackend("litmus", ["iot"], apply=True)
    be._api = Broken()
    with pytest.raises(ApiException):                # anything else still says so
        be.census("r1")


# ------------------------------------------------------------------ the session's cluster: released after its last user

SESSION_CONFTEST = '''
import contextlib, os
import pytest
from monsoon.stack import pods

LOG = []

@contextlib.contextmanager
def fake_cluster(namespaces):
    saved = os.environ.get("KUBECONFIG")
    LOG.append("up")
    os.environ["KUBECONFIG"] = "/fake/kubeconfig"
    try:
        yield "cluster"
    finally:
        LOG.append("down")
        if saved is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = saved

pods.cluster_for_stacks = fake_cluster

@pytest.fixture(scope="module")
def kube(request):
    c = pods.cluster_for_session(request.config, ("ns-" + request.module.__name__[-1],))
    yield c
    LOG.append("module-teardown:" + request.module.__name__)   # while the cluster still runs
'''


def _restored_after(monkeypatch) -> None:
    """The inner session's conftest replaces pods.cluster_for_stacks (and cluster.running) in this process: put
    them back after the test, or every later test of this session would get the fake cluster."""
    from monsoon.stack import cluster, pods

    monkeypatch.setattr(pods, "cluster_for_stacks", pods.cluster_for_stacks)
    monkeypatch.setattr(cluster, "running", cluster.running)


def test_the_session_cluster_stops_after_the_last_test_that_needs_it_and_gives_the_env_back(pytester, monkeypatch):
    """Two modules in a row that use it (marked kubernetes, or importing cluster_for_session) share one cluster; the unmarked module after them runs without it (the
    environment put back); a marked module later starts it again; the session's end stops that one."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("MONSOON_KUBE_NAMESPACES", raising=False)
    _restored_after(monkeypatch)
    pytester.makeconftest(SESSION_CONFTEST)
    marked = '''
import os, pytest
from conftest import LOG
pytestmark = pytest.mark.kubernetes
def test_one(kube):
    LOG.append("test:" + __name__)
    assert os.environ["KUBECONFIG"] == "/fake/kubeconfig"
def test_two(kube):
    assert LOG[0] == "up" and LOG.count("up") - LOG.count("down") == 1
'''
    # test_b is not marked: that it imports cluster_for_session says it uses the cluster
    unmarked = marked.replace("pytestmark = pytest.mark.kubernetes",
                              "from monsoon.stack.pods import cluster_for_session  # noqa: F401")
    pytester.makepyfile(test_a=marked, test_b=unmarked, test_d=marked, test_c='''
import os
from conftest import LOG
def test_without(request):
    assert "KUBECONFIG" not in os.environ and "MONSOON_KUBE_NAMESPACES" not in os.environ
    assert LOG == ["up", "test:test_a", "module-teardown:test_a", "test:test_b", "module-teardown:test_b", "down"]
''', test_e='''
from conftest import LOG
def test_last():
    assert LOG[-3:] == ["test:test_d", "module-teardown:test_d", "down"]
''')
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=8)


def test_a_session_cluster_taken_down_since_is_started_again_for_the_next_module(pytester, monkeypatch):
    """A module whose last test takes the cluster down (a test of `cluster down`) does not hand a dead cluster to
    the next module that asks: it is released and started again."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    _restored_after(monkeypatch)
    pytester.makeconftest(SESSION_CONFTEST.replace('yield "cluster"', 'yield pods.Cluster(Path("/fake"))').replace(
        "import contextlib, os", "import contextlib, os\nfrom pathlib import Path\nRUNNING = [True]") + '''
pods.cluster.running = lambda c=None: RUNNING[0]
''')
    first = '''
import pytest
from conftest import LOG, RUNNING
pytestmark = pytest.mark.kubernetes
def test_takes_it_down(kube):
    RUNNING[0] = False
'''
    pytester.makepyfile(test_a=first, test_b='''
import pytest
from conftest import LOG, RUNNING
pytestmark = pytest.mark.kubernetes
def test_gets_a_new_one(kube):
    assert LOG == ["up", "module-teardown:test_a", "down", "up"]
''')
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)
