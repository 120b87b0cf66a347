"""One experiment against one stack: load + observation + checks, into a run directory.

Data flows one way: specs -> stack -> (fleet, collectors) -> timeline and
files on disk -> checks -> verdicts.  Every exit path stops the fleet, the
collectors and the stack; an interrupted run still leaves an analysable
directory (timeline, logs, acked log).
"""
from __future__ import annotations

import json
import queue
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TextIO

from .checks import ACKED_FILE, STORED_FILE, TIMELINE_FILE, Verdict, check_base, combine, evaluate
from .accounting import SENT_FILE, stored_source, write_sent
from .hdrlog import LATENCY_FILE
from .collectors import Sampler, collectors_for
from .specs import ExperimentSpec, StackSpec
from .stack import Stack
from .progress import LoadProgress, progress_fields
from .timeline import Timeline

Progress = Callable[[str], None]
# summary.json: per experiment, these figures of its checks side by side
HEADLINE = ("acked", "acked_lost", "oom_events", "peak_lag", "recovery_s", "faults_injected", "faults_landed",
            "faults_healed", "faults_left_in_place", "max_downtime_s", "throughput_drop_pct", "late_pct",
            "pacing_error_pct", "duplicates", "budget_consumed_pct", "heap_headroom_pct", "predicted_drain_s",
            "observed_drain_s")


@dataclass
class ExperimentResult:
    stack: str
    experiment: str
    profile: str
    dir: Path
    checks: list[Verdict] = field(default_factory=list)
    error: str | None = None
    dry_run: str | None = None      # the plan that a dry run printed instead of running
    base_rate: dict | None = None   # base_rate: auto: how x1 was resolved (monsoon.calibrate)

    @property
    def verdict(self) -> str:
        if self.dry_run is not None:
            return "skipped"
        return combine([c.verdict for c in self.checks] + (["unknown"] if self.error else []))

    def headline(self) -> dict[str, float]:
        """The experiment's key figures, lifted from its checks (first check that has each wins)."""
        out: dict[str, float] = {}
        for key in HEADLINE:
            v = next((c.figures[key] for c in self.checks if key in c.figures), None)
            if v is not None:
                out[key] = v
        return out

    def to_dict(self) -> dict:
        d = {"stack": self.stack, "experiment": self.experiment, "verdict": self.verdict,
             "figures": self.headline(), "checks": [c.to_dict() for c in self.checks], "dir": str(self.dir)}
        if self.error:
            d["error"] = self.error
        if self.base_rate:   # base_rate: auto: the resolved x1, the capacity and fraction it came from
            d["figures"].update({k: self.base_rate[x] for k, x in (("base_rate_msg_s", "base_rate"),
                                 ("calibrated_capacity_msg_s", "capacity_msg_s"), ("base_fraction", "fraction"))
                                 if self.base_rate.get(x) is not None})
            d["base_rate"] = self.base_rate
        return d

    def check(self, name: str) -> Verdict:
        """The verdict of one check by name (KeyError naming the checks there are).

        An exact name wins; otherwise the verdicts whose base name is ``name`` (``latency_objective``
        finds ``latency_objective[steady]``): one is returned as is, several are composed into one
        (fail > unknown > pass; the worst one's figures, every one's figures as ``key[phase]``)."""
        for c in self.checks:
            if c.name == name:
                return c
        same = [c for c in self.checks if check_base(c.name) == name]
        if len(same) == 1:
            return same[0]
        if same:
            worst = combine([c.verdict for c in same])
            first = next(c for c in same if c.verdict == worst)
            figures = dict(first.figures)
            for c in same:
                figures.update({f"{k}[{c.name[len(name) + 1:-1]}]": v for k, v in c.figures.items()})
            parts = [f"{c.name}: {c.verdict}" + (f" ({c.message})" if c.message else "") for c in same]
            return Verdict(name, worst, figures, "; ".join(parts))
        raise KeyError(f"no check {name!r} in {self.stack}/{self.experiment} (has: {', '.join(c.name for c in self.checks)})")

    def assert_pass(self) -> None:
        """Fail the calling test with the numbers unless every check passed (skip it after a dry run)."""
        import pytest
        if self.dry_run is not None:
            pytest.skip(f"dry run of {self.stack}/{self.experiment}: nothing was started")
        if self.verdict != "pass":
            pytest.fail(self.failure_message(), pytrace=False)

    def failure_message(self) -> str:
        lines = [f"{self.stack} / {self.experiment} ({self.profile}): {self.verdict.upper()}"]
        if self.error:
            lines.append(f"  error: {self.error}")
        for c in self.checks:
            figs = ", ".join(f"{k}={v:g}" if isinstance(v, (int, float)) else f"{k}={v}"
                             for k, v in c.figures.items())
            lines.append(f"  {c.verdict.upper():7} {c.name}: {c.message} [{figs}]")
        lines.append(f"  run directory: {self.dir}")
        return "\n".join(lines)


