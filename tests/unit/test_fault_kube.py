"""Chaos Mesh / Litmus rendering: kinds, fields, run-id labels, namespace allow-list, dry-run files."""
import yaml
import pytest

from monsoon.faults.base import FaultContext, FaultError
from monsoon.faults.kube import RUN_LABEL, KubeBackend, NamespaceNotAllowed, render, to_yaml
from monsoon.faults.spec import FaultSpec

SEL = {"namespace": "iot", "labelSelector": {"app": "hono-adapter", "tier": "edge"}}


def spec(kind, backend, params, repeat=None, target=SEL):
    return FaultSpec(name=f"{kind}-x", kind=kind, target=target, backend=backend, params=params,
                     schedule={"at": 5, "duration": 60, "repeat_every": repeat})


def test_pod_kill_podchaos():
    (o,) = render(spec("pod-kill", "chaos-mesh", {}), "run-1", ["iot"])
    assert (o["apiVersion"], o["kind"]) == ("chaos-mesh.org/v1alpha1", "PodChaos")
    assert o["metadata"]["namespace"] == "iot" and o["metadata"]["labels"][RUN_LABEL] == "run-1"
    assert o["spec"]["action"] == "pod-kill"
    assert o["spec"]["selector"] == {"namespaces": ["iot"], "labelSelectors": {"app": "hono-adapter", "tier": "edge"}}


def test_network_delay_and_memory_stress():
    (n,) = render(spec("mongo-slowdown", "chaos-mesh", {"latency_ms": 250, "jitter_ms": 30}), "r", ["iot"])
    assert n["kind"] == "NetworkChaos" and n["spec"]["action"] == "delay"
    assert n["spec"]["delay"] == {"latency": "250ms", "jitter": "30ms", "correlation": "0"}
    assert n["spec"]["duration"] == "60s"
    (m,) = render(spec("memory-pressure", "chaos-mesh", {"hog_mb": 512, "workers": 2}), "r", ["iot"])
    assert m["kind"] == "StressChaos" and m["spec"]["stressors"]["memory"] == {"workers": 2, "size": "512MB"}


def test_repeating_fault_becomes_a_schedule():
    (s,) = render(spec("pod-kill", "chaos-mesh", {}, repeat=600), "r", ["iot"])
    assert s["kind"] == "Schedule" and s["spec"]["type"] == "PodChaos"
    assert s["spec"]["schedule"] == "@every 600s" and s["spec"]["podChaos"]["action"] == "pod-kill"
    assert s["metadata"]["labels"][RUN_LABEL] == "r"


@pytest.mark.parametrize("kind,params,exp,env", [
    ("pod-kill", {}, "pod-delete", {"TOTAL_CHAOS_DURATION": "60", "FORCE": "true"}),
    ("network-latency", {"latency_ms": 200, "jitter_ms": 20}, "pod-network-latency",
     {"NETWORK_LATENCY": "200", "JITTER": "20"}),
    ("memory-pressure", {"hog_mb": 300}, "pod-memory-hog", {"MEMORY_CONSUMPTION": "300", "NUMBER_OF_WORKERS": "1"}),
])
def test_litmus_chaosengine(kind, params, exp, env):
    (o,) = render(spec(kind, "litmus", params), "run-7", ["iot"])
    assert (o["apiVersion"], o["kind"]) == ("litmuschaos.io/v1alpha1", "ChaosEngine")
    assert o["metadata"]["labels"][RUN_LABEL] == "run-7"
    assert o["spec"]["appinfo"] == {"appns": "iot", "applabel": "app=hono-adapter,tier=edge", "appkind": "deployment"}
    (e,) = o["spec"]["experiments"]
    got = {x["name"]: x["value"] for x in e["spec"]["components"]["env"]}
    assert e["name"] == exp and env.items() <= got.items()
    assert all(isinstance(x["value"], str) for x in e["spec"]["components"]["env"])


@pytest.mark.parametrize("backend", ["chaos-mesh", "litmus"])
def test_namespace_allow_list(backend):
    f = spec("pod-kill", backend, {})
    with pytest.raises(NamespaceNotAllowed, match="'iot' is not on the allow-list"):
        render(f, "r", ["staging"])
    with pytest.raises(NamespaceNotAllowed, match="empty"):
        render(f, "r", [])
    assert render(f, "r", ["staging", "iot"])


def test_names_are_dns_safe_and_yaml_round_trips():
    objs = render(spec("infinispan-slowdown", "chaos-mesh", {"latency_ms": 5}), "20250101-120000-ab12", ["iot"])
    name = objs[0]["metadata"]["name"]
    assert len(name) <= 63 and name == name.lower() and "_" not in name
    assert list(yaml.safe_load_all(to_yaml(objs))) == objs


