"""The sign-off checklist (Markdown) and ``summary.json`` of a run.

``summary.json`` has a fixed shape that later tools read::

    {"run_id": str, "profile": str,
     "results": [{"stack": str, "experiment": str, "verdict": "pass"|"fail"|"unknown",
                  "figures": {str: number},      # headline figures lifted from the checks (:data:`HEADLINE`)
                  "checks": [{"name": str, "verdict": str, "figures": {str: number}}]}]}

(``message`` and ``dir`` ride along on results/checks as extra keys; a result whose faults ran under a chaos
engine with a verdict of its own (Litmus) also carries ``faults``: one entry per window, :func:`faults_section`.)
"""
from __future__ import annotations

from typing import Any

from monsoon.checks.base import check_base, combine
from monsoon.report import sidebyside
from monsoon.timeline.views import fault_windows


class _KeyFigures(dict):
    """Key figures by check; a qualified verdict name (``latency_objective[steady]``) reads its check's entry."""

    def __getitem__(self, name: str):
        return super().__getitem__(check_base(name))

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and super().__contains__(check_base(name))

    def get(self, name: str, default=None):
        return super().get(check_base(name), default)


# The one list of key figures. Per check, in checklist order: (figure, where it is shown): "both" = in the
# checklist's row and among the summary's per-experiment headline figures (summary.json "figures"),
# "checklist" = in the row only, "headline" = among the headline figures only.
FIGURES: dict[str, tuple[tuple[str, str], ...]] = {
    "no_oom": (("oom_events", "both"), ("restarts", "checklist"), ("heap_headroom_pct", "both")),
    "no_unexpected_exit": (("unexpected_exits", "both"), ("restarts", "checklist"), ("injected_kills", "checklist")),
    "no_acked_loss": (("acked", "both"), ("acked_lost", "both"), ("stored_late", "both"), ("duplicates", "both")),
    "no_duplicates": (("duplicates", "checklist"),),
    "no_unexpected": (("unexpected", "checklist"),),
    "lag_recovers_within": (("peak_lag", "both"), ("recovery_s", "both"), ("predicted_drain_s", "both"),
                            ("observed_drain_s", "both")),
    "lag_bounded": (("peak_lag", "checklist"), ("predicted_drain_s", "checklist"), ("observed_drain_s", "checklist")),
    "consumer_not_stalled": (("worst_status", "checklist"), ("stalled_partitions", "checklist")),
    "error_budget": (("budget_consumed_pct", "both"), ("worst_burn_rate", "checklist")),
    "no_memory_leak": (("heap_slope_mb_per_h", "checklist"), ("rss_slope_mb_per_h", "checklist")),
    "gc_time_fraction": (("worst_gc_fraction", "checklist"),),
    "gc_time_below": (("gc_over_s", "checklist"), ("worst_gc_fraction", "checklist")),
    "no_thread_leak": (("threads_per_reconnect", "checklist"),),
    "faults_landed": (("faults_injected", "both"), ("faults_landed", "both"), ("faults_healed", "both"),
                      ("faults_left_in_place", "headline"), ("max_downtime_s", "both")),
    "throughput_drop": (("throughput_drop_pct", "both"), ("baseline_msg_s", "checklist"),
                        ("during_faults_msg_s", "checklist")),
    "latency_objective": (("p99_ms", "checklist"), ("p50_ms", "checklist"), ("samples", "checklist")),
    "load_valid": (("late_pct", "both"), ("pacing_error_pct", "both"), ("dropped", "checklist")),
}
KEY_FIGURES = _KeyFigures({check: tuple(f for f, where in rows if where != "headline")
                           for check, rows in FIGURES.items()})
# summary.json: per experiment, these figures of its checks side by side (the first check that has one wins)
HEADLINE = tuple(dict.fromkeys(f for rows in FIGURES.values() for f, where in rows if where != "checklist"))
ICON = {"pass": "PASS", "fail": "FAIL", "unknown": "UNKNOWN", "info": "INFO"}


def summary(run_id: str, profile: str, results: list[dict], interrupted: dict | None = None) -> dict:
    """``interrupted`` (the signal that stopped the session) defaults to the one a result carries."""
    if interrupted is None:
        interrupted = next(({"stack": r["stack"], "experiment": r["experiment"], **r["interrupted"]}
                            for r in results if r.get("interrupted")), None)
    s: dict[str, Any] = {"run_id": run_id, "profile": profile, "results": results}
    if interrupted:
        s["interrupted"] = interrupted
    return s


# what a chaos engine's own verdict is worth, said wherever it is shown
ENGINE_CAVEAT = {"litmus": "evidence, not proof: Litmus sets its verdict to Pass right after injecting, before its "
                           "own post-checks; monsoon judges the fault by its effect"}


