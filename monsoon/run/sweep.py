"""A size sweep (Spring XD's message-size benchmark, reproduced on one stack): the same load at each of
``load.payload.sizes``, the platform's sustained capacity at each found by the calibration's ramp
(:func:`monsoon.run.calibrate.ramp`, judged by its criteria plus GC saturation), and beside it the stack's own
transport alone (:func:`monsoon.load.sweep.kafka_throughput`: Kafka produce-and-consume through the stack's
broker), so the report shows msg/s and MB/s per size and the platform's overhead over its transport.

One stack is started for the whole sweep (the JVM warmed once: ``profiles.<p>.warmup`` seconds at the first
step of the smallest size, not judged).  The smallest size ramps from ``load.base_rate``; each larger size
starts at the higher of half the MB/s the previous size sustained and 1/20 of its msg/s (:func:`ladder_for`),
so the ladder reaches its capacity without dozens of steps, and goes on up to ``max_rate``, stopping at its
first step not kept up; a capacity below that start shows as "no step kept up" at that size. Steps are judged
on throughput (the calibration's criteria and GC) without the latency knee unless ``load.sweep.latency_k``
is set: a larger size's ladder starts near idle, so its first step's p99 (the knee's baseline) would make
an ordinary loaded p99 look like a knee (ThingsBoard at 1 KB: 384 ms against 42 ms at 12 msg/s, where it
had kept up at 250 msg/s of 100 B with 336 ms).  Between sizes the
stack's backlog drains (up to ``DRAIN_S``) and then the transport alone is measured at that size.

Everything lands in one run directory: the timeline (every ramp's load seconds, samples and steps), one
``size-<N>/`` per size (its acked and latency logs), ``sweep.json`` and the report (:mod:`monsoon.report.sweep`)
with the experiment's checks (default ``gc_time_below``) judged over the whole sweep.
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import socket
import sys
import threading
import time
from pathlib import Path

from monsoon import settings
from monsoon.checks.registry import BUILT_IN, CheckRegistry
from monsoon.load.payloads import Payload
from monsoon.load.sweep import kafka_throughput, sized_payload
from monsoon.observe.collectors import KafkaLagCollector
from monsoon.observe.progress import Progress
from monsoon.report import sweep as sweep_report
from monsoon.run.calibrate import Criteria, Params, RecordingTimeline, Step, decide, ramp
from monsoon.run.course import DRAIN, LOAD, TEARDOWN, Course
from monsoon.run.plan import RunPlan
from monsoon.run.validate import validate
from monsoon.rundir import CHECKLIST_FILE, TIMELINE_FILE, experiment_dir_name, new_run_id, point_latest
from monsoon.spec.experiment import ExperimentSpec, load_experiment
from monsoon.spec.stack import StackSpec, load_stack
from monsoon.spec.sweep import SweepSpec
from monsoon.spec.yamlio import SpecError
from monsoon.stack.supervisor import Stack
from monsoon.timeline.events import META, OP, OP_SWEEP_SIZE, SWEEP_SIZE

MIN_RATE = 5.0        # msg/s: no ladder starts lower
DRAIN_S = 30.0        # at most this long for the backlog to drain between sizes
GC_CHECK = ("gc_time_below", {"fraction": 0.1, "over": "kept-up"})   # the steps that kept up: every ramp
#                                                    ends, by design, on one that did not (GC may be why)


def ladder_for(size: int, prev: dict | None, base_rate: float, max_rate: float) -> tuple[float, float]:
    """``(start, top)`` msg/s of ``size``'s ladder: the smallest size from ``base_rate``, a larger one from the
    higher of half the previous size's sustained MB/s and 1/20 of its msg/s (a per-message cost that barely
    changes with size keeps msg/s near the previous size's: a ladder from the MB/s alone would climb a dozen
    steps to it); every ladder up to ``max_rate`` (its ramp stops at the first step not kept up, so a top
    below that would only turn a capacity it could have found into a lower bound)."""
    if prev is None or not prev.get("capacity_msg_s"):
        start = base_rate if prev is None else max(MIN_RATE, base_rate * (prev["size"] if prev else size) / size)
        return float(round(min(start, max_rate))), float(max_rate)
    cap, psize = float(prev["capacity_msg_s"]), int(prev["size"])
    start = max(MIN_RATE, round(0.5 * cap * psize / size), round(cap / 20))
    return float(min(start, max_rate)), float(max_rate)


def _drain(bootstrap: str | None, group: str | None, topic: str | None, rate: float, stop: threading.Event,
           progress: Progress, label: str) -> float | None:
    """Wait (up to DRAIN_S) until the stack's Kafka lag is under half a second of ``rate``; the last lag seen."""
    if not bootstrap or not group:
        time.sleep(2.0)
        return None
    lag = None
    c = KafkaLagCollector(bootstrap, group, topic)
    try:
        end = time.monotonic() + DRAIN_S
        while time.monotonic() < end and not stop.is_set():
            try:
                lag = c.sample().get("lag")
            except Exception:   # a poll that fails is retried until the deadline
                lag = None
            if lag is not None and lag <= max(100.0, 0.5 * rate):
                break
            time.sleep(1.0)
    finally:
        c.close()
    progress(f"[{label}] backlog before the next size: {lag if lag is not None else '?'}")
    return lag


