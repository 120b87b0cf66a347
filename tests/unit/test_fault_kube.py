"""Chaos Mesh / Litmus rendering: kinds, fields, run-id labels, namespace allow-list, dry-run files."""
import yaml
import pytest

from monsoon.faults.base import FaultContext, FaultError
from monsoon.stack.reaper import RUN_LABEL
from monsoon.faults.kube import KubeBackend, NamespaceNotAllowed, render, to_yaml
from monsoon.spec.fault import FaultSpec

SEL = {"namespace": "iot", "labelSelector": {"app": "hono-adapter", "tier": "edge"}}


def spec(kind, backend, params, repeat=None, target=SEL):
    return FaultSpec(name=f"{kind}-x", kind=kind, target=target, backend=backend, params=params,
                     schedule={"at": 5, "duration": 60, "repeat_every": repeat})


def test_pod_kill_podchaos():
    (o,) = render(spec("pod-kill", "chaos-mesh", {}), "run-1", ["iot"])
    assert (o["apiVersion"], o["kind"]) == ("chaos-mesh.org/v1alpha1", "PodChaos")
    assert o["metadata"]["namespace"] == "iot" and o["metadata"]["labels"][RUN_LABEL] == "run-1"
    assert o["spec"]["action"] == "pod-kill"
    assert o["spec"]["selector"] == {"namespaces": ["iot"], "labelSelectors": {"app": "hono-adapter", "tier": "edge"}}


def test_network_delay_and_memory_stress():
    (n,) = render(spec("mongo-slowdown", "chaos-mesh", {"latency_ms": 250, "jitter_ms": 30}), "r", ["iot"])
    assert n["kind"] == "NetworkChaos" and n["spec"]["action"] == "delay"
    assert n["spec"]["delay"] == {"latency": "250ms", "jitter": "30ms", "correlation": "0"}
    assert n["spec"]["duration"] == "60s"
    (m,) = render(spec("memory-pressure", "chaos-mesh", {"hog_mb": 512, "workers": 2}), "r", ["iot"])
    assert m["kind"] == "StressChaos" and m["spec"]["stressors"]["memory"] == {"workers": 2, "size": "512MB"}


def test_repeating_fault_becomes_a_schedule():
    (s,) = render(spec("pod-kill", "chaos-mesh", {}, repeat=600), "r", ["iot"])
    assert s["kind"] == "Schedule" and s["spec"]["type"] == "PodChaos"
    assert s["spec"]["schedule"] == "@every 600s" and s["spec"]["podChaos"]["action"] == "pod-kill"
    assert s["metadata"]["labels"][RUN_LABEL] == "r"


@pytest.mark.parametrize("kind,params,exp,env", [
    ("pod-kill", {}, "pod-delete", {"TOTAL_CHAOS_DURATION": "60", "FORCE": "true"}),
    ("network-latency", {"latency_ms": 200, "jitter_ms": 20}, "pod-network-latency",
     {"NETWORK_LATENCY": "200", "JITTER": "20"}),
    ("memory-pressure", {"hog_mb": 300}, "pod-memory-hog", {"MEMORY_CONSUMPTION": "300", "NUMBER_OF_WORKERS": "1"}),
])
def test_litmus_chaosengine(kind, params, exp, env):
    (o,) = render(spec(kind, "litmus", params), "run-7", ["iot"])
    assert (o["apiVersion"], o["kind"]) == ("litmuschaos.io/v1alpha1", "ChaosEngine")
    assert o["metadata"]["labels"][RUN_LABEL] == "run-7"
    assert o["spec"]["appinfo"] == {"appns": "iot", "applabel": "app=hono-adapter,tier=edge", "appkind": "deployment"}
    (e,) = o["spec"]["experiments"]
    got = {x["name"]: x["value"] for x in e["spec"]["components"]["env"]}
    assert e["name"] == exp and env.items() <= got.items()
    assert all(isinstance(x["value"], str) for x in e["spec"]["components"]["env"])


@pytest.mark.parametrize("backend", ["chaos-mesh", "litmus"])
def test_namespace_allow_list(backend):
    f = spec("pod-kill", backend, {})
    with pytest.raises(NamespaceNotAllowed, match="'iot' is not on the allow-list"):
        render(f, "r", ["staging"])
    with pytest.raises(NamespaceNotAllowed, match="empty"):
        render(f, "r", [])
    assert render(f, "r", ["staging", "iot"])


