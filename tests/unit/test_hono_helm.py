"""Hono by its own Helm chart (stacks/hono-helm.yaml): tools/build-hono-chart copies the chart unchanged but for
Chart.yaml's dependencies, tools/build-hono-images skips in one line without Hono's jars, the stack's own pods
(Kafka, Postgres) go beside the release on the pod network, and `helm template` of the fetched chart with the
stack's values gives what the stack expects (skips in one line where the chart or Helm is not there)."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from monsoon.paths import REPO
from monsoon.settings import cache_dir
from monsoon.spec.stack import load_stack
from monsoon.stack import helm

TOOL = REPO / "tools/build-hono-chart"
CHART_YAML = """apiVersion: v2
name: hono
description: |
  Eclipse Hono
version: 2.6.6
# Version of Hono being deployed by the chart
appVersion: 2.6.0
keywords:
- IoT
dependencies:
- name: "kafka"
  repository: "oci://registry-1.docker.io/bitnamicharts"
  version: "^26.8"
  condition: "kafkaMessagingClusterExample.enabled"
- name: "grafana"
  version: "^6.x"
  repository: "https://grafana.github.io/helm-charts"
  condition: "grafana.enabled"
"""


def fake_chart(root: Path, chart_yaml: str = CHART_YAML) -> Path:
    """A copy of eclipse/packages as the tool is given it: charts/hono with a Chart.yaml, values and a template."""
    d = root / "packages" / "charts" / "hono"
    (d / "templates").mkdir(parents=True)
    (d / "Chart.yaml").write_text(chart_yaml)
    (d / "values.yaml").write_text("adapters: {http: {enabled: true}}\n")
    (d / "templates" / "svc.yaml").write_bytes(b"{{- if .Values.adapters.http.enabled }}\nkind: Service\n{{- end }}\n")
    return root / "packages"


def run(tool: Path, *args: str, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(tool), *args], capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "MONSOON_CACHE": str(cache)})


def test_the_chart_is_copied_unchanged_but_for_its_dependencies(tmp_path):
    src = fake_chart(tmp_path)
    r = run(TOOL, str(src), cache=tmp_path / "cache")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "cache" / "hono-chart" / "2.6.6"
    chart = (out / "hono" / "Chart.yaml").read_text()
    assert "dependencies" not in chart and "bitnami" not in chart
    # every other line of Chart.yaml as it was, in order
    assert chart == CHART_YAML.split("dependencies:")[0]
    for f in ("values.yaml", "templates/svc.yaml"):     # byte for byte
        assert (out / "hono" / f).read_bytes() == (src / "charts" / "hono" / f).read_bytes()
    stamp = dict(line.split("=", 1) for line in (out / "BUILT").read_text().splitlines())
    assert stamp["chart_version"] == "2.6.6" and stamp["removed_dependencies"] == "kafka grafana"
    assert "removed from Chart.yaml: dependencies (kafka grafana)" in r.stderr
    again = run(TOOL, cache=tmp_path / "cache")        # idempotent: built, so no source needed
    assert again.returncode == 0 and "already in" in again.stderr


@pytest.mark.parametrize("edit, msg", [
    (None, "usage: tools/build-hono-chart SRC_DIR"),
    ("name: hono", "is not Hono's chart"),
    ("version: 2.6.6", "not 2.6.6 (appVersion 2.6.0)"),
])
def test_the_chart_tool_refuses_what_is_not_the_chart(tmp_path, edit, msg):
    args: list[str] = []
    if edit is not None:
        wrong = {"name: hono": "name: other", "version: 2.6.6": "version: 2.6.5"}[edit]
        args = [str(fake_chart(tmp_path, CHART_YAML.replace(edit, wrong, 1)))]
    r = run(TOOL, *args, cache=tmp_path / "cache")
    assert r.returncode == 2 and msg in r.stderr, r.stderr
    assert not (tmp_path / "cache" / "hono-chart" / "2.6.6" / "BUILT").exists()


def test_the_image_tool_skips_in_one_line_without_honos_jars(tmp_path):
    r = run(REPO / "tools/build-hono-images", cache=tmp_path)
    assert r.returncode == 0
    assert r.stderr.strip().count("\n") == 0 and "tools/build-hono <a clone" in r.stderr


def test_the_stack_is_a_release_with_monsoons_own_pods_beside_it():
    s = load_stack("hono-helm")
    assert s.releases() == ["service-auth", "service-device-registry", "service-command-router", "adapter-http",
                            "adapter-coap"]
    assert s.pods() == ["postgres", "kafka", "infinispan", "toxiproxy"] and s.provider_of("backend") == "process"
    # the data grid's hop is routed before the install (the router's readiness needs its cache); the backend, which
    # needs only Kafka, starts then too
    assert s.before_release() == ["postgres", "kafka", "infinispan", "toxiproxy", "routes", "backend"]
    assert s.helm.replicas == {"service-command-router": 2, "adapter-http": 2, "adapter-coap": 2}
    assert s.chaos.toxiproxy == "http://127.0.0.1:{port:toxiproxy}"
    assert s.helm_release() == "hono" and s.kube_namespace() == "monsoon-hono-helm"
    assert s.observe.kubernetes.label_selector == {"app.kubernetes.io/instance": "hono",
                                                   "app.kubernetes.io/component": "adapter-http"}
    assert s.ports["hono_http"] == 8080 and s.ports["hono_registry"] == 28080     # the chart's Service ports
    assert s.ports["hono_coaps"] == 5684 and s.devices.port_of("hono-coap") == ("hono-coap", "{port:hono_coaps}")


def test_own_pods_beside_a_release_are_on_the_pod_network(tmp_path):
    from monsoon.stack.supervisor import Stack
    st = Stack(load_stack("hono-helm"), tmp_path, run_id="run-1")
    assert st._pod_network()
    st.ports = {"hono_http": 8080, "hono_registry": 28080, "kafka": 30001, "kafka_observer": 30002}
    r = st._helm_release(mirrored=[30001, 30002], namespace_ready=True)
    assert sorted(r.ports) == [8080, 28080] and r.namespace_ready       # the release mirrors only its own


def test_a_release_in_the_runs_namespace_neither_makes_nor_deletes_it(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(helm, "uninstall", lambda *a, **k: calls.append(a))
    r = helm.Release(load_stack("hono-helm"), tmp_path, run_id="run-1", render=lambda v: v, ports=[],
                     on_event=lambda t, **f: None, namespace_ready=True)

    class Kube:
        deleted: list = []

        def ensure_namespace(self, *a, **k):
            raise AssertionError("the namespace is there already")

        def delete_namespace(self, name, timeout=120.0):
            self.deleted.append(name)
            return True

    r.kube = Kube()
    r.installed = True
    r.stop()
    assert len(calls) == 1 and Kube.deleted == []      # uninstalled; the namespace is the supervisor's to delete


def test_the_fetched_chart_renders_the_stacks_values(tmp_path, monkeypatch):
    """The chart as tools/build-hono-chart left it, with hono-helm's values as monsoon writes them: the five
    components in the images the stack imports, ClusterIP Services on the ports the stack mirrors, Kafka and the
    registry's database at monsoon's pods' Services, and none of the chart's own dependencies or example Jobs."""
    chart = cache_dir() / "hono-chart" / "2.6.6" / "hono"
    if not (chart / "Chart.yaml").is_file():
        pytest.skip(f"Hono's chart is not there ({chart}): tools/build-hono-chart <a clone of github.com/eclipse/packages>")
    if helm.helm_binary() is None:
        pytest.skip(helm.not_built())
    from monsoon.stack.supervisor import render
    spec = load_stack("hono-helm")
    ports = {n: 20000 + i for i, n in enumerate(spec.port_names())} | {k: v for k, v in spec.ports.items()
                                                                       if v != "auto"}
    ctx = {"repo": str(REPO), "cache": "/c", "python": "py", "run_dir": str(tmp_path), "stack_dir": str(tmp_path),
           "stack_file_dir": str(REPO / "stacks")}
    monkeypatch.setattr(helm.os, "getpid", lambda: 4242)
    r = helm.Release(spec, tmp_path, run_id="run-1", render=lambda v: render(v, ctx, ports), ports=[],
                     on_event=lambda t, **f: None)
    out = subprocess.run([str(helm.helm_binary()), "template", "hono", str(chart), "--namespace", "monsoon-hono-helm",
                          "-f", str(r.values_file())], capture_output=True, text=True,
                         env=helm.helm_env(Path("/nonexistent")))
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert not [d for d in docs if d["kind"] in ("Job", "StatefulSet", "PersistentVolumeClaim")]
    deps = {d["metadata"]["labels"]["app.kubernetes.io/component"]: d["spec"]["template"]["spec"] for d in docs
            if d["kind"] == "Deployment"}
    assert sorted(deps) == sorted(spec.releases())
    for name, pod in deps.items():
        c = pod["containers"][0]
        assert c["name"] == name and c["image"] == spec.services[name].image        # imported before the install
        assert "cpu" not in c["resources"]["limits"] and c["resources"]["limits"]["memory"].endswith("Mi")
        # the chart's default logging profile, dev, logs org.eclipse.hono at DEBUG: every request, with stack traces
        env = {e["name"]: e.get("value") for e in c.get("env") or []}
        assert env["QUARKUS_CONFIG_LOCATIONS"].endswith("/logging-quarkus-prod.yml"), name
    svcs = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "Service"}
    assert all(s.get("type", "ClusterIP") == "ClusterIP" for s in svcs.values())
    assert not [p for s in svcs.values() for p in s["ports"] if "nodePort" in p]
    assert {p["port"] for p in svcs["hono-adapter-http"]["ports"]} >= {8080}
    assert {p["port"] for p in svcs["hono-service-device-registry-ext"]["ports"]} >= {28080}
    # the CoAP adapter's DTLS port only, over UDP: what the port mirror carries as UDP (helm.service_targets)
    assert helm.service_targets([{"spec": {"clusterIP": "10.96.0.9", **svcs["hono-adapter-coap"]}}], [5684, 5683],
                                "UDP") == {5684: "10.96.0.9"}
    conf = {d["metadata"]["name"]: yaml.safe_load(d["stringData"]["application.yml"]) for d in docs
            if d["kind"] == "Secret" and "application.yml" in (d.get("stringData") or {})}
    assert conf["hono-adapter-coap-conf"]["hono"]["coap"]["port"] == 5684
    for name in ("hono-adapter-http-conf", "hono-adapter-coap-conf", "hono-service-device-registry-conf",
                 "hono-service-command-router-conf"):
        assert conf[name]["hono"]["kafka"]["commonClientConfig"]["bootstrap.servers"] == f"kafka:{ports['kafka']}"
    jdbc = conf["hono-service-device-registry-conf"]["hono"]["registry"]["jdbc"]["adapter"]
    assert jdbc["url"] == f"jdbc:postgresql://postgres:{ports['postgres']}/postgres"


def test_a_psk_key_goes_to_the_registry_as_its_json_decoder_reads_it():
    """Hono's images (and tools/build-hono-images') run with -Dvertx.json.base64=legacy: standard Base64 there, a
    '-' or '_' answered 400; run-hono's processes use Vert.x's default, Base64url. hono-helm says which."""
    import base64
    from monsoon.stack.provision import psk_credential, psk_key
    secret = next(s for s in (f"t{i}" for i in range(1000))
                  if set(base64.b64encode(psk_key(s)).decode()) & set("+/"))
    std = psk_credential("d", secret, "base64")["secrets"][0]["key"]
    url = psk_credential("d", secret)["secrets"][0]["key"]
    assert base64.b64decode(std, validate=True) == psk_key(secret) == base64.urlsafe_b64decode(url)
    assert set(std) & set("+/") and not set(url) & set("+/")
    assert load_stack("hono-helm").provisioning.psk_key_encoding == "base64"
    assert load_stack("hono-kafka-toxiproxy").provisioning.psk_key_encoding == "base64url"


def test_replicas_scale_the_one_workload_of_a_service_and_wait_for_it(tmp_path):
    """helm.replicas: the Deployment labelled as the service's pods is patched to the count, and the start returns
    once that many pods are ready; no workload (or two) under the service's labels is an error naming them."""
    from types import SimpleNamespace as NS
    events: list = []
    r = helm.Release(load_stack("hono-helm"), tmp_path, run_id="run-1", render=lambda v: v, ports=[],
                     on_event=lambda t, **f: events.append(f))

    class Apps:
        def __init__(self, deployments):
            self.deployments, self.patched, self.reads = deployments, [], 0

        def list_namespaced_deployment(self, ns, label_selector, _request_timeout):
            self.selector = label_selector
            return NS(items=[NS(metadata=NS(name=n)) for n in self.deployments])

        def list_namespaced_stateful_set(self, ns, label_selector, _request_timeout):
            return NS(items=[])

        def patch_namespaced_deployment_scale(self, name, ns, body, _request_timeout):
            self.patched.append((name, ns, body))

        def read_namespaced_deployment(self, name, ns, _request_timeout):
            self.reads += 1
            return NS(status=NS(ready_replicas=1 if self.reads < 2 else 2))

    apps = Apps(["hono-adapter-http"])
    r.kube = NS(apps=apps, why_not_running=lambda ns: "")
    helm.time.sleep, real_sleep = (lambda s: None), helm.time.sleep
    try:
        r._scale("adapter-http", 2)
        assert apps.selector == "app.kubernetes.io/component=adapter-http,app.kubernetes.io/instance=hono"
        assert apps.patched == [("hono-adapter-http", "monsoon-hono-helm", {"spec": {"replicas": 2}})]
        assert apps.reads == 2 and events[-1]["event"] == "scaled" and events[-1]["replicas"] == 2
        r.kube = NS(apps=Apps([]), why_not_running=lambda ns: "")
        with pytest.raises(helm.HelmError, match="helm.replicas.adapter-http: 0 workloads labelled"):
            r._scale("adapter-http", 2)
    finally:
        helm.time.sleep = real_sleep
