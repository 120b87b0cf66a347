"""The check registry: the only module that imports every check (pure functions of a saved run -> Verdict).

:data:`CHECKS` is monsoon's own, read-only. A :class:`CheckRegistry` is the built-in checks plus those added to
it: each pytest session builds one (the ``pytest_monsoon_add_checks`` hook registers into it) and every run's
plan carries it, so validating and judging see the same checks and nothing is process-wide. Verdicts are
``pass``, ``fail`` or ``unknown``; fail beats unknown beats pass.
"""
from __future__ import annotations

import inspect
import typing
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable, Iterable, Mapping

from monsoon.checks.base import RunData, UNKNOWN, Verdict
from monsoon.checks.faults import faults_landed, latency_objective, throughput_drop
from monsoon.checks.lag import consumer_not_stalled, lag_bounded, lag_recovers_within
from monsoon.checks.gc import gc_time_below
from monsoon.checks.legs import leg_objective
from monsoon.checks.load import load_valid
from monsoon.checks.loss import no_acked_loss, no_duplicates, no_unexpected
from monsoon.checks.memory import gc_time_fraction, no_memory_leak, no_thread_leak
from monsoon.checks.oom import no_oom, no_unexpected_exit
from monsoon.checks.slo import error_budget
from monsoon.checks.serve import serves_throughout
from monsoon.checks.stall import no_ingest_stall
from monsoon.checks.torn import withhold
from monsoon.timeline.store import Events


_BUILT_IN: dict[str, Callable[..., Verdict]] = {
    "lag_recovers_within": lag_recovers_within,
    "no_acked_loss": no_acked_loss,
    "no_duplicates": no_duplicates,
    "no_unexpected": no_unexpected,
    "no_oom": no_oom,
    "no_unexpected_exit": no_unexpected_exit,
    "lag_bounded": lag_bounded,
    "consumer_not_stalled": consumer_not_stalled,
    "error_budget": error_budget,
    "no_memory_leak": no_memory_leak,
    "gc_time_fraction": gc_time_fraction,
    "gc_time_below": gc_time_below,
    "no_thread_leak": no_thread_leak,
    "faults_landed": faults_landed,
    "throughput_drop": throughput_drop,
    "latency_objective": latency_objective,
    "load_valid": load_valid,
    "no_ingest_stall": no_ingest_stall,
    "serves_throughout": serves_throughout,
    "leg_objective": leg_objective,
}

#: monsoon's own checks, read-only. A session's :class:`CheckRegistry` starts from these.
CHECKS: Mapping[str, Callable[..., Verdict]] = MappingProxyType(_BUILT_IN)


class CheckRegistry:
    """The checks one session (or one ``monsoon analyze``) knows: the built-in ones plus those registered on it.

    Each pytest session builds its own and hands ``register`` to the ``pytest_monsoon_add_checks`` hook; the
    plan of every run carries it, so validation and judging see the same checks and nothing is process-wide."""

    def __init__(self, checks: Mapping[str, Callable[..., Verdict]] | None = None) -> None:
        self._checks: dict[str, Callable[..., Verdict]] = dict(CHECKS if checks is None else checks)

    def __contains__(self, name: object) -> bool:
        return name in self._checks

    def __getitem__(self, name: str) -> Callable[..., Verdict]:
        return self._checks[name]

    def names(self) -> list[str]:
        return sorted(self._checks)

    def register(self, name: str, fn: Callable[..., Verdict]) -> None:
        """Add a check (the ``pytest_monsoon_add_checks`` hook's ``register``): ``fn(run, **params) -> Verdict``."""
        if not name.isidentifier():
            raise ValueError(f"check name {name!r} must be an identifier")
        if self._checks.get(name, fn) is not fn:
            raise ValueError(f"a check named {name!r} exists already")
        if not callable(fn) or not list(inspect.signature(fn).parameters):
            raise ValueError(f"check {name!r} must be a function of the run data: fn(run, **params) -> Verdict")
        self._checks[name] = fn

    def validate(self, name: str, params: dict[str, Any]) -> None:
        """Raise ValueError naming what is wrong with a check reference."""
        if name not in self._checks:
            raise ValueError(f"unknown check {name!r} (known: {', '.join(self.names())})")
        fn = self._checks[name]
        sig = inspect.signature(fn)
        accepted = [p for p in list(sig.parameters)[1:]]
        for k, v in params.items():
            if k not in accepted:
                raise ValueError(f"check {name!r} has no parameter {k!r} (accepts: {', '.join(accepted) or 'none'})")
            default = sig.parameters[k].default
            allowed = literal_values(fn, k)
            if allowed is not None:
                if v not in allowed:
                    raise ValueError(f"check {name!r}: {k} must be one of {', '.join(map(str, allowed))}, got {v!r}")
                continue
            if isinstance(v, str) and (default is None or isinstance(default, str)):
                continue  # a name, e.g. error_budget's phase
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
                raise ValueError(f"check {name!r}: {k} must be a number >= 0, got {v!r}")
        for p in list(sig.parameters.values())[1:]:
            if p.default is inspect.Parameter.empty and p.name not in params:
                raise ValueError(f"check {name!r} needs parameter {p.name!r}")

    def evaluate(self, run_dir: Path, checks: Iterable[tuple[str, dict[str, Any]]],
                 events: Events | None = None) -> list[Verdict]:
        """Every check's verdict on a saved run (``events``: its timeline, when already loaded with
        :meth:`Events.load`).  A verdict that a torn file can overturn is ``unknown`` (:func:`withhold`)."""
        run = RunData(run_dir, events)
        out = []
        for name, params in checks:
            try:
                out.append(withhold(run, name, self._checks[name](run, **params)))
            except Exception as e:  # a broken check must not hide the others
                out.append(Verdict(name, UNKNOWN, {}, f"check crashed: {type(e).__name__}: {e}"))
        return out


BUILT_IN = CheckRegistry()   # what runs outside a session (``monsoon analyze``, ``monsoon validate``) know


def literal_values(fn: Callable, param: str) -> tuple | None:
    """The values a check's parameter may take when it is annotated ``Literal[...]`` (else None)."""
    try:
        hint = typing.get_type_hints(fn).get(param)
    except Exception:          # an annotation that does not resolve: no enumeration to check against
        return None
    return typing.get_args(hint) if typing.get_origin(hint) is typing.Literal else None


def validate_check(name: str, params: dict[str, Any]) -> None:
    """Raise ValueError naming what is wrong with a reference to a built-in check."""
    BUILT_IN.validate(name, params)


def evaluate(run_dir: Path, checks: Iterable[tuple[str, dict[str, Any]]], events: Events | None = None) -> list[Verdict]:
    """The built-in checks' verdicts on a saved run (:meth:`CheckRegistry.evaluate`)."""
    return BUILT_IN.evaluate(run_dir, checks, events)
