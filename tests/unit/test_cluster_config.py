"""The single-node cluster's rendered configuration (monsoon.stack.cluster): pure functions, no cluster."""
import tomllib
from pathlib import Path

import pytest

from monsoon.stack import cluster
from monsoon.stack.nsforward import format_target, parse_target

D = Path("/cache/k8s/cluster")


def test_containerd_config_is_private_and_carries_the_traps():
    cfg = tomllib.loads(cluster.containerd_config(D))
    assert cfg["version"] == 2
    assert cfg["root"].startswith(str(D)) and cfg["state"].startswith(str(D))
    assert cfg["grpc"]["address"] == str(D / "containerd" / "c.sock")
    cri = cfg["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True          # else every sandbox fails in runc
    assert cri["netns_mounts_under_state_dir"] is True
    assert cri["sandbox_image"] == cluster.PAUSE_IMAGE
    runc = cri["containerd"]["runtimes"]["runc"]["options"]
    assert runc["SystemdCgroup"] is False and runc["Root"].startswith(str(D))
    assert cri["cni"]["conf_dir"].startswith(str(D))


def test_cni_config_bridge_without_masquerade_in_the_pod_cidr():
    c = cluster.cni_config(D)
    bridge = c["plugins"][0]
    assert bridge["type"] == "bridge" and bridge["ipMasq"] is False and bridge["isGateway"] is True
    assert bridge["ipam"]["ranges"] == [[{"subnet": cluster.POD_CIDR}]]
    assert bridge["ipam"]["dataDir"].startswith(str(D))


def test_kubelet_config_and_argv_stay_in_the_state_dir():
    k = cluster.kubelet_config(D)
    assert k["cgroupDriver"] == "cgroupfs" and k["failSwapOn"] is False and k["failCgroupV1"] is False
    assert k["address"] == cluster.NODE_IP and k["podLogsDir"].startswith(str(D))
    assert k["containerRuntimeEndpoint"] == f"unix://{D}/containerd/c.sock"
    argv, _ = cluster.daemon_argv("kubelet", D, Path("/bin"))
    assert f"--root-dir={D}/kubelet" in argv and f"--node-ip={cluster.NODE_IP}" in argv


def test_apiserver_and_chaos_controller_arguments():
    argv, _ = cluster.daemon_argv("kube-apiserver", D, Path("/b"))
    assert "--secure-port=443" in argv and f"--advertise-address={cluster.NODE_IP}" in argv
    assert "--authorization-mode=Node,RBAC" in argv
    argv, env = cluster.daemon_argv("chaos-controller-manager", D, Path("/b"))
    assert argv[1] == f"-kubeconfig={D}/kubeconfig.inside"
    assert env["ENABLE_LEADER_ELECTION"] == "false" and env["CERTS_DIR"] == f"{D}/chaos-certs"
    assert env["POD_FAILURE_PAUSE_IMAGE"] == cluster.PAUSE_IMAGE
    with pytest.raises(ValueError):
        cluster.daemon_argv("kube-nonesuch", D, Path("/b"))


def test_kubeconfig_points_at_the_server_with_the_users_certificate():
    kc = cluster.kubeconfig("https://127.0.0.1:16443", D, "admin")
    assert kc["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:16443"
    assert kc["users"][0]["user"]["client-certificate"] == f"{D}/pki/admin.crt"
    assert "IP:127.0.0.1" in cluster.APISERVER_SANS and f"IP:{cluster.SERVICE_IP}" in cluster.APISERVER_SANS
    assert cluster.CLIENTS["kubelet"] == (f"system:node:{cluster.NODE}", "system:nodes")


def test_missing_pieces_name_each_binary(tmp_path):
    c = cluster.Cluster(tmp_path / "k8s" / "cluster")
    miss = cluster.missing_pieces(c, chaos_mesh=True)
    for b in cluster.KUBE_BINARIES + ("chaos-controller-manager",):
        assert any(line.startswith(f"{b}: not built") and "make k8s" in line for line in miss)


def test_forwarder_target_parsing():
    assert parse_target("5=10.200.0.1:443") == (5, "10.200.0.1", 443, "tcp")
    assert parse_target("7=udp:10.96.0.20:5684") == (7, "10.96.0.20", 5684, "udp")
    for bad in ("x=1.2.3.4:1", "5=1.2.3.4", "5", "5=udp:", "5=udp:1.2.3.4", "5=udp::53"):
        with pytest.raises(ValueError):
            parse_target(bad)
    # what start_forwarder writes is what the forwarder reads, either protocol
    for t in ((5, "10.200.0.1", 443, "tcp"), (7, "10.96.0.20", 5684, "udp")):
        assert parse_target(format_target(*t)) == t
    assert format_target(5, "127.0.0.1", 80) == "5=127.0.0.1:80"
    with pytest.raises(ValueError):
        format_target(5, "127.0.0.1", 80, "sctp")
