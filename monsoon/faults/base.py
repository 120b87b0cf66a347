"""The fault backend contract, and what every backend hands back.

A backend injects one kind of fault and can always take it back:

* ``inject(fault, ctx) -> Handle``  — do it; the handle remembers what to undo.
* ``heal(handle)``                  — undo it; idempotent, never raises for "already gone".
* ``heal_all(run_id)``              — undo everything of a run, *without* handles (after a crash):
  every backend labels what it changes with the run id so it can be found again.
* ``verify(handle) -> Landing``     — did it land (or, after ``heal``, did the heal land)? Measured evidence.
* ``census(run_id) -> list[str]``   — what of this run is still in place (empty = clean).
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from monsoon.spec.fault import FaultSpec
from monsoon.stack.reaper import check_run_id


_seq = itertools.count(1)


class FaultError(RuntimeError):
    """A fault could not be injected (or healed); the message says why and what to do."""


@dataclass
class FaultContext:
    """What a backend may need about the run: its id, the stack, where to keep state."""
    run_id: str
    stack: Any = None                  # monsoon.stack.supervisor.Stack (or anything with pid(service) / kill(service, sig))
    state_dir: Path | None = None      # crash-safe records (cgroup originals); default: the cache
    out_dir: Path | None = None        # rendered manifests (dry-run)

    def __post_init__(self) -> None:
        check_run_id(self.run_id)


@dataclass
class Handle:
    """One injected fault: enough to heal it and to verify it."""
    fault: FaultSpec
    backend: str
    run_id: str
    data: dict[str, Any] = field(default_factory=dict)
    injected_wall: float = field(default_factory=time.time)
    healed: bool = False
    id: str = ""

    def __post_init__(self) -> None:
        if not self.id:
            self.id = f"{self.run_id}__{self.fault.name}__{next(_seq)}"


@dataclass(frozen=True)
class Landing:
    """Whether a fault (or its heal) took effect, with the measurement that says so.

    ``landed`` is ``None`` when the backend could not measure it (e.g. no probe
    for the protocol); ``evidence`` always says how it was judged (``method``).
    """
    landed: bool | None
    evidence: dict[str, Any]


@runtime_checkable
class FaultBackend(Protocol):
    name: str

    def inject(self, fault: FaultSpec, ctx: FaultContext) -> Handle: ...

    def heal(self, handle: Handle) -> None: ...

    def heal_all(self, run_id: str) -> list[str]: ...

    def verify(self, handle: Handle) -> Landing: ...

    def census(self, run_id: str) -> list[str]: ...


def wait_for(pred, timeout: float, interval: float = 0.05) -> tuple[bool, float]:
    """Poll ``pred`` until true or ``timeout``; returns (ok, seconds waited)."""
    t0 = time.monotonic()
    while True:
        if pred():
            return True, time.monotonic() - t0
        if time.monotonic() - t0 >= timeout:
            return False, time.monotonic() - t0
        time.sleep(interval)
