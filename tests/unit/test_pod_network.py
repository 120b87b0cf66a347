"""Pods on the pod network (kubernetes.host_network: false) and the cluster's service network (kube-proxy, CoreDNS):
what is rendered from a stack and for the cluster. Pure logic, no cluster (tests/integration/
test_kubernetes_service_network.py runs it on one)."""
import textwrap
from pathlib import Path

import pytest

from monsoon.spec.stack import ReadySpec, load_stack
from monsoon.spec.yamlio import SpecError
from monsoon.stack import cluster
from monsoon.stack.pods import PodError, deployment_manifest, port_owners, readiness_probe, service_manifest
from monsoon.stack.reaper import RUN_LABEL
from monsoon.stack.supervisor import render

D = Path("/cache/k8s/cluster")


def texts_of(stack):
    out = {}
    for n in stack.pods():
        sp = stack.services[n]
        ready = [v for v in (sp.ready.tcp, sp.ready.http, sp.ready.cql) if v] if sp.ready else []
        out[n] = [*sp.command, *[str(v) for v in sp.env_for("quick").values()], *ready]
    return out


def test_the_shipped_stacks_run_on_the_pod_network_and_each_port_has_one_listener():
    kafka = load_stack("kafka-k8s")
    assert kafka.kubernetes.host_network is False
    assert port_owners(texts_of(kafka)) == {"postgres": "postgres", "kafka": "kafka", "kafka_controller": "kafka",
                                            "kafka_observer": "kafka", "mqtt": "platform", "http": "platform"}
    env = kafka.services["platform"].env_for("quick")
    assert env["TB_KAFKA_SERVERS"] == "{host:kafka}:{port:kafka}"
    assert env["DATABASE_URL"] == "jdbc:postgresql://{host:postgres}:{port:postgres}/postgres"
    # the broker tells clients in pods its Service's name; monsoon on the host reads lag on the 127.0.0.1 listener
    assert kafka.services["kafka"].env_for("quick")["KAFKA_ADVERTISED"] == "{host:kafka}:{port:kafka}"
    assert kafka.observe.kafka.bootstrap == "127.0.0.1:{port:kafka_observer}"
    mem = load_stack("inmemory-k8s")
    assert mem.kubernetes.host_network is False
    assert port_owners(texts_of(mem)) == {"postgres": "postgres", "mqtt": "platform", "http": "platform"}


def test_a_port_two_services_listen_on_is_refused_in_one_line():
    with pytest.raises(PodError) as e:
        port_owners({"a": ["run", "{port:x}"], "b": ["run", "{port:x}"]})
    assert "{port:x}" in str(e.value) and "'a'" in str(e.value) and "'b'" in str(e.value)
    assert "\n" not in str(e.value)
    # a client names the server: {host:S}:{port:NAME} is S's port, wherever it is written
    assert port_owners({"a": ["{host:b}:{port:x}"], "b": ["serve", "{port:x}"]}) == {"x": "b"}
    assert port_owners({"a": ["jdbc:pg://{host:b}:{port:x}/db", "{port:y}"]}) == {"x": "b", "y": "a"}


def test_a_service_is_a_clusterip_of_the_services_name_selecting_its_pod():
    s = service_manifest(namespace="ns", run_id="r-1", service="kafka",
                         ports={"kafka": 9092, "kafka_controller": 9093, "kafka_observer": 9094})
    assert s["kind"] == "Service" and s["metadata"]["name"] == "kafka" and s["spec"]["type"] == "ClusterIP"
    assert s["spec"]["selector"] == {RUN_LABEL: "r-1", "monsoon.io/service": "kafka"}
    assert s["metadata"]["labels"][RUN_LABEL] == "r-1"
    ports = s["spec"]["ports"]
    assert [(p["port"], p["targetPort"]) for p in ports] == [(9092, 9092), (9093, 9093), (9094, 9094)]
    names = [p["name"] for p in ports]
    assert names == ["kafka", "kafka-controlle", "kafka-observer"]     # IANA service names: 15 characters at most
    assert all(len(n) <= 15 and "_" not in n and not n.endswith("-") for n in names)


def test_a_pod_on_the_pod_network_uses_the_cluster_dns_and_is_probed_on_its_own_ip(tmp_path):
    d = deployment_manifest(namespace="ns", run_id="r-1", service="platform", image="i", command=["x"], env={},
                            workdir=tmp_path, host_network=False,
                            probe=readiness_probe(ReadySpec(http="http://127.0.0.1:8080/health"), str, False))
    pod = d["spec"]["template"]["spec"]
    assert pod["hostNetwork"] is False and pod["dnsPolicy"] == "ClusterFirst"
    # no host: kubelet probes the pod's IP (127.0.0.1 would be the node's own loopback)
    assert pod["containers"][0]["readinessProbe"]["httpGet"] == {"port": 8080, "path": "/health", "scheme": "HTTP"}
    assert readiness_probe(ReadySpec(tcp="127.0.0.1:9092"), str, False)["tcpSocket"] == {"port": 9092}
    assert readiness_probe(ReadySpec(tcp="127.0.0.1:9092"), str)["tcpSocket"] == {"host": "127.0.0.1", "port": 9092}
    hn = deployment_manifest(namespace="ns", run_id="r-1", service="platform", image="i", command=[], env={},
                             workdir=tmp_path)["spec"]["template"]["spec"]
    assert hn["hostNetwork"] is True and hn["dnsPolicy"] == "ClusterFirstWithHostNet"