def faults_section(events) -> list[dict]:
    """summary.json's ``faults`` of one experiment (``events``: its timeline): per window its name, kind, target,
    whether it landed and healed, and a chaos engine's own word when there is one (Litmus's ChaosResult: its
    ``phase`` and ``verdict`` at the inject's check and just before the heal, with :data:`ENGINE_CAVEAT`)."""
    out = []
    for w in fault_windows(events):
        f: dict[str, Any] = {"name": w.name, "window": w.window, "kind": w.kind, "target": w.target,
                             "landed": w.landed, "healed": w.healed}
        at_inject, at_heal = w.evidence.get("chaosresult"), w.heal_evidence.get("chaosresult")
        if isinstance(at_inject, dict) or isinstance(at_heal, dict):
            f["engine"] = "litmus"
            f["chaosresult"] = {k: v for k, v in (("at_inject", at_inject), ("at_heal", at_heal))
                                if isinstance(v, dict)}
            last = at_heal if isinstance(at_heal, dict) else at_inject
            assert isinstance(last, dict)     # one of the two is (the branch's condition)
            f["chaosresult"].update({k: last.get(k) for k in ("name", "phase", "verdict", "fail_step")
                                     if last.get(k) is not None})
            f["caveat"] = ENGINE_CAVEAT["litmus"]
        out.append(f)
    return out


def _fault_lines(results: list[dict]) -> list[str]:
    rows = [(r, f) for r in results for f in r.get("faults") or []]
    if not rows:
        return []
    yes = {True: "yes", False: "no", None: "not measured"}
    lines = ["", "## Faults", ""]
    for r, f in rows:
        line = (f"- {r['stack']} / {r['experiment']}: {f['name']}#{f['window']} ({f['kind']} on {f['target']}): "
                f"landed {yes[f.get('landed')]}, healed {yes[f.get('healed')]}")
        cr = f.get("chaosresult")
        if cr:
            line += (f"; Litmus ChaosResult {cr.get('name', '?')}: phase {cr.get('phase') or '?'}, verdict "
                     f"{cr.get('verdict') or '?'}" + (f", failStep {cr['fail_step']}" if cr.get("fail_step") else "")
                     + f" ({f.get('caveat', '')})")
        lines.append(line)
    return lines


def describe_interruption(i: dict) -> str:
    """``interrupted by SIGTERM at t=42s (load phase burst)``."""
    where = f"load phase {i['phase']}" if i.get("phase") else str(i.get("stage", "?"))
    return f"interrupted by {i.get('signal', '?')} at t={float(i.get('t', 0)):.0f}s ({where})"


def _fmt(v) -> str:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.1f}"
    return str(v)


def platform_line(platform: dict | None) -> str:
    """``version=4.2.1, queue=kafka, ts_database=sql``: what the running platform said it is (observe.facts)."""
    return ", ".join(f"{k}={v}" for k, v in (platform or {}).items())


def checklist(summary_: dict) -> str:
    results = summary_["results"]
    overall = combine([r["verdict"] for r in results])
    decision = "GO" if overall == "pass" else "NO-GO"
    stopped = summary_.get("interrupted")
    if stopped:
        decision = "NO-GO"
    lines = [f"# monsoon resilience sign-off — run {summary_['run_id']} ({summary_['profile']} profile)", "",
             f"**Decision: {decision}** — {sum(r['verdict'] == 'pass' for r in results)} of {len(results)} "
             f"experiments pass" + (f"; the session was {describe_interruption(stopped)} in {stopped.get('stack')} / "
                                    f"{stopped.get('experiment')}, so it is incomplete" if stopped else "") + ".", "",
             "| stack | experiment | check | verdict | key figures |", "| --- | --- | --- | --- | --- |"]
    for r in results:
        if r.get("error"):
            lines.append(f"| {r['stack']} | {r['experiment']} | (run) | UNKNOWN | {r['error'][:120]} |")
        if r.get("interrupted"):
            lines.append(f"| {r['stack']} | {r['experiment']} | (run) | UNKNOWN | {describe_interruption(r['interrupted'])}: "
                         f"the checks below judged the data up to then (partial) |")
        part = " (partial)" if r.get("partial") else ""
        for c in r["checks"]:
            keys = KEY_FIGURES.get(c["name"], tuple(c["figures"])[:3])
            figs = ", ".join(f"{k}={_fmt(c['figures'][k])}" for k in keys if k in c["figures"])
            lines.append(f"| {r['stack']} | {r['experiment']} | {c['name']} | {ICON.get(c['verdict'], c['verdict'])}"
                         f"{part} | {figs} |")
    loads = [(r, (r.get("base_rate") or {}).get("x1")) for r in results]
    if any(x for _, x in loads):   # the load is relative to what the stack can take: say how x1 was chosen
        lines += ["", "## Load (x1, relative to the capacity measured on this machine)", ""]
        lines += [f"- {r['stack']} / {r['experiment']}: {x}" for r, x in loads if x]
    said = {r["stack"]: platform_line(r.get("platform")) for r in results if r.get("platform")}
    if said:   # a verdict is about the platform that ran: its own word on what it is
        lines += ["", "## Platforms under test (as they said when they ran)", ""]
        lines += [f"- {stack}: {line}" for stack, line in said.items()]
    lines += _fault_lines(results)
    side = sidebyside.markdown(results)   # one experiment on several stacks: their figures next to each other
    if side:
        lines += side.rstrip("\n").split("\n")
    fails = [(r, c) for r in results for c in r["checks"] if c["verdict"] != "pass"]
    if fails:
        lines += ["", "## Evidence", ""]
        for r, c in fails:
            lines.append(f"- **{r['stack']} / {r['experiment']} / {c['name']}** ({c['verdict']}): {c.get('message', '')}")
    return "\n".join(lines) + "\n"


