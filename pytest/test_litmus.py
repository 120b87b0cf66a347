"""Litmus's pod-delete on a stack in Kubernetes form: `pytest -m chaos pytest/ -k litmus`.

Litmus's chaos-operator (built by tools/build-litmus from clones of its three repositories at 3.18.0) runs against
monsoon's cluster, out of cluster; a ChaosEngine runs the pod-delete experiment on the kafka-k8s platform pod under
load: landed by a new pod UID, the ChaosResult's phase and verdict recorded on the fault events, healed
(engineState stop, the engine deleted, the runner pod and the experiment's Job gone), nothing acked lost, lag
recovered. Skips in one line without `make k8s` or the Litmus build.
"""
import pytest

from monsoon.stack import litmus
from monsoon.stack.pods import ClusterUnavailable, cluster_for_session
from monsoon.timeline.store import read_events

pytestmark = pytest.mark.kubernetes


@pytest.fixture(scope="module", autouse=True)
def litmus_cluster(pytestconfig):
    if pytestconfig.getoption("--monsoon-dry-run"):
        return None
    why = litmus.skip_reason()
    if why:
        pytest.skip(why)
    try:
        c = cluster_for_session(pytestconfig, ("monsoon-inmemory-k8s", "monsoon-kafka-k8s"))
    except ClusterUnavailable as e:
        pytest.skip(str(e))
    litmus.start()
    return c


@pytest.mark.chaos
def test_kafka_pods_survive_a_litmus_pod_delete(monsoon):
    result = monsoon.run("kafka-k8s", "pod-kill-litmus")
    if result.dry_run is not None:
        pytest.skip("dry run")
    result.assert_pass()
    faults = [e for e in read_events(result.dir / "timeline.jsonl") if e.get("type") == "fault"]
    inject = next(e for e in faults if e["phase"] == "inject")
    ev = inject["evidence"]
    assert inject["landed"] is True and ev["killed_uids"] and ev["new_uids"], ev
    assert set(ev["new_uids"]).isdisjoint(ev["uids_before"]), ev
    heal = next(e for e in faults if e["phase"] == "heal")
    hv = heal["evidence"]
    assert heal["landed"] is True and hv["present"] is False and hv["runner_and_job_left"] == [], hv
    print(f"ChaosResult at the heal: {hv['chaosresult']}")
