"""Readiness: a service is ready when its tcp port answers, its http URL answers 2xx, its log matches, or (cql) a
Cassandra node answers a CQL query."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable
import requests

from monsoon.extras import need
from monsoon.spec.stack import ReadySpec
from monsoon.stack.ports import port_open


START_HEADER = "--- monsoon: start #"     # the line the supervisor writes into a service's log at each start


def this_start(log: str) -> str:
    """The part of a service log written since its last start (after the supervisor's header line): a restarted
    service's readiness and death are judged on what it said this time, never on an earlier start's lines."""
    i = log.rfind(START_HEADER)
    if i < 0:
        return log
    j = log.find("\n", i)
    return "" if j < 0 else log[j + 1:]


def _ready_once(ready: ReadySpec, log_path: Path, render_: Callable[[str], str]) -> bool:
    if ready.tcp:
        target = render_(ready.tcp)
        host, _, port = target.rpartition(":")
        return port_open(host or "127.0.0.1", int(port))
    if ready.http:
        try:
            return requests.get(render_(ready.http), timeout=1).ok
        except requests.RequestException:
            return False
    if ready.cql:
        host, _, port = render_(ready.cql).rpartition(":")
        return cql_answers(host or "127.0.0.1", int(port))
    assert ready.log is not None     # ReadySpec._one: exactly one of tcp, http, cql, log is given
    try:
        return re.search(render_(ready.log), this_start(log_path.read_text(errors="replace"))) is not None
    except FileNotFoundError:
        return False


def cql_answers(host: str, port: int, timeout: float = 2.0) -> bool:
    """A Cassandra node answers a CQL query (its native port accepts connections well before that)."""
    if not port_open(host, port):
        return False
    cluster = cql_cluster([host], port, timeout=timeout)
    try:
        session = cluster.connect()
        return session.execute("SELECT release_version FROM system.local").one() is not None
    except Exception:   # any failure means "not yet"
        return False
    finally:
        cluster.shutdown()


def cql_cluster(hosts: list[str], port: int, *, timeout: float = 5.0, row_factory=None):
    """A cassandra-driver Cluster for monsoon's own short sessions: protocol v5 (Cassandra 4+/5; no downgrade
    dance), DC-aware round robin, ``timeout`` per request. cassandra-driver is imported now
    (``monsoon[cassandra]``), not when monsoon is."""
    cluster_mod = need("cassandra.cluster", "cassandra", "a Cassandra stack")
    Cluster, ExecutionProfile = cluster_mod.Cluster, cluster_mod.ExecutionProfile
    EXEC_PROFILE_DEFAULT = cluster_mod.EXEC_PROFILE_DEFAULT
    DCAwareRoundRobinPolicy = need("cassandra.policies", "cassandra", "a Cassandra stack").DCAwareRoundRobinPolicy
    profile = ExecutionProfile(load_balancing_policy=DCAwareRoundRobinPolicy(), request_timeout=timeout,
                               **({"row_factory": row_factory} if row_factory else {}))
    return Cluster(hosts, port=port, protocol_version=5, connect_timeout=min(timeout, 5),
                   control_connection_timeout=min(timeout, 5), execution_profiles={EXEC_PROFILE_DEFAULT: profile})
