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
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from monsoon.faults.base import FaultContext
from monsoon.faults.plan import FaultPlan
from monsoon.faults.resolve import build_backends
from monsoon.load.payloads import build_payload
from monsoon.observe.progress import LoadProgress, Progress, progress_fields
from monsoon.observe.storage import storage_services, stored_source
from monsoon.report.checklist import describe_interruption
from monsoon.report.result import ExperimentResult, RunInterrupted
from monsoon.run.calibrate import x1_line
from monsoon.run.drain import Drain
from monsoon.run.harness import LoadHarness, StackEvents, report_plan, totals_dict
from monsoon.run.plan import RunPlan
from monsoon.run.shield import FinishFirst, TeardownShield
from monsoon.rundir import RESULT_FILE, SENT_DATA, STORED_AT_DRAIN_DATA, STORED_DATA, STORED_FINAL_TMP, TIMELINE_FILE
from monsoon.signals import signal_of
from monsoon.stack.supervisor import Stack
from monsoon.timeline.columnar import fresh, write_rows
from monsoon.timeline.store import Timeline
from monsoon.timeline.events import DRAIN, META, OP, OP_ERROR, OP_FINAL_READ_BACK, OP_INTERRUPTED, OP_LOAD_END, STORED


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
    session, which writes its checklist before it stops."""
    plan, registry = ctx.plan, ctx.plan.registry
    stack_spec, exp, profile, run_id = plan.stack, plan.exp, plan.profile, ctx.run_id
    out_dir, faults, progress, stop, live = Path(ctx.out_dir), list(plan.faults), ctx.progress, ctx.stop, ctx.live
    progress_every = ctx.progress_every
    result = ExperimentResult(stack_spec.name, exp.name, profile, out_dir, base_rate=plan.base_rate)
    durations = plan.durations
    shape = plan.shape()
    out_dir.mkdir(parents=True, exist_ok=True)
    checks = list(plan.checks)   # the experiment's, then the implied ones (monsoon.run.plan.run_checks)
    label = plan.label

    with Timeline(out_dir / TIMELINE_FILE) as tl:
        tl.add(META, run_id=run_id, stack=stack_spec.name, experiment=exp.name, profile=profile,
               base_rate=exp.load.base_rate, base_rate_auto=result.base_rate, env=exp.env, restart=exp.restart, shape=exp.load.shape.kind,
               multiplier=exp.load.shape.multiplier, devices=exp.load.devices, qos=exp.load.qos,
               transport=exp.load.transport or stack_spec.devices.transport, engine=exp.load.engine, workers=exp.load.workers,
               durations=durations.model_dump(),
               stack_source=stack_spec.source, experiment_source=exp.source,
               checks=[{"name": n, "params": p} for n, p in checks],
               faults=[f.model_dump(mode="json", exclude={"description"}) for f in faults])

        on_event = StackEvents(tl, label, progress)
        where = {"stage": "starting the stack"}   # where a signal would find the run (its checklist says)

        load = LoadHarness(tl)
        # the final heal + census and the stack's stop run to the end whatever signals arrive meanwhile
        shield = TeardownShield(progress)
        try:
            progress(f"[{label}] starting stack {stack_spec.name} ({', '.join(stack_spec.start_order())})")
            with shield.around_exit(Stack(stack_spec, out_dir, run_id=run_id, on_event=on_event, profile=profile,
                                          env_overrides=exp.env, restart_overrides=exp.restart)) as stack:
                load.start(stack, device_prefix=exp.load.device_prefix, devices=exp.load.devices, shape=shape,
                           qos=exp.load.qos, out_dir=out_dir, payload=build_payload(exp.load.payload),
                           engine=exp.load.engine, workers=exp.load.workers,
                           legs=None if exp.load.legs is None else {str(k): w for k, w in exp.load.legs.items()},
                           transport=exp.load.transport)
                result.platform = load.facts or None
                if any(n == "no_ingest_stall" for n, _ in checks):
                    load.watch_stalls(stack, out_dir)
                fleet, sampler = load.fleet, load.sampler
                where["stage"] = "load"
                progress(f"[{label}] load: {exp.load.devices} devices, "
                         f"{x1_line(plan.base_rate, float(exp.load.base_rate))}; "
                         + ", ".join(f"{p.name} {p.end - p.start:g}s" for p in shape.phases()))
                phases = shape.phases()
                view = LoadProgress(label, progress, live=live, every=progress_every)

                def on_second(st) -> None:
                    load.record_second(st)
                    ph = next((p.name for p in phases if p.start <= st.t < p.end), "-")
                    where["phase"] = ph
                    view.update(progress_fields(st.t, ph, st, sampler.value, on_event.restarts))

                if faults:
                    fault_ctx = FaultContext(run_id=run_id, stack=stack, out_dir=out_dir)
                    fault_plan = FaultPlan(faults, build_backends(faults, stack, out_dir), tl, ctx=fault_ctx,
                                           horizon=durations.total)
                    progress(f"[{label}] faults: " + "; ".join(
                        f"{f.name} ({f.kind}) on {f.target} at "
                        + ", ".join(f"{a:g}s" for a, _ in f.schedule.windows(durations.total)[:6])
                        for f in faults))
                    # heals every fault on every exit path, then takes the census (shielded up to the stack's stop)
                    with shield.around_exit(fault_plan, hold=True), view:
                        totals = fleet.run(stop, on_second)
                    report_plan(fault_plan, label, progress)
                else:
                    with view:
                        totals = fleet.run(stop, on_second)
                tl.add(OP, op=OP_LOAD_END, **totals_dict(totals))
                write_rows(out_dir / SENT_DATA, ("device", "last_seq"), totals.last_seq.items())   # what "never sent" means for the accounting
                fleet.close()
                where.update(stage="drain", phase=None)
                progress(f"[{label}] load done: sent={totals.sent:,} acked={totals.acked:,} "
                         f"failed={totals.failed:,} late={totals.late:,}; draining (up to {durations.drain_timeout:g}s)")
                drain = Drain(sampler, stack_spec.observe.kafka is not None).wait(durations.drain_timeout, stop)
                tl.add(DRAIN, **drain)
                sampler.stop()
                where["stage"] = "read-back"
                t_export = time.monotonic()
                rows = stored_source(stack_spec.storage, stack.endpoint).export(out_dir / STORED_DATA)
                tl.add(STORED, path=STORED_DATA, rows=rows, seconds=round(time.monotonic() - t_export, 3))
                load.deprovision()    # the devices a registry holds for the run, deleted while it runs
                where["stage"] = "teardown"
                read_back_after_stop(stack, out_dir, tl, progress, label, rows)
        except Exception as e:  # the run failed to run: report it, don't crash the session
            result.error = f"{type(e).__name__}: {e}"
            tl.add(OP, op=OP_ERROR, error=result.error, traceback=traceback.format_exc())
            progress(f"[{label}] ERROR {result.error}")
        except KeyboardInterrupt as e:   # after the heal and the stop (shielded above): judge what exists
            result.interrupted = interruption(signal_of(e), tl.now(), where)
            tl.add(OP, op=OP_INTERRUPTED, **result.interrupted)
            progress(f"[{label}] {describe_interruption(result.interrupted)}; faults healed, stack stopped; "
                     f"checking the data that exists")
        finally:
            load.close()

    # one signal while the checks run lets them finish (a run 1 s from its end keeps its verdict);
    # a second one, or any after an interrupted run, stops at once
    with FinishFirst(progress, f"finishing the checks of {label}", already=result.interrupted is not None) as fin:
        result.checks = registry.evaluate(out_dir, checks)
    (out_dir / RESULT_FILE).write_text(json.dumps(result.to_dict(), indent=2))
    if result.interrupted is not None:
        raise RunInterrupted(result, result.interrupted)
    if fin.received:                  # the run was whole and its verdict stands; the session stops after it
        raise RunInterrupted(result, interruption(fin.received[0], tl.now(), {"stage": "checks"}))
    return result


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