def test_names_are_dns_safe_and_yaml_round_trips():
    objs = render(spec("infinispan-slowdown", "chaos-mesh", {"latency_ms": 5}), "20250101-120000-ab12", ["iot"])
    name = objs[0]["metadata"]["name"]
    assert len(name) <= 63 and name == name.lower() and "_" not in name
    assert list(yaml.safe_load_all(to_yaml(objs))) == objs


def test_dry_run_backend_writes_yaml_and_reports_unmeasured(tmp_path):
    be = KubeBackend("chaos-mesh", ["iot"], out_dir=tmp_path, apply=False)
    h = be.inject(spec("network-latency", "chaos-mesh", {"latency_ms": 100}), FaultContext(run_id="r9"))
    files = list((tmp_path / "kube").glob("*.yaml"))
    assert len(files) == 1
    (o,) = yaml.safe_load_all(files[0].read_text())
    assert o["kind"] == "NetworkChaos" and o["metadata"]["labels"][RUN_LABEL] == "r9"
    land = be.verify(h)
    assert land.landed is None and land.evidence["method"] == "dry-run"
    be.heal(h)
    assert be.census("r9") == [] and be.heal_all("r9") == []


def test_dry_run_backend_still_enforces_the_allow_list(tmp_path):
    be = KubeBackend("litmus", ["staging"], out_dir=tmp_path, apply=False)
    with pytest.raises(NamespaceNotAllowed):
        be.inject(spec("pod-kill", "litmus", {}), FaultContext(run_id="r9"))
    assert not (tmp_path / "kube").exists()


# ---- what the manifest contract test (tests/integration/test_manifest_contract.py) found

def test_network_chaos_has_no_container_names_and_delays_egress():
    """NetworkChaos has no containerNames field (a pod's containers share one network namespace)."""
    target = dict(SEL, container="app")
    (n,) = render(spec("network-latency", "chaos-mesh", {"latency_ms": 100}, target=target), "r", ["iot"])
    assert "containerNames" not in n["spec"] and n["spec"]["direction"] == "to"
    (s,) = render(spec("network-latency", "chaos-mesh", {"latency_ms": 100}, repeat=600, target=target), "r", ["iot"])
    assert "containerNames" not in s["spec"]["networkChaos"]
    (m,) = render(spec("memory-pressure", "chaos-mesh", {"hog_mb": 64}, target=target), "r", ["iot"])
    assert m["spec"]["containerNames"] == ["app"]          # StressChaos does have it


@pytest.mark.parametrize("stream", ["upstream", "both"])
def test_chaos_mesh_refuses_latency_into_the_selected_pods(stream):
    """Without a target selector Chaos Mesh's webhook rejects direction from/both: say so before applying."""
    with pytest.raises(FaultError, match="select the client pods instead"):
        render(spec("mongo-slowdown", "chaos-mesh", {"latency_ms": 100, "stream": stream}), "r", ["iot"])


def test_long_fault_names_give_valid_distinct_labels_and_names():
    a, b = ("x" * 60 + "-mongo-slowdown-of-the-registry", "x" * 60 + "-mongo-slowdown-of-the-adapter")
    (oa,) = render(FaultSpec(name=a, kind="pod-kill", target=SEL, backend="chaos-mesh", schedule={"duration": 5}),
                   "r", ["iot"])
    (ob,) = render(FaultSpec(name=b, kind="pod-kill", target=SEL, backend="chaos-mesh", schedule={"duration": 5}),
                   "r", ["iot"])
    for o, full in ((oa, a), (ob, b)):
        assert len(o["metadata"]["labels"]["monsoon.io/fault"]) <= 63 and len(o["metadata"]["name"]) <= 63
        assert o["metadata"]["annotations"]["monsoon.io/fault"] == full
    assert oa["metadata"]["name"] != ob["metadata"]["name"]
    assert oa["metadata"]["labels"]["monsoon.io/fault"] != ob["metadata"]["labels"]["monsoon.io/fault"]
    (short,) = render(spec("pod-kill", "chaos-mesh", {}), "r", ["iot"])
    assert "annotations" not in short["metadata"]


def test_litmus_engine_has_what_its_crd_requires_and_whole_seconds():
    f = FaultSpec(name="k", kind="pod-kill", target=SEL, backend="litmus", schedule={"duration": 0.5})
    (o,) = render(f, "r", ["iot"])
    assert o["spec"]["components"] == {"runner": {"image": "monsoon.local/litmus-runner:3.18.0",
                                                  "imagePullPolicy": "IfNotPresent",
                                                  "runnerLabels": {"monsoon.io/run-id": "r"}}}
    assert o["spec"]["experiments"][0]["spec"]["rank"] == 0 and o["spec"]["jobCleanUpPolicy"] == "delete"
    env = {x["name"]: x["value"] for x in o["spec"]["experiments"][0]["spec"]["components"]["env"]}
    assert env["TOTAL_CHAOS_DURATION"] == "1" and env["CHAOS_INTERVAL"] == "1"   # not "0": no chaos at all


