"""A request mix (Eclipse Ditto's read/search/modify benchmark, reproduced on one stack): reads by id, searches
by filter, device writes and Kafka modifications in one open-model schedule, ramped by the calibration's
ladder (:func:`monsoon.run.calibrate.ramp`, in ops/s of the whole mix) until a step is not kept up, which
names what stopped it: GC (the platform's JVM over ``load.mix.gc_fraction`` of the window), latency (a knee
in an operation's p99 or the writes' ack p99), errors (an operation's failures or refusals past
``error_fraction``), or the writes' own criteria (acked, stored, backlog).

One stack is started; the devices are provisioned; the warm-up touches every device (its id by name, one
read) and is recorded apart (``warmup`` in ``mix.json``, judged by ``mix_warmup``); then the ramp, after
``profiles.<p>.warmup`` seconds of the mix at the first step (the JVM's warm-up, not judged).  The record
(``mix.json``), checklist and report go to the run directory, with the experiment's checks judged over the
timeline (default: none beyond ``mix_capacity`` and ``mix_warmup``).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import socket
import threading
import time
from pathlib import Path

from monsoon.checks.registry import BUILT_IN, CheckRegistry
from monsoon.load.mix import MixClient, MixCriteria, MixDevice, judge_ops, ops_failures
from monsoon.observe.progress import Progress
from monsoon.report import mix as mix_report
from monsoon.run.calibrate import Criteria, Params, RecordingTimeline, Step, ramp
from monsoon.run.course import LOAD, TEARDOWN, Course
from monsoon.run.plan import RunPlan
from monsoon.run.validate import validate
from monsoon.rundir import TIMELINE_FILE
from monsoon.spec.experiment import ExperimentSpec
from monsoon.spec.mix import NOT_HTTP
from monsoon.spec.stack import StackSpec
from monsoon.spec.yamlio import SpecError
from monsoon.stack.provision import device_names
from monsoon.stack.supervisor import Stack
from monsoon.timeline.events import META, OP, OP_MIX_WARMUP
from monsoon.timeline.store import Timeline


def plan_mix(stack_spec: StackSpec, exp: ExperimentSpec, profile: str, *, force: bool = False,
             registry: CheckRegistry = BUILT_IN) -> ExperimentSpec:
    """``exp`` checked as a request mix on ``stack_spec``: SpecError (file, key) on the first problem, before
    anything starts."""
    mix = exp.load.mix
    if mix is None:
        raise SpecError(exp.source, None, "load.mix", "a request mix needs load.mix: {weights: {read, search, write}}")
    if exp.load.auto:
        raise SpecError(exp.source, None, "load.base_rate", "a request mix starts its ramp at a number of ops/s")
    prov = stack_spec.provisioning
    http = [op for op, w in mix.weights.items() if w > 0 and op not in NOT_HTTP]
    if http and prov.kind != "thingsboard-rest":
        raise SpecError(exp.source, None, "load.mix.weights",
                        f"{', '.join(http)} log in and find the devices through a ThingsBoard-style REST API "
                        f"(/api/auth/login, /api/tenant/devices): stack {stack_spec.name} has provisioning kind "
                        f"{prov.kind}")
    if mix.weights.get("modify") and not (stack_spec.observe.kafka and stack_spec.observe.kafka.topic):
        raise SpecError(exp.source, None, "load.mix.weights.modify",
                        f"modifications go into the stack's Kafka topic: stack {stack_spec.name} has no "
                        "observe.kafka.topic")
    topic = stack_spec.observe.kafka.topic if stack_spec.observe.kafka else None
    if mix.weights.get("modify") and topic and any(c in topic for c in "*?[^$"):
        raise SpecError(exp.source, None, "load.mix.weights.modify",
                        f"modifications go into one Kafka topic, shaped as the reference platform's queue carries "
                        f"telemetry: stack {stack_spec.name}'s observe.kafka.topic is a pattern ({topic}); a "
                        "platform whose queues carry its own framing (ThingsBoard's protobuf) has no topic an "
                        "outside producer can write to: leave modify out (weight 0)")
    validate(stack_spec, exp, profile, force=force, registry=registry)
    return exp


def mix_checks(exp: ExperimentSpec, profile: str) -> list[tuple[str, dict]]:
    return [(c.name, c.resolved(profile)) for c in exp.checks if c.applies(profile)]


def describe_mix(stack_spec: StackSpec, exp: ExperimentSpec, profile: str, run_id: str) -> str:
    mx = exp.load.mix
    assert mx is not None
    m = mx.resolved(profile)
    shares = ", ".join(f"{op} {s:.0%}" for op, s in mx.shares().items())
    return "\n".join([
        f"[dry run] request mix {stack_spec.name}/{exp.name} ({profile}), run {run_id}: nothing is started",
        f"  would start stack {stack_spec.name} ({', '.join(stack_spec.services)}) and provision "
        f"{exp.load.devices} devices; warm-up: every device found by name and read once (judged apart)",
        f"  mix: {shares}; ramp from {float(exp.load.base_rate):g} ops/s x{m['factor']:g} per step of "
        f"{m['step_s']:g} s (+{m['settle_s']:g} s settle) up to {m['max_rate']:g} ops/s, after "
        f"{exp.durations(profile).warmup:g} s at the first step; stop at GC > {m['gc_fraction']}, errors > "
        f"{m['error_fraction']:g}, a latency knee or the writes' criteria",
        "  requests: " + ("; ".join(f"{op} {f.get('method', 'GET')} {f['path']}" for op, f in m["requests"].items()
                                    if mx.weights.get(op)) or "none (writes and modifications only)"),
        "  checks: " + ", ".join([f"{n} {p}" if p else n for n, p in mix_checks(exp, profile)]
                                 + [mix_report.CAPACITY_CHECK, mix_report.WARMUP_CHECK])])


class RampMix:
    """The mix's side of :func:`ramp`: the write share, the non-write operations' schedule, and their judge."""

    def __init__(self, client: MixClient, write_share: float, crit: MixCriteria):
        self.client, self.write_share, self.crit = client, write_share, crit

    def start(self, shape) -> None:
        """The shape's per-second total ops/s (the fleet's shape is the write share of it)."""
        n = int(shape.duration)
        self.client.start([(shape.rate_at(s + 0.5) or 0.0) / self.write_share for s in range(n)])

    def stop(self) -> None:
        self.client.stop()

    def window(self, ops_target: float, a: int, b: int) -> dict:
        return {"ops_target": ops_target, "ops": self.client.window(a, b)}

    def judge(self, step_mix: dict, first: dict | None) -> tuple[str | None, str]:
        return judge_ops(step_mix["ops"], (first or step_mix)["ops"], self.crit)

    def failures(self, step_mix: dict, first: dict | None) -> list[tuple[str, str]]:
        """Every criterion the step's operations failed (:func:`ops_failures`), judged against the first step."""
        return ops_failures(step_mix["ops"], (first or step_mix)["ops"], self.crit)