def plan_sweep(stack_spec: StackSpec, exp: ExperimentSpec, profile: str, *, sizes: tuple[int, ...] | None = None,
               force: bool = False, registry: CheckRegistry = BUILT_IN) -> ExperimentSpec:
    """``exp`` checked as a size sweep on ``stack_spec`` (``sizes`` over its ``load.payload.sizes``): SpecError
    (file, key) on the first problem, before anything starts; the experiment the sweep runs."""
    if sizes:
        exp = exp.model_copy(update={"load": exp.load.model_copy(update={
            "payload": type(exp.load.payload).model_validate({"sizes": tuple(sizes)})})})
    if not exp.load.payload.sizes:
        raise SpecError(exp.source, None, "load.payload.sizes", "a size sweep needs load.payload.sizes")
    if exp.load.auto:
        raise SpecError(exp.source, None, "load.base_rate", "a size sweep starts its ramp at a number of msg/s")
    validate(stack_spec, exp, profile, force=force, registry=registry)
    for size in exp.load.payload.sizes:   # a size the payload cannot take: a ValueError here, not mid-sweep
        sized_payload(size, exp.load.device_prefix)
    return exp


def sweep_checks(exp: ExperimentSpec, profile: str) -> list[tuple[str, dict]]:
    """What a sweep judges over its whole timeline: the experiment's checks for ``profile``, else GC time."""
    return [(c.name, c.resolved(profile)) for c in exp.checks if c.applies(profile)] or [GC_CHECK]


def describe_sweep(stack_spec: StackSpec, exp: ExperimentSpec, profile: str, run_id: str) -> str:
    """The dry run's plan of a sweep: what would start, each size's ladder (the first one's; the later ones
    follow the capacity found before them), the transport measurement and the checks."""
    sw = (exp.load.sweep or SweepSpec()).resolved(profile)
    sizes = list(exp.load.payload.sizes or ())
    start, top = ladder_for(sizes[0], None, float(exp.load.base_rate), float(sw["max_rate"]))
    kafka = stack_spec.observe.kafka
    lines = [f"[dry run] size sweep {stack_spec.name}/{exp.name} ({profile}), run {run_id}: nothing is started",
             f"  would start stack {stack_spec.name} ({len(stack_spec.services)} services: "
             f"{', '.join(stack_spec.services)}) once for the whole sweep",
             f"  sizes: {', '.join(f'{n} B' for n in sizes)}; {exp.load.devices} devices, qos {exp.load.qos}",
             f"  warm-up {exp.durations(profile).warmup:g} s at the first step of {sizes[0]} B (not judged)",
             f"  ramp per size: x{sw['factor']:g} per step of {sw['step_s']:g} s (+{sw['settle_s']:g} s settle), "
             f"stop at the calibration's throughput criteria"
             + (f", GC > {sw['gc_fraction']:g} of wall time" if sw["gc_fraction"] is not None else "")
             + (f", p99 > {sw['latency_k']:g} x the size's first step's" if sw["latency_k"] else
                " (no latency knee)") + "; "
             f"{sizes[0]} B from {start:g} to {top:g} msg/s, each larger size from the capacity before it",
             "  transport alone: " + (f"Kafka produce+consume through {kafka.bootstrap} for {sw['transport_s']:g} s "
                                      "per size" if kafka and float(sw["transport_s"]) > 0 else "not measured"),
             "  checks: " + ", ".join(f"{n} {p}" if p else n for n, p in sweep_checks(exp, profile))]
    return "\n".join(lines)


