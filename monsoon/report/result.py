"""The result of one experiment: its verdicts, its headline figures, and the message a failing test shows.

Nothing here depends on pytest: :meth:`ExperimentResult.assert_pass` raises :class:`RunFailed` (an
AssertionError) or :class:`DryRunSkipped`, which monsoon's pytest plugin turns into a clean failure (no
traceback) or a skip."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monsoon.checks.base import Verdict, check_base, combine
from monsoon.report.checklist import HEADLINE, describe_interruption


class RunFailed(AssertionError):
    """An experiment did not pass; the message carries every check's verdict and numbers."""


class DryRunSkipped(Exception):
    """``assert_pass`` after a dry run: nothing was started, so there is nothing to judge."""


class StackUnavailable(Exception):
    """``monsoon.run(..., skip_unavailable=True)`` on a stack whose ``requires`` are missing (a part that set-up
    cannot fetch, such as ThingsBoard's jar): the plugin reports it as a skip, in one line."""


class RunInterrupted(KeyboardInterrupt):
    """A SIGINT/SIGTERM stopped the session during (or right after) a run, once everything was torn down.

    ``result`` is the run's result, judged over the data that exists; ``interruption`` is
    ``{"signal", "t", "stage"[, "phase"]}``. When the signal came while the checks ran, they finished and
    ``result`` is whole (its ``interrupted`` is None); otherwise ``result.interrupted`` is set and its
    verdict is unknown."""

    def __init__(self, result: "ExperimentResult", interruption: dict):
        super().__init__(f"monsoon: {describe_interruption(interruption)}")
        self.result, self.interruption = result, interruption
        self.signal = interruption.get("signal")




@dataclass
class ExperimentResult:
    stack: str
    experiment: str
    profile: str
    dir: Path
    checks: list[Verdict] = field(default_factory=list)
    error: str | None = None
    dry_run: str | None = None      # the plan that a dry run printed instead of running
    base_rate: dict | None = None   # base_rate: auto: how x1 was resolved (monsoon.run.calibrate)
    interrupted: dict | None = None  # a signal cut the run short: {"signal", "t", "stage"[, "phase"]}
    platform: dict | None = None    # what the running platform said it is (observe.facts): version, queue...

    @property
    def verdict(self) -> str:
        if self.dry_run is not None:
            return "skipped"
        return combine([c.verdict for c in self.checks] + (["unknown"] if self.error or self.interrupted else []))

    def headline(self) -> dict[str, float]:
        """The experiment's key figures, lifted from its checks (first check that has each wins)."""
        out: dict[str, float] = {}
        for key in HEADLINE:
            v = next((c.figures[key] for c in self.checks if key in c.figures), None)
            if v is not None:
                out[key] = v
        return out

    def to_dict(self) -> dict:
        d: dict[str, Any] = {"stack": self.stack, "experiment": self.experiment, "verdict": self.verdict,
             "figures": self.headline(), "checks": [c.to_dict() for c in self.checks], "dir": str(self.dir)}
        if self.error:
            d["error"] = self.error
        if self.interrupted:   # the checks judged a run cut short: their verdicts are over partial data
            d["interrupted"] = dict(self.interrupted)
            d["partial"] = True
        if self.base_rate:   # base_rate: auto: the resolved x1, the capacity and fraction it came from
            d["figures"].update({k: self.base_rate[x] for k, x in (("base_rate_msg_s", "base_rate"),
                                 ("calibrated_capacity_msg_s", "capacity_msg_s"), ("base_fraction", "fraction"))
                                 if self.base_rate.get(x) is not None})
            d["base_rate"] = self.base_rate
        if self.platform:
            d["platform"] = dict(self.platform)
        return d

    def check(self, name: str) -> Verdict:
        """The verdict of one check by name (KeyError naming the checks there are).

        An exact name wins; otherwise the verdicts whose base name is ``name`` (``latency_objective``
        finds ``latency_objective[steady]``): one is returned as is, several are composed into one
        (fail > unknown > pass; the worst one's figures, every one's figures as ``key[phase]``)."""
        for c in self.checks:
            if c.name == name:
                return c
        same = [c for c in self.checks if check_base(c.name) == name]
        if len(same) == 1:
            return same[0]
        if same:
            worst = combine([c.verdict for c in same])
            first = next(c for c in same if c.verdict == worst)
            figures = dict(first.figures)
            for c in same:
                figures.update({f"{k}[{c.name[len(name) + 1:-1]}]": v for k, v in c.figures.items()})
            parts = [f"{c.name}: {c.verdict}" + (f" ({c.message})" if c.message else "") for c in same]
            return Verdict(name, worst, figures, "; ".join(parts))
        raise KeyError(f"no check {name!r} in {self.stack}/{self.experiment} (has: {', '.join(c.name for c in self.checks)})")

    def assert_pass(self) -> None:
        """Fail the calling test with the numbers unless every check passed (skip it after a dry run):
        raises :class:`RunFailed` or :class:`DryRunSkipped` (the pytest plugin reports them as such)."""
        if self.dry_run is not None:
            raise DryRunSkipped(f"dry run of {self.stack}/{self.experiment}: nothing was started")
        if self.verdict != "pass":
            raise RunFailed(self.failure_message())

    def failure_message(self) -> str:
        lines = [f"{self.stack} / {self.experiment} ({self.profile}): {self.verdict.upper()}"]
        if self.error:
            lines.append(f"  error: {self.error}")
        for c in self.checks:
            figs = ", ".join(f"{k}={v:g}" if isinstance(v, (int, float)) else f"{k}={v}"
                             for k, v in c.figures.items())
            lines.append(f"  {c.verdict.upper():7} {c.name}: {c.message} [{figs}]")
        lines.append(f"  run directory: {self.dir}")
        return "\n".join(lines)