def build_shape(exp: ExperimentSpec, profile: str):
    """The experiment's load shape for ``profile`` (see ``ShapeSpec``: how each kind uses the profile's
    warmup / burst / recovery windows)."""
    return exp.load.shape.build(exp.load.base_rate, exp.durations(profile), profile)


def provision(stack: Stack, exp: ExperimentSpec):
    from .provision import NoProvisioner, TbRestProvisioner, device_names
    prov = stack.spec.provisioning
    wanted = device_names(exp.load.device_prefix, exp.load.devices)
    client = NoProvisioner() if prov.kind == "none" else \
        TbRestProvisioner(stack.endpoint(prov.url), prov.username, prov.password)
    client.login()
    return client.ensure_devices(wanted)


class _Drain:
    """Waits until the stack's backlog is empty and storage stops moving."""

    def __init__(self, sampler: Sampler, has_kafka: bool):
        self.sampler, self.has_kafka = sampler, has_kafka

    def backlog(self) -> float | None:
        if self.has_kafka:
            return self.sampler.value("kafka", "lag")
        return self.sampler.value("metrics", "queue_depth")

    def wait(self, timeout: float, stop: threading.Event) -> dict:
        t0 = time.monotonic()
        last_stored, stable = None, 0
        while time.monotonic() - t0 < timeout and not stop.is_set():
            time.sleep(1.0)
            backlog = self.backlog()
            stored = self.sampler.value("storage", "stored")
            stable = stable + 1 if (stored is not None and stored == last_stored) else 0
            last_stored = stored
            if backlog is not None and backlog <= 0 and (stored is None or stable >= 2):
                return {"drained": True, "waited_s": round(time.monotonic() - t0, 1), "backlog": backlog}
        return {"drained": False, "waited_s": round(time.monotonic() - t0, 1), "backlog": self.backlog()}


