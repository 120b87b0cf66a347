"""Litmus beyond pod-delete, the pure parts: the profile's ``litmus:`` (a ChaosHub chart or a litmus-go experiment,
its env) validated with file/line/key errors, the chart applied unchanged but for its image, the engine's env
(containerd socket, helper image), the one-line refusals before the load, and pod-memory-hog's judgement."""
import textwrap
from pathlib import Path

import pytest
import yaml

from monsoon.faults.base import FaultError
from monsoon.faults.kube import render
from monsoon.faults.litmus import (HELPER_TOOLS, chart_experiment, chart_path, cgroup_usage, engine_experiment,
                                   hog_effect, image_tools, load_chart, refusal, summary_usage)
from monsoon.spec.fault import FaultSpec, load_fault
from monsoon.spec.yamlio import SpecError
from monsoon.stack import litmus

POD = {"namespace": "iot", "labelSelector": {"monsoon.io/service": "platform"}, "container": "platform"}
MIB = 1 << 20

# a chart shaped as chaos-charts' faults/kubernetes/<name>/fault.yaml (written here, not copied from upstream)
CHART = textwrap.dedent("""\
    ---
    apiVersion: litmuschaos.io/v1alpha1
    kind: ChaosExperiment
    metadata:
      name: container-kill
      labels: {name: container-kill, app.kubernetes.io/version: 3.18.0}
    spec:
      definition:
        scope: Namespaced
        permissions:
          - apiGroups: [""]
            resources: ["pods"]
            verbs: ["create", "delete", "get", "list"]
        image: "registry.example/litmuschaos/go-runner:3.18.0"
        imagePullPolicy: Always
        args: ["-c", "./experiments -name container-kill"]
        command: ["/bin/bash"]
        env:
          - {name: SOCKET_PATH, value: /run/containerd/containerd.sock}
          - {name: TOTAL_CHAOS_DURATION, value: "20"}
        labels: {name: container-kill, app.kubernetes.io/component: experiment-job}
    """)


def fault(kind="container-kill", params=None, lit=None, duration=30.0, **kw):
    return FaultSpec(name=f"{kind}-l", kind=kind, target=kw.pop("target", POD), backend=kw.pop("backend", "litmus"),
                     params=params or {}, schedule={"at": 10, "duration": duration}, litmus=lit, **kw)


def charts(tmp_path: Path, name="container-kill", text=CHART) -> Path:
    d = tmp_path / "chaos-charts" / "faults" / "kubernetes" / name
    d.mkdir(parents=True)
    (d / "fault.yaml").write_text(text)
    return tmp_path / "chaos-charts"


# ------------------------------------------------------------------------------------------ the profile field

def test_a_chart_name_picks_its_experiment_and_env_is_strings():
    f = fault(lit={"chart": "container-kill", "env": {"SIGNAL": "SIGTERM", "CHAOS_INTERVAL": 5, "X": True}})
    assert f.litmus.experiment_for(f.kind) == "container-kill"
    assert f.litmus.env == {"SIGNAL": "SIGTERM", "CHAOS_INTERVAL": "5", "X": "true"}


@pytest.mark.parametrize("lit,backend,needle", [
    ({"experiment": "pod-delete"}, "litmus", "container-kill runs Litmus experiment container-kill, not 'pod-delete'"),
    ({"experiment": "pod-exploder"}, "litmus", "unknown litmus-go experiment 'pod-exploder'"),
    ({"chart": "Container Kill"}, "litmus", "neither a chaos-charts fault name"),
    ({"env": {"TOTAL_CHAOS_DURATION": 9}}, "litmus", "TOTAL_CHAOS_DURATION is monsoon's to set"),
    ({"env": {"BAD-NAME": 1}}, "litmus", "not an environment variable name"),
    ({"chart": "container-kill", "image": "x"}, "litmus", "Extra inputs are not permitted"),
    ({"chart": "container-kill"}, "chaos-mesh", "litmus: is for backend litmus"),
])
def test_a_wrong_litmus_field_is_refused(lit, backend, needle):
    with pytest.raises(Exception, match=needle.replace("(", r"\(").replace(")", r"\)")):
        fault(lit=lit, backend=backend)


def test_an_error_in_a_profile_names_file_line_and_key(tmp_path):
    p = tmp_path / "container-kill-litmus.yaml"
    p.write_text(textwrap.dedent("""\
        name: ck
        kind: container-kill
        target: {namespace: iot, labelSelector: {app: x}, container: app}
        backend: litmus
        litmus:
          chart: container-kill
          env:
            LIB_IMAGE: mine
        schedule: {at: 5, duration: 20}
        """))
    with pytest.raises(SpecError) as e:
        load_fault(p)
    msg = str(e.value)
    assert msg.startswith(f"{p}:") and "litmus.env" in msg and "LIB_IMAGE" in msg and "\n" not in msg
    assert e.value.line in (5, 7, 8)


