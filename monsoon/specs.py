"""Validated, frozen descriptions of stacks and experiments, parsed from YAML.

Every error names the file, the line and the dotted key (see ``yamlio``).
Nothing here touches a live system: validation happens before anything starts.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

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


# ---------------------------------------------------------------- experiments

def _invalid(message: str) -> PydanticCustomError:
    """A validation error whose message is shown as is (no "Value error, " prefix; braces are literal)."""
    return PydanticCustomError("value_error", message)


# what each shape kind takes (YAML names) and needs
_SHAPE_KEYS: dict[str, tuple[str, ...]] = {
    "steady": (), "burst": ("multiplier",), "ramp": ("from", "to"), "stages": ("stages",),
    "ladder": ("steps",), "spike": ("multiplier", "every", "width"), "python": ("function", "file"),
}
_SHAPE_NEEDS: dict[str, dict[str, str]] = {
    "burst": {"multiplier": "a multiplier (e.g. 10 for x10)"},
    "ramp": {"to": "to (the final multiplier of base_rate; from defaults to 1)"},
    "stages": {"stages": "stages (a list of {duration, rate or multiplier})"},
    "ladder": {"steps": "steps (a list of {multiplier, duration[, start]})"},
    "spike": {"multiplier": "a multiplier", "every": "every (seconds between spike starts)",
              "width": "width (seconds each spike lasts)"},
    "python": {"function": "function ('module:function', or the function's name with file:)"},
}
# shapes laid over the profile's burst window: warmup before it, recovery after it
BURST_WINDOW_KINDS = ("burst", "ramp", "ladder", "spike")
_FIELD_OF = {"from": "from_"}


class StageSpec(_Frozen):
    """One stage: ``rate`` msg/s or ``multiplier`` x base_rate (0 = a pause) for a share of the load.

    ``duration`` is relative: a stage lasts duration / (sum of all durations) of the profile's
    total load time (warmup + burst + recovery). Write the seconds of one profile and the others
    keep the same ratios.
    """
    duration: float = Field(gt=0, allow_inf_nan=False)
    rate: float | None = Field(None, ge=0, allow_inf_nan=False)
    multiplier: float | None = Field(None, ge=0, allow_inf_nan=False)
    name: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _one(self) -> "StageSpec":
        if (self.rate is None) == (self.multiplier is None):
            raise _invalid("give exactly one of rate (msg/s) or multiplier (x base_rate); 0 is a pause")
        return self


class StepSpec(_Frozen):
    """One ladder step: ``multiplier`` x base_rate from ``start`` for ``duration``, both fractions (0..1]
    of the profile's burst window; ``start`` defaults to the end of the previous step (0 for the first)."""
    multiplier: float = Field(gt=0, allow_inf_nan=False)
    duration: float = Field(gt=0, le=1, allow_inf_nan=False)
    start: float | None = Field(None, ge=0, lt=1, allow_inf_nan=False)
    name: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _inside(self) -> "StepSpec":
        if self.start is not None and self.start + self.duration > 1 + 1e-9:
            raise _invalid(f"start ({self.start:g}) + duration ({self.duration:g}) > 1: a step must end "
                           "within the burst window (start and duration are fractions of it)")
        return self


