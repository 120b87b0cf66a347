"""The stories on pods, short: monsoon's cluster (started here unless it runs, stopped after if it was), the
Kafka stack as pods with Chaos Mesh's PodChaos pod-kill of the platform under load, the in-memory stack's
platform pod OOMKilled by its memory limit under x10, and the load itself as the pods of an Indexed Job. Skips in
one line when `make k8s` has not been run."""
import json
import time

import pytest

from monsoon.stack.pods import ClusterUnavailable, Kube, cluster_for_stacks, run_namespaces
from monsoon.timeline.store import read_events

POD_KILL = """
name: k8s-pod-kill-short
load: {devices: 20, qos: 1, base_rate: 300, shape: {kind: steady}}
profiles:
  quick: {warmup: 20, recovery: 40, drain_timeout: 90}
faults:
  - profile: pod-kill
    name: platform-pod-kill-chaos-mesh
    backend: chaos-mesh
    target: {namespace: monsoon-kafka-k8s, labelSelector: {monsoon.io/service: platform}}
    schedule: {at: 15, duration: 5}
checks:
  - no_oom
  - no_acked_loss
  - lag_recovers_within: {seconds: 60}
"""

X10 = """
name: k8s-x10-short
load: {devices: 50, qos: 1, base_rate: 400, shape: {kind: burst, multiplier: 10}}
profiles:
  quick: {warmup: 5, burst: 45, recovery: 10, drain_timeout: 30}
checks:
  - no_oom
  - no_acked_loss
"""


LOAD_JOB = """
name: k8s-load-job-short
load: {devices: 20, qos: 1, base_rate: 400, shape: {kind: steady}, kubernetes: {shards: 2}}
profiles:
  quick: {warmup: 20, recovery: 5, drain_timeout: 30}
checks:
  - no_acked_loss
"""


@pytest.fixture(scope="module")
def kube_cluster():
    try:
        with cluster_for_stacks(("monsoon-inmemory-k8s", "monsoon-kafka-k8s")) as c:
            yield c
    except ClusterUnavailable as e:
        pytest.skip(str(e))


def run(tmp_path, stack, text, run_id):
    from monsoon.session import MonsoonSession
    exp = tmp_path / f"{run_id}.yaml"
    exp.write_text(text)
    session = MonsoonSession(runs_dir=tmp_path / "runs", run_id=run_id, progress=print)
    t0 = time.monotonic()
    result = session.run(stack, str(exp))
    print(f"story {stack}/{run_id}: {time.monotonic() - t0:.1f} s")
    return result, read_events(result.dir / "timeline.jsonl")


def test_kafka_pods_survive_a_chaos_mesh_pod_kill_landed_by_a_new_uid(kube_cluster, tmp_path):
    result, events = run(tmp_path, "kafka-k8s", POD_KILL, "k8s-pod-kill")
    result.assert_pass()
    faults = [e for e in events if e["type"] == "fault"]
    inject = next(e for e in faults if e["phase"] == "inject")
    ev = inject["evidence"]
    assert inject["landed"] is True and ev["method"] == "api+pod-uid", ev
    assert ev["killed_uids"] and ev["new_uids"] and set(ev["new_uids"]).isdisjoint(ev["uids_before"]), ev
    heal = next(e for e in faults if e["phase"] == "heal")
    assert heal["landed"] is True and heal["evidence"]["present"] is False, heal
    # the supervisor saw the pod go and its replacement come, as it sees a process die and restart
    svc = [e for e in events if e["type"] == "service" and e.get("service") == "platform"]
    starts = [e for e in svc if e["event"] == "start"]
    assert len(starts) == 2 and starts[0]["uid"] != starts[1]["uid"], starts
    assert any(e["event"] == "exit" and e.get("reason") == "pod deleted" for e in svc), svc
    assert any(e["event"] == "restart" for e in svc), svc
    # no_unexpected_exit: the pod's death is the fault's, by its service label
    assert result.check("no_unexpected_exit").verdict == "pass", result.failure_message()
    assert (result.dir / "logs" / "platform.log").stat().st_size > 0
    assert run_namespaces("k8s-pod-kill", Kube()) == []       # the run's namespace is gone with the stack


def test_inmemory_x10_on_pods_is_oomkilled_and_kubelet_restarts_it(kube_cluster, tmp_path):
    result, events = run(tmp_path, "inmemory-k8s", X10, "k8s-x10")
    oom, loss = result.check("no_oom"), result.check("no_acked_loss")
    assert oom.verdict == "fail" and oom.figures.get("k8s_oom_killed", 0) >= 1, result.failure_message()
    exits = [e for e in events if e.get("event") == "exit" and e.get("service") == "platform"]
    assert any(e.get("reason") == "OOMKilled" and e["code"] == 137 and e.get("oom") for e in exits), exits
    assert any(e.get("event") == "restart" and e.get("by") == "kubelet" for e in events), "no kubelet restart"
    f = loss.figures
    assert loss.verdict == "fail" and 0 < f["acked_lost"] < f["acked"], result.failure_message()
    assert run_namespaces("k8s-x10", Kube()) == []


def test_the_load_as_an_indexed_job_of_two_pods_is_accounted_exactly(kube_cluster, tmp_path):
    """load.kubernetes: {shards: 2}: monsoon-loadgen runs as the two pods of an Indexed Job (its own image, the
    node's network); each pod writes its shard's acks into the run directory, and the accounting is exact."""
    result, events = run(tmp_path, "inmemory-k8s", LOAD_JOB, "k8s-load-job")
    result.assert_pass()
    job = json.loads((result.dir / "load-shards.json").read_text())
    shards = job["shards"]
    for s in shards:
        print(f"shard {s['index']} (pod {s['pod']}): devices {s['range']}, {s['sent']:,} sent of {s['scheduled']:,}, "
              f"{s['acked']:,} acked, {s['late']:,} late ({s['late_pct']} %), send lateness p99 "
              f"{s['send_late_p99_ms']} ms, max {s['send_late_max_ms']} ms, {s['elapsed_s']} s")
    assert [s["index"] for s in shards] == [0, 1], shards
    assert all(s["phase"] == "Succeeded" and s["exit_code"] == 0 for s in shards), shards
    assert shards[0]["range"] == [0, 10] and shards[1]["range"] == [10, 20], shards
    loss = result.check("no_acked_loss").figures
    per_second = sum(e["acked"] for e in events if e["type"] == "load")
    assert loss["acked"] == sum(s["acked"] for s in shards) == per_second > 0, (loss, shards, per_second)
    assert loss["acked_lost"] == 0, loss
    assert run_namespaces("k8s-load-job", Kube()) == []      # the Job's namespace went with the fleet
