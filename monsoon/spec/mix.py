"""A request mix (``load.mix``): weighted operations in one open-model schedule, as Eclipse Ditto's benchmark
mixes READ_THINGS, SEARCH_THINGS and MODIFY_THINGS with live device messages.  ``base_rate`` is then the
first step's operations per second, all kinds together; each step of the ramp multiplies it by ``factor``.
Run by :mod:`monsoon.run.mix` (``monsoon.mix(stack, experiment)`` in pytest)."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from monsoon.spec.base import _Frozen, _invalid, _per_profile

PerProfile = float | dict[str, float]
OPS = ("read", "search", "write", "modify")
Op = Literal["read", "search", "write", "modify"]


class MixSpec(_Frozen):
    """Weights of the operations and the ramp that finds the mix's capacity (see docs/load.md, "Request mix")."""
    weights: dict[Op, float] = Field(description="relative weight of each operation: read (HTTP GET of a device's "
                                     "latest telemetry by id), search (HTTP GET of devices by a name and type "
                                     "filter), write (device telemetry through the fleet), modify (a message "
                                     "into the stack's Kafka topic); write must be > 0")
    keys: str = Field("seq", description="read: the telemetry keys asked for (comma-separated)")
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
        if any(w < 0 for w in self.weights.values()):
            raise _invalid("load.mix.weights: weights are >= 0")
        if self.weights.get("write", 0) <= 0:
            raise _invalid("load.mix.weights.write must be > 0: the device writes carry the ramp's steps")
        return self

    def shares(self) -> dict[str, float]:
        """Each operation's fraction of the ops/s (weights normalised; 0-weight operations left out)."""
        total = sum(self.weights.values())
        w = {str(op): float(v) for op, v in self.weights.items()}
        return {op: w[op] / total for op in OPS if w.get(op, 0.0) > 0}

    def resolved(self, profile: str) -> dict[str, Any]:
        """The profile's numbers (every field, per-profile ones resolved; weights as a plain dict)."""
        out = {k: _per_profile(getattr(self, k), profile, f"load.mix.{k}") for k in type(self).model_fields}
        out["weights"] = dict(self.weights)
        return out
