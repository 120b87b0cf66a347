"""The generator's self-check: was the load that was asked for the load that was sent?

``load_valid`` is added to every experiment (like ``faults_landed`` to every experiment with faults).
An open-model generator that falls behind its schedule measures a gentler load than the one the
experiment names: its verdict must not read as a pass.  It reads the fleet's per-second ``load``
events and its ``load-end`` totals from the timeline:

* **late**: messages handed to the socket more than the fleet's tolerance after their intended time.
  The fleet's sockets never block it (a stalled server fills buffers, and a dead one refuses: those
  count ``failed``), so lateness measures the generator itself: CPU starvation, a slow payload,
  a GC pause of its own;
* **pacing error** per phase: |messages taken off the schedule - target| / target, where the target
  sums the per-second ``target_rate``: what the schedule asks for in that second (the integral of
  its rate over ``[s, s+1)``, :meth:`monsoon.load.schedule.Schedule.expected_per_second`), so a generator
  that keeps its schedule is on target on a ramp or a spike too;
* **dropped**: messages whose time came but that were never sent (a run stopped early).
* **the generator's CPU**: the per-second ``gen_cpu_s`` (CPU seconds the generator used in that second)
  against the machine's CPUs (``cpus`` in ``load-end``): cores busy in its busiest phase and CPU per
  message sent. Every verdict says it ("the generator used 0.31 cores of 2"). On a machine the generator
  shares with the platform, every core it takes is one the platform does not have: above
  ``warn_generator_pct`` (25 %) of the machine the message carries a warning with the numbers, and above
  ``max_generator_pct`` (75 %) the verdict is ``unknown``: the platform was measured on a quarter of the
  machine or less, so its capacity figures describe the generator's leftovers. Between the two the verdict
  stands (testing on one machine always costs some CPU, and the figures let the reader weigh it); a
  generator on another machine (a Kubernetes Job) reports no ``gen_cpu_s`` and is not judged on it.

Any of them above its limit gives ``unknown`` with the reason "invalid load", never ``pass``.
"""
from __future__ import annotations

from monsoon.checks.base import PASS, RunData, UNKNOWN, Verdict


__all__ = ["load_valid"]


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
               max_generator_pct: float = 75.0) -> Verdict:
    """The generator kept its schedule: late, per-phase pacing error and dropped within limits."""
    name = "load_valid"
    ev = run.events
    end = ev.first("op", op="load-end")
    seconds = list(ev.of("load"))
    if end is None or not seconds:
        return Verdict(name, UNKNOWN, {}, "no load totals in the timeline (the load did not run to its end)")
    scheduled, sent = int(end.get("scheduled") or 0), int(end.get("sent") or 0)
    late, dropped = int(end.get("late") or 0), int(end.get("dropped") or 0)
    if scheduled <= 0:
        return Verdict(name, UNKNOWN, {"scheduled": scheduled}, "nothing was scheduled")
    figures: dict[str, float] = {
        "scheduled": scheduled, "sent": sent, "late": late, "dropped": dropped,
        "late_pct": round(100.0 * late / max(sent, 1), 3),
        "dropped_pct": round(100.0 * dropped / scheduled, 3),
    }
    # per phase: what the generator took off the schedule against what the shape asked for.
    # A load event is written at the end of its second: attribute it to the phase of its middle.
    phases = ev.phases()
    per: dict[str, list[float]] = {}
    for s in seconds:
        ph = _phase_of(s["t"] - 0.5, phases) or "all"
        acc = per.setdefault(ph, [0.0, 0.0, 0.0, 0.0])   # target, scheduled, late, sent
        acc[0] += float(s.get("target_rate") or 0)
        acc[1] += float(s.get("scheduled") or 0)
        acc[2] += float(s.get("late") or 0)
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
    problems = []
    if figures["late_pct"] > max_late_pct:
        problems.append(f"{figures['late_pct']:g}% of messages left late (limit {max_late_pct:g}%)")
    if worst_err > max_pacing_error_pct:
        problems.append(f"the {worst} phase was paced {worst_err:.1f}% off its target (limit {max_pacing_error_pct:g}%)")
    if figures["dropped_pct"] > max_dropped_pct:
        problems.append(f"{dropped:,} messages ({figures['dropped_pct']:g}%) were due but never sent "
                        f"(limit {max_dropped_pct:g}%)")
    if problems:
        return Verdict(name, UNKNOWN, figures,
                       "invalid load: the generator fell behind its schedule: " + "; ".join(problems)
                       + (f" ({used})" if used else ""))
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
                   f"generator kept its schedule: {figures['late_pct']:g}% late, worst phase pacing error "
                   f"{worst_err:.2f}% ({worst}), {dropped:,} dropped{note}")

