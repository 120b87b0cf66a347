"""Fault profiles: the shipped ones validate; bad ones name the file, the line and the key."""
import textwrap

import pytest

from monsoon.spec.fault import KINDS, PROFILES_DIR, FaultSpec, LatencyParams, Schedule, load_fault, load_profiles
from monsoon.spec.yamlio import SpecError

SHIPPED = ["pod-kill", "process-pause", "network-latency", "dependency-down", "bandwidth", "mongo-slowdown",
           "infinispan-slowdown", "kafka-broker-restart", "memory-pressure", "cassandra-slowdown", "cassandra-down",
           "pod-failure", "container-kill"]

LATENCY = """\
name: pg-latency
kind: network-latency
target: platform->postgres
backend: toxiproxy
params:
  latency_ms: 200
  jitter_ms: 20
schedule:
  at: 10
  duration: 30
"""


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_every_required_profile_ships_and_validates():
    profiles = load_profiles()
    assert sorted(profiles) == sorted(SHIPPED)
    for kind, spec in profiles.items():
        assert spec.kind == kind and (PROFILES_DIR / f"{kind}.yaml").exists()
        assert spec.backend in KINDS[kind].backends


def test_profile_by_kind_name_and_typed_params():
    f = load_fault("network-latency")
    assert isinstance(f.params, LatencyParams) and f.params.latency_ms == 200
    assert f.target.hop == ("platform", "postgres") and str(f.target) == "platform->postgres"
    with pytest.raises(Exception):
        f.params.latency_ms = 1          # frozen
    assert f.model_dump()["params"]["latency_ms"] == 200


def test_kind_must_match_file_name(tmp_path):
    p = write(tmp_path, "latency.yaml", LATENCY)
    with pytest.raises(SpecError) as e:
        load_fault(p)
    assert e.value.key == "kind" and e.value.line == 2 and "latency.yaml" in str(e.value)


def test_unknown_param_key_names_its_line(tmp_path):
    p = write(tmp_path, "network-latency.yaml", LATENCY.replace("  jitter_ms: 20\n", "  jitter_ms: 20\n  jiter: 5\n"))
    with pytest.raises(SpecError) as e:
        load_fault(p)
    assert (e.value.key, e.value.line) == ("params.jiter", 8)
    assert "unknown key" in str(e.value) and str(p) in str(e.value)


def test_bad_param_value_names_key_and_line(tmp_path):
    p = write(tmp_path, "network-latency.yaml", LATENCY.replace("latency_ms: 200", "latency_ms: -5"))
    with pytest.raises(SpecError) as e:
        load_fault(p)
    assert (e.value.key, e.value.line) == ("params.latency_ms", 6)


def test_missing_required_param(tmp_path):
    p = write(tmp_path, "bandwidth.yaml", LATENCY.replace("kind: network-latency", "kind: bandwidth")
              .replace("  latency_ms: 200\n  jitter_ms: 20\n", "  stream: downstream\n"))
    with pytest.raises(SpecError) as e:
        load_fault(p)
    assert e.value.key == "params.rate_kbps"


def test_kind_not_kebab_or_unknown(tmp_path):
    p = write(tmp_path, "network_latency.yaml", LATENCY.replace("kind: network-latency", "kind: network_latency"))
    with pytest.raises(SpecError, match="kebab-case") as e:
        load_fault(p)
    assert e.value.line == 2
    p = write(tmp_path, "cpu-burn.yaml", LATENCY.replace("kind: network-latency", "kind: cpu-burn"))
    with pytest.raises(SpecError, match="unknown kind 'cpu-burn'"):
        load_fault(p)


def test_backend_must_fit_the_kind(tmp_path):
    p = write(tmp_path, "network-latency.yaml", LATENCY.replace("backend: toxiproxy", "backend: cgroup"))
    with pytest.raises(SpecError, match="backend 'cgroup' cannot do network-latency"):
        load_fault(p)
    p = write(tmp_path, "network-latency.yaml", LATENCY.replace("backend: toxiproxy", "backend: kubectl"))
    with pytest.raises(SpecError) as e:
        load_fault(p)
    assert (e.value.key, e.value.line) == ("backend", 4)


