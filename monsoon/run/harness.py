"""What a run and a calibration share: device provisioning, the load harness, and the reports of a fault plan."""
from __future__ import annotations
from dataclasses import dataclass
from typing import Any, Mapping
from pathlib import Path
import time

from monsoon.load.fleet import Fleet, FleetOptions, build_fleet
from monsoon.load.payloads import Payload, build_payload
from monsoon.load.shapes import LoadShape
from monsoon.load.stats import SecondStats
from monsoon.observe.collectors import collectors_for
from monsoon.observe.preflight import preflight
from monsoon.observe.progress import Progress
from monsoon.observe.sampler import Sampler
from monsoon.observe.storage import stored_source
from monsoon.observe.threaddump import ThreadDumper
from monsoon.rundir import ACKED_DATA, LATENCY_FILE
from monsoon.spec.experiment import LoadSpec
from monsoon.stack.provision import Device, device_names, provisioner_for
from monsoon.stack.supervisor import Stack
from monsoon.timeline.store import Timeline
from monsoon.timeline.events import (LOAD, OP, OP_CONNECTED, OP_DEPROVISIONED, OP_PREFLIGHT, OP_PROVISIONED,
                                     PHASE, PLATFORM, SERVICE, SVC_EXIT, SVC_RESTART)


def provision(stack: Stack, device_prefix: str, n: int, *, created: list | None = None) -> list[Device]:
    """The stack's devices, created through its provisioning (ThingsBoard's REST API, Hono's registry) or named
    as they are. A provisioner that deletes after the run (Hono's registry) is put on ``created`` before its first
    call, with every name asked for: a failure part-way still deletes what was made (absent names are fine)."""
    prov = stack.spec.provisioning
    wanted = device_names(device_prefix, n)
    client = provisioner_for(prov, stack.endpoint)
    if created is not None and getattr(client, "delete_after_run", False):
        created.append((client, [name for name, _ in wanted]))
    client.login()
    return client.ensure_devices(wanted)


def report_plan(plan, label: str, progress: Progress) -> None:
    """One progress line on a run's faults: injected, landed, heals verified, anything left in place or failed."""
    injected = [e for e in plan.events if e["phase"] == "inject"]
    landed = sum(1 for e in injected if e["landed"] is True)
    heals = [e for e in plan.events if e["phase"] == "heal"]
    healed = sum(1 for e in heals if e["landed"] is not False)
    progress(f"[{label}] faults: {len(injected)} injected, {landed} landed, {healed} of {len(heals)} heals verified"
             + ("" if not plan.leftovers else f"; LEFT IN PLACE: {plan.leftovers}")
             + ("" if not plan.errors else f"; errors: {'; '.join(plan.errors)}"))


def totals_dict(totals) -> dict:
    """A fleet's totals as the ``load-end`` op's fields (without the per-device ``last_seq``, which goes to the
    sent dataset)."""
    d = dict(vars(totals))
    d.pop("last_seq", None)
    return d


class StackEvents:
    """The stack's events onto the timeline; a service's exit (of ``watch`` only, when given) and restarts are
    also said as progress lines and counted."""

    def __init__(self, tl: Timeline, label: str, progress: Progress, watch: str | None = None):
        self.tl, self.label, self.progress, self.watch = tl, label, progress, watch
        self.restarts = 0
        self.exits: list[float] = []     # timeline times of the exits said

    def __call__(self, type_: str, **fields: Any) -> None:
        self.tl.add(type_, **fields)
        if type_ != SERVICE:
            return
        if fields.get("event") == SVC_EXIT and self.watch in (None, fields.get("service")):
            self.exits.append(self.tl.now())
            self.progress(f"[{self.label}] service {fields['service']} exited: {fields.get('cause')}")
        if fields.get("event") == SVC_RESTART:
            self.restarts += 1
            self.progress(f"[{self.label}] service {fields['service']} restarted (#{fields.get('n')})")


@dataclass(frozen=True)
class FleetPlan:
    """What one fleet sends, given once: an experiment's ``load`` (:meth:`of`) or a ramp's ladder."""
    shape: LoadShape
    devices: int
    qos: int = 1
    device_prefix: str = "monsoon"
    payload: Payload | None = None            # None: the minimal payload
    engine: str = "python"
    workers: int = 1
    legs: Mapping[str, float] | None = None   # Hono's command flow: weights of the message kinds
    transport: str | None = None              # None: the stack's devices.transport

    @classmethod
    def of(cls, load: LoadSpec, shape: LoadShape) -> "FleetPlan":
        """An experiment's ``load`` with its profile's ``shape`` (x1 settled)."""
        return cls(shape, load.devices, load.qos, load.device_prefix, build_payload(load.payload),
                   load.engine, load.workers, None if load.legs is None else {str(k): w for k, w in load.legs.items()},
                   load.transport)

    def options(self, out_dir: Path, topic: str) -> FleetOptions:
        """The fleet's options: its acked and latency logs in ``out_dir``, publishing to ``topic``."""
        return FleetOptions(shape=self.shape, acked_path=out_dir / ACKED_DATA, topic=topic, qos=self.qos,
                            latency_log_path=out_dir / LATENCY_FILE, payload=self.payload, workers=self.workers,
                            legs=self.legs)


