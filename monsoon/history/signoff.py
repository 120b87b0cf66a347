"""The resilience sign-off: a policy (``signoff.yaml``) judged against the history, not the last session.

Per item (an experiment on a stack, in a profile, optionally only some of its checks):

* **GO**: its newest run passed and is younger than ``max_age``;
* **EXPIRED**: its newest run passed, longer than ``max_age`` ago;
* **NO-GO**: its newest run failed or was ``unknown``, or it never ran (never GO).

Score (Gremlin's reliability score, weighted): 100 GO, 75 EXPIRED, 50 failed or unknown, 0 never run;
``score = sum(weight_i * points_i) / sum(weight_i)``. Overall: NO-GO if any item is NO-GO, else EXPIRED if any
is, else GO; valid until the first GO item expires. Exit codes: 0 GO, 1 NO-GO, 3 EXPIRED (2: a bad policy).
"""
from __future__ import annotations

import html
import re
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from pydantic import Field, field_validator

from monsoon.checks.base import combine
from monsoon.history.html import EXTRA_CSS
from monsoon.history.store import EXPERIMENT, Row
from monsoon.report.html import CSS
from monsoon.rundir import REPORT_FILE
from monsoon.spec.base import PROFILES, _Frozen
from monsoon.spec.yamlio import load_located, validate

