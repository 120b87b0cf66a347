"""Litmus on monsoon's cluster: its CRDs, the runner and experiment images, and its chaos-operator, run out of
cluster inside the cluster's network namespace (``WATCH_NAMESPACE=""``, ``ANALYTICS=FALSE``, the cluster's admin
kubeconfig) the way Chaos Mesh's controller runs (:mod:`monsoon.stack.cluster`), and stopped with the cluster
(``cluster.DAEMONS`` names it).

What it runs is built by ``tools/build-litmus`` from clones of Litmus's three public repositories at
:data:`VERSION` into ``<cache>/litmus/<VERSION>/`` (the module proxy refuses Litmus's own modules)::

    bin/chaos-operator bin/chaos-runner bin/experiments bin/helpers   crds/litmus.yaml
    images/chaos-runner.tar (RUNNER_IMAGE)   images/litmus-go.tar (EXPERIMENT_IMAGE)
    helper-tools/files   what tools/build-litmus-helpers added to EXPERIMENT_IMAGE for litmus-go's helper pods

Also here, pure: which Litmus experiment a fault runs (:func:`experiment_of`) and the env its ChaosEngine gives it
(:func:`engine_experiment`), which the renderer (:mod:`monsoon.faults.kube`) and the backend
(:mod:`monsoon.faults.litmus`) share; :data:`HELPER_TOOLS`: what each experiment's helper pod runs.
"""
from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Callable

from monsoon.paths import CACHE
from monsoon.spec.fault import LITMUS_KIND_EXPERIMENTS, FaultSpec, LatencyParams, MemoryPressureParams
from monsoon.stack import cluster

VERSION = "3.18.0"
RUNNER_IMAGE = f"monsoon.local/litmus-runner:{VERSION}"
EXPERIMENT_IMAGE = f"monsoon.local/litmus-go:{VERSION}"
DEFAULT_SOCKET = "/run/containerd/containerd.sock"     # the charts' default
# what litmus-go's helper pods run besides `helpers` (chaoslib/litmus/*/helper): container-kill `crictl stop`s the
# container; stress-chaos finds the PID with `crictl inspect` and starts `pause nsutil -t PID -p -- stress-ng ...`;
# both annotate their ChaosResult with `kubectl annotate` (a helper that cannot fails its experiment)
HELPER_TOOLS: dict[str, tuple[str, ...]] = {
    "container-kill": ("helpers", "crictl", "kubectl"),
    "pod-memory-hog": ("helpers", "crictl", "kubectl", "pause", "nsutil", "stress-ng"),
    "pod-cpu-hog": ("helpers", "crictl", "kubectl", "pause", "nsutil", "stress-ng"),
    "pod-io-stress": ("helpers", "crictl", "kubectl", "pause", "nsutil", "nsutil.so", "stress-ng"),
}
RUNTIME_EXPERIMENTS = tuple(HELPER_TOOLS)       # their helpers talk to the container runtime on the node

OPERATOR = "chaos-operator"
PROBE_PORT = 18081          # the operator's health probe, inside the cluster's namespace
METRICS_PORT = 18080
CLONES_HINT = (f"run tools/build-litmus with clones of github.com/litmuschaos/chaos-operator, chaos-runner and "
               f"litmus-go at {VERSION} (git clone --branch {VERSION} --depth 1 https://github.com/litmuschaos/<repo>)")


def home() -> Path:
    """``<cache>/litmus/<VERSION>``: what ``tools/build-litmus`` built."""
    return Path(CACHE) / "litmus" / VERSION


def missing(h: Path | None = None) -> list[str]:
    """One line per piece ``tools/build-litmus`` has not built (empty: all there)."""
    h = h or home()
    return [f"{rel}: not built ({h / rel})" for rel in
            ("bin/chaos-operator", "bin/chaos-runner", "bin/experiments", "crds/litmus.yaml",
             "images/chaos-runner.tar", "images/litmus-go.tar")
            if not (h / rel).is_file()]


def skip_reason() -> str | None:
    """Why the Litmus scenarios cannot run here (one line), or None."""
    why = cluster.skip_reason(chaos_mesh=True)
    if why:
        return why
    miss = missing()
    return f"Litmus {VERSION} is not built ({miss[0]}): {CLONES_HINT}" if miss else None


def running(c: cluster.Cluster | None = None) -> bool:
    c = c or cluster.Cluster()
    return cluster._pid(c.dir, OPERATOR) is not None


