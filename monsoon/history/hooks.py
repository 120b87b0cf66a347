"""What a session does with the history: record each result as soon as it is judged (the plugin's
``pytest_monsoon_result``), compare it with a baseline (``--monsoon-compare``), and refresh the history page.

A history that cannot be written (a Postgres that is down) costs the run a warning, never its result."""
from __future__ import annotations

import logging
from pathlib import Path

from monsoon.history import html as history_html
from monsoon.history.compare import CompareError, Rule, compare, pick_baseline
from monsoon.history.record import host_class, record_results
from monsoon.history.store import HistoryStore, default_location
from monsoon import options as opt

log = logging.getLogger(__name__)


def record(runs_dir: Path, run_id: str, profile: str, results: list[dict], run_dir: Path) -> str | None:
    """Upsert results' rows (a session's as each is judged, ``monsoon analyze``'s all at once) and rewrite
    ``<runs>/history.html``; returns a warning, or None."""
    try:
        with HistoryStore(default_location(runs_dir)) as store:
            record_results(store, run_id, profile, results, run_dir)
            rows = store.rows()
        history_html.write(Path(runs_dir) / history_html.HISTORY_PAGE, rows)
    except Exception as e:   # the history is a record of the run, never a reason to lose it
        log.warning("monsoon: run history not written: %s: %s", type(e).__name__, e, exc_info=True)
        return f"monsoon: run history not written: {type(e).__name__}: {e}"
    return None


def regressions(runs_dir: Path, run_id: str, result: dict, profile: str, which: str, rules: list[Rule],
                force: bool = False) -> tuple[list[str], str]:
    """(one line per regression, a note when nothing could be compared) for ``result`` against its baseline."""
    with HistoryStore(default_location(runs_dir)) as store:
        rows = store.rows(stack=result["stack"], experiment=result["experiment"])
    base, why = pick_baseline(rows, stack=result["stack"], experiment=result["experiment"], run_id=run_id,
                              profile=profile, host_class=host_class(), which=which, force=force)
    if base is None:
        return [], why
    return [str(r) for r in compare(rules, base, result.get("figures", {}), result["stack"], result["experiment"])], ""


def check_regressions(runs_dir: Path, run_id: str, results: list, which: str, rules: list[Rule], *,
                      force: bool = False, note=lambda s: None) -> list[str]:
    """Every regression of a test's results (:class:`~monsoon.report.result.ExperimentResult`) against their
    baselines; ``note`` hears when there was nothing to compare with. Raises CompareError (one line)."""
    found = []
    for r in results:
        if r.verdict == "skipped":
            continue
        lines, why = regressions(runs_dir, run_id, r.to_dict(), r.profile, which, rules, force=force)
        found += lines
        if why:
            note(f"monsoon: {opt.COMPARE}: {why}")
    return found


__all__ = ["CompareError", "check_regressions", "record", "regressions"]
