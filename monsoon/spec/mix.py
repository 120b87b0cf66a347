"""A request mix (``load.mix``): weighted operations in one open-model schedule, as Eclipse Ditto's benchmark
mixes READ_THINGS, SEARCH_THINGS and MODIFY_THINGS with live device messages.  ``base_rate`` is then the
first step's operations per second, all kinds together; each step of the ramp multiplies it by ``factor``.
The HTTP operations are named request forms (``load.mix.requests``): ``read`` and ``search`` by default, in the
form ThingsBoard's REST API and the reference platform share; an experiment can reshape them or add its own
(a time-series range, ThingsBoard's entity query) and weight them by name.
Run by :mod:`monsoon.run.mix` (``monsoon.mix(stack, experiment)`` in pytest)."""
from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, model_validator

from monsoon.spec.base import _Frozen, _invalid, _per_profile

PerProfile = float | dict[str, float]
OPS = ("read", "search", "write", "modify")      # the built-in operations, in their report order
NOT_HTTP = ("write", "modify")                   # the fleet's writes and the Kafka modifications
PLACEHOLDERS = ("id", "name", "name_prefix", "type", "keys", "now_ms", "since_ms")
PLACEHOLDER_RE = re.compile(r"\{([a-z_]+)\}")
_OP_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


class RequestSpec(_Frozen):
    """One HTTP operation of the mix, sent with the JWT of ``/api/auth/login`` (the stack's provisioning user).
    ``path``, ``params`` values and the strings of ``body`` take placeholders: ``{id}`` (the device's id, found
    by the warm-up), ``{name}``, ``{name_prefix}`` (the name without its last digit: ~10 devices), ``{type}``,
    ``{keys}`` (``load.mix.keys``), ``{now_ms}`` and ``{since_ms}`` (now minus ``load.mix.range_s``)."""
    method: Literal["GET", "POST"] = Field("GET", description="the HTTP method")
    path: str = Field(description="the path under the provisioning URL, e.g. "
                      "/api/plugins/telemetry/DEVICE/{id}/values/timeseries")
    params: dict[str, str] = Field({}, description="the query parameters, e.g. {keys: '{keys}'}")
    body: dict[str, Any] | None = Field(None, description="POST: the JSON body (its strings take the placeholders)")
    expect: str | None = Field(None, description="a top-level key of the JSON answer that must be non-empty (e.g. "
                               "data: a search that finds nothing is an error); none: any JSON object")

    @model_validator(mode="after")
    def _known_placeholders(self) -> "RequestSpec":
        for text in [self.path, *self.params.values(), *_strings(self.body)]:
            for name in PLACEHOLDER_RE.findall(text):
                if name not in PLACEHOLDERS:
                    raise _invalid(f"unknown placeholder {{{name}}} in {text!r} (known: "
                                   + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS) + ")")
        if self.body is not None and self.method != "POST":
            raise _invalid("a body goes with method: POST")
        return self


def _strings(x: Any) -> list[str]:
    if isinstance(x, str):
        return [x]
    if isinstance(x, dict):
        return [s for v in x.values() for s in _strings(v)]
    if isinstance(x, list):
        return [s for v in x for s in _strings(v)]
    return []


#: The forms ThingsBoard's REST API and the reference platform share: a device's latest telemetry by id, and
#: devices by a name substring and their type.
DEFAULT_REQUESTS: dict[str, RequestSpec] = {
    "read": RequestSpec(path="/api/plugins/telemetry/DEVICE/{id}/values/timeseries", params={"keys": "{keys}"}),
    "search": RequestSpec(path="/api/tenant/devices", params={"pageSize": "10", "page": "0",
                                                              "textSearch": "{name_prefix}", "type": "{type}"},
                          expect="data"),
}


