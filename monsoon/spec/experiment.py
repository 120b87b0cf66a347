"""Validated, frozen descriptions of stacks and experiments, parsed from YAML.

Every error names the file, the line and the dotted key (see ``yamlio``).
Nothing here touches a live system: validation happens before anything starts.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import PrivateAttr, Field, field_validator, model_validator

import math

from monsoon import options as opt
from monsoon import settings
from monsoon.spec.base import _Frozen, _fail, _invalid, _per_profile, _resolve
from monsoon.spec.payload import PayloadProfile, PayloadSpec
from monsoon.spec.shape import BURST_WINDOW_KINDS, Durations, ShapeSpec
from monsoon.spec.stack import StackSpec, Transport
from monsoon.spec.sweep import SweepSpec
from monsoon.spec.mix import MixSpec
from monsoon.spec.yamlio import LocatedDoc, SpecError, load_located, validate


# --------------------------------------------------------------------- stacks


# ---------------------------------------------------------------- experiments


class KubeLoadSpec(_Frozen):
    """``load.kubernetes``: the load as an Indexed Job in monsoon's cluster (the stack runs there too)."""
    shards: int = Field(1, ge=1, le=64, description="the Job's pods (completions and parallelism), each "
                        "monsoon-loadgen --shard i/shards of the devices")


def _reads_as_number(text: str) -> bool:
    """``text`` is a number to Python (``1e12``, ``2.5E3``), though YAML left it text."""
    try:
        float(text)
    except ValueError:
        return False
    return text.strip().lower() not in ("nan", "inf", "infinity", "+inf", "-inf", "+infinity", "-infinity")


