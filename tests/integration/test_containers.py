"""Container stacks on a real Docker daemon (monsoon's private one unless DOCKER_HOST says otherwise).

* a container over its mem_limit is OOM-killed by the kernel: the supervisor's exit event says exit 137, SIGKILL
  and ``oom: true`` (State.OOMKilled), and the docker collector, keyed by service, has the OOMKilled termination;
* pod-kill (docker kill), process-pause (docker pause) and memory-pressure (docker update --memory) land, are
  verified and heal through the same backends as for processes; ``monsoon heal --run-id`` and the census find
  a paused container and a lowered limit left behind, and remove the run's containers by label;
* a SIGTERM mid-fault (a paused container and a lowered limit) heals both before the stack stops, and leaves no
  container;
* the in-memory x10 story on containers, cut short: the kernel OOM-kills the platform container (exit 137,
  State.OOMKilled), and the acked messages it held are counted lost, device by device, against what Postgres
  stored (every stored row matched to its ack: none "unexpected"). The full-length scenarios are
  pytest/test_containers.py (``pytest -m docker pytest/``).
"""
from __future__ import annotations

import signal
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

IMAGES = ("monsoon/base", "monsoon/platform", "monsoon/postgres")


@pytest.fixture(scope="module")
def docker_daemon():
    """A Docker daemon: DOCKER_HOST's or monsoon's private one, started here (and stopped) when none runs."""
    started = False
    if dockerd.docker_host() is None:
        try:
            dockerd.start()
            started = True
        except dockerd.DockerdError as e:
            pytest.skip(f"no Docker daemon: {str(e).splitlines()[0]} (make setup installs Docker)")
    try:
        missing = [i for i in IMAGES if not client().images.list(name=i)]
        if missing:
            pytest.skip(f"images {', '.join(missing)} missing: build them with `make images`")
        yield dockerd.docker_host()
    finally:
        if started:
            dockerd.stop()
            assert dockerd.running() is None


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
        assert any(e.get("event") == "restart" and e["service"] == "web" for e in events)
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


# burst-x10 cut short: the kernel's kill comes ~30 s into the x10 flood (200m limit, -Xmx512m, AlwaysPreTouch)
X10 = """
name: x10-short
description: burst-x10 with a shorter quick profile
load: {devices: 50, qos: 1, base_rate: 400, shape: {kind: burst, multiplier: 10}}
profiles:
  quick: {warmup: 5, burst: 45, recovery: 5, drain_timeout: 20}
checks:
  - no_oom
  - no_acked_loss
"""


def test_inmemory_x10_on_containers_is_oom_killed_by_the_kernel(docker_daemon, tmp_path):
    from monsoon.session import MonsoonSession
    from monsoon.timeline.store import read_events
    exp = tmp_path / "x10-short.yaml"
    exp.write_text(X10)
    session = MonsoonSession(runs_dir=tmp_path / "runs", run_id="ctr-x10", progress=lambda s: None)
    result = session.run("inmemory-docker", str(exp))
    oom, loss = result.check("no_oom"), result.check("no_acked_loss")
    assert oom.verdict == "fail" and oom.figures["docker_oom_killed"] >= 1, result.failure_message()
    assert "OOMKilled: the kernel killed the container" in oom.message, oom.message
    exits = [e for e in read_events(result.dir / "timeline.jsonl") if e.get("event") == "exit"]
    assert any(e["service"] == "platform" and e["code"] == 137 and e.get("oom") for e in exits), exits
    f = loss.figures
    # counted loss, device by device: what was acked and stored is matched (the rest is the OOM'd queue)
    assert loss.verdict == "fail" and 0 < f["acked_lost"] < f["acked"], result.failure_message()
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
