"""What the history says, as pure functions of its rows: the verdict strip per stack x experiment, the trend of
key figures, flaky checks, and the first run where a check started failing."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass

from monsoon.history.store import EXPERIMENT, Row

# the figures a trend follows (summary.json headline names): recovery, lag, loss, capacity, error budget spent
TREND_FIGURES = ("recovery_s", "peak_lag", "acked_lost", "calibrated_capacity_msg_s", "budget_consumed_pct")
STRIP_CHAR = {"pass": "P", "fail": "F", "unknown": "?", "skipped": "s", "missed": "m", "info": "i"}


def _by_run(rows: list[Row]) -> list[Row]:
    return sorted(rows, key=lambda r: (r.started_at or 0.0, r.run_id))


def experiments(rows: list[Row]) -> dict[tuple[str, str], list[Row]]:
    """The experiment rows (check ``*``) per (stack, experiment), oldest run first."""
    out: dict[tuple[str, str], list[Row]] = defaultdict(list)
    for r in rows:
        if r.check_name == EXPERIMENT:
            out[(r.stack, r.experiment)].append(r)
    return {k: _by_run(v) for k, v in sorted(out.items())}


def strip(rows: list[Row], last: int = 20) -> dict[tuple[str, str], list[Row]]:
    """Per (stack, experiment) its last ``last`` experiment rows, oldest first."""
    return {k: v[-last:] for k, v in experiments(rows).items()}


def strip_text(runs: list[Row]) -> str:
    return "".join(STRIP_CHAR.get(r.verdict, "?") for r in runs)


def trend(rows: list[Row], figures: tuple[str, ...] = TREND_FIGURES, last: int = 20) \
        -> dict[tuple[str, str], dict[str, list[tuple[str, float]]]]:
    """Per (stack, experiment), per figure that any of its runs has: [(run_id, value)], oldest first."""
    out = {}
    for key, runs in strip(rows, last).items():
        series = {f: [(r.run_id, float(r.figures[f])) for r in runs if isinstance(r.figures.get(f), (int, float))]
                  for f in figures}
        out[key] = {f: s for f, s in series.items() if s}
    return out


@dataclass(frozen=True)
class Flip:
    stack: str
    experiment: str
    check: str
    from_run: str
    to_run: str
    from_verdict: str
    to_verdict: str
    commit: str | None


def per_check(rows: list[Row]) -> dict[tuple[str, str, str], list[Row]]:
    """The check rows of runs that ran, per (stack, experiment, check), oldest run first."""
    per: dict[tuple[str, str, str], list[Row]] = defaultdict(list)
    for r in rows:
        if r.check_name != EXPERIMENT and r.status == "ran":
            per[(r.stack, r.experiment, r.check_name)].append(r)
    return {k: _by_run(v) for k, v in sorted(per.items())}


def flaky(rows: list[Row]) -> list[Flip]:
    """Verdict flips (pass <-> fail) between consecutive runs of a check with the same commit and stack file:
    nothing changed but the verdict did."""
    out = []
    for (stack, exp, check), runs in per_check(rows).items():
        runs = [r for r in runs if r.verdict in ("pass", "fail")]
        for a, b in zip(runs, runs[1:]):
            if a.verdict != b.verdict and a.git_commit == b.git_commit and a.stack_sha256 == b.stack_sha256:
                out.append(Flip(stack, exp, check, a.run_id, b.run_id, a.verdict, b.verdict, b.git_commit))
    return out


@dataclass(frozen=True)
class FirstFailure:
    stack: str
    experiment: str
    check: str
    run_id: str             # the first run of the failing streak that is still going on
    commit: str | None
    started_at: float | None
    last_pass_run: str | None
    last_pass_commit: str | None
    failing_runs: int


def first_failing(rows: list[Row]) -> list[FirstFailure]:
    """For every check whose latest verdict is ``fail``: the run where this failing streak began (its commit), and
    the last passing run before it (``unknown`` runs inside the streak do not end it)."""
    out = []
    for (stack, exp, check), runs in per_check(rows).items():
        decided = [r for r in runs if r.verdict in ("pass", "fail")]
        if not decided or decided[-1].verdict != "fail":
            continue
        i = len(decided) - 1
        while i > 0 and decided[i - 1].verdict == "fail":
            i -= 1
        first, prev = decided[i], (decided[i - 1] if i > 0 else None)
        out.append(FirstFailure(stack, exp, check, first.run_id, first.git_commit, first.started_at,
                                prev.run_id if prev else None, prev.git_commit if prev else None,
                                len(decided) - i))
    return out


def as_json(rows: list[Row], last: int = 20) -> dict:
    """Everything ``monsoon history --json`` prints."""
    return {
        "experiments": [{"stack": s, "experiment": e, "strip": strip_text(runs),
                         "runs": [{"run_id": r.run_id, "verdict": r.verdict, "status": r.status,
                                   "started_at": r.started_at, "profile": r.profile, "git_commit": r.git_commit,
                                   "message": r.message, "run_dir": r.run_dir} for r in runs],
                         "trend": {f: [{"run_id": rid, "value": v} for rid, v in series]
                                   for f, series in trend(rows, last=last).get((s, e), {}).items()}}
                        for (s, e), runs in strip(rows, last).items()],
        "flaky": [asdict(f) for f in flaky(rows)],
        "first_failing": [asdict(f) for f in first_failing(rows)],
    }


def _num(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 100 or float(v).is_integer() else f"{v:,.2f}"


def as_text(rows: list[Row], last: int = 20) -> str:
    """The strips (P pass, F fail, ? unknown, s skipped, m missed; oldest left), the trends, flaky checks and
    first failures, for a terminal."""
    lines = [f"monsoon history: last {last} runs per stack x experiment (P pass, F fail, ? unknown, s skipped, "
             "m missed; oldest first)", ""]
    tr = trend(rows, last=last)
    for (s, e), runs in strip(rows, last).items():
        lines.append(f"{s} / {e}: {strip_text(runs)}  (latest {runs[-1].run_id}: {runs[-1].verdict.upper()})")
        for f, series in tr.get((s, e), {}).items():
            lines.append(f"    {f}: " + " -> ".join(_num(v) for _, v in series))
    fl = flaky(rows)
    lines += ["", f"flaky checks (verdict flipped with no change of commit or stack file): {len(fl) or 'none'}"]
    for flip in fl:
        lines.append(f"  {flip.stack} / {flip.experiment} / {flip.check}: {flip.from_verdict} in {flip.from_run} -> "
                     f"{flip.to_verdict} in {flip.to_run} (commit {(flip.commit or '?')[:12]})")
    ff = first_failing(rows)
    lines += ["", f"failing now, and since when: {len(ff) or 'none'}"]
    for ff_ in ff:
        since = (f" (last pass {ff_.last_pass_run}, commit {(ff_.last_pass_commit or '?')[:12]})"
                 if ff_.last_pass_run else " (never passed)")
        lines.append(f"  {ff_.stack} / {ff_.experiment} / {ff_.check}: failing since {ff_.run_id}, commit "
                     f"{(ff_.commit or '?')[:12]}, {ff_.failing_runs} failing run(s){since}")
    return "\n".join(lines) + "\n"
