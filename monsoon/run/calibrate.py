"""Calibration: ramp the load on a stack until it stops keeping up, and record its capacity.

``monsoon calibrate STACK`` sends a geometric ladder of constant-rate steps, judges each measured window
(:func:`judge_step`, pure: the first of :data:`CRITERIA` that fails names the step, its reason names every
failed one) and stops at the first step the
stack did not keep up with, so it is never pushed long above its capacity. Capacity = the highest step kept up
with (:func:`decide`). The record goes to ``~/.cache/monsoon/calibration/<stack>.json`` (:func:`calibration_dir`), the run to
``<runs>/<run-id>/calibrate-<stack>/``. ``base_rate: auto`` (:func:`resolve_auto`, called through
:func:`monsoon.run.plan.settle_x1`) is ``base_fraction`` x that capacity. Each criterion: docs/load.md, "How a calibration step is judged".
"""
from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import os
import socket
import statistics
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any


from monsoon.load.shapes import Stage, Stages
from monsoon.observe.progress import Progress
from monsoon import settings
from monsoon.run.course import Course
from monsoon.run.harness import FleetPlan, LoadHarness
from monsoon.rundir import CALIBRATION_RECORD, TIMELINE_FILE, calibrate_dir_name
from monsoon.spec.stack import jar_sha256
from monsoon.timeline.store import Timeline
from monsoon.timeline.views import counter_steps
from monsoon.timeline.events import CALIBRATION_STEP, META, OP, OP_LOAD_END, SAMPLE


CALIBRATION_DIR = "calibration"
DEFAULT_MAX_AGE_DAYS = 7.0
MAX_AGE_ENV = "MONSOON_CALIBRATION_MAX_AGE_DAYS"
DIR_ENV = "MONSOON_CALIBRATION_DIR"
CRITERIA = ("stack-died", "generator", "held", "acked-rate", "stored-rate", "backlog-growth", "latency-knee", "gc",
            "errors")   # errors: a request mix's operations failed (monsoon.load.mix.judge_ops)


# ------------------------------------------------------------------ pure logic

@dataclass(frozen=True)
class Criteria:
    """When a step counts as "not kept up" (see the module docstring)."""
    tolerance: float = 0.10           # achieved rates may fall this fraction below the sent rate
    late_fraction: float = 0.5        # more late sends than this fraction: generator-bound (held ones: the stack's)
    latency_k: float = 5.0            # knee: p99 > k x the first step's p99 ...
    latency_floor_ms: float = 250.0   # ... and above this absolute floor
    slope_fraction: float = 0.05      # backlog growth: slope > this x target ...
    slope_min: float = 20.0           # ... and > this many msg/s ...
    backlog_floor_s: float = 0.5      # ... to a backlog of more than this many seconds of the target
    gc_fraction: float | None = None  # GC saturation: more than this fraction of the window in GC (None: off)