def run_sweep(stack_spec, exp, out_dir: Path, *, run_id: str, profile: str = "quick", progress: Progress = print,
              stop: threading.Event | None = None, registry: CheckRegistry = BUILT_IN) -> dict:
    """Run the sweep of ``exp`` (``load.payload.sizes``) on ``stack_spec``; return the record written to
    ``out_dir/sweep.json`` (and the report beside it), its checks judged by ``registry``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stop = stop or threading.Event()
    sizes = list(exp.load.payload.sizes or ())
    sw = (exp.load.sweep or SweepSpec()).resolved(profile)
    plan = RunPlan(stack_spec, exp, profile, checks=tuple(sweep_checks(exp, profile)), registry=registry)
    label, checks = plan.label, plan.checks
    started = time.time()
    entries: list[dict] = []
    obs_kafka = stack_spec.observe.kafka
    payloads = {size: sized_payload(size, exp.load.device_prefix) for size in sizes}   # ValueError before a start
    with RecordingTimeline(out_dir / TIMELINE_FILE) as tl:
        tl.add(META, kind="size-sweep", run_id=run_id, stack=stack_spec.name, experiment=exp.name,
               profile=profile, sizes=sizes, sweep=sw, devices=exp.load.devices, stack_source=stack_spec.source,
               queue_depth_uncounted=stack_spec.observe.queue_depth_uncounted, experiment_source=exp.source,
               checks=[{"name": n, "params": p} for n, p in checks])
        course = Course(tl, label, progress, watch=stack_spec.observe.service)
        with course.guarded(on_interrupt=course.interrupted):
            with course.start_stack(stack_spec, out_dir, run_id=run_id, profile=profile, env=exp.env,
                                    restart=exp.restart, detail=f"; sizes {', '.join(map(str, sizes))} bytes") as stack:
                bootstrap = stack.endpoint(obs_kafka.bootstrap) if obs_kafka else None
                prev: dict | None = None
                for k, size in enumerate(sizes):
                    if stop.is_set():
                        break
                    entry = sweep_size(course, stack, plan, size, prev, first=k == 0, bootstrap=bootstrap,
                                       payload=payloads[size], out_dir=out_dir, stop=stop)
                    entries.append(entry)
                    prev = entry
                course.enter(TEARDOWN)
        error = course.error
    record = {"kind": "size-sweep", "stack": stack_spec.name, "experiment": exp.name, "profile": profile,
              "run_id": run_id, "host": socket.gethostname(), "cpu_count": os.cpu_count(),
              "date": _dt.datetime.fromtimestamp(started, _dt.timezone.utc).isoformat(timespec="seconds"),
              "seconds": round(time.time() - started, 1), "sweep": sw, "sizes": entries,
              "transport": "kafka" if obs_kafka else None}
    if error:
        record["error"] = error
    record["trends"] = sweep_report.trends(record)
    record["rows"] = sweep_report.rows(record)
    verdicts = [v.to_dict() for v in course.judge(registry, out_dir, checks)]
    record["checks"] = verdicts
    (out_dir / sweep_report.SWEEP_FILE).write_text(json.dumps(record, indent=2))
    sweep_report.write(out_dir, record, verdicts)
    return record


def sweep_size(course: Course, stack: Stack, plan: RunPlan, size: int, prev: dict | None, *, first: bool,
               bootstrap: str | None, payload: Payload, out_dir: Path, stop: threading.Event) -> dict:
    """One size of a sweep on the started ``stack``: its ladder ramped (from the capacity found before it), its
    capacity decided, the backlog drained, the transport alone measured; its entry in ``sweep.json``."""
    exp, tl, progress = plan.exp, course.tl, course.progress
    course.enter(LOAD)                  # each size: its ladder is the load, then its backlog drains
    sw = (exp.load.sweep or SweepSpec()).resolved(plan.profile)
    obs_kafka = plan.stack.observe.kafka
    start, top = ladder_for(size, prev, float(exp.load.base_rate), float(sw["max_rate"]))
    params = Params(start_rate=start, factor=float(sw["factor"]), max_rate=max(top, start),
                    step_seconds=float(sw["step_s"]), settle_seconds=float(sw["settle_s"]),
                    warmup_seconds=float(int(plan.durations.warmup) if first else 0), devices=exp.load.devices,
                    qos=exp.load.qos, device_prefix=exp.load.device_prefix,
                    criteria=Criteria(gc_fraction=sw["gc_fraction"], latency_k=sw["latency_k"] or math.inf))
    sdir = out_dir / f"size-{size}"
    sdir.mkdir(exist_ok=True)
    tl.add(OP, op=OP_SWEEP_SIZE, size=size, start_rate=start, max_rate=top)
    steps: list[Step] = []
    slabel = f"{plan.label} {size}B"
    assert isinstance(tl, RecordingTimeline)
    finished = ramp(stack, tl, params, sdir, steps, label=slabel, progress=progress, stop=stop,
                    exits=course.events.exits, payload=payload, phase_prefix=f"{size}B-")
    failed = any(not s.ok for s in steps)
    dec = decide([Step.from_dict(s.to_dict()) for s in steps], params.criteria, finished=finished or failed)
    entry: dict = {"size": size, "capacity_msg_s": dec.capacity_msg_s, "criterion": dec.criterion,
                   "reason": dec.reason, "lower_bound": dec.lower_bound,
                   "generator_bound": dec.generator_bound, "result": dec.line(),
                   "ladder": [start, top], "steps": [s.to_dict() for s in steps]}
    progress(f"[{slabel}] {dec.line()}")
    course.enter(DRAIN)
    entry["backlog_after"] = _drain(bootstrap, obs_kafka.group if obs_kafka else None,
                                    obs_kafka.topic if obs_kafka else None,
                                    dec.capacity_msg_s or start, stop, progress, slabel)
    if bootstrap and float(sw["transport_s"]) > 0 and not stop.is_set():
        tr = kafka_throughput(bootstrap, size, float(sw["transport_s"]), stop=stop)
        entry["transport"] = tr.to_dict()
        progress(f"[{slabel}] transport alone (Kafka produce+consume): {tr.msg_s:,.0f} msg/s, "
                 f"{tr.mb_s:,.2f} MB/s" + (f" ({tr.error})" if tr.error else ""))
    tl.add(SWEEP_SIZE, **{k: v for k, v in entry.items() if k != "steps"})
    return entry


# ------------------------------------------------------------------------ CLI

def add_arguments(p) -> None:
    p.add_argument("experiment", help="an experiment with load.payload.sizes, e.g. size-sweep")
    p.add_argument("--stack", default="kafka", help="a stack name or file (default kafka)")
    p.add_argument("--profile", default="quick", choices=("quick", "nightly", "full"))
    p.add_argument("--sizes", default=None, help="comma-separated sizes in bytes, over the experiment's")
    p.add_argument("--runs-dir", type=Path, default=None, help="default: $MONSOON_RUNS_DIR or <repo>/runs")


def cli(args) -> int:
    try:
        stack_spec = load_stack(args.stack)
        sizes = None
        if args.sizes:
            try:
                sizes = tuple(int(x) for x in args.sizes.split(","))
            except ValueError:
                raise SpecError("--sizes", None, "sizes", f"want comma-separated integers, got {args.sizes!r}") from None
        exp = plan_sweep(stack_spec, load_experiment(args.experiment), args.profile, sizes=sizes)
    except (SpecError, ValueError) as e:
        print(f"monsoon sweep: {e}".splitlines()[0], file=sys.stderr)
        return 2
    runs = settings.runs_dir(args.runs_dir)
    run_id = new_run_id()
    out = runs / run_id / experiment_dir_name(stack_spec.name, exp.name)
    stop = threading.Event()
    rec = run_sweep(stack_spec, exp, out, run_id=run_id, profile=args.profile,
                    progress=lambda s: print(s, flush=True), stop=stop)
    point_latest(out.parent)
    print((out / CHECKLIST_FILE).read_text())
    print(f"monsoon sweep: {out}")
    return 0 if not rec.get("error") and all(e.get("capacity_msg_s") for e in rec["sizes"]) else 1

