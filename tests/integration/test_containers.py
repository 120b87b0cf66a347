"""Container stacks on a real Docker daemon (monsoon's private one unless DOCKER_HOST says otherwise).

* a container over its mem_limit is OOM-killed by the kernel: the supervisor's exit event says exit 137, SIGKILL
  and ``oom: true`` (State.OOMKilled), and the docker collector, keyed by service, has the OOMKilled termination;
* pod-kill (docker kill), process-pause (docker pause) and memory-pressure (docker update --memory) land, are
  verified and heal through the same backends as for processes; ``monsoon heal --run-id`` and the census find
  a paused container and a lowered limit left behind, and remove the run's containers by label;
* a SIGTERM mid-fault (a paused container and a lowered limit) heals both before the stack stops, and leaves no
  container;
* a network fault on a container hop goes through Toxiproxy (itself a container), lands, is measured and heals;
* a docker-compose file runs as a stack: its mem_limit and deploy limits, environment, depends_on order and
  restart policy hold on the real daemon;
* the in-memory x10 story on containers, cut short: the platform container dies of memory — the kernel
  OOM-kills it (exit 137, State.OOMKilled), or, as in one CI run of four, the kernel keeps reclaiming the JVM's
  file pages instead and the container sits alive at 199.9 of its 200 MB acking nothing (a memory-limit stall)
  — no_oom fails either way, naming which, and the acked messages it held are counted lost, device by device,
  against what Postgres stored (every stored row matched to its ack: none "unexpected"). The full-length scenarios are
  pytest/test_containers.py (``pytest -m docker pytest/``).
"""
from __future__ import annotations

import signal
import socket
import subprocess
import sys

import pytest

from monsoon.faults.base import FaultContext
from monsoon.faults.cgroup import CgroupBackend
from monsoon.faults.heal import heal_everything
from monsoon.faults.process import ProcessBackend
from monsoon.observe.collectors import collectors_for
from monsoon.spec.fault import FaultSpec
from monsoon.spec.stack import load_stack
from monsoon.stack import dockerd
from monsoon.stack.containers import client, run_containers
from monsoon.stack.supervisor import Stack
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.integration

IMAGES = ("monsoon/base", "monsoon/platform", "monsoon/postgres", "monsoon/toxiproxy")


@pytest.fixture(scope="module")
def docker_daemon(docker_daemon):
    """The plugin's daemon (started here when none runs), with the images these tests need."""
    missing = [i for i in IMAGES if not client().images.list(name=i)]
    if missing:
        pytest.skip(f"images {', '.join(missing)} missing: build them with `make images`")
    return docker_daemon


STACK = """\
name: containers
provider: docker
ports: {web: auto}
services:
  web:
    image: monsoon/base
    command: ["python3", "-c", "import socket,sys,time; s=socket.create_server(('127.0.0.1', int(sys.argv[1]))); print('up', flush=True); time.sleep(100000)", "{port:web}"]
    ready: {tcp: "127.0.0.1:{port:web}", timeout: 30}
    mem_limit: 128m
    restart: always
    restart_delay: 0.2
    stop_timeout: 2
  hog:
    image: monsoon/base
    command: ["python3", "-c", "import time; print('hog ready', flush=True); time.sleep(2); x=[bytearray(1<<20) for _ in range(300)]; time.sleep(60)"]
    mem_limit: 64m
    ready: {log: "(?m)^hog ready$", timeout: 30}
    stop_timeout: 2
devices: {port: 1883}
provisioning: none
storage: {dsn: "postgresql://127.0.0.1:1/x", loss_query: "select 1"}
"""


def _fault(kind: str, params: dict | None = None, backend: str = "process") -> FaultSpec:
    return FaultSpec.model_validate({"name": f"c-{kind}", "kind": kind, "target": "web", "backend": backend,
                                     "params": params or {}, "schedule": {"at": 0, "duration": 5}})