class LoadHarness:
    """What a run and a calibration do before their load, and undo after it: devices provisioned, the fleet
    connected, the sampler sampling (one baseline sample), the shape's phases on the timeline. ``close()``
    stops the fleet and the sampler; it is safe on every exit path, however far ``start`` got."""

    def __init__(self, tl: Timeline):
        self.tl = tl
        self._fleet: Fleet | None = None
        self.sampler: Sampler | None = None
        self.collectors: list = []
        self.t0: float | None = None
        self.dumper: ThreadDumper | None = None   # watch_stalls(): thread dumps while ingestion stalls
        self.facts: dict[str, str] = {}          # what the running platform says it is (observe.facts)
        self.created: list = []                  # (provisioner, device names) to delete when the run ends

    def start(self, stack: Stack, plan: FleetPlan, out_dir: Path) -> "LoadHarness":
        """Preflight, provision ``plan.devices``, connect the fleet, start the sampler, put the phases on the
        timeline: the fleet is ready to run ``plan.shape``."""
        tl, dev = self.tl, stack.spec.devices
        self.collectors = collectors = collectors_for(stack)
        # every declared endpoint answers before anything is sent; the platform's facts are read with them
        self.facts = preflight(stack.spec, collectors, stored_source(stack.spec.storage, stack.endpoint),
                               render=stack.endpoint)
        tl.add(OP, op=OP_PREFLIGHT, ok=True)
        if self.facts:
            tl.add(PLATFORM, **self.facts)
        t = time.monotonic()
        devs = self.provision(stack, plan.device_prefix, plan.devices)
        tl.add(OP, op=OP_PROVISIONED, devices=len(devs), seconds=round(time.monotonic() - t, 2))
        transport, port_t = dev.port_of(plan.transport)    # the stack's devices.transport, or load.transport
        host, port = stack.endpoint(dev.host), int(stack.endpoint(port_t))
        self._fleet = fleet = build_fleet(transport, devs, host, port, plan.options(out_dir, dev.topic),
                                          engine=plan.engine)
        fleet.connect()
        tl.add(OP, op=OP_CONNECTED, devices=len(devs), **fleet.extra.get("connect", {}))
        self.sampler = Sampler(tl, collectors).start()
        time.sleep(1.0)  # one baseline sample before the load
        self.t0 = t0 = tl.now()
        for ph in plan.shape.phases():
            tl.add(PHASE, name=ph.name, start=round(t0 + ph.start, 3), end=round(t0 + ph.end, 3))
        return self

    def provision(self, stack: Stack, device_prefix: str, n: int) -> list[Device]:
        """The run's devices (:func:`provision`). Whatever fails from here on (provisioning itself, the connect,
        the load, the drain), what provisioning created is deleted before the stack stops its services, while
        the registry still answers."""
        stack.before_stop(self.deprovision)
        return provision(stack, device_prefix, n, created=self.created)

    @property
    def fleet(self) -> Fleet:
        """The connected fleet (once ``start`` has built it)."""
        if self._fleet is None:
            raise RuntimeError("LoadHarness.start() has not built the fleet")
        return self._fleet

    def watch_stalls(self, stack: Stack, out_dir: Path) -> None:
        """Take JVM thread dumps of the observed service while ingestion stalls (for no_ingest_stall)."""
        service = stack.spec.observe.service
        if service:
            self.dumper = ThreadDumper(lambda: stack.pid(service), out_dir, self.tl)

    def record_second(self, st: SecondStats) -> dict:
        """One second of the fleet onto the timeline (``sec``: the fleet's second index; ``t`` is the timeline's)."""
        fields = dict(vars(st))
        fields["sec"] = fields.pop("t")
        self.tl.add(LOAD, **fields)
        if self.dumper is not None:
            self.dumper.on_second(fields)
        return fields

    def close(self) -> None:
        if self.dumper is not None:
            self.dumper.close()
        if self._fleet is not None:
            self._fleet.close()
        if self.sampler is not None:
            self.sampler.stop()       # closes the collectors
        else:
            for c in self.collectors:
                c.close()
        self.deprovision()

    def deprovision(self) -> None:
        """Delete what provisioning created where the provisioner asks for it (Hono's registry), once: the run
        calls it after the drain's read-back, while the platform still runs; the stack's stop on every other path
        (``Stack.before_stop``, registered by :meth:`provision`), before its services stop; ``close()`` last."""
        for client, names in self.created:
            try:
                client.delete_devices(names)
                self.tl.add(OP, op=OP_DEPROVISIONED, devices=len(names))
            except Exception as e:   # a registry already gone: said on the timeline, not raised over the run
                self.tl.add(OP, op=OP_DEPROVISIONED, ok=False, error=f"{type(e).__name__}: {e}")
            finally:
                client.close()
        self.created = []