@dataclass
class Step:
    """One measured step (the window after its settle time)."""
    index: int
    target: float                      # msg/s asked of the fleet
    seconds: float                     # length of the measured window
    scheduled: int = 0
    sent: int = 0
    acked: int = 0
    failed: int = 0
    late: int = 0
    held: int = 0                      # of late: waited for a request slot the stack held (request fleets)
    stored_rate: float | None = None   # slope of the storage count, msg/s (None: no count collector)
    backlog_slope: float | None = None  # slope of queue depth / Kafka lag, msg/s (None: not observed)
    backlog_end: float | None = None
    p99_ms: float | None = None        # median of the window's per-second p99 ack latencies
    exits: int = 0                     # exits / restarts of the service under test in the step
    gc_fraction: float | None = None   # the window's GC time / wall time (None: no gc_seconds samples)
    gen_cpu_s: float | None = None     # the load generator's own CPU seconds over the window (None: not reported)
    ok: bool | None = None             # filled by judge / decide
    criterion: str | None = None
    reason: str = ""
    mix: dict | None = None            # a request mix's step: {ops_target, ops: {op: window figures}}
    criteria: list[str] = field(default_factory=list)   # every criterion the step failed (criterion: the first)

    @property
    def send_rate(self) -> float:
        return self.sent / self.seconds if self.seconds > 0 else 0.0

    @property
    def ack_rate(self) -> float:
        return self.acked / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["send_rate"] = round(self.send_rate, 1)
        d["ack_rate"] = round(self.ack_rate, 1)
        for k in ("stored_rate", "backlog_slope", "backlog_end", "p99_ms", "target", "seconds", "gc_fraction",
                  "gen_cpu_s"):
            if isinstance(d[k], float):
                d[k] = round(d[k], 2)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Step":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def step_failures(step: Step, baseline_p99_ms: float | None,
                  crit: Criteria = Criteria()) -> list[tuple[str, str]]:
    """``[(criterion, reason)]``: every criterion of :data:`CRITERIA` the step failed, in that order; ``[]``
    if it kept up. A step that was not measured fails ``generator`` alone (nothing else can be judged)."""
    tol = crit.tolerance
    out: list[tuple[str, str]] = []
    if step.exits:
        out.append(("stack-died", f"the service under test exited {step.exits} time(s) during the step"))
    if step.seconds <= 0:
        return out + [("generator", "the step was not measured (no load seconds)")]
    if step.send_rate < (1 - tol) * step.target:
        out.append(("generator", f"the fleet sent {step.send_rate:,.0f}/s of the {step.target:,.0f}/s target "
                                 f"(sent {step.sent:,} of {step.scheduled:,} scheduled)"))
    elif step.scheduled and (step.late - step.held) / step.scheduled > crit.late_fraction:
        out.append(("generator", f"{step.late - step.held:,} of {step.scheduled:,} sends were late "
                                 f"(> {crit.late_fraction:.0%}): the fleet cannot keep its schedule"))
    elif step.scheduled and step.late / step.scheduled > crit.late_fraction:
        out.append(("held", f"{step.late:,} of {step.scheduled:,} sends were late (> {crit.late_fraction:.0%}), "
                            f"{step.held:,} of them waiting for a request slot the stack held: it answers slower "
                            f"than it is sent to"))
    ref = step.send_rate
    if step.ack_rate < (1 - tol) * ref:
        out.append(("acked-rate", f"acked {step.ack_rate:,.0f}/s < {1 - tol:.0%} of sent {ref:,.0f}/s"))
    if step.stored_rate is not None and step.stored_rate < (1 - tol) * ref:
        out.append(("stored-rate", f"stored {step.stored_rate:,.0f}/s < {1 - tol:.0%} of sent {ref:,.0f}/s"))
    if (step.backlog_slope is not None and step.backlog_slope > max(crit.slope_fraction * step.target, crit.slope_min)
            and (step.backlog_end is None or step.backlog_end > crit.backlog_floor_s * step.target)):
        out.append(("backlog-growth", f"backlog grew {step.backlog_slope:,.0f} msg/s during the step "
                                      f"(to {step.backlog_end or 0:,.0f})"))
    if (step.p99_ms is not None and baseline_p99_ms is not None and step.p99_ms > crit.latency_k * baseline_p99_ms
            and step.p99_ms > crit.latency_floor_ms):
        out.append(("latency-knee", f"p99 {step.p99_ms:,.0f} ms > {crit.latency_k:g} x the first step's "
                                    f"{baseline_p99_ms:,.0f} ms (and > {crit.latency_floor_ms:g} ms)"))
    if crit.gc_fraction is not None and step.gc_fraction is not None and step.gc_fraction > crit.gc_fraction:
        out.append(("gc", f"saturated by GC: {step.gc_fraction:.0%} of the window in GC "
                          f"(> {crit.gc_fraction:.0%})"))
    return out


def judge_step(step: Step, baseline_p99_ms: float | None, crit: Criteria = Criteria()) -> tuple[str | None, str]:
    """``(criterion, reason)`` of a step the stack did not keep up with, ``(None, "")`` if it did: the first
    of :func:`step_failures`, its reason naming the others too (:func:`verdict`)."""
    criterion, reason, _ = verdict(step_failures(step, baseline_p99_ms, crit))
    return criterion, reason


def verdict(failures: list[tuple[str, str]]) -> tuple[str | None, str, list[str]]:
    """``(criterion, reason, criteria)`` of a step's failures: the first criterion names the step; the reason
    is the first's, then each further one as ``criterion: reason``, so no failure hides behind another (pure)."""
    if not failures:
        return None, "", []
    names = list(dict.fromkeys(c for c, _ in failures))
    reason = "; ".join(r if k == 0 else f"{c}: {r}" for k, (c, r) in enumerate(failures))
    return failures[0][0], reason, names


@dataclass
class Decision:
    capacity_msg_s: float | None       # highest step kept up with (None: not even the first)
    criterion: str                     # what stopped it: one of CRITERIA, "max-rate" or "interrupted"
    reason: str
    lower_bound: bool                  # capacity is only a lower bound (generator-bound or max rate reached)
    generator_bound: bool
    failed_step: int | None

    def line(self) -> str:
        if self.capacity_msg_s is None:
            return f"no step kept up: {self.criterion}: {self.reason}"
        if self.generator_bound:
            return (f"capacity >= {self.capacity_msg_s:,.0f} msg/s (generator-bound: {self.reason})")
        if self.lower_bound:
            return f"capacity >= {self.capacity_msg_s:,.0f} msg/s ({self.criterion}: {self.reason})"
        return f"capacity {self.capacity_msg_s:,.0f} msg/s (stopped by {self.criterion}: {self.reason})"


