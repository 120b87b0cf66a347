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


LS = """REF                                  TYPE                                                 DIGEST                                                                  SIZE      PLATFORMS   LABELS
docker.io/monsoon/platform:latest    application/vnd.docker.distribution.manifest.v2+json sha256:1111111111111111111111111111111111111111111111111111111111111111 312.4 MiB linux/amd64 io.cri-containerd.image=managed,monsoon.docker-image-id=sha256:aaa
docker.io/monsoon/kafka:latest       application/vnd.docker.distribution.manifest.v2+json sha256:2222222222222222222222222222222222222222222222222222222222222222 410.0 MiB linux/amd64 -
registry.k8s.io/pause:3.6            application/vnd.oci.image.manifest.v1+json           sha256:3333333333333333333333333333333333333333333333333333333333333333 300.0 KiB linux/amd64 io.cri-containerd.image=managed
"""


def test_ctr_images_ls_gives_each_ref_and_the_docker_image_it_came_from():
    assert cluster.parse_image_ids(LS) == {"docker.io/monsoon/platform:latest": "sha256:aaa",
                                           "docker.io/monsoon/kafka:latest": "",
                                           "registry.k8s.io/pause:3.6": ""}
    assert cluster.parse_image_ids("") == {}


def test_an_image_rebuilt_under_its_name_is_imported_again_and_an_unchanged_one_is_kept(monkeypatch):
    from monsoon.stack import pods

    imported: list[str] = []

    class FakeCluster:
        def image_ids(self):
            return cluster.parse_image_ids(LS)

        def import_image(self, image):
            imported.append(image)

    ids = {"monsoon/platform": "sha256:aaa",        # the same Docker image: kept
           "monsoon/kafka": "sha256:bbb",           # held unlabelled (an import before labels): imported again
           "monsoon/postgres": "sha256:ccc"}        # not held: imported
    monkeypatch.setattr(pods, "Cluster", FakeCluster)
    monkeypatch.setattr(cluster, "docker_image_id", lambda image: ids.get(image))
    events: list = []
    pods.import_images(["monsoon/platform", "monsoon/kafka", "monsoon/postgres", "monsoon/platform"],
                       lambda t, **f: events.append(f["image"]))
    assert imported == events == ["monsoon/kafka", "monsoon/postgres"]
    ids["monsoon/platform"] = "sha256:new"          # make images rebuilt it
    imported.clear()
    pods.import_images(["monsoon/platform"], lambda t, **f: None)
    assert imported == ["monsoon/platform"]
    ids.clear()                                     # Docker cannot say: what the cluster holds is kept
    imported.clear()
    pods.import_images(["monsoon/platform", "monsoon/kafka"], lambda t, **f: None)
    assert imported == []
