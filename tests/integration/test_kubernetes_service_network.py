"""The cluster's service network for real (the session's cluster: started here unless it runs): kube-proxy's rules and
CoreDNS in the node's namespace, and a stack on the pod network (kafka-k8s, kubernetes.host_network: false) whose
platform pod, killed under load by Chaos Mesh, comes back on a new pod IP behind the same Service: the devices
(through the host's port mirror to the Service) and the platform's Kafka and Postgres clients (by Service name)
carry on, nothing acked lost. Skips in one line without `make k8s`."""
import ipaddress
import json
import random
import socket
import struct
import subprocess

import pytest

from monsoon.stack import cluster
from monsoon.stack.pods import ClusterUnavailable, Kube, cluster_for_session, run_namespaces
from tests.integration.helpers import run_story

pytestmark = pytest.mark.kubernetes    # the session keeps the cluster up through a run of modules marked so

POD_KILL = """
name: k8s-pod-network
load: {devices: 20, qos: 1, base_rate: 300, shape: {kind: steady}}
profiles:
  quick: {warmup: 10, recovery: 30, drain_timeout: 90}
faults:
  - profile: pod-kill
    name: platform-pod-kill-chaos-mesh
    backend: chaos-mesh
    target: {namespace: monsoon-kafka-k8s, labelSelector: {monsoon.io/service: platform}}
    schedule: {at: 10, duration: 5}
checks:
  - no_oom
  - no_acked_loss
  - lag_recovers_within: {seconds: 60}
"""


@pytest.fixture(scope="module")
def kube_cluster(request):
    try:
        return cluster_for_session(request.config, ("monsoon-kafka-k8s",))
    except ClusterUnavailable as e:
        pytest.skip(str(e))


def dns_query(name: str, server: str = cluster.DNS_IP) -> tuple[int, list[str]]:
    """One A query over UDP from inside the node's namespace: (rcode, addresses)."""
    qid = random.randrange(1 << 16)
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)

    def ask() -> bytes:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(3)
            s.sendto(q, (server, 53))
            return s.recv(4096)
    r = cluster._in_netns(ask)
    (rid, flags, _qd, an, _ns, _ar) = struct.unpack(">HHHHHH", r[:12])
    assert rid == qid
    i = 12
    while r[i]:
        i += r[i] + 1
    i += 5
    ips = []
    for _ in range(an):
        if r[i] & 0xC0 == 0xC0:
            i += 2
        else:
            while r[i]:
                i += r[i] + 1
            i += 1
        rtype, _cls, _ttl, rdlen = struct.unpack(">HHIH", r[i:i + 10])
        i += 10
        if rtype == 1:
            ips.append(socket.inet_ntoa(r[i:i + rdlen]))
        i += rdlen
    return flags & 0xF, ips


def test_kube_proxy_routes_the_dns_service_to_coredns_inside_the_namespace_only(kube_cluster):
    rows = {name: (ok, line) for name, ok, line in cluster.status()}
    assert rows["kube-proxy"][0] and rows["coredns"][0], rows
    # 10.96.0.10 is on no interface: only kube-proxy's DNAT takes the query to CoreDNS on the node's IP
    assert dns_query("kubernetes.default.svc.cluster.local") == (0, [cluster.SERVICE_IP])
    assert dns_query("kube-dns.kube-system.svc.cluster.local") == (0, [cluster.DNS_IP])
    assert dns_query("example.com")[0] == 3           # NXDOMAIN: no upstream, nothing leaves the namespace
    inside = subprocess.run(c_ns(["iptables", "-t", "nat", "-S", "KUBE-SERVICES"]), capture_output=True, text=True)
    assert inside.returncode == 0 and f"{cluster.DNS_IP}/32" in inside.stdout, inside.stderr
    host = subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, text=True)
    assert "KUBE-" not in host.stdout, "kube-proxy wrote rules into the host's own tables"
    # no sysctl and no /sys file written: kube-proxy logs each one it sets (klog level 0)
    log = (cluster.state_dir() / "logs" / "kube-proxy.log").read_text()
    for said in ("Set sysctl", "Setting nf_conntrack_max", "Setting conntrack hashsize", "route_localnet=1"):
        assert said not in log, f"kube-proxy: {said!r} in its log"


def c_ns(argv: list[str]) -> list[str]:
    return [*cluster.Cluster().nsenter_prefix(), *argv]


def test_platform_pod_killed_under_load_comes_back_on_a_new_ip_behind_its_service(kube_cluster, tmp_path):
    result, events = run_story(tmp_path, "kafka-k8s", POD_KILL, "k8s-pod-network")
    services = {e["service"]: e for e in events if e["type"] == "op" and e.get("op") == "namespace"
                and e.get("event") == "service"}
    assert set(services) == {"postgres", "kafka", "platform"}, services
    cidr = ipaddress.ip_network(cluster.SERVICE_CIDR)
    assert all(ipaddress.ip_address(e["cluster_ip"]) in cidr for e in services.values()), services
    starts = [e for e in events if e["type"] == "service" and e.get("service") == "platform"
              and e["event"] == "start"]
    print("platform starts:", [(round(e["t"], 1), e.get("uid"), e.get("ip")) for e in starts])
    print("services:", {n: (e["cluster_ip"], e["ports"]) for n, e in services.items()})
    assert len(starts) >= 2, starts
    first, last = starts[0], starts[-1]
    pods = ipaddress.ip_network(cluster.POD_CIDR)
    assert ipaddress.ip_address(first["ip"]) in pods and ipaddress.ip_address(last["ip"]) in pods, starts
    assert first["uid"] != last["uid"] and first["ip"] != last["ip"], starts     # a new pod, a new IP
    inject = next(e for e in events if e["type"] == "fault" and e["phase"] == "inject")
    assert inject["landed"] is True and first["uid"] in inject["evidence"]["killed_uids"], inject["evidence"]
    # the devices reach the new pod through the same mirror and Service: acks after it started, every device on
    loads = [e for e in events if e["type"] == "load"]
    after = [e for e in loads if e["t"] > last["t"] + 5]
    assert after and sum(e["acked"] for e in after) > 0, loads[-5:]
    assert max(e["connected"] for e in after) == 20, after[-3:]
    # the new platform's Kafka and Postgres clients found them by Service name: the lag drained, all stored
    lost = result.check("no_acked_loss")
    print(f"no_acked_loss {lost.verdict}: {json.dumps(lost.figures)}")
    result.assert_pass()
    assert run_namespaces("k8s-pod-network", Kube()) == []