def decide(steps: list[Step], crit: Criteria = Criteria(), *, finished: bool = True) -> Decision:
    """The capacity a step table shows: judge each step (baseline p99 = the first step's), stop at the
    first failing one. ``finished=False``: the ramp was interrupted before it failed or reached its end."""
    baseline = steps[0].p99_ms if steps else None
    best: float | None = None
    for s in steps:
        criterion, reason, s.criteria = verdict(step_failures(s, baseline, crit))
        s.ok, s.criterion, s.reason = criterion is None, criterion, reason
        if criterion is not None:
            gen = criterion == "generator"
            if best is None and s.sent > 0 and s.acked < 0.1 * s.sent:
                # nothing (or next to nothing) acked at the first step: a stack still starting, not its capacity
                reason += (f"; it acked {s.acked:,} of {s.sent:,} sent at the first step: was it still starting? "
                           "(a longer --warmup-seconds gives a cold start time)")
            return Decision(best, criterion, f"at {s.target:,.0f} msg/s: {reason}", gen and best is not None,
                            gen, s.index)
        best = s.target if best is None else max(best, s.target)
    if not steps:
        return Decision(None, "interrupted", "no step was measured", False, False, None)
    if not finished:
        return Decision(best, "interrupted", f"the ramp was stopped after {best:,.0f} msg/s", True, False, None)
    return Decision(best, "max-rate", f"every step kept up, up to the maximum rate {best:,.0f} msg/s", True,
                    False, None)


def ladder_rates(start: float, factor: float, max_rate: float) -> list[float]:
    """``start``, ``start*factor``, ... up to ``max_rate`` (included as the last step), rounded to msg/s."""
    if not start > 0 or not factor > 1 or not max_rate >= start:
        raise ValueError(f"need 0 < start_rate <= max_rate and factor > 1 (got {start:g}, {max_rate:g}, {factor:g})")
    out, r = [], float(start)
    while r < max_rate * (1 - 1e-9):
        out.append(float(round(r)))
        r *= factor
    out.append(float(round(max_rate)))
    return out


