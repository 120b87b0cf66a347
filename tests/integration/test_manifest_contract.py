"""Contract test: every Chaos Mesh / Litmus object monsoon renders, checked the way a cluster would take it.

The checker is a Go program (``tests/contract``) built against Chaos Mesh's own
API module: strict decoding into the upstream types, object metadata rules, the
CRD schema (the ``+kubebuilder`` markers of the same source) and Chaos Mesh's
admission webhooks (Default, then ValidateCreate) called in-process.  Litmus'
Go module is not available from the module proxy, so ChaosEngine is checked
against a transcription of its schema (``tests/contract/litmus.go``).

It is built once into ``${MONSOON_CACHE:-.cache}/bin/manifest-contract`` and
rebuilt when a source in ``tests/contract`` is newer than the binary.
"""
from __future__ import annotations

import copy
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from monsoon.stack.reaper import RUN_LABEL
from monsoon.faults.kube import render, to_yaml
from monsoon.spec.fault import FaultSpec
from monsoon.paths import REPO

CONTRACT = REPO / "tests" / "contract"
CACHE = Path(os.environ.get("MONSOON_CACHE", REPO / ".cache"))
BIN = CACHE / "bin" / "manifest-contract"
GO = shutil.which("go")
pytestmark = pytest.mark.skipif(GO is None, reason="Go is not installed (go not on PATH): the manifest contract "
                                                   "checker in tests/contract is a Go program")

RUN_ID = "20250101-120000-ab12"
NS = "iot"
PARAMS = {
    "pod-kill": {},
    "kafka-broker-restart": {"grace_period": 15},
    "network-latency": {"latency_ms": 200, "jitter_ms": 20},
    "mongo-slowdown": {"latency_ms": 250, "jitter_ms": 30, "stream": "downstream"},
    "infinispan-slowdown": {"latency_ms": 5},
    "memory-pressure": {"hog_mb": 512, "workers": 2},
}
VARIANTS = {
    # one injection, a sub-second part in its duration, no container
    "once": ({"at": 5, "duration": 45.5}, None),
    # a repeating fault (a Chaos Mesh Schedule), aimed at one container
    "repeating": ({"at": 5, "duration": 60, "repeat_every": 600}, "app"),
}
COMBOS = [(kind, backend, variant) for kind in PARAMS for backend in ("chaos-mesh", "litmus") for variant in VARIANTS]


def fault(kind: str, backend: str, variant: str, name: str | None = None) -> FaultSpec:
    schedule, container = VARIANTS[variant]
    target = {"namespace": NS, "labelSelector": {"app.kubernetes.io/name": "hono-adapter", "tier": "edge"}}
    if container:
        target["container"] = container
    return FaultSpec(name=name or f"{kind}-{variant}", kind=kind, target=target, backend=backend,
                     params=PARAMS[kind], schedule=schedule)


def objects(kind: str, backend: str, variant: str) -> list[dict]:
    return render(fault(kind, backend, variant), RUN_ID, [NS])


def _sources() -> list[Path]:
    return [p for p in CONTRACT.iterdir() if p.suffix == ".go" or p.name in ("go.mod", "go.sum")]


