"""The sign-off checklist (Markdown) and ``summary.json`` of a run.

``summary.json`` has a fixed shape that later tools read::

    {"run_id": str, "profile": str,
     "results": [{"stack": str, "experiment": str, "verdict": "pass"|"fail"|"unknown",
                  "figures": {str: number},      # headline figures lifted from the checks (runner.HEADLINE)
                  "checks": [{"name": str, "verdict": str, "figures": {str: number}}]}]}

(``message`` and ``dir`` ride along on results/checks as extra keys.)
"""
from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from .checks import check_base, combine


class _KeyFigures(dict):
    """Key figures by check; a qualified verdict name (``latency_objective[steady]``) reads its check's entry."""

    def __getitem__(self, name: str):
        return super().__getitem__(check_base(name))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(check_base(name))

    def get(self, name: str, default=None):
        return super().get(check_base(name), default)


KEY_FIGURES = _KeyFigures({
    "no_oom": ("oom_events", "restarts", "heap_headroom_pct"),
    "no_acked_loss": ("acked", "acked_lost", "duplicates"),
    "no_duplicates": ("duplicates",),
    "no_unexpected": ("unexpected",),
    "lag_recovers_within": ("peak_lag", "recovery_s", "predicted_drain_s", "observed_drain_s"),
    "lag_bounded": ("peak_lag", "predicted_drain_s", "observed_drain_s"),
    "consumer_not_stalled": ("worst_status", "stalled_partitions"),
    "error_budget": ("budget_consumed_pct", "worst_burn_rate"),
    "no_memory_leak": ("heap_slope_mb_per_h", "rss_slope_mb_per_h"),
    "gc_time_fraction": ("worst_gc_fraction",),
    "no_thread_leak": ("threads_per_reconnect",),
    "faults_landed": ("faults_injected", "faults_landed", "faults_healed", "max_downtime_s"),
    "throughput_drop": ("throughput_drop_pct", "baseline_msg_s", "during_faults_msg_s"),
    "latency_objective": ("p99_ms", "p50_ms", "samples"),
    "load_valid": ("late_pct", "pacing_error_pct", "dropped"),
})
ICON = {"pass": "PASS", "fail": "FAIL", "unknown": "UNKNOWN"}


def summary(run_id: str, profile: str, results: list[dict]) -> dict:
    return {"run_id": run_id, "profile": profile, "results": results}


def _fmt(v) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.1f}"
    return str(v)


def checklist(summary_: dict) -> str:
    results = summary_["results"]
    overall = combine([r["verdict"] for r in results])
    decision = "GO" if overall == "pass" else "NO-GO"
    lines = [f"# monsoon resilience sign-off — run {summary_['run_id']} ({summary_['profile']} profile)", "",
             f"**Decision: {decision}** — {sum(r['verdict'] == 'pass' for r in results)} of {len(results)} "
             f"experiments pass.", "",
             "| stack | experiment | check | verdict | key figures |", "| --- | --- | --- | --- | --- |"]
    for r in results:
        if r.get("error"):
            lines.append(f"| {r['stack']} | {r['experiment']} | (run) | UNKNOWN | {r['error'][:120]} |")
        for c in r["checks"]:
            keys = KEY_FIGURES.get(c["name"], tuple(c["figures"])[:3])
            figs = ", ".join(f"{k}={_fmt(c['figures'][k])}" for k in keys if k in c["figures"])
            lines.append(f"| {r['stack']} | {r['experiment']} | {c['name']} | {ICON.get(c['verdict'], c['verdict'])} "
                         f"| {figs} |")
    fails = [(r, c) for r in results for c in r["checks"] if c["verdict"] != "pass"]
    if fails:
        lines += ["", "## Evidence", ""]
        for r, c in fails:
            lines.append(f"- **{r['stack']} / {r['experiment']} / {c['name']}** ({c['verdict']}): {c.get('message', '')}")
    return "\n".join(lines) + "\n"


def write(run_dir: Path, run_id: str, profile: str, results: list[dict]) -> tuple[dict, str]:
    """Write summary.json, checklist.md and report.html into ``run_dir``; point runs/latest at it."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    s = summary(run_id, profile, results)
    (run_dir / "summary.json").write_text(json.dumps(s, indent=2))
    md = checklist(s)
    (run_dir / "checklist.md").write_text(md)
    point_latest(run_dir)
    try:  # the HTML report with plots; a plotting failure must never cost the run its summary or checklist
        from . import html_report
        html_report.write(run_dir, s)
    except Exception as e:
        logging.getLogger(__name__).warning("monsoon: report.html not written for %s: %s: %s",
                                            run_dir, type(e).__name__, e, exc_info=True)
    return s, md


def point_latest(run_dir: Path) -> None:
    latest = run_dir.parent / "latest"
    tmp = run_dir.parent / f".latest-{os.getpid()}"
    try:
        if tmp.is_symlink():
            tmp.unlink()
        tmp.symlink_to(run_dir.name)
        os.replace(tmp, latest)
    except OSError:
        pass
