"""In kafka-registry, the platform reaches every backend only through its Toxiproxy proxy: Postgres, Mongo,
Infinispan and Kafka, the brokers it is sent to after bootstrap included (KAFKA_ADVERTISED). A fault on a
proxy can only be trusted to reach the platform if no connection goes around it."""
import os

import psutil
import pytest

from monsoon.paths import REPO
from monsoon.spec.stack import load_stack
from monsoon.stack.supervisor import Stack
from monsoon.stack.reaper import find_leftovers
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.integration

BACKENDS = ("postgres", "kafka", "mongo", "infinispan")


def remote_ports(pid: int) -> set[int]:
    """Remote 127.0.0.1 ports of the established TCP connections of a process and its children (a JVM's
    sockets are dual-stack: 127.0.0.1 shows as ::ffff:127.0.0.1)."""
    procs = [psutil.Process(pid)]
    procs += procs[0].children(recursive=True)
    return {c.raddr.port for p in procs for c in p.net_connections(kind="tcp")
            if c.status == psutil.CONN_ESTABLISHED and c.raddr and c.raddr.ip in ("127.0.0.1", "::ffff:127.0.0.1")}


def test_the_platform_reaches_every_backend_only_through_its_proxy(tmp_path):
    run_id = f"routes-{os.getpid()}"
    with Stack(load_stack(REPO / "stacks" / "kafka-registry.yaml"), tmp_path / "run", run_id=run_id) as st:
        proxies = {b: st.ports[f"{b}_proxy"] for b in BACKENDS}
        direct = {b: st.ports[b] for b in BACKENDS} | {"kafka_observer": st.ports["kafka_observer"]}
        pid = st.pid("platform")
        # the Kafka consumer joins its group after start-up: wait until every backend is reached via its proxy
        seen = wait_for(lambda: (p := remote_ports(pid)) >= set(proxies.values()) and p, 60,
                        f"the platform to connect to every proxy {proxies}")
        around = {b: port for b, port in direct.items() if port in seen}
        assert not around, f"the platform bypasses Toxiproxy to {around}; its connections: {sorted(seen)}"
    assert find_leftovers(run_id) == []