def slope(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (t, value) points; None with fewer than 3 points or no time spread."""
    if len(points) < 3:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    if den <= 0:
        return None
    return sum((t - mt) * (v - mv) for t, v in points) / den


def gc_window_fraction(points: list[tuple[float, float]]) -> float | None:
    """GC time / wall time over (t, cumulative gc_seconds) samples (a drop is a counter reset); None with
    fewer than two samples or no time spread."""
    pts = sorted(points)
    if len(pts) < 2 or pts[-1][0] - pts[0][0] <= 0:
        return None
    inc = sum(counter_steps(pts))
    return max(0.0, inc / (pts[-1][0] - pts[0][0]))


def measure_step(index: int, target: float, seconds: list[dict], stored: list[tuple[float, float]],
                 backlog: list[tuple[float, float]], exits: int = 0,
                 gc: list[tuple[float, float]] | None = None) -> Step:
    """A :class:`Step` from the measured window's per-second load stats (``load`` events / SecondStats
    fields) and the (t, value) samples of the storage count, the backlog and the GC-time counter inside
    the window."""
    st = Step(index, float(target), float(len(seconds)))
    for s in seconds:
        st.scheduled += int(s.get("scheduled", 0))
        st.sent += int(s.get("sent", 0))
        st.acked += int(s.get("acked", 0))
        st.failed += int(s.get("failed", 0))
        st.late += int(s.get("late", 0))
        st.held += int(s.get("held", 0))
    cpus = [float(s["gen_cpu_s"]) for s in seconds if s.get("gen_cpu_s") is not None]
    st.gen_cpu_s = round(sum(cpus), 4) if cpus else None
    p99s = [s["p99_ms"] for s in seconds if s.get("p99_ms") is not None]
    st.p99_ms = float(statistics.median(p99s)) if p99s else None
    st.stored_rate = slope(stored)
    st.backlog_slope = slope(backlog)
    st.backlog_end = backlog[-1][1] if backlog else None
    st.exits = exits
    st.gc_fraction = gc_window_fraction(gc or [])
    return st


# ---------------------------------------------------------- calibration files

def calibration_dir() -> Path:
    """``$MONSOON_CALIBRATION_DIR``, else the user's cache: ``$XDG_CACHE_HOME/monsoon/calibration`` (default
    ``~/.cache/monsoon/calibration``). A calibration belongs to the machine, not to a checkout or a run: a fresh
    clone on the same host reuses it while its key (:func:`usable`) still holds."""
    d = settings.env(DIR_ENV)
    if d:
        return Path(d)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "monsoon" / CALIBRATION_DIR


def stack_sha256(stack_spec) -> str | None:
    """sha256 of the stack's file (part of a calibration's key: an edited stack is measured again)."""
    src = getattr(stack_spec, "source", "")
    if not src or not Path(src).is_file():
        return None
    return hashlib.sha256(Path(src).read_bytes()).hexdigest()


def service_cpus() -> str | None:
    """The CPU budget the stack's services run under (``$MONSOON_SERVICE_CPUS``), part of a calibration's key."""
    return settings.env("MONSOON_SERVICE_CPUS") or None


def calibration_file(cal_dir: Path, stack: str) -> Path:
    return Path(cal_dir) / f"{stack}.json"


def max_age_s() -> float:
    """``$MONSOON_CALIBRATION_MAX_AGE_DAYS`` (default 7) in seconds."""
    raw = settings.env(MAX_AGE_ENV)
    try:
        days = float(raw) if raw else DEFAULT_MAX_AGE_DAYS
    except ValueError:
        raise ValueError(f"{MAX_AGE_ENV}={raw!r}: want a number of days") from None
    return days * 86400.0


def usable(cal: dict | None, *, host: str, max_age: float, now: float, profile: str | None = None,
           jars: dict[str, str] | None = None, stack_file: str | None = None,
           cpus: str | None = None) -> tuple[bool, str]:
    """Whether a saved calibration may stand for this machine now, and why not: same host, recent, and (when
    given) the same profile (the stack's per-profile settings, e.g. its heap, set its capacity), the same
    jars (a rebuilt platform may be faster or slower), the same stack file (sha256) and the same CPU budget
    of the services (``$MONSOON_SERVICE_CPUS``). A changed key measures again."""
    if not cal:
        return False, "not yet calibrated"
    if cal.get("capacity_msg_s") is None:
        return False, f"the saved calibration found no capacity ({cal.get('result', '?')})"
    if cal.get("host") != host:
        return False, f"calibrated on host {cal.get('host')!r}, this is {host!r}"
    age = now - float(cal.get("created", 0))
    if age > max_age:
        return False, f"calibrated {age / 86400:.1f} days ago (max age {max_age / 86400:g} days, ${MAX_AGE_ENV})"
    if profile is not None and cal.get("profile") not in (None, profile):
        return False, f"calibrated with profile {cal.get('profile')!r}, this run is {profile!r}"
    saved = cal.get("jar_sha256") or {}
    if jars and saved:
        changed = sorted(n for n in set(saved) | set(jars) if saved.get(n) != jars.get(n))
        if changed:
            return False, f"{', '.join(changed)} changed since the calibration (sha256)"
    if stack_file and cal.get("stack_sha256") not in (None, stack_file):
        return False, "the stack file changed since the calibration (sha256)"
    if cal.get("service_cpus") != cpus:
        return False, (f"calibrated with the services' CPU budget {cal.get('service_cpus') or 'none'}, this run has "
                       f"{cpus or 'none'} ($MONSOON_SERVICE_CPUS)")
    return True, ""


def usable_here(cal: dict | None, stack_spec, profile: str) -> tuple[bool, str]:
    """:func:`usable` for ``stack_spec`` on this host now, with its whole key (profile, jars, stack file, CPU
    budget)."""
    return usable(cal, host=socket.gethostname(), max_age=max_age_s(), now=time.time(), profile=profile,
                  jars=jar_sha256(stack_spec), stack_file=stack_sha256(stack_spec), cpus=service_cpus())


def read_calibration(path: Path) -> dict | None:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def describe_auto(fraction: float, stack_spec, cal_dir: Path, profile: str) -> str:
    """For a dry run: what ``base_rate: auto`` would resolve to, without a live stack, judged by the same whole
    key as the run (:func:`usable_here`): a dry run that names a saved capacity is a run that will use it."""
    stack = stack_spec.name
    path = calibration_file(cal_dir, stack)
    cal = read_calibration(path)
    ok, why = usable_here(cal, stack_spec, profile)
    if ok:
        assert cal is not None      # usable() says yes to a saved calibration only
        cap = float(cal["capacity_msg_s"])
        return (f"base_rate: auto (fraction {fraction:g} of calibrated capacity {cap:,.0f} msg/s = "
                f"{fraction * cap:,.0f} msg/s; calibration file {path})")
    return (f"base_rate: auto (fraction {fraction:g} of calibrated capacity; {path}: {why}: "
            f"monsoon calibrate {stack} runs first)")


# ----------------------------------------------------------------- live ramp

@dataclass(frozen=True)
class Params:
    start_rate: float = 200.0
    factor: float = 1.25
    max_rate: float = 20000.0
    step_seconds: float = 10.0        # per step, settle included
    settle_seconds: float = 2.0
    warmup_seconds: float = 20.0      # at start_rate before the first step, not judged: a platform just
    #                                   started is slower than it will be (real TB on Cassandra backed up
    #                                   to 902 at 200 msg/s in its first 10 s, then kept up with 391)
    devices: int = 50
    qos: int = 1
    device_prefix: str = "monsoon"
    criteria: Criteria = field(default_factory=Criteria)

    def __post_init__(self) -> None:
        if not (self.step_seconds > self.settle_seconds >= 0) or self.step_seconds - self.settle_seconds < 3:
            raise ValueError(f"step_seconds ({self.step_seconds:g}) must exceed settle_seconds "
                             f"({self.settle_seconds:g}) by at least 3 s (the measured window)")
        if (self.step_seconds != int(self.step_seconds) or self.settle_seconds != int(self.settle_seconds)
                or self.warmup_seconds != int(self.warmup_seconds) or self.warmup_seconds < 0):
            raise ValueError("step_seconds, settle_seconds and warmup_seconds must be whole seconds (>= 0)")
        if self.devices < 1:
            raise ValueError("devices must be >= 1")
        ladder_rates(self.start_rate, self.factor, self.max_rate)


class RecordingTimeline(Timeline):
    """A timeline that also keeps the storage / backlog samples in memory for the step judge."""

    def __init__(self, path: Path):
        super().__init__(path)
        self.samples: list[dict] = []
        self._mem = threading.Lock()

    def __enter__(self) -> "RecordingTimeline":
        return self

    def add(self, type: str, **fields: Any) -> dict:
        ev = super().add(type, **fields)
        if type == SAMPLE and fields.get("collector") in ("storage", "metrics", "kafka"):
            with self._mem:
                self.samples.append(ev)
        return ev

    def series(self, collector: str, key: str, a: float, b: float) -> list[tuple[float, float]]:
        with self._mem:
            return [(e["t"], float(e[key])) for e in self.samples
                    if e.get("collector") == collector and a <= e["t"] <= b
                    and isinstance(e.get(key), (int, float))]


def ramp(stack, tl: "RecordingTimeline", params: Params, out_dir: Path, steps: list[Step], *, label: str,
         progress: Progress, stop: threading.Event, exits: list[float], payload=None,
         phase_prefix: str = "", mix=None) -> bool:
    """The ladder of :class:`Params` on a started ``stack``: connect a fleet (its acked and latency logs in
    ``out_dir``, its phases ``<phase_prefix>step..``), send the steps, judge each (appended to ``steps``, also
    as ``calibration-step`` events) and stop at the first one not kept up.  ``exits``: timeline times of the
    service's exits (:class:`StackEvents`).  True when every step of the ladder was measured.

    ``mix`` (a request mix, :mod:`monsoon.run.mix`): the ladder is in ops/s of the whole mix; the fleet sends
    ``mix.write_share`` of each step as device writes, ``mix.start(rates)`` the rest beside it, and a step that
    is also judged by ``mix.failures(window, first_window)`` over its window's seconds, every failed criterion
    of both named in the step's reason."""
    halt = threading.Event()             # ours: set at the first failing step
    rates = ladder_rates(params.start_rate, params.factor, params.max_rate)
    step_s, settle, warm = int(params.step_seconds), int(params.settle_seconds), int(params.warmup_seconds)
    share = mix.write_share if mix is not None else 1.0   # the fleet's part of each step's rate
    shape = Stages(((Stage(f"{phase_prefix}warmup", float(warm), rates[0] * share),) if warm else ())
                   + tuple(Stage(f"{phase_prefix}step{i:02d}-{r:g}", float(step_s), r * share)
                           for i, r in enumerate(rates)))
    first = len(steps)                   # the steps of this ladder start here (a sweep keeps one list per size)
    mine: list[Step] = []
    load = LoadHarness(tl)
    try:
        load.start(stack, FleetPlan(shape, params.devices, params.qos, params.device_prefix, payload), out_dir)
        fleet, sampler, t0 = load.fleet, load.sampler, load.t0
        assert sampler is not None and t0 is not None   # load.start() set both (or raised)
        backlog_key = ("kafka", "lag") if stack.spec.observe.kafka else ("metrics", "queue_depth")
        progress(f"[{label}] ramp: {params.devices} devices, {len(rates)} steps of {step_s}s "
                 f"({settle}s settle) from {rates[0]:,.0f} to at most {rates[-1]:,.0f} msg/s, x{params.factor:g} per step"
                 + (f", after a {warm}s warm-up at {rates[0]:,.0f} msg/s (not judged)" if warm else ""))
        per_sec: dict[int, dict] = {}

        def evaluate(i: int) -> bool:
            """Judge step i (its window is over); True to go on."""
            a, b = warm + i * step_s + settle, warm + (i + 1) * step_s
            secs = [per_sec[s] for s in range(a, b) if s in per_sec]
            ta, tb = t0 + a, t0 + b + 0.5
            st = measure_step(first + i, rates[i] * share, secs, tl.series("storage", "stored", ta, tb),
                              tl.series(*backlog_key, ta, tb),
                              exits=sum(1 for x in exits if t0 + warm + i * step_s <= x <= tb),
                              gc=tl.series("metrics", "gc_seconds", ta - 1.0, tb))
            fails = step_failures(st, mine[0].p99_ms if mine else st.p99_ms, params.criteria)
            if mix is not None:   # the operations are judged too, whatever the writes did: no failure hidden
                st.mix = mix.window(rates[i], a, b)
                fails += mix.failures(st.mix, mine[0].mix if mine else None)
            crit, reason, st.criteria = verdict(fails)
            st.ok, st.criterion, st.reason = crit is None, crit, reason
            steps.append(st)
            mine.append(st)
            tl.add(CALIBRATION_STEP, **st.to_dict(), window=[round(ta, 3), round(tb, 3)])
            progress(f"[{label}] step {i}: target {st.target:7,.0f}/s sent {st.send_rate:7,.0f}/s "
                     f"acked {st.ack_rate:7,.0f}/s stored {_f(st.stored_rate)}/s "
                     f"backlog slope {_f(st.backlog_slope)}/s p99 {_f(st.p99_ms)}ms"
                     + ("" if st.gc_fraction is None else f" gc {st.gc_fraction:.0%}") + " -> "
                     + ("kept up" if crit is None else f"NOT kept up ({crit}: {reason})"))
            return crit is None

        def on_second(s) -> None:
            per_sec[s.t] = load.record_second(s)
            # step i's window is [warm + i*step, warm + (i+1)*step); judge it one second into the next step
            u = s.t - warm
            if u % step_s == 0 and u >= step_s:
                i = u // step_s - 1
                if len(mine) == i and not halt.is_set() and not evaluate(i):
                    halt.set()     # stop at the first step not kept up: never stay above capacity
            if stop.is_set():
                halt.set()

        if mix is not None:
            mix.start(shape)
        totals = fleet.run(halt, on_second)
        if mix is not None:
            mix.stop()
        tl.add(OP, op=OP_LOAD_END, sent=totals.sent, acked=totals.acked, late=totals.late)
        if len(mine) == len(rates) - 1 and all(x.ok for x in mine) and not stop.is_set():
            time.sleep(1.5)        # one more sample after the last step's end
            evaluate(len(rates) - 1)
        fleet.close()
        sampler.stop()
        return len(mine) == len(rates)
    finally:
        if mix is not None:
            mix.stop()
        load.close()


def calibrate(stack_spec, out_dir: Path, *, run_id: str, profile: str = "quick", params: Params = Params(),
              progress: Progress = print, stop: threading.Event | None = None,
              save_to: Path | None = None) -> dict:
    """Ramp ``stack_spec`` (started fresh in ``out_dir``) until it stops keeping up; return the calibration
    record (also written to ``out_dir/calibration.json`` and, when given, ``save_to``)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stop = stop or threading.Event()     # the caller's: interrupts the ramp
    rates = ladder_rates(params.start_rate, params.factor, params.max_rate)
    label = f"{stack_spec.name}/calibrate"
    steps: list[Step] = []
    finished = [False]
    started = time.time()
    with RecordingTimeline(out_dir / TIMELINE_FILE) as tl:
        tl.add(META, kind="calibration", run_id=run_id, stack=stack_spec.name, profile=profile,
               stack_source=stack_spec.source, rates=rates,
               params={k: v for k, v in asdict(params).items() if k != "criteria"}, criteria=asdict(params.criteria))

        course = Course(tl, label, progress, watch=stack_spec.observe.service)
        with course.guarded():   # a signal goes on up: an interrupted calibration records nothing
            with course.start_stack(stack_spec, out_dir, run_id=run_id, profile=profile,
                                    detail=f" ({', '.join(stack_spec.start_order())}), profile {profile}") as stack:
                finished[0] = ramp(stack, tl, params, out_dir, steps, label=label, progress=progress, stop=stop,
                                   exits=course.events.exits)
        error = course.error

    failed = next((s for s in steps if not s.ok), None)
    dec = decide([Step.from_dict(s.to_dict()) for s in steps], params.criteria,
                 finished=finished[0] or failed is not None)
    if error and failed is None:
        dec = Decision(dec.capacity_msg_s, "error", error, dec.capacity_msg_s is not None, False, None)
    record = {
        "stack": stack_spec.name, "capacity_msg_s": dec.capacity_msg_s, "criterion": dec.criterion,
        "reason": dec.reason, "lower_bound": dec.lower_bound, "generator_bound": dec.generator_bound,
        "result": dec.line(), "steps": [s.to_dict() for s in steps], "profile": profile,
        "params": {k: v for k, v in asdict(params).items() if k != "criteria"}, "criteria": asdict(params.criteria),
        "host": socket.gethostname(), "cpu_count": os.cpu_count(),
        "date": _dt.datetime.fromtimestamp(started, _dt.timezone.utc).isoformat(timespec="seconds"),
        "created": round(started, 3), "seconds": round(time.time() - started, 1),
        "jar_sha256": jar_sha256(stack_spec), "run_id": run_id, "run_dir": str(out_dir),
        "stack_source": stack_spec.source, "stack_sha256": stack_sha256(stack_spec), "service_cpus": service_cpus(),
    }
    if error:
        record["error"] = error
    (out_dir / CALIBRATION_RECORD).write_text(json.dumps(record, indent=2))
    if save_to is not None and dec.capacity_msg_s is not None and not error:
        save_to.parent.mkdir(parents=True, exist_ok=True)
        tmp = save_to.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record, indent=2))
        tmp.replace(save_to)
        record["saved_to"] = str(save_to)
    progress(f"[{label}] {dec.line()}")
    return record


def _f(x: float | None) -> str:
    return "     -" if x is None else f"{x:6,.0f}"


# --------------------------------------------------------- base_rate: auto

def resolve_auto(stack_spec, fraction: float, *, cal_dir: Path, calibrate_dir: Path, run_id: str, profile: str,
                 progress: Progress = print, stop: threading.Event | None = None) -> dict:
    """x1 for ``base_rate: auto``: ``fraction`` x the stack's calibrated capacity. Uses the calibration
    file when usable (same host, recent), else calibrates first (into ``calibrate_dir``) and saves it.
    Returns ``{base_rate, capacity_msg_s, fraction, source, calibration_file, calibrated_at, ...}``;
    raises RuntimeError when the stack could not be calibrated."""
    path = calibration_file(cal_dir, stack_spec.name)
    cal = read_calibration(path)
    ok, why = usable_here(cal, stack_spec, profile)
    source = "calibration-file"
    if not ok:
        progress(f"[{stack_spec.name}] base_rate: auto: {path}: {why}; calibrating {stack_spec.name} first "
                 f"(run directory {calibrate_dir})")
        cal = calibrate(stack_spec, calibrate_dir, run_id=run_id, profile=profile, progress=progress, stop=stop,
                        save_to=path)
        source = "calibrated-now"
        if cal.get("capacity_msg_s") is None or cal.get("error"):
            raise RuntimeError(f"base_rate: auto: could not calibrate {stack_spec.name}: {cal.get('result')}"
                               + (f" ({cal['error']})" if cal.get("error") else "")
                               + f"; see {calibrate_dir}")
    assert cal is not None      # usable() says yes to a saved calibration only; else calibrate() made one
    cap = float(cal["capacity_msg_s"])
    out = {"base_rate": round(fraction * cap, 3), "capacity_msg_s": cap, "fraction": fraction, "source": source,
           "calibration_file": str(path), "calibrated_at": cal.get("date"), "lower_bound": cal.get("lower_bound"),
           "criterion": cal.get("criterion"), "factor": (cal.get("params") or {}).get("factor", Params.factor),
           "how": "calibration ramp", "generator_bound": cal.get("generator_bound")}
    out["x1"] = x1_line(out)
    out["generator_us_per_msg"] = generator_cost(cal)
    progress(f"[{stack_spec.name}] {out['x1']} ({source}: {path})")
    if cal.get("lower_bound"):
        progress(f"[{stack_spec.name}] WARNING: the calibrated capacity is only a lower bound "
                 f"({cal.get('result')}): the stack kept up with everything this machine's generator sent, so "
                 f"x{1 / fraction:g} of this x1 may not overload it; raise --max-rate, or set a fixed base_rate")
    return out


def saved_capacity(stack_spec, base_rate: float, *, cal_dir: Path, profile: str) -> dict | None:
    """A fixed-base_rate run's stack capacity: its saved calibration when usable (same host, recent, same
    profile and jars), in the shape :func:`resolve_auto` returns (``source: calibration-file, fixed base_rate``),
    so the result carries ``calibrated_capacity_msg_s`` and ``base_fraction`` next to its other figures (the
    side-by-side table, the drain prediction); None when there is no usable calibration (nothing is calibrated)."""
    path = calibration_file(cal_dir, stack_spec.name)
    cal = read_calibration(path)
    ok, _ = usable_here(cal, stack_spec, profile)
    if not ok:
        return None
    assert cal is not None      # usable() says yes to a saved calibration only
    cap = float(cal["capacity_msg_s"])
    out = {"base_rate": float(base_rate), "capacity_msg_s": cap, "fraction": round(float(base_rate) / cap, 4),
           "source": "calibration-file, fixed base_rate", "calibration_file": str(path),
           "calibrated_at": cal.get("date"), "lower_bound": cal.get("lower_bound"), "criterion": cal.get("criterion"),
           "fixed": True}
    out["x1"] = x1_line(out)
    return out


def generator_cost(cal: dict) -> float | None:
    """The load generator's CPU microseconds per sent message at the calibration's fastest step kept up with
    (None: not reported): what pacing a faster rate will cost this machine's generator."""
    kept = [s for s in cal.get("steps") or () if s.get("ok") and s.get("gen_cpu_s") and s.get("sent")]
    if not kept:
        return None
    top = max(kept, key=lambda s: s["sent"])
    return round(1e6 * float(top["gen_cpu_s"]) / float(top["sent"]), 2)


