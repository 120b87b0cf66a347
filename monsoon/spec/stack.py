"""Stack specs (``stacks/*.yaml``): services, their readiness, devices, provisioning, storage read-back and
what to observe; ``load_stack`` checks placeholders, dependencies and start order."""
from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any, Literal
from pydantic import ConfigDict, Field, field_validator, model_validator

from monsoon.spec.base import _Frozen, _fail, _invalid, _per_profile, _resolve
from monsoon.spec.yamlio import LocatedDoc, SpecError, load_located, validate





# {repo} {cache} {python} {run_dir} {stack_dir} {dir} {port:NAME}
TEMPLATE_RE = re.compile(r"\{([a-z_]+)(?::([A-Za-z0-9_.-]+))?\}")


TEMPLATE_NAMES = {"repo", "cache", "python", "run_dir", "stack_dir", "dir", "port"}


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
            try:
                out[k] = _per_profile(v, profile, f"env.{k}")
            except SpecError:
                raise ValueError(f"env {k} has no value for profile {profile!r} and no default") from None
        return out


class DevicesSpec(_Frozen):
    """Where devices connect. ``transport``: ``mqtt`` (``topic``), ``http`` (ThingsBoard's
    ``POST /api/v1/{token}/telemetry``) or ``coap`` (the same path over CoAP); ``port`` is that
    transport's port. ``protocol`` is the older name of ``transport``."""
    transport: Literal["mqtt", "http", "coap"] = "mqtt"
    protocol: Literal["mqtt", "http", "coap"] | None = None
    host: str = "127.0.0.1"
    port: str
    topic: str = "v1/devices/me/telemetry"

    @field_validator("port", mode="before")
    @classmethod
    def _port_str(cls, v: Any) -> Any:
        return str(v) if isinstance(v, int) else v

    @model_validator(mode="after")
    def _protocol_is_transport(self) -> "DevicesSpec":
        if self.protocol is not None:
            if "transport" in self.model_fields_set and self.protocol != self.transport:
                raise _invalid(f"protocol ({self.protocol}) and transport ({self.transport}) differ: "
                               "give transport only")
            object.__setattr__(self, "transport", self.protocol)
        return self


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
