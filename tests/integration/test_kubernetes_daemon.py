"""Chaos Mesh's chaos-daemon for real, on monsoon's cluster (the session's: started here unless it runs): one Kafka
platform run takes a PodChaos container-kill of its container under load (the same pod, a new container ID and a
restart) and then the controller's PodChaos pod-kill (a new pod, landed by its new UID), nothing acked lost
across both; a StressChaos memory hog in the in-memory platform's container until its memory limit OOM-kills it
(no_oom names it). The daemon is started by the first fault that needs it; that `monsoon cluster down` stops it
with the rest is test_kubernetes_story.py's last-but-one test (the session's cluster stays up here for the modules
after this one). Skips in one line without `make k8s` or `tools/build-chaos-daemon`."""
import json
from pathlib import Path

import pytest

from monsoon.stack import cluster
from monsoon.stack.pods import ClusterUnavailable, Kube, cluster_for_session, run_namespaces
from tests.integration.helpers import run_story

pytestmark = pytest.mark.kubernetes    # the session keeps the cluster up through a run of modules marked so

KILLS = """
name: k8s-kills
load: {devices: 20, qos: 1, base_rate: 300, shape: {kind: steady}}
profiles:
  quick: {warmup: 10, recovery: 55, drain_timeout: 90}     # 65 s of load: the pod-kill at 30 s, 35 s after it
faults:
  - profile: container-kill
    schedule: {at: 8, duration: 5}
  - profile: pod-kill
    name: platform-pod-kill-chaos-mesh
    backend: chaos-mesh
    target: {namespace: monsoon-kafka-k8s, labelSelector: {monsoon.io/service: platform}}
    schedule: {at: 30, duration: 5}
checks:
  - no_oom
  - no_acked_loss
  - lag_recovers_within: {seconds: 60}
"""

MEMORY_STRESS = """
name: k8s-memory-stress
load: {devices: 20, qos: 1, base_rate: 300, shape: {kind: steady}}
profiles:
  quick: {warmup: 10, recovery: 25, drain_timeout: 60}
faults:
  - profile: memory-pressure
    name: platform-memory-stress
    backend: chaos-mesh
    target: {namespace: monsoon-inmemory-k8s, labelSelector: {monsoon.io/service: platform}, container: platform}
    params: {hog_mb: 256}
    schedule: {at: 10, duration: 15}
checks:
  - no_oom
  - no_acked_loss
"""


@pytest.fixture(scope="module")
def kube_cluster(request):
    why = cluster.skip_reason(chaos_mesh=True) or cluster.chaos_daemon_missing()
    if why:
        pytest.skip(why)
    try:
        return cluster_for_session(request.config, ("monsoon-inmemory-k8s", "monsoon-kafka-k8s"))
    except ClusterUnavailable as e:
        pytest.skip(str(e))


