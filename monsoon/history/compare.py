"""Regressions against a baseline run, like pytest-benchmark's ``--benchmark-compare-fail``.

``--monsoon-compare-fail='recovery_s:+20%,peak_lag:+50%,acked_lost:>0'``: each term is ``FIGURE:RULE`` where
RULE is

* ``+P%`` / ``-P%``: a regression when the figure rose (fell) by more than P % of the baseline's value (from a
  baseline of 0, any rise (fall) is one);
* ``+N`` / ``-N``: when it rose (fell) by more than N;
* ``>N`` / ``<N``: when the figure itself is above (below) N, whatever the baseline.

``--monsoon-compare=last|RUN_ID`` picks the baseline: the newest earlier run of the same stack x experiment in
the history, or that run. Only a baseline with the same profile and host class is compared, unless forced.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from monsoon.history.store import EXPERIMENT, Row
from monsoon import options as opt

_TERM = re.compile(r"^\s*([A-Za-z_][\w.\[\]-]*)\s*:\s*([+\-<>])\s*([0-9]+(?:\.[0-9]+)?)\s*(%?)\s*$")


class CompareError(ValueError):
    """A bad --monsoon-compare-fail expression or an incomparable baseline: one line."""


@dataclass(frozen=True)
class Rule:
    figure: str
    op: str          # + - > <
    amount: float
    percent: bool

    def __str__(self) -> str:
        return f"{self.figure}:{self.op}{self.amount:g}{'%' if self.percent else ''}"

    def regressed(self, base: float | None, now: float) -> bool:
        if self.op == ">":
            return now > self.amount
        if self.op == "<":
            return now < self.amount
        if base is None:
            return False
        delta = now - base if self.op == "+" else base - now
        if self.percent:
            return delta > abs(base) * self.amount / 100.0 if base != 0 else delta > 0
        return delta > self.amount


def parse_rules(text: str) -> list[Rule]:
    """``recovery_s:+20%,acked_lost:>0`` -> rules; a bad term is a CompareError naming it."""
    rules = []
    for term in (t for t in text.split(",")):
        if not term.strip():
            raise CompareError(f"{opt.COMPARE_FAIL}: empty term in {text!r}")
        m = _TERM.match(term)
        if not m:
            raise CompareError(f"{opt.COMPARE_FAIL}: {term.strip()!r} is not FIGURE:RULE (RULE: +20%, -10%, "
                               "+5, -5, >0 or <100)")
        fig, op, num, pct = m.groups()
        if pct and op in "<>":
            raise CompareError(f"{opt.COMPARE_FAIL}: {term.strip()!r}: a bound ({op}N) takes no %")
        rules.append(Rule(fig, op, float(num), bool(pct)))
    return rules


def parse_baseline(text: str) -> str:
    text = (text or "").strip()
    if not text:
        raise CompareError(f"{opt.COMPARE}: give last or a run id")
    return text


@dataclass(frozen=True)
class Regression:
    rule: Rule
    stack: str
    experiment: str
    baseline_run: str
    baseline: float | None
    now: float

    def __str__(self) -> str:
        base = "n/a" if self.baseline is None else f"{self.baseline:g}"
        return (f"regression in {self.stack}/{self.experiment}: {self.rule.figure} = {self.now:g} against "
                f"{base} in baseline run {self.baseline_run} (rule {self.rule})")


def pick_baseline(history: list[Row], *, stack: str, experiment: str, run_id: str, profile: str,
                  host_class: str, which: str, force: bool = False) -> tuple[Row | None, str]:
    """The baseline's experiment row, or None and why not. ``history``: rows of that stack x experiment."""
    mine = [r for r in history if r.check_name == EXPERIMENT and r.stack == stack and r.experiment == experiment
            and r.status == "ran" and r.run_id != run_id]
    mine.sort(key=lambda r: (r.started_at or 0.0, r.run_id))
    if which == "last":
        ok = [r for r in mine if force or (r.profile == profile and r.host_class == host_class)]
        if not ok:
            return None, (f"no earlier run of {stack}/{experiment} with profile {profile} on host class {host_class} "
                          "to compare with")
        return ok[-1], ""
    named = [r for r in mine if r.run_id == which]
    if not named:
        raise CompareError(f"{opt.COMPARE}={which}: no run {which!r} of {stack}/{experiment} in the history")
    base = named[-1]
    if not force and (base.profile != profile or base.host_class != host_class):
        raise CompareError(f"{opt.COMPARE}={which}: baseline has profile {base.profile} on {base.host_class}, "
                           f"this run {profile} on {host_class}: not comparable ({opt.FORCE} compares anyway)")
    return base, ""


def compare(rules: list[Rule], baseline: Row, figures: dict, stack: str, experiment: str) -> list[Regression]:
    """The regressions of ``figures`` (this run's headline figures) against the baseline row's."""
    out = []
    for rule in rules:
        now = figures.get(rule.figure)
        if not isinstance(now, (int, float)):
            continue
        base = baseline.figures.get(rule.figure)
        base = float(base) if isinstance(base, (int, float)) else None
        if rule.regressed(base, float(now)):
            out.append(Regression(rule, stack, experiment, baseline.run_id, base, float(now)))
    return out
