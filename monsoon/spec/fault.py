"""Declarative faults: ``fault-profiles/<kind>.yaml`` -> a validated, frozen :class:`FaultSpec`.

A profile names *what* breaks (``kind`` + ``params``), *where* (``target``: a
stack service, a hop ``"platform->postgres"`` between two services, or a
Kubernetes selector), *when* (``schedule``) and *how* (``backend``).  Errors
name the file, the line and the dotted key (see :mod:`monsoon.spec.yamlio`); the
file name must equal the ``kind`` (kebab-case).

Nothing here touches a live system.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializeAsAny, ValidationInfo, field_validator, model_validator

from monsoon.settings import ROOT
from monsoon.spec.base import _Frozen, _resolve, label_selector
from monsoon.spec.yamlio import SpecError, load_located, validate


PROFILES_DIR = ROOT / "fault-profiles"   # the ones monsoon ships
KEBAB = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
# a Kubernetes label key/value, loosely: [prefix/]name
LABEL_RE = re.compile(r"^([a-z0-9.-]+/)?[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$")
DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")

Backend = Literal["toxiproxy", "process", "cgroup", "chaos-mesh", "litmus"]
KUBE_BACKENDS = ("chaos-mesh", "litmus")


# --------------------------------------------------------------------- target

class KubeSelector(_Frozen):
    """Pods of a Kubernetes namespace selected by labels (``matchLabels`` semantics)."""
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    namespace: str = Field(description="the pods' namespace (must be on MONSOON_KUBE_NAMESPACES)")
    label_selector: dict[str, str] = Field(alias="labelSelector", min_length=1,
                                           description="labels the pods carry, all of them")
    container: str | None = Field(None, description="one container of the pods (default: the whole pod)")

    @field_validator("namespace")
    @classmethod
    def _ns(cls, v: str) -> str:
        if not DNS_LABEL.match(v):
            raise ValueError(f"{v!r} is not a valid namespace name (lower-case DNS label)")
        return v

    @field_validator("label_selector")
    @classmethod
    def _labels(cls, v: dict[str, str]) -> dict[str, str]:
        for k, val in v.items():
            if not LABEL_RE.match(str(k)):
                raise ValueError(f"{k!r} is not a valid label key")
            if val != "" and not LABEL_RE.match(str(val)):
                raise ValueError(f"{val!r} (label {k}) is not a valid label value")
        return {str(k): str(val) for k, val in v.items()}

    def selector_string(self) -> str:
        return label_selector(self.label_selector)


class Target(_Frozen):
    """Exactly one of: ``service`` ("kafka"), ``hop`` ("platform->postgres"), ``kube`` (a selector).

    In YAML write ``target: kafka``, ``target: platform->postgres`` or
    ``target: {namespace: iot, labelSelector: {app: hono-adapter}}``.
    """
    service: str | None = None
    hop: tuple[str, str] | None = None
    kube: KubeSelector | None = None

    @model_validator(mode="before")
    @classmethod
    def _from_yaml(cls, v: Any) -> Any:
        if isinstance(v, str):
            if "->" in v:
                src, _, dst = v.partition("->")
                src, dst = src.strip(), dst.strip()
                if not src or not dst or "->" in dst:
                    raise ValueError(f"a hop is 'client->server', got {v!r}")
                return {"hop": (src, dst)}
            if not v.strip():
                raise ValueError("empty target")
            return {"service": v.strip()}
        if isinstance(v, dict) and "namespace" in v:
            return {"kube": v}
        return v

    @model_validator(mode="after")
    def _one(self) -> "Target":
        given = [k for k in ("service", "hop", "kube") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give a service name, a hop 'client->server', or {namespace, labelSelector}")
        return self

    @property
    def what(self) -> Literal["service", "hop", "kube"]:
        return "service" if self.service else "hop" if self.hop else "kube"

    def __str__(self) -> str:
        if self.service:
            return self.service
        if self.hop:
            return f"{self.hop[0]}->{self.hop[1]}"
        assert self.kube is not None
        return f"{self.kube.namespace}/{self.kube.selector_string()}"


# ------------------------------------------------------------------- schedule

class Schedule(_Frozen):
    """Seconds from the start of the run: inject at ``at``, heal ``duration`` later, again every ``repeat_every``."""
    at: float = Field(0.0, ge=0, description="seconds from the load start to the first injection")
    duration: float = Field(gt=0, description="seconds until it heals")
    repeat_every: float | None = Field(None, gt=0, description="inject again every so many seconds (longer than "
                                       "duration)")
    times: int | None = Field(None, gt=0, description="how many injections when repeating (default: until the run ends)")

    @model_validator(mode="after")
    def _fits(self) -> "Schedule":
        if self.repeat_every is not None and self.repeat_every <= self.duration:
            raise ValueError(f"repeat_every ({self.repeat_every}s) must be longer than duration ({self.duration}s): "
                             "a fault must heal before it is injected again")
        if self.times is not None and self.repeat_every is None and self.times > 1:
            raise ValueError("times > 1 needs repeat_every")
        return self

    def windows(self, horizon: float) -> list[tuple[float, float]]:
        """(inject, heal) times that start before ``horizon``; a heal may fall after it."""
        out: list[tuple[float, float]] = []
        t = self.at
        while t < horizon:
            out.append((t, t + self.duration))
            if self.repeat_every is None or (self.times is not None and len(out) >= self.times):
                break
            t += self.repeat_every
        return out


# --------------------------------------------------------------------- params

SIGNALS = Literal["SIGKILL", "SIGTERM", "SIGINT", "SIGQUIT"]
Stream = Literal["downstream", "upstream", "both"]
Probe = Literal["auto", "echo", "postgres", "http", "kafka", "mongo", "redis", "cql", "none"]


class PodKillParams(_Frozen):
    signal: SIGNALS = Field("SIGKILL", description="the signal sent to the service's process group")
    restart_timeout: float = Field(60.0, gt=0, description="seconds to wait for the restart that proves landing")
    grace_period: int = Field(0, ge=0, description="Kubernetes only: pod deletion grace period")


class PodFailureParams(_Frozen):
    landing_timeout: float = Field(60.0, gt=0, description="seconds to wait for the pod to run the pause image "
                                   "and go not-ready (and, after the heal, to run its own image and be Ready again)")


class KafkaBrokerRestartParams(PodKillParams):
    signal: SIGNALS = Field("SIGTERM", description="the signal sent to the broker's process group")


class ProcessPauseParams(_Frozen):
    verify_timeout: float = Field(5.0, gt=0, description="seconds to wait for the processes to show stopped "
                                  "(and running again after the heal)")


class LatencyParams(_Frozen):
    latency_ms: int = Field(gt=0, description="added delay in ms")
    jitter_ms: int = Field(0, ge=0, description="+/- this many ms at random (at most latency_ms)")
    stream: Stream = Field("downstream", description="downstream (replies), upstream (requests) or both")
    probe: Probe = Field("auto", description="the request that measures the landing (auto: from the upstream "
                         "service's name)")

    @model_validator(mode="after")
    def _jitter(self) -> "LatencyParams":
        if self.jitter_ms > self.latency_ms:
            raise ValueError(f"jitter_ms ({self.jitter_ms}) larger than latency_ms ({self.latency_ms})")
        return self


class DependencyDownParams(_Frozen):
    mode: Literal["disable", "reset_peer", "timeout"] = Field(
        "disable", description="disable the proxy (refused connections), reset connections, or hold them")
    timeout_ms: int = Field(0, ge=0, description="reset_peer/timeout: after how long (0 = at once / forever)")
    probe: Probe = Field("auto", description="the request that measures the landing (auto: from the upstream "
                         "service's name)")


class BandwidthParams(_Frozen):
    rate_kbps: int = Field(gt=0, description="KiB per second (Toxiproxy's bandwidth 'rate')")
    stream: Stream = Field("downstream", description="downstream (replies), upstream (requests) or both")
    probe: Probe = Field("auto", description="the requests whose throughput measures the landing (auto: from "
                         "the upstream service's name)")


class MemoryPressureParams(_Frozen):
    limit_mb: int | None = Field(None, gt=0, description="cgroup: the lowered memory limit")
    hog_mb: int | None = Field(None, gt=0, description="Kubernetes: memory a stressor allocates in the pod")
    workers: int = Field(1, gt=0, description="Kubernetes: stressor workers")
    mode: Literal["child", "in-place"] = Field("child", description="cgroup: child (a child cgroup of the "
                                               "service's, the default) or in-place (its own cgroup)")

    @model_validator(mode="after")
    def _one(self) -> "MemoryPressureParams":
        if self.limit_mb is None and self.hog_mb is None:
            raise ValueError("give limit_mb (cgroup backend) and/or hog_mb (chaos-mesh/litmus)")
        return self


# litmus-go 3.18.0's experiments (bin/experiment/experiment.go: `./experiments -name <one of these>`)
LITMUS_EXPERIMENTS = frozenset("""
container-kill disk-fill kafka-broker-pod-failure kubelet-service-kill docker-service-kill node-cpu-hog node-drain
node-io-stress node-memory-hog node-taint pod-autoscaler pod-cpu-hog-exec pod-delete pod-io-stress
pod-memory-hog-exec pod-network-corruption pod-network-duplication pod-network-latency pod-network-loss
pod-network-partition pod-memory-hog pod-cpu-hog cassandra-pod-delete aws-ssm-chaos-by-id aws-ssm-chaos-by-tag
ec2-terminate-by-id ec2-terminate-by-tag ebs-loss-by-id ebs-loss-by-tag node-restart pod-dns-error pod-dns-spoof
pod-http-latency pod-http-status-code pod-http-modify-header pod-http-modify-body pod-http-reset-peer vm-poweroff
azure-instance-stop azure-disk-loss gcp-vm-disk-loss pod-fio-stress gcp-vm-instance-stop redfish-node-restart
gcp-vm-instance-stop-by-label gcp-vm-disk-loss-by-label spring-boot-cpu-stress k6-loadgen""".split())
# which Litmus experiments a kind may run (the first: the kind's default): monsoon judges each by its kind's effect
LITMUS_KIND_EXPERIMENTS: dict[str, tuple[str, ...]] = {
    "pod-kill": ("pod-delete",), "kafka-broker-restart": ("pod-delete",), "container-kill": ("container-kill",),
    "memory-pressure": ("pod-memory-hog",), "network-latency": ("pod-network-latency",),
    "mongo-slowdown": ("pod-network-latency",), "infinispan-slowdown": ("pod-network-latency",),
    "cassandra-slowdown": ("pod-network-latency",)}
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# set by monsoon from the fault (the window, the image built here): a profile may not set them
LITMUS_OWN_ENV = ("TOTAL_CHAOS_DURATION", "LIB_IMAGE", "LIB_IMAGE_PULL_POLICY")


class LitmusSpec(_Frozen):
    """``backend: litmus`` only: which Litmus experiment runs the fault. ``chart`` names a ChaosHub chart's
    ``fault.yaml`` (applied unchanged apart from its image), else monsoon writes the ChaosExperiment for the
    litmus-go ``experiment`` itself; ``env`` is given to the experiment through the ChaosEngine."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    chart: str | None = Field(None, description="a chaos-charts fault: its name (container-kill: "
                              "faults/kubernetes/<name>/fault.yaml of the chaos-charts directory, "
                              "MONSOON_CHAOS_CHARTS) or a path to a fault.yaml (relative: to the chaos-charts "
                              "directory)")
    experiment: str | None = Field(None, description="the litmus-go experiment (./experiments -name <it>); "
                                   "default: the chart's name, else the kind's (pod-kill: pod-delete, "
                                   "container-kill: container-kill, memory-pressure: pod-memory-hog)")
    env: dict[str, str] = Field({}, description="more environment for the experiment (the ChaosEngine's "
                                "experiments[].spec.components.env; over the chart's and monsoon's own)")

    @field_validator("chart")
    @classmethod
    def _chart(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("empty chart (give a chaos-charts fault name or a path to its fault.yaml)")
        if v is not None and "/" not in v and not v.endswith((".yaml", ".yml")) and not KEBAB.match(v):
            raise ValueError(f"chart {v!r} is neither a chaos-charts fault name (kebab-case, e.g. "
                             f"container-kill) nor a path to a fault.yaml")
        return v

    @field_validator("experiment")
    @classmethod
    def _experiment(cls, v: str | None) -> str | None:
        if v is not None and v not in LITMUS_EXPERIMENTS:
            raise ValueError(f"unknown litmus-go experiment {v!r} (litmus-go 3.18.0 has e.g. pod-delete, "
                             f"container-kill, pod-memory-hog, pod-cpu-hog)")
        return v

    @field_validator("env", mode="before")
    @classmethod
    def _env(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        out = {}
        for k, val in v.items():
            if not ENV_NAME.match(str(k)):
                raise ValueError(f"{k!r} is not an environment variable name")
            if k in LITMUS_OWN_ENV:
                raise ValueError(f"{k} is monsoon's to set (TOTAL_CHAOS_DURATION: schedule.duration; LIB_IMAGE*: "
                                 f"the image tools/build-litmus made)")
            if isinstance(val, (dict, list)) or val is None:
                raise ValueError(f"env {k}: give a string or a number, not {type(val).__name__}")
            out[str(k)] = str(val).lower() if isinstance(val, bool) else str(val)
        return out

    def chart_name(self) -> str | None:
        """The chart as a chaos-charts fault name (``container-kill``), or None when it is a path."""
        c = self.chart
        return c if c is not None and "/" not in c and not c.endswith((".yaml", ".yml")) else None

    def experiment_for(self, kind: str) -> str:
        """The litmus-go experiment this fault runs."""
        return self.experiment or self.chart_name() or LITMUS_KIND_EXPERIMENTS.get(kind, ("",))[0]


class KindInfo(BaseModel):
    params: type[BaseModel]
    backends: tuple[str, ...]
    targets: tuple[str, ...]


KINDS: dict[str, KindInfo] = {
    "pod-kill": KindInfo(params=PodKillParams, backends=("process", "chaos-mesh", "litmus"),
                         targets=("service", "kube")),
    "kafka-broker-restart": KindInfo(params=KafkaBrokerRestartParams, backends=("process", "chaos-mesh", "litmus"),
                                     targets=("service", "kube")),
    "pod-failure": KindInfo(params=PodFailureParams, backends=("chaos-mesh",), targets=("kube",)),
    "container-kill": KindInfo(params=PodKillParams, backends=("chaos-mesh", "litmus"), targets=("kube",)),
    "process-pause": KindInfo(params=ProcessPauseParams, backends=("process",), targets=("service",)),
    "network-latency": KindInfo(params=LatencyParams, backends=("toxiproxy", "chaos-mesh", "litmus"),
                                targets=("hop", "kube")),
    "mongo-slowdown": KindInfo(params=LatencyParams, backends=("toxiproxy", "chaos-mesh", "litmus"),
                               targets=("hop", "kube")),
    "infinispan-slowdown": KindInfo(params=LatencyParams, backends=("toxiproxy", "chaos-mesh", "litmus"),
                                    targets=("hop", "kube")),
    "cassandra-slowdown": KindInfo(params=LatencyParams, backends=("toxiproxy", "chaos-mesh", "litmus"),
                                   targets=("hop", "kube")),
    "dependency-down": KindInfo(params=DependencyDownParams, backends=("toxiproxy",), targets=("hop",)),
    "cassandra-down": KindInfo(params=DependencyDownParams, backends=("toxiproxy",), targets=("hop",)),
    "bandwidth": KindInfo(params=BandwidthParams, backends=("toxiproxy",), targets=("hop",)),
    "memory-pressure": KindInfo(params=MemoryPressureParams, backends=("cgroup", "chaos-mesh", "litmus"),
                                targets=("service", "kube")),
}


# ----------------------------------------------------------------------- spec

class FaultSpec(_Frozen):
    """A fault profile (``fault-profiles/<kind>.yaml``): what breaks (``kind``, ``params``), where
    (``target``), when (``schedule``) and how (``backend``); an experiment's ``faults:`` may override each."""
    name: str = Field(description="the fault's name, kebab-case (distinct within an experiment)")
    kind: str = Field(description="what breaks; must equal the file name")
    description: str = Field("", description="one line about it")
    target: Target = Field(description="a stack service, a hop client->server, or {namespace, labelSelector}")
    backend: Backend = Field(description="what injects it: toxiproxy, process, cgroup, chaos-mesh or litmus")
    params: SerializeAsAny[BaseModel] = Field(default=None, validate_default=True,
                                              description="the kind's parameters (below)")
    schedule: Schedule = Field(description="when: seconds from the load start")
    litmus: LitmusSpec | None = Field(None, description="backend litmus: the chaos-charts chart or litmus-go "
                                      "experiment that runs it, and its env (default: the kind's experiment, "
                                      "written by monsoon)")
    source: str = Field("", description="set by monsoon: the file the profile was read from")

    @field_validator("name", "kind")
    @classmethod
    def _kebab(cls, v: str, info: ValidationInfo) -> str:
        if not KEBAB.match(v):
            raise ValueError(f"{info.field_name} must be kebab-case (like network-latency), got {v!r}")
        return v

    @field_validator("kind")
    @classmethod
    def _known(cls, v: str, info: ValidationInfo) -> str:
        if v not in KINDS:
            raise ValueError(f"unknown kind {v!r} (known: {', '.join(sorted(KINDS))})")
        path = (info.context or {}).get("path")
        if path is not None and Path(path).stem != v and not Path(path).stem.startswith(f"{v}-"):
            raise ValueError(f"kind {v!r} must match the file name ({Path(path).name}: kind {Path(path).stem!r}, "
                             f"or a variant {v}-<name>.yaml)")
        return v

    @field_validator("params", mode="before")
    @classmethod
    def _params(cls, v: Any, info: ValidationInfo) -> Any:
        kind = info.data.get("kind")
        if kind is None:          # kind itself is invalid: that error is reported
            return v
        model = KINDS[kind].params
        if isinstance(v, model):
            return v
        return model.model_validate(v or {})

    @model_validator(mode="after")
    def _compatible(self) -> "FaultSpec":
        info = KINDS[self.kind]
        if self.backend not in info.backends:
            raise ValueError(f"backend {self.backend!r} cannot do {self.kind} (use one of: {', '.join(info.backends)})")
        if self.target.what not in info.targets:
            raise ValueError(f"{self.kind} targets a {' or a '.join(info.targets)}, not a {self.target.what} "
                             f"({self.target})")
        kube_target = self.target.what == "kube"
        if kube_target != (self.backend in KUBE_BACKENDS):
            raise ValueError(f"backend {self.backend!r} needs a "
                             f"{'Kubernetes selector {namespace, labelSelector}' if not kube_target else 'stack service or hop'}"
                             f" as target (got {self.target})")
        if self.litmus is not None:
            if self.backend != "litmus":
                raise ValueError(f"litmus: is for backend litmus, not {self.backend!r}")
            exp = self.litmus.experiment_for(self.kind)
            allowed = LITMUS_KIND_EXPERIMENTS.get(self.kind, ())
            if exp not in allowed:
                raise ValueError(f"litmus: {self.kind} runs Litmus experiment {' or '.join(allowed)}, not {exp!r} "
                                 f"(monsoon judges a fault by its kind's effect)")
        if isinstance(self.params, MemoryPressureParams):
            if self.backend == "cgroup" and self.params.limit_mb is None:
                raise ValueError("memory-pressure on the cgroup backend needs params.limit_mb")
            if self.backend in KUBE_BACKENDS and self.params.hog_mb is None:
                raise ValueError(f"memory-pressure on {self.backend} needs params.hog_mb")
        return self


# -------------------------------------------------------------------- loading


def load_fault(name_or_path: str | Path, *, folder: Path | None = None,
               services: set[str] | None = None, **overrides: Any) -> FaultSpec:
    """Load and validate one fault profile.

    ``services`` (the stack's service names), when given, is checked against
    the target; ``overrides`` replace top-level keys (e.g. ``schedule=...``)
    before validation.
    """
    doc = load_located(_resolve("fault profile", name_or_path, folder))
    if isinstance(doc.data, dict):
        doc.data.setdefault("source", str(doc.path))
        doc.data.update(overrides)
    spec = validate(doc, FaultSpec)
    if services is not None:
        check_target(spec, services, doc_path=doc.path, line=doc.line_of(("target",)))
    return spec


def check_target(spec: FaultSpec, services: set[str], *, doc_path: str | Path = "", line: int | None = None) -> None:
    """The target names services of the stack (a hop: both ends)."""
    names = [spec.target.service] if spec.target.service else list(spec.target.hop or ())
    for n in names:
        if n not in services:
            raise SpecError(doc_path or spec.source, line, "target",
                            f"unknown service {n!r} (the stack has: {', '.join(sorted(services))})")


def load_profiles(folder: Path = PROFILES_DIR) -> dict[str, FaultSpec]:
    """Every kind's own profile in ``folder`` (``<kind>.yaml``; a variant ``<kind>-<name>.yaml`` is loaded by its
    name, :func:`load_fault`) by kind; the first invalid one raises."""
    return {p.stem: load_fault(p) for p in sorted(folder.glob("*.yaml")) if p.stem in KINDS}
