"""Eclipse Hono 2.6.0 installed by its own Helm chart (stacks/hono-helm.yaml) on monsoon's cluster, with the Hono
write-up's story in one load (experiments/hono-cluster-story.yaml): monsoon's Kafka, Postgres, Infinispan and
Toxiproxy pods start first, `helm install --wait` of the fetched chart (templates unchanged, only values ours)
brings every component's pod to ready, the command router and the HTTP adapter are scaled to 2 replicas, and HTTP
devices run the 6:2:2 telemetry/event/command mix through the HTTP adapter's Service: a cold start, warm steady,
500 ms on the command router's data-grid hop (the Toxiproxy pod), one of the two adapter pods killed by Chaos Mesh,
and recovery. Nothing acked is missing from Kafka, every verdict of the story holds, and the release and its
namespace are gone at the end. The same story with CoAP devices (experiments/hono-coap-cluster-story.yaml: monsoon's
native engine, DTLS with the PSK credentials provisioned in the registry) runs through the CoAP adapter's UDP
Service, mirrored as UDP, the kill on one of the two CoAP adapter pods.

Skips in one line without `make k8s` (the cluster, Helm), Hono's chart (tools/build-hono-chart) or Hono's images
(tools/build-hono, tools/build-hono-images)."""
import json
import os
import time
from pathlib import Path

import pytest
import yaml

from monsoon.paths import REPO
from monsoon.selftest.procfs import proc_rss_mb
from monsoon.settings import cache_dir
from monsoon.spec.stack import load_stack
from monsoon.stack import cluster, helm
from monsoon.stack.pods import ClusterUnavailable, cluster_for_session, run_namespaces
from tests.integration.helpers import run_story

pytestmark = pytest.mark.kubernetes    # the session keeps the cluster up through a run of modules marked so

NAMESPACE = "monsoon-hono-helm"
RATE = float(os.environ.get("MONSOON_HONO_HELM_RATE", "20"))   # msg/s of the 6:2:2 mix (the process form: ~49)


def _unbuilt() -> str | None:
    """One line: what of Hono on the chart is not there, and how to get it."""
    why = helm.not_built()
    if why:
        return why
    for svc in load_stack("hono-helm").services.values():
        for req in svc.requires:
            path = Path(req.path.replace("{cache}", str(cache_dir()))) if req.path else None
            if path is not None and not path.exists():
                return f"Hono by its chart: {path} missing: {req.hint}"
    return None


@pytest.fixture(scope="module")
def kube_cluster(request):
    why = _unbuilt()
    if why:
        pytest.skip(why)
    try:
        return cluster_for_session(request.config, (NAMESPACE,))
    except ClusterUnavailable as e:
        pytest.skip(str(e))


def cluster_rss_mb() -> dict[str, float]:
    """The cluster's resident memory now: its daemons (etcd, control plane, kubelet, containerd, shims, proxies)
    and every process in kubelet's kubepods cgroups (the pods' containers), in MiB."""
    daemons = set(cluster._tagged(cluster.Cluster().dir))
    pods: set[int] = set()
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if "kubepods" in (p / "cgroup").read_text():
                    pods.add(int(p.name))
            except OSError:
                pass
    return {"daemons": round(sum(proc_rss_mb(p) for p in daemons - pods), 1),
            "pods": round(sum(proc_rss_mb(p) for p in pods), 1)}


def fixed_rate(name: str, rate: float, new_name: str) -> str:
    """experiments/NAME.yaml with a fixed x1 (its base_rate: auto would calibrate: a second install), renamed."""
    doc = yaml.safe_load((REPO / "experiments" / f"{name}.yaml").read_text())
    doc["name"] = new_name
    doc["load"]["base_rate"] = rate
    doc["load"].pop("base_fraction", None)
    return yaml.safe_dump(doc, sort_keys=False)


