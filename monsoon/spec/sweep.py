"""A size sweep (``load.sweep``, with ``load.payload.sizes``): the same load at several payload sizes, the
platform's sustained capacity at each (the calibration's ramp) beside its own transport's (Kafka produce and
consume through the stack's broker, no platform in between), as in Spring XD's message-size benchmark.
Run by ``monsoon sweep`` (:mod:`monsoon.run.sweep`)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field

from monsoon.spec.base import _Frozen, _per_profile

PerProfile = float | Mapping[str, float]     # a Mapping: the defaults' int values are floats too (validated to a dict)


class SweepSpec(_Frozen):
    """How each size is ramped: ``factor`` x per step of ``step_s`` seconds (``settle_s`` of them not measured),
    from ``load.base_rate`` msg/s at the smallest size; each larger size starts at the higher of half the MB/s
    the previous size sustained and 1/20 of its msg/s; every ladder goes up to ``max_rate`` and stops at its
    first step not kept up. A step is judged as a calibration's, without its latency knee unless ``latency_k``
    is set, and with ``gc_fraction``."""
    factor: float = Field(2.0, gt=1, le=10, description="rate multiplier per ramp step")
    step_s: PerProfile = Field({"quick": 4, "nightly": 10, "full": 60},
                               description="seconds per ramp step, settle included (may differ per profile)")
    settle_s: PerProfile = Field({"quick": 1, "nightly": 2, "full": 10},
                                 description="seconds at the start of each step not measured")
    max_rate: float = Field(20000, gt=0, description="no ladder goes above this many msg/s")
    transport_s: PerProfile = Field({"quick": 3, "nightly": 10, "full": 60},
                                    description="seconds of bare-transport produce-and-consume per size "
                                                "(0: not measured)")
    gc_fraction: float | None = Field(0.25, gt=0, lt=1, description="a step whose window the platform's JVM spent "
                                      "more than this fraction of in GC is not kept up (null: GC not judged)")
    latency_k: float | None = Field(None, gt=1, description="a step whose p99 ack latency is more than this many "
                                    "times its size's first step's (and > 250 ms) is not kept up; null (the "
                                    "default): throughput alone, as Spring XD measured, since a larger size's "
                                    "ladder starts near idle, where its first step's p99 is no baseline")

    def resolved(self, profile: str) -> dict[str, Any]:
        """The profile's numbers: ``{factor, step_s, settle_s, max_rate, transport_s, gc_fraction, latency_k}``."""
        out = {k: _per_profile(getattr(self, k), profile, f"load.sweep.{k}") for k in type(self).model_fields}
        return out