def test_container_oom_faults_heal_and_reap(docker_daemon, tmp_path):
    (tmp_path / "s.yaml").write_text(STACK)
    events: list[dict] = []
    run_id = "ctr-faults"
    stack = Stack(load_stack(tmp_path / "s.yaml"), tmp_path / "run", run_id=run_id,
                  on_event=lambda kind, **k: events.append(dict(k, type=kind)))
    with stack:
        assert {c.labels["monsoon.service"] for c in run_containers(run_id)} == {"web", "hog"}
        # the kernel OOM-kills the hog over its 64 MiB: Docker's word, not a guess
        wait_for(lambda: any(e.get("event") == "exit" and e["service"] == "hog" for e in events), 60, "the hog's exit")
        ex = next(e for e in events if e.get("event") == "exit" and e["service"] == "hog")
        assert (ex["code"], ex["signal"], ex["oom"]) == (137, "SIGKILL", True), ex
        docker = next(c for c in collectors_for(stack) if c.name == "docker")
        sample = docker.sample()
        assert sample["containers"]["hog"]["oom_killed"] == 1 and sample["oom_killed"] == 1, sample
        assert sample["containers"]["web"]["state"] == "running"
        assert "hog" in (tmp_path / "run" / "logs" / "hog.log").read_text()

        ctx = FaultContext(run_id=run_id, stack=stack, state_dir=tmp_path / "state")
        proc = ProcessBackend(stack)
        # pod-kill: docker kill, then the restart policy brings it back; not an OOM
        h = proc.inject(_fault("pod-kill"), ctx)
        landing = proc.verify(h)
        assert landing.landed, landing.evidence
        kill = [e for e in events if e.get("event") == "exit" and e["service"] == "web"][-1]
        assert kill["oom"] is False and "killed by monsoon" in kill["cause"], kill
        # verify saw the new container's pid, which _spawn sets before the supervisor says "restart": wait for it
        wait_for(lambda: any(e.get("event") == "restart" and e["service"] == "web" for e in events), 30,
                 "web's restart event")
        # process-pause: docker pause / unpause
        h = proc.inject(_fault("process-pause"), ctx)
        assert proc.verify(h).landed and stack.container("web").refresh()["Paused"]
        proc.heal(h)
        assert proc.verify(h).landed and not stack.container("web").refresh()["Paused"]
        # memory-pressure: docker update --memory, restored on heal
        cg = CgroupBackend(state_dir=tmp_path / "state")
        h = cg.inject(_fault("memory-pressure", {"limit_mb": 96}, backend="cgroup"), ctx)
        assert cg.verify(h).landed and stack.container("web").memory_limit() == 96 << 20
        cg.heal(h)
        assert cg.verify(h).landed and stack.container("web").memory_limit() == 128 << 20

        # left behind on purpose (as after kill -9 of monsoon): a paused container and a lowered limit
        proc.inject(_fault("process-pause"), ctx)
        cg.inject(_fault("memory-pressure", {"limit_mb": 96}, backend="cgroup"), ctx)
        assert ProcessBackend().census(run_id) and CgroupBackend(state_dir=tmp_path / "state").census(run_id)
        rep = heal_everything(run_id, state_root=tmp_path / "state")
        assert rep.census == {}, rep
        assert any("unpaused" in d for d in rep.done) and any("removed 2 leftover container" in d for d in rep.done)
        assert run_containers(run_id) == []
    assert any(e.get("event") == "stop" for e in events)


COMPOSE = """\
services:
  db:
    image: monsoon/base
    command: ["python3", "-c", "import socket,sys,time; s=socket.create_server(('127.0.0.1', int(sys.argv[1]))); print('db up', flush=True); time.sleep(100000)", "{port:db}"]
    mem_limit: 96m
    restart: unless-stopped
    stop_grace_period: 2s
    network_mode: host
  app:
    image: monsoon/base
    command: ["python3", "-c", "import os,time; print('app sees', os.environ['DB_PORT'], flush=True); time.sleep(100000)"]
    environment: ["DB_PORT={port:db}"]
    depends_on: {db: {condition: service_healthy}}
    deploy: {resources: {limits: {memory: 80m}}}
    network_mode: host
"""

COMPOSE_STACK = """\
name: composed
compose: docker-compose.yml
ports: {db: auto}
services:
  db: {ready: {tcp: "127.0.0.1:{port:db}", timeout: 30}}
  app: {ready: {log: '(?m)^app sees \\d+$', timeout: 30}}
devices: {port: 1883}
provisioning: none
storage: {dsn: "postgresql://127.0.0.1:1/x", loss_query: "select 1"}
"""


