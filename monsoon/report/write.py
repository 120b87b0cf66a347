"""Write a run's report: ``summary.json``, ``checklist.md`` and ``report.html``."""
from __future__ import annotations

import json
import logging
from pathlib import Path

from monsoon.report import html as html_report
from monsoon.report.checklist import checklist, faults_section, summary
from monsoon.rundir import CHECKLIST_FILE, REPORT_FILE, SUMMARY_FILE, TIMELINE_FILE, point_latest
from monsoon.timeline.store import Events


def with_faults(results: list[dict], events: dict) -> list[dict]:
    """Each result whose fault plan ran under a chaos engine that gives its own verdict (Litmus) with its ``faults``
    section, every window of it (a run without one keeps the summary's shape as it was); the timelines read here
    are added to ``events`` (the HTML report reads them again otherwise)."""
    out = []
    for r in results:
        d = r.get("dir")
        if not d or not any(c.get("name") == "faults_landed" for c in r.get("checks") or []):
            out.append(r)
            continue
        key = Path(d).resolve()
        try:
            ev = events.get(key)
            if ev is None and (Path(d) / TIMELINE_FILE).exists():
                ev = events[key] = Events.load(Path(d) / TIMELINE_FILE)
            faults = faults_section(ev) if ev is not None else []
        except Exception as e:   # a torn timeline costs the section, never the summary
            logging.getLogger(__name__).warning("monsoon: no faults section for %s: %s: %s", d, type(e).__name__, e)
            faults = []
        out.append({**r, "faults": faults} if any("chaosresult" in f for f in faults) else r)
    return out


def write(run_dir: Path, run_id: str, profile: str, results: list[dict], events: dict | None = None,
          interrupted: dict | None = None) -> tuple[dict, str]:
    """Write summary.json, checklist.md and report.html into ``run_dir``; point runs/latest at it.
    ``events``: the experiments' timelines already loaded, by experiment directory (read once per analysis);
    ``interrupted``: the signal that stopped the session (``{"stack", "experiment", "signal", "t", ...}``)."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    events = {Path(k).resolve(): v for k, v in (events or {}).items()}
    s = summary(run_id, profile, with_faults(results, events), interrupted)
    (run_dir / SUMMARY_FILE).write_text(json.dumps(s, indent=2))
    md = checklist(s)
    (run_dir / CHECKLIST_FILE).write_text(md)
    point_latest(run_dir)
    try:  # the HTML report with plots; a plotting failure must never cost the run its summary or checklist
        html_report.write(run_dir, s, events)
    except Exception as e:
        logging.getLogger(__name__).warning("monsoon: %s not written for %s: %s: %s", REPORT_FILE,
                                            run_dir, type(e).__name__, e, exc_info=True)
    return s, md
