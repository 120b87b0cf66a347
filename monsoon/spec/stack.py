"""Stack specs (``stacks/*.yaml``): services, their readiness, devices, provisioning, storage read-back and
what to observe; ``load_stack`` checks placeholders, dependencies and start order."""
from __future__ import annotations

import difflib
import hashlib
import os
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any, Literal
from pydantic import ConfigDict, Field, field_validator, model_validator

from monsoon.paths import CACHE, REPO
from monsoon.spec.compose import compose_services
from monsoon.spec.base import _Frozen, _fail, _invalid, _per_profile, _resolve, label_selector
from monsoon.spec.yamlio import LocatedDoc, SpecError, load_located, validate


# {repo} {cache} {python} {run_dir} {stack_dir} {stack_file_dir} {dir} {port:NAME}
TEMPLATE_RE = re.compile(r"\{([a-z_]+)(?::([A-Za-z0-9_.-]+))?\}")


#: What each placeholder stands for (rendered by ``monsoon.stack.supervisor.Stack``).
PLACEHOLDERS = {
    "repo": "the monsoon repository",
    "cache": "monsoon's cache (MONSOON_CACHE, default .cache in the repository)",
    "python": "the Python interpreter running monsoon",
    "run_dir": "this stack's directory in the run: runs/<run-id>/<stack>--<experiment>/ (calibrate-<stack>/ under "
               "monsoon calibrate), holding logs/ and services/",
    "stack_dir": "the same as {run_dir}",
    "stack_file_dir": "the folder of the stack's YAML file (for launchers and configs shipped beside it)",
    "dir": "inside a service only: that service's work dir (<run_dir>/services/<service>/, its cwd)",
    "port": "a free 127.0.0.1 port for NAME (the same everywhere in the stack), or the one fixed under ports:",
    "host": "inside a service only: where the stack's services reach service NAME: its Service's name (NAME) for "
            "pods on the pod network (kubernetes.host_network: false), else 127.0.0.1",
}


TEMPLATE_NAMES = set(PLACEHOLDERS)


Profile = Literal["quick", "nightly", "full", "default"]
Scalar = str | int | float | bool


