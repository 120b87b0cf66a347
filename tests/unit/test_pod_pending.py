"""Why pods stay Pending, said in the error: the scheduler's message, a container's waiting reason, the node's
pressure conditions; and a disk too full for kubelet refused before anything starts. Pure logic: pod and node
objects as the API returns them (tests/integration runs the cluster)."""
import os
from collections import namedtuple

from monsoon.stack import cluster
from monsoon.stack.pods import pending_reason

TAINT = "0/1 nodes are available: 1 node(s) had untolerated taint {node.kubernetes.io/disk-pressure: }."


def pod(phase="Pending", scheduled=None, waiting=None, name="postgres"):
    st: dict = {"phase": phase, "conditions": []}
    if scheduled is not None:
        st["conditions"].append({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                 "message": scheduled})
    if waiting is not None:
        st["containerStatuses"] = [{"name": name, "state": {"waiting": waiting}, "ready": False}]
    return {"metadata": {"name": "p-1"}, "status": st}


def test_an_unscheduled_pod_names_the_schedulers_reason():
    assert pending_reason(pod(scheduled=TAINT), "postgres") == f"Pending, not scheduled: {TAINT}"


def test_a_waiting_container_names_its_reason_and_message_before_the_phase():
    p = pod(waiting={"reason": "ImagePullBackOff", "message": "image postgres:16 not found"})
    assert pending_reason(p, "postgres") == "ImagePullBackOff: image postgres:16 not found"
    assert pending_reason(pod(waiting={"reason": "ContainerCreating"}), "postgres") == "ContainerCreating"
    # another container's state is not this one's
    assert pending_reason(pod(waiting={"reason": "CrashLoopBackOff"}, name="sidecar"), "postgres") == "Pending"
    assert pending_reason(pod(waiting={"reason": "CrashLoopBackOff"}, name="sidecar")) == "CrashLoopBackOff"


def test_a_pod_with_no_status_says_its_phase_or_a_question_mark():
    assert pending_reason({"status": {"phase": "Running"}}) == "Running"
    assert pending_reason({}) == "?"


def test_node_pressure_names_the_conditions_that_keep_pods_off():
    node = {"status": {"conditions": [
        {"type": "MemoryPressure", "status": "False"},
        {"type": "DiskPressure", "status": "True", "message": "kubelet has disk pressure"},
        {"type": "PIDPressure", "status": "False"},
        {"type": "Ready", "status": "True"}]}}
    assert cluster.node_pressure(node) == ["DiskPressure (kubelet has disk pressure)"]
    node["status"]["conditions"][3] = {"type": "Ready", "status": "False", "reason": "KubeletNotReady"}
    assert cluster.node_pressure(node) == ["DiskPressure (kubelet has disk pressure)", "NotReady (KubeletNotReady)"]
    assert cluster.node_pressure(None) == [] and cluster.node_pressure({"status": {"conditions": [
        {"type": "Ready", "status": "True"}]}}) == []


StatVfs = namedtuple("StatVfs", "f_bavail f_frsize f_blocks")


def test_a_disk_below_the_headroom_is_refused_in_one_line_naming_the_directory(tmp_path, monkeypatch):
    d = tmp_path / "k8s" / "cluster"            # not created yet: its nearest existing parent is measured
    monkeypatch.setattr(os, "statvfs", lambda p: StatVfs(1 << 18, 4096, 60 << 18))    # 1 GiB free of 60
    why = cluster.disk_refusal(d)
    assert why is not None and "\n" not in why
    assert str(d) in why and "1.0 GiB free of 60.0 GiB" in why and cluster.EVICTION_DISK in why
    monkeypatch.setattr(os, "statvfs", lambda p: StatVfs(3 << 18, 4096, 60 << 18))    # 3 GiB free
    assert cluster.disk_refusal(d) is None


def test_kubelet_evicts_at_an_absolute_floor_not_a_share_of_a_large_disk(tmp_path):
    ev = cluster.kubelet_config(tmp_path)["evictionHard"]
    assert ev["nodefs.available"] == ev["imagefs.available"] == cluster.EVICTION_DISK == "512Mi"
    assert cluster.DISK_HEADROOM > 512 << 20
