"""Litmus for real, short: its chaos-operator (built by tools/build-litmus at 3.18.0) against monsoon's session
cluster, a pod-delete ChaosEngine on the Kafka stack's platform pod under load: landed by a new pod UID, the
ChaosResult's phase and verdict on the run's fault events, healed (engineState stop, the engine deleted, the runner
pod and the experiment's Job gone), nothing acked lost, lag recovered. Then Ctrl-C while an engine is in place:
nothing of it is left. Skips in one line without `make k8s` or without the Litmus build.
(The module sorts before test_kubernetes_story.py, whose last tests take the session's cluster down.)"""
import signal
import subprocess
import sys
import time

import pytest

from monsoon.faults.litmus import LitmusBackend
from monsoon.stack import litmus
from monsoon.stack.pods import ClusterUnavailable, Kube, cluster_for_session, run_namespaces
from monsoon.timeline.store import read_events
from tests.integration.helpers import sigint_default, wait_for

NS = "monsoon-kafka-k8s"
POD_DELETE = """
name: k8s-litmus-pod-delete
load: {devices: 20, qos: 1, base_rate: 300, shape: {kind: steady}}
profiles:
  quick: {warmup: 20, recovery: 40, drain_timeout: 90}
faults:
  - profile: pod-kill
    name: platform-pod-delete-litmus
    backend: litmus
    target: {namespace: monsoon-kafka-k8s, labelSelector: {monsoon.io/service: platform}}
    params: {grace_period: 0}
    schedule: {at: 15, duration: 5}
checks:
  - no_oom
  - no_acked_loss
  - lag_recovers_within: {seconds: 60}
"""

HELD = """
name: k8s-litmus-interrupted
load: {devices: 10, qos: 1, base_rate: 100, shape: {kind: steady}}
profiles: {quick: {warmup: 150, recovery: 5, drain_timeout: 20}}
faults:
  - {profile: pod-kill, name: platform-pod-delete-held, backend: litmus, params: {grace_period: 0},
     target: {namespace: monsoon-kafka-k8s, labelSelector: {monsoon.io/service: platform}},
     schedule: {at: 3, duration: 140}}
checks: [no_acked_loss]
"""
SCENARIO = """
def test_interrupted(monsoon):
    monsoon.run("kafka-k8s", "{exp}").assert_pass()
"""


@pytest.fixture(scope="module")
def litmus_cluster(request):
    """The session's cluster with Litmus's operator added (stopped with the cluster)."""
    why = litmus.skip_reason()
    if why:
        pytest.skip(why)
    try:
        c = cluster_for_session(request.config, ("monsoon-inmemory-k8s", NS))
    except ClusterUnavailable as e:
        pytest.skip(str(e))
    t0 = time.monotonic()
    if litmus.start(say=print):
        print(f"Litmus added to the cluster in {time.monotonic() - t0:.1f} s")
    return c


def run_objects(run_id: str) -> list[str]:
    """Everything labelled with the run in the cluster: pods, Jobs (the runner, the experiment)."""
    k = Kube()
    sel = f"monsoon.io/run-id={run_id}"
    pods = k.core.list_pod_for_all_namespaces(label_selector=sel, _request_timeout=10).items
    from kubernetes import client
    jobs = client.BatchV1Api(k.core.api_client).list_job_for_all_namespaces(label_selector=sel,
                                                                            _request_timeout=10).items
    return [f"pod/{p.metadata.name}" for p in pods] + [f"job/{j.metadata.name}" for j in jobs]


def test_kafka_pods_survive_a_litmus_pod_delete(litmus_cluster, tmp_path):
    from monsoon.session import MonsoonSession
    exp = tmp_path / "k8s-litmus.yaml"
    exp.write_text(POD_DELETE)
    session = MonsoonSession(runs_dir=tmp_path / "runs", run_id="k8s-litmus", progress=print)
    t0 = time.monotonic()
    result = session.run("kafka-k8s", str(exp))
    print(f"story kafka-k8s/k8s-litmus: {time.monotonic() - t0:.1f} s")
    events = read_events(result.dir / "timeline.jsonl")
    faults = [e for e in events if e["type"] == "fault"]
    inject = next(e for e in faults if e["phase"] == "inject")
    heal = next(e for e in faults if e["phase"] == "heal")
    print(f"inject evidence: {inject['evidence']}\nheal evidence: {heal['evidence']}")
    result.assert_pass()
    ev = inject["evidence"]
    # landed by its effect: the platform pod replaced by a new one (a new UID), not only the engine's status
    assert inject["landed"] is True and ev["method"] == "api+pod-uid", ev
    assert ev["killed_uids"] and ev["new_uids"] and set(ev["new_uids"]).isdisjoint(ev["uids_before"]), ev
    assert ev["chaosresult"].get("phase"), ev          # the ChaosResult's phase and verdict, as evidence
    hv = heal["evidence"]
    assert heal["landed"] is True and hv["present"] is False, hv
    assert hv["chaosresult"].get("phase") and hv["chaosresult"].get("verdict"), hv
    assert hv["runner_and_job_left"] == [], hv
    loss, lag = result.check("no_acked_loss"), result.check("lag_recovers_within")
    print(f"no_acked_loss {loss.figures}\nlag_recovers_within {lag.figures}")
    assert loss.figures["acked_lost"] == 0 and loss.figures["acked"] > 0, loss.figures
    assert LitmusBackend([NS]).census("k8s-litmus") == []
    assert run_objects("k8s-litmus") == [] and run_namespaces("k8s-litmus", Kube()) == []


def test_ctrl_c_during_a_chaosengine_leaves_nothing_of_it(litmus_cluster, tmp_path):
    exp = tmp_path / "k8s-litmus-interrupted.yaml"
    exp.write_text(HELD)
    (tmp_path / "test_it.py").write_text(SCENARIO.replace("{exp}", str(exp)))
    runs, run_id = tmp_path / "runs", "k8s-litmus-int"
    timeline = runs / run_id / "kafka-k8s--k8s-litmus-interrupted" / "timeline.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", str(tmp_path / "test_it.py"), "-p", "no:cacheprovider",
                             f"--monsoon-runs-dir={runs}", f"--monsoon-run-id={run_id}"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=sigint_default)
    backend = LitmusBackend([NS])
    try:
        def injected() -> bool:
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            return timeline.exists() and any(e["type"] == "fault" and e.get("phase") == "inject"
                                             for e in read_events(timeline))
        wait_for(injected, 240, "the ChaosEngine injected")
        placed = backend.census(run_id)
        assert any(x.startswith("ChaosEngine") for x in placed), placed
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=180)
        events = read_events(timeline)
        heal = next(e for e in events if e["type"] == "fault" and e.get("phase") == "heal")
        assert heal.get("final") and heal["landed"] is True and heal["evidence"]["present"] is False, heal
        assert heal["evidence"]["runner_and_job_left"] == [], heal
        census = next(e for e in events if e["type"] == "fault-census")
        assert census["leftovers"] == {} and census["errors"] == [], census
        info = out[-4000:]
        assert backend.census(run_id) == [], info
        assert run_objects(run_id) == [] and run_namespaces(run_id) == [], info
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
