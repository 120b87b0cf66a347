"""ChaosHub's charts on a stack in Kubernetes form: `pytest -m chaos pytest/ -k litmus`.

experiments/charts-litmus.yaml: the pod-delete, container-kill and pod-memory-hog charts of chaos-charts 3.18.0
(applied unchanged apart from the image tools/build-litmus made) one after the other on the kafka-k8s platform pod
under load, each landed by its effect (a new pod UID; a new container ID with restarts up; the container's memory
up by half the hog), healed, nothing acked lost, lag recovered. Skips in one line without `make k8s`, the Litmus
build, its helper tools (tools/build-litmus-helpers) or the chaos-charts directory (MONSOON_CHAOS_CHARTS).
"""
import pytest

from monsoon.faults.litmus import charts_skip_reason
from monsoon.stack import litmus
from monsoon.stack.pods import ClusterUnavailable, cluster_for_session
from monsoon.timeline.store import read_events

pytestmark = pytest.mark.kubernetes


@pytest.fixture(scope="module", autouse=True)
def litmus_cluster(pytestconfig):
    if pytestconfig.getoption("--monsoon-dry-run"):
        return None
    why = charts_skip_reason()
    if why:
        pytest.skip(why)
    try:
        c = cluster_for_session(pytestconfig, ("monsoon-inmemory-k8s", "monsoon-kafka-k8s"))
    except ClusterUnavailable as e:
        pytest.skip(str(e))
    litmus.start()
    return c


@pytest.mark.chaos
def test_kafka_pods_survive_three_chaoshub_charts(monsoon):
    result = monsoon.run("kafka-k8s", "charts-litmus")
    if result.dry_run is not None:
        pytest.skip("dry run")
    result.assert_pass()
    injects = [e for e in read_events(result.dir / "timeline.jsonl") if e.get("type") == "fault"
               and e["phase"] == "inject"]
    assert len(injects) == 3 and all(e["landed"] is True for e in injects), injects