def test_a_variant_profile_file_carries_its_kind_as_prefix(tmp_path):
    p = tmp_path / "container-kill-litmus.yaml"
    p.write_text("name: ck\nkind: container-kill\ntarget: {namespace: iot, labelSelector: {a: b}}\n"
                 "backend: litmus\nschedule: {duration: 5}\n")
    assert load_fault(p).kind == "container-kill"
    q = tmp_path / "pod-kill-litmus.yaml"
    q.write_text(p.read_text())
    with pytest.raises(SpecError, match="must match the file name"):
        load_fault(q)


def test_the_shipped_litmus_profiles_validate():
    root = Path(__file__).resolve().parents[2]
    got = {p.name: load_fault(p) for p in sorted((root / "fault-profiles").glob("*litmus*.yaml"))}
    assert {"container-kill-litmus.yaml", "memory-pressure-litmus.yaml"} <= set(got)
    assert got["container-kill-litmus.yaml"].litmus.chart == "container-kill"
    assert got["memory-pressure-litmus.yaml"].litmus.experiment_for("memory-pressure") == "pod-memory-hog"


# ------------------------------------------------------------------------------------------ the engine's env

def test_container_kill_engine_env_names_the_runtime_socket_and_one_kill_a_window():
    f = fault(params={"signal": "SIGTERM"}, lit={"chart": "container-kill", "env": {"RAMP_TIME": "2"}})
    exp, env = engine_experiment(f, socket="/x/containerd/c.sock")
    assert exp == "container-kill"
    assert env["CONTAINER_RUNTIME"] == "containerd" and env["SOCKET_PATH"] == "/x/containerd/c.sock"
    assert (env["TOTAL_CHAOS_DURATION"], env["CHAOS_INTERVAL"], env["SIGNAL"]) == ("30", "30", "SIGTERM")
    assert env["TARGET_CONTAINER"] == "platform" and env["RAMP_TIME"] == "2"
    assert env["LIB_IMAGE"] == litmus.EXPERIMENT_IMAGE and env["LIB_IMAGE_PULL_POLICY"] == "IfNotPresent"


def test_the_profile_env_wins_over_monsoons_and_the_engine_runs_the_experiment():
    f = fault(lit={"chart": "container-kill", "env": {"SOCKET_PATH": "/run/k3s/containerd/containerd.sock"}})
    (engine,) = render(f, "r-1", ["iot"])
    (e,) = engine["spec"]["experiments"]
    env = {x["name"]: x["value"] for x in e["spec"]["components"]["env"]}
    assert e["name"] == "container-kill" and env["SOCKET_PATH"] == "/run/k3s/containerd/containerd.sock"


def test_memory_hog_engine_env():
    exp, env = engine_experiment(fault("memory-pressure", {"hog_mb": 200, "workers": 2}), socket="/s")
    assert exp == "pod-memory-hog" and (env["MEMORY_CONSUMPTION"], env["NUMBER_OF_WORKERS"]) == ("200", "2")
    assert env["CONTAINER_RUNTIME"] == "containerd" and env["SOCKET_PATH"] == "/s"
    _, pd = engine_experiment(fault("pod-kill"), socket="/s")
    assert "SOCKET_PATH" not in pd and pd["FORCE"] == "true"


# ------------------------------------------------------------------------------------------ the chart

def test_the_chart_is_applied_unchanged_but_for_its_image(tmp_path):
    c = charts(tmp_path)
    f = fault(lit={"chart": "container-kill"})
    path = chart_path(f, c)
    assert path == c / "faults/kubernetes/container-kill/fault.yaml"
    up = yaml.safe_load(CHART)
    x = chart_experiment(load_chart(path, "container-kill"), "iot", "r-1")
    d = x["spec"]["definition"]
    assert d["image"] == litmus.EXPERIMENT_IMAGE and d["imagePullPolicy"] == "IfNotPresent"
    for k in ("image", "imagePullPolicy"):
        d.pop(k)
        up["spec"]["definition"].pop(k)
    assert x["spec"] == up["spec"]                     # command, args, env, permissions, labels: upstream's
    assert x["metadata"]["namespace"] == "iot" and x["metadata"]["labels"]["monsoon.io/run-id"] == "r-1"
    assert x["metadata"]["name"] == "container-kill"


def test_a_chart_by_path_is_relative_to_the_charts_directory(tmp_path):
    c = charts(tmp_path)
    f = fault(lit={"chart": "faults/kubernetes/container-kill/fault.yaml"})
    assert chart_path(f, c).is_file()
    g = fault(lit={"chart": str(c / "faults/kubernetes/container-kill/fault.yaml")})
    assert chart_path(g, tmp_path / "elsewhere") == c / "faults/kubernetes/container-kill/fault.yaml"


