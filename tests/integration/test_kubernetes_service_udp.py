"""The port mirror carries UDP, on the real cluster (the session's: started here unless it runs): a pod running a
tiny UDP echo (python3 of monsoon/base: it answers each datagram with the address it came from and its pod's name)
behind a ClusterIP Service whose port is ``protocol: UDP``, found by helm.service_targets(..., "UDP") and mirrored
with Cluster.forward(udp=...) to the host's 127.0.0.1 and the node's own: two client sockets each get their own
replies, each through its own upstream socket (one source address per client, kept across datagrams). Then the pod
is deleted: a new client reaches its successor; what an old client's datagrams do (kube-proxy's cleanup of the dead
pod's UDP conntrack entries) is printed. Skips in one line without `make k8s` or `make images` (monsoon/base)."""
import socket
import time

import pytest

from monsoon.stack import cluster, helm
from monsoon.stack.pods import ClusterUnavailable, Kube, cluster_for_session, import_images, namespace_manifest
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.kubernetes    # the session keeps the cluster up through a run of modules marked so

NS = "monsoon-udp-mirror"
PORT = 15684
IMAGE = "monsoon/base"
ECHO = f"""
import os, socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", {PORT}))
me = os.uname().nodename
while True:
    d, a = s.recvfrom(65536)
    s.sendto(d + ("|%s:%d|%s" % (a[0], a[1], me)).encode(), a)
"""


@pytest.fixture(scope="module")
def kube(request):
    try:
        c = cluster_for_session(request.config, (NS,))
    except ClusterUnavailable as e:
        pytest.skip(str(e))
    if cluster.docker_image_id(IMAGE) is None:
        pytest.skip(f"{IMAGE}: not built (make images)")
    k = Kube()
    k.delete_namespace(NS)
    k.core.create_namespace(namespace_manifest(NS, "udp-mirror"), _request_timeout=10)
    try:
        yield c, k
    finally:
        k.delete_namespace(NS)


def echo_objects() -> tuple[dict, dict]:
    labels = {"app": "udp-echo"}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "udp-echo", "namespace": NS},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "echo", "image": IMAGE, "imagePullPolicy": "Never",
                            "command": ["python3", "-u", "-c", ECHO],
                            "ports": [{"name": "echo", "containerPort": PORT, "protocol": "UDP"}]}]}}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "udp-echo", "namespace": NS},
               "spec": {"type": "ClusterIP", "selector": labels,
                        "ports": [{"name": "echo", "port": PORT, "targetPort": PORT, "protocol": "UDP"}]}}
    return deployment, service


def client() -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect(("127.0.0.1", PORT))
    s.settimeout(1.0)
    return s


def ask(s: socket.socket, data: bytes) -> tuple[str, str] | None:
    """(the source address the pod saw, the pod's name) of the reply to ``data``; None: no reply within 1 s."""
    try:
        s.send(data)
        while True:
            r = s.recv(65536)
            if r.startswith(data + b"|"):
                _, seen, pod = r.decode().split("|")
                return seen, pod
    except (socket.timeout, ConnectionRefusedError):
        return None


def running_pod(k: Kube, not_name: str | None = None) -> dict | None:
    for p in k.pods(NS, "app=udp-echo"):
        if (p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
                and p["metadata"]["name"] != not_name):
            return p
    return None


def test_udp_service_mirrored_per_client_and_after_a_pod_kill(kube):
    c, k = kube
    import_images([IMAGE], lambda *a, **kw: None)
    deployment, service = echo_objects()
    k.apps.create_namespaced_deployment(NS, deployment, _request_timeout=10)
    k.core.create_namespaced_service(NS, service, _request_timeout=10)
    first = wait_for(lambda: running_pod(k), 90, "the echo pod running")
    svcs = [k.plain(x) for x in k.core.list_namespaced_service(NS, _request_timeout=5).items]
    udp = helm.service_targets(svcs, [PORT], "UDP")
    assert helm.service_targets(svcs, [PORT]) == {} and list(udp) == [PORT], svcs
    with c.forward([PORT], udp=udp) as fwd:
        assert set(fwd.ports) == {PORT} and fwd.also is not None and fwd.alive()
        a, b = client(), client()
        try:
            # the pod binds a moment after it runs, and kube-proxy's rules follow the endpoint: ask until answered
            seen_a, pod = wait_for(lambda: ask(a, b"a0"), 60, "a reply through the UDP mirror")
            assert pod == first["metadata"]["name"]
            seen_b, _ = wait_for(lambda: ask(b, b"b0"), 30, "b's reply")
            again = [ask(s, m) for s, m in ((a, b"a1"), (b, b"b1"), (a, b"a2"), (b, b"b2"))]
            print(f"\nUDP mirror 127.0.0.1:{PORT} -> {udp[PORT]}:{PORT} (pod {pod}, {first['status']['podIP']}): "
                  f"client a seen as {seen_a}, b as {seen_b}; then {again}")
            assert seen_a != seen_b                          # each client its own upstream socket
            assert [x[0] if x else None for x in again] == [seen_a, seen_b, seen_a, seen_b]   # kept per client

            # the node's side of the mirror (what runs on the node's network): the same port on its 127.0.0.1
            def inside() -> tuple[str, str] | None:
                with client() as s:
                    return ask(s, b"n0")
            assert cluster._in_netns(lambda: wait_for(inside, 30, "the node's own 127.0.0.1"))[1] == pod

            # the pod deleted: its Deployment's next one, on a new IP, behind the same Service. Client a keeps sending
            # through it (as a device retransmits): its flow's conntrack entry, DNATed to the dead pod's IP, is kept
            # alive by its own datagrams unless kube-proxy deletes it. Reported, not asserted.
            k.core.delete_namespaced_pod(pod, NS, grace_period_seconds=0, _request_timeout=10)
            t_kill, t_next, second, old, unanswered = time.monotonic(), 0.0, None, None, 0
            while old is None and (second is None or time.monotonic() - t_next < 60):
                assert time.monotonic() - t_kill < 150, "no next echo pod"
                r = ask(a, b"a3")
                if r is not None and r[1] != pod:
                    old = r
                unanswered += r is None
                if second is None and (second := running_pod(k, pod)) is not None:
                    t_next = time.monotonic()
            assert second is not None
            fresh = client()
            try:
                _, pod2 = wait_for(lambda: ask(fresh, b"c0"), 60, "a new client's reply from the next pod")
            finally:
                fresh.close()
            assert pod2 == second["metadata"]["name"]
            print(f"pod {pod} deleted, next {pod2} ({second['status']['podIP']}) running {t_next - t_kill:.1f} s "
                  "later; a new client answered by it; the old client a (its upstream 5-tuple kept, sending every "
                  f"~1 s through the kill, {unanswered} unanswered) "
                  + (f"answered by {old[1]} {time.monotonic() - t_next:+.1f} s after it ran" if old
                     else "got no reply from it in 60 s after it ran (a stale conntrack entry to the dead pod's IP)"))
        finally:
            a.close()
            b.close()
    assert not fwd.alive()