def operator_argv(c: cluster.Cluster, h: Path) -> tuple[list[str], dict[str, str]]:
    kc = str(c.kubeconfig_inside)
    return ([str(h / "bin" / OPERATOR), f"-kubeconfig={kc}", f"-metrics-bind-address=127.0.0.1:{METRICS_PORT}",
             f"-health-probe-bind-address=127.0.0.1:{PROBE_PORT}"],
            {"WATCH_NAMESPACE": "", "ANALYTICS": "FALSE", "KUBECONFIG": kc, "OPERATOR_NAME": OPERATOR})


def install_crds(c: cluster.Cluster, h: Path) -> list[str]:
    """Create Litmus's CRDs (already there: fine) and wait until each is Established; their names."""
    return cluster.install_crds(c, h / "crds" / "litmus.yaml", "Litmus")


def start(say: Callable[[str], None] = lambda s: None) -> bool:
    """Add Litmus to the running cluster: CRDs, the two images, the operator. False when it already ran."""
    h = home()
    miss = missing(h)
    if miss:
        raise cluster.ClusterError(f"Litmus {VERSION} is not built ({miss[0]}): {CLONES_HINT}")
    c = cluster.Cluster()
    if not cluster.running(c):
        raise cluster.ClusterError("the monsoon cluster is not running (monsoon cluster up)")
    with cluster._locked(c.dir):
        if running(c):
            return False
        t0 = time.monotonic()
        names = install_crds(c, h)
        for tar in ("chaos-runner.tar", "litmus-go.tar"):
            c.import_archive(h / "images" / tar)
        argv, extra = operator_argv(c, h)
        pid = cluster._spawn(c.dir, OPERATOR, argv, extra)
        cluster._wait("Litmus chaos-operator", lambda: cluster._http_inside(PROBE_PORT, "/healthz", b" 200 "),
                      60, c.dir, OPERATOR, pid)
        say(f"Litmus {VERSION}: {len(names)} CRDs, 2 images and chaos-operator in {time.monotonic() - t0:.1f}s")
    return True


def stop() -> bool:
    """Stop the operator (the cluster's down stops it too). True when it ran."""
    c = cluster.Cluster()
    pid = cluster._pid(c.dir, OPERATOR)
    if pid is None:
        return False
    cluster._kill(pid, 10.0)
    (c.dir / "pids" / f"{OPERATOR}.pid").unlink(missing_ok=True)
    return True


# ------------------------------------------------------------------ which experiment, with what env (pure)

def experiment_of(fault: FaultSpec) -> str:
    """The litmus-go experiment a litmus fault runs (its ``litmus:``, else its kind's)."""
    if fault.litmus is not None:
        return fault.litmus.experiment_for(fault.kind)
    return LITMUS_KIND_EXPERIMENTS.get(fault.kind, ("",))[0]


def _whole(seconds: float) -> int:
    return max(1, math.ceil(seconds))


def engine_experiment(fault: FaultSpec, socket: str | None = None) -> tuple[str, dict[str, str]]:
    """The experiment a litmus fault's ChaosEngine runs and the env it gives it (over the ChaosExperiment's)."""
    exp = experiment_of(fault)
    p, k, sch = fault.params, fault.target.kube, fault.schedule
    env: dict[str, Any] = {"TOTAL_CHAOS_DURATION": _whole(sch.duration)}
    if exp == "pod-delete":
        env.update(CHAOS_INTERVAL=_whole(sch.repeat_every or sch.duration),
                   FORCE="true" if getattr(p, "grace_period", 0) == 0 else "false")
    elif exp == "container-kill":      # one kill a window: the interval is the window
        env.update(CHAOS_INTERVAL=_whole(sch.duration), SIGNAL=getattr(p, "signal", "SIGKILL"))
    elif exp == "pod-network-latency" and isinstance(p, LatencyParams):
        env.update(NETWORK_LATENCY=p.latency_ms, JITTER=p.jitter_ms)
    elif exp == "pod-memory-hog" and isinstance(p, MemoryPressureParams):
        env.update(MEMORY_CONSUMPTION=p.hog_mb, NUMBER_OF_WORKERS=p.workers)
    elif fault.kind not in LITMUS_KIND_EXPERIMENTS:
        raise ValueError(f"{fault.name}: litmus cannot render {fault.kind}")
    if exp in RUNTIME_EXPERIMENTS:
        env.update(CONTAINER_RUNTIME="containerd", SOCKET_PATH=socket or DEFAULT_SOCKET)
    env.update(LIB_IMAGE=EXPERIMENT_IMAGE, LIB_IMAGE_PULL_POLICY="IfNotPresent",
               GOLANG_PROTOBUF_REGISTRATION_CONFLICT="warn")
    if k is not None and k.container:
        env["TARGET_CONTAINER"] = k.container
    if fault.litmus is not None:
        env.update(fault.litmus.env)
    return exp, {key: str(v) for key, v in env.items()}
