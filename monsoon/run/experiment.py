"""One experiment against one stack: load + observation + checks, into a run directory.

Data flows one way: specs -> stack -> (fleet, collectors) -> timeline and
files on disk -> checks -> verdicts.  Every exit path stops the fleet, the
collectors and the stack; an interrupted run still leaves an analysable
directory (timeline, logs, acked log).
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from monsoon.faults.base import FaultContext
from monsoon.faults.plan import FaultPlan
from monsoon.faults.resolve import build_backends
from monsoon.load.shapes import LoadShape
from monsoon.load.stats import FleetTotals
from monsoon.observe.progress import LoadProgress, Progress, progress_fields
from monsoon.observe.storage import storage_services, stored_source
from monsoon.report.checklist import describe_interruption
from monsoon.report.result import ExperimentResult, RunInterrupted
from monsoon.run.calibrate import x1_line
from monsoon.run.drain import Drain
from monsoon.run.course import CHECKS, DRAIN, LOAD, READ_BACK, TEARDOWN, Course
from monsoon.run.harness import FleetPlan, LoadHarness, report_plan, totals_dict
from monsoon.run.plan import RunPlan
from monsoon.run.shield import FinishFirst
from monsoon.rundir import RESULT_FILE, SENT_DATA, STORED_AT_DRAIN_DATA, STORED_DATA, STORED_FINAL_TMP, TIMELINE_FILE
from monsoon.signals import signal_of
from monsoon.stack.supervisor import Stack
from monsoon.timeline.columnar import fresh, write_rows
from monsoon.timeline.store import Timeline
from monsoon.timeline.events import DRAIN as DRAIN_EVENT
from monsoon.timeline.events import META, OP, OP_FINAL_READ_BACK, OP_INTERRUPTED, OP_LOAD_END, STORED


@dataclass
class RunContext:
    """One run: its plan (validated and resolved, x1 settled: :mod:`monsoon.run.plan`), where it writes, and
    how it reports progress."""
    plan: RunPlan
    out_dir: Path
    run_id: str
    progress: Progress = lambda s: None
    progress_every: float = 5.0             # seconds between plain progress lines
    stop: threading.Event = field(default_factory=threading.Event)
    live: TextIO | None = None              # a terminal to draw the live load panel on (plain lines otherwise)


def run_experiment(ctx: RunContext) -> ExperimentResult:
    """Run one experiment; exceptions from the stack or load become ``result.error`` (verdict unknown).
    A SIGINT/SIGTERM tears everything down (faults healed first), then the checks judge the data that
    exists and :class:`RunInterrupted` carries that result (verdict unknown, ``interrupted`` set) up to the
    session, which writes its checklist before it stops. The course (:mod:`monsoon.run.course`): start the
    stack, :func:`start_load`, :func:`run_load`, :func:`drain`, :func:`read_back`, teardown
    (:func:`read_back_after_stop`), then the checks and ``result.json``."""
    plan, out_dir, run_id = ctx.plan, Path(ctx.out_dir), ctx.run_id
    stack_spec, exp, profile, progress = plan.stack, plan.exp, plan.profile, ctx.progress
    result = ExperimentResult(stack_spec.name, exp.name, profile, out_dir, base_rate=plan.base_rate)
    shape = plan.shape()
    out_dir.mkdir(parents=True, exist_ok=True)
    checks = list(plan.checks)   # the experiment's, then the implied ones (monsoon.run.plan.run_checks)
    label = plan.label

    with Timeline(out_dir / TIMELINE_FILE) as tl:
        tl.add(META, run_id=run_id, stack=stack_spec.name, experiment=exp.name, profile=profile,
               base_rate=exp.load.base_rate, base_rate_auto=result.base_rate, env=exp.env, restart=exp.restart, shape=exp.load.shape.kind,
               multiplier=exp.load.shape.multiplier, devices=exp.load.devices, qos=exp.load.qos,
               transport=exp.load.transport or stack_spec.devices.transport, engine=exp.load.engine, workers=exp.load.workers,
               durations=plan.durations.model_dump(),
               stack_source=stack_spec.source, experiment_source=exp.source,
               queue_depth_uncounted=stack_spec.observe.queue_depth_uncounted,
               checks=[{"name": n, "params": p} for n, p in checks],
               faults=[f.model_dump(mode="json", exclude={"description"}) for f in plan.faults])

        course = Course(tl, label, progress)
        load = LoadHarness(tl)

        def interrupted(e: KeyboardInterrupt) -> None:   # after the heal and the stop (shielded): judge what exists
            result.interrupted = interruption(signal_of(e), tl.now(), course.where)
            tl.add(OP, op=OP_INTERRUPTED, **result.interrupted)
            progress(f"[{label}] {describe_interruption(result.interrupted)}; faults healed, stack stopped; "
                     f"checking the data that exists")

        with course.guarded(on_interrupt=interrupted, cleanup=load.close):
            with course.start_stack(stack_spec, out_dir, run_id=run_id, profile=profile, env=exp.env,
                                    restart=exp.restart,
                                    detail=f" ({', '.join(stack_spec.start_order())})") as stack:
                start_load(ctx, load, stack, shape)
                result.platform = load.facts or None
                run_load(ctx, course, load, stack, shape)
                drain(ctx, course, load)
                rows = read_back(ctx, course, load, stack)
                course.enter(TEARDOWN)
                read_back_after_stop(stack, out_dir, tl, progress, label, rows)
        result.error = course.error

    # one signal while the checks run lets them finish (a run 1 s from its end keeps its verdict);
    # a second one, or any after an interrupted run, stops at once
    with FinishFirst(progress, f"finishing the checks of {label}", already=result.interrupted is not None) as fin:
        result.checks = course.judge(plan.registry, out_dir, checks)
    (out_dir / RESULT_FILE).write_text(json.dumps(result.to_dict(), indent=2))
    if result.interrupted is not None:
        raise RunInterrupted(result, result.interrupted)
    if fin.received:                  # the run was whole and its verdict stands; the session stops after it
        raise RunInterrupted(result, interruption(fin.received[0], tl.now(), {"stage": CHECKS}))
    return result


def start_load(ctx: RunContext, load: LoadHarness, stack: Stack, shape: LoadShape) -> None:
    """Preflight, devices, the fleet connected, the sampler sampling (:meth:`LoadHarness.start`), and the
    stall watch when ``no_ingest_stall`` judges the run."""
    plan = ctx.plan
    load.start(stack, FleetPlan.of(plan.exp.load, shape), Path(ctx.out_dir))
    if any(n == "no_ingest_stall" for n, _ in plan.checks):
        load.watch_stalls(stack, Path(ctx.out_dir))


def run_load(ctx: RunContext, course: Course, load: LoadHarness, stack: Stack, shape: LoadShape) -> FleetTotals:
    """The load phase: the shape sent (the live panel or progress lines each second), the faults injected and
    healed on schedule (every fault healed on every exit path, then the census, shielded up to the stack's
    stop); the totals on the timeline (``load-end``) and the sent dataset."""
    plan, tl, progress, label, out_dir = ctx.plan, course.tl, ctx.progress, ctx.plan.label, Path(ctx.out_dir)
    exp, faults, durations = plan.exp, list(plan.faults), plan.durations
    fleet, sampler = load.fleet, load.sampler
    assert sampler is not None      # start_load: load.start() started it (or raised)
    course.enter(LOAD)
    progress(f"[{label}] load: {exp.load.devices} devices, "
             f"{x1_line(plan.base_rate, float(exp.load.base_rate))}; "
             + ", ".join(f"{p.name} {p.end - p.start:g}s" for p in shape.phases()))
    phases = shape.phases()
    view = LoadProgress(label, progress, live=ctx.live, every=ctx.progress_every)

    def on_second(st) -> None:
        load.record_second(st)
        ph = next((p.name for p in phases if p.start <= st.t < p.end), "-")
        course.where["phase"] = ph
        view.update(progress_fields(st.t, ph, st, sampler.value, course.events.restarts))

    if faults:
        fault_ctx = FaultContext(run_id=ctx.run_id, stack=stack, out_dir=out_dir)
        fault_plan = FaultPlan(faults, build_backends(faults, stack, out_dir), tl, ctx=fault_ctx,
                               horizon=durations.total)
        progress(f"[{label}] faults: " + "; ".join(
            f"{f.name} ({f.kind}) on {f.target} at "
            + ", ".join(f"{a:g}s" for a, _ in f.schedule.windows(durations.total)[:6])
            for f in faults))
        # heals every fault on every exit path, then takes the census (shielded up to the stack's stop)
        with course.shield.around_exit(fault_plan, hold=True), view:
            totals = fleet.run(ctx.stop, on_second)
        report_plan(fault_plan, label, progress)
    else:
        with view:
            totals = fleet.run(ctx.stop, on_second)
    tl.add(OP, op=OP_LOAD_END, **totals_dict(totals))
    write_rows(out_dir / SENT_DATA, ("device", "last_seq"), totals.last_seq.items())   # what "never sent" means for the accounting
    fleet.close()
    progress(f"[{label}] load done: sent={totals.sent:,} acked={totals.acked:,} "
             f"failed={totals.failed:,} late={totals.late:,}; draining (up to {durations.drain_timeout:g}s)")
    return totals


def drain(ctx: RunContext, course: Course, load: LoadHarness) -> None:
    """The drain: until the backlog is gone, up to ``drain_timeout`` (its figures on the timeline); the sampler
    stops after it."""
    plan, sampler = ctx.plan, load.sampler
    assert sampler is not None
    course.enter(DRAIN)
    course.tl.add(DRAIN_EVENT, **Drain(sampler, plan.stack.observe.kafka is not None).wait(
        plan.durations.drain_timeout, ctx.stop))
    sampler.stop()


def read_back(ctx: RunContext, course: Course, load: LoadHarness, stack: Stack) -> int:
    """The read-back: storage exported as the ``stored`` dataset, then the devices a registry holds deleted
    while the platform still runs. The rows read back."""
    out_dir = Path(ctx.out_dir)
    course.enter(READ_BACK)
    t_export = time.monotonic()
    rows = stored_source(ctx.plan.stack.storage, stack.endpoint).export(out_dir / STORED_DATA)
    course.tl.add(STORED, path=STORED_DATA, rows=rows, seconds=round(time.monotonic() - t_export, 3))
    load.deprovision()    # the devices a registry holds for the run, deleted while it runs
    return rows


def read_back_after_stop(stack: Stack, out_dir: Path, tl: Timeline, progress: Progress, label: str,
                         at_drain: int) -> None:
    """Late is not lost: every service but the storage's (:func:`storage_services`) stops, newest first (each
    ``stop`` event with its exit code: a death while stopping is recorded like any other), and storage is read
    again. That read becomes the ``stored`` dataset (what the checks account against) and the drain's becomes
    ``stored-at-drain``: a message stored only in the last read was written late (during the platform's
    graceful stop, or after a drain that ended too soon) and is counted ``stored_late``, never lost. A last read
    that fails keeps the drain's, and says so."""
    keep = storage_services(stack.spec)
    first = [n for n in reversed(stack.spec.start_order()) if n not in keep and n in stack.services]
    for name in first:
        stack.stop_service(name)
    t = time.monotonic()
    try:
        rows = stored_source(stack.spec.storage, stack.endpoint).export(out_dir / STORED_FINAL_TMP)
    except Exception as e:
        tl.add(OP, op=OP_FINAL_READ_BACK, ok=False, error=f"{type(e).__name__}: {e}"[:300])
        progress(f"[{label}] reading storage again after {', '.join(first) or 'nothing'} stopped failed "
                 f"({type(e).__name__}); the drain's read-back stands")
        return
    fresh(out_dir / STORED_AT_DRAIN_DATA)
    os.replace(out_dir / STORED_DATA, out_dir / STORED_AT_DRAIN_DATA)
    os.replace(out_dir / STORED_FINAL_TMP, out_dir / STORED_DATA)
    tl.add(STORED, path=STORED_DATA, rows=rows, seconds=round(time.monotonic() - t, 3), final=True,
           stopped=first, at_drain=at_drain, at_drain_path=STORED_AT_DRAIN_DATA)
    progress(f"[{label}] storage read again after {', '.join(first) or 'nothing'} stopped: {rows:,} rows "
             f"({rows - at_drain:+,} since the drain's read-back)")


def interruption(sig: str, t: float, where: dict) -> dict:
    """``{"signal", "t", "stage"[, "phase"]}``: what stopped a run, when (timeline seconds) and where."""
    out = {"signal": sig, "t": round(t, 1), "stage": where.get("stage", "?")}
    if where.get("stage") == "load" and where.get("phase"):
        out["phase"] = where["phase"]
    return out