def rss_mb(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process, in MiB."""
    st = dict(ln.split(":", 1) for ln in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in ln)
    rss, hwm = (round(int(st[k].split()[0]) / 1024, 1) for k in ("VmRSS", "VmHWM"))
    return rss, hwm


def test_kafka_platform_container_killed_in_its_pod_then_the_pod_killed_loses_nothing(kube_cluster, tmp_path):
    """Two kills of the Kafka platform in one run (one stack start for both): the chaos-daemon's container-kill
    (the same pod, a new container) and then the controller's pod-kill (a new pod, by its new UID)."""
    result, events = run_story(tmp_path, "kafka-k8s", KILLS, "k8s-kills")
    pid = cluster.daemon_pid("chaos-daemon")
    assert pid is not None, "the container-kill should have started chaos-daemon"
    print(f"chaos-daemon pid {pid}: RSS, peak RSS (MiB) {rss_mb(pid)}")
    faults = [e for e in events if e["type"] == "fault"]
    injects = {e["name"]: e for e in faults if e["phase"] == "inject"}
    heals = {e["name"]: e for e in faults if e["phase"] == "heal"}
    assert set(injects) == set(heals) == {"platform-container-kill", "platform-pod-kill-chaos-mesh"}, faults
    assert all(h["landed"] is True and h["evidence"]["present"] is False for h in heals.values()), heals
    svc = [e for e in events if e["type"] == "service" and e.get("service") == "platform"]
    starts = [e for e in svc if e["event"] == "start"]
    print("platform:", [(e["event"], round(e["t"], 1), e.get("uid"), e.get("reason")) for e in svc])
    # the container-kill: the same pod, a new container ID, one more restart, SIGKILLed (137), not OOM
    ck = injects["platform-container-kill"]
    ev = ck["evidence"]
    print(json.dumps({k: ev.get(k) for k in ("restarted", "same_uids", "all_injected", "effect_waited_s")}))
    assert ck["landed"] is True and ev["method"] == "api+container-id", ev
    (r,) = ev["restarted"]
    assert r["uid"] in ev["same_uids"] and r["id"] != r["id_before"] and r["restarts"] == r["restarts_before"] + 1, ev
    assert r["container"] == "platform" and r["last"].endswith("(137)"), r      # SIGKILLed, not OOM
    pk = injects["platform-pod-kill-chaos-mesh"]
    first_pod = [e for e in starts if e["uid"] == r["uid"]]
    assert len(first_pod) == 2 and starts[:2] == first_pod, starts    # the first pod: two containers, in turn
    # the pod-kill: landed by a new UID, seen by the supervisor as a pod gone and its replacement come
    pv = pk["evidence"]
    assert pk["landed"] is True and pv["method"] == "api+pod-uid", pv
    assert pv["killed_uids"] and pv["new_uids"] and set(pv["new_uids"]).isdisjoint(pv["uids_before"]), pv
    assert r["uid"] in pv["killed_uids"], (r, pv)
    later = starts[2:]
    assert later and {e["uid"] for e in later} <= set(pv["new_uids"]), starts      # then the new pod
    assert any(e["event"] == "exit" and e.get("reason") == "pod deleted" for e in svc), svc
    # no_oom, nothing acked lost across both, lag recovered, no_unexpected_exit (the faults explain both deaths)
    result.assert_pass()
    assert result.check("no_unexpected_exit").verdict == "pass", result.failure_message()
    assert (result.dir / "logs" / "platform.log").stat().st_size > 0
    assert run_namespaces("k8s-kills", Kube()) == []       # the run's namespace is gone with the stack


def test_inmemory_platform_stressed_to_its_memory_limit_is_oomkilled_and_no_oom_names_it(kube_cluster, tmp_path):
    from monsoon.faults.kube import kernel_refusal, memory_cgroup_missing
    why = memory_cgroup_missing()
    if why:     # the refusal is what this machine can show: one line, before the load
        from monsoon.spec.fault import FaultSpec
        f = FaultSpec(name="m", kind="memory-pressure", backend="chaos-mesh", params={"hog_mb": 64},
                      target={"namespace": "monsoon-inmemory-k8s", "labelSelector": {"a": "b"}},
                      schedule={"at": 1, "duration": 1})
        line = kernel_refusal(f)
        assert line and "refused before the load" in line, line
        pytest.skip(f"this kernel refuses StressChaos memory: {line}")
    result, events = run_story(tmp_path, "inmemory-k8s", MEMORY_STRESS, "k8s-memory-stress")
    pid = cluster.daemon_pid("chaos-daemon")
    assert pid is not None
    print(f"chaos-daemon pid {pid}: RSS, peak RSS (MiB) {rss_mb(pid)}")
    faults = [e for e in events if e["type"] == "fault"]
    inject = next(e for e in faults if e["phase"] == "inject")
    ev = inject["evidence"]
    print(json.dumps({k: ev.get(k) for k in ("restarted", "oom_killed", "all_injected", "effect_waited_s")}))
    assert inject["landed"] is True and ev["oom_killed"], ev
    heal = next(e for e in faults if e["phase"] == "heal")
    assert heal["landed"] is True and heal["evidence"]["present"] is False, heal
    oom = result.check("no_oom")
    print(f"no_oom {oom.verdict}: {oom.figures} {oom.message}")
    assert oom.verdict == "fail" and oom.figures.get("k8s_oom_killed", 0) >= 1, result.failure_message()
    assert "platform" in oom.message, oom.message
    exits = [e for e in events if e.get("event") == "exit" and e.get("service") == "platform"]
    assert any(e.get("reason") == "OOMKilled" and e["code"] == 137 for e in exits), exits
    assert run_namespaces("k8s-memory-stress", Kube()) == []