class LoadSpec(_Frozen):
    """The load (open model): ``devices`` send ``base_rate`` msg/s together (x1), shaped over the profile's
    windows by ``shape``."""
    devices: int = Field(gt=0, description="simulated devices (one connection each)")
    qos: Literal[0, 1] = Field(1, description="MQTT QoS of every publish (1: acked by PUBACK)")
    # x1 in msg/s (all devices together), or "auto": base_fraction x the stack's calibrated capacity
    # (monsoon.run.calibrate; resolved by the session before the run, so validation needs no live stack)
    base_rate: float | Literal["auto"] = Field(description="x1 in messages per second, all devices together, or "
                                               "auto (base_fraction x the stack's calibrated capacity)")
    base_fraction: float | None = Field(None, gt=0, le=1, allow_inf_nan=False,
                                        description="base_rate: auto only: x1 = this fraction of the capacity (0.25)")
    shape: ShapeSpec = Field(description="the rate over time: steady, burst, ramp, stages, ladder, spike or python")
    payload: PayloadSpec = Field(PayloadSpec(), description="what each message carries: a profile name, or "
                                 "{profile, datapoints} / {profile: template, template}")
    device_prefix: str = Field("monsoon", description="device names are <device_prefix>-00000, -00001, ...")
    # the MQTT generator: python (paho, one thread; ~10k msg/s) or native (monsoon-loadgen, Rust; ~100k msg/s per
    # core, ``workers`` processes each taking a shard of the devices, as the pods of the Kubernetes Job do)
    engine: Literal["python", "native", "kubernetes"] = Field(
        "python", description="the load generator: python (paho for MQTT, asyncio for HTTP and CoAP; one thread), "
        "native (monsoon-loadgen, Rust: MQTT, and Hono's CoAP over DTLS with PSK) or kubernetes (monsoon-loadgen as "
        "the pods of an Indexed Job, MQTT: set by load.kubernetes)")
    workers: int = Field(1, ge=1, le=64, description="engine: native only: worker processes (--shard i/workers)")
    kubernetes: KubeLoadSpec | None = Field(None, description="run the load as a Kubernetes Indexed Job in monsoon's "
                                            "cluster: {shards: N} pods, each monsoon-loadgen --shard i/N")
    transport: Transport | None = Field(None, description="the devices' transport, one the stack offers (its "
                                        "devices.transport, the default, or one of devices.endpoints), e.g. hono-coap")
    legs: dict[Literal["telemetry", "event", "command"], Annotated[float, Field(ge=0, allow_inf_nan=False)]] | None = \
        Field(None, description="transports hono-http and hono-coap only: weights of the message kinds (Hono's command flow), "
              "e.g. {telemetry: 6, event: 2, command: 2} (the default)")
    sweep: SweepSpec | None = Field(None, description="a size sweep's ramp (with payload.sizes; monsoon sweep): "
                                    "{factor, step_s, settle_s, max_rate, transport_s, gc_fraction}")
    mix: MixSpec | None = Field(None, description="a request mix (monsoon.mix): {weights: {read, search, write, "
                                "modify}, factor, step_s, settle_s, max_rate, gc_fraction, ...}; base_rate = ops/s")

    @model_validator(mode="after")
    def _sweep_has_sizes(self) -> "LoadSpec":
        if self.sweep is not None and self.payload.sizes is None:
            raise _invalid("load.sweep ramps each of load.payload.sizes: add payload: {sizes: [100, 1000, ...]}")
        return self

    @model_validator(mode="before")
    @classmethod
    def _kubernetes_engine(cls, v: Any) -> Any:
        """``kubernetes: {shards: N}`` is engine kubernetes with N workers (one pod per shard)."""
        if isinstance(v, dict) and isinstance(v.get("kubernetes"), dict):
            if v.get("engine", "kubernetes") != "kubernetes":
                raise _invalid(f"load.kubernetes runs monsoon-loadgen as the Job's pods: drop engine: {v['engine']}")
            shards = v["kubernetes"].get("shards", 1)
            if v.get("workers", shards) != shards:
                raise _invalid("load.kubernetes: the shards are the workers: drop workers")
            v = {**v, "engine": "kubernetes", "workers": shards}
        elif isinstance(v, dict) and v.get("engine") == "kubernetes":
            raise _invalid("engine: kubernetes is set by load.kubernetes: {shards: N}")
        return v

    @field_validator("base_rate", mode="before",
                     json_schema_input_type=Annotated[float, Field(gt=0)] | Literal["auto"])
    @classmethod
    def _rate_or_auto(cls, v: Any) -> Any:
        if isinstance(v, str) and v.strip().lower() == "auto":
            return "auto"
        if isinstance(v, str) and _reads_as_number(v):   # 1e12: a number in YAML 1.2, text in PyYAML's 1.1
            raise _invalid(f"want a number of msg/s greater than 0, or auto (got the text {v!r}: YAML reads an "
                           "exponent as a number only with a dot and a sign, 1.0e+3, or write the digits)")
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _invalid(f"want a number of msg/s greater than 0, or auto (got {v!r})")
        if not math.isfinite(v):
            raise _invalid("Input should be a finite number (msg/s greater than 0, or auto)")
        if v <= 0:
            raise _invalid(f"Input should be greater than 0 (x1 in msg/s, or auto), got {v:g}")
        return float(v)

    @property
    def auto(self) -> bool:
        return self.base_rate == "auto"

    @property
    def fraction(self) -> float:
        """base_rate: auto: the fraction of the calibrated capacity that is x1 (default 0.25)."""
        return 0.25 if self.base_fraction is None else self.base_fraction

    @property
    def rate_for_checks(self) -> float:
        """A rate to build and check the shape with before the stack runs (1.0 stands in for auto)."""
        return 1.0 if self.base_rate == "auto" else float(self.base_rate)

    @field_validator("payload", mode="before", json_schema_input_type=PayloadProfile | PayloadSpec)
    @classmethod
    def _payload_str(cls, v: Any) -> Any:
        return {"profile": v} if isinstance(v, str) else v


AUTO_STAND_INS = (1.0, 100.0, 10_000.0)   # x1 stand-ins for validating a python shape under base_rate: auto


class CheckSpec(_Frozen):
    """A check reference; a parameter may differ per profile: ``seconds: {quick: 120, full: 1800}``.

    ``profiles: [nightly, full]`` among the params judges the check only in those
    profiles (e.g. a leak slope that minutes of data cannot decide).
    """
    name: str = Field(description="a registered check, e.g. no_acked_loss")
    params: dict[str, Any] = Field({}, description="its parameters; a value may differ per profile")
    profiles: tuple[Literal["quick", "nightly", "full"], ...] | None = Field(
        None, description="judge it only in these profiles (default: all)")

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


