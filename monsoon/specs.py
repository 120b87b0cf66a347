"""Validated, frozen descriptions of stacks and experiments, parsed from YAML.

Every error names the file, the line and the dotted key (see ``yamlio``).
Nothing here touches a live system: validation happens before anything starts.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from .yamlio import LocatedDoc, SpecError, load_located, validate

REPO = Path(__file__).resolve().parent.parent
PROFILES = ("quick", "nightly", "full")

# {repo} {cache} {python} {run_dir} {stack_dir} {dir} {port:NAME}
TEMPLATE_RE = re.compile(r"\{([a-z_]+)(?::([A-Za-z0-9_.-]+))?\}")
TEMPLATE_NAMES = {"repo", "cache", "python", "run_dir", "stack_dir", "dir", "port"}


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------- stacks

class ReadySpec(_Frozen):
    """How to tell a service is ready: exactly one of tcp / http / log."""
    tcp: str | None = None        # "{port:kafka}" or "127.0.0.1:9092"
    http: str | None = None       # URL answering 2xx
    log: str | None = None        # regex searched in the service log
    timeout: float = Field(60.0, gt=0)

    @model_validator(mode="after")
    def _one(self) -> "ReadySpec":
        given = [k for k in ("tcp", "http", "log") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of tcp, http, log (got {given or 'none'})")
        return self


class RequireSpec(_Frozen):
    """A precondition checked before anything starts: a binary on PATH or a file."""
    binary: str | None = None
    path: str | None = None
    hint: str = ""

    @model_validator(mode="after")
    def _one(self) -> "RequireSpec":
        if bool(self.binary) == bool(self.path):
            raise ValueError("give exactly one of binary, path")
        return self


class ServiceSpec(_Frozen):
    command: tuple[str, ...]
    requires: tuple[RequireSpec, ...] = ()
    # a value may differ per profile: {quick: 64m, full: 768m, default: 256m}
    env: dict[str, str | dict[Literal["quick", "nightly", "full", "default"], str]] = {}
    depends_on: tuple[str, ...] = ()
    ready: ReadySpec | None = None
    restart: Literal["no", "always", "on-failure"] = "no"
    restart_delay: float = Field(1.0, ge=0)
    stop_timeout: float = Field(15.0, gt=0)
    stop_signal: Literal["SIGTERM", "SIGINT", "SIGQUIT", "SIGKILL"] = "SIGTERM"
    ephemeral: bool = False   # delete the service's work dir (not its log) after the stack stops

    @field_validator("command", mode="before")
    @classmethod
    def _split(cls, v: Any) -> Any:
        return tuple(shlex.split(v)) if isinstance(v, str) else v

    @field_validator("env", mode="before")
    @classmethod
    def _env_str(cls, v: Any) -> Any:
        if not isinstance(v, dict):
            return v
        return {k: ({p: str(y) for p, y in x.items()} if isinstance(x, dict) else str(x)) for k, x in v.items()}

    def env_for(self, profile: str) -> dict[str, str]:
        out = {}
        for k, v in self.env.items():
            if isinstance(v, dict):
                if profile not in v and "default" not in v:
                    raise ValueError(f"env {k} has no value for profile {profile!r} and no default")
                v = v.get(profile, v.get("default"))
            out[k] = v
        return out


class DevicesSpec(_Frozen):
    protocol: Literal["mqtt"] = "mqtt"
    host: str = "127.0.0.1"
    port: str
    topic: str = "v1/devices/me/telemetry"

    @field_validator("port", mode="before")
    @classmethod
    def _port_str(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) else v


class ProvisioningSpec(_Frozen):
    kind: Literal["thingsboard-rest", "none"]
    url: str | None = None
    username: str | None = None
    password: str | None = None

    @model_validator(mode="after")
    def _need_url(self) -> "ProvisioningSpec":
        if self.kind == "thingsboard-rest" and not (self.url and self.username and self.password is not None):
            raise ValueError("thingsboard-rest provisioning needs url, username and password")
        return self


class StorageSpec(_Frozen):
    kind: Literal["postgres"] = "postgres"
    dsn: str
    loss_query: str = Field(description="SQL returning (device, seq[, stored_ms]) for every stored message")
    count_query: str | None = Field(None, description="SQL returning one number: stored messages so far")


class KafkaObserveSpec(_Frozen):
    bootstrap: str
    group: str
    topic: str | None = None


class KubeObserveSpec(_Frozen):
    """Pods whose restarts and OOMKilled terminations no_oom reads (``matchLabels`` semantics)."""
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    namespace: str
    label_selector: dict[str, str] = Field(alias="labelSelector", min_length=1)

    def selector_string(self) -> str:
        return ",".join(f"{k}={v}" for k, v in sorted(self.label_selector.items()))


class ObserveSpec(_Frozen):
    service: str | None = None                 # the service under test: RSS, exits, OOM
    metrics_url: str | None = None             # Prometheus text endpoint
    metrics: dict[str, str] = {}               # signal name -> series selector
    kafka: KafkaObserveSpec | None = None
    kubernetes: KubeObserveSpec | None = None  # pods: OOMKilled, restartCount (when a cluster is configured)
    docker: tuple[str, ...] = ()               # containers: State.OOMKilled, RestartCount (docker inspect)


class ChaosSpec(_Frozen):
    """Where the stack's fault tooling lives (templates allowed)."""
    toxiproxy: str | None = Field(None, description="the stack's Toxiproxy API, e.g. http://127.0.0.1:{port:toxiproxy}")