def build_checker() -> Path:
    """Build the checker into the cache unless a binary newer than every source is there."""
    newest = max(p.stat().st_mtime for p in _sources())
    if BIN.exists() and BIN.stat().st_mtime >= newest:
        # the checker reads the CRD markers from the chaos-mesh api source in the module cache: make sure
        # it is still there (a no-op when it is; the cache may have been cleaned since the build)
        r = subprocess.run([GO, "mod", "download", "github.com/chaos-mesh/chaos-mesh/api"], cwd=CONTRACT,
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, f"go mod download failed:\n{r.stderr}"
        return BIN
    BIN.parent.mkdir(parents=True, exist_ok=True)
    tmp = BIN.with_name(f".{BIN.name}.{os.getpid()}")
    start = time.monotonic()
    r = subprocess.run([GO, "build", "-trimpath", "-ldflags=-s -w", "-o", str(tmp), "."], cwd=CONTRACT,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, f"building the manifest contract checker failed:\n{r.stdout}{r.stderr}"
    os.replace(tmp, BIN)
    print(f"built {BIN} in {time.monotonic() - start:.1f}s")
    return BIN


@pytest.fixture(scope="module")
def checker() -> Path:
    return build_checker()


def run_checker(checker: Path, objs: list[dict] | str) -> tuple[int, dict[str, str], str]:
    """Exit code, {"Kind/name": "ok" | "error: ..."}, the whole output."""
    text = objs if isinstance(objs, str) else to_yaml(objs)
    r = subprocess.run([str(checker), "-"], input=text, capture_output=True, text=True, timeout=60)
    lines: dict[str, str] = {}
    for line in r.stdout.splitlines():
        ident, _, verdict = line.partition(": ")
        assert ident not in lines, f"two objects named {ident}: {r.stdout}"
        lines[ident] = verdict
    return r.returncode, lines, r.stdout + r.stderr


def ident(o: dict) -> str:
    return f"{o['kind']}/{o['metadata']['name']}"


@pytest.fixture(scope="module")
def verdicts(checker) -> tuple[int, dict[str, str], str]:
    """The checker over every combination at once (one process for the whole matrix)."""
    return run_checker(checker, [o for combo in COMBOS for o in objects(*combo)])


# ------------------------------------------------------------------- positive

@pytest.mark.parametrize("kind,backend,variant", COMBOS)
def test_rendered_objects_pass_the_upstream_contract(verdicts, kind, backend, variant):
    rc, lines, out = verdicts
    objs = objects(kind, backend, variant)
    expected = {"chaos-mesh": "Schedule" if variant == "repeating" else None, "litmus": "ChaosEngine"}[backend]
    if expected:
        assert [o["kind"] for o in objs] == [expected]
    for o in objs:
        assert lines.get(ident(o)) == "ok", f"{ident(o)}: {lines.get(ident(o))}\n{to_yaml([o])}"


def test_the_whole_matrix_exits_zero_with_one_line_per_object(verdicts):
    rc, lines, out = verdicts
    every = [o for combo in COMBOS for o in objects(*combo)]
    assert rc == 0, out
    assert len(lines) == len(every) == 24, out
    assert {o["kind"] for o in every} == {"PodChaos", "NetworkChaos", "StressChaos", "Schedule", "ChaosEngine"}


@pytest.mark.parametrize("backend", ["chaos-mesh", "litmus"])
def test_a_long_fault_name_still_gives_valid_metadata(checker, backend):
    """Label values stop at 63 characters: a long fault name is shortened (with a hash), kept whole in an annotation."""
    name = "a-very-long-fault-name-that-describes-the-mongo-slowdown-of-the-device-registry-in-detail"
    objs = render(fault("pod-kill", backend, "once", name=name), RUN_ID, [NS])
    rc, lines, out = run_checker(checker, objs)
    assert rc == 0, out
    (o,) = objs
    assert o["metadata"]["labels"][RUN_LABEL] == RUN_ID
    assert o["metadata"]["annotations"]["monsoon.io/fault"] == name


# ------------------------------------------------------------------- negative

def one(kind: str, backend: str = "chaos-mesh", variant: str = "once") -> dict:
    (o,) = objects(kind, backend, variant)
    return copy.deepcopy(o)


def _set(path: str, value):
    def f(o: dict) -> None:
        *parents, last = path.split(".")
        d = o
        for p in parents:
            d = d[int(p)] if p.isdigit() else d[p]
        d[last] = value
    return f


UNKNOWN_FIELDS = {
    "PodChaos": (lambda: one("pod-kill"), "spec.gracePeriodSeconds", 5),
    "NetworkChaos": (lambda: one("network-latency"), "spec.containerNames", ["app"]),  # what kube.py used to write
    "StressChaos": (lambda: one("memory-pressure"), "spec.stressors.memory.sizeMB", 512),
    "Schedule": (lambda: one("pod-kill", variant="repeating"), "spec.podChaos.killAll", True),
    "ChaosEngine": (lambda: one("pod-kill", "litmus"), "spec.annotationCheck", "false"),
}


@pytest.mark.parametrize("kind", list(UNKNOWN_FIELDS))
def test_an_unknown_field_fails_the_object_and_names_it(checker, kind):
    make, path, value = UNKNOWN_FIELDS[kind]
    o = make()
    _set(path, value)(o)
    rc, lines, out = run_checker(checker, [o])
    assert rc == 1, out
    assert lines[ident(o)].startswith("error: strict decode: unknown field"), out
    assert f'"{path}"' in lines[ident(o)], out


INVALID_VALUES = [
    # (case, object, mutation, words the error must contain)
    ("networkchaos-duration", lambda: one("network-latency"), _set("spec.duration", "60 seconds"),
     ["webhook ValidateCreate", "parse duration", "60 seconds"]),
    ("networkchaos-direction-without-target", lambda: one("mongo-slowdown"), _set("spec.direction", "from"),
     ["webhook ValidateCreate", "direction", "targets is empty"]),
    ("schedule-cron", lambda: one("pod-kill", variant="repeating"), _set("spec.schedule", "@every banana"),
     ["webhook ValidateCreate", "spec.schedule", "banana"]),
    ("stresschaos-size", lambda: one("memory-pressure"), _set("spec.stressors.memory.size", "lots"),
     ["webhook ValidateCreate", "incorrect bytes format"]),
    ("podchaos-percent", lambda: one("pod-kill"),
     lambda o: (_set("spec.mode", "fixed-percent")(o), _set("spec.value", "150")(o)),
     ["webhook ValidateCreate", "150", "(0,100]"]),
    ("podchaos-mode-enum", lambda: one("pod-kill"), _set("spec.mode", "some"), ["spec.mode", "Unsupported value"]),
    ("podchaos-negative-grace", lambda: one("kafka-broker-restart"), _set("spec.gracePeriod", -1),
     ["spec.gracePeriod", "greater than or equal to 0"]),
    ("networkchaos-latency-pattern", lambda: one("network-latency"), _set("spec.delay.latency", "250"),
     ["spec.delay.latency", "should match"]),
    ("schedule-history-limit", lambda: one("memory-pressure", variant="repeating"), _set("spec.historyLimit", 0),
     ["spec.historyLimit"]),
    ("podchaos-wrong-type", lambda: one("pod-kill"), _set("spec.gracePeriod", "5"), ["cannot unmarshal string"]),
    ("podchaos-missing-action", lambda: one("pod-kill"), lambda o: o["spec"].pop("action"),
     ["spec.action", "Required value"]),
    ("metadata-name", lambda: one("pod-kill"), _set("metadata.name", "Pod_Kill"), ["metadata.name", "RFC 1123"]),
    ("litmus-engine-state", lambda: one("network-latency", "litmus"), _set("spec.engineState", "running"),
     ["spec.engineState"]),
    ("litmus-integer-env", lambda: one("pod-kill", "litmus"),
     _set("spec.experiments.0.spec.components.env.0.value", "1m"), ["TOTAL_CHAOS_DURATION must be an integer"]),
    ("litmus-env-not-a-string", lambda: one("memory-pressure", "litmus"),
     _set("spec.experiments.0.spec.components.env.0.value", 60), ["cannot unmarshal number"]),
    ("litmus-missing-rank", lambda: one("pod-kill", "litmus"), lambda o: o["spec"]["experiments"][0]["spec"].pop("rank"),
     ["spec.experiments[0].spec.rank", "Required value"]),
]


@pytest.mark.parametrize("case,make,mutate,words", INVALID_VALUES, ids=[c[0] for c in INVALID_VALUES])
def test_an_invalid_value_fails_the_object_and_names_it(checker, case, make, mutate, words):
    o = make()
    mutate(o)
    rc, lines, out = run_checker(checker, [o])
    assert rc == 1, out
    verdict = lines[ident(o)]
    assert verdict.startswith("error: "), out
    for w in words:
        assert w in verdict, f"{w!r} not in {verdict!r}"


def test_one_bad_object_among_good_ones_fails_only_itself(checker):
    good = [o for combo in [("pod-kill", "chaos-mesh", "once"), ("memory-pressure", "litmus", "repeating")]
            for o in objects(*combo)]
    bad = one("network-latency")
    _set("spec.delay.jitter", "a bit")(bad)
    rc, lines, out = run_checker(checker, good[:1] + [bad] + good[1:])
    assert rc == 1, out
    assert [lines[ident(o)] for o in good] == ["ok", "ok"], out
    assert lines[ident(bad)].startswith("error: ") and "spec.delay.jitter" in lines[ident(bad)], out


def test_input_that_is_not_a_known_object_fails(checker):
    rc, lines, out = run_checker(checker, "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n---\n"
                                          "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n---\n"
                                          "apiVersion: chaos-mesh.org/v1alpha1\nkind: PodChaos\nkind: Dup\n")
    assert rc == 1, out
    assert "none of chaos-mesh.org/v1alpha1, litmuschaos.io/v1alpha1, v1, batch/v1" in lines["Deployment/x"], out
    assert "v1 Secret is not a kind this checker knows" in lines["Secret/s"], out
    assert any("not valid YAML" in v for v in lines.values()), out  # a duplicate key
    rc, _, out = run_checker(checker, "# nothing here\n")
    assert rc == 2 and "no objects" in out


# ------------------------------------------------------------ the load's Indexed Job

def load_job(shards: int = 4) -> list[dict]:
    from monsoon.load.kube_job import render_load_job
    config = {"devices": [{"name": f"dev-{i}", "token": f"tok-{i}"} for i in range(10)],
              "segments": [[0.0, 60.0, 400.0]], "qos": 1}
    return render_load_job(config, experiment="burst-x10", run_id=RUN_ID, shards=shards,
                           image="ghcr.io/example/monsoon-loadgen:0.1", namespace=NS, allowed_namespaces=[NS])


def test_the_load_job_and_its_configmap_pass_the_upstream_types(checker):
    objs = load_job()
    rc, lines, out = run_checker(checker, objs)
    assert rc == 0, out
    assert [o["kind"] for o in objs] == ["ConfigMap", "Job"]
    job = objs[1]
    assert job["spec"]["completionMode"] == "Indexed" and job["spec"]["completions"] == 4
    assert job["spec"]["template"]["spec"]["containers"][0]["command"][-2:] == ["--shard", "auto/4"]
    assert all(o["metadata"]["labels"][RUN_LABEL] == RUN_ID for o in objs)


JOB_BREAKS = [
    ("restart-always", _set("spec.template.spec.restartPolicy", "Always"), ["restartPolicy", "Unsupported value"]),
    ("indexed-without-completions", lambda o: o["spec"].pop("completions"), ["spec.completions", "Required value"]),
    ("unknown-field", _set("spec.template.spec.containers.0.cmd", ["x"]), ["strict decode", "unknown field"]),
    ("mount-of-no-volume", _set("spec.template.spec.volumes.0.name", "other"), ["volumeMounts[0].name", "Not found"]),
    ("wrong-type", _set("spec.parallelism", "4"), ["cannot unmarshal string"]),
]


@pytest.mark.parametrize("case,mutate,words", JOB_BREAKS, ids=[c[0] for c in JOB_BREAKS])
def test_a_broken_load_job_fails_and_names_what(checker, case, mutate, words):
    job = copy.deepcopy(load_job()[1])
    mutate(job)
    rc, lines, out = run_checker(checker, [job])
    assert rc == 1, out
    for w in words:
        assert w in lines[ident(job)], out


# ------------------------------------------------------------ the scheduled runs' CronJob

def scheduled_cronjob() -> dict:
    from monsoon.history.schedule import cronjob, every_to_cron, run_command
    cron = every_to_cron("6h")
    return cronjob("nightly-chaos", run_command("nightly-chaos", ["-m", "chaos"], deadline=600, cron=cron,
                                                runs_dir="/monsoon/runs"),
                   cron, image="ghcr.io/example/monsoon:0.1", namespace=NS, deadline=600, history_secret="history")


def test_the_scheduled_cronjob_passes_the_upstream_types(checker):
    cj = scheduled_cronjob()
    rc, lines, out = run_checker(checker, [cj])
    assert rc == 0 and lines == {"CronJob/monsoon-nightly-chaos": "ok"}, out
    assert cj["spec"]["concurrencyPolicy"] == "Forbid" and cj["spec"]["startingDeadlineSeconds"] == 600


CRONJOB_BREAKS = [
    ("bad-schedule", _set("spec.schedule", "61 * * * *"), ["spec.schedule", "Invalid value"]),
    ("unknown-policy", _set("spec.concurrencyPolicy", "Never"), ["spec.concurrencyPolicy", "Unsupported value"]),
    ("negative-deadline", _set("spec.startingDeadlineSeconds", -1), ["startingDeadlineSeconds"]),
    ("long-name", _set("metadata.name", "monsoon-" + "x" * 50), ["metadata.name", "52 characters"]),
    ("restart-always", _set("spec.jobTemplate.spec.template.spec.restartPolicy", "Always"), ["restartPolicy"]),
]


@pytest.mark.parametrize("case,mutate,words", CRONJOB_BREAKS, ids=[c[0] for c in CRONJOB_BREAKS])
def test_a_broken_cronjob_fails_and_names_what(checker, case, mutate, words):
    cj = scheduled_cronjob()
    mutate(cj)
    rc, lines, out = run_checker(checker, [cj])
    assert rc == 1, out
    for w in words:
        assert w in lines[ident(cj)], out