class FaultRef(_Frozen):
    """One fault of an experiment: a profile from ``fault-profiles/`` plus overrides.

    ``schedule`` and ``params`` are merged key by key onto the profile's; every
    value may differ per profile (``at: {quick: 30, full: 3600}``).  Times are
    seconds from the start of the load.
    """
    profile: str = Field(description="a fault profile: fault-profiles/<profile>.yaml")
    name: str | None = Field(None, description="overrides the profile's name (each fault needs its own)")
    target: str | dict[str, Any] | None = Field(None, description="overrides the profile's target: a service, "
                                                "a hop client->server, or {namespace, labelSelector}")
    backend: str | None = Field(None, description="overrides the profile's backend")
    params: dict[str, Any] = Field({}, description="merged key by key onto the profile's params")
    schedule: dict[str, Any] = Field({}, description="merged key by key onto the profile's schedule (seconds "
                                     "from the load start)")

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
    """An experiment (``experiments/<name>.yaml``): the load, the phase durations per profile, the checks that
    judge the run, its faults, and extra environment for the stack's services."""
    name: str = Field(description="the experiment's name (runs and reports use it)")
    description: str = Field("", description="one line about it")
    marks: tuple[str, ...] = Field((), description="labels for selecting experiments, e.g. burst, chaos, defect")
    load: LoadSpec = Field(description="the load")
    profiles: dict[Literal["quick", "nightly", "full"], Durations] = Field(
        description=f"phase durations (seconds) per profile; a run uses one profile ({opt.PROFILE})")
    checks: tuple[CheckSpec, ...] = Field(description="each a check name, {name: {params}}, or "
                                          "{name, params, profiles}")
    faults: tuple[FaultRef, ...] = Field((), description="faults to inject, each a fault profile with overrides")
    # extra environment per stack service, e.g. {platform: {DEFECT_DROP_ACKED_PCT: "0.1"}}; wins over the stack's
    env: dict[str, dict[str, str]] = Field({}, description="extra environment per stack service, e.g. {platform: "
                                           "{DEFECT_X: \"1\"}}; wins over the stack's")
    restart: dict[str, Literal["no", "always", "on-failure"]] = Field(
        {}, description="restart policy per stack service, over the stack's: e.g. {kafka: \"no\"} when a broker "
                        "death should end the run instead of being recovered from")
    source: str = Field("", description="set by monsoon: the file the experiment was read from")
    _doc: LocatedDoc | None = PrivateAttr(None)   # where each key came from (load_experiment)

    def fail(self, path: tuple, msg: str) -> SpecError:
        """A SpecError naming this experiment's file, the line of ``path`` and the dotted key."""
        if self._doc is None:
            return SpecError(self.source, None, ".".join(map(str, path)), msg)
        return _fail(self._doc, path, msg)

    def line_of(self, path: tuple) -> int | None:
        return self._doc.line_of(path) if self._doc is not None else None

    @field_validator("env", mode="before", json_schema_input_type=dict[str, dict[str, str | int | float | bool]])
    @classmethod
    def _env_str(cls, v: Any) -> Any:
        if isinstance(v, dict):
            return {svc: ({k: str(x) for k, x in e.items()} if isinstance(e, dict) else e) for svc, e in v.items()}
        return v

    @field_validator("faults", mode="before", json_schema_input_type=list[str | FaultRef])
    @classmethod
    def _faults(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"profile": x} if isinstance(x, str) else x for x in v]
        return v

    @field_validator("checks", mode="before",
                     json_schema_input_type=list[str | dict[str, dict[str, Any] | None] | CheckSpec])
    @classmethod
    def _checks(cls, v: Any) -> Any:
        if not isinstance(v, list):
            return v
        out: list[Any] = []
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
            if self.load.shape.kind in BURST_WINDOW_KINDS and d.burst <= 0:
                raise ValueError(f"profile {prof!r}: a {self.load.shape.kind} experiment needs burst > 0 seconds")
        if not self.profiles:
            raise ValueError("profiles: give at least one of quick, nightly, full")
        return self

    def durations(self, profile: str) -> Durations:
        if profile not in self.profiles:
            raise SpecError(self.source, None, "profiles",
                            f"experiment {self.name!r} has no {profile!r} profile (has: {', '.join(self.profiles)})")
        return self.profiles[profile]


# -------------------------------------------------------------------- loading


def load_experiment(name_or_path: str | Path) -> ExperimentSpec:
    """Parse an experiment file: its structure and every rule that needs only the spec itself (errors name
    file, line and key). What needs other parts of monsoon (shapes sampled, checks and fault profiles
    resolved) is :func:`monsoon.run.validate.validate`, the one entry point every caller goes through."""
    doc = load_located(_resolve("experiment", name_or_path))
    if isinstance(doc.data, dict):
        doc.data.setdefault("source", str(doc.path))
    spec = validate(doc, ExperimentSpec)
    spec._doc = doc
    if spec.load.base_fraction is not None and not spec.load.auto:
        raise _fail(doc, ("load", "base_fraction"), "base_fraction is for base_rate: auto (x1 = base_fraction x "
                    "the calibrated capacity): drop it or write base_rate: auto")
    if spec.load.workers > 1 and spec.load.engine not in ("native", "kubernetes"):
        raise _fail(doc, ("load", "workers"), "workers > 1 needs engine: native (the python fleet is one process)")
    if spec.load.engine == "native" and spec.load.transport not in (None, "mqtt", "hono-coap"):
        raise _fail(doc, ("load", "engine"), f"engine: native drives mqtt and hono-coap, not {spec.load.transport}: "
                    "drop engine (the python fleet) or change the transport")
    if spec.load.engine in ("native", "kubernetes"):
        problem = workers_problem(spec.load.devices, spec.load.workers, key="workers")
        if problem:
            raise _fail(doc, ("load", "workers"), problem)
    if spec.load.workers > spec.load.devices:
        raise _fail(doc, ("load", "workers"), f"{spec.load.workers} workers for {spec.load.devices} devices: "
                    "every worker needs at least one device")
    return spec