POINTS = {"GO": 100, "EXPIRED": 75, "FAILED": 50, "NEVER": 0}
EXIT = {"GO": 0, "NO-GO": 1, "EXPIRED": 3}
_AGE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([smhdw]?)\s*$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(v) -> float:
    """``7d``, ``12h``, ``90m``, ``3600`` (seconds) -> seconds."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        seconds = float(v)
    else:
        m = _AGE.match(str(v))
        if not m:
            raise ValueError(f"{v!r} is not an age (a number of seconds, or 30m, 12h, 7d, 2w)")
        seconds = float(m.group(1)) * _UNIT[m.group(2)]
    if seconds <= 0:
        raise ValueError(f"{v!r}: an age must be greater than 0")
    return seconds


class SignoffItem(_Frozen):
    """One line of the sign-off: an experiment that must pass on each of ``stacks``."""
    experiment: str = Field(description="experiment name (experiments/<name>.yaml)")
    stacks: tuple[str, ...] = Field(min_length=1, description="stacks it must pass on (one verdict per stack)")
    profile: str | None = Field(None, description="profile of the runs that count (default: the policy's)")
    checks: tuple[str, ...] = Field((), description="only these checks must pass (default: the experiment's verdict)")
    max_age: float | None = Field(None, description="a passing run older than this is EXPIRED (default: the policy's)")
    weight: float = Field(1.0, gt=0, description="weight in the resilience score")

    @field_validator("max_age", mode="before")
    @classmethod
    def _age(cls, v):
        return None if v is None else parse_age(v)

    @field_validator("profile")
    @classmethod
    def _profile(cls, v):
        if v is not None and v not in PROFILES:
            raise ValueError(f"{v!r}: choose one of {', '.join(PROFILES)}")
        return v


class SignoffPolicy(_Frozen):
    """``signoff.yaml``: what must pass, where, and for how long a pass counts."""
    name: str = Field("resilience sign-off", description="a title for the checklist")
    profile: str = Field("quick", description="default profile of the runs that count")
    max_age: float = Field(7 * 86400, description="default expiry of a passing run (7d, 12h, or seconds)")
    items: tuple[SignoffItem, ...] = Field(min_length=1, description="the experiments that must pass")

    @field_validator("max_age", mode="before")
    @classmethod
    def _age(cls, v):
        return parse_age(v)

    @field_validator("profile")
    @classmethod
    def _profile(cls, v):
        if v not in PROFILES:
            raise ValueError(f"{v!r}: choose one of {', '.join(PROFILES)}")
        return v


def load_policy(path: Path | str) -> SignoffPolicy:
    """Read and validate a policy; a bad one is a SpecError naming the file, the line and the key."""
    return validate(load_located(path), SignoffPolicy)


@dataclass
class ItemResult:
    experiment: str
    stack: str
    profile: str
    state: str               # GO | NO-GO | EXPIRED
    why: str                 # passed | expired | failed | unknown | never run
    points: int
    weight: float
    run: Row | None = None
    checks: dict[str, str] = field(default_factory=dict)
    expires_at: float | None = None

    def evidence(self) -> str:
        if self.run is None:
            return "never run"
        when = _date(self.run.ended_at or self.run.started_at)
        figs = ", ".join(f"{k}={v:g}" if isinstance(v, (int, float)) else f"{k}={v}"
                         for k, v in list(self.run.figures.items())[:6])
        return f"run {self.run.run_id} ({when}){': ' + figs if figs else ''}"

    def link(self) -> str | None:
        return str(Path(self.run.run_dir) / REPORT_FILE) if self.run is not None and self.run.run_dir else None


@dataclass
class Signoff:
    policy: SignoffPolicy
    items: list[ItemResult]
    now: float

    @property
    def decision(self) -> str:
        states = {i.state for i in self.items}
        return "NO-GO" if "NO-GO" in states else "EXPIRED" if "EXPIRED" in states else "GO"

    @property
    def score(self) -> float:
        total = sum(i.weight for i in self.items)
        return round(sum(i.weight * i.points for i in self.items) / total, 1) if total else 0.0

    @property
    def valid_until(self) -> float | None:
        """When the first GO item expires (None unless the decision is GO)."""
        if self.decision != "GO":
            return None
        return min((i.expires_at for i in self.items if i.expires_at is not None), default=None)

    @property
    def exit_code(self) -> int:
        return EXIT[self.decision]


def _date(ts: float | None) -> str:
    return "?" if ts is None else datetime.fromtimestamp(ts, timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def judge(policy: SignoffPolicy, rows: list[Row], now: float | None = None) -> Signoff:
    """Judge every item x stack on the history ``rows``; ``now`` (epoch s) is the clock, injectable."""
    now = time.time() if now is None else now
    items = []
    for it in policy.items:
        profile = it.profile or policy.profile
        max_age = it.max_age or policy.max_age
        for stack in it.stacks:
            runs = sorted((r for r in rows if r.check_name == EXPERIMENT and r.stack == stack
                           and r.experiment == it.experiment and r.profile == profile and r.status == "ran"),
                          key=lambda r: (r.started_at or 0.0, r.run_id))
            if not runs:
                items.append(ItemResult(it.experiment, stack, profile, "NO-GO", "never run", POINTS["NEVER"],
                                        it.weight))
                continue
            run = runs[-1]
            checks: dict[str, str] = {}
            if it.checks:
                mine = {r.check_name: r.verdict for r in rows if r.run_id == run.run_id and r.stack == stack
                        and r.experiment == it.experiment}
                checks = {c: mine.get(c, "unknown") for c in it.checks}   # a check the run lacks is unknown
                verdict = combine(list(checks.values()))
            else:
                verdict = run.verdict
            if verdict != "pass":
                items.append(ItemResult(it.experiment, stack, profile, "NO-GO", verdict if verdict in
                                        ("fail", "unknown") else "unknown", POINTS["FAILED"], it.weight, run, checks))
                continue
            done = run.ended_at or run.started_at or 0.0
            expires = done + max_age
            if now > expires:
                items.append(ItemResult(it.experiment, stack, profile, "EXPIRED", "expired", POINTS["EXPIRED"],
                                        it.weight, run, checks, expires))
            else:
                items.append(ItemResult(it.experiment, stack, profile, "GO", "passed", POINTS["GO"], it.weight, run,
                                        checks, expires))
    return Signoff(policy, items, now)


def markdown(s: Signoff) -> str:
    vu = s.valid_until
    lines = [f"# monsoon {s.policy.name}", "",
             f"**Decision: {s.decision}** — resilience score {s.score:g}/100"
             + (f", valid until {_date(vu)}" if vu else "") + f" (judged {_date(s.now)} from the run history)", "",
             "| experiment | stack | profile | state | why | score | evidence | report |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for i in s.items:
        extra = "; " + ", ".join(f"{c}={v}" for c, v in i.checks.items()) if i.checks else ""
        lines.append(f"| {i.experiment} | {i.stack} | {i.profile} | {i.state} | {i.why} | {i.points} (x{i.weight:g}) "
                     f"| {i.evidence()}{extra} | {i.link() or ''} |")
    lines += ["", "Score: 100 GO, 75 passed but expired, 50 failed or unknown, 0 never run; weighted mean."]
    return "\n".join(lines) + "\n"


def to_html(s: Signoff) -> str:
    def e(x) -> str:
        return html.escape(str(x), quote=True)
    vu = s.valid_until
    cls = {"GO": "go", "NO-GO": "nogo", "EXPIRED": "expired"}
    h = ['<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">', f'<title>monsoon {e(s.policy.name)}</title>',
         f'<style>{CSS}{EXTRA_CSS}</style></head><body>', f'<h1>monsoon {e(s.policy.name)}</h1>',
         f'<div id="decision" class="decision {cls[s.decision]}" data-decision="{e(s.decision)}" '
         f'data-score="{s.score:g}">Decision: {e(s.decision)} — resilience score {s.score:g}/100'
         + (f', valid until {e(_date(vu))}' if vu else "") + '</div>',
         '<table><thead><tr><th>experiment</th><th>stack</th><th>profile</th><th>state</th><th>why</th>'
         '<th>score</th><th>evidence</th></tr></thead><tbody>']
    for i in s.items:
        link = i.link()
        ev = e(i.evidence()) + (f' (<a href="file://{e(link)}">report</a>)' if link else "")
        v = {"GO": "pass", "NO-GO": "fail", "EXPIRED": "unknown"}[i.state]
        h.append(f'<tr data-state="{e(i.state)}"><td>{e(i.experiment)}</td><td>{e(i.stack)}</td>'
                 f'<td>{e(i.profile)}</td><td class="verdict {v}">{e(i.state)}</td><td>{e(i.why)}</td><td>{i.points} (x{i.weight:g})</td>'
                 f'<td>{ev}</td></tr>')
    h.append('</tbody></table><p>Score: 100 GO, 75 passed but expired, 50 failed or unknown, 0 never run; '
             'weighted mean.</p></body></html>')
    return "\n".join(h) + "\n"