def pacing_warning(peak_rate: float, us_per_msg: float | None, engine: str, *, cores: float = 1.0,
                   headroom: float = 0.7) -> str | None:
    """Why the chosen engine may not pace ``peak_rate`` here (None: it can): the python fleet is one process,
    at most ``cores`` core, and a load that takes more than ``headroom`` of it falls behind its schedule."""
    if us_per_msg is None or engine != "python":
        return None
    need = peak_rate * us_per_msg / 1e6
    if need <= headroom * cores:
        return None
    return (f"the peak of {peak_rate:,.0f} msg/s needs ~{need:.2f} cores of the python fleet here ({us_per_msg:g} us "
            f"of CPU per message, measured in the calibration), more than {headroom:.0%} of the one core it runs "
            f"on: it may fall behind its schedule (load_valid says so); engine: native paces it at ~1 us per message")


def x1_line(info: dict | None, base_rate: float | None = None) -> str:
    """How x1 was chosen, in one line for the progress line, the checklist and the report: ``x1 = 580 msg/s =
    20 % of 2,900 msg/s measured at 2026-11-29 23:41 UTC``; a fixed rate says so (with the saved capacity, when
    there is one); a burst sized to fill the stack's memory says how."""
    if not info or info.get("base_rate") is None:
        return f"x1 = {base_rate:,.0f} msg/s (a fixed rate; the stack's capacity was not measured)" \
            if base_rate is not None else "x1 = ? (not settled)"
    when = str(info.get("calibrated_at") or "?").replace("T", " ").replace("+00:00", " UTC")
    frac = float(info.get("fraction") or 0)
    pct = f"{frac:.1%}" if frac < 0.1 and round(frac * 100) != frac * 100 else f"{frac:.0%}"   # 3.3 %, not 3 %
    line = (f"x1 = {float(info['base_rate']):,.0f} msg/s = {pct} of {float(info['capacity_msg_s']):,.0f} msg/s "
            f"measured at {when}")
    if info.get("fixed"):
        line = f"x1 = {float(info['base_rate']):,.0f} msg/s (fixed rate) = {pct} of the " \
               f"{float(info['capacity_msg_s']):,.0f} msg/s measured at {when}"
    if info.get("lower_bound"):
        line += " (a lower bound: the stack kept up with all the generator sent)"
    if info.get("burst_s") is not None:
        line += (f"; burst {info['burst_s']:g} s, to pass {info['fills_at']:,} queued messages (what fills the "
                 f"heap) {info['fill']:g}x at >= {info['growth_msg_s']:,.0f} msg/s of growth")
    return line


