"""FaultPlan: a schedule of faults over a run, and a final heal that always runs.

    with FaultPlan(faults, backends, timeline, ctx=ctx, horizon=600) as plan:
        ... run the load ...
    plan.leftovers      # census after the final heal: {} when everything healed

``__enter__`` starts a scheduler thread that injects and heals at the planned
times (seconds from the plan's start) and writes one timeline event per action::

    {"type": "fault", "name", "kind", "backend", "target", "window", "phase": "inject"|"heal",
     "intended": t, "effective": t, "landed": bool|None, "evidence": {...}}

``__exit__`` — on success, an exception, Ctrl-C or SIGTERM (turned into
KeyboardInterrupt when nobody else handles it) — stops the scheduler, heals every
fault still in place, calls ``heal_all(run_id)`` on every backend in use (which
also catches what a crashed earlier run left) and takes a ``census``.

An action the scheduler is in the middle of is waited for, as long as its own
bounds allow (a heal first waits up to ``inject_check_timeout`` — longer when the
fault's own restart/verify timeouts are — for its inject's landing check, then
``action_timeout`` for the backend call), never cut off at a fixed time; a heal
whose action overstays even that is taken over by the final heal.  Every heal
writes its ``heal`` event before the census, the last scheduled one included.
"""
from __future__ import annotations

import signal
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from monsoon.faults.base import FaultBackend, FaultContext, Handle, Landing
from monsoon.signals import Interrupted
from monsoon.spec.fault import FaultSpec
from monsoon.spec.stack import SERVICE_POD_LABEL
from monsoon.timeline.events import FAULT, FAULT_CENSUS, FAULT_PLAN


@dataclass(frozen=True, order=True)
class Action:
    t: float
    order: int            # heal (0) before inject (1) at the same instant
    index: int            # fault index, for stable ordering
    window: int
    phase: str
    fault: FaultSpec

    @property
    def key(self) -> tuple[int, int]:
        return (self.index, self.window)


def schedule(faults: Sequence[FaultSpec], horizon: float) -> list[Action]:
    """Every inject/heal of the run in time order; a heal past the horizon is clamped to it."""
    out = []
    for i, f in enumerate(faults):
        for w, (start, end) in enumerate(f.schedule.windows(horizon)):
            out.append(Action(start, 1, i, w, "inject", f))
            out.append(Action(min(end, horizon), 0, i, w, "heal", f))
    return sorted(out)


def _service_of(fault: FaultSpec) -> dict[str, str]:
    """A Kubernetes target that selects one stack service's pods (``monsoon.io/service``): that service, so the
    timeline ties the pod's exit and restart to the fault as it does for a process kill."""
    k = fault.target.kube
    svc = k.label_selector.get(SERVICE_POD_LABEL) if k is not None else None
    return {"service": svc} if svc else {}