def test_target_forms(tmp_path):
    p = write(tmp_path, "network-latency.yaml", LATENCY.replace("platform->postgres", "platform"))
    with pytest.raises(SpecError, match="targets a hop"):
        load_fault(p)
    p = write(tmp_path, "network-latency.yaml", LATENCY.replace("platform->postgres", "'->postgres'"))
    with pytest.raises(SpecError) as e:
        load_fault(p)
    assert e.value.key == "target" and e.value.line == 3
    kube = LATENCY.replace("target: platform->postgres",
                           "target: {namespace: iot, labelSelector: {app: hono}}").replace("toxiproxy", "chaos-mesh")
    f = load_fault(write(tmp_path, "network-latency.yaml", kube))
    assert f.target.kube.namespace == "iot" and f.target.kube.label_selector == {"app": "hono"}
    bad_ns = kube.replace("namespace: iot", "namespace: IoT_Prod")
    with pytest.raises(SpecError, match="valid namespace") as e:
        load_fault(write(tmp_path, "network-latency.yaml", bad_ns))
    assert e.value.key.startswith("target")
    # a kube selector with a local backend, and a hop with a kube backend, are both refused
    with pytest.raises(SpecError, match="stack service or hop"):
        load_fault(write(tmp_path, "network-latency.yaml", kube.replace("chaos-mesh", "toxiproxy")))


def test_hop_services_checked_against_the_stack(tmp_path):
    p = write(tmp_path, "network-latency.yaml", LATENCY)
    load_fault(p, services={"platform", "postgres"})
    with pytest.raises(SpecError, match="unknown service 'postgres'") as e:
        load_fault(p, services={"platform", "kafka"})
    assert e.value.line == 3


def test_schedule_rules(tmp_path):
    text = LATENCY.replace("  duration: 30\n", "  duration: 30\n  repeat_every: 20\n")
    with pytest.raises(SpecError, match="must be longer than duration") as e:
        load_fault(write(tmp_path, "network-latency.yaml", text))
    assert e.value.key == "schedule"
    s = Schedule(at=10, duration=5, repeat_every=30)
    assert s.windows(100) == [(10, 15), (40, 45), (70, 75)]
    assert Schedule(at=10, duration=5, repeat_every=30, times=2).windows(1000) == [(10, 15), (40, 45)]
    assert Schedule(at=200, duration=5).windows(100) == []


def test_jitter_larger_than_latency(tmp_path):
    text = LATENCY.replace("jitter_ms: 20", "jitter_ms: 500")
    with pytest.raises(SpecError, match="jitter_ms") as e:
        load_fault(write(tmp_path, "network-latency.yaml", text))
    assert e.value.key == "params"


def test_memory_pressure_needs_the_right_size(tmp_path):
    text = """\
    name: mp
    kind: memory-pressure
    target: platform
    backend: cgroup
    params: {hog_mb: 100}
    schedule: {duration: 10}
    """
    with pytest.raises(SpecError, match="needs params.limit_mb"):
        load_fault(write(tmp_path, "memory-pressure.yaml", text))


def test_overrides_replace_keys_before_validation():
    f = load_fault("network-latency", schedule={"at": 1, "duration": 2})
    assert (f.schedule.at, f.schedule.duration) == (1, 2)


def test_missing_profile_lists_available():
    with pytest.raises(SpecError, match="available: .*pod-kill"):
        load_fault("no-such-fault")


def test_direct_construction_validates_params_too():
    with pytest.raises(Exception, match="latency_ms"):
        FaultSpec(name="x", kind="network-latency", target="a->b", backend="toxiproxy", params={},
                  schedule={"duration": 1})
