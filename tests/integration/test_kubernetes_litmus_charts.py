"""Litmus beyond pod-delete, for real: ChaosHub's pod-delete, container-kill and pod-memory-hog charts (chaos-charts
at 3.18.0, applied unchanged apart from the image tools/build-litmus made) one after the other on the Kafka stack's
platform pod under load, against monsoon's session cluster. Each is judged by its effect: a new pod UID; the same
pod with its container under a new ID and its restart count up; the container's memory cgroup up by half the hog
while stress-ng runs. The ChaosResult's phase and verdict of each are recorded as evidence. Then nothing acked is
lost, the lag recovers and nothing of the engines is left. A network chart is refused in one line before the load.

Skips in one line without `make k8s`, the Litmus build (tools/build-litmus), its helper tools
(tools/build-litmus-helpers) or the chaos-charts directory (MONSOON_CHAOS_CHARTS), saying how to get each.
Its kept run (tests/fixtures/litmus/) is judged again by tests/unit/test_litmus_fixtures.py where none of this is.
(The module sorts before test_kubernetes_story.py, whose last tests take the session's cluster down.)"""
import time

import pytest

from monsoon.faults.litmus import LitmusBackend, charts_skip_reason, judge_effect
from monsoon.spec.yamlio import SpecError
from monsoon.stack import litmus
from monsoon.stack.pods import ClusterUnavailable, Kube, cluster_for_session, run_namespaces
from tests.integration.helpers import run_story

NS = "monsoon-kafka-k8s"
CHARTS = """
name: k8s-litmus-charts
load: {devices: 20, qos: 1, base_rate: 300, shape: {kind: steady}}
profiles:
  quick: {warmup: 20, recovery: 150, drain_timeout: 90}
faults:
  - {profile: pod-kill-litmus, schedule: {at: 10, duration: 10}}
  - {profile: container-kill-litmus, schedule: {at: 60, duration: 20}}
  - {profile: memory-pressure-litmus, schedule: {at: 110, duration: 45}}
checks:
  - no_oom
  - no_acked_loss
  - lag_recovers_within: {seconds: 90}
"""
NETWORK = """
name: k8s-litmus-network
load: {devices: 5, qos: 1, base_rate: 50, shape: {kind: steady}}
profiles: {quick: {warmup: 5, recovery: 5, drain_timeout: 20}}
faults:
  - {profile: network-latency, backend: litmus, schedule: {at: 2, duration: 5},
     target: {namespace: monsoon-kafka-k8s, labelSelector: {monsoon.io/service: platform}}}
checks: [no_acked_loss]
"""


@pytest.fixture(scope="module")
def litmus_cluster(request):
    """The session's cluster with Litmus's operator added (stopped with the cluster)."""
    why = charts_skip_reason()
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


def test_three_charts_land_by_their_effect_and_nothing_acked_is_lost(litmus_cluster, tmp_path):
    result, events = run_story(tmp_path, "kafka-k8s", CHARTS, "k8s-litmus-charts")
    faults = [e for e in events if e["type"] == "fault"]
    for e in faults:
        print(f"{e['phase']} {e['name']} landed={e['landed']} evidence={e['evidence']}")
    injects = {e["name"]: e for e in faults if e["phase"] == "inject"}
    heals = {e["name"]: e for e in faults if e["phase"] == "heal"}
    assert len(injects) == 3 and len(heals) == 3, sorted(injects)
    for name, exp in (("platform-pod-delete-chart", "pod-delete"), ("platform-container-kill-litmus", "container-kill"),
                      ("platform-memory-hog-litmus", "pod-memory-hog")):
        ev = injects[name]["evidence"]
        assert [x["name"] for x in ev["experiments"]] == [exp], ev
        ok, why = judge_effect(exp, ev, 64 if exp == "pod-memory-hog" else None)
        print(f"{exp}: {why}")
        assert injects[name]["landed"] is True and ok, ev
        assert ev["chaosresult"].get("name", "").endswith(exp), ev        # read, as evidence
        hv = heals[name]["evidence"]
        assert heals[name]["landed"] is True and hv["present"] is False and hv["runner_and_job_left"] == [], hv
    assert injects["platform-container-kill-litmus"]["evidence"]["method"] == "api+container-id"
    assert injects["platform-memory-hog-litmus"]["evidence"]["method"] == "api+memory-usage"
    loss = result.check("no_acked_loss")
    print(f"no_acked_loss {loss.figures}\nlag_recovers_within {result.check('lag_recovers_within').figures}")
    result.assert_pass()
    assert loss.figures["acked_lost"] == 0 and loss.figures["acked"] > 0, loss.figures
    assert LitmusBackend([NS]).census("k8s-litmus-charts") == []
    assert run_namespaces("k8s-litmus-charts", Kube()) == []


def test_a_network_chart_is_refused_in_one_line_before_the_load(litmus_cluster, tmp_path):
    t0 = time.monotonic()
    with pytest.raises(SpecError) as e:
        run_story(tmp_path, "kafka-k8s", NETWORK, "k8s-litmus-network")
    msg = str(e.value)
    print(f"refused in {time.monotonic() - t0:.1f} s: {msg}")
    assert "pod-network-latency needs tc" in msg and "sch_netem" in msg and "\n" not in msg
    assert not (tmp_path / "runs" / "k8s-litmus-network" / "kafka-k8s--k8s-litmus-network" / "timeline.jsonl").exists()