class FaultPlan:
    def __init__(self, faults: Sequence[FaultSpec], backends: Mapping[str, FaultBackend], timeline: Any, *,
                 ctx: FaultContext, horizon: float, clock: Callable[[], float] = time.monotonic,
                 wait: Callable[[float], bool] | None = None, verify: bool = True,
                 verify_workers: int = 4, handle_sigterm: bool = True, inject_check_timeout: float = 120.0,
                 action_timeout: float = 60.0, idle_grace: float = 5.0):
        missing = sorted({f.backend for f in faults} - set(backends))
        if missing:
            raise ValueError(f"no backend for {', '.join(missing)} (have: {', '.join(sorted(backends)) or 'none'})")
        self.faults = list(faults)
        self.backends = dict(backends)
        self.timeline = timeline
        self.ctx = ctx
        self.horizon = horizon
        self.actions = schedule(self.faults, horizon)
        self.clock = clock
        self._stop = threading.Event()
        self._wait = wait or self._stop.wait
        self.verify_enabled = verify
        self._pool = ThreadPoolExecutor(max_workers=verify_workers, thread_name_prefix="fault-verify")
        self._lock = threading.Lock()
        self.live: dict[tuple[int, int], Handle] = {}
        self._healing: dict[tuple[int, int], Handle] = {}   # a scheduled heal under way (off `live`)
        self._inject_checks: dict[tuple[int, int], Future] = {}
        self.inject_check_timeout = inject_check_timeout
        self.action_timeout = action_timeout
        self.idle_grace = idle_grace
        self._busy_until: float | None = None   # time.monotonic() by which the scheduler's action is due to end
        self._taken_over = False                # the final heal owns every handle now
        self.events: list[dict] = []
        self.errors: list[str] = []
        self.leftovers: dict[str, list[str]] = {}
        self.t0: float | None = None
        self._thread: threading.Thread | None = None
        self._handle_sigterm = handle_sigterm
        self._old_term: Any = None
        self._on_term: Any = None

    # --- time
    def now(self) -> float:
        return self.clock() - (self.t0 if self.t0 is not None else self.clock())

    # --- events
    def _event(self, a: Action | None, fault: FaultSpec, window: int, phase: str, intended: float | None,
               effective: float, landing: Landing | None, **extra: Any) -> None:
        ev = {"name": fault.name, "kind": fault.kind, "backend": fault.backend, "target": str(fault.target),
              **_service_of(fault), "window": window, "phase": phase, "intended": None if intended is None else round(intended, 3),
              "effective": round(effective, 3), "landed": None if landing is None else landing.landed,
              "evidence": {} if landing is None else landing.evidence, **extra}
        with self._lock:
            self.events.append(ev)
        self.timeline.add(FAULT, **ev)

    def _verify(self, backend: FaultBackend, handle: Handle) -> Landing:
        try:
            return backend.verify(handle)
        except Exception as e:  # a failed measurement is evidence, not a crash of the plan
            return Landing(None, {"method": "error", "error": f"{e.__class__.__name__}: {e}"})

    def _after(self, backend, handle, a, effective, key=None) -> Future | None:
        if not self.verify_enabled:
            self._event(a, a.fault, a.window, a.phase, a.t, effective, None)
            return None

        def job() -> None:
            self._event(a, a.fault, a.window, a.phase, a.t, effective, self._verify(backend, handle))
        try:
            return self._pool.submit(job)
        except RuntimeError:   # the pool is already shut down: measure here, the event is still written
            job()
            return None

    # --- bounds
    def _check_bound(self, fault: FaultSpec) -> float:
        """How long an inject's landing check may take: the plan's default, or the fault's own waits
        (a pod kill's restart_timeout, a backend's inject_timeout) when they are longer."""
        p = fault.params
        own = float(getattr(p, "restart_timeout", 0) or 0) + float(getattr(p, "verify_timeout", 0) or 0)
        own = max(own, float(getattr(self.backends.get(fault.backend), "inject_timeout", 0) or 0))
        return max(self.inject_check_timeout, own + 10.0) if own else self.inject_check_timeout

    def _await_inject_check(self, key: tuple[int, int], fault: FaultSpec) -> None:
        """Wait (within its bound) for the landing check of an inject, so it is judged before the heal."""
        fut = self._inject_checks.pop(key, None)
        if fut is not None:
            try:
                fut.result(timeout=self._check_bound(fault))
            except Exception:   # the check writes its own event; a failed one is judged there
                pass

    def _bound(self, a: Action) -> float:
        """How long the scheduler may be busy with one action."""
        return self.action_timeout + (self._check_bound(a.fault) if a.phase == "heal" else 0.0)

    # --- actions
    def _do(self, a: Action) -> None:
        backend = self.backends[a.fault.backend]
        if a.phase == "inject":
            try:
                handle = backend.inject(a.fault, self.ctx)
            except Exception as e:
                self.errors.append(f"inject {a.fault.name}: {e}")
                self._event(a, a.fault, a.window, "inject", a.t, self.now(),
                            Landing(False, {"method": "inject", "error": f"{e.__class__.__name__}: {e}"}))
                return
            eff = self.now()
            with self._lock:
                late = self._taken_over
                if not late:
                    self.live[a.key] = handle
            if late:   # the inject overstayed its bound and the final heal is over: undo it at once
                self.errors.append(f"inject {a.fault.name} returned after the final heal: healed at once")
                try:
                    backend.heal(handle)
                except Exception as e:
                    self.errors.append(f"heal {a.fault.name}: {e}")
                return
            fut = self._after(backend, handle, a, eff)
            if fut is not None:
                self._inject_checks[a.key] = fut
            return
        with self._lock:
            popped = self.live.pop(a.key, None)
            if popped is None:
                return   # the inject failed: nothing to heal
            handle = popped
            self._healing[a.key] = handle
        self._await_inject_check(a.key, a.fault)   # judge the inject before undoing it
        with self._lock:
            if self._healing.get(a.key) is not handle:
                return   # the final heal took it over
        try:
            backend.heal(handle)
        except Exception as e:
            self.errors.append(f"heal {a.fault.name}: {e}")
            with self._lock:
                mine = self._healing.pop(a.key, None) is handle
                if mine:
                    self.live[a.key] = handle          # the final heal retries it
            if mine:
                self._event(a, a.fault, a.window, "heal", a.t, self.now(),
                            Landing(False, {"method": "heal", "error": f"{e.__class__.__name__}: {e}"}))
            return
        with self._lock:
            mine = self._healing.pop(a.key, None) is handle
        if mine:   # else the final heal took it over and writes its event
            self._after(backend, handle, a, self.now())

    def run(self) -> None:
        """Execute the schedule in the calling thread until done or stopped."""
        if self.t0 is None:
            self.t0 = self.clock()
        for a in self.actions:
            while True:
                delay = a.t - self.now()
                if delay <= 0:
                    break
                if self._wait(min(delay, 1.0)) or self._stop.is_set():
                    return
            with self._lock:
                if self._stop.is_set():
                    return
                self._busy_until = time.monotonic() + self._bound(a)
            try:
                self._do(a)
            finally:
                with self._lock:
                    self._busy_until = None

    def start(self) -> "FaultPlan":
        self.t0 = self.clock()
        # the plan's clock starts here: a fault's timeline time is this event's t + its "effective"
        self.timeline.add(FAULT_PLAN, run_id=self.ctx.run_id, horizon=self.horizon,
                          faults=[{"name": f.name, "kind": f.kind, "backend": f.backend, "target": str(f.target),
                                   "windows": f.schedule.windows(self.horizon)} for f in self.faults])
        self._thread = threading.Thread(target=self._run_safe, name="fault-plan", daemon=True)
        self._thread.start()
        return self

    def _run_safe(self) -> None:
        try:
            self.run()
        except BaseException as e:  # never let the scheduler die silently
            self.errors.append(f"scheduler: {e.__class__.__name__}: {e}")

    # --- the final heal
    def _join_scheduler(self) -> None:
        """Wait for the scheduler to stop: as long as the action it is in may take, a short grace when idle."""
        t = self._thread
        if t is None or t is threading.current_thread():
            return
        idle_until = time.monotonic() + self.idle_grace
        while t.is_alive():
            with self._lock:
                busy = self._busy_until
            if busy is not None:
                idle_until = time.monotonic() + self.idle_grace   # once the action ends: a grace to leave
            left = (busy if busy is not None else idle_until) - time.monotonic()
            if left <= 0:
                self.errors.append("scheduler: still busy past its action's bound; the final heal takes over")
                return
            t.join(timeout=min(left, 1.0))

    def heal_all(self) -> dict[str, list[str]]:
        """Stop scheduling, heal what is live, sweep every backend for the run, take the census."""
        self._stop.set()
        self._join_scheduler()
        with self._lock:
            self._taken_over = True
            live = sorted([*self.live.items(), *self._healing.items()], key=lambda kv: kv[0])
            self.live.clear()
            self._healing.clear()
        for (i, w), handle in live:
            fault = self.faults[i]
            backend = self.backends[fault.backend]
            self._await_inject_check((i, w), fault)   # judge the inject before undoing it, as a scheduled heal does
            try:
                backend.heal(handle)
                landing = self._verify(backend, handle) if self.verify_enabled else None
            except Exception as e:
                self.errors.append(f"final heal {fault.name}: {e}")
                landing = Landing(False, {"method": "heal", "error": f"{e.__class__.__name__}: {e}"})
            self._event(None, fault, w, "heal", None, self.now(), landing, final=True)
        swept: dict[str, list[str]] = {}
        for name in sorted({f.backend for f in self.faults}):
            try:
                swept[name] = self.backends[name].heal_all(self.ctx.run_id)
            except Exception as e:
                self.errors.append(f"heal_all {name}: {e}")
        self._pool.shutdown(wait=True, cancel_futures=False)
        self.leftovers = self.census()
        self.timeline.add(FAULT_CENSUS, run_id=self.ctx.run_id, swept=swept, leftovers=self.leftovers,
                          errors=list(self.errors))
        return self.leftovers

    def census(self) -> dict[str, list[str]]:
        """What of this run is still in place, per backend (only non-empty entries)."""
        out: dict[str, list[str]] = {}
        for name in sorted({f.backend for f in self.faults}):
            try:
                left = self.backends[name].census(self.ctx.run_id)
            except Exception as e:
                left = [f"census failed: {e.__class__.__name__}: {e}"]
            if left:
                out[name] = left
        return out

    # --- context manager
    def __enter__(self) -> "FaultPlan":
        if (self._handle_sigterm and threading.current_thread() is threading.main_thread()
                and signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None)):
            def on_term(signum, frame):
                raise Interrupted("SIGTERM", "monsoon: SIGTERM during a fault plan")
            self._on_term = on_term
            self._old_term = signal.signal(signal.SIGTERM, on_term)
        try:
            return self.start()
        except BaseException:
            self.heal_all()
            raise

    def __exit__(self, *exc: Any) -> None:
        try:
            self.heal_all()
        finally:
            # put the previous handler back only if ours is still there: a teardown shield that took over
            # SIGTERM around this exit (monsoon.run.shield.TeardownShield) must stay in place until it comes down
            if self._old_term is not None and signal.getsignal(signal.SIGTERM) is self._on_term:
                signal.signal(signal.SIGTERM, self._old_term)
            self._old_term = self._on_term = None