class ShapeSpec(_Frozen):
    """The load shape (``load.shape``). How each kind uses the profile's windows (warmup, burst, recovery):

    * ``steady``: base_rate for the whole load (one phase, ``steady``).
    * ``burst``: base_rate, x``multiplier`` during the burst window (phases warmup, burst, recovery).
    * ``ramp``: x``from`` (default 1) during warmup, linear to x``to`` over the burst window, x``to``
      during the recovery window (phases warmup, ramp, hold).
    * ``stages``: the stages fill the whole load; each ``duration`` is a share (see :class:`StageSpec`).
    * ``ladder``: x1 with steps in the burst window (``start``/``duration`` fractions of it); phases
      warmup, one per step (``x3``, ...; the last step is ``burst`` so lag recovery is measured after
      it, unless a step is named ``burst``), ``after-<step>`` for x1 gaps, recovery.
    * ``spike``: x1 with spikes of x``multiplier``, ``width`` seconds every ``every`` seconds (absolute,
      multiples of 0.1 s) over the burst window (phases warmup, burst, recovery).
    * ``python``: ``function: "module:function"``, or ``file: path.py`` (relative to the experiment
      file) with ``function: name``; ``rate_at(t)`` or ``rate_at(t, ctx)`` returns msg/s or None to
      stop; imported when the experiment is validated and sampled over each profile (phases: the
      profile's warmup, burst, recovery windows).
    """
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    kind: Literal["ramp", "stages", "ladder", "spike", "python", "steady", "burst"]  # "... 'steady' or 'burst'"
    multiplier: float | None = Field(None, gt=0, allow_inf_nan=False)
    from_: float | None = Field(None, alias="from", ge=0, allow_inf_nan=False)
    to: float | None = Field(None, ge=0, allow_inf_nan=False)
    stages: tuple[StageSpec, ...] | None = Field(None, min_length=1)
    steps: tuple[StepSpec, ...] | None = Field(None, min_length=1)
    every: float | None = Field(None, gt=0, allow_inf_nan=False)
    width: float | None = Field(None, gt=0, allow_inf_nan=False)
    function: str | None = Field(None, min_length=1)
    file: str | None = Field(None, min_length=1)
    _fn: Any = PrivateAttr(None)

    @field_validator("file")
    @classmethod
    def _abs_file(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return v
        p = Path(v).expanduser()
        if not p.is_absolute():
            src = (info.context or {}).get("path")
            p = (Path(src).resolve().parent if src else Path.cwd()) / p
        return str(p)

    @field_validator("every", "width")
    @classmethod
    def _on_grid(cls, v: float | None) -> float | None:
        from .shapes import SCHEDULE_STEP
        if v is not None and abs(v / SCHEDULE_STEP - round(v / SCHEDULE_STEP)) > 1e-6:
            raise _invalid(f"must be a multiple of {SCHEDULE_STEP:g} s (the load schedule's resolution), got {v:g}")
        return v

    @field_validator("stages")
    @classmethod
    def _stages(cls, v: tuple[StageSpec, ...] | None) -> tuple[StageSpec, ...] | None:
        if v is None:
            return v
        names = [s.name for s in v if s.name]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise _invalid(f"two stages are named {dup[0]!r}: give each a distinct name")
        if all((s.rate if s.rate is not None else s.multiplier) == 0 for s in v):
            raise _invalid("every stage has rate 0: the load would send nothing")
        last = v[-1]
        if (last.rate if last.rate is not None else last.multiplier) == 0:
            raise _invalid(f"stages.{len(v) - 1}: the last stage has rate 0, which would end the load early "
                           "(it ends with its last message); drop it, the drain after the load watches the stack")
        return v

    @field_validator("steps")
    @classmethod
    def _steps(cls, v: tuple[StepSpec, ...] | None) -> tuple[StepSpec, ...] | None:
        if v is None:
            return v
        end = 0.0
        for i, st in enumerate(v):
            start = end if st.start is None else st.start
            if start < end - 1e-9:
                raise _invalid(f"steps.{i} starts at {start:g}, before steps.{i - 1} ends ({end:g}): steps must "
                               "be in order and must not overlap (start and duration are fractions of the burst window)")
            end = start + st.duration
            if end > 1 + 1e-9:
                raise _invalid(f"steps.{i} ends at {end:g} of the burst window (> 1): shorten the steps")
        names = [s.name for s in v if s.name]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise _invalid(f"two steps are named {dup[0]!r}: give each a distinct name")
        return v

    @model_validator(mode="after")
    def _kind(self) -> "ShapeSpec":
        allowed = _SHAPE_KEYS[self.kind]
        given = sorted(("from" if f == "from_" else f) for f in self.model_fields_set if f != "kind")
        extra = [g for g in given if g not in allowed]
        if extra:
            takes = f"takes {', '.join(allowed)}" if allowed else "takes nothing but kind"
            raise _invalid(f"a {self.kind} shape {takes} (got {', '.join(extra)})")
        for key, what in _SHAPE_NEEDS.get(self.kind, {}).items():
            if getattr(self, _FIELD_OF.get(key, key)) is None:
                raise _invalid(f"a {self.kind} shape needs {what}")
        if self.kind == "ramp" and (self.from_ if self.from_ is not None else 1.0) == 0 and self.to == 0:
            raise _invalid("a ramp from 0 to 0 sends nothing: from or to must be > 0")
        if self.kind == "spike":
            if not self.width < self.every:
                raise _invalid(f"spike width ({self.width:g} s) must be shorter than every ({self.every:g} s)")
        if self.kind == "python":
            try:
                self._fn = _load_function(self.function, self.file)
            except ValueError as e:
                raise _invalid(str(e)) from None
        return self

    @property
    def label(self) -> str:
        """How the shape is named in messages (the python shape's function)."""
        if self.kind != "python":
            return self.kind
        return f"{self.file}:{self.function}" if self.file else str(self.function)

    def python_function(self) -> Any:
        if self._fn is None:
            self._fn = _load_function(self.function, self.file)
        return self._fn

    def build(self, base_rate: float, d: "Durations", profile: str = ""):
        """The :class:`monsoon.shapes.LoadShape` of this spec for one profile's durations."""
        from . import shapes as sh
        total = d.total
        w0, w1 = d.warmup, d.warmup + d.burst
        k = self.kind
        if k == "steady":
            return sh.Steady(base_rate, total)
        if k == "burst":
            return sh.Burst(base_rate, self.multiplier, d.warmup, d.burst, total)
        if k == "ramp":
            x0 = 1.0 if self.from_ is None else self.from_
            return sh.Ramp(base_rate * x0, base_rate * self.to, d.warmup, d.burst, total)
        if k == "spike":
            return sh.Spike(base_rate, self.multiplier, self.every, self.width, w0, w1, total)
        if k == "stages":
            weight = sum(s.duration for s in self.stages)
            return sh.Stages(tuple(
                sh.Stage(s.name or f"stage-{i + 1}", s.duration * total / weight,
                         s.rate if s.rate is not None else base_rate * s.multiplier)
                for i, s in enumerate(self.stages)))
        if k == "ladder":
            named_burst = any(s.name == "burst" for s in self.steps)
            out, end, seen = [], 0.0, set()
            for i, st in enumerate(self.steps):
                start = end if st.start is None else st.start
                end = start + st.duration
                name = st.name
                if name is None:
                    name = "burst" if (i == len(self.steps) - 1 and not named_burst) else f"x{st.multiplier:g}"
                    base, n = name, 2
                    while name in seen or any(s.name == name for s in self.steps):
                        name, n = f"{base}#{n}", n + 1
                seen.add(name)
                a = w0 + start * d.burst
                b = min(w0 + end * d.burst, w1)
                out.append(sh.LadderStep(name, a, b, st.multiplier))
            return sh.Ladder(base_rate, tuple(out), total)
        windows = [sh.Phase("warmup", 0.0, w0), sh.Phase("burst", w0, w1), sh.Phase("recovery", w1, total)]
        ctx = sh.ShapeContext(base_rate, total, d.warmup, d.burst, d.recovery, profile)
        return sh.PythonShape(self.python_function(), self.label, total,
                              tuple(p for p in windows if p.end > p.start), ctx)

    def check(self, base_rate: float, d: "Durations", profile: str = "") -> None:
        """Build the shape for a profile and sample its rate over the whole load: raises ValueError
        (a negative rate names the shape and t)."""
        from .shapes import check_rates
        check_rates(self.build(base_rate, d, profile))


def _load_function(function: str | None, file: str | None) -> Any:
    """Import a user shape function: ``module:attr`` or ``attr`` in ``file``; ValueError if it cannot."""
    import importlib
    import importlib.util
    if not function:
        raise ValueError("a python shape needs function")
    if file is not None:
        path = Path(file)
        if not path.is_file():
            raise ValueError(f"python shape file not found: {path}")
        mod_name = "monsoon_user_shape_" + re.sub(r"\W", "_", str(path))
        try:
            spec = importlib.util.spec_from_file_location(mod_name, path)
            if spec is None or spec.loader is None:
                raise ImportError("not a Python source file")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - user code
            raise ValueError(f"cannot load python shape file {path}: {type(e).__name__}: {e}") from None
        attr, where = function, str(path)
    else:
        if ":" not in function:
            raise ValueError(f"function must be 'module:function' (or give file: and the function's name), "
                             f"got {function!r}")
        mod, attr = function.split(":", 1)
        try:
            module = importlib.import_module(mod)
        except Exception as e:  # noqa: BLE001 - user code
            raise ValueError(f"cannot import module {mod!r} of the python shape: {type(e).__name__}: {e}") from None
        where = f"module {mod!r}"
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{where} has no function {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{where}: {attr!r} is not callable (want rate_at(t) -> msg/s or None)")
    return obj


PAYLOAD_PROFILES = ("minimal", "smart-meter", "smart-tracker", "industrial-plc", "template")


class PayloadSpec(_Frozen):
    """What each device publishes (``load.payload``): see :mod:`monsoon.payloads`.

    ``{profile: smart-meter}``, ``{profile: industrial-plc, datapoints: 100}``,
    ``{profile: template, template: '{"ts": {ts}, "values": {"device": "{device}", "seq": {seq}}}'}``;
    a bare string is the profile. Default: ``minimal`` (temperature, humidity).
    """
    profile: Literal["minimal", "smart-meter", "smart-tracker", "industrial-plc", "template"] = "minimal"
    datapoints: int | None = Field(None, ge=1, le=999, description="industrial-plc only: values per message")
    template: str | None = Field(None, description="template only: JSON text with placeholders")

    @field_validator("template")
    @classmethod
    def _template_ok(cls, v: str | None) -> str | None:
        from .payloads import compile_template
        if v is not None:
            try:
                compile_template(v)
            except ValueError as e:   # TemplateError: says what is wrong and where in the template
                raise _invalid(str(e)) from None
        return v

    @model_validator(mode="after")
    def _fits(self) -> "PayloadSpec":
        if self.datapoints is not None and self.profile != "industrial-plc":
            raise _invalid(f"datapoints is for the industrial-plc profile, not {self.profile!r}")
        if self.profile == "template":
            if self.template is None:
                raise _invalid("the template profile needs a template: JSON text with {device}, {seq}, {ts} "
                               "(and {sent_ms}, {rand_int:A:B}, {rand_float:A:B}) placeholders")
        elif self.template is not None:
            raise _invalid(f"template is for the template profile, not {self.profile!r}")
        return self

    def build(self):
        """The :class:`monsoon.payloads.Payload` the fleet renders."""
        from .payloads import DEFAULT_DATAPOINTS, Payload
        return Payload(self.profile, self.datapoints or DEFAULT_DATAPOINTS, self.template)


class LoadSpec(_Frozen):
    devices: int = Field(gt=0)
    qos: Literal[0, 1] = 1
    # x1 in msg/s (all devices together), or "auto": base_fraction x the stack's calibrated capacity
    # (monsoon.calibrate; resolved by the runner, so validation needs no live stack)
    base_rate: float | Literal["auto"] = Field(description="x1 in messages per second, all devices together, or auto")
    base_fraction: float | None = Field(None, gt=0, le=1, allow_inf_nan=False,
                                        description="base_rate: auto only: x1 = this fraction of the capacity (0.25)")
    shape: ShapeSpec
    payload: PayloadSpec = PayloadSpec()
    device_prefix: str = "monsoon"
    # the MQTT generator: python (paho, one thread; ~10k msg/s) or native (monsoon-loadgen, Rust; ~100k msg/s per
    # core, ``workers`` processes each taking a shard of the devices, as the pods of the Kubernetes Job do)
    engine: Literal["python", "native"] = "python"
    workers: int = Field(1, ge=1, le=64, description="engine: native only: worker processes (--shard i/workers)")

    @field_validator("base_rate", mode="before")
    @classmethod
    def _rate_or_auto(cls, v: Any) -> Any:
        import math
        if isinstance(v, str) and v.strip().lower() == "auto":
            return "auto"
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

    @field_validator("payload", mode="before")
    @classmethod
    def _payload_str(cls, v: Any) -> Any:
        return {"profile": v} if isinstance(v, str) else v


AUTO_STAND_INS = (1.0, 100.0, 10_000.0)   # x1 stand-ins for validating a python shape under base_rate: auto


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
    if spec.load.base_fraction is not None and not spec.load.auto:
        raise _fail(doc, ("load", "base_fraction"), "base_fraction is for base_rate: auto (x1 = base_fraction x "
                    "the calibrated capacity): drop it or write base_rate: auto")
    if spec.load.workers > 1 and spec.load.engine != "native":
        raise _fail(doc, ("load", "workers"), "workers > 1 needs engine: native (the python fleet is one process)")
    if spec.load.engine == "native":
        from .native import workers_problem
        problem = workers_problem(spec.load.devices, spec.load.workers, key="workers")
        if problem:
            raise _fail(doc, ("load", "workers"), problem)
    if spec.load.workers > spec.load.devices:
        raise _fail(doc, ("load", "workers"), f"{spec.load.workers} workers for {spec.load.devices} devices: "
                    "every worker needs at least one device")
    for profile, d in spec.profiles.items():   # build the shape per profile and sample its rate
        try:
            if spec.load.auto and spec.load.shape.kind == "python":
                # its rates may depend on the calibrated x1 (ctx.base_rate): refused here only when negative
                # whatever x1 is; the runner samples it again once x1 is known, before anything starts
                errs = []
                for stand_in in AUTO_STAND_INS:
                    try:
                        spec.load.shape.check(stand_in, d, profile)
                    except ValueError as e:
                        errs.append(e)
                if len(errs) == len(AUTO_STAND_INS):
                    raise ValueError(f"{errs[0]} (whatever x1 base_rate: auto resolves to)")
            else:
                spec.load.shape.check(spec.load.rate_for_checks, d, profile)
        except ValueError as e:
            raise _fail(doc, ("load", "shape"), f"profile {profile!r}: {e}") from None
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