def run_experiment(stack_spec: StackSpec, exp: ExperimentSpec, profile: str, out_dir: Path, *,
                   run_id: str, progress: Progress = lambda s: None, progress_every: float = 5.0,
                   stop: threading.Event | None = None, dry_run: bool = False, calibration_dir: Path | None = None,
                   live: TextIO | None = None) -> ExperimentResult:
    """Run one experiment; exceptions from the stack or load become ``result.error`` (verdict unknown),
    KeyboardInterrupt/SystemExit propagate after everything is torn down (faults healed first).

    ``dry_run``: validate everything, print what would be done, start nothing.
    ``live``: a terminal to draw the live load panel on (plain progress lines otherwise)."""
    from .chaos import build_backends, describe, experiment_faults
    from .faults import FaultContext, FaultPlan
    from .transports import build_fleet   # MqttFleet, HttpFleet or CoapFleet, by devices.transport
    out_dir = Path(out_dir)
    result = ExperimentResult(stack_spec.name, exp.name, profile, out_dir)
    if exp.load.auto:   # base_rate: auto: x1 = base_fraction x the calibrated capacity (calibrates first if needed)
        from .calibrate import resolve_experiment
        try:
            exp, result.base_rate = resolve_experiment(stack_spec, exp, profile, out_dir, run_id=run_id,
                                                       progress=progress, stop=stop, dry_run=dry_run,
                                                       cal_dir=calibration_dir)
        except Exception as e:   # could not calibrate: the run did not run (verdict unknown)
            result.error = f"{type(e).__name__}: {e}"
            progress(f"[{stack_spec.name}/{exp.name}] ERROR {result.error}")
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / "result.json").write_text(json.dumps(result.to_dict(), indent=2))
            return result
    durations = exp.durations(profile)
    if result.base_rate and exp.load.shape.kind == "python" and not dry_run:   # x1 was auto
        from .yamlio import SpecError
        try:   # its rates depend on the calibrated x1: sampled now, before anything starts
            exp.load.shape.check(exp.load.base_rate, durations, profile)
        except ValueError as e:
            raise SpecError(exp.source, None, "load.shape",
                            f"with base_rate: auto = {exp.load.base_rate:g} msg/s: {e}") from None
    shape = build_shape(exp, profile)
    faults = experiment_faults(exp, profile, stack_spec)   # a bad fault fails here, before anything starts
    unknown = sorted(set(exp.env) - set(stack_spec.services))
    if unknown:
        from .yamlio import SpecError
        raise SpecError(exp.source, None, "env", f"no service {', '.join(unknown)} in stack {stack_spec.name!r} "
                        f"(it has: {', '.join(stack_spec.services)})")
    if dry_run:
        result.dry_run = describe(stack_spec, exp, profile, faults, run_id)
        if result.base_rate:
            result.dry_run = result.dry_run.replace(f"x1 = {exp.load.base_rate:g} msg/s", result.base_rate["describe"])
        progress(result.dry_run)
        return result
    out_dir.mkdir(parents=True, exist_ok=True)
    stop = stop or threading.Event()
    checks = [(c.name, c.resolved(profile)) for c in exp.checks if c.applies(profile)]
    if faults and "faults_landed" not in {n for n, _ in checks}:
        checks.append(("faults_landed", {}))   # a fault that did not land or heal must show in the verdict
    if "load_valid" not in {n for n, _ in checks}:
        checks.append(("load_valid", {}))      # the generator's self-check: a load that fell behind is not a pass
    label = f"{stack_spec.name}/{exp.name}"
    restarts = [0]

    with Timeline(out_dir / TIMELINE_FILE) as tl:
        tl.add("meta", run_id=run_id, stack=stack_spec.name, experiment=exp.name, profile=profile,
               base_rate=exp.load.base_rate, base_rate_auto=result.base_rate, env=exp.env, shape=exp.load.shape.kind,
               multiplier=exp.load.shape.multiplier, devices=exp.load.devices, qos=exp.load.qos,
               transport=stack_spec.devices.transport, engine=exp.load.engine, workers=exp.load.workers,
               durations=durations.model_dump(),
               stack_source=stack_spec.source, experiment_source=exp.source,
               checks=[{"name": n, "params": p} for n, p in checks],
               faults=[f.model_dump(mode="json", exclude={"description"}) for f in faults])

        def on_event(type_: str, **fields) -> None:
            tl.add(type_, **fields)
            if type_ == "service" and fields.get("event") == "exit":
                progress(f"[{label}] service {fields['service']} exited: {fields.get('cause')}")
            if type_ == "service" and fields.get("event") == "restart":
                restarts[0] += 1
                progress(f"[{label}] service {fields['service']} restarted (#{fields.get('n')})")

        fleet = sampler = None
        # the final heal + census and the stack's stop run to the end whatever signals arrive meanwhile
        shield = TeardownShield(progress)
        try:
            progress(f"[{label}] starting stack {stack_spec.name} ({', '.join(stack_spec.start_order())})")
            with shield.around_exit(Stack(stack_spec, out_dir, run_id=run_id, on_event=on_event, profile=profile,
                                          env_overrides=exp.env)) as stack:
                t = time.monotonic()
                devices = provision(stack, exp)
                tl.add("op", op="provisioned", devices=len(devices), seconds=round(time.monotonic() - t, 2))
                dev = stack_spec.devices
                fleet = build_fleet(dev.transport, devices, stack.endpoint(dev.host), int(stack.endpoint(dev.port)),
                                    topic=dev.topic, qos=exp.load.qos, shape=shape, acked_path=out_dir / ACKED_FILE,
                                    latency_log_path=out_dir / LATENCY_FILE, payload=exp.load.payload.build(),
                                    engine=exp.load.engine, workers=exp.load.workers)
                fleet.connect()
                tl.add("op", op="connected", devices=len(devices))
                sampler = Sampler(tl, collectors_for(stack)).start()
                time.sleep(1.0)  # one baseline sample before the load
                t0 = tl.now()
                for ph in shape.phases():
                    tl.add("phase", name=ph.name, start=round(t0 + ph.start, 3), end=round(t0 + ph.end, 3))
                progress(f"[{label}] load: {exp.load.devices} devices, x1={exp.load.base_rate:g} msg/s, "
                         + ", ".join(f"{p.name} {p.end - p.start:g}s" for p in shape.phases()))
                phases = shape.phases()
                view = LoadProgress(label, progress, live=live, every=progress_every)

                def on_second(st) -> None:
                    fields = dict(vars(st))
                    fields["sec"] = fields.pop("t")  # the fleet's second index; "t" is the timeline's clock
                    tl.add("load", **fields)
                    ph = next((p.name for p in phases if p.start <= st.t < p.end), "-")
                    view.update(progress_fields(st.t, ph, st, sampler.value, restarts[0]))

                if faults:
                    ctx = FaultContext(run_id=run_id, stack=stack, out_dir=out_dir)
                    plan = FaultPlan(faults, build_backends(faults, stack, out_dir), tl, ctx=ctx,
                                     horizon=durations.total)
                    progress(f"[{label}] faults: " + "; ".join(
                        f"{f.name} ({f.kind}) on {f.target} at "
                        + ", ".join(f"{a:g}s" for a, _ in f.schedule.windows(durations.total)[:6])
                        for f in faults))
                    # heals every fault on every exit path, then takes the census (shielded up to the stack's stop)
                    with shield.around_exit(plan, hold=True), view:
                        totals = fleet.run(stop, on_second)
                    _report_plan(plan, label, progress)
                else:
                    with view:
                        totals = fleet.run(stop, on_second)
                tl.add("op", op="load-end", **_totals_dict(totals))
                write_sent(out_dir / SENT_FILE, totals.last_seq)   # what "never sent" means for the accounting
                fleet.close()
                progress(f"[{label}] load done: sent={totals.sent:,} acked={totals.acked:,} "
                         f"failed={totals.failed:,} late={totals.late:,}; draining (up to {durations.drain_timeout:g}s)")
                drain = _Drain(sampler, stack_spec.observe.kafka is not None).wait(durations.drain_timeout, stop)
                tl.add("drain", **drain)
                sampler.stop()
                rows = stored_source(stack_spec.storage, stack.endpoint).export(out_dir / STORED_FILE)
                tl.add("stored", path=STORED_FILE, rows=rows)
        except Exception as e:  # the run failed to run: report it, don't crash the session
            result.error = f"{type(e).__name__}: {e}"
            tl.add("op", op="error", error=result.error, traceback=traceback.format_exc())
            progress(f"[{label}] ERROR {result.error}")
        finally:
            if fleet is not None:
                fleet.close()
            if sampler is not None:
                sampler.stop()

    result.checks = evaluate(out_dir, checks)
    (out_dir / "result.json").write_text(json.dumps(result.to_dict(), indent=2))
    return result