MAX_PER_WORKER = 19_900     # connections one worker holds under a 20,000 open-file hard limit


# connections per source address to one host:port. The ephemeral range is ~28k, but connect() fills its even
# half (~14k) before the odd one: 20,000 per address stalled at 229k of 250k in `make bench-load --many`.
PER_SOURCE = 10_000


def workers_problem(n_devices: int, workers: int, key: str = "load.workers") -> str | None:
    """Why ``n_devices`` cannot be spread over ``workers`` native workers (None: they can); ``key`` names the
    setting to raise."""
    per_worker = -(-n_devices // workers)
    if per_worker <= MAX_PER_WORKER:
        return None
    return (f"{n_devices:,} devices over {workers} worker(s) is {per_worker:,} connections per worker: at most "
            f"{MAX_PER_WORKER:,} fit under the open-file limit; set {key} >= {-(-n_devices // MAX_PER_WORKER)}")


def experiments_marked(mark: str, pattern: str = "*.yaml", folder: Path | None = None) -> list[str]:
    """Names of the experiments in ``folder`` matching ``pattern`` whose ``marks`` include ``mark``, for a
    scenario's parametrization (default folder: the user's, ``monsoon_specs`` and the project's ``experiments/``,
    first one wins a name; monsoon's own when the user has none). It reads only the ``marks`` key and never
    raises: a file that cannot be read is listed too, so the one scenario that runs it reports its error (file,
    line, key) while the others still run."""
    folders = settings.current().spec_dirs("experiment") if folder is None else [folder]
    if folder is None and len(folders) > 1:   # the last one is monsoon's own
        users = folders[:-1]
        folders = users if any(any(d.glob(pattern)) for d in users) else folders[-1:]
    files: dict[str, Path] = {}
    for d in reversed(folders):   # the first folder wins a name
        files.update((p.stem, p) for p in d.glob(pattern))
    out = []
    for p in (files[k] for k in sorted(files)):
        try:
            doc = load_located(p)
            marks = doc.data.get("marks", ()) if isinstance(doc.data, dict) else ()
            hit = mark in marks if isinstance(marks, (list, tuple)) else True
        except (ValueError, OSError):   # SpecError, or bytes that are not UTF-8
            hit = True
        if hit:
            out.append(p.stem)
    return out


# ----------------------------------------------------- checks against a stack

_BACKLOG = (("kafka", "metrics.queue_depth"),
            "Kafka consumer lag (observe.kafka) or the queue depth (observe.metrics: {queue_depth: ...} with "
            "observe.metrics_url)")

#: What a check can only get from the stack's ``observe:`` section (:meth:`ObserveSpec.signals`): any one of
#: the signals will do. Checks not listed read what every run has (the load, the stored messages, service exits,
#: fault events), or also accept a GC log, which a service may write without the stack file saying so: those are
#: never refused.
CHECK_NEEDS: dict[str, tuple[tuple[str, ...], str]] = {
    "lag_recovers_within": _BACKLOG,
    "lag_bounded": _BACKLOG,
    "consumer_not_stalled": (("kafka",), "per-partition Kafka offsets (observe.kafka)"),
    "no_thread_leak": (("process",), "the service's thread count (observe.service)"),
}


def check_fits(exp: ExperimentSpec, stack: StackSpec) -> list[SpecError]:
    """The experiment's checks that cannot judge a run of ``stack`` (each a SpecError at ``checks.N``): the
    check needs a signal only the stack's ``observe:`` could give, and it gives none of them, so the check
    could never say anything but unknown."""
    have = stack.observe.signals()
    out = []
    for i, c in enumerate(exp.checks):
        signals, what = CHECK_NEEDS.get(c.name, ((), ""))
        if signals and not any(s in have for s in signals):
            where = f" ({stack.source})" if stack.source else ""
            out.append(exp.fail(("checks", i), f"{c.name} reads {what}; stack {stack.name!r}{where} observes none "
                                "of it, so the check could only say unknown"))
    return out