class WarmFirst(RampMix):
    """A :class:`RampMix` that warms the entities up (every device found by name, read once; recorded apart as
    ``mix-warmup``) once the fleet's devices exist, before the first step's operations."""

    def __init__(self, client: MixClient, write_share: float, crit: MixCriteria, *, tl: Timeline,
                 progress: Progress, label: str):
        super().__init__(client, write_share, crit)
        self.tl, self.progress, self.label = tl, progress, label

    def start(self, shape) -> None:
        t = time.monotonic()
        w = self.client.warm_up()
        self.tl.add(OP, op=OP_MIX_WARMUP, **{k: v for k, v in w.items() if k in ("entities", "found", "seconds")})
        self.progress(f"[{self.label}] warm-up: {w['found']} of {w['entities']} entities found and read in "
                      f"{time.monotonic() - t:.1f} s (read p99 {w['read'].get('p99_ms')} ms)")
        super().start(shape)


def mix_client(stack: Stack, plan: RunPlan) -> MixClient:
    """The mix's client on the started ``stack``: its REST API (the provisioning's login), its Kafka topic."""
    exp = plan.exp
    mx = exp.load.mix
    assert mx is not None
    m = mx.resolved(plan.profile)
    prov, kafka = plan.stack.provisioning, plan.stack.observe.kafka
    devs = [MixDevice(n) for n, _ in device_names(exp.load.device_prefix, exp.load.devices)]
    return MixClient(stack.endpoint(prov.url or ""), prov.username or "", prov.password or "", devs,
                     shares=mx.shares(), keys=m["keys"], forms=m["requests"], range_s=float(m["range_s"]),
                     kafka_bootstrap=stack.endpoint(kafka.bootstrap) if kafka else None,
                     kafka_topic=kafka.topic if kafka else None, max_in_flight=int(m["max_in_flight"]))