class TeardownShield:
    """Teardown (the final heal and census, the stack's stop) that a second Ctrl-C or SIGTERM cannot cut short.

    ``with shield.around_exit(cm):`` runs ``cm.__exit__`` with SIGINT and SIGTERM *recorded* instead of
    raised: each one is answered with ``monsoon: still healing/stopping, please wait`` and lands in
    ``received``.  When the shield comes down, a KeyboardInterrupt naming them is raised unless one (or
    SystemExit) is already on its way, so the interruption is honoured once teardown is done.

    ``hold=True`` (an inner teardown, with an outer ``around_exit`` still to come): when the exit leaves by
    an exception, the shield stays up until the outer exit, so no signal slips in between the two.
    Signal handlers belong to the main thread: in any other thread the shield does nothing.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, say: Progress = print):
        self.say = say
        self.received: list[str] = []
        self._old: dict[int, Any] | None = None
        self._notes: queue.SimpleQueue = queue.SimpleQueue()   # put() is safe in a signal handler
        self._teller: threading.Thread | None = None

    @property
    def armed(self) -> bool:
        return self._old is not None

    def _on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        self.received.append(name)
        self._notes.put(name)   # said from a thread: the progress sink takes locks a signal handler must not

    def _tell(self) -> None:
        while (name := self._notes.get()) is not None:
            try:
                self.say(f"monsoon: still healing/stopping, please wait ({name} received)")
            except Exception:
                pass

    def arm(self) -> None:
        if self.armed or threading.current_thread() is not threading.main_thread():
            return
        self._old = {s: signal.signal(s, self._on_signal) for s in self.SIGNALS}   # first: the shield is up
        self._teller = threading.Thread(target=self._tell, name="teardown-shield", daemon=True)
        self._teller.start()

    def disarm(self) -> list[str]:
        """Put the previous handlers back (unless someone replaced ours meanwhile); what was received."""
        if self._old is not None:
            for s, old in self._old.items():
                if signal.getsignal(s) == self._on_signal:
                    signal.signal(s, signal.SIG_DFL if old is None else old)
            self._old = None
            self._notes.put(None)
            if self._teller is not None:
                self._teller.join(timeout=2)
                self._teller = None
        return list(self.received)

    def around_exit(self, cm: Any, *, hold: bool = False) -> "_ShieldedExit":
        return _ShieldedExit(self, cm, hold)

    def _after(self, leaving: BaseException | None, hold: bool) -> None:
        """Teardown is done: bring the shield down (or keep it up for an outer teardown) and honour signals."""
        pending = bool(self.received) and not isinstance(leaving, (KeyboardInterrupt, SystemExit))
        if not hold or (leaving is None and not pending):
            self.disarm()   # else an exception goes on to the outer teardown, which brings the shield down
        if pending:
            what = ", ".join(dict.fromkeys(self.received))
            raise KeyboardInterrupt(f"monsoon: received {what} during teardown; stopped once it was done") \
                from leaving


class _ShieldedExit:
    def __init__(self, shield: TeardownShield, cm: Any, hold: bool):
        self.shield, self.cm, self.hold = shield, cm, hold

    def __enter__(self) -> Any:
        return self.cm.__enter__()

    def __exit__(self, et, ev, tb) -> bool:
        self.shield.arm()
        try:
            suppress = bool(self.cm.__exit__(et, ev, tb))
        except BaseException as e:
            self.shield._after(e, self.hold)
            raise
        self.shield._after(None if suppress or et is None else ev, self.hold)
        return suppress


def _report_plan(plan, label: str, progress: Progress) -> None:
    injected = [e for e in plan.events if e["phase"] == "inject"]
    landed = sum(1 for e in injected if e["landed"] is True)
    heals = [e for e in plan.events if e["phase"] == "heal"]
    healed = sum(1 for e in heals if e["landed"] is not False)
    progress(f"[{label}] faults: {len(injected)} injected, {landed} landed, {healed} of {len(heals)} heals verified"
             + ("" if not plan.leftovers else f"; LEFT IN PLACE: {plan.leftovers}")
             + ("" if not plan.errors else f"; errors: {'; '.join(plan.errors)}"))


def _totals_dict(totals) -> dict:
    d = dict(vars(totals))
    d.pop("last_seq", None)
    return d
