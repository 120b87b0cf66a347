"""One experiment on several stacks, side by side (ThingsBoard's Postgres vs Cassandra comparison): per stack its
calibrated capacity, x1, ack latency p50/p99 per load phase, drain time and loss, from a session's results.

Pure functions of ``summary.json``'s results: the checklist (Markdown) and the HTML report both show the table
when a session ran one experiment on two stacks or more. The figures come from the checks:

* capacity: ``calibrated_capacity_msg_s`` (``monsoon calibrate STACK``; a fixed-base_rate run carries its stack's
  saved calibration when there is a usable one), x1: ``base_rate_msg_s`` (a fixed x1, from ``load_valid`` when no
  calibration came with it, says so: "400 msg/s (fixed)");
* ack latency: ``p50_ms.<phase>`` / ``p99_ms.<phase>`` (``latency_objective`` with the fleet's HdrHistograms);
* drain: ``observed_drain_s`` of the Kafka backlog, else ``recovery_s`` of the backlog's recovery;
* loss: ``acked_lost`` of ``acked`` (``no_acked_loss``).
"""
from __future__ import annotations

from collections import defaultdict

PHASE_ORDER = ("warmup", "steady", "burst", "spike", "recovery")


def _figure(result: dict, name: str):
    """A figure of the result: its headline figures first, then the first check that has it."""
    v = (result.get("figures") or {}).get(name)
    if isinstance(v, (int, float)):
        return v
    for c in result.get("checks", []):
        v = (c.get("figures") or {}).get(name)
        if isinstance(v, (int, float)):
            return v
    return None


def phases(results: list[dict]) -> list[str]:
    """The load phases whose ack latency any of the results reports, in load order."""
    seen = {k.split(".", 1)[1] for r in results for c in r.get("checks", []) for k in (c.get("figures") or {})
            if k.startswith("p99_ms.") and isinstance(c["figures"][k], (int, float))}
    return sorted(seen, key=lambda p: (PHASE_ORDER.index(p) if p in PHASE_ORDER else len(PHASE_ORDER), p))


def _x1_fixed(result: dict) -> bool:
    """Whether the result's x1 was a fixed ``base_rate``: its resolved base rate says so (a fixed rate with a
    saved calibration), or it has none and its x1 comes from the load's own check (``load_valid``, from the
    timeline's ``base_rate``): ``base_rate: auto`` always leaves its resolved base rate on the result."""
    resolved = result.get("base_rate")
    if isinstance(resolved, dict):
        return bool(resolved.get("fixed"))
    return not isinstance((result.get("figures") or {}).get("base_rate_msg_s"), (int, float)) and \
        _figure(result, "base_rate_msg_s") is not None


def row(result: dict, phase_names: list[str]) -> dict:
    drain = _figure(result, "observed_drain_s")
    return {"stack": result["stack"], "verdict": result.get("verdict", "unknown"),
            "capacity_msg_s": _figure(result, "calibrated_capacity_msg_s"),
            "base_rate_msg_s": _figure(result, "base_rate_msg_s"), "base_rate_fixed": _x1_fixed(result),
            "latency": {p: (_figure(result, f"p50_ms.{p}"), _figure(result, f"p99_ms.{p}")) for p in phase_names},
            "drain_s": drain if drain is not None else _figure(result, "recovery_s"),
            "drain_kind": "observed_drain_s" if drain is not None else "recovery_s",
            "acked": _figure(result, "acked"), "acked_lost": _figure(result, "acked_lost")}


def groups(results: list[dict]) -> dict[str, list[dict]]:
    """Per experiment that ran on two stacks or more: its results (one per stack, the last one of a stack wins)."""
    per: dict[str, dict[str, dict]] = defaultdict(dict)
    for r in results:
        if not r.get("error") or r.get("checks"):
            per[r["experiment"]][r["stack"]] = r
    return {e: list(by.values()) for e, by in per.items() if len(by) >= 2}


def tables(results: list[dict]) -> dict[str, tuple[list[str], list[dict]]]:
    """Per compared experiment: (phase names, one row per stack)."""
    out = {}
    for exp, rs in groups(results).items():
        ph = phases(rs)
        out[exp] = (ph, [row(r, ph) for r in rs])
    return out


def _n(v, unit: str = "") -> str:
    if v is None:
        return "-"
    return f"{v:,.0f}{unit}" if abs(v) >= 10 or float(v).is_integer() else f"{v:,.1f}{unit}"


def headers(phase_names: list[str]) -> list[str]:
    return (["stack", "verdict", "capacity msg/s", "x1 msg/s"]
            + [f"ack p50 / p99 ms ({p})" for p in phase_names] + ["drain s", "acked lost / acked"])


def cells(r: dict, phase_names: list[str]) -> list[str]:
    lat = [f"{_n(r['latency'][p][0])} / {_n(r['latency'][p][1])}" for p in phase_names]
    drain = _n(r["drain_s"]) + ("" if r["drain_kind"] == "observed_drain_s" or r["drain_s"] is None else " (recovery)")
    x1 = _n(r["base_rate_msg_s"]) + (" msg/s (fixed)" if r.get("base_rate_fixed") and r["base_rate_msg_s"] is not None
                                     else "")
    return ([r["stack"], r["verdict"].upper(), _n(r["capacity_msg_s"]), x1] + lat
            + [drain, f"{_n(r['acked_lost'])} / {_n(r['acked'])}"])


def markdown(results: list[dict]) -> str:
    """The side-by-side section of the checklist ('' when no experiment ran on two stacks)."""
    out = []
    for exp, (ph, rows) in tables(results).items():
        hs = headers(ph)
        out += ["", f"## Side by side: {exp}", "", "| " + " | ".join(hs) + " |", "| " + " | ".join("---" for _ in hs)
                + " |"]
        out += ["| " + " | ".join(cells(r, ph)) + " |" for r in rows]
    return "\n".join(out) + ("\n" if out else "")
