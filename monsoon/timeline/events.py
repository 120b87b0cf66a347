"""Every timeline event, declared once: its type, its fields (required and optional) and what it says.

The timeline (``timeline.jsonl``) is the contract between the live run and every check, report and analysis
that reads it afterwards.  Each line is one event ``{"type": ..., "t": ..., "wall": ..., **fields}``: ``t`` is
the timeline's seconds since it opened, ``wall`` the wall clock (both written by :meth:`Timeline.add`; a writer
that knows the time better, a replay or a test, may give them).  This module is the one place an event type,
an ``op`` and a service event are spelled: writers name them through the constants below, readers too, and
:meth:`~monsoon.timeline.store.Timeline.add` refuses an undeclared type, op, service event or field name
(:func:`check`: one dict lookup and one set comparison per event).

``required`` is what every writer writes and a reader may rely on *in a run written now*; it is checked on every
writer's call in the source by ``tests/unit/test_timeline_events.py`` (not at run time: a test or a partial
writer may write less).  Runs written before a field existed lack it: readers keep using ``.get``.  Reading
never validates: every run directory ever written keeps loading.

Two types carry a sub-kind, each declared here too: ``op`` (its field ``op``: one step of the run's course)
and ``service`` (its field ``event``: one moment of a stack service's life).  Two are open, any further field
allowed: ``sample`` (a collector's own values) and ``platform`` (the facts the running platform reports)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping

#: fields every event has: its timeline time (s) and wall-clock time, written by Timeline.add
ENVELOPE = frozenset({"t", "wall"})


class UndeclaredEvent(ValueError):
    """An event type, op, service event or field name that this module does not declare."""


@dataclass(frozen=True)
class Declared:
    """One declared event type (or one ``op``, or one service ``event``)."""
    name: str
    doc: str
    required: frozenset[str]
    optional: frozenset[str]
    open: bool = False         # further fields allowed (a collector's values, the platform's facts)

    @property
    def fields(self) -> frozenset[str]:
        return self.required | self.optional


EVENTS: dict[str, Declared] = {}           # event type -> declaration
OPS: dict[str, Declared] = {}              # "op" events: the value of their ``op`` field -> declaration
SERVICE_EVENTS: dict[str, Declared] = {}   # "service" events: the value of their ``event`` field -> declaration
#: the types whose events carry a sub-kind: type -> (the field naming it, its declarations)
KINDS: dict[str, tuple[str, dict[str, Declared]]] = {}


def _declare(table: dict[str, Declared], name: str, doc: str, required: Iterable[str] = (),
             optional: Iterable[str] = (), *, open: bool = False) -> str:
    if name in table:
        raise ValueError(f"timeline event {name!r} declared twice")
    table[name] = Declared(name, doc, frozenset(required), frozenset(optional), open)
    return name


def event(name: str, doc: str, required: Iterable[str] = (), optional: Iterable[str] = (), *,
          open: bool = False) -> str:
    return _declare(EVENTS, name, doc, required, optional, open=open)


def op(name: str, doc: str, required: Iterable[str] = (), optional: Iterable[str] = ()) -> str:
    return _declare(OPS, name, doc, required, optional)


def service_event(name: str, doc: str, required: Iterable[str] = (), optional: Iterable[str] = ()) -> str:
    return _declare(SERVICE_EVENTS, name, doc, required, optional)


# --- what the run is ------------------------------------------------------------------------------------------
META = event("meta", "What the run is: its id, stack, experiment, profile and plan; the timeline's first event.",
             ["run_id", "stack", "profile"],
             ["experiment", "kind", "base_rate", "base_rate_auto", "env", "restart", "shape", "multiplier",
              "devices", "qos", "transport", "engine", "workers", "durations", "stack_source", "experiment_source",
              "queue_depth_uncounted",              # observe.queue_depth_uncounted: per device, below zero
              "checks", "faults",
              "rates", "params", "criteria",       # a calibration (kind "calibration")
              "mix", "shares",                     # a request mix (kind "request-mix")
              "sizes", "sweep"])                   # a size sweep (kind "size-sweep")
PLATFORM = event("platform", "What the running platform says it is (version, queue, time-series database...).",
                 optional=["version", "queue", "ts_database"], open=True)
PHASE = event("phase", "One phase of the load shape (warmup, burst, recovery...), in timeline seconds.",
              ["name", "start", "end"])

# --- the load and what was observed ---------------------------------------------------------------------------
LOAD = event("load", "One second of the fleet (SecondStats; sec: the fleet's second index).",
             ["sec", "target_rate", "scheduled", "sent", "acked", "failed", "late", "connected",
              "p50_ms", "p99_ms", "max_ms"],
             ["gen_cpu_s", "held"])
SAMPLE = event("sample", "One collector's values at one tick (its own fields), or the error it raised.",
               ["collector"], ["error"], open=True)
SILENCE = event("silence", "A collector that answered nothing from start to end (open: until the end of the run).",
                ["collector", "start", "end", "reason"], ["open"])
SERVICE = event("service", "A moment in a stack service's life; its `event` field is one of SERVICE_EVENTS.",
                ["service", "event"])
OP = event("op", "One step of the run's course; its `op` field is one of OPS.", ["op"])

# --- faults ---------------------------------------------------------------------------------------------------
FAULT_PLAN = event("fault-plan", "The fault plan starts: its faults and their windows; a fault's time is this t + "
                   "its effective.", ["run_id", "horizon", "faults"])
FAULT = event("fault", "One inject or heal of a fault window: when it was meant and done, and whether it landed.",
              ["name", "kind", "backend", "target", "window", "phase", "intended", "effective", "landed",
               "evidence"],
              ["service",       # the stack service a Kubernetes target selects
               "final"])        # a heal of the final heal (after the load)
FAULT_CENSUS = event("fault-census", "After the final heal: what was swept, what was left in place, what failed.",
                     ["run_id", "swept", "leftovers"], ["errors"])

# --- the end of the load --------------------------------------------------------------------------------------
DRAIN = event("drain", "The wait after the load for the platform to store what it accepted.",
              ["drained", "waited_s", "backlog"], ["signal"])
STORED = event("stored", "Storage read back into a dataset (final: read again after the other services stopped).",
               ["path", "rows"], ["seconds", "final", "stopped", "at_drain", "at_drain_path"])

# --- calibrations and sweeps ----------------------------------------------------------------------------------
CALIBRATION_STEP = event("calibration-step", "One measured step of a calibration ladder (its Step, and its window).",
                         ["index", "target", "seconds", "window"],
                         ["scheduled", "sent", "acked", "failed", "late", "held", "stored_rate", "backlog_slope",
                          "backlog_end", "p99_ms", "exits", "gc_fraction", "gen_cpu_s", "ok", "criterion", "reason",
                          "mix", "criteria", "send_rate", "ack_rate"])
SWEEP_SIZE = event("sweep-size", "One payload size of a size sweep measured: its capacity and why it stopped there.",
                   ["size", "capacity_msg_s", "criterion", "reason", "lower_bound", "generator_bound", "result",
                    "ladder"],
                   ["backlog_after", "transport"])

# --- ops: the run's course (type "op", field "op") -------------------------------------------------------------
OP_COURSE = op("course", "The run enters a stage of its course (monsoon.run.course): starting the stack, load, "
               "drain, read-back or teardown.", ["stage"])
OP_STACK_START = op("stack-start", "The stack starts, on these ports (attempt: a retry on new ports counts up).",
                    ["stack", "ports", "attempt"])
OP_STACK_RETRY = op("stack-retry", "A service found its port taken: the stack stops and starts again.",
                    ["stack", "attempt", "reason"])
OP_IMAGE_IMPORT = op("image-import", "An image imported into the cluster for the run.", ["image", "seconds"])
OP_NAMESPACE = op("namespace", "The run's Kubernetes namespace: created, deleted, delete-failed or still-there; "
                  "service: a ClusterIP Service made in it (pods on the pod network).",
                  ["namespace", "event"], ["error", "seconds", "service", "cluster_ip", "ports"])
OP_HELM_RELEASE = op("helm-release", "The stack's Helm release: installed, scaled (a service's workload to "
                     "helm.replicas, all ready), found (not monsoon's: never touched), uninstalled or "
                     "uninstall-failed.", ["release", "namespace", "event"],
                     ["error", "seconds", "service", "workload", "replicas"])
OP_PREFLIGHT = op("preflight", "Every declared endpoint answered before anything was sent.", ["ok"])
OP_PROVISIONED = op("provisioned", "The run's devices provisioned.", ["devices", "seconds"])
OP_CONNECTED = op("connected", "The fleet connected (the native engine: in how many seconds, and how many DTLS "
                  "handshakes it gave up and began again).", ["devices"], ["seconds", "handshake_restarts"])
OP_MIX_WARMUP = op("mix-warmup", "A request mix's warm-up: entities found and read.", [],
                   ["entities", "found", "seconds"])
OP_SWEEP_SIZE = op("sweep-size", "A size sweep starts one payload size's ladder.", ["size", "start_rate", "max_rate"])
OP_THREAD_DUMP = op("thread-dump", "A JVM thread dump taken while ingestion stalled (path), or why not (error).",
                    ["pid", "sec"], ["path", "acked", "target_rate", "p99_ms", "error"])
OP_LOAD_END = op("load-end", "The load is over: the fleet's totals (FleetTotals, without last_seq).",
                 ["sent", "acked"],
                 ["scheduled", "failed", "late", "dropped", "unacked", "p50_ms", "p99_ms", "max_ms", "reconnects",
                  "elapsed_s", "lost_in_flight", "cpus",
                  "failures",      # a request fleet's failures by cause
                  "legs"])         # Hono's fleets: each leg's summary (monsoon.load.hono.HonoTotals)
OP_FINAL_READ_BACK = op("final-read-back", "Reading storage again after the other services stopped failed.",
                        ["ok", "error"])
OP_DEPROVISIONED = op("deprovisioned", "The devices a registry holds for the run deleted (or why not).", [],
                      ["devices", "ok", "error"])
OP_BEFORE_STOP = op("before-stop", "A step before the stack's stop (deprovisioning) failed.", ["ok", "error"])
OP_ERROR = op("error", "The run failed to run: what was raised.", ["error"], ["traceback"])
OP_INTERRUPTED = op("interrupted", "A signal cut the run short: which, when and in which stage (and phase).", [],
                    ["signal", "stage", "phase"])

# --- service events (type "service", field "event") -----------------------------------------------------------
SVC_START = service_event("start", "A service (process, container or pod) started; n: its start count.",
                          ["pid", "n"], ["container", "image", "pod", "uid", "restart_count",
                                         "ip"])      # a pod's IP (its own on the pod network)
SVC_READY = service_event("ready", "A service answered its readiness probe, after_s after its start.", ["after_s"])
SVC_DONE = service_event("done", "A one-shot service (a setup job) finished with its exit code.", ["code", "after_s"])
SVC_EXIT = service_event("exit", "A service died while the stack ran: its code and cause, whether OOM-killed.",
                         ["code", "cause", "oom", "pid"],
                         ["container", "signal", "pod", "uid", "reason", "kernel_log"])
SVC_RESTART = service_event("restart", "A service restarted by its policy (by: kubelet, for a pod).", ["n"], ["by"])
SVC_RESTART_FAILED = service_event("restart-failed", "Restarting a dead service failed.", ["error"])
SVC_STOP = service_event("stop", "A service stopped by the stack's own stop, with its exit code.", ["code"])

KINDS[OP] = ("op", OPS)
KINDS[SERVICE] = ("event", SERVICE_EVENTS)


# --- validation -----------------------------------------------------------------------------------------------
def _names(d: Declared, *more: Iterable[str]) -> frozenset[str]:
    out = set(d.fields) | ENVELOPE
    for m in more:
        out |= set(m)
    return frozenset(out)


# a declared, closed type without sub-kinds -> every field name it may carry (the hot path: one lookup, one <=)
_PLAIN: dict[str, frozenset[str]] = {n: _names(d) for n, d in EVENTS.items() if not d.open and n not in KINDS}
# a type with sub-kinds -> (its kind field, kind -> every field name an event of that kind may carry); looked up
# with whatever an event's kind field holds (absent: None)
_KINDED: dict[str, tuple[str, dict[Any, frozenset[str]]]] = {
    t: (field, {k: _names(d, EVENTS[t].fields) for k, d in table.items()}) for t, (field, table) in KINDS.items()}


def check(type: str, fields: Mapping[str, Any]) -> None:
    """Raise :class:`UndeclaredEvent` unless ``type`` is declared and every name in ``fields`` is one of its
    fields (an ``op`` or service event: of that op's or event's).  Required fields are not checked here
    (:func:`missing` says which are absent).  Costs a dict lookup and a set comparison for most events."""
    allowed = _PLAIN.get(type)
    if allowed is None:
        kinded = _KINDED.get(type)
        if kinded is not None:
            try:
                allowed = kinded[1].get(fields.get(kinded[0]))
            except TypeError:       # an unhashable kind: said by the slow path
                allowed = None
    if allowed is not None and fields.keys() <= allowed:
        return
    _check_slow(type, fields)


def _check_slow(type: str, fields: Mapping[str, Any]) -> None:
    allowed = _PLAIN.get(type)
    if allowed is None:
        kinded = _KINDED.get(type)
        if kinded is not None:
            field, kinds = kinded
            kind = fields.get(field)
            allowed = kinds.get(kind) if isinstance(kind, str) else None
            if allowed is None:
                raise UndeclaredEvent(f"timeline event {type!r} with {field}={kind!r}: no such {field} is declared "
                                      f"in monsoon/timeline/events.py (declared: {', '.join(sorted(kinds))})")
            type = f"{type} {field}={kind}"
        else:
            d = EVENTS.get(type)
            if d is None:
                raise UndeclaredEvent(f"timeline event type {type!r} is not declared in monsoon/timeline/events.py "
                                      f"(declared: {', '.join(sorted(EVENTS))})")
            return          # an open type: any further field
    extra = sorted(set(fields) - allowed)
    if extra:
        raise UndeclaredEvent(f"timeline event {type!r}: field(s) {', '.join(extra)} not declared in "
                              f"monsoon/timeline/events.py (declared: {', '.join(sorted(allowed - ENVELOPE))})")


def declaration(type: str, fields: Mapping[str, Any] | None = None) -> Declared:
    """The declaration of an event: its type's, or for an ``op`` / service event (``fields`` given) its kind's."""
    if type in KINDS and fields is not None:
        field, table = KINDS[type]
        kind = fields.get(field)
        if isinstance(kind, str) and kind in table:
            return table[kind]
    if type not in EVENTS:
        raise UndeclaredEvent(f"timeline event type {type!r} is not declared in monsoon/timeline/events.py")
    return EVENTS[type]


def missing(type: str, fields: Mapping[str, Any]) -> list[str]:
    """The required fields ``fields`` lacks (the type's own, and its op's or service event's)."""
    need = set(EVENTS[type].required) if type in EVENTS else set()
    if type in KINDS:
        need |= declaration(type, fields).required
    return sorted(need - set(fields))