def test_host_renders_the_services_name_on_the_pod_network_and_loopback_otherwise():
    ports = {"kafka": 9092}
    assert render("{host:kafka}:{port:kafka}", {"host:kafka": "kafka"}, ports) == "kafka:9092"
    assert render("{host:kafka}:{port:kafka}", {}, ports) == "127.0.0.1:9092"


def write_stack(tmp_path, env_value, where="services"):
    p = tmp_path / "s.yaml"
    body = textwrap.dedent(f"""\
        name: s
        provider: kubernetes
        kubernetes: {{host_network: false}}
        services:
          db:
            image: i
            command: [x, '{{port:pg}}']
          platform:
            image: i
            command: [x, '{{port:mqtt}}']
            env: {{DB: "{env_value}"}}
        devices: {{port: "{{port:mqtt}}"{', host: "' + env_value + '"' if where == 'devices' else ''}}}
        provisioning: none
        storage: {{dsn: "postgresql://x@127.0.0.1:{{port:pg}}/p", loss_query: "SELECT 1"}}
        observe: {{service: platform}}
        """)
    p.write_text(body)
    return p


def test_host_names_a_service_of_the_stack_and_only_inside_a_service(tmp_path):
    assert load_stack(write_stack(tmp_path, "{host:db}:{port:pg}")).kubernetes.host_network is False
    with pytest.raises(SpecError) as e:
        load_stack(write_stack(tmp_path, "{host:dbx}:{port:pg}"))
    assert e.value.key == "services.platform.env.DB" and "no service 'dbx'" in str(e.value)
    with pytest.raises(SpecError) as e:
        load_stack(write_stack(tmp_path, "{host}:{port:pg}"))
    assert "unknown placeholder {host}" in str(e.value)
    with pytest.raises(SpecError) as e:
        load_stack(write_stack(tmp_path, "{host:db}", where="devices"))
    assert e.value.key == "devices.host"


def test_kube_proxy_writes_no_sysctl_and_coredns_answers_only_the_cluster():
    argv, _ = cluster.daemon_argv("kube-proxy", D, Path("/b"))
    assert argv[0] == "/b/kube-proxy" and "--proxy-mode=iptables" in argv
    # conntrack limits and timeouts left as they are, no route_localnet: nothing under /proc/sys or /sys
    for flag in ("--conntrack-max-per-core=0", "--conntrack-min=0", "--conntrack-tcp-timeout-established=0",
                 "--conntrack-tcp-timeout-close-wait=0", "--iptables-localhost-nodeports=false"):
        assert flag in argv
    assert f"--cluster-cidr={cluster.POD_CIDR}" in argv and f"--kubeconfig={D}/kubeconfig.inside" in argv
    assert any(a.startswith("--healthz-bind-address=127.0.0.1:") for a in argv)
    assert any(a.startswith("--metrics-bind-address=127.0.0.1:") for a in argv)
    assert "--masquerade-all" not in argv
    assert "--masquerade-all" in cluster.daemon_argv("kube-proxy", D, Path("/b"), masquerade_all=True)[0]
    assert cluster.daemon_argv("coredns", D, Path("/b"))[0] == ["/b/coredns", "-conf", f"{D}/Corefile"]
    cf = cluster.corefile(D / "kubeconfig.inside")
    assert f"bind {cluster.NODE_IP}" in cf and f"kubeconfig {D}/kubeconfig.inside" in cf
    assert "kubernetes cluster.local in-addr.arpa ip6.arpa" in cf
    assert "forward" not in cf and "rcode NXDOMAIN" in cf        # nothing leaves the namespace
    assert f"ready 127.0.0.1:{cluster.COREDNS_READY}" in cf and f"health 127.0.0.1:{cluster.COREDNS_HEALTH}" in cf
    assert cluster.kubelet_config(D)["clusterDNS"] == [cluster.DNS_IP]
    (svc_path, svc), (eps_path, eps) = cluster.dns_objects()
    assert svc_path.endswith("/namespaces/kube-system/services") and svc["spec"]["clusterIP"] == cluster.DNS_IP
    assert "selector" not in svc["spec"]
    assert {(p["protocol"], p["port"]) for p in svc["spec"]["ports"]} == {("UDP", 53), ("TCP", 53)}
    assert eps["metadata"]["labels"]["kubernetes.io/service-name"] == "kube-dns"
    assert eps["endpoints"][0]["addresses"] == [cluster.NODE_IP]
    assert cluster.DAEMONS.index("kube-proxy") < cluster.DAEMONS.index("kube-apiserver")
    assert cluster.DAEMONS.index("coredns") < cluster.DAEMONS.index("kube-apiserver")