class ReadySpec(_Frozen):
    """How to tell a service is ready: exactly one of tcp / http / log / cql."""
    tcp: str | None = Field(None, description="host:port accepting TCP connections, e.g. 127.0.0.1:{port:kafka}")
    http: str | None = Field(None, description="a URL answering 2xx")
    log: str | None = Field(None, description="a regular expression searched in the service's log")
    cql: str | None = Field(None, description="host:port of a Cassandra node answering a CQL query "
                            "(SELECT release_version FROM system.local)")
    timeout: float = Field(60.0, gt=0, description="seconds to wait for readiness before the start fails")

    @model_validator(mode="after")
    def _one(self) -> "ReadySpec":
        given = [k for k in ("tcp", "http", "log", "cql") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of tcp, http, log, cql (got {given or 'none'})")
        return self


class RequireSpec(_Frozen):
    """A precondition checked before anything starts: a binary on PATH or a file."""
    binary: str | None = Field(None, description="a program that must be on PATH")
    path: str | None = Field(None, description="a file or folder that must exist (placeholders allowed)")
    hint: str = Field("", description="how to get it, shown when it is missing")

    @model_validator(mode="after")
    def _one(self) -> "RequireSpec":
        if bool(self.binary) == bool(self.path):
            raise ValueError("give exactly one of binary, path")
        return self


Provider = Literal["process", "docker", "kubernetes", "helm"]
DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
#: the label every pod of a Kubernetes-form stack carries with its service name (what observe.kubernetes selects)
SERVICE_POD_LABEL = "monsoon.io/service"
MEM_RE = re.compile(r"^[0-9]+(\.[0-9]+)?[bkmg]?$", re.I)


class ServiceSpec(_Frozen):
    """One process of the stack, started in its own process group with its work dir as cwd; or, with
    ``provider: docker``, one container of ``image`` on the host network (its work dir mounted at the same
    path, so ``{dir}`` means the same inside and out); with ``provider: kubernetes``, a one-replica Deployment
    of ``image`` in the stack's namespace (host network of the cluster's node, the work dir a hostPath at the
    same path, ``mem_limit`` as ``resources.limits.memory``, kubelet restarting it)."""
    command: tuple[str, ...] = Field((), description="the command: a list of arguments, or one string split like a "
                                     "shell would (no shell runs it); a container's default is its image's")
    provider: Provider | None = Field(None, description="process, docker, kubernetes or helm (default: the "
                                     "stack's provider)")
    image: str | None = Field(None, description="docker: the image, e.g. monsoon/platform (make images builds "
                              "monsoon's)")
    mem_limit: str | dict[Profile, str] | None = Field(
        None, description="docker: the container's memory limit (swap included), e.g. 256m; may differ per "
        "profile; the kernel OOM-kills the container above it (exit 137, State.OOMKilled)")
    cpus: float | None = Field(None, gt=0, description="docker: CPU quota in cores, e.g. 0.5")
    volumes: tuple[str, ...] = Field((), description="docker: HOST:CONTAINER[:ro] bind mounts (placeholders "
                                     "allowed); the service's work dir is always mounted at its own path")
    requires: tuple[RequireSpec, ...] = Field((), description="preconditions checked before anything starts")
    # a value may differ per profile: {quick: 64m, full: 768m, default: 256m}
    env: dict[str, str | dict[Profile, str]] = Field(
        {}, description="extra environment variables; a value may differ per profile: "
        "{quick: 64m, full: 1g, default: 256m}")
    depends_on: tuple[str, ...] = Field((), description="services started (and ready) before this one")
    ready: ReadySpec | None = Field(None, description="how to tell it is ready (none: 0.2 s after it started "
                                    "and did not exit)")
    restart: Literal["no", "always", "on-failure"] = Field(
        "no", description="restart it when it exits: never, always, or when its exit code is not 0")
    restart_delay: float = Field(1.0, ge=0, description="seconds between an exit and the restart")
    stop_timeout: float = Field(15.0, gt=0, description="seconds between stop_signal and SIGKILL when the "
                                "stack stops")
    stop_signal: Literal["SIGTERM", "SIGINT", "SIGQUIT", "SIGKILL"] = Field(
        "SIGTERM", description="the signal sent to its process group to stop it")
    ephemeral: bool = Field(False, description="delete its work dir (not its log) after the stack stops")
    oneshot: bool = Field(False, description="a one-shot step (an installer, a migration): run once per stack "
                          "start, to completion; it is ready when it exits 0 (any other exit fails the start), "
                          "and services that depend_on it start after it; no ready or restart with it")
    oneshot_timeout: float = Field(600.0, gt=0, description="oneshot only: seconds it may run before the start "
                                   "fails")

    @model_validator(mode="after")
    def _oneshot(self) -> "ServiceSpec":
        if self.oneshot and self.ready is not None:
            raise _invalid("a oneshot service is ready when it exits 0: give no ready")
        if self.oneshot and self.restart != "no":
            raise _invalid("a oneshot service runs once: give no restart")
        return self

    @field_validator("mem_limit", mode="before", json_schema_input_type=str | dict[Profile, str] | None)
    @classmethod
    def _mem(cls, v: Any) -> Any:
        for x in (v.values() if isinstance(v, dict) else [v]):
            if x is not None and not MEM_RE.match(str(x)):
                raise _invalid(f"memory size {x!r}: a number with b, k, m or g, e.g. 256m")
        return v

    def mem_limit_for(self, profile: str) -> str | None:
        return _per_profile(self.mem_limit, profile, "mem_limit")

    @field_validator("command", mode="before", json_schema_input_type=str | list[str])
    @classmethod
    def _split(cls, v: Any) -> Any:
        return tuple(shlex.split(v)) if isinstance(v, str) else v

    @field_validator("env", mode="before", json_schema_input_type=dict[str, Scalar | dict[Profile, Scalar]])
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


Transport = Literal["mqtt", "http", "coap", "hono-http", "hono-coap"]


class DevicesSpec(_Frozen):
    """Where devices connect. ``transport``: ``mqtt`` (``topic``), ``http`` (ThingsBoard's
    ``POST /api/v1/{token}/telemetry``), ``coap`` (the same path over CoAP) or ``hono-http`` (Eclipse Hono's
    HTTP adapter: telemetry, events and command round trips, monsoon.load.hono) or ``hono-coap`` (the same over
    Hono's CoAP adapter, DTLS with PSK, monsoon.load.coap); ``port`` is that transport's port. ``endpoints``: other
    transports the stack's devices can use, by their port; an experiment picks one with ``load.transport``.
    ``protocol`` is the older name of ``transport``."""
    transport: Transport = Field("mqtt", description="how the devices talk to the stack")
    protocol: Literal["mqtt", "http", "coap"] | None = Field(None, description="the older name of transport")
    host: str = Field("127.0.0.1", description="the host devices connect to")
    port: str = Field(description="that transport's port, e.g. {port:mqtt} or 1883")
    topic: str = Field("v1/devices/me/telemetry", description="mqtt only: the topic devices publish to")
    endpoints: dict[Transport, str] = Field({}, description="other transports the devices can use and their ports, "
                                            "e.g. {hono-coap: '{port:coaps}'}: an experiment's load.transport picks one")

    def offers(self) -> tuple[str, ...]:
        """The transports the devices can use: ``transport`` first, then ``endpoints``."""
        return (self.transport, *(t for t in self.endpoints if t != self.transport))

    def port_of(self, transport: str | None) -> tuple[str, str]:
        """(transport, port) for ``transport`` (None: the default ``transport``); KeyError if not offered."""
        if transport is None or transport == self.transport:
            return self.transport, self.port
        for t, port in self.endpoints.items():
            if t == transport:
                return t, port
        raise KeyError(transport)

    @field_validator("port", mode="before", json_schema_input_type=str | int)
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
    """How the run's devices come to exist: ``none`` (a plain broker: each device's token is its name) or
    ``thingsboard-rest`` (created, or found, through ThingsBoard's REST API with ``url``, ``username``,
    ``password``). ``provisioning: none`` is short for ``{kind: none}``."""
    kind: Literal["thingsboard-rest", "hono-registry", "none"] = Field(
        description="none, thingsboard-rest or hono-registry")
    url: str | None = Field(None, description="thingsboard-rest: the REST API's base URL; hono-registry: the Device "
                            "Registry Management API's base URL (placeholders allowed)")
    username: str | None = Field(None, description="thingsboard-rest: the tenant user")
    password: str | None = Field(None, description="thingsboard-rest: its password")
    tenant: str | None = Field(None, description="hono-registry: the tenant created for the run's devices")
    password_hash: Literal["bcrypt", "sha-256"] = Field(
        "bcrypt", description="hono-registry: how the devices' passwords are stored: bcrypt (Hono's default for a "
        "plain password: ~0.1 s of CPU per check, paid on every HTTP or CoAP request) or sha-256 (salted)")
    psk_key_encoding: Literal["base64url", "base64"] = Field(
        "base64url", description="hono-registry: how a psk credential's key is sent: base64url (Vert.x's default "
        "for binary JSON, as stacks/bin/run-hono runs Hono) or base64 (Hono's release images and the images "
        "tools/build-hono-images makes run with -Dvertx.json.base64=legacy: the registry then reads standard Base64 "
        "and answers a key with '-' or '_' with a 400)")

    @model_validator(mode="after")
    def _need_url(self) -> "ProvisioningSpec":
        if self.kind == "thingsboard-rest" and not (self.url and self.username and self.password is not None):
            raise ValueError("thingsboard-rest provisioning needs url, username and password")
        if self.kind == "hono-registry" and not (self.url and self.tenant):
            raise ValueError("hono-registry provisioning needs url and tenant")
        return self


class StorageSpec(_Frozen):
    """Where stored messages are read back after the drain (every loss and duplicate check reads them):
    ``kind: postgres`` (``dsn``, ``loss_query``) or ``kind: cassandra`` (``contact_points``, ``keyspace``,
    ``cql``; ``dsn`` + ``names_query`` name the entity ids a CQL query returns) or ``kind: kafka`` (``contact_points``:
    the brokers, ``topics``: what reached them is stored)."""
    kind: Literal["postgres", "cassandra", "kafka"] = Field("postgres", description="the database kind (kafka: "
                                                             "a platform whose storage is a topic)")
    dsn: str | None = Field(None, description="postgres: the connection string, e.g. "
                            "postgresql://postgres@127.0.0.1:{port:postgres}/postgres (cassandra: the Postgres "
                            "holding the device names, with names_query)")
    loss_query: str | None = Field(None, description="postgres: SQL returning (device, seq[, stored_ms]) for every "
                                   "stored message")
    count_query: str | None = Field(None, description="SQL on dsn returning one number: stored messages so far "
                                   "(exact; sampled during the drain, and during the load only when there is no "
                                   "running_count_query, then resting so it takes at most 10 % of the time)")
    running_count_query: str | None = Field(
        None, description="SQL on dsn, cheap, sampled every second during the load instead of count_query: one "
        "number (a statistics estimate such as SELECT reltuples::bigint FROM pg_class WHERE oid = 'ts_kv'::regclass, "
        "or the platform's own counter), or, with %(since)s in it, (rows, watermark) of the rows past the last "
        "watermark (NULL at first), added up")
    contact_points: tuple[str, ...] = Field((), description="cassandra: host:port of the nodes, e.g. "
                                            "127.0.0.1:{port:cassandra}; kafka: of the brokers")
    topics: tuple[str, ...] = Field((), description="kafka: the topics whose records are the stored messages, e.g. "
                                    "hono.telemetry.<tenant>")
    keyspace: str | None = Field(None, description="cassandra: the keyspace the cql reads")
    cql: str | None = Field(None, description="cassandra: CQL returning (device or entity_id, seq[, stored_ms]) for "
                            "every stored message; read in pages")
    names_query: str | None = Field(None, description="cassandra: SQL on dsn returning (entity_id, device), to name "
                                    "the entity ids the cql returns")
    fetch_size: int = Field(5000, gt=0, description="cassandra: rows per page")

    @model_validator(mode="after")
    def _kind_fields(self) -> "StorageSpec":
        need = {"postgres": ("dsn", "loss_query"), "cassandra": ("contact_points", "keyspace", "cql"),
                "kafka": ("contact_points", "topics")}[self.kind]
        missing = [k for k in need if not getattr(self, k)]
        if missing:
            raise ValueError(f"storage kind {self.kind} needs {', '.join(missing)}")
        for k in ("names_query", "count_query", "running_count_query"):
            if getattr(self, k) and not self.dsn:
                raise ValueError(f"{k} needs dsn (the Postgres it runs on)")
        if self.running_count_query and not self.count_query:
            raise ValueError("running_count_query needs count_query (the exact count the drain judges)")
        return self


#: What may start the query ``COPY (query) TO STDOUT`` runs (PostgreSQL's COPY takes these, not a statement).
QUERY_WORDS = ("select", "with", "values", "table")
_SQL_SKIP = re.compile(r"\s+|--[^\n]*|/\*.*?\*/|\(", re.S)   # space, comments, an opening parenthesis


def first_sql_word(sql: str) -> str:
    """The first keyword of ``sql`` in lower case, past blanks, comments and opening parentheses (what is there
    instead when it is no word: its first character, or "" for nothing)."""
    i = 0
    while m := _SQL_SKIP.match(sql, i):
        if m.end() == i:
            break
        i = m.end()
    word = re.match(r"[A-Za-z_]+", sql[i:])
    return word.group(0).lower() if word else sql[i:i + 1]


def _snippet(text: str, n: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[:n] + "..."


def _check_queries(doc: LocatedDoc, spec: "StackSpec") -> None:
    """What is plainly no query, before a live database says so: ``loss_query`` starts as a query does (it is
    read back as ``COPY (loss_query) TO STDOUT``), ``cql`` with SELECT. Whether it runs is the preflight's."""
    st = spec.storage
    if st.loss_query and first_sql_word(st.loss_query) not in QUERY_WORDS:
        raise _fail(doc, ("storage", "loss_query"), f"not an SQL query: it is read back as COPY (loss_query) TO "
                    f"STDOUT, so it starts with SELECT, WITH, VALUES or TABLE (got {_snippet(st.loss_query)!r})")
    if st.cql and first_sql_word(st.cql) != "select":
        raise _fail(doc, ("storage", "cql"), f"not a CQL query: it starts with SELECT (got {_snippet(st.cql)!r})")


GLOB_CHARS = set("*?[")


def is_pattern(name: str | None) -> bool:
    """A Kafka group or topic name given as a shell-style pattern (``*``, ``?``, ``[...]``)."""
    if not name:
        return False
    return not GLOB_CHARS.isdisjoint(name)


class KafkaObserveSpec(_Frozen):
    """Kafka consumer groups whose lag is sampled every second (per partition: log end, committed offset).
    ``group`` and ``topic`` may be shell-style patterns (``re-Main-consumer-*``, ``tb_rule_engine.main.*``):
    then the lag covers every matching group on every matching topic; a partition's lag is that of the
    slowest matching group that has committed on it (its whole log when none has)."""
    bootstrap: str = Field(description="host:port of a broker, e.g. 127.0.0.1:{port:kafka}")
    group: str = Field(description="the consumer group of the service under test, or a pattern matching its groups")
    topic: str | None = Field(None, description="the topic, or a pattern matching its topics (default: every "
                              "topic the group(s) have committed on)")


_SELECTOR = r'[A-Za-z_:][A-Za-z0-9_:]*(?:\{(?:[^}"]|"(?:[^"\\]|\\.)*")*\})?'
_TERM_RE = re.compile(r'\s*([+-])?\s*(' + _SELECTOR + r')\s*')


def metric_terms(expr: str) -> tuple[tuple[int, str], ...]:
    """``'a{x="1"} - b + c'`` -> ((1, 'a{x="1"}'), (-1, 'b'), (1, 'c')): the series of a signal, each with its
    sign. One selector is one term; label values may hold any character (``-`` included)."""
    terms: list[tuple[int, str]] = []
    pos = 0
    while pos < len(expr):
        m = _TERM_RE.match(expr, pos)
        if not m or m.end() == pos or (terms and not m.group(1)) or (not terms and m.group(1) == "+"):
            raise ValueError(f"cannot read {expr[pos:].strip()[:40]!r} in {expr!r}: give series joined by + and -, "
                             "e.g. 'put_total - done_total'")
        terms.append((-1 if m.group(1) == "-" else 1, m.group(2)))
        pos = m.end()
    if not terms:
        raise ValueError("empty series")
    return tuple(terms)


class KubeObserveSpec(_Frozen):
    """Pods whose restarts and OOMKilled terminations no_oom reads (``matchLabels`` semantics)."""
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    namespace: str = Field(description="the pods' namespace")
    label_selector: dict[str, str] = Field(alias="labelSelector", min_length=1,
                                           description="labels the pods carry, all of them")

    def selector_string(self) -> str:
        return label_selector(self.label_selector)


class FactSpec(_Frozen):
    """One fact about the platform under test, read from it once it is ready (before the load): a JSON field
    of an HTTP GET, e.g. ThingsBoard's version from ``/actuator/info`` (``json: build.version``)."""
    url: str = Field(description="the endpoint (templates allowed), e.g. http://127.0.0.1:{port:http}/actuator/info")
    json_path: str = Field(alias="json", description="the field, as dotted keys (list items by index), e.g. "
                           "build.version or property.value")
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class ObserveSpec(_Frozen):
    """What monsoon samples every second while the stack runs (with storage.count_query): the signals the
    checks and the report read."""
    service: str | None = Field(None, description="the service under test: its RSS and thread count and its "
                                "cgroup's OOM kills are sampled")
    metrics_url: str | None = Field(None, description="a Prometheus text endpoint scraped every second "
                                    "(needed for metrics)")
    metrics: dict[str, str] = Field({}, description="signal name: Prometheus series, e.g. queue_depth: tb_queue_size, "
                                    "or a sum and difference of series, e.g. queue_depth: 'put_total - done_total' "
                                    "(a derived signal: missing while any of its series is); the checks read "
                                    "queue_depth, heap_max, gc_seconds, the report also heap_used and stored")
    kafka: KafkaObserveSpec | None = Field(None, description="the consumer group whose lag the lag checks read")
    kubernetes: KubeObserveSpec | None = Field(None, description="pods whose OOMKilled terminations and restarts "
                                               "no_oom reads (when a cluster is configured)")
    docker: tuple[str, ...] = Field((), description="containers whose State.OOMKilled and RestartCount no_oom "
                                    "reads (docker inspect)")
    fills_at: int | dict[Profile, int] | None = Field(
        None, description="the queue depth (messages) at which the service under test's memory is full, per "
        "profile when its heap or memory limit differs, e.g. {quick: 45000, full: 700000}: measured, the depth at "
        "its OutOfMemoryError or OOM kill. A burst experiment with fill sizes its burst from it (docs/load.md)")
    queue_depth_uncounted: int | None = Field(
        None, ge=1, le=100, description="messages per device that the platform's consumer finishes but a derived "
        "queue_depth's inflow term never counts, so that the depth reads up to this many x the devices below "
        "zero: ThingsBoard's transport producer counter leaves out the connect and activity events its core sends "
        "the rule engine (3 per device seen). Down to that, a sample below zero is read as this, not as a wrong "
        "metric; a lower one still is (docs/checks.md)")
    facts: dict[str, FactSpec] = Field({}, description="name: {url, json}: facts read from the running platform "
                                       "before the load (its version, queue type, time-series database); in the "
                                       "report's header, summary.json and the checklist. One that does not answer "
                                       "stops the run before the load, like any declared endpoint")

    @model_validator(mode="after")
    def _scraped(self) -> "ObserveSpec":
        if self.metrics and not self.metrics_url:
            raise _invalid("metrics needs metrics_url (the Prometheus endpoint they are scraped from)")
        for sig, expr in self.metrics.items():
            try:
                metric_terms(expr)
            except ValueError as e:
                raise _invalid(f"metrics.{sig}: {e}") from None
        if self.queue_depth_uncounted is not None and "queue_depth" not in self.metrics:
            raise _invalid("queue_depth_uncounted needs metrics.queue_depth")
        return self

    def fills_at_for(self, profile: str) -> int | None:
        """:attr:`fills_at` for ``profile`` (None: not stated for it)."""
        if isinstance(self.fills_at, dict):
            return self.fills_at.get(profile, self.fills_at.get("default"))  # type: ignore[call-overload]
        return self.fills_at

    def signals(self) -> dict[str, str]:
        """The timeline signals this observation gives the checks, each with the setting it comes from."""
        out: dict[str, str] = {}
        if self.service:
            out["process"] = "observe.service"
        if self.kafka:
            out["kafka"] = "observe.kafka"
        if self.metrics_url:
            out.update({f"metrics.{k}": f"observe.metrics.{k}" for k in self.metrics})
        return out


class ChaosSpec(_Frozen):
    """Where the stack's fault tooling lives (templates allowed)."""
    toxiproxy: str | None = Field(None, description="the stack's Toxiproxy API, e.g. http://127.0.0.1:{port:toxiproxy}")


class KubeStackSpec(_Frozen):
    """Where the stack's pods (``provider: kubernetes``) run. monsoon creates the namespace, labelled with the
    run id, and deletes it (and waits) when the stack stops; it must not exist unlabelled."""
    namespace: str | None = Field(None, description="the namespace monsoon creates for the stack's pods (default "
                                  "monsoon-<stack name>); fault profiles and MONSOON_KUBE_NAMESPACES name it")
    ready_timeout: float = Field(120.0, gt=0, description="seconds a pod may take to be scheduled and its container "
                                 "to start (before the service's own ready timeout)")
    host_network: bool = Field(True, description="true: pods on the node's network, on 127.0.0.1 ports; false: pods "
                               "on the pod network, each service behind a ClusterIP Service of its name for the ports "
                               "it listens on ({host:NAME} renders that name), mirrored to 127.0.0.1 on this host")

    @field_validator("namespace")
    @classmethod
    def _ns(cls, v: str | None) -> str | None:
        if v is not None and not DNS_LABEL.match(v):
            raise ValueError(f"{v!r} is not a valid namespace name (lower-case DNS label)")
        return v


# ------------------------------------------------------------------ helm: a stack that is a Helm release
#: the labels that find a service's pods in a release by default: the release's instance and the service as component
HELM_INSTANCE_LABEL = "app.kubernetes.io/instance"
HELM_COMPONENT_LABEL = "app.kubernetes.io/component"
#: what a helm service may not set: the chart says how its pods run
HELM_CHART_KEYS = ("command", "mem_limit", "cpus", "volumes", "env")


class HelmPodsSpec(_Frozen):
    """How one service's pods are found in the release (``matchLabels`` semantics) and which container is it."""
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    label_selector: dict[str, str] = Field(alias="labelSelector", min_length=1,
                                           description="labels the service's pods carry, all of them")
    container: str | None = Field(None, description="the container that is the service (default: the service's "
                                  "name)")


class HelmSpec(_Frozen):
    """``provider: helm``: the stack is a Helm release. With ``install: true`` (the default) monsoon installs
    ``chart`` (a chart directory or .tgz on this machine) with ``values_files`` and then ``values`` (placeholders
    rendered; a value that is only ``{port:NAME}`` becomes a number) into ``namespace`` (created for the run, like
    ``provider: kubernetes``'s), labels the release with the run id and its own PID, waits until it is ready and
    uninstalls it when the stack stops, on every exit path. With ``install: false`` the release is someone's own:
    monsoon only finds its pods by label, never upgrades, uninstalls or deletes anything of it."""
    chart: str | None = Field(None, description="install: the chart: a directory or .tgz, relative to the stack file "
                              "(placeholders {repo} {cache} {stack_file_dir}); fetch a remote one first with "
                              "helm pull --untar")
    release: str | None = Field(None, description="the release's name (default: the stack's name); install: false "
                                "needs it")
    namespace: str | None = Field(None, description="its namespace (default monsoon-<stack name>); install: false "
                                  "needs it")
    install: bool = Field(True, description="false: a release monsoon did not install (it is found, never touched)")
    values: dict[str, Any] = Field({}, description="inline values, over values_files (placeholders allowed)")
    values_files: tuple[str, ...] = Field((), description="values files, relative to the stack file, applied in order")
    timeout: float = Field(300.0, gt=0, description="seconds helm install --wait may take (and helm uninstall)")
    pods: dict[str, HelmPodsSpec] = Field({}, description="service -> how its pods are found: {labelSelector, "
                                          "container} (default: app.kubernetes.io/instance=<release>, "
                                          "app.kubernetes.io/component=<service>)")
    replicas: dict[str, int] = Field({}, description="service -> its replicas once the release is ready: the "
                                     "Deployment (or StatefulSet) whose pods the service's selector finds is "
                                     "scaled, as an operator would with kubectl scale, where the chart fixes the "
                                     "count; install: true only")

    @field_validator("replicas")
    @classmethod
    def _replicas(cls, v: dict[str, int]) -> dict[str, int]:
        bad = {k: n for k, n in v.items() if not isinstance(n, int) or n < 1}
        if bad:
            raise ValueError(f"replicas must be at least 1: {bad}")
        return v

    @field_validator("release", "namespace")
    @classmethod
    def _dns(cls, v: str | None) -> str | None:
        if v is not None and (not DNS_LABEL.match(v) or len(v) > 53):
            raise ValueError(f"{v!r} is not a valid name (a lower-case DNS label of at most 53 characters)")
        return v

    @model_validator(mode="after")
    def _installed_or_found(self) -> "HelmSpec":
        if self.install and not self.chart:
            raise _invalid("install: true needs chart (a chart directory or .tgz)")
        if not self.install:
            given = [k for k in ("chart", "values", "values_files", "replicas") if getattr(self, k)]
            if given:
                raise _invalid(f"install: false: monsoon installs nothing, so {', '.join(given)} cannot apply")
            missing = [k for k in ("release", "namespace") if not getattr(self, k)]
            if missing:
                raise _invalid(f"install: false needs {' and '.join(missing)} (the release that runs)")
        return self

    def selector_of(self, service: str, release: str) -> dict[str, str]:
        """The labels of ``service``'s pods: ``pods.<service>.labelSelector``, else instance + component."""
        p = self.pods.get(service)
        if p is not None:
            return dict(p.label_selector)
        return {HELM_INSTANCE_LABEL: release, HELM_COMPONENT_LABEL: service}


class StackSpec(_Frozen):
    """A deployment under test (``stacks/<name>.yaml``): its services, where devices connect, how they are
    provisioned, where stored messages are read back and what to observe. Strings may hold placeholders:
    {port:NAME}, {dir}, {run_dir}, {stack_dir}, {stack_file_dir}, {repo}, {cache}, {python}."""
    name: str = Field(description="the stack's name (runs and reports use it)")
    description: str = Field("", description="one line about the deployment")
    ports: dict[str, int | Literal["auto"]] = Field({}, description="{port:NAME} fixed to a number (an error "
                                                    "when taken) or auto (a free port, the default)")
    services: dict[str, ServiceSpec] = Field(description="the processes, started in depends_on order (with "
                                             "compose: merged over the compose file's services, key by key)")
    compose: str | None = Field(None, description="a docker-compose file (relative to this file) whose services "
                                "run as containers: image, command, environment, mem_limit, "
                                "deploy.resources.limits.memory/cpus, cpus, restart, depends_on, volumes, "
                                "stop_signal, stop_grace_period, network_mode: host; any other key is refused")
    devices: DevicesSpec = Field(description="where the devices connect")
    provisioning: ProvisioningSpec = Field(description="none, or {kind: thingsboard-rest, url, username, password}, "
                                           "or {kind: hono-registry, url, tenant}")
    storage: StorageSpec = Field(description="where stored messages are read back")
    observe: ObserveSpec = Field(ObserveSpec(), description="what monsoon samples while the stack runs")
    chaos: ChaosSpec = Field(ChaosSpec(), description="the stack's fault tooling")
    kubernetes: KubeStackSpec | None = Field(None, description="provider: kubernetes: the namespace of the stack's "
                                             "pods (monsoon deploys them into the cluster of KUBECONFIG)")
    helm: HelmSpec | None = Field(None, description="provider: helm: the Helm release the stack is (installed by "
                                  "monsoon, or found: install: false)")
    provider: Provider = Field("process", description="how services run: process (local processes), docker "
                               "(containers through testcontainers, on the host network) or kubernetes (pods in "
                               "the cluster monsoon starts, `monsoon cluster up`); a service may say otherwise")
    source: str = Field("", description="set by monsoon: the file the stack was read from")

    @field_validator("provisioning", mode="before", json_schema_input_type=Literal["none"] | ProvisioningSpec)
    @classmethod
    def _provisioning_word(cls, v: Any) -> Any:
        return {"kind": v} if isinstance(v, str) else v

    @model_validator(mode="after")
    def _runnable(self) -> "StackSpec":
        for name, svc in self.services.items():
            provider = self.provider_of(name)
            if provider == "helm":      # the chart runs it: only image (imported into the cluster) and ready apply
                _helm_service(name, svc)
                continue
            if provider in ("docker", "kubernetes"):
                if not svc.image:
                    raise _invalid(f"services.{name}: a {provider} service needs image")
                if provider == "kubernetes" and not DNS_LABEL.match(name):
                    raise _invalid(f"services.{name}: a kubernetes service's name is a DNS label (lower-case "
                                   "letters, digits, '-')")
                if provider == "kubernetes" and svc.oneshot:
                    raise _invalid(f"services.{name}: a oneshot service cannot run as a Deployment: give it "
                                   "provider: process")
            else:
                if not svc.command:
                    raise _invalid(f"services.{name}: a process service needs command")
                extra = [k for k in ("image", "mem_limit", "cpus", "volumes") if getattr(svc, k)]
                if extra:
                    raise _invalid(f"services.{name}: {', '.join(extra)} only apply to provider: docker or "
                                   "kubernetes")
        if self.kubernetes is not None and not self.pods():
            raise _invalid("kubernetes: no service has provider: kubernetes (the namespace would hold nothing)")
        obs = self.observe
        if obs.kubernetes is None and obs.service in self.services and self.provider_of(obs.service) == "kubernetes":
            # no_oom reads the pod's own word (lastState.terminated.reason: OOMKilled) on the service under test
            kube = KubeObserveSpec(namespace=self.kube_namespace(), label_selector={SERVICE_POD_LABEL: obs.service})
            object.__setattr__(self, "observe", obs.model_copy(update={"kubernetes": kube}))
        self._helm_release()
        return self

    def _helm_release(self) -> None:
        """provider: helm and the helm section go together; observe.kubernetes: the service under test's pods."""
        helm_services = self.releases()
        if self.helm is None:
            if helm_services:
                raise _invalid(f"services {', '.join(helm_services)} have provider: helm: give the helm section "
                               "(chart, or release and namespace with install: false)")
            return
        if not helm_services:
            raise _invalid("helm: no service has provider: helm (set provider: helm on the stack)")
        if self.kubernetes is not None:
            raise _invalid("helm and kubernetes: a stack is one Helm release or monsoon's own Deployments, not both")
        obs = self.observe     # (helm.pods naming no helm service: _check_helm, at its line)
        if obs.kubernetes is None and obs.service in helm_services:
            kube = KubeObserveSpec(namespace=self.kube_namespace(),
                                   label_selector=self.helm.selector_of(obs.service, self.helm_release()))
            object.__setattr__(self, "observe", obs.model_copy(update={"kubernetes": kube}))

    def releases(self) -> list[str]:
        """The services that are pods of the stack's Helm release (``provider: helm``)."""
        return [n for n in self.services if self.provider_of(n) == "helm"]

    def helm_release(self) -> str:
        """The release's name: ``helm.release``, else the stack's name as a DNS label (at most 53 characters)."""
        if self.helm is not None and self.helm.release:
            return self.helm.release
        return re.sub(r"[^a-z0-9-]+", "-", self.name.lower()).strip("-")[:53].rstrip("-") or "monsoon"

    def pods(self) -> list[str]:
        """The services that run as pods (``provider: kubernetes``)."""
        return [n for n in self.services if self.provider_of(n) == "kubernetes"]

    def kube_namespace(self) -> str:
        """The namespace the stack's pods run in: ``kubernetes.namespace``, else ``monsoon-<stack name>``."""
        if self.kubernetes is not None and self.kubernetes.namespace:
            return self.kubernetes.namespace
        if self.helm is not None and self.helm.namespace:
            return self.helm.namespace
        return ("monsoon-" + re.sub(r"[^a-z0-9-]+", "-", self.name.lower())).strip("-")[:63].rstrip("-")

    def provider_of(self, service: str) -> str:
        return self.services[service].provider or self.provider

    def containers(self) -> list[str]:
        """The services that run as containers."""
        return [n for n in self.services if self.provider_of(n) == "docker"]

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

    def before_release(self) -> list[str]:
        """A Helm stack's services that start before its release is installed, in start order: monsoon's own pods
        and processes that need nothing of the release, however indirectly (e.g. the routes of a Toxiproxy the
        release's pods connect through: a pod whose readiness needs the hop must find it routed)."""
        helm = set(self.releases())
        order = self.start_order()           # a service's dependencies come before it
        needs: dict[str, bool] = {}
        for n in order:
            needs[n] = n in helm or any(needs[d] for d in self.services[n].depends_on)
        return [n for n in order if not needs[n]]

    def port_names(self) -> list[str]:
        names = set(self.ports)
        for m in TEMPLATE_RE.finditer(self.model_dump_json()):
            if m.group(1) == "port":
                names.add(m.group(2))
        return sorted(names)


def _helm_service(name: str, svc: ServiceSpec) -> None:
    """A service of a Helm release: the chart says how it runs (command, env, limits, volumes), kubelet restarts
    it; what monsoon may know of it is its image (imported into the cluster before the install) and ready."""
    given = [k for k in HELM_CHART_KEYS if getattr(svc, k)]
    if given:
        raise _invalid(f"services.{name}: {', '.join(given)}: the chart says how a provider: helm service runs "
                       "(set it in helm.values)")
    if svc.oneshot:
        raise _invalid(f"services.{name}: a oneshot service cannot be part of a Helm release: give it "
                       "provider: process")


def _check_helm(doc: LocatedDoc, spec: "StackSpec") -> None:
    """The helm section's files exist (a chart directory with Chart.yaml, or a .tgz; the values files), and its
    pods name helm services: at their lines, before anything starts."""
    if spec.helm is None:
        return
    ctx = _known_now(doc)
    for key in ("pods", "replicas"):
        for name in getattr(spec.helm, key):
            if name not in spec.services or spec.provider_of(name) != "helm":
                raise _fail(doc, ("helm", key, name), "no service of this name has provider: helm")
    if spec.helm.chart:
        path = helm_path(spec.helm.chart, doc.path, ctx)
        if path is None:
            raise _fail(doc, ("helm", "chart"), "only {repo}, {cache} and {stack_file_dir} are known before the "
                        "run: the chart is a file on this machine")
        if path.is_dir() and not (path / "Chart.yaml").is_file():
            raise _fail(doc, ("helm", "chart"), f"{path} has no Chart.yaml: not a chart directory")
        if not path.exists() and "{cache}" not in spec.helm.chart:
            # (a chart in monsoon's cache is one a tool puts there, e.g. tools/build-hono-chart: the stack is valid
            # before it is built, and its start refuses in one line, its services' requires saying how to get it)
            raise _fail(doc, ("helm", "chart"), f"no such chart: {path} (a chart directory or .tgz; fetch a remote "
                        "chart first: helm pull REPO/CHART --untar)")
    for i, f in enumerate(spec.helm.values_files):
        path = helm_path(f, doc.path, ctx)
        if path is None or not path.is_file():
            raise _fail(doc, ("helm", "values_files", i), f"no such values file: {path or f}")


def _check_helm_doc(doc: LocatedDoc) -> None:
    """Before the model: a provider: helm service that sets what the chart decides, at that key's line."""
    data = doc.data if isinstance(doc.data, dict) else {}
    if data.get("provider") == "helm" and not data.get("helm"):
        raise _fail(doc, ("provider",), "a provider: helm stack needs the helm section (chart, or release and "
                    "namespace with install: false)")
    if data.get("helm") and data.get("kubernetes"):
        raise _fail(doc, ("kubernetes",), "helm and kubernetes: a stack is one Helm release or monsoon's own "
                    "Deployments, not both")
    services = data.get("services")
    services = services if isinstance(services, dict) else {}
    for name, svc in services.items():
        svc = svc if isinstance(svc, dict) else {}
        if (svc.get("provider") or data.get("provider")) != "helm":
            continue
        for k in HELM_CHART_KEYS + ("oneshot",):
            if svc.get(k):
                raise _fail(doc, ("services", name, k), "the chart says how a provider: helm service runs (set it "
                            "in helm.values)" if k != "oneshot" else "a oneshot service cannot be part of a Helm "
                            "release: give it provider: process")


def helm_path(value: str, stack_file: Path | str, ctx: dict[str, str] | None = None) -> Path | None:
    """A helm section's path (chart, values file) with {repo} {cache} {stack_file_dir} filled in, relative to the
    stack file's folder; None when it names a placeholder only known once the run starts."""
    ctx = ctx or _known_now(stack_file)
    text = _render_known(value, ctx)
    if text is None:
        return None
    p = Path(text).expanduser()
    return p if p.is_absolute() else Path(stack_file).resolve().parent / p


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
                bad = name not in TEMPLATE_NAMES or (name in ("port", "host")) != (arg is not None)
                if name in ("dir", "host") and (len(path) < 2 or path[0] != "services"):
                    bad = True
                if name == "host" and arg is not None and not bad and arg not in services:
                    raise SpecError(doc.path, doc.line_of(path), ".".join(map(str, path)),
                                    f"{m.group(0)}: no service {arg!r} in this stack")
                if bad:
                    raise SpecError(doc.path, doc.line_of(path), ".".join(map(str, path)),
                                    f"unknown placeholder {m.group(0)} (use {{repo}}, {{cache}}, {{python}}, {{run_dir}}, "
                                    "{stack_dir}, {stack_file_dir}, {dir} or {host:SERVICE} inside a service, or "
                                    "{port:NAME})")
                if name == "port":
                    uses.setdefault(arg, []).append(path)
    uses: dict[str, list[tuple]] = {}
    services: Any = doc.data.get("services") if isinstance(doc.data, dict) else None
    services = set(services) if isinstance(services, dict) else set()
    walk(doc.data, ())
    declared = doc.data.get("ports") if isinstance(doc.data, dict) else None
    declared = set(declared) if isinstance(declared, dict) else set()
    unused = [str(n) for n in declared if n not in uses]   # declared, and no placeholder names it
    lone = {port for port, paths in uses.items() if len(paths) == 1 and port not in declared}
    for port, paths in uses.items():
        if port not in lone:
            continue
        # one side of a connection that has no other side: misspelt here, or where the name it is close to stands
        near = difflib.get_close_matches(port, [n for n in uses if n != port] + unused, n=1)
        other = near[0] if near else None
        if other is not None and (other in lone or other in unused) and \
                _familiarity(other, doc.data) < _familiarity(port, doc.data):
            if other in unused:    # the typo is the name declared under ports:
                raise SpecError(doc.path, doc.line_of(("ports", other)), f"ports.{other}",
                                f"no {{port:{other}}} uses this port, and {{port:{port}}} at {_dotted(paths[0])}, "
                                f"line {doc.line_of(paths[0])}, is used only there: one is misspelt?")
            port, paths, other = other, uses[other], port   # the less familiar name is the misspelt one
        where = ("ports", other) if other in unused else uses[other][0] if other else ()
        hint = f" ({{port:{other}}} at {_dotted(where)}, line {doc.line_of(where)}: one is misspelt?)" if other else ""
        raise SpecError(doc.path, doc.line_of(paths[0]), _dotted(paths[0]),
                        f"{{port:{port}}} is used only here: nothing else in the stack knows this port{hint}; "
                        f"a port only this service needs is declared under ports: ({port}: auto)")


#: Words port names are made of (monsoon's own stacks' and the usual protocols'): of two names one letter apart,
#: the one made of these and of the stack's own words is the one spelt right.
PORT_WORDS = frozenset(
    "mqtt mqtts http https coap coaps amqp amqps kafka postgres postgresql pg psql mysql redis mongo mongodb "
    "cassandra cql toxiproxy proxy management metrics api admin grpc ws wss db broker registry health debug "
    "controller observer storage auth command router hono infinispan ferretdb web ui jmx prometheus zookeeper "
    "zk nats rabbitmq tcp udp dtls tls ssl grafana".split())


def _familiarity(name: str, data: Any) -> int:
    """How many of ``name``'s words (split at ``_``, ``-``, ``.``) are known port words or words the stack file
    uses elsewhere (outside ``{port:...}`` and ``ports:``)."""
    words: set[str] = set()

    def collect(x: Any) -> None:
        if isinstance(x, dict):
            for k, v in x.items():
                collect(k)
                collect(v)
        elif isinstance(x, list):
            for v in x:
                collect(v)
        elif isinstance(x, str):
            words.update(re.findall(r"[a-z0-9]+", TEMPLATE_RE.sub(" ", x).lower()))
    collect({k: v for k, v in data.items() if k != "ports"} if isinstance(data, dict) else data)
    return sum(1 for w in re.split(r"[_.-]+", name.lower()) if w in PORT_WORDS or w in words)


def _dotted(path: tuple) -> str:
    return ".".join(map(str, path))


def _merge_compose(doc: LocatedDoc) -> None:
    """The compose file's services, each merged with the stack's own entry for it (the stack's keys win)."""
    path = Path(str(doc.data["compose"])).expanduser()
    path = path if path.is_absolute() else doc.path.parent / path
    if not path.exists():
        raise _fail(doc, ("compose",), f"no such compose file: {path}")
    own = doc.data.get("services") or {}
    if not isinstance(own, dict):
        raise _fail(doc, ("services",), "a mapping of service name to settings")
    merged = compose_services(path)
    for name, extra in own.items():
        merged[name] = {**merged.get(name, {}), **(extra or {})}
    doc.data["services"] = merged
    doc.data.setdefault("provider", "docker")
    doc.data["compose"] = str(path)


def _check_images(doc: LocatedDoc) -> None:
    """A container or pod service without an image, or a pod service whose name is no DNS label: at its line
    (the model's own check, which says the same, can only point at the file)."""
    data = doc.data if isinstance(doc.data, dict) else {}
    services = data.get("services")
    services = services if isinstance(services, dict) else {}
    for name, svc in services.items():
        svc = svc if isinstance(svc, dict) else {}
        provider = svc.get("provider") or data.get("provider") or "process"
        if provider in ("docker", "kubernetes") and not svc.get("image"):
            raise _fail(doc, ("services", name), f"a {provider} service needs image")
        if provider == "kubernetes" and not DNS_LABEL.match(str(name)):
            raise _fail(doc, ("services", name), "a kubernetes service's name is a DNS label (lower-case letters, "
                        "digits, '-'): it names the Deployment and its container")


def _known_now(doc: LocatedDoc | Path | str) -> dict[str, str]:
    """The placeholders known before a run (the others, {run_dir} {stack_dir} {dir} {port:NAME}, only once it
    starts), for the stack file ``doc`` (its parsed form or its path)."""
    path = doc.path if isinstance(doc, LocatedDoc) else doc
    return {"repo": str(REPO), "cache": str(CACHE), "python": sys.executable,
            "stack_file_dir": str(Path(path).resolve().parent)}


def _render_known(value: str, ctx: dict[str, str]) -> str | None:
    """``value`` with its placeholders filled in, or None when one of them is only known once the run starts."""
    if any(m.group(1) not in ctx for m in TEMPLATE_RE.finditer(value)):
        return None
    return TEMPLATE_RE.sub(lambda m: ctx[m.group(1)], value)


def _check_commands(doc: LocatedDoc, spec: StackSpec) -> None:
    """Each process service's program exists, where the file alone can tell (``monsoon validate``): a path
    (placeholders known before the run filled in) is an executable file, a bare name is on PATH. Not judged: a
    program the stack declares under ``requires:`` (the preflight names it with its hint), a path under a required
    one, a path with {run_dir}, {stack_dir} or {dir} (made by the run), one going up from the service's work dir
    (another service's), a bare name when the service sets PATH, and containers' and pods' commands (their
    image's)."""
    ctx = _known_now(doc)
    binaries = {r.binary for svc in spec.services.values() for r in svc.requires if r.binary}
    required = [Path(p) for svc in spec.services.values() for r in svc.requires if r.path
                for p in [_render_known(r.path, ctx)] if p]
    for name, svc in spec.services.items():
        if spec.provider_of(name) != "process" or not svc.command:
            continue
        program = _render_known(svc.command[0], ctx)
        key = ("services", name, "command", 0)
        if program is None:
            continue
        if "/" not in program:
            if program in binaries or "PATH" in svc.env or shutil.which(program) is not None:
                continue
            raise _fail(doc, key, f"{program!r} is not on PATH (if the set-up installs it, say so under requires: "
                        f"[{{binary: {program}, hint: how to install it}}])")
        path = Path(program)
        if not path.is_absolute():
            if program.startswith(".."):
                continue
            beside = Path(ctx["stack_file_dir"]) / program
            hint = (f"; {beside} is beside the stack file: write {{stack_file_dir}}/{program.removeprefix('./')}"
                    if beside.exists() else "; for a file beside the stack file write {stack_file_dir}/...")
            raise _fail(doc, key, f"{program} is relative to the service's work dir (<run_dir>/services/{name}/, "
                        f"empty when it starts), where it cannot be{hint}")
        if any(path == r or r in path.parents for r in required):
            continue
        if not path.exists():
            raise _fail(doc, key, f"no such file: {program} (if the set-up makes it, say so under requires: "
                        f"[{{path: {svc.command[0]}, hint: how to get it}}])")
        if not path.is_file() or not os.access(path, os.X_OK):
            raise _fail(doc, key, f"{program} is not an executable file")


def load_stack(name_or_path: str | Path, *, commands: bool = False) -> StackSpec:
    """A stack spec, every rule the file alone can decide checked (errors name the file, the line and the key);
    ``commands``: also that each service's program exists where the file can tell (``monsoon validate``)."""
    doc = load_located(_resolve("stack", name_or_path))
    for key in doc.data if isinstance(doc.data, dict) else ():   # before the placeholders: a misspelt section
        if key not in StackSpec.model_fields:                      # would make them look misplaced
            near = difflib.get_close_matches(str(key), list(StackSpec.model_fields), n=1)
            raise _fail(doc, (key,), "unknown key" + (f" (did you mean {near[0]}?)" if near else ""))
    if isinstance(doc.data, dict) and doc.data.get("compose"):
        _merge_compose(doc)
    _check_templates(doc)
    _check_images(doc)
    _check_helm_doc(doc)
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
    _check_queries(doc, spec)
    _check_helm(doc, spec)
    if commands:
        _check_commands(doc, spec)
    return spec


def jar_sha256(stack: StackSpec) -> dict[str, str]:
    """sha256 of the jars the stack's services require (``requires: [{path: ...jar}]``) that exist: what a
    calibration and the run history record as the platform under test. Keyed by file name, or by
    ``<folder>/<name>`` where two required jars share a name (Hono's components are each a ``quarkus-run.jar``).
    The path's {repo}, {cache} and {stack_file_dir} are filled in (TB's and Hono's jars live in the cache)."""
    ctx = _known_now(stack.source or REPO / "stack.yaml")
    found: list[Path] = []
    for svc in stack.services.values():
        for r in svc.requires:
            text = _render_known(r.path, ctx) if r.path and r.path.endswith(".jar") else None
            if text is not None and Path(text).is_file() and Path(text) not in found:
                found.append(Path(text))
    names = [p.name for p in found]
    return {(p.name if names.count(p.name) == 1 else f"{p.parent.name}/{p.name}"): _file_sha256(p) for p in found}


_SHA256: dict[tuple[str, int, int], str] = {}


def _file_sha256(p: Path) -> str:
    """A file's sha256, hashed once per process while its size and mtime hold: TB's jar is 328 MB, and a run
    asks for it when it reads its calibration, when it records one and when it writes its history."""
    st = p.stat()
    key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _SHA256:
        h = hashlib.sha256()
        with open(p, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        _SHA256[key] = h.hexdigest()
    return _SHA256[key]