class StackSpec(_Frozen):
    name: str
    description: str = ""
    ports: dict[str, int | Literal["auto"]] = {}
    services: dict[str, ServiceSpec]
    devices: DevicesSpec
    provisioning: ProvisioningSpec
    storage: StorageSpec
    observe: ObserveSpec = ObserveSpec()
    chaos: ChaosSpec = ChaosSpec()
    source: str = ""

    def start_order(self) -> list[str]:
        order: list[str] = []
        seen: set[str] = set()

        def visit(n: str, stack: tuple[str, ...]) -> None:
            if n in stack:
                raise ValueError(f"dependency cycle: {' -> '.join(stack + (n,))}")
            if n in seen:
                return
            for d in self.services[n].depends_on:
                visit(d, stack + (n,))
            seen.add(n)
            order.append(n)

        for n in self.services:
            visit(n, ())
        return order

    def port_names(self) -> list[str]:
        names = set(self.ports)
        for m in TEMPLATE_RE.finditer(self.model_dump_json()):
            if m.group(1) == "port":
                names.add(m.group(2))
        return sorted(names)


# ---------------------------------------------------------------- experiments

class ShapeSpec(_Frozen):
    kind: Literal["steady", "burst"]
    multiplier: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _mult(self) -> "ShapeSpec":
        if self.kind == "burst" and self.multiplier is None:
            raise ValueError("a burst shape needs a multiplier (e.g. 10 for x10)")
        return self


class LoadSpec(_Frozen):
    devices: int = Field(gt=0)
    qos: Literal[0, 1] = 1
    base_rate: float = Field(gt=0, description="x1 in messages per second, all devices together")
    shape: ShapeSpec
    device_prefix: str = "monsoon"


class Durations(_Frozen):
    """Seconds per phase. steady shapes use ``warmup`` + ``recovery`` only."""
    warmup: float = Field(gt=0)
    burst: float = Field(0, ge=0)
    recovery: float = Field(0, ge=0)
    drain_timeout: float = Field(120, gt=0)

    @property
    def total(self) -> float:
        return self.warmup + self.burst + self.recovery


class CheckSpec(_Frozen):
    """A check reference; a parameter may differ per profile: ``seconds: {quick: 120, full: 1800}``.

    ``profiles: [nightly, full]`` among the params judges the check only in those
    profiles (e.g. a leak slope that minutes of data cannot decide).
    """
    name: str
    params: dict[str, Any] = {}
    profiles: tuple[Literal["quick", "nightly", "full"], ...] | None = None

    @model_validator(mode="before")
    @classmethod
    def _split_profiles(cls, v: Any) -> Any:
        if isinstance(v, dict) and isinstance(v.get("params"), dict) and "profiles" in v["params"]:
            params = dict(v["params"])
            v = {**v, "params": params, "profiles": params.pop("profiles")}
        return v

    def applies(self, profile: str) -> bool:
        return self.profiles is None or profile in self.profiles

    def resolved(self, profile: str) -> dict[str, Any]:
        return {k: _per_profile(v, profile, f"checks.{self.name}.{k}") for k, v in self.params.items()}


def _per_profile(value: Any, profile: str, key: str) -> Any:
    """``{quick: 30, full: 3600}`` -> the profile's value; anything else as is."""
    if isinstance(value, dict) and value and set(value) <= set(PROFILES) | {"default"}:
        if profile in value:
            return value[profile]
        if "default" in value:
            return value["default"]
        raise SpecError("", None, key, f"no value for profile {profile!r}")
    return value


class FaultRef(_Frozen):
    """One fault of an experiment: a profile from ``fault-profiles/`` plus overrides.

    ``schedule`` and ``params`` are merged key by key onto the profile's; every
    value may differ per profile (``at: {quick: 30, full: 3600}``).  Times are
    seconds from the start of the load.
    """
    profile: str
    name: str | None = None
    target: str | dict[str, Any] | None = None
    backend: str | None = None
    params: dict[str, Any] = {}
    schedule: dict[str, Any] = {}

    def overrides(self, profile: str) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in ("name", "target", "backend"):
            v = getattr(self, key)
            if v is not None:
                out[key] = v
        for key in ("params", "schedule"):
            d = getattr(self, key)
            if d:
                out[key] = {k: _per_profile(v, profile, f"faults.{key}.{k}") for k, v in d.items()}
        return out