def test_a_compose_file_runs_as_a_container_stack(docker_daemon, tmp_path):
    """The user's compose file, as it is, on the real daemon: its limits, environment, order and restart policy."""
    (tmp_path / "docker-compose.yml").write_text(COMPOSE)
    (tmp_path / "stack.yaml").write_text(COMPOSE_STACK)
    events: list[dict] = []
    stack = Stack(load_stack(tmp_path / "stack.yaml"), tmp_path / "run", run_id="ctr-compose",
                  on_event=lambda kind, **k: events.append(dict(k, type=kind)))
    with stack:
        got = {c.labels["monsoon.service"]: c for c in run_containers("ctr-compose")}
        assert set(got) == {"db", "app"}
        assert got["db"].attrs["HostConfig"]["Memory"] == 96 << 20
        assert got["app"].attrs["HostConfig"]["Memory"] == 80 << 20          # deploy.resources.limits.memory
        port = stack.ports["db"]
        assert f"DB_PORT={port}" in got["app"].attrs["Config"]["Env"]
        assert f"app sees {port}" in (tmp_path / "run" / "logs" / "app.log").read_text()
        ready = [e["service"] for e in events if e.get("event") == "ready"]
        assert ready == ["db", "app"], events                                 # depends_on: db ready first
        stack.kill("db")                                                      # unless-stopped: restarted
        wait_for(lambda: any(e.get("event") == "restart" and e["service"] == "db" for e in events), 30, "db restart")
    assert run_containers("ctr-compose") == []


PROXIED = """\
name: proxied
provider: docker
ports: {echo: auto, toxiproxy: auto}
services:
  echo:
    image: monsoon/base
    command: ["python3", "-c", "import socket,sys,threading\\ndef h(c):\\n  with c:\\n    while (d := c.recv(4096)): c.sendall(d)\\ns=socket.create_server(('127.0.0.1', int(sys.argv[1])))\\nwhile True: threading.Thread(target=h, args=(s.accept()[0],), daemon=True).start()", "{port:echo}"]
    ready: {tcp: "127.0.0.1:{port:echo}", timeout: 30}
  toxiproxy:
    image: monsoon/toxiproxy
    command: ["toxiproxy-server", "-host", "127.0.0.1", "-port", "{port:toxiproxy}"]
    ready: {tcp: "127.0.0.1:{port:toxiproxy}", timeout: 30}
chaos: {toxiproxy: "http://127.0.0.1:{port:toxiproxy}"}
devices: {port: 1883}
provisioning: none
storage: {dsn: "postgresql://127.0.0.1:1/x", loss_query: "select 1"}
"""


def test_network_latency_on_a_container_hop_goes_through_toxiproxy(docker_daemon, tmp_path):
    """Network faults on a container stack are Toxiproxy's, as on processes: the proxy runs as a container too."""
    from monsoon.faults.toxiproxy import PROBE_PAYLOADS, ToxiproxyBackend, floor_rtt
    (tmp_path / "s.yaml").write_text(PROXIED)
    run_id = "ctr-proxy"
    stack = Stack(load_stack(tmp_path / "s.yaml"), tmp_path / "run", run_id=run_id)
    with stack:
        be = ToxiproxyBackend(stack.endpoint(stack.spec.chaos.toxiproxy))
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            listen = f"127.0.0.1:{free.getsockname()[1]}"
        proxy = be.route(run_id, ("app", "echo"), listen, f"127.0.0.1:{stack.ports['echo']}")
        host, port = proxy.listen.rsplit(":", 1)
        addr, echo = (host, int(port)), PROBE_PAYLOADS["echo"]
        before = floor_rtt(addr, echo)
        h = be.inject(FaultSpec.model_validate({
            "name": "c-latency", "kind": "network-latency", "target": "app->echo", "backend": "toxiproxy",
            "params": {"latency_ms": 200, "probe": "echo"}, "schedule": {"at": 0, "duration": 30}}),
            FaultContext(run_id=run_id, stack=stack))
        landing = be.verify(h)
        assert landing.landed is True and 190 <= landing.evidence["added_ms"] <= 300, landing.evidence
        assert 190 <= floor_rtt(addr, echo) - before <= 300
        be.heal(h)
        assert be.verify(h).landed is True and be.census(run_id) == []
        assert floor_rtt(addr, echo) < before + 50
    assert run_containers(run_id) == []


# burst-x10 cut short: the kernel's kill comes ~30 s into the x10 flood (200m limit, -Xmx512m, AlwaysPreTouch)
X10 = """
name: x10-short
description: burst-x10 with a shorter quick profile
load: {devices: 50, qos: 1, base_rate: 400, shape: {kind: burst, multiplier: 10}}
profiles:
  quick: {warmup: 5, burst: 45, recovery: 5, drain_timeout: 120}   # the drain ends when storage settles: a slow
                                                                     # machine's third life still storing is not a hang
checks:
  - no_oom
  - no_acked_loss
  - serves_throughout: {max_silent_s: 10}
"""