class MixSpec(_Frozen):
    """Weights of the operations and the ramp that finds the mix's capacity (see docs/load.md, "Request mix")."""
    weights: dict[str, float] = Field(description="relative weight of each operation: write (device telemetry "
                                      "through the fleet; must be > 0), modify (a message into the stack's Kafka "
                                      "topic), and the HTTP request forms by name: read (a device's latest "
                                      "telemetry by id) and search (devices by a name and type filter) unless "
                                      "load.mix.requests reshapes them, and any form it adds")
    requests: dict[str, RequestSpec] = Field({}, description="HTTP request forms by operation name, over the "
                                             "defaults read and search (the platform's API: e.g. ThingsBoard's "
                                             "time-series range or its entity query POST /api/entitiesQuery/find)")
    keys: str = Field("seq", description="the telemetry keys the reads ask for ({keys}, comma-separated)")
    range_s: float = Field(60.0, gt=0, description="{since_ms}: a time-series range read covers this many "
                           "seconds back from now")
    factor: float = Field(2.0, gt=1, le=10, description="ops/s multiplier per ramp step")
    step_s: PerProfile = Field({"quick": 5.0, "nightly": 20.0, "full": 600.0},
                               description="seconds per ramp step, settle included (may differ per profile)")
    settle_s: PerProfile = Field({"quick": 1.0, "nightly": 3.0, "full": 30.0},
                                 description="seconds at the start of each step not measured")
    max_rate: float = Field(5000, gt=0, description="the ramp goes no higher than this many ops/s")
    gc_fraction: float | None = Field(0.25, gt=0, lt=1, description="a step whose window the platform's JVM spent "
                                      "more than this fraction of in GC is not kept up (null: GC not judged)")
    error_fraction: float = Field(0.01, ge=0, lt=1, description="a step in which more than this fraction of an "
                                  "operation's requests failed (or were refused: too many in flight) is not kept up")
    max_in_flight: int = Field(64, ge=1, le=4096, description="per operation: requests outstanding beyond this are "
                               "not sent and count as errors (too many in-flight requests)")

    @model_validator(mode="after")
    def _writes_carry_the_ramp(self) -> "MixSpec":
        forms = self.forms()
        for op, w in self.weights.items():
            if op not in NOT_HTTP and op not in forms:
                raise _invalid(f"load.mix.weights.{op}: no such operation (write, modify, or a request form: "
                               f"{', '.join(forms)}; add one under load.mix.requests)")
            if w < 0:
                raise _invalid(f"load.mix.weights.{op}: weights are >= 0")
        for op in self.requests:
            if op in NOT_HTTP or not _OP_NAME.match(op):
                raise _invalid(f"load.mix.requests.{op}: a request form's name is lower-case letters, digits, - "
                               "and _ (not write or modify)")
        if self.weights.get("write", 0) <= 0:
            raise _invalid("load.mix.weights.write must be > 0: the device writes carry the ramp's steps")
        return self

    def forms(self) -> dict[str, RequestSpec]:
        """The HTTP request forms: the defaults (read, search) with the experiment's over them."""
        return {**DEFAULT_REQUESTS, **self.requests}

    def shares(self) -> dict[str, float]:
        """Each operation's fraction of the ops/s (weights normalised; 0-weight operations left out), the
        built-in operations first, then the experiment's own forms in their order."""
        total = sum(self.weights.values())
        order = [*OPS, *(op for op in self.weights if op not in OPS)]
        return {op: float(self.weights[op]) / total for op in order if self.weights.get(op, 0.0) > 0}

    def resolved(self, profile: str) -> dict[str, Any]:
        """The profile's numbers (every field, per-profile ones resolved; weights and request forms as plain
        data)."""
        out = {k: _per_profile(getattr(self, k), profile, f"load.mix.{k}") for k in type(self).model_fields
               if k != "requests"}
        out["weights"] = dict(self.weights)
        out["requests"] = {op: f.model_dump(exclude_none=True) for op, f in self.forms().items()}
        return out
