"""The pure parts of provider: helm: the stack's helm section (validated with file, line and key), helm's argv,
the values monsoon renders, the census read from Helm's release Secrets, and what stop does (and does not) do."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from monsoon.paths import REPO
from monsoon.spec.stack import load_stack
from monsoon.spec.yamlio import SpecError
from monsoon.stack import helm

BASE = """name: rel
provider: helm
helm:
  chart: chart
  values: {ports: {mqtt: "{port:mqtt}"}}
services:
  platform:
    ready: {tcp: "127.0.0.1:{port:mqtt}"}
devices: {port: "{port:mqtt}"}
provisioning: none
storage: {dsn: "postgresql://127.0.0.1:1/x", loss_query: "SELECT 1"}
observe: {service: platform}
"""


def write(tmp_path: Path, text: str = BASE, chart: bool = True) -> Path:
    if chart:
        (tmp_path / "chart").mkdir(exist_ok=True)
        (tmp_path / "chart" / "Chart.yaml").write_text("apiVersion: v2\nname: c\nversion: 0.1.0\n")
    p = tmp_path / "s.yaml"
    p.write_text(text)
    return p


def error(p: Path) -> SpecError:
    with pytest.raises(SpecError) as e:
        load_stack(p)
    return e.value


def test_the_shipped_helm_stack_is_one_release_of_monsoons_chart():
    s = load_stack("kafka-helm")
    assert s.releases() == ["postgres", "kafka", "platform"] and s.helm_release() == "kafka-helm"
    assert s.kube_namespace() == "monsoon-kafka-helm"
    assert s.observe.kubernetes.label_selector == {"app.kubernetes.io/instance": "kafka-helm",
                                                   "app.kubernetes.io/component": "platform"}
    assert helm.helm_path(s.helm.chart, s.source) == REPO / "stacks" / "charts" / "reference-platform"
    assert {"postgres", "kafka", "kafka_controller", "mqtt", "http"} <= set(s.port_names())


def test_a_minimal_release_stack_defaults_its_name_namespace_and_selector(tmp_path):
    s = load_stack(write(tmp_path))
    assert (s.helm_release(), s.kube_namespace(), s.helm.install, s.helm.timeout) == ("rel", "monsoon-rel", True, 300)
    assert s.helm.selector_of("platform", "rel") == {"app.kubernetes.io/instance": "rel",
                                                     "app.kubernetes.io/component": "platform"}


@pytest.mark.parametrize("edit, line, key, words", [
    (("chart: chart", "chart: nowhere"), 4, "helm.chart", "no such chart"),
    (("chart: chart", "chart: ."), 4, "helm.chart", "no Chart.yaml"),
    (("  values:", "  values_files: [v.yaml]\n  values:"), 5, "helm.values_files.0", "no such values file"),
    (("    ready:", "    command: [x]\n    ready:"), 8, "services.platform.command", "the chart says"),
    (("    ready:", "    oneshot: true\n    ready:"), 8, "services.platform.oneshot", "oneshot"),
    (("  values:", "  pods: {nope: {labelSelector: {a: b}}}\n  values:"), 5, "helm.pods.nope", "no service"),
    (("  chart: chart", "  release: Not_A_Name\n  chart: chart"), 4, "helm.release", "not a valid name"),
    (("  chart: chart", "  install: false\n  chart: chart"), 3, "helm", "install: false"),
    (("  values:", "  replicas: {nope: 2}\n  values:"), 5, "helm.replicas.nope", "no service"),
    (("  values:", "  replicas: {platform: 0}\n  values:"), 5, "helm.replicas", "at least 1"),
    (("helm:\n  chart: chart\n  values: {ports: {mqtt: \"{port:mqtt}\"}}\n", ""), 2, "provider", "needs the helm"),
    (("provider: helm", "provider: helm\nkubernetes: {namespace: x}"), 3, "kubernetes", "not both"),
])
def test_a_bad_helm_section_is_refused_naming_file_line_and_key(tmp_path, edit, line, key, words):
    e = error(write(tmp_path, BASE.replace(*edit)))
    assert (e.line, e.key) == (line, key) and words in e.message, str(e)
    assert str(e).startswith(f"{tmp_path / 's.yaml'}:{line}:") and "\n" not in str(e)


def test_a_release_monsoon_did_not_install_needs_its_name_and_namespace(tmp_path):
    text = BASE.replace("  chart: chart\n  values: {ports: {mqtt: \"{port:mqtt}\"}}\n", "  install: false\n")
    assert "needs release and namespace" in error(write(tmp_path, text)).message
    s = load_stack(write(tmp_path, text.replace("install: false", "install: false\n  release: tb\n  namespace: iot")))
    assert (s.helm_release(), s.kube_namespace(), s.helm.install) == ("tb", "iot", False)


def test_helm_install_and_uninstall_argv():
    argv = helm.install_argv("/h", release="r", chart=Path("/c"), namespace="ns", kubeconfig="/kc",
                             values_files=[Path("/a.yaml"), Path("/b.yaml")],
                             labels=helm.release_labels("run-1", 42), timeout=240.5)
    assert argv == ["/h", "install", "r", "/c", "--namespace", "ns", "--kubeconfig", "/kc", "--wait", "--timeout",
                    "240s", "--labels", "monsoon.io/owner-pid=42,monsoon.io/run-id=run-1",
                    "--values", "/a.yaml", "--values", "/b.yaml"]
    assert helm.uninstall_argv("/h", release="r", namespace="ns", kubeconfig="/kc", timeout=60) == \
        ["/h", "uninstall", "r", "--namespace", "ns", "--kubeconfig", "/kc", "--wait", "--timeout", "60s",
         "--ignore-not-found"]
    with pytest.raises(ValueError):
        helm.release_labels("bad run id!", 1)


def test_values_are_rendered_and_a_lone_port_becomes_a_number():
    ports = {"mqtt": 31883, "http": 18080}

    def render(v: str) -> str:
        return v.replace("{port:mqtt}", str(ports["mqtt"])).replace("{port:http}", str(ports["http"])) \
            .replace("{run_dir}", "/runs/r")
    out = helm.render_values({"ports": {"mqtt": "{port:mqtt}"}, "url": "http://127.0.0.1:{port:http}/x",
                              "dirs": ["{run_dir}/services", 3, True], "n": None}, render)
    assert out == {"ports": {"mqtt": 31883}, "url": "http://127.0.0.1:18080/x", "dirs": ["/runs/r/services", 3, True],
                   "n": None}


def secret(name: str, ns: str, version: int, status: str = "deployed", **labels: str) -> dict:
    return {"metadata": {"namespace": ns, "labels": {"owner": "helm", "name": name, "version": str(version),
                                                    "status": status, **labels}}}


def test_the_census_reads_each_releases_newest_secret():
    refs = helm.releases_from_secrets([
        secret("kafka-helm", "monsoon-kafka-helm", 1, "superseded", **{"monsoon.io/run-id": "r1",
                                                                      "monsoon.io/owner-pid": "4242"}),
        secret("kafka-helm", "monsoon-kafka-helm", 2, "pending-install", **{"monsoon.io/run-id": "r1",
                                                                           "monsoon.io/owner-pid": "4242"}),
        secret("other", "a", 1),
        {"metadata": {"namespace": "x", "labels": {"owner": "someone", "name": "n"}}},
        {"metadata": {"namespace": "x"}},
    ])
    assert [(r.namespace, r.name, r.version, r.status, r.run_id, r.owner_pid) for r in refs] == [
        ("a", "other", 1, "deployed", None, None),
        ("monsoon-kafka-helm", "kafka-helm", 2, "pending-install", "r1", 4242)]
    assert str(refs[1]) == "helm release monsoon-kafka-helm/kafka-helm (pending-install, revision 2)"


def test_monsoons_helm_is_looked_for_in_the_cache_then_on_path(monkeypatch, tmp_path):
    monkeypatch.setattr(helm, "CACHE", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    assert helm.helm_binary() is None
    assert helm.not_built() == f"helm: not built ({tmp_path}/k8s/bin/helm, and none on PATH): run make k8s"
    b = tmp_path / "k8s" / "bin" / "helm"
    b.parent.mkdir(parents=True)
    b.write_text("#!/bin/sh\n")
    b.chmod(0o755)
    assert helm.helm_binary() == b and helm.not_built() is None
    env = helm.helm_env(Path("/kc"))
    assert env["KUBECONFIG"] == "/kc" and env["HELM_CONFIG_HOME"].startswith(str(tmp_path))


class FakeKube:
    def __init__(self):
        self.deleted: list[str] = []

    def delete_namespace(self, name, timeout=120.0):
        self.deleted.append(name)
        return True


def release(tmp_path: Path, text: str, monkeypatch) -> tuple[helm.Release, list, list]:
    calls: list = []
    events: list = []
    monkeypatch.setattr(helm, "uninstall", lambda *a, **k: calls.append(a))
    spec = load_stack(write(tmp_path, text))
    r = helm.Release(spec, tmp_path / "run", run_id="run-1", render=lambda v: v.replace("{port:mqtt}", "31883"),
                     ports=[31883], on_event=lambda t, **f: events.append(f))
    r.kube = FakeKube()
    return r, calls, events


def test_stop_uninstalls_what_monsoon_installed_and_deletes_its_namespace(tmp_path, monkeypatch):
    r, calls, events = release(tmp_path, BASE, monkeypatch)
    r.stop()                    # nothing started: nothing to undo
    assert calls == [] and events == []
    r.installed, r.namespace_created = True, True      # helm install was called (whatever it answered)
    r.stop()
    r.stop()                    # a second stop does nothing more
    assert calls == [("rel", "monsoon-rel", 300.0, r.log_path)] and r.kube.deleted == ["monsoon-rel"]
    assert [(e["op"], e["event"]) for e in events] == [("helm-release", "uninstalled"), ("namespace", "deleted")]


def test_a_release_monsoon_did_not_install_is_never_uninstalled(tmp_path, monkeypatch):
    text = BASE.replace("  chart: chart\n  values: {ports: {mqtt: \"{port:mqtt}\"}}\n",
                        "  install: false\n  release: tb\n  namespace: iot\n")
    r, calls, events = release(tmp_path, text, monkeypatch)
    r.stop()
    assert calls == [] and r.kube.deleted == [] and events == []
    pod = r.podproc("platform", tmp_path / "p.log")
    assert pod.selector == "app.kubernetes.io/component=platform,app.kubernetes.io/instance=tb"
    assert pod.service == "platform" and pod.created        # the container; never a Deployment of monsoon's


def test_the_run_values_carry_the_run_for_the_charts_labels(tmp_path, monkeypatch):
    r, _, _ = release(tmp_path, BASE, monkeypatch)
    r.dir.mkdir(parents=True)
    values = yaml.safe_load(r.values_file().read_text())
    assert values["ports"] == {"mqtt": 31883} and values["monsoon"]["runId"] == "run-1"
    assert isinstance(values["monsoon"]["ownerPid"], int)


def test_the_chart_renders_the_stacks_values(tmp_path):
    """monsoon's chart with its default hostNetwork: true and the ports given: every service on the host network,
    on those ports, labelled for the selector the stack uses (helm template, when Helm is built)."""
    if helm.helm_binary() is None:
        pytest.skip(helm.not_built())
    import subprocess
    values = tmp_path / "v.yaml"
    values.write_text(yaml.safe_dump({"ports": {"postgres": 15432, "kafka": 19092, "kafkaController": 19093,
                                                "mqtt": 11883, "http": 18080}, "monsoon": {"runId": "run-1"}}))
    out = subprocess.run([str(helm.helm_binary()), "template", "rel", str(REPO / "stacks/charts/reference-platform"),
                          "-f", str(values)], capture_output=True, text=True, env=helm.helm_env(Path("/nonexistent")))
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    deps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
    assert sorted(deps) == ["rel-kafka", "rel-platform", "rel-postgres"]
    assert sorted(d["metadata"]["name"] for d in docs if d["kind"] == "Service") == sorted(deps)
    plat = deps["rel-platform"]["spec"]["template"]
    assert plat["spec"]["hostNetwork"] is True
    assert plat["metadata"]["labels"]["monsoon.io/run-id"] == "run-1"
    assert plat["metadata"]["labels"]["app.kubernetes.io/component"] == "platform"
    env = {e["name"]: e.get("value") for e in plat["spec"]["containers"][0]["env"]}
    assert env["TB_KAFKA_SERVERS"] == "127.0.0.1:19092" and env["MQTT_BIND_PORT"] == "11883"


def test_the_shipped_stack_renders_the_chart_on_the_pod_network_as_kafka_k8s_runs(tmp_path, monkeypatch):
    """kafka-helm's own values, rendered as monsoon writes <run>/helm-values.yaml, through `helm template` into the
    run's namespace: the pods on the pod network like kafka-k8s's (issue 43: with the images' run-kafka and
    run-postgres, older than their bind-address options, Kafka and Postgres bound 127.0.0.1 in their pods, kubelet's
    probes of the pod IPs never passed and `helm install --wait` timed out)."""
    if helm.helm_binary() is None:
        pytest.skip(helm.not_built())
    import subprocess
    from monsoon.stack.supervisor import render
    spec = load_stack("kafka-helm")
    ports = {n: 20000 + i for i, n in enumerate(spec.port_names())}
    ctx = {"repo": str(REPO), "cache": "/c", "python": "py", "run_dir": str(tmp_path), "stack_dir": str(tmp_path),
           "stack_file_dir": str(REPO / "stacks")}
    monkeypatch.setattr(helm.os, "getpid", lambda: 4242)
    r = helm.Release(spec, tmp_path, run_id="run-1", render=lambda v: render(v, ctx, ports), ports=[],
                     on_event=lambda t, **f: None)
    ns, rel = spec.kube_namespace(), spec.helm_release()
    out = subprocess.run([str(helm.helm_binary()), "template", rel, str(REPO / "stacks/charts/reference-platform"),
                          "--namespace", ns, "-f", str(r.values_file())], capture_output=True, text=True,
                         env=helm.helm_env(Path("/nonexistent")))
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    pods = {d["metadata"]["name"].removeprefix(f"{rel}-"): d["spec"]["template"]["spec"] for d in docs
            if d["kind"] == "Deployment"}
    svcs = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Service"}
    assert sorted(pods) == ["kafka", "platform", "postgres"]
    dns = {s: f"{rel}-{s}.{ns}.svc" for s in pods}        # a Service of that name for each, in the run's namespace
    assert sorted(svcs) == sorted(n.split(".")[0] for n in dns.values())

    def env(s: str) -> dict:
        return {e["name"]: e.get("value") for e in pods[s]["containers"][0]["env"]}

    def script(s: str, name: str) -> Path:      # the file the container runs: the checkout's, mounted over the image's
        c = pods[s]["containers"][0]
        (m,) = [m for m in c["volumeMounts"] if m["name"] == "scripts"]
        (v,) = [v for v in pods[s]["volumes"] if v["name"] == "scripts"]
        assert c["command"][0] == f"{m['mountPath']}/{name}"
        return Path(v["hostPath"]["path"]) / name

    for s, c in pods.items():
        assert c["hostNetwork"] is False and c["dnsPolicy"] == "ClusterFirst"
        probe = c["containers"][0]["readinessProbe"]
        assert "host" not in (probe.get("tcpSocket") or probe.get("httpGet")), (s, probe)   # kubelet: the pod's IP
    # Kafka: both listeners on all addresses, the pods' advertising the Service's name, the host's 127.0.0.1
    k = env("kafka")
    assert "KAFKA_BIND_ADDRESS" in script("kafka", "run-kafka").read_text() and k["KAFKA_BIND_ADDRESS"] == "0.0.0.0"
    assert k["KAFKA_ADVERTISED"] == f"{dns['kafka']}:{ports['kafka']}"
    assert k["KAFKA_OBSERVER_PORT"] == str(ports["kafka_observer"])
    assert {p["port"] for p in svcs[f"{rel}-kafka"]["ports"]} == {ports["kafka"], ports["kafka_observer"]}
    assert spec.observe.kafka.bootstrap == "127.0.0.1:{port:kafka_observer}"
    # Postgres on all addresses, other pods' IPs trusted
    assert "PG_LISTEN_ADDRESSES" in script("postgres", "run-postgres").read_text()
    assert env("postgres")["PG_LISTEN_ADDRESSES"] == "*"
    # the platform reaches both by their Services' names and is reached on its own IP
    p = env("platform")
    assert p["TB_KAFKA_SERVERS"] == f"{dns['kafka']}:{ports['kafka']}"
    assert p["DATABASE_URL"] == f"jdbc:postgresql://{dns['postgres']}:{ports['postgres']}/postgres"
    assert p["MQTT_BIND_ADDRESS"] == p["HTTP_BIND_ADDRESS"] == "0.0.0.0"
    assert {x["port"] for x in svcs[f"{rel}-platform"]["ports"]} == {ports["mqtt"], ports["http"]}
    wait = pods["platform"]["initContainers"][0]["command"][-1]
    assert f"{dns['postgres']}/{ports['postgres']}" in wait and f"{dns['kafka']}/{ports['kafka']}" in wait
    # every port monsoon mirrors to this host is a Service's (the mirror goes to the ClusterIPs)
    exposed = {x["port"] for v in svcs.values() for x in v["ports"]}
    assert {ports[n] for n in ("postgres", "kafka", "kafka_observer", "mqtt", "http")} <= exposed


def test_a_release_on_the_pod_network_is_mirrored_to_its_services():
    services = [{"spec": {"clusterIP": "10.96.0.12", "ports": [{"port": 31883}, {"port": 18080, "protocol": "TCP"}]}},
                {"spec": {"clusterIP": "None", "ports": [{"port": 15432}]}},          # headless: no address
                {"spec": {"clusterIP": "10.96.0.13", "ports": [{"port": 15432}, {"port": 999}]}},
                {"spec": {"clusterIP": "10.96.0.14", "ports": [{"port": 19999, "protocol": "UDP"}]}}]
    assert helm.service_targets(services, [31883, 18080, 15432, 19999]) == \
        {31883: "10.96.0.12", 18080: "10.96.0.12", 15432: "10.96.0.13"}
    # UDP Service ports (Hono's CoAP adapter: coaps 5684/UDP) are the UDP mirror's, apart from the TCP ones
    assert helm.service_targets(services, [31883, 18080, 15432, 19999], "UDP") == {19999: "10.96.0.14"}
    both = [{"spec": {"clusterIP": "10.96.0.10", "ports": [{"port": 53, "protocol": "UDP"}, {"port": 53}]}}]
    assert helm.service_targets(both, [53]) == helm.service_targets(both, [53], "UDP") == {53: "10.96.0.10"}


def test_heal_all_uninstalls_the_release_of_a_dead_run_and_skips_a_live_ones(monkeypatch, tmp_path):
    """The census and `monsoon heal --all` know releases: a run found only by its release's labels is healed when
    its owner is gone (the release uninstalled before the namespaces), skipped while its owner runs."""
    import os

    import monsoon.faults.heal as heal
    import monsoon.stack.reaper as reaper
    uninstalled: list = []
    left = {"run-dead": ["helm release monsoon-kafka-helm/kafka-helm (deployed, revision 1)"]}
    for mod in (reaper, heal):
        monkeypatch.setattr(mod, "process_owners", lambda: {})
        monkeypatch.setattr(mod, "reap", lambda rid=None: [])
    monkeypatch.setattr(heal, "_toxiproxy_apis_of_runs", lambda: [])
    monkeypatch.setattr(heal, "cluster_configured", lambda: False)
    for name in ("namespace_owners", "container_owners"):
        monkeypatch.setattr(heal, name, lambda: {})
    for name in ("reap_containers", "reap_namespaces"):
        monkeypatch.setattr(heal, name, lambda rid=None: [])
    for name in ("container_census", "namespace_census"):
        monkeypatch.setattr(heal, name, lambda rid: [])
    monkeypatch.setattr(heal.cluster, "left_behind", lambda: None)
    monkeypatch.setattr(heal, "release_owners", lambda: {"run-dead": 999_999_999, "run-live": os.getpid()})

    def reap_releases(rid=None):
        uninstalled.append(rid)
        return [x.split()[2] for x in left.pop(rid, [])]
    monkeypatch.setattr(heal, "reap_releases", reap_releases)
    monkeypatch.setattr(heal, "release_census", lambda rid: left.get(rid, []))
    rep = heal.heal_everything(None, state_root=tmp_path)
    assert uninstalled == ["run-dead"] and rep.census == {} and rep.failed == []
    assert "run-dead: uninstalled 1 leftover Helm release(s): monsoon-kafka-helm/kafka-helm" in rep.done
    assert any("run run-live is still live" in n for n in rep.notes), rep.notes


def test_what_needs_nothing_of_the_release_starts_before_it(tmp_path):
    """StackSpec.before_release: monsoon's own pods and the processes whose dependencies (however indirect) hold no
    service of the release; a process needing the release waits for it."""
    text = BASE.replace("provisioning: none", """provisioning: none""").replace("""services:
  platform:""", """services:
  db:
    provider: process
    command: [x]
  route:
    provider: process
    command: [x]
    depends_on: [db]
  after:
    provider: process
    command: [x]
    depends_on: [route, platform]
  platform:""")
    s = load_stack(write(tmp_path, text))
    assert s.before_release() == ["db", "route"]
    assert s.start_order().index("after") > s.start_order().index("platform")


def test_the_faults_and_collectors_find_monsoons_running_cluster_without_kubeconfig(tmp_path, monkeypatch):
    """kubeapi.kubeconfig_file, the faults' and collectors' kubeconfig: KUBECONFIG first; else monsoon's own cluster
    while it runs (its api-port written), as its pods use; else ~/.kube/config; else none."""
    from monsoon.stack import kubeapi
    k8s = tmp_path / "k8s"
    monkeypatch.setenv("MONSOON_K8S_DIR", str(k8s))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert kubeapi.kubeconfig_file() is None and not kubeapi.cluster_configured()
    (tmp_path / "home" / ".kube").mkdir(parents=True)
    (tmp_path / "home" / ".kube" / "config").write_text("x")
    assert kubeapi.kubeconfig_file() == tmp_path / "home" / ".kube" / "config"
    (k8s / "cluster").mkdir(parents=True)
    (k8s / "cluster" / "kubeconfig").write_text("x")
    assert kubeapi.kubeconfig_file() == tmp_path / "home" / ".kube" / "config"     # down: its file is left
    (k8s / "cluster" / "api-port").write_text("16443")
    assert kubeapi.kubeconfig_file() == k8s / "cluster" / "kubeconfig" and kubeapi.cluster_configured()
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "mine"))
    assert kubeapi.kubeconfig_file() == tmp_path / "mine" and not kubeapi.cluster_configured()
