"""Litmus's objects besides the ChaosEngine: the engine's ServiceAccount/Role/RoleBinding, the pod-delete
ChaosExperiment on the image tools/build-litmus makes, and the one-line refusal of kinds without an experiment."""
import pytest

from monsoon.faults.base import FaultContext, FaultError
from monsoon.faults.kube import render
from monsoon.faults.litmus import LitmusBackend, pod_delete_experiment, rbac, refusal
from monsoon.spec.fault import FaultSpec
from monsoon.stack import litmus
from monsoon.stack.reaper import RUN_LABEL

SEL = {"namespace": "iot", "labelSelector": {"monsoon.io/service": "platform"}}


def spec(kind, params=None):
    return FaultSpec(name=f"{kind}-x", kind=kind, target=SEL, backend="litmus", params=params or {},
                     schedule={"at": 5, "duration": 5})


def test_the_engine_runs_as_its_own_service_account_bound_to_a_namespaced_role():
    (engine,) = render(spec("pod-kill"), "run-3", ["iot"])
    sa_name = engine["spec"]["chaosServiceAccount"]
    assert sa_name == engine["metadata"]["name"]
    sa, role, binding = rbac(sa_name, "iot", "run-3")
    assert [o["kind"] for o in (sa, role, binding)] == ["ServiceAccount", "Role", "RoleBinding"]
    assert all(o["metadata"]["namespace"] == "iot" and o["metadata"]["labels"][RUN_LABEL] == "run-3"
               for o in (sa, role, binding))
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa_name}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": sa_name, "namespace": "iot"}]
    deletes = [r for r in role["rules"] if "pods" in r["resources"]]
    assert deletes and "delete" in deletes[0]["verbs"]


def test_pod_delete_experiment_runs_the_built_image_without_pulling():
    x = pod_delete_experiment("iot", "run-3")
    d = x["spec"]["definition"]
    assert (x["kind"], x["metadata"]["name"]) == ("ChaosExperiment", "pod-delete")
    assert d["image"] == litmus.EXPERIMENT_IMAGE and d["imagePullPolicy"] == "IfNotPresent"
    assert d["command"] == ["/usr/local/bin/experiments"] and d["args"] == ["-name", "pod-delete"]
    # the runner adds chaosUID to these labels (it panics on none) and copies them onto the Job
    assert d["labels"]["name"] == "pod-delete" and d["labels"][RUN_LABEL] == "run-3"


def test_network_experiments_are_refused_in_one_line_before_anything_is_made():
    assert refusal(spec("pod-kill")) is None
    why = refusal(spec("network-latency", {"latency_ms": 50}), where=False)
    assert why and "sch_netem" in why and "tc" in why and "toxiproxy" in why and "\n" not in why
    with pytest.raises(FaultError, match="pod-network-latency needs tc"):
        LitmusBackend(["iot"], apply=False).inject(spec("network-latency", {"latency_ms": 50}),
                                                   FaultContext(run_id="r"))


def test_dry_run_writes_the_engine_alone(tmp_path):
    be = LitmusBackend(["iot"], out_dir=tmp_path, apply=False)
    h = be.inject(spec("pod-kill"), FaultContext(run_id="r9"))
    assert be.verify(h).landed is None and h.data["dry_run"] and "extras" not in h.data


def test_skip_reason_names_the_build_when_it_is_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(litmus, "home", lambda: tmp_path)
    monkeypatch.setattr(litmus.cluster, "skip_reason", lambda chaos_mesh=False: None)
    why = litmus.skip_reason()
    assert why and "tools/build-litmus" in why and "3.18.0" in why and "\n" not in why


# ------------------------------------------------------------------ the ChaosResult in summary.json and the checklist

def _litmus_timeline(at_heal: dict | None) -> list[dict]:
    inject_ev = {"killed_uids": ["u1"], "chaosresult": {"name": "e-pod-delete", "phase": "Running", "verdict": "Awaited"}}
    heal_ev = {"deleted_with_it": ["ChaosResult/e-pod-delete"]}
    if at_heal is not None:
        heal_ev["chaosresult"] = at_heal
    return [{"type": "fault-plan", "t": 10.0},
            {"type": "fault", "phase": "inject", "name": "litmus-kill", "kind": "pod-kill", "target": "platform",
             "window": 0, "effective": 5.0, "landed": True, "evidence": inject_ev},
            {"type": "fault", "phase": "heal", "name": "litmus-kill", "kind": "pod-kill", "target": "platform",
             "window": 0, "effective": 25.0, "landed": True, "evidence": heal_ev}]


def test_the_chaosresult_verdict_is_in_the_summary_faults_and_the_checklist_with_its_caveat(tmp_path):
    import json
    from monsoon.report.write import write
    from monsoon.timeline.store import Events
    d = tmp_path / "run" / "kafka-k8s--pod-kill-litmus"
    at_heal = {"name": "e-pod-delete", "phase": "Completed", "verdict": "Pass", "waited_s": 3.1}
    result = {"stack": "kafka-k8s", "experiment": "pod-kill-litmus", "verdict": "pass", "figures": {}, "dir": str(d),
              "checks": [{"name": "faults_landed", "verdict": "pass", "figures": {"faults_landed": 1}}]}
    s, md = write(tmp_path / "run", "r1", "quick", [result], events={d: Events(_litmus_timeline(at_heal))})
    [f] = json.loads((tmp_path / "run" / "summary.json").read_text())["results"][0]["faults"]
    assert (f["name"], f["kind"], f["landed"], f["healed"], f["engine"]) == ("litmus-kill", "pod-kill", True, True,
                                                                            "litmus")
    cr = f["chaosresult"]
    assert (cr["phase"], cr["verdict"], cr["at_inject"]["phase"], cr["at_heal"]["waited_s"]) == \
        ("Completed", "Pass", "Running", 3.1)
    assert "before its own post-checks" in f["caveat"]
    line = next(x for x in md.splitlines() if "ChaosResult" in x)
    assert "phase Completed, verdict Pass" in line and "before its own post-checks" in line and "landed yes" in line


def test_without_a_heal_reading_the_inject_one_is_shown_and_plain_faults_have_no_engine():
    from monsoon.report.checklist import faults_section
    from monsoon.timeline.store import Events
    [f] = faults_section(Events(_litmus_timeline(None)))
    assert (f["chaosresult"]["phase"], f["chaosresult"]["verdict"]) == ("Running", "Awaited")
    assert "at_heal" not in f["chaosresult"]
    plain = _litmus_timeline(None)
    plain[1]["evidence"] = {"signal": "SIGKILL"}
    [g] = faults_section(Events(plain))
    assert "chaosresult" not in g and "engine" not in g and g["landed"] is True


def test_a_run_without_an_engine_verdict_keeps_its_summary_shape(tmp_path):
    from monsoon.report.write import write
    from monsoon.timeline.store import Events
    d = tmp_path / "run" / "inmemory--pod-kill"
    plain = _litmus_timeline(None)
    plain[1]["evidence"] = {"signal": "SIGKILL"}
    result = {"stack": "inmemory", "experiment": "pod-kill", "verdict": "pass", "figures": {}, "dir": str(d),
              "checks": [{"name": "faults_landed", "verdict": "pass", "figures": {}}]}
    s, md = write(tmp_path / "run", "r1", "quick", [result], events={d: Events(plain)})
    assert "faults" not in s["results"][0] and "## Faults" not in md