def test_inmemory_x10_on_containers_dies_of_memory_killed_or_stalled_at_its_limit(docker_daemon, tmp_path):
    from monsoon.session import MonsoonSession
    from monsoon.timeline.store import read_events
    exp = tmp_path / "x10-short.yaml"
    exp.write_text(X10)
    session = MonsoonSession(runs_dir=tmp_path / "runs", run_id="ctr-x10", progress=lambda s: None)
    result = session.run("inmemory-docker", str(exp))
    oom, loss = result.check("no_oom"), result.check("no_acked_loss")
    assert oom.verdict == "fail", result.failure_message()
    exits = [e for e in read_events(result.dir / "timeline.jsonl") if e.get("event") == "exit"]
    if oom.figures["docker_oom_killed"] >= 1:           # the kernel's kill
        assert "OOMKilled: the kernel killed the container" in oom.message, oom.message
        assert any(e["service"] == "platform" and e["code"] == 137 and e.get("oom") for e in exits), exits
    else:                                               # alive at its limit, acking nothing
        assert oom.figures.get("memory_limit_stalls", 0) >= 1, result.failure_message()
        assert "platform stalled at its memory limit" in oom.message, oom.message
        assert not [e for e in exits if e["service"] == "platform"], exits
    f = loss.figures
    # counted loss, device by device: what was acked and stored is matched (the rest is the OOM'd queue)
    if loss.verdict == "unknown":
        # the restarted container can hang at its limit too (metrics silent, no acks): then the drain never sees
        # the backlog settle and nothing can tell the second life's unstored messages lost from late. That is
        # right only when serves_throughout names the hang after the restart
        serves = result.check("serves_throughout")
        assert serves.verdict == "fail" and "platform served" in serves.message, result.failure_message()
        assert "cannot tell lost from late" in loss.message, loss.message
        back = [e["t"] for e in read_events(result.dir / "timeline.jsonl")
                if e.get("service") == "platform" and e.get("event") == "ready"][1:]
        assert back and any(w in serves.message for w in ("at its memory limit", "metrics silent")), serves.message
    else:
        assert loss.verdict == "fail", result.failure_message()
    assert 0 < f["acked_lost"] < f["acked"], result.failure_message()
    assert f["stored"] > 0 and f["unexpected"] == 0 and f["acked"] - f["acked_lost"] <= f["stored"], f
    assert run_containers("ctr-x10") == []


EXPERIMENT = """
name: ctr-term
description: a paused container and a lowered memory limit, then SIGTERM
load: {devices: 10, qos: 1, base_rate: 100, shape: {kind: steady}}
profiles:
  quick: {warmup: 10, recovery: 100, drain_timeout: 20}
faults:
  - profile: process-pause
    target: postgres
    schedule: {at: 3, duration: 90}
  - profile: memory-pressure
    target: postgres
    params: {limit_mb: 384}
    schedule: {at: 3, duration: 90}
checks:
  - no_acked_loss
"""


def test_sigterm_mid_fault_leaves_no_container_pause_or_limit(docker_daemon, tmp_path):
    from monsoon.timeline.store import read_events
    exp = tmp_path / "ctr-term.yaml"
    exp.write_text(EXPERIMENT)
    (tmp_path / "test_it.py").write_text(f'def test_it(monsoon):\n    monsoon.run("inmemory-docker", "{exp}")\n')
    runs, run_id = tmp_path / "runs", "ctr-term"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", str(tmp_path / "test_it.py"), "-p", "no:cacheprovider",
                             f"--monsoon-runs-dir={runs}", f"--monsoon-run-id={run_id}"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timeline = runs / run_id / "inmemory-docker--ctr-term" / "timeline.jsonl"
    try:
        def landed() -> bool:
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            return timeline.exists() and sum(1 for e in read_events(timeline) if e["type"] == "fault"
                                             and e.get("phase") == "inject") >= 2
        wait_for(landed, 240, "both faults injected", interval=0.2)
        pg = client().containers.get(f"monsoon-{run_id}-postgres")
        assert pg.status == "paused" and pg.attrs["HostConfig"]["Memory"] == 384 << 20
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    events = read_events(timeline)
    injects = [e for e in events if e["type"] == "fault" and e.get("phase") == "inject"]
    heals = [e for e in events if e["type"] == "fault" and e.get("phase") == "heal"]
    assert all(e["landed"] is True for e in injects) and len(injects) == 2, injects
    # both healed by the final heal and verified: unpaused, the limit back at 512m, before the stack stopped
    assert len(heals) == 2 and all(e.get("final") and e["landed"] is True for e in heals), heals
    census = next(e for e in events if e["type"] == "fault-census")
    assert census["leftovers"] == {} and census["errors"] == [], census
    assert proc.returncode != 0, out[-3000:]
    assert run_containers(run_id) == [], out[-3000:]     # no container, paused or not, and so no lowered limit
    assert heal_everything(run_id).census == {}