def fill_burst(burst_s: float, *, fill: float, fills_at: int, multiplier: float, fraction: float,
               capacity: float, factor: float) -> tuple[float, float]:
    """``(burst seconds, the least backlog growth in msg/s)``: the burst lasts at least ``burst_s``, and long
    enough that the backlog passes ``fills_at`` ``fill`` times over. The stack stores less than ``factor`` x
    ``capacity`` (the calibration's first step not kept up), so the backlog grows by at least
    ``(multiplier x fraction - factor) x capacity`` msg/s. ValueError when that is not positive: such a burst
    cannot be sure to fill anything."""
    growth = (multiplier * fraction - factor) * capacity
    if growth <= 0:
        raise ValueError(f"fill: x{multiplier:g} of x1 = {fraction:g} x capacity is {multiplier * fraction:g} x "
                         f"capacity, not above the {factor:g} x capacity the stack may still store: the backlog "
                         "need not grow; raise base_fraction or the multiplier, or drop fill")
    return max(float(burst_s), float(math.ceil(fill * fills_at / growth))), growth


def resolve_experiment(stack_spec, exp, profile: str, out_dir: Path, *, run_id: str, progress: Progress,
                       stop: threading.Event | None = None, dry_run: bool = False,
                       cal_dir: Path | None = None) -> tuple[Any, dict]:
    """The runner's side of ``base_rate: auto``: ``(exp with a numeric base_rate, how it was resolved)``.

    The calibration file is in ``cal_dir`` (default :func:`calibration_dir`: the user's cache); a
    calibration run goes to ``<run dir>/calibrate-<stack>/``.  A dry run starts nothing: the rate is
    the saved calibration's when there is one, else a placeholder, and ``describe`` says which."""
    out_dir = Path(out_dir)
    cal_dir = Path(cal_dir) if cal_dir is not None else calibration_dir()
    f = exp.load.fraction
    if dry_run:
        cal = read_calibration(calibration_file(cal_dir, stack_spec.name))
        ok, _ = usable_here(cal, stack_spec, profile)
        rate = f * float(cal["capacity_msg_s"]) if cal and ok else 1.0
        info = {"base_rate": rate if ok else None, "fraction": f, "source": "calibration-file" if ok else None,
                "describe": describe_auto(f, stack_spec, cal_dir, profile)}
    else:
        cdir = out_dir.parent / calibrate_dir_name(stack_spec.name)
        n = 2
        while cdir.exists():
            cdir, n = out_dir.parent / calibrate_dir_name(stack_spec.name, n), n + 1
        info = resolve_auto(stack_spec, f, cal_dir=cal_dir, calibrate_dir=cdir, run_id=run_id, profile=profile,
                            progress=progress, stop=stop)
        rate = info["base_rate"]
    return exp.model_copy(update={"load": exp.load.model_copy(update={"base_rate": float(rate)})}), info
