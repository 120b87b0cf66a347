"""The load shape of an experiment (``load.shape``): steady, burst, ramp, stages, ladder, spike or a Python
function, validated per kind; :func:`monsoon.load.shapes.build_shape` turns it into a rate over time."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal
from pydantic import ConfigDict, Field, PrivateAttr, ValidationInfo, field_validator, model_validator

import importlib
import importlib.util

from monsoon.spec.base import _Frozen, _invalid


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
    duration: float = Field(gt=0, allow_inf_nan=False, description="its share of the load (relative to the sum)")
    rate: float | None = Field(None, ge=0, allow_inf_nan=False, description="msg/s (0: a pause)")
    multiplier: float | None = Field(None, ge=0, allow_inf_nan=False, description="x base_rate (0: a pause)")
    name: str | None = Field(None, min_length=1, description="its phase name (default stage-N)")

    @model_validator(mode="after")
    def _one(self) -> "StageSpec":
        if (self.rate is None) == (self.multiplier is None):
            raise _invalid("give exactly one of rate (msg/s) or multiplier (x base_rate); 0 is a pause")
        return self


class StepSpec(_Frozen):
    """One ladder step: ``multiplier`` x base_rate from ``start`` for ``duration``, both fractions (0..1]
    of the profile's burst window; ``start`` defaults to the end of the previous step (0 for the first)."""
    multiplier: float = Field(gt=0, allow_inf_nan=False, description="x base_rate")
    duration: float = Field(gt=0, le=1, allow_inf_nan=False, description="fraction of the burst window")
    start: float | None = Field(None, ge=0, lt=1, allow_inf_nan=False, description="fraction of the burst window "
                                "(default: where the previous step ends)")
    name: str | None = Field(None, min_length=1, description="its phase name (default x<multiplier>; the last step: burst)")

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
    kind: Literal["ramp", "stages", "ladder", "spike", "python", "steady", "burst"] = Field(  # "... 'steady' or 'burst'"
        description="steady, burst, ramp, stages, ladder, spike or python")
    multiplier: float | None = Field(None, gt=0, allow_inf_nan=False,
                                     description="burst, spike: x base_rate in the burst window or the spikes")
    from_: float | None = Field(None, alias="from", ge=0, allow_inf_nan=False,
                                description="ramp: the multiplier during warmup (default 1)")
    to: float | None = Field(None, ge=0, allow_inf_nan=False, description="ramp: the multiplier it ends at")
    stages: tuple[StageSpec, ...] | None = Field(None, min_length=1, description="stages: the stages, in order")
    steps: tuple[StepSpec, ...] | None = Field(None, min_length=1, description="ladder: the steps, in order")
    every: float | None = Field(None, gt=0, allow_inf_nan=False, description="spike: seconds between spike starts")
    width: float | None = Field(None, gt=0, allow_inf_nan=False, description="spike: seconds each spike lasts")
    function: str | None = Field(None, min_length=1, description="python: 'module:function', or the function's "
                                 "name with file")
    file: str | None = Field(None, min_length=1, description="python: a .py file (relative to the experiment file)")
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
            assert self.width is not None and self.every is not None     # _SHAPE_NEEDS: a spike needs both
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

    def stage_names(self) -> list[str]:
        """stages: each stage's phase name (its own, else ``stage-N``)."""
        return [s.name or f"stage-{i + 1}" for i, s in enumerate(self.stages or ())]

    def step_names(self) -> list[str]:
        """ladder: each step's phase name (its own, else ``x<multiplier>``, the last unnamed one ``burst``
        unless a step is named so; a generated name that is taken gets ``#2``, ``#3``...)."""
        steps = self.steps or ()
        named_burst = any(s.name == "burst" for s in steps)
        out: list[str] = []
        for i, st in enumerate(steps):
            name = st.name
            if name is None:
                name = "burst" if (i == len(steps) - 1 and not named_burst) else f"x{st.multiplier:g}"
                base, n = name, 2
                while name in out or any(s.name == name for s in steps):
                    name, n = f"{base}#{n}", n + 1
            out.append(name)
        return out

    def step_windows(self, d: "Durations") -> list[tuple[float, float]]:
        """ladder: each step's ``(start, end)`` in seconds of the load, for one profile's durations."""
        w0, w1 = d.warmup, d.warmup + d.burst
        out, end = [], 0.0
        for st in self.steps or ():
            start = end if st.start is None else st.start
            end = start + st.duration
            out.append((w0 + start * d.burst, min(w0 + end * d.burst, w1)))
        return out

    def duplicate_phase(self, d: "Durations") -> str | None:
        """Why the shape's phases (checks and reports look them up by name) are not distinct in a profile with
        durations ``d``, or None. Only stages and ladders name phases after the user's names."""
        if self.kind == "stages":
            names, what = self.stage_names(), "stages"
        elif self.kind == "ladder":
            wins, steps, what = self.step_windows(d), self.step_names(), "ladder"
            names = ["warmup"]
            for i, (a, _) in enumerate(wins):
                if i and a > wins[i - 1][1]:
                    names.append(f"after-{steps[i - 1]}")
                names.append(steps[i])
            if wins[-1][1] < d.total:
                names.append("recovery")
        else:
            return None
        seen: set[str] = set()
        for n in names:
            if n in seen:
                return f"{what}: two phases are named {n!r}; give each a distinct name"
            seen.add(n)
        return None


class Durations(_Frozen):
    """Seconds per phase. steady shapes use ``warmup`` + ``recovery`` only."""
    warmup: float = Field(gt=0, description="seconds of the warmup window")
    burst: float = Field(0, ge=0, description="seconds of the burst window (burst, ramp, ladder, spike need it)")
    recovery: float = Field(0, ge=0, description="seconds of the recovery window")
    drain_timeout: float = Field(120, gt=0, description="after the load, seconds to wait for the stack to drain "
                                 "its backlog")
    fill: float | None = Field(None, gt=0, allow_inf_nan=False,
                               description="burst shapes under base_rate: auto: the burst lasts long enough that "
                               "its backlog passes what fills the stack's memory (observe.fills_at) this many times "
                               "over at the calibrated x1, burst being the shortest it lasts (docs/load.md)")

    @property
    def total(self) -> float:
        return self.warmup + self.burst + self.recovery


def _load_function(function: str | None, file: str | None) -> Any:
    """Import a user shape function: ``module:attr`` or ``attr`` in ``file``; ValueError if it cannot."""
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
        except Exception as e:  # user code
            raise ValueError(f"cannot load python shape file {path}: {type(e).__name__}: {e}") from None
        attr, where = function, str(path)
    else:
        if ":" not in function:
            raise ValueError(f"function must be 'module:function' (or give file: and the function's name), "
                             f"got {function!r}")
        mod, attr = function.split(":", 1)
        try:
            module = importlib.import_module(mod)
        except Exception as e:  # user code
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


#: The step of :class:`monsoon.load.schedule.Schedule` (its default): shapes that vary
#: inside a phase change their rate only on this grid (measured from the
#: phase start).
SCHEDULE_STEP = 0.1
