"""Load shapes: the target message rate as a function of time.

A shape is pure data plus arithmetic. It never looks at a clock; the
:class:`monsoon.load.schedule.Schedule` turns it into intended send times.

Conventions shared by every shape:

* ``t`` is seconds since the start of the load, ``0 <= t``.
* ``rate_at(t)`` is the target rate in messages per second at ``t``; it
  returns ``None`` once ``t >= duration`` (the load is over).
* ``phases()`` lists named, contiguous, half-open windows ``[start, end)``
  covering ``[0, duration)``, with distinct names (checks and reports look
  phases up by name: ``burst``, ``warmup``, ``recovery``, ``steady``, ...).
* The schedule samples ``rate_at`` at every phase start and then every
  :data:`SCHEDULE_STEP` seconds inside a phase. Every built-in shape changes
  its rate only at those instants, so the schedule integrates it exactly:
  piecewise-constant shapes (steady, burst, stages, ladder) change only at
  phase boundaries; :class:`Spike` requires spike widths and periods on the
  step grid; :class:`Ramp` is a staircase of ``SCHEDULE_STEP`` cells whose
  value is the linear ramp at the middle of the cell (so the message count is
  the exact integral of the linear ramp). A :class:`PythonShape` is sampled
  the same way: what it does between samples is not seen.

Shapes do not validate their parameters: :class:`monsoon.spec.shape.ShapeSpec` does, once, with file, line
and key, and :func:`build_shape` builds from a validated spec. Only a user's function is checked here, at
each sample (its values are not known before).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from monsoon.spec.shape import Durations, SCHEDULE_STEP, ShapeSpec, StageSpec


__all__ = [
    "Burst",
    "Ladder",
    "LadderStep",
    "LoadShape",
    "Phase",
    "PythonShape",
    "Ramp",
    "SCHEDULE_STEP",
    "ShapeContext",
    "Spike",
    "Stage",
    "Stages",
    "Steady",
    "check_rates",
]


_EPS = 1e-9  # float slack when a sample time sits on a grid point


def _floats(obj: object, *names: str) -> None:
    """Store these fields of a frozen shape as floats (a spec may give ints). Shapes do not validate:
    :class:`monsoon.spec.shape.ShapeSpec` does, once, with file, line and key."""
    for n in names:
        object.__setattr__(obj, n, float(getattr(obj, n)))


@dataclass(frozen=True)
class Phase:
    """A named window ``[start, end)`` of a load shape, in seconds from start."""

    name: str
    start: float
    end: float


@runtime_checkable
class LoadShape(Protocol):
    """What the load engine needs from a shape."""

    @property
    def duration(self) -> float:
        """Seconds of load."""
        ...

    def rate_at(self, t: float) -> float | None:
        """Target msg/s at ``t`` seconds after start; ``None`` means stop."""
        ...

    def phases(self) -> list[Phase]:
        """Named, contiguous windows covering ``[0, duration)``."""
        ...


@dataclass(frozen=True)
class Steady:
    """A constant ``rate`` msg/s for ``duration`` seconds (one phase, "steady")."""

    rate: float
    duration: float

    def __post_init__(self) -> None:
        _floats(self, 'rate', 'duration')

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
        _floats(self, 'base_rate', 'multiplier', 'start', 'burst_duration', 'duration')

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


@dataclass(frozen=True)
class Ramp:
    """``start_rate`` msg/s until ``start``, then a linear ramp to ``end_rate``
    over ``ramp_duration`` seconds, then ``end_rate`` until ``duration``.

    Phases: "warmup" ``[0, start)``, "ramp", "hold" (zero-length ones omitted).

    Inside the ramp the rate is a staircase of ``step``-second cells (measured
    from ``start``); each cell carries the linear ramp's value at its middle,
    so the staircase's integral, hence the message count, equals the linear
    ramp's exactly. One rate may be 0 (a ramp up from nothing, or down to it).
    """

    start_rate: float
    end_rate: float
    start: float
    ramp_duration: float
    duration: float
    step: float = SCHEDULE_STEP

    def __post_init__(self) -> None:
        _floats(self, 'start_rate', 'end_rate', 'start', 'ramp_duration', 'duration', 'step')

    @property
    def ramp_end(self) -> float:
        return self.start + self.ramp_duration

    def rate_at(self, t: float) -> float | None:
        if t < 0 or t >= self.duration:
            return None
        if t < self.start:
            return self.start_rate
        end = self.ramp_end
        if t >= end:
            return self.end_rate
        i = math.floor((t - self.start) / self.step + _EPS)
        a = self.start + i * self.step
        b = min(a + self.step, end)
        mid = min((a + b) / 2, end)
        frac = (mid - self.start) / self.ramp_duration
        return self.start_rate + (self.end_rate - self.start_rate) * frac

    def phases(self) -> list[Phase]:
        out = [
            Phase("warmup", 0.0, self.start),
            Phase("ramp", self.start, self.ramp_end),
            Phase("hold", self.ramp_end, self.duration),
        ]
        return [p for p in out if p.end > p.start]


@dataclass(frozen=True)
class Stage:
    """One stage of :class:`Stages`: ``rate`` msg/s for ``duration`` seconds.
    A rate of 0 is a pause (nothing is sent; the schedule resumes after it)."""

    name: str
    duration: float
    rate: float


@dataclass(frozen=True)
class Stages:
    """Consecutive constant-rate stages; each stage is one phase (its name).

    A stage may have rate 0 (a pause), but not the last one: the load ends
    with its last message, so a trailing pause would silently shorten it.
    """

    stages: tuple[Stage, ...]
    duration: float = field(init=False)

    def __post_init__(self) -> None:
        stages = tuple(self.stages)
        object.__setattr__(self, "stages", stages)
        ends: list[float] = []
        t = 0.0
        for s in stages:
            t += float(s.duration)
            ends.append(t)
        object.__setattr__(self, "_ends", tuple(ends))
        object.__setattr__(self, "duration", t)

    def rate_at(self, t: float) -> float | None:
        if t < 0 or t >= self.duration:
            return None
        ends: tuple[float, ...] = self._ends  # type: ignore[attr-defined]
        for s, end in zip(self.stages, ends):
            if t < end:
                return s.rate
        return float(self.stages[-1].rate)  # pragma: no cover - t < duration == ends[-1]

    def phases(self) -> list[Phase]:
        ends: tuple[float, ...] = self._ends  # type: ignore[attr-defined]
        starts = (0.0,) + ends[:-1]
        return [Phase(s.name, a, b) for s, a, b in zip(self.stages, starts, ends)]


@dataclass(frozen=True)
class LadderStep:
    """One step of :class:`Ladder`: ``base_rate * multiplier`` in ``[start, end)``."""

    name: str
    start: float
    end: float
    multiplier: float


@dataclass(frozen=True)
class Ladder:
    """A burst ladder: ``base_rate`` (x1), with steps of ``base_rate * multiplier``
    (e.g. x3 then x10), each with its own start and end; x1 between and after.

    Phases: "warmup" before the first step, one phase per step (its name),
    ``after-<step>`` for an x1 gap between two steps, "recovery" after the
    last step (zero-length ones omitted). Names must be distinct.
    """

    base_rate: float
    steps: tuple[LadderStep, ...]
    duration: float

    def __post_init__(self) -> None:
        _floats(self, "base_rate", "duration")
        object.__setattr__(self, "steps", tuple(self.steps))

    def rate_at(self, t: float) -> float | None:
        if t < 0 or t >= self.duration:
            return None
        for s in self.steps:
            if t < s.start:
                break
            if t < s.end:
                return self.base_rate * s.multiplier
        return self.base_rate

    def phases(self) -> list[Phase]:
        out = [Phase("warmup", 0.0, self.steps[0].start)]
        for i, s in enumerate(self.steps):
            if i:
                prev = self.steps[i - 1]
                out.append(Phase(f"after-{prev.name}", prev.end, s.start))
            out.append(Phase(s.name, s.start, s.end))
        out.append(Phase("recovery", self.steps[-1].end, self.duration))
        return [p for p in out if p.end > p.start]


@dataclass(frozen=True)
class Spike:
    """``base_rate`` (x1), with short spikes of ``base_rate * multiplier``:
    one of ``width`` seconds every ``every`` seconds, the first at ``start``,
    none after ``end`` (a spike running into ``end`` is cut there).

    Phases: "warmup" ``[0, start)``, "burst" ``[start, end)`` (the window the
    spikes fall in), "recovery" ``[end, duration)``. ``every`` and ``width``
    must be multiples of :data:`SCHEDULE_STEP` so the schedule sees every
    spike edge exactly.
    """

    base_rate: float
    multiplier: float
    every: float
    width: float
    start: float
    end: float
    duration: float

    def __post_init__(self) -> None:
        _floats(self, 'base_rate', 'multiplier', 'every', 'width', 'start', 'end', 'duration')

    def in_spike(self, t: float) -> bool:
        if t < self.start or t >= self.end:
            return False
        u = t - self.start
        k = math.floor(u / self.every + _EPS)
        return u - k * self.every < self.width - _EPS

    def spikes(self) -> Iterator[tuple[float, float]]:
        """``(start, end)`` of every spike."""
        k = 0
        while True:
            a = self.start + k * self.every
            if a >= self.end - _EPS:
                return
            yield (a, min(a + self.width, self.end))
            k += 1

    def rate_at(self, t: float) -> float | None:
        if t < 0 or t >= self.duration:
            return None
        return self.base_rate * self.multiplier if self.in_spike(t) else self.base_rate

    def phases(self) -> list[Phase]:
        out = [
            Phase("warmup", 0.0, self.start),
            Phase("burst", self.start, self.end),
            Phase("recovery", self.end, self.duration),
        ]
        return [p for p in out if p.end > p.start]


@dataclass(frozen=True)
class ShapeContext:
    """What a user-supplied ``rate_at(t, ctx)`` may want to know (seconds, msg/s)."""

    base_rate: float
    duration: float
    warmup: float
    burst: float
    recovery: float
    profile: str = ""


def _takes_context(fn: Callable[..., Any]) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return False
    try:
        sig.bind(0.0, None)
    except TypeError:
        return False
    return True


@dataclass(frozen=True)
class PythonShape:
    """A user-supplied ``rate_at(t)`` (or ``rate_at(t, ctx)`` with a
    :class:`ShapeContext`) returning msg/s, or ``None`` to stop the load.

    Every value it returns is checked: a negative, non-finite or non-numeric
    rate raises a ``ValueError`` naming the shape and ``t``; so does an
    exception raised by the function. Phases are given (by the spec: the
    profile's warmup / burst / recovery windows).
    """

    fn: Callable[..., Any]
    name: str
    duration: float
    windows: tuple[Phase, ...]
    context: ShapeContext | None = None

    def __post_init__(self) -> None:
        _floats(self, "duration")
        object.__setattr__(self, "windows", tuple(self.windows))
        object.__setattr__(self, "_with_ctx", _takes_context(self.fn))

    def rate_at(self, t: float) -> float | None:
        if t < 0 or t >= self.duration:
            return None
        try:
            r = self.fn(t, self.context) if self._with_ctx else self.fn(t)  # type: ignore[attr-defined]
        except Exception as e:  # user code: say where it failed
            raise ValueError(f"python shape {self.name} raised at t={t:g}s: {type(e).__name__}: {e}") from e
        if r is None:
            return None
        if isinstance(r, bool) or not isinstance(r, (int, float)):
            raise ValueError(
                f"python shape {self.name} returned {r!r} at t={t:g}s: a rate must be a number "
                "(msg/s) or None to stop the load"
            )
        r = float(r)
        if not math.isfinite(r):
            raise ValueError(f"python shape {self.name} returned a non-finite rate {r!r} at t={t:g}s")
        if r < 0:
            raise ValueError(
                f"python shape {self.name} returned a negative rate {r:g} at t={t:g}s "
                "(a rate is msg/s >= 0; return None to stop the load)"
            )
        return r

    def phases(self) -> list[Phase]:
        return list(self.windows)


def check_rates(shape: LoadShape, *, max_samples: int = 20_000) -> float:
    """Sample ``shape.rate_at`` over its whole duration (every phase start,
    then every :data:`SCHEDULE_STEP` s, coarser if that would exceed
    ``max_samples``) and return the highest rate seen; raise ``ValueError`` on a negative or non-finite rate
    (a :class:`PythonShape` raises its own, more precise error first).  A
    user's Python shape is sampled on the schedule's own grid whatever its
    length (the run would meet every one of those points), the built-in
    shapes (base rate x positive multipliers) at most ``max_samples`` times."""
    duration = float(shape.duration)
    if isinstance(shape, PythonShape):
        max_samples = max(max_samples, int(math.ceil(duration / SCHEDULE_STEP)) + 1)
    step = max(SCHEDULE_STEP, duration / max_samples)
    points = {float(p.start) for p in shape.phases()}
    n = int(math.ceil(duration / step))
    points.update(i * step for i in range(n))
    peak = 0.0
    for t in sorted(points):
        if not 0 <= t < duration:
            continue
        r = shape.rate_at(t)
        if r is None:
            return peak
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or r < 0:
            raise ValueError(f"shape rate_at({t:g}) returned {r!r}: a rate must be a number >= 0")
        peak = max(peak, float(r))
    return peak


def _stage_rate(s: StageSpec, base_rate: float) -> float:
    """A stage's rate: its own, else its multiplier of the base rate (StageSpec._one: one of the two is set)."""
    if s.rate is not None:
        return s.rate
    assert s.multiplier is not None     # a validated StageSpec without a rate has its multiplier
    return base_rate * s.multiplier


def build_shape(spec: ShapeSpec, base_rate: float, d: Durations, profile: str = "") -> LoadShape:
    """The :class:`monsoon.load.shapes.LoadShape` of this spec for one profile's durations."""
    total = d.total
    w0, w1 = d.warmup, d.warmup + d.burst
    k = spec.kind
    if k == "steady":
        return Steady(base_rate, total)
    if k == "burst":
        assert spec.multiplier is not None     # a validated ShapeSpec: a burst has its multiplier
        return Burst(base_rate, spec.multiplier, d.warmup, d.burst, total)
    if k == "ramp":
        x0 = 1.0 if spec.from_ is None else spec.from_
        assert spec.to is not None     # a validated ShapeSpec: a ramp has its to
        return Ramp(base_rate * x0, base_rate * spec.to, d.warmup, d.burst, total)
    if k == "spike":
        assert spec.multiplier is not None and spec.every is not None and spec.width is not None   # validated
        return Spike(base_rate, spec.multiplier, spec.every, spec.width, w0, w1, total)
    if k == "stages":
        assert spec.stages is not None     # a validated ShapeSpec: stages has its stages
        weight = sum(s.duration for s in spec.stages)
        return Stages(tuple(Stage(name, s.duration * total / weight, _stage_rate(s, base_rate))
                            for name, s in zip(spec.stage_names(), spec.stages)))
    if k == "ladder":
        assert spec.steps is not None     # a validated ShapeSpec: a ladder has its steps
        return Ladder(base_rate, tuple(LadderStep(name, a, b, st.multiplier) for name, (a, b), st
                                       in zip(spec.step_names(), spec.step_windows(d), spec.steps)), total)
    windows = [Phase("warmup", 0.0, w0), Phase("burst", w0, w1), Phase("recovery", w1, total)]
    ctx = ShapeContext(base_rate, total, d.warmup, d.burst, d.recovery, profile)
    return PythonShape(spec.python_function(), spec.label, total,
                          tuple(p for p in windows if p.end > p.start), ctx)

_PEAKS: dict[tuple[str, float, str, str], float] = {}


def check_shape(spec: ShapeSpec, base_rate: float, d: Durations, profile: str = "") -> float:
    """Build the shape for a profile and sample its rate over the whole load: raises ValueError
    (a negative rate names the shape and t). Returns the peak rate.

    A built-in shape's peak is a function of its spec, rate and durations alone: it is computed once per process
    (``monsoon validate`` checks each experiment's shapes for every profile and again in every pair it is in:
    sampling the full profiles was 2/3 of its time). A user's Python shape is sampled every time."""
    if spec.kind == "python":
        return check_rates(build_shape(spec, base_rate, d, profile))
    key = (spec.model_dump_json(), float(base_rate), d.model_dump_json(), profile)
    if key not in _PEAKS:
        _PEAKS[key] = check_rates(build_shape(spec, base_rate, d, profile))
    return _PEAKS[key]