@pytest.mark.parametrize("seconds,text", [(60, "60s"), (0.5, "500ms"), (1.001, "1001ms"), (0.0001, "1ms")])
def test_go_durations_round_not_truncate(seconds, text):
    (o,) = render(FaultSpec(name="n", kind="network-latency", target=SEL, backend="chaos-mesh",
                            params={"latency_ms": 10}, schedule={"duration": seconds}), "r", ["iot"])
    assert o["spec"]["duration"] == text


def test_a_plan_window_applies_one_shot_objects_not_a_schedule(tmp_path):
    """FaultPlan heals each window by deleting its objects: a Schedule would never fire before that."""
    f = spec("pod-kill", "chaos-mesh", {}, repeat=600)
    h = KubeBackend("chaos-mesh", ["iot"], out_dir=tmp_path, apply=False).inject(f, FaultContext(run_id="r1"))
    assert [o["kind"] for o in h.data["objects"]] == ["PodChaos"]
    assert render(f, "r1", ["iot"])[0]["kind"] == "Schedule"   # the standalone rendering still repeats


# ------------------------------------------------- applying, healing and the census on a (fake) cluster

class FakeCustomObjectsApi:
    """An in-memory API server for custom objects: the four calls KubeBackend makes, with the real signatures."""

    def __init__(self):
        self.store: dict[tuple[str, str, str, str, str], dict] = {}
        self.calls: list[tuple] = []          # (verb, plural, name[, body]) in call order
        self.controller = None                # called with (api, key, obj) before every GET: the operator's work
        self.refuse_finalizers = False        # RBAC: patches of metadata.finalizers are refused (403)

    def finalize(self, key) -> None:
        """What the operator does when its finalizer is done: drop it; the server then removes the object."""
        o = self.store[key]
        o["metadata"]["finalizers"] = []
        if o["metadata"].get("deletionTimestamp"):
            del self.store[key]

    @staticmethod
    def _error(status: int, reason: str):
        from kubernetes.client.exceptions import ApiException
        return ApiException(status=status, reason=reason)

    def create_namespaced_custom_object(self, group, version, namespace, plural, body, **kw):
        key = (group, version, namespace, plural, body["metadata"]["name"])
        if key in self.store:
            raise self._error(409, "AlreadyExists")
        assert body["metadata"]["namespace"] == namespace and body["apiVersion"] == f"{group}/{version}"
        self.store[key] = yaml.safe_load(yaml.safe_dump(body))   # what the server keeps is a copy
        return body

    def list_namespaced_custom_object(self, group, version, namespace, plural, label_selector=None, **kw):
        def matches(o) -> bool:
            labels = o["metadata"].get("labels") or {}
            for term in filter(None, (label_selector or "").split(",")):
                k, _, v = term.partition("=")
                if k not in labels or ("=" in term and labels[k] != v):
                    return False
            return True
        return {"items": [yaml.safe_load(yaml.safe_dump(o)) for (g, ver, ns, pl, _), o in sorted(self.store.items())
                          if (g, ver, ns, pl) == (group, version, namespace, plural) and matches(o)]}

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, **kw):
        self.calls.append(("delete", plural, name))
        key = (group, version, namespace, plural, name)
        o = self.store.get(key)
        if o is None:
            raise self._error(404, "NotFound")
        if o["metadata"].get("finalizers"):     # the API server only marks it; the finalizer's owner removes it
            o["metadata"].setdefault("deletionTimestamp", "2025-01-01T00:00:00Z")
        else:
            del self.store[key]
        return {"status": "Success"}

    def get_namespaced_custom_object(self, group, version, namespace, plural, name, **kw):
        key = (group, version, namespace, plural, name)
        self.calls.append(("get", plural, name))
        if self.controller is not None and key in self.store:
            self.controller(self, key, self.store[key])
        try:
            return self.store[key]
        except KeyError:
            raise self._error(404, "NotFound") from None

    def patch_namespaced_custom_object(self, group, version, namespace, plural, name, body, **kw):
        """A JSON merge patch (the client's default content type for custom objects)."""
        self.calls.append(("patch", plural, name, body))
        key = (group, version, namespace, plural, name)
        if key not in self.store:
            raise self._error(404, "NotFound")

        def merge(dst: dict, src: dict) -> None:
            for k, v in src.items():
                if isinstance(v, dict) and isinstance(dst.get(k), dict):
                    merge(dst[k], v)
                else:
                    dst[k] = v
        if self.refuse_finalizers and "finalizers" in (body.get("metadata") or {}):
            raise self._error(403, "Forbidden")
        merge(self.store[key], yaml.safe_load(yaml.safe_dump(body)))
        o = self.store[key]
        if o["metadata"].get("deletionTimestamp") and not o["metadata"].get("finalizers"):
            del self.store[key]               # the API server removes a deleted object once its finalizers are gone
        return o

    def runs(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for (_, _, ns, _, name), o in sorted(self.store.items()):
            out.setdefault(o["metadata"]["labels"][RUN_LABEL], []).append(f"{o['kind']} {ns}/{name}")
        return out


def test_the_fake_api_has_the_signatures_of_the_real_client():
    import inspect
    kubernetes = pytest.importorskip("kubernetes")
    for m in ("create_namespaced_custom_object", "list_namespaced_custom_object",
              "delete_namespaced_custom_object", "get_namespaced_custom_object", "patch_namespaced_custom_object"):
        real = [p for p in inspect.signature(getattr(kubernetes.client.CustomObjectsApi, m)).parameters.values()
                if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD]
        fake = [p for p in inspect.signature(getattr(FakeCustomObjectsApi, m)).parameters.values()
                if p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD]
        assert [p.name for p in fake] == [p.name for p in real], m
    assert "label_selector" in inspect.signature(kubernetes.client.CustomObjectsApi.list_namespaced_custom_object).parameters


@pytest.fixture
def cluster(tmp_path, monkeypatch):
    """A configured cluster (a kubeconfig, the real client's config loading) whose API is the fake; the
    allow-list from MONSOON_KUBE_NAMESPACES; nothing else of this machine in reach of heal_everything."""
    kubernetes = pytest.importorskip("kubernetes")
    import monsoon.faults.heal as chaos
    import monsoon.stack.reaper as stack_mod
    cfg = tmp_path / "kubeconfig"
    cfg.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "fake",
        "clusters": [{"name": "fake", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "fake", "user": {"token": "t"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake"}}]}))
    monkeypatch.setenv("KUBECONFIG", str(cfg))
    # the client reads KUBECONFIG once, at import (a real monsoon process has it set before that)
    monkeypatch.setattr(kubernetes.config.kube_config, "KUBE_CONFIG_DEFAULT_LOCATION", str(cfg))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("MONSOON_KUBE_NAMESPACES", "iot, lab")
    api = FakeCustomObjectsApi()
    monkeypatch.setattr(kubernetes.client, "CustomObjectsApi", lambda *a, **k: api)
    owners: dict = {}
    for mod in (stack_mod, chaos):   # the reaper, and heal_everything's own reference
        monkeypatch.setattr(mod, "process_owners", lambda: dict(owners))
    for mod in (stack_mod, chaos):   # the reaper, and heal_everything's own reference
        monkeypatch.setattr(mod, "reap", lambda rid=None: [])
    monkeypatch.setattr(chaos, "_toxiproxy_apis_of_runs", lambda: [])
    return api, owners, tmp_path


def inject_as_a_run_does(run_id: str, flavor: str, kind: str, params: dict, out_dir, ns: str = "iot") -> None:
    from monsoon.faults.resolve import kube_namespaces
    be = KubeBackend(flavor, kube_namespaces(), out_dir=out_dir,   # as chaos.build_backends makes it;
                     inject_timeout=0)                             # no operator here: one read, no waiting
    assert be.apply                                                # a cluster is configured: applied, not dry
    target = {**SEL, "namespace": ns}
    h = be.inject(spec(kind, flavor, params, target=target), FaultContext(run_id=run_id, out_dir=out_dir))
    assert be.verify(h).evidence["present"] is True
    # ... and monsoon is killed with -9: the backend and its handles are gone


def test_heal_run_id_deletes_the_labelled_objects_of_a_killed_run(cluster):
    from monsoon.faults.heal import heal_everything
    api, _, tmp = cluster
    inject_as_a_run_does("r-kube", "chaos-mesh", "pod-kill", {}, tmp)
    inject_as_a_run_does("r-kube", "litmus", "network-latency", {"latency_ms": 200}, tmp, ns="lab")
    inject_as_a_run_does("r-other", "chaos-mesh", "pod-kill", {}, tmp)
    placed = api.runs()
    assert len(placed["r-kube"]) == 2 and len(placed["r-other"]) == 1
    rep = heal_everything("r-kube", state_root=tmp)
    assert sorted(x for x in rep.done if "deleted" in x) == sorted(
        f"r-kube {'litmus' if x.startswith('ChaosEngine') else 'chaos-mesh'}: {x} deleted" for x in placed["r-kube"])
    assert rep.census == {} and rep.notes == []
    assert api.runs() == {"r-other": placed["r-other"]}            # another run's object is not this run's
    for flavor in ("chaos-mesh", "litmus"):
        assert KubeBackend(flavor, ["iot", "lab"]).census("r-kube") == []


def test_heal_all_finds_kubernetes_only_runs_by_their_label_and_skips_live_ones(cluster, monkeypatch):
    import monsoon.faults.heal as chaos
    from monsoon.faults.heal import heal_everything
    api, owners, tmp = cluster
    inject_as_a_run_does("r-gone", "chaos-mesh", "pod-kill", {}, tmp)
    inject_as_a_run_does("r-gone-too", "litmus", "pod-kill", {}, tmp, ns="lab")
    inject_as_a_run_does("r-live", "chaos-mesh", "network-latency", {"latency_ms": 200}, tmp)
    owners[10**9] = ("r-live", 4321)                                # its stack still runs under monsoon 4321
    monkeypatch.setattr(chaos, "_proc_stat", {4321: ("S", 1, 10), 10**9: ("S", 4321, 20)}.get)
    live = api.runs()["r-live"]
    rep = heal_everything(None, state_root=tmp)
    assert rep.notes == ["run r-live is still live (owner pid 4321): skipped; use --run-id r-live to force"]
    assert {x.split(" ", 1)[0] for x in rep.done if "deleted" in x} == {"r-gone", "r-gone-too"}
    assert rep.census == {} and api.runs() == {"r-live": live}


def test_heal_says_so_when_a_cluster_is_configured_but_no_namespace_is_allowed(cluster, monkeypatch):
    from monsoon.faults.heal import heal_everything
    api, _, tmp = cluster
    inject_as_a_run_does("r-kube", "chaos-mesh", "pod-kill", {}, tmp)
    monkeypatch.setenv("MONSOON_KUBE_NAMESPACES", "")
    rep = heal_everything("r-kube", state_root=tmp)
    assert any("MONSOON_KUBE_NAMESPACES is empty" in n for n in rep.notes)
    assert len(api.runs()["r-kube"]) == 1


# ------------------------------------- landing is polled: operators take their time (fake clock, no sleeping)

class FakeClock:
    def __init__(self):
        self.t = 0.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.t += s


def polled_backend(flavor: str, api: FakeCustomObjectsApi, clock: FakeClock, **kw) -> KubeBackend:
    be = KubeBackend(flavor, ["iot"], apply=True, clock=clock, sleep=clock.sleep, poll_interval=1.0,
                     inject_timeout=kw.pop("inject_timeout", 30), heal_timeout=kw.pop("heal_timeout", 30), **kw)
    be._api = api
    return be


def after_gets(n: int, action):
    """A controller that does ``action(obj)`` from the n-th GET of an object on."""
    seen: dict = {}

    def controller(api, key, obj):
        seen[key] = seen.get(key, 0) + 1
        if seen[key] >= n:
            action(api, key, obj)
    return controller


def all_injected(api, key, obj):
    obj["status"] = {"conditions": [{"type": "Selected", "status": "True"}, {"type": "AllInjected", "status": "True"}]}


def test_chaos_mesh_inject_is_polled_until_all_injected():
    api, clock = FakeCustomObjectsApi(), FakeClock()
    api.controller = after_gets(3, all_injected)          # the first two reads find no status yet
    be = polled_backend("chaos-mesh", api, clock)
    h = be.inject(spec("network-latency", "chaos-mesh", {"latency_ms": 100}), FaultContext(run_id="r1"))
    land = be.verify(h)
    assert land.landed is True and land.evidence["conditions"]["AllInjected"] == "True"
    assert land.evidence["polls"] == 3 and clock.sleeps == [1.0, 1.0]


def test_chaos_mesh_inject_not_injected_by_the_timeout_did_not_land():
    api, clock = FakeCustomObjectsApi(), FakeClock()
    api.controller = lambda a, k, o: o.update(status={"conditions": [{"type": "AllInjected", "status": "False"}]})
    be = polled_backend("chaos-mesh", api, clock, inject_timeout=10)
    h = be.inject(spec("pod-kill", "chaos-mesh", {}), FaultContext(run_id="r1"))
    land = be.verify(h)
    assert land.landed is False and land.evidence["waited_s"] == 10 and land.evidence["polls"] == 11
    assert "AllInjected is False" in land.evidence["pending"]


@pytest.mark.parametrize("status,landed", [
    ({"engineStatus": "initialized", "experiments": [{"name": "pod-delete", "status": "Running", "verdict": "Awaited"}]},
     True),
    ({"engineStatus": "completed", "experiments": [{"name": "pod-delete", "status": "Completed", "verdict": "Pass"}]},
     True),
    ({"engineStatus": "initialized", "experiments": [{"name": "pod-delete", "status": "ChaosExperiment Not Found"}]},
     False),
])
def test_litmus_inject_is_judged_on_engine_and_experiment_status(status, landed):
    """A ChaosEngine has no AllInjected condition: its status.engineStatus and experiments[].status say it."""
    api, clock = FakeCustomObjectsApi(), FakeClock()
    api.controller = after_gets(2, lambda a, k, o: o.update(status=status))
    be = polled_backend("litmus", api, clock)
    h = be.inject(spec("pod-kill", "litmus", {}), FaultContext(run_id="r1"))
    land = be.verify(h)
    assert land.landed is landed and land.evidence["polls"] == 2
    assert land.evidence["engineStatus"] == status["engineStatus"]


def test_litmus_engine_initialized_but_no_experiment_running_is_not_proof():
    api, clock = FakeCustomObjectsApi(), FakeClock()
    api.controller = lambda a, k, o: o.update(status={"engineStatus": "initialized", "experiments": [
        {"name": "pod-delete", "status": "Waiting for Job Creation", "verdict": "Awaited"}]})
    be = polled_backend("litmus", api, clock, inject_timeout=5)
    h = be.inject(spec("pod-kill", "litmus", {}), FaultContext(run_id="r1"))
    land = be.verify(h)
    assert land.landed is None and land.evidence["waited_s"] == 5 and "no experiment runs" in land.evidence["pending"]


def with_finalizer(api):
    for o in api.store.values():
        o["metadata"]["finalizers"] = ["chaos-mesh/records"]


def test_chaos_mesh_heal_waits_for_the_finalizer_to_finish():
    api, clock = FakeCustomObjectsApi(), FakeClock()
    be = polled_backend("chaos-mesh", api, clock)
    h = be.inject(spec("network-latency", "chaos-mesh", {"latency_ms": 100}), FaultContext(run_id="r1"))
    with_finalizer(api)
    # the controller recovers the pods and drops its finalizer on the third read after the delete
    api.controller = after_gets(3, lambda a, k, o: o["metadata"].get("deletionTimestamp") and a.finalize(k))
    be.heal(h)
    land = be.verify(h)
    assert land.landed is True and land.evidence["present"] is False and land.evidence["polls"] == 3
    assert "forced_finalizer" not in land.evidence and not [c for c in api.calls if c[0] == "patch"]
    assert be.census("r1") == []


def test_chaos_mesh_heal_stuck_in_its_finalizer_is_forced_with_the_clean_finalizer_annotation():
    api, clock = FakeCustomObjectsApi(), FakeClock()
    be = polled_backend("chaos-mesh", api, clock, heal_timeout=20)
    h = be.inject(spec("network-latency", "chaos-mesh", {"latency_ms": 100}), FaultContext(run_id="r1"))
    with_finalizer(api)

    def controller(a, key, o):   # cannot recover the pod: only the forced annotation lets it go
        if (o["metadata"].get("annotations") or {}).get("chaos-mesh.chaos-mesh.org/cleanFinalizer") == "forced":
            a.finalize(key)
    api.controller = controller
    be.heal(h)
    land = be.verify(h)
    patches = [c for c in api.calls if c[0] == "patch"]
    assert patches == [("patch", "networkchaos", h.data["objects"][0]["metadata"]["name"],
                        {"metadata": {"annotations": {"chaos-mesh.chaos-mesh.org/cleanFinalizer": "forced"}}})]
    assert land.landed is True and land.evidence["forced_finalizer"] is True
    assert land.evidence["finalizers"] == ["chaos-mesh/records"] and land.evidence["waited_s"] >= 20
    assert be.census("r1") == []


def test_a_finalizer_nobody_clears_even_forced_is_removed_outright():
    """No controller acts on the forced annotation (it is stopped): the heal takes the finalizers off itself."""
    api, clock = FakeCustomObjectsApi(), FakeClock()
    be = polled_backend("chaos-mesh", api, clock, heal_timeout=5)
    h = be.inject(spec("pod-kill", "chaos-mesh", {}), FaultContext(run_id="r1"))
    with_finalizer(api)
    be.heal(h)
    land = be.verify(h)
    name = h.data["objects"][0]["metadata"]["name"]
    assert [c for c in api.calls if c[0] == "patch"] == [
        ("patch", "podchaos", name, {"metadata": {"annotations": {"chaos-mesh.chaos-mesh.org/cleanFinalizer": "forced"}}}),
        ("patch", "podchaos", name, {"metadata": {"finalizers": None}})]
    assert land.landed is True and land.evidence["finalizers_removed"] is True and land.evidence["present"] is False
    assert be.census("r1") == []


def test_on_monsoons_cluster_without_its_controller_the_finalizers_go_at_once(monkeypatch):
    """monsoon's own cluster, chaos-controller-manager not running: no 60 s wait for a finalizer nobody will clear,
    no annotation nobody will read; with the controller running, the heal waits for it as before."""
    import monsoon.faults.kube as kube
    monkeypatch.setattr(kube, "local_cluster", lambda: True)
    monkeypatch.setattr(kube, "daemon_pid", lambda name: None)
    api, clock = FakeCustomObjectsApi(), FakeClock()
    be = polled_backend("chaos-mesh", api, clock, heal_timeout=60)
    h = be.inject(spec("pod-kill", "chaos-mesh", {}), FaultContext(run_id="r1"))
    with_finalizer(api)
    be.heal(h)
    land = be.verify(h)
    name = h.data["objects"][0]["metadata"]["name"]
    assert [c for c in api.calls if c[0] == "patch"] == [("patch", "podchaos", name, {"metadata": {"finalizers": None}})]
    assert land.landed is True and land.evidence["finalizers_removed"] is True and "forced_finalizer" not in land.evidence
    assert "not running" in land.evidence["controller"] and land.evidence["waited_s"] <= 2.0
    monkeypatch.setattr(kube, "daemon_pid", lambda name: 4242)     # the controller runs: wait for it
    api2, clock2 = FakeCustomObjectsApi(), FakeClock()
    be2 = polled_backend("chaos-mesh", api2, clock2, heal_timeout=60)
    h2 = be2.inject(spec("pod-kill", "chaos-mesh", {}), FaultContext(run_id="r2"))
    with_finalizer(api2)
    be2.heal(h2)
    land2 = be2.verify(h2)
    assert land2.evidence["forced_finalizer"] is True and land2.evidence["waited_s"] >= 60 and "controller" not in land2.evidence


def test_a_heal_that_never_goes_did_not_land_and_says_why():
    api, clock = FakeCustomObjectsApi(), FakeClock()
    be = polled_backend("chaos-mesh", api, clock, heal_timeout=5)
    h = be.inject(spec("pod-kill", "chaos-mesh", {}), FaultContext(run_id="r1"))
    with_finalizer(api)                                   # and nobody ever removes it, forced or not
    api.refuse_finalizers = True                          # nor may monsoon (RBAC)
    be.heal(h)
    land = be.verify(h)
    assert land.landed is False and land.evidence["forced_finalizer"] is True
    assert land.evidence["finalizers_removed"].startswith("refused: ApiException")
    assert land.evidence["deletion_pending"] == [f"PodChaos/{h.data['objects'][0]['metadata']['name']}"]
    assert be.census("r1")                                # still there: the census says so


def test_litmus_heal_stops_the_engine_before_deleting_it():
    api, clock = FakeCustomObjectsApi(), FakeClock()
    be = polled_backend("litmus", api, clock)
    h = be.inject(spec("network-latency", "litmus", {"latency_ms": 100}), FaultContext(run_id="r1"))
    name = h.data["objects"][0]["metadata"]["name"]
    for o in api.store.values():
        o["metadata"]["finalizers"] = ["chaosengine.litmuschaos.io/finalizer"]

    def operator(a, key, o):   # on stop it aborts the experiment and drops its finalizer
        if o["spec"]["engineState"] == "stop":
            o.setdefault("status", {})["engineStatus"] = "stopped"
            if o["metadata"].get("deletionTimestamp"):
                a.finalize(key)
    api.controller = operator
    be.heal(h)
    mutations = [c[:3] + ((c[3],) if len(c) > 3 else ()) for c in api.calls if c[0] in ("patch", "delete")]
    assert mutations == [("patch", "chaosengines", name, {"spec": {"engineState": "stop"}}),
                         ("delete", "chaosengines", name)]
    assert be.verify(h).landed is True and be.census("r1") == []


def test_litmus_heal_never_forces_a_finalizer():
    """Dropping Litmus's finalizer would leave its chaos (netem) in place: a stuck engine is a failed heal."""
    api, clock = FakeCustomObjectsApi(), FakeClock()
    be = polled_backend("litmus", api, clock, heal_timeout=4)
    h = be.inject(spec("pod-kill", "litmus", {}), FaultContext(run_id="r1"))
    for o in api.store.values():
        o["metadata"]["finalizers"] = ["chaosengine.litmuschaos.io/finalizer"]
    be.heal(h)
    land = be.verify(h)
    assert land.landed is False and "forced_finalizer" not in land.evidence
    assert [c[0] for c in api.calls if c[0] in ("patch", "delete")] == ["patch", "delete"]


def test_heal_all_stops_litmus_engines_and_waits_for_them(tmp_path):
    api, clock = FakeCustomObjectsApi(), FakeClock()
    be = polled_backend("litmus", api, clock)
    be.inject(spec("pod-kill", "litmus", {}), FaultContext(run_id="r1"))
    for o in api.store.values():
        o["metadata"]["finalizers"] = ["chaosengine.litmuschaos.io/finalizer"]
    api.controller = after_gets(2, lambda a, k, o: o["metadata"].get("deletionTimestamp") and a.finalize(k))
    fresh = polled_backend("litmus", api, clock)          # after a crash: no handles
    done = fresh.heal_all("r1")
    assert len(done) == 1 and done[0].endswith("deleted")
    assert [c[0] for c in api.calls if c[0] in ("patch", "delete")] == ["patch", "delete"]
    assert api.store == {} and fresh.census("r1") == []


# ------------------------------------------------------------------ pod-failure: judged by the pod's image and Ready

def test_pod_failure_podchaos():
    (o,) = render(spec("pod-failure", "chaos-mesh", {}), "r", ["iot"])
    assert o["kind"] == "PodChaos" and o["spec"]["action"] == "pod-failure" and o["spec"]["mode"] == "one"
    assert o["spec"]["duration"] == "60s" and o["spec"]["selector"]["namespaces"] == ["iot"]
    with pytest.raises(Exception, match="cannot do pod-failure"):
        spec("pod-failure", "litmus", {})


class FakeCore:
    """list_namespaced_pod of one pod whose image and Ready condition the test sets."""

    def __init__(self):
        self.image, self.ready = "monsoon/platform", True

    def list_namespaced_pod(self, namespace, label_selector=None, **kw):
        from types import SimpleNamespace as NS
        cs = NS(name="platform", image=self.image, restart_count=1,
                state=NS(running=NS() if self.ready else None, terminated=None,
                         waiting=None if self.ready else NS(reason="CrashLoopBackOff")))
        pod = NS(metadata=NS(uid="u1", name="platform-abc", deletion_timestamp=None),
                 spec=NS(containers=[NS(name="platform", image=self.image)]),
                 status=NS(conditions=[NS(type="Ready", status="True" if self.ready else "False")],
                           container_statuses=[cs]))
        return NS(items=[pod])


def test_pod_failure_lands_on_the_pause_image_and_not_ready_and_heals_on_its_own_image_ready():
    api, clock, core = FakeCustomObjectsApi(), FakeClock(), FakeCore()
    be = polled_backend("chaos-mesh", api, clock)
    be._core = core
    api.controller = lambda a, k, o: o.update(status={"conditions": [{"type": "AllInjected", "status": "True"}]})
    h = be.inject(spec("pod-failure", "chaos-mesh", {"landing_timeout": 10}), FaultContext(run_id="r1"))
    assert h.data["pods_before"]["u1"]["images"] == {"platform": "monsoon/platform"}
    land = be.verify(h)                      # the image is still its own: not landed by the bound
    assert land.landed is False and "no selected pod ran another image" in land.evidence["not_landed"]
    core.image, core.ready = "registry.k8s.io/pause:3.6", False
    land = be.verify(h)
    assert land.landed is True and land.evidence["failed_uids"] == ["u1"] and land.evidence["method"] == "api+pod-image"
    assert land.evidence["pods"]["u1"]["containers"]["platform"]["state"] == "waiting: CrashLoopBackOff"
    be.heal(h)
    healed = be.verify(h)                    # the object is gone, but the pod still runs the pause image
    assert healed.landed is False and "not back on its own image" in healed.evidence["not_healed"]
    core.image, core.ready = "monsoon/platform", True
    healed = be.verify(h)
    assert healed.landed is True and healed.evidence["images_back"] is True and healed.evidence["present"] is False
