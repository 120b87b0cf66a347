"""Faults that always heal: declarative profiles, backends, and a plan that schedules them.

* :mod:`.spec`      — ``FaultSpec`` loaded from ``fault-profiles/<kind>.yaml``
* :mod:`.base`      — the ``FaultBackend`` protocol, ``Handle``, ``Landing``, ``FaultContext``
* :mod:`.toxiproxy` — latency/jitter, bandwidth, dependency-down through Toxiproxy
* :mod:`.process`   — pod-kill, kafka-broker-restart, process-pause on stack services
* :mod:`.cgroup`    — memory-pressure by a lowered cgroup memory limit (v1 and v2)
* :mod:`.kube`      — Chaos Mesh / Litmus manifests (dry-run unless a cluster is configured)
* :mod:`.plan`      — ``FaultPlan``: schedule, timeline events, final heal, census
"""

from monsoon.faults.base import FaultBackend, FaultContext, FaultError, Handle, Landing
from monsoon.faults.plan import FaultPlan
from monsoon.spec.fault import FaultSpec, KINDS, load_fault, load_profiles


__all__ = ["FaultBackend", "FaultContext", "FaultError", "FaultPlan", "FaultSpec", "Handle", "KINDS", "Landing",
           "load_fault", "load_profiles"]
