"""The generator's self-check: was the load that was asked for the load that was sent?

The reasoning, sources and measurements behind it: docs/design.md, "monsoon/checks/load.py"."""
from __future__ import annotations

from monsoon.checks.base import PASS, RunData, UNKNOWN, Verdict
from monsoon.timeline.events import LOAD, OP, OP_LOAD_END


__all__ = ["load_valid", "x1_of"]


def x1_of(meta: dict) -> float | None:
    """The x1 (msg/s) a run's load was built on: its fixed ``base_rate``, or the one ``base_rate: auto``
    resolved to; None when the timeline says neither."""
    fixed = meta.get("base_rate")
    if isinstance(fixed, (int, float)) and not isinstance(fixed, bool):
        return float(fixed)
    auto = meta.get("base_rate_auto")
    got = auto.get("base_rate") if isinstance(auto, dict) else None
    return float(got) if isinstance(got, (int, float)) and not isinstance(got, bool) else None


def _phase_of(t: float, phases: list[dict]) -> str | None:
    return next((p["name"] for p in phases if p["start"] <= t < p["end"]), None)


def _generator(seconds: list[dict], phases: list[dict], sent: int, cpus: int | None) -> dict:
    """The generator's CPU figures from the per-second ``gen_cpu_s`` (empty when it was not measured)."""
    per: dict[str, list[float]] = {}
    for s in seconds:
        if s.get("gen_cpu_s") is None:
            continue
        acc = per.setdefault(_phase_of(s["t"] - 0.5, phases) or "all", [0.0, 0.0])
        acc[0] += float(s["gen_cpu_s"])
        acc[1] += 1
    if not per:
        return {}
    total = sum(c for c, _ in per.values())
    phase, (cpu, n) = max(per.items(), key=lambda kv: kv[1][0] / kv[1][1])
    f: dict = {"gen_cpu_s": round(total, 3), "gen_cores": round(total / sum(n for _, n in per.values()), 3),
               "gen_cores_peak_phase": round(cpu / n, 3), "gen_peak_phase": phase,
               "gen_cpu_us_per_msg": round(total / sent * 1e6, 3) if sent else None}
    if cpus:
        f["cpus"] = cpus
        f["gen_pct_of_machine"] = round(100.0 * f["gen_cores_peak_phase"] / cpus, 1)
    return f