# ------------------------------------------------------------------------------------------ refusals

def built(tmp_path: Path, tools: tuple[str, ...] = ()) -> Path:
    h = tmp_path / "litmus-build"
    (h / "bin").mkdir(parents=True)
    (h / "images").mkdir()
    (h / "BUILT").write_text("version=3.18.0\n")
    (h / "bin" / "helpers").write_text("x")
    if tools:
        (h / "helper-tools").mkdir()
        (h / "helper-tools" / "files").write_text("".join(f"usr/local/bin/{t}=/h/{t}\n" for t in tools))
    (h / "images" / "litmus-go.tar").write_text("tar")   # written after the list: it holds the tools
    return h


def test_a_helper_tool_the_build_lacks_is_refused_in_one_line(tmp_path):
    c = charts(tmp_path)
    f = fault(lit={"chart": "container-kill"})
    why = refusal(f, where=True, h=built(tmp_path), charts=c)
    assert why and "crictl, kubectl" in why and "tools/build-litmus-helpers" in why and "\n" not in why
    assert "before the load" in why


def test_with_its_tools_and_chart_container_kill_is_served(tmp_path):
    c = charts(tmp_path)
    h = built(tmp_path, ("crictl", "kubectl"))
    assert image_tools(h) >= {"helpers", "crictl", "kubectl", "experiments"}
    assert refusal(fault(lit={"chart": "container-kill"}), where=True, h=h, charts=c) is None
    hog = fault("memory-pressure", {"hog_mb": 100})
    assert "stress-ng" in refusal(hog, where=True, h=h, charts=c)
    assert set(HELPER_TOOLS["pod-memory-hog"]) >= {"pause", "nsutil", "stress-ng", "crictl"}


def test_a_missing_chart_or_another_experiment_is_refused_saying_how_to_fetch(tmp_path):
    h = built(tmp_path, ("crictl", "kubectl"))
    why = refusal(fault(lit={"chart": "container-kill"}), where=True, h=h, charts=tmp_path / "none")
    assert why and "not found" in why and "git clone --branch 3.18.0" in why and "chaos-charts" in why
    c = charts(tmp_path, "container-kill", CHART.replace("name: container-kill\n", "name: pod-delete\n", 1))
    why = refusal(fault(lit={"chart": "container-kill"}), where=True, h=h, charts=c)
    assert why and "is ChaosExperiment 'pod-delete', not 'container-kill'" in why


def test_off_this_machine_only_the_static_refusals_apply(tmp_path):
    assert refusal(fault(lit={"chart": "container-kill"}), where=False, charts=tmp_path / "none") is None
    with pytest.raises(FaultError, match="not found"):
        load_chart(tmp_path / "none.yaml", "container-kill")


def test_a_signal_container_kill_cannot_send_is_refused():
    why = refusal(fault(params={"signal": "SIGINT"}), where=False)
    assert why and "SIGKILL or SIGTERM" in why


# ------------------------------------------------------------------------------------------ pod-memory-hog's effect

def test_the_hog_lands_when_usage_rises_by_half_of_it():
    before = {"p/platform": 100 * MIB}
    samples = [(2.0, {"p/platform": 110 * MIB}), (4.0, {"p/platform": 260 * MIB}), (6.0, {"p/platform": 120 * MIB})]
    landed, ev = hog_effect(before, samples, 200)
    assert landed and ev["rise_mb"] == {"p/platform": 160.0} and ev["rise_needed_mb"] == 100.0
    assert ev["hogged"] == ["p/platform"] and len(ev["samples"]) == 3
    assert not hog_effect(before, samples[:1], 200)[0]
    assert not hog_effect({}, samples, 200)[0]          # nothing known before: no rise to judge


def test_summary_usage_reads_the_target_containers():
    doc = {"pods": [{"podRef": {"name": "p", "namespace": "iot"},
                     "containers": [{"name": "platform", "memory": {"usageBytes": 5, "workingSetBytes": 4}},
                                    {"name": "side", "memory": {"workingSetBytes": 7}}]},
                    {"podRef": {"name": "q", "namespace": "other"}, "containers": [{"name": "platform"}]}]}
    assert summary_usage(doc, "iot", ["p", "q"], "platform") == {"p/platform": 5}
    assert summary_usage(doc, "iot", ["p"], None) == {"p/platform": 5, "p/side": 7}


def test_cgroup_usage_finds_the_container_under_kubepods(tmp_path):
    d = tmp_path / "memory" / "kubepods" / "burstable" / "pod1234" / "abcdef"
    d.mkdir(parents=True)
    (d / "memory.usage_in_bytes").write_text("4096\n")
    assert cgroup_usage("containerd://abcdef", tmp_path) == 4096
    assert cgroup_usage("containerd://nope", tmp_path) is None
