"""Load shapes: the target message rate as a function of time.

A shape is pure data plus arithmetic. It never looks at a clock; the
:class:`monsoon.load.Schedule` turns it into intended send times.

Conventions shared by every shape:

* ``t`` is seconds since the start of the load, ``0 <= t``.
* ``rate_at(t)`` is the target rate in messages per second at ``t``; it
  returns ``None`` once ``t >= duration`` (the load is over).
* ``phases()`` lists named, contiguous, half-open windows ``[start, end)``
  covering ``[0, duration)``. The rate of the built-in shapes is constant
  inside a phase, so the rate changes exactly at phase boundaries.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

__all__ = ["Burst", "LoadShape", "Phase", "Steady"]


@dataclass(frozen=True)
class Phase:
    """A named window ``[start, end)`` of a load shape, in seconds from start."""

    name: str
    start: float
    end: float


@runtime_checkable
class LoadShape(Protocol):
    """What the load engine needs from a shape."""

    duration: float

    def rate_at(self, t: float) -> float | None:
        """Target msg/s at ``t`` seconds after start; ``None`` means stop."""
        ...

    def phases(self) -> list[Phase]:
        """Named, contiguous windows covering ``[0, duration)``."""
        ...


def _positive(name: str, value: object) -> float:
    """Validate a strictly positive, finite number; name the parameter if not."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return v


def _non_negative(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")
    return v


@dataclass(frozen=True)
class Steady:
    """A constant ``rate`` msg/s for ``duration`` seconds (one phase, "steady")."""

    rate: float
    duration: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "rate", _positive("rate", self.rate))
        object.__setattr__(self, "duration", _positive("duration", self.duration))

    def rate_at(self, t: float) -> float | None:
        if t < 0 or t >= self.duration:
            return None
        return self.rate

    def phases(self) -> list[Phase]:
        return [Phase("steady", 0.0, self.duration)]


@dataclass(frozen=True)
class Burst:
    """``base_rate`` (x1), then ``base_rate * multiplier`` for ``burst_duration``
    seconds starting at ``start``, then back to ``base_rate`` until ``duration``.

    Phases: "warmup" ``[0, start)``, "burst" ``[start, start+burst_duration)``,
    "recovery" ``[start+burst_duration, duration)``. A phase of zero length
    (burst at 0, or ending exactly at ``duration``) is omitted.
    """

    base_rate: float
    multiplier: float
    start: float
    burst_duration: float
    duration: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "base_rate", _positive("base_rate", self.base_rate))
        object.__setattr__(self, "multiplier", _positive("multiplier", self.multiplier))
        object.__setattr__(self, "start", _non_negative("start", self.start))
        object.__setattr__(
            self, "burst_duration", _positive("burst_duration", self.burst_duration)
        )
        object.__setattr__(self, "duration", _positive("duration", self.duration))
        end = self.start + self.burst_duration
        if end > self.duration:
            raise ValueError(
                f"burst must lie within duration: start ({self.start:g}) + "
                f"burst_duration ({self.burst_duration:g}) = {end:g} > "
                f"duration ({self.duration:g})"
            )

    @property
    def burst_end(self) -> float:
        return self.start + self.burst_duration

    @property
    def burst_rate(self) -> float:
        return self.base_rate * self.multiplier

    def rate_at(self, t: float) -> float | None:
        if t < 0 or t >= self.duration:
            return None
        if self.start <= t < self.burst_end:
            return self.burst_rate
        return self.base_rate

    def phases(self) -> list[Phase]:
        out = [
            Phase("warmup", 0.0, self.start),
            Phase("burst", self.start, self.burst_end),
            Phase("recovery", self.burst_end, self.duration),
        ]
        return [p for p in out if p.end > p.start]