def load_valid(run: RunData, max_late_pct: float = 5.0, max_pacing_error_pct: float = 5.0,
               max_dropped_pct: float = 0.1, warn_generator_pct: float = 25.0,
               max_generator_pct: float = 75.0, during: str = "all") -> Verdict:
    """The generator kept its schedule: late, per-phase pacing error and dropped within limits.

    ``during``: a phase's name (``load.shape`` stages, or warmup/burst/recovery) to judge lateness and pacing in
    that phase alone, the one the experiment's objectives judge.

    On a request/response transport (HTTP, CoAP) a device's sends wait for a free request slot. A send that
    went out late after waiting for a slot the platform held (the ``held`` of the load's seconds) is the
    platform's lateness, not the generator's: it is reported (``held``, ``held_pct``) and not judged, and
    ``late_pct`` counts only the rest. The latency, measured from the intended time, still counts that wait."""
    name = "load_valid"
    ev = run.events
    end = ev.first(OP, op=OP_LOAD_END)
    seconds = list(ev.of(LOAD))
    if end is None or not seconds:
        return Verdict(name, UNKNOWN, {}, "no load totals in the timeline (the load did not run to its end)")
    scheduled, sent = int(end.get("scheduled") or 0), int(end.get("sent") or 0)
    late, dropped = int(end.get("late") or 0), int(end.get("dropped") or 0)
    held = min(late, sum(int(s.get("held") or 0) for s in seconds))
    if scheduled <= 0:
        return Verdict(name, UNKNOWN, {"scheduled": scheduled}, "nothing was scheduled")
    figures: dict[str, float] = {
        "scheduled": scheduled, "sent": sent, "late": late, "dropped": dropped,
        "late_pct": round(100.0 * (late - held) / max(sent, 1), 3),
        "dropped_pct": round(100.0 * dropped / scheduled, 3),
    }
    if held:
        figures["held"] = held
        figures["held_pct"] = round(100.0 * held / max(sent, 1), 3)
    x1 = x1_of(run.meta)
    if x1 is not None:       # the x1 the load was paced from (the side-by-side table shows a fixed one)
        figures["base_rate_msg_s"] = x1
    # per phase: what the generator took off the schedule against what the shape asked for.
    # A load event is written at the end of its second: attribute it to the phase of its middle.
    phases = ev.phases()
    per: dict[str, list[float]] = {}
    for s in seconds:
        ph = _phase_of(s["t"] - 0.5, phases) or "all"
        acc = per.setdefault(ph, [0.0, 0.0, 0.0, 0.0])   # target, scheduled, late (not held), sent
        acc[0] += float(s.get("target_rate") or 0)
        acc[1] += float(s.get("scheduled") or 0)
        acc[2] += max(0.0, float(s.get("late") or 0) - float(s.get("held") or 0))
        acc[3] += float(s.get("sent") or 0)
    worst, worst_err = None, 0.0
    for ph, (target, took, ph_late, ph_sent) in per.items():
        if target < 1:
            continue
        err = 100.0 * abs(took - target) / target
        figures[f"pacing_error_pct_{ph}"] = round(err, 3)
        if ph_sent:
            figures[f"late_pct_{ph}"] = round(100.0 * ph_late / ph_sent, 3)
        if err >= worst_err:
            worst, worst_err = ph, err
    judged = "the load"
    if during != "all":
        if during not in per:
            return Verdict(name, UNKNOWN, figures, f"no phase {during!r} in the load's seconds "
                           f"(phases: {', '.join(sorted(per))})")
        target, took, ph_late, ph_sent = per[during]
        worst = during
        worst_err = 100.0 * abs(took - target) / target if target >= 1 else 0.0
        figures["late_pct"] = round(100.0 * ph_late / max(ph_sent, 1), 3)
        figures["late_pct_all"] = round(100.0 * (late - held) / max(sent, 1), 3)
        judged = f"the {during} phase"
    figures["pacing_error_pct"] = round(worst_err, 3)
    gen = _generator(seconds, phases, sent, int(end.get("cpus") or 0) or None)
    figures.update({k: v for k, v in gen.items() if k != "gen_peak_phase"})
    used = ""
    if gen:
        used = (f"the generator used {gen['gen_cores_peak_phase']:.2f} cores"
                + (f" of {gen['cpus']} ({gen['gen_pct_of_machine']:g}%)" if "cpus" in gen else "")
                + f" in its busiest phase ({gen['gen_peak_phase']})"
                + (f", {gen['gen_cpu_us_per_msg']:g} us of CPU per message" if gen["gen_cpu_us_per_msg"] else ""))
    share = gen.get("gen_pct_of_machine")
    held_note = (f"; {held:,} more ({figures['held_pct']:g}%) left late after waiting for a request slot the "
                 f"platform held (its lateness, not judged)" if held else "")
    problems = []
    if figures["late_pct"] > max_late_pct:
        problems.append(f"{figures['late_pct']:g}% of messages left late (limit {max_late_pct:g}%)"
                        + (f" in {judged}" if during != "all" else ""))
    if worst_err > max_pacing_error_pct:
        problems.append(f"the {worst} phase was paced {worst_err:.1f}% off its target (limit {max_pacing_error_pct:g}%)")
    if figures["dropped_pct"] > max_dropped_pct:
        problems.append(f"{dropped:,} messages ({figures['dropped_pct']:g}%) were due but never sent "
                        f"(limit {max_dropped_pct:g}%)")
    if problems:
        return Verdict(name, UNKNOWN, figures,
                       "invalid load: the generator fell behind its schedule: " + "; ".join(problems)
                       + (f" ({used})" if used else "") + held_note)
    if share is not None and share > max_generator_pct:
        return Verdict(name, UNKNOWN, figures,
                       f"invalid load: {used}: more than {max_generator_pct:g}% of the machine, so the platform "
                       f"under test had what was left of it (limit max_generator_pct={max_generator_pct:g})")
    note = ""
    if used:
        note = f"; {used}"
        if share is not None and share > warn_generator_pct:
            note = (f"; WARNING: {used}, more than {warn_generator_pct:g}% of the machine: a platform on the same "
                    f"machine had that much less CPU")
    return Verdict(name, PASS, figures,
                   "generator kept its schedule"
                   + (f" in {judged} ({figures['late_pct_all']:g}% late over the whole load)"
                      if during != "all" else "")
                   + f": {figures['late_pct']:g}% late, worst phase pacing error "
                   f"{worst_err:.2f}% ({worst}), {dropped:,} dropped{held_note}{note}")