class ExperimentSpec(_Frozen):
    name: str
    description: str = ""
    marks: tuple[str, ...] = ()
    load: LoadSpec
    profiles: dict[Literal["quick", "nightly", "full"], Durations]
    checks: tuple[CheckSpec, ...]
    faults: tuple[FaultRef, ...] = ()
    # extra environment per stack service, e.g. {platform: {DEFECT_DROP_ACKED_PCT: "0.1"}}; wins over the stack's
    env: dict[str, dict[str, str]] = {}
    source: str = ""

    @field_validator("env", mode="before")
    @classmethod
    def _env_str(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {svc: ({k: str(x) for k, x in e.items()} if isinstance(e, dict) else e) for svc, e in v.items()}
        return v

    @field_validator("faults", mode="before")
    @classmethod
    def _faults(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"profile": x} if isinstance(x, str) else x for x in v]
        return v

    @field_validator("checks", mode="before")
    @classmethod
    def _checks(cls, v: Any) -> Any:
        if not isinstance(v, list):
            return v
        out = []
        for item in v:
            if isinstance(item, str):
                out.append({"name": item})
            elif isinstance(item, dict) and len(item) == 1:
                (name, params), = item.items()
                out.append({"name": name, "params": params or {}})
            else:
                out.append(item)
        return out

    @model_validator(mode="after")
    def _valid(self) -> "ExperimentSpec":
        for prof, d in self.profiles.items():
            if self.load.shape.kind == "burst" and d.burst <= 0:
                raise ValueError(f"profile {prof!r}: a burst experiment needs burst > 0 seconds")
        if not self.profiles:
            raise ValueError("profiles: give at least one of quick, nightly, full")
        return self

    def durations(self, profile: str) -> Durations:
        if profile not in self.profiles:
            raise SpecError(self.source, None, "profiles",
                            f"experiment {self.name!r} has no {profile!r} profile (has: {', '.join(self.profiles)})")
        return self.profiles[profile]


# -------------------------------------------------------------------- loading

def _check_templates(doc: LocatedDoc) -> None:
    def walk(x: Any, path: tuple) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                walk(v, path + (k,))
        elif isinstance(x, list):
            for i, v in enumerate(x):
                walk(v, path + (i,))
        elif isinstance(x, str):
            for m in TEMPLATE_RE.finditer(x):
                name, arg = m.group(1), m.group(2)
                bad = name not in TEMPLATE_NAMES or (name == "port") != (arg is not None)
                if name == "dir" and (len(path) < 2 or path[0] != "services"):
                    bad = True
                if bad:
                    raise SpecError(doc.path, doc.line_of(path), ".".join(map(str, path)),
                                    f"unknown placeholder {m.group(0)} (use {{repo}}, {{cache}}, {{python}}, {{run_dir}}, "
                                    "{stack_dir}, {dir} inside a service, or {port:NAME})")
    walk(doc.data, ())


def _resolve(kind: str, name_or_path: str | Path) -> Path:
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    folder = REPO / ("stacks" if kind == "stack" else "experiments")
    cand = folder / f"{name_or_path}.yaml"
    if not cand.exists():
        avail = sorted(x.stem for x in folder.glob("*.yaml"))
        raise SpecError(cand, None, "", f"no {kind} named {name_or_path!r} (available: {', '.join(avail) or 'none'})")
    return cand


def _fail(doc: LocatedDoc, path: tuple, msg: str) -> SpecError:
    return SpecError(doc.path, doc.line_of(path), ".".join(map(str, path)), msg)


def load_stack(name_or_path: str | Path) -> StackSpec:
    doc = load_located(_resolve("stack", name_or_path))
    _check_templates(doc)
    if isinstance(doc.data, dict):
        doc.data.setdefault("source", str(doc.path))
    spec = validate(doc, StackSpec)
    for name, svc in spec.services.items():
        for i, dep in enumerate(svc.depends_on):
            if dep not in spec.services:
                raise _fail(doc, ("services", name, "depends_on", i), f"unknown service {dep!r}")
    if spec.observe.service and spec.observe.service not in spec.services:
        raise _fail(doc, ("observe", "service"), f"unknown service {spec.observe.service!r}")
    try:
        spec.start_order()
    except ValueError as e:
        raise _fail(doc, ("services",), str(e)) from None
    return spec


def load_experiment(name_or_path: str | Path) -> ExperimentSpec:
    from .checks import validate_check  # late import: checks use these types
    doc = load_located(_resolve("experiment", name_or_path))
    if isinstance(doc.data, dict):
        doc.data.setdefault("source", str(doc.path))
    spec = validate(doc, ExperimentSpec)
    for i, c in enumerate(spec.checks):
        for profile in spec.profiles:
            if not c.applies(profile):
                continue
            try:
                validate_check(c.name, c.resolved(profile))
            except SpecError as e:
                raise _fail(doc, ("checks", i), f"{e.key}: no value for profile {profile!r}") from None
            except ValueError as e:
                raise _fail(doc, ("checks", i), str(e)) from None
    if spec.faults:
        from .chaos import resolve_fault
        for profile in spec.profiles:
            seen: dict[str, int] = {}
            for i, ref in enumerate(spec.faults):
                f = resolve_fault(ref, profile, where=(doc.path, doc.line_of(("faults", i)), f"faults.{i}"))
                if f.name in seen:
                    raise _fail(doc, ("faults", i), f"fault name {f.name!r} is also the name of faults.{seen[f.name]}: "
                                "give each fault a distinct name")
                seen[f.name] = i
    return spec