def test_dry_run_backend_writes_yaml_and_reports_unmeasured(tmp_path):
    be = KubeBackend("chaos-mesh", ["iot"], out_dir=tmp_path, apply=False)
    h = be.inject(spec("network-latency", "chaos-mesh", {"latency_ms": 100}), FaultContext(run_id="r9"))
    files = list((tmp_path / "kube").glob("*.yaml"))
    assert len(files) == 1
    (o,) = yaml.safe_load_all(files[0].read_text())
    assert o["kind"] == "NetworkChaos" and o["metadata"]["labels"][RUN_LABEL] == "r9"
    land = be.verify(h)
    assert land.landed is None and land.evidence["method"] == "dry-run"
    be.heal(h)
    assert be.census("r9") == [] and be.heal_all("r9") == []


def test_dry_run_backend_still_enforces_the_allow_list(tmp_path):
    be = KubeBackend("litmus", ["staging"], out_dir=tmp_path, apply=False)
    with pytest.raises(NamespaceNotAllowed):
        be.inject(spec("pod-kill", "litmus", {}), FaultContext(run_id="r9"))
    assert not (tmp_path / "kube").exists()


# ---- what the manifest contract test (tests/integration/test_manifest_contract.py) found

def test_network_chaos_has_no_container_names_and_delays_egress():
    """NetworkChaos has no containerNames field (a pod's containers share one network namespace)."""
    target = dict(SEL, container="app")
    (n,) = render(spec("network-latency", "chaos-mesh", {"latency_ms": 100}, target=target), "r", ["iot"])
    assert "containerNames" not in n["spec"] and n["spec"]["direction"] == "to"
    (s,) = render(spec("network-latency", "chaos-mesh", {"latency_ms": 100}, repeat=600, target=target), "r", ["iot"])
    assert "containerNames" not in s["spec"]["networkChaos"]
    (m,) = render(spec("memory-pressure", "chaos-mesh", {"hog_mb": 64}, target=target), "r", ["iot"])
    assert m["spec"]["containerNames"] == ["app"]          # StressChaos does have it


@pytest.mark.parametrize("stream", ["upstream", "both"])
def test_chaos_mesh_refuses_latency_into_the_selected_pods(stream):
    """Without a target selector Chaos Mesh's webhook rejects direction from/both: say so before applying."""
    with pytest.raises(FaultError, match="select the client pods instead"):
        render(spec("mongo-slowdown", "chaos-mesh", {"latency_ms": 100, "stream": stream}), "r", ["iot"])


def test_long_fault_names_give_valid_distinct_labels_and_names():
    a, b = ("x" * 60 + "-mongo-slowdown-of-the-registry", "x" * 60 + "-mongo-slowdown-of-the-adapter")
    (oa,) = render(FaultSpec(name=a, kind="pod-kill", target=SEL, backend="chaos-mesh", schedule={"duration": 5}),
                   "r", ["iot"])
    (ob,) = render(FaultSpec(name=b, kind="pod-kill", target=SEL, backend="chaos-mesh", schedule={"duration": 5}),
                   "r", ["iot"])
    for o, full in ((oa, a), (ob, b)):
        assert len(o["metadata"]["labels"]["monsoon.io/fault"]) <= 63 and len(o["metadata"]["name"]) <= 63
        assert o["metadata"]["annotations"]["monsoon.io/fault"] == full
    assert oa["metadata"]["name"] != ob["metadata"]["name"]
    assert oa["metadata"]["labels"]["monsoon.io/fault"] != ob["metadata"]["labels"]["monsoon.io/fault"]
    (short,) = render(spec("pod-kill", "chaos-mesh", {}), "r", ["iot"])
    assert "annotations" not in short["metadata"]


def test_litmus_engine_has_what_its_crd_requires_and_whole_seconds():
    f = FaultSpec(name="k", kind="pod-kill", target=SEL, backend="litmus", schedule={"duration": 0.5})
    (o,) = render(f, "r", ["iot"])
    assert o["spec"]["components"] == {"runner": {}} and o["spec"]["experiments"][0]["spec"]["rank"] == 0
    env = {x["name"]: x["value"] for x in o["spec"]["experiments"][0]["spec"]["components"]["env"]}
    assert env["TOTAL_CHAOS_DURATION"] == "1" and env["CHAOS_INTERVAL"] == "1"   # not "0": no chaos at all


@pytest.mark.parametrize("seconds,text", [(60, "60s"), (0.5, "500ms"), (1.001, "1001ms"), (0.0001, "1ms")])
def test_go_durations_round_not_truncate(seconds, text):
    (o,) = render(FaultSpec(name="n", kind="network-latency", target=SEL, backend="chaos-mesh",
                            params={"latency_ms": 10}, schedule={"duration": seconds}), "r", ["iot"])
    assert o["spec"]["duration"] == text


def test_a_plan_window_applies_one_shot_objects_not_a_schedule(tmp_path):
    """FaultPlan heals each window by deleting its objects: a Schedule would never fire before that."""
    f = spec("pod-kill", "chaos-mesh", {}, repeat=600)
    h = KubeBackend("chaos-mesh", ["iot"], out_dir=tmp_path, apply=False).inject(f, FaultContext(run_id="r1"))
    assert [o["kind"] for o in h.data["objects"]] == ["PodChaos"]
    assert render(f, "r1", ["iot"])[0]["kind"] == "Schedule"   # the standalone rendering still repeats
