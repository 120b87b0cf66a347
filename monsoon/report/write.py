"""Write a run's report: ``summary.json``, ``checklist.md`` and ``report.html``."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from monsoon.report import html as html_report
from monsoon.report.checklist import checklist, summary
from monsoon.rundir import CHECKLIST_FILE, SUMMARY_FILE, point_latest


def write(run_dir: Path, run_id: str, profile: str, results: list[dict], events: dict | None = None,
          interrupted: dict | None = None) -> tuple[dict, str]:
    """Write summary.json, checklist.md and report.html into ``run_dir``; point runs/latest at it.
    ``events``: the experiments' timelines already loaded, by experiment directory (read once per analysis);
    ``interrupted``: the signal that stopped the session (``{"stack", "experiment", "signal", "t", ...}``)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    s = summary(run_id, profile, results, interrupted)
    (run_dir / SUMMARY_FILE).write_text(json.dumps(s, indent=2))
    md = checklist(s)
    (run_dir / CHECKLIST_FILE).write_text(md)
    point_latest(run_dir)
    try:  # the HTML report with plots; a plotting failure must never cost the run its summary or checklist
        html_report.write(run_dir, s, events)
    except Exception as e:
        logging.getLogger(__name__).warning("monsoon: report.html not written for %s: %s: %s",
                                            run_dir, type(e).__name__, e, exc_info=True)
    return s, md