def mix_decision(steps: list[Step], finished: bool) -> dict:
    """Capacity (ops/s) = the highest step kept up before the first that was not; what stopped it."""
    best = None
    for s in steps:
        target = (s.mix or {}).get("ops_target", s.target)
        if not s.ok:
            gen = s.criterion == "generator"
            cap = f"capacity {'>= ' if gen else ''}{best:,.0f} ops/s" if best is not None else "no step kept up"
            return {"capacity_ops_s": best, "criterion": s.criterion, "criteria": s.criteria or [s.criterion],
                    "generator_bound": gen,
                    "reason": f"at {target:,.0f} ops/s: {s.reason}",
                    "result": f"{cap} (stopped by {s.criterion}: at {target:,.0f} ops/s: {s.reason})"}
        best = target
    if best is None:
        return {"capacity_ops_s": None, "criterion": "interrupted", "generator_bound": False,
                "reason": "no step was measured", "result": "no step was measured"}
    crit = "max-rate" if finished else "interrupted"
    return {"capacity_ops_s": best, "criterion": crit, "generator_bound": False,
            "reason": f"every step kept up to {best:,.0f} ops/s", "result": f"capacity >= {best:,.0f} ops/s ({crit})"}


def run_mix(stack_spec: StackSpec, exp: ExperimentSpec, out_dir: Path, *, run_id: str, profile: str = "quick",
            progress: Progress = print, stop: threading.Event | None = None,
            registry: CheckRegistry = BUILT_IN) -> dict:
    """Run the request mix of ``exp`` on ``stack_spec``; return the record written to ``out_dir/mix.json``."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stop = stop or threading.Event()
    mx = exp.load.mix
    assert mx is not None
    m = mx.resolved(profile)
    shares = mx.shares()
    plan = RunPlan(stack_spec, exp, profile, checks=tuple(mix_checks(exp, profile)), registry=registry)
    label, checks = plan.label, plan.checks
    started = time.time()
    steps: list[Step] = []
    finished = False
    client: MixClient | None = None
    params = Params(start_rate=float(exp.load.base_rate), factor=float(m["factor"]), max_rate=float(m["max_rate"]),
                    step_seconds=float(m["step_s"]), settle_seconds=float(m["settle_s"]),
                    warmup_seconds=float(int(plan.durations.warmup)), devices=exp.load.devices,
                    qos=exp.load.qos, device_prefix=exp.load.device_prefix,
                    criteria=Criteria(gc_fraction=m["gc_fraction"]))
    with RecordingTimeline(out_dir / TIMELINE_FILE) as tl:
        tl.add(META, kind="request-mix", run_id=run_id, stack=stack_spec.name, experiment=exp.name, profile=profile,
               mix=m, shares=shares, devices=exp.load.devices, stack_source=stack_spec.source,
               queue_depth_uncounted=stack_spec.observe.queue_depth_uncounted, experiment_source=exp.source,
               checks=[{"name": n, "params": p} for n, p in checks])
        course = Course(tl, label, progress, watch=stack_spec.observe.service)
        with course.guarded(on_interrupt=course.interrupted):
            restart: dict[str, str] | None = dict(exp.restart) if exp.restart else None
            with course.start_stack(stack_spec, out_dir, run_id=run_id, profile=profile, env=exp.env,
                                    restart=restart, detail=f"; mix {shares}") as stack:
                course.enter(LOAD)
                client = mix_client(stack, plan)
                warm = WarmFirst(client, shares["write"], MixCriteria(error_fraction=float(m["error_fraction"])),
                                 tl=tl, progress=progress, label=label)
                finished = ramp(stack, tl, params, out_dir, steps, label=label, progress=progress, stop=stop,
                                exits=course.events.exits, mix=warm)
                course.enter(TEARDOWN)
        error = course.error
    failed = any(not s.ok for s in steps)
    dec = mix_decision(steps, finished or failed)
    cap_step = next((s for s in reversed(steps) if s.ok and s.mix), None)
    record = {"kind": "request-mix", "stack": stack_spec.name, "experiment": exp.name, "profile": profile,
              "run_id": run_id, "host": socket.gethostname(), "cpu_count": os.cpu_count(),
              "date": _dt.datetime.fromtimestamp(started, _dt.timezone.utc).isoformat(timespec="seconds"),
              "seconds": round(time.time() - started, 1), "weights": dict(mx.weights), "shares": shares, "mix": m,
              **dec, "capacity_step_ops": cap_step.mix["ops"] if cap_step and cap_step.mix else None,
              "ops": client.totals() if client is not None else None,
              "warmup": client.warmup if client is not None else None,
              "steps": [s.to_dict() for s in steps]}
    if client is not None and client.error:
        record["mix_error"] = client.error
    if error:
        record["error"] = error
    verdicts = [v.to_dict() for v in course.judge(registry, out_dir, checks)]
    record["checks"] = verdicts
    (out_dir / mix_report.MIX_FILE).write_text(json.dumps(record, indent=2))
    mix_report.write(out_dir, record, verdicts + [mix_report.capacity_verdict(record).to_dict(),
                                                  mix_report.warmup_verdict(record).to_dict()])
    progress(f"[{label}] {dec['result']}")
    return record