def story_on_the_chart(tmp_path, monkeypatch, experiment: str, run_id: str):
    """The experiment on hono-helm (installed, scaled, run, uninstalled), what it measured printed; asserted:
    installed, scaled and uninstalled, nothing acked lost, no namespace of the run left. (result, events)."""
    samples: list[dict] = []
    from monsoon.stack import supervisor

    real_start = supervisor.Stack.start

    def start(self):          # the cluster's RSS once every pod of the release is ready
        out = real_start(self)
        samples.append(cluster_rss_mb())
        return out
    monkeypatch.setattr(supervisor.Stack, "start", start)
    t0 = time.monotonic()
    result, events = run_story(tmp_path, "hono-helm", experiment, run_id)
    rel = [e for e in events if e["type"] == "op" and e.get("op") == "helm-release"]
    imports = [e for e in events if e["type"] == "op" and e.get("op") == "image-import"]
    ready = {e["service"]: e.get("after_s") for e in events if e["type"] == "service" and e.get("event") == "ready"}
    print("helm:", json.dumps(rel))
    print("image imports:", json.dumps([(e["image"], e["seconds"]) for e in imports]))
    print("ready after (s):", json.dumps(ready))
    print("cluster RSS with Hono installed (MiB):", json.dumps(samples))
    f = result.check("no_acked_loss").figures
    print(f"no_acked_loss: {f.get('acked_lost')} of {f.get('acked')} acked lost; story {time.monotonic() - t0:.0f} s;"
          f" {result.failure_message()}")
    for c in result.checks:
        print(" ", c.name, c.verdict, json.dumps(c.figures)[:600])
    assert [e["event"] for e in rel if e["event"] != "scaled"] == ["installed", "uninstalled"], rel
    assert {(e["service"], e["replicas"]) for e in rel if e["event"] == "scaled"} == \
        {("service-command-router", 2), ("adapter-http", 2), ("adapter-coap", 2)}, rel
    assert result.check("no_acked_loss").verdict == "pass", f
    assert f.get("acked_lost") == 0 and f.get("acked", 0) > 0, f
    assert run_namespaces(run_id) == []
    return result, events


def test_hono_by_its_chart_tells_the_write_ups_story(kube_cluster, tmp_path, monkeypatch):
    result, _ = story_on_the_chart(tmp_path, monkeypatch, fixed_rate("hono-cluster-story", RATE, "hono-helm-story"),
                                   "hono-helm-story")
    assert result.check("faults_landed").verdict == "pass", result.check("faults_landed").figures
    failed = [(c.name, c.message) for c in result.checks if c.verdict == "fail"]
    assert not failed, failed                   # every objective of the story: steady, slowdown, recovered


def test_hono_by_its_chart_tells_the_coap_story_over_dtls_psk(kube_cluster, tmp_path, monkeypatch):
    """The write-up's own story: CoAP devices over DTLS with PSK (the native engine) through the CoAP adapter's UDP
    Service, mirrored as UDP; a cold start, warm, 500 ms on the data-grid hop, one of the two CoAP adapter pods
    killed (its devices' DTLS sessions die with it: they handshake again through the Service), recovery."""
    exp = fixed_rate("hono-coap-cluster-story", RATE, "hono-helm-coap-story")
    result, _ = story_on_the_chart(tmp_path, monkeypatch, exp, "hono-helm-coap-story")
    legs = {c.name: c.figures for c in result.checks if c.name.startswith("leg_objective")}
    for name, fig in legs.items():       # the CoAP legs' round trips and their errors by CoAP code (5.03s)
        print(f"  {name}: ok {fig.get('ok')}, p50/p99/p99.9 {fig.get('p50_ms')}/{fig.get('p99_ms')}/"
              f"{fig.get('p999_ms')} ms, 5.03s {fig.get('errors.coap_5.03', 0)}, errors {fig.get('errors')}")
    assert result.check("faults_landed").verdict == "pass", result.check("faults_landed").figures
    failed = [(c.name, c.message) for c in result.checks if c.verdict == "fail"]
    assert not failed, failed                   # every objective: steady, slowdown, recovered after the kill
