"""A run interrupted by SIGTERM while faults are live heals every fault before its stack stops,
and leaves nothing of the run behind: no toxic, no stopped process, no lowered cgroup limit,
no process.

The moment of the interrupt is random (seeded, printed): anywhere from just after the
faults landed to the middle of their window.
"""
import os
import random
import signal
import subprocess
import sys
import time

import pytest

from monsoon.faults.heal import run_ids_in_place
from monsoon.analysis import analyze
from monsoon.faults.cgroup import CgroupBackend, CgroupFS
from monsoon.faults.process import proc_state
from monsoon.paths import REPO
from monsoon.stack.reaper import find_leftovers, reap
from monsoon.timeline.store import read_events
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.integration

EXPERIMENT = """
name: census
description: three backends live at once, then an interrupt
load: {devices: 10, qos: 1, base_rate: 200, shape: {kind: steady}}
profiles:
  quick: {warmup: 20, recovery: 100, drain_timeout: 30}
faults:
  - profile: process-pause
    target: postgres
    schedule: {at: 5, duration: %(duration)s}
  - profile: network-latency
    target: platform->kafka
    params: {latency_ms: 100, jitter_ms: 0, probe: kafka}
    schedule: {at: 5, duration: %(duration)s}
%(cgroup)s
checks:
  - no_acked_loss
"""
CGROUP = """  - profile: memory-pressure
    target: platform
    params: {limit_mb: 900}
    schedule: {at: 5, duration: %(duration)s}
"""
SCENARIO = '''
def test_census(monsoon):
    monsoon.run("kafka-registry", "{exp}").assert_pass()
'''



def start_census_run(tmp_path, what: str, duration: int = 60):
    """The census experiment under pytest in a subprocess, its faults live for ``duration`` seconds from 5 s
    into the load: (process, run id, runs dir, timeline, faults, a seeded delay of 0-25 s, seed)."""
    seed = int(os.environ.get("MONSOON_CENSUS_SEED", random.randrange(1 << 30)))
    rnd = random.Random(seed)
    cgroup_ok = CgroupFS().available() is None
    exp = tmp_path / "census.yaml"
    exp.write_text(EXPERIMENT % {"cgroup": CGROUP % {"duration": duration} if cgroup_ok else "",
                                 "duration": duration})
    (tmp_path / "test_it.py").write_text(SCENARIO.replace("{exp}", str(exp)))
    runs = tmp_path / "runs"
    run_id = f"census-{what}-{seed}"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", str(tmp_path / "test_it.py"), "-p", "no:cacheprovider",
                             f"--monsoon-runs-dir={runs}", f"--monsoon-run-id={run_id}"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    timeline = runs / run_id / "kafka-registry--census" / "timeline.jsonl"
    return proc, run_id, runs, timeline, 3 if cgroup_ok else 2, rnd.uniform(0.0, 25.0), seed


def wait_event(proc, timeline, pred, n: int, what: str) -> None:
    """Until ``n`` events of the run's timeline match ``pred``; fails at once if the run ended first."""
    def seen() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the run ended (exit {proc.returncode}) before {what}:\n{proc.stdout.read()[-3000:]}")
        return timeline.exists() and sum(1 for e in read_events(timeline) if pred(e)) >= n
    wait_for(seen, 240, what, interval=0.1)


def is_inject(e) -> bool:
    return e["type"] == "fault" and e.get("phase") == "inject"


def wait_for_faults(proc, timeline, n_faults: int) -> None:
    """Every fault injected (and its landing judged)."""
    wait_event(proc, timeline, is_inject, n_faults, f"{n_faults} faults injected")


def test_sigterm_mid_fault_heals_everything(tmp_path):
    proc, run_id, runs, timeline, n_faults, delay, seed = start_census_run(tmp_path, "term")
    try:
        wait_for_faults(proc, timeline, n_faults)
        time.sleep(delay)          # a random moment inside the window
        paused = [p for p in find_leftovers(run_id) if proc_state(p) in ("T", "t")]
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    info = f"seed={seed} delay={delay:.1f}s (re-run with MONSOON_CENSUS_SEED={seed})\n{out[-4000:]}"
    assert proc.returncode != 0, info
    assert paused, "postgres should have been frozen when the interrupt came\n" + info
    events = read_events(timeline)
    injects = [e for e in events if e["type"] == "fault" and e.get("phase") == "inject"]
    heals = [e for e in events if e["type"] == "fault" and e.get("phase") == "heal"]
    assert len(injects) == n_faults and all(e["landed"] is True for e in injects), info
    # each fault healed by the final heal (the interrupt came before its window ended), and the heal was verified
    assert {(e["name"], e["window"]) for e in heals} == {(e["name"], e["window"]) for e in injects}, info
    assert all(e.get("final") and e["landed"] is not False for e in heals), heals
    census = next(e for e in events if e["type"] == "fault-census")
    assert census["leftovers"] == {} and census["errors"] == [], census
    # the census happened while the stack was still up: before any service stopped
    stops = [e["t"] for e in events if e["type"] == "service" and e.get("event") == "stop"]
    assert stops and census["t"] <= min(stops), info
    # and after the run: nothing of it anywhere
    assert find_leftovers(run_id) == [], info
    assert CgroupBackend().census(run_id) == [], info
    assert run_id not in run_ids_in_place(), info
    # the run directory is still analysable, fault checks included
    s = analyze(runs / run_id)
    names = {c["name"] for c in s["results"][0]["checks"]}
    assert {"no_acked_loss", "faults_landed"} <= names


def test_kill_9_mid_fault_then_heal_run_id_leaves_nothing(tmp_path):
    """kill -9 gives monsoon no chance to heal: every fault stays in place and every service keeps running.
    `monsoon heal --run-id` must then undo all of it, and the run directory must still be analysable."""
    proc, run_id, runs, timeline, n_faults, delay, seed = start_census_run(tmp_path, "kill")
    try:
        wait_for_faults(proc, timeline, n_faults)
        time.sleep(delay)
        proc.kill()
        out, _ = proc.communicate(timeout=30)
        info = f"seed={seed} delay={delay:.1f}s (re-run with MONSOON_CENSUS_SEED={seed})\n{out[-3000:]}"
        # the faults really were left in place: postgres frozen, the run's faults on record, services alive
        left = find_leftovers(run_id)
        assert any(proc_state(p) in ("T", "t") for p in left), info
        assert run_id in run_ids_in_place(), info
        if n_faults == 3:
            assert CgroupBackend().census(run_id) != [], info
        healed = subprocess.run([sys.executable, "-m", "monsoon.cli", "heal", "--run-id", run_id], cwd=REPO,
                                env={k: v for k, v in os.environ.items() if k != "MONSOON_RUN_ID"},
                                capture_output=True, text=True, timeout=180)
        info += f"\n--- heal (exit {healed.returncode}):\n{healed.stdout[-3000:]}{healed.stderr[-2000:]}"
        assert healed.returncode == 0, info
        wait_for(lambda: find_leftovers(run_id) == [], 30, "the run's processes to be gone")
        assert CgroupBackend().census(run_id) == [], info
        assert run_id not in run_ids_in_place(), info
    finally:
        reap(run_id)                # whatever the assertions say, leave nothing running
    # the run directory is still analysable: its faults are on record, and with no census from the run
    # itself, faults_landed cannot say they healed
    s = analyze(runs / run_id)
    checks = {c["name"]: c for c in s["results"][0]["checks"]}
    assert {"no_acked_loss", "faults_landed"} <= set(checks), checks
    fl = checks["faults_landed"]
    assert fl["verdict"] == "unknown" and fl["figures"]["faults_injected"] == n_faults, fl
    # the fleet's acked parts were never closed: analyze says where the data ends, and reads up to there
    torn = s["results"][0].get("torn", [])
    assert any(n.startswith("acked.parquet was not closed: the run was cut off") for n in torn), torn


START_ORDER = ("postgres", "kafka", "mongo", "infinispan", "toxiproxy", "routes", "platform")


@pytest.mark.parametrize("moment", ["start-up", "injecting", "healing"])
def test_sigterm_during_start_up_an_inject_or_a_heal_leaves_nothing(tmp_path, moment):
    """The interrupt lands while the stack is still starting (as a random service starts), while the faults
    are being injected (just after the first inject event), or while the scheduled heals run (just after the
    first one): still no fault, process or cgroup record is left, and the run directory is analysable."""
    proc, run_id, runs, timeline, n_faults, _, seed = start_census_run(tmp_path, moment, duration=10)
    rnd = random.Random(seed)
    service = rnd.choice(START_ORDER)
    trigger = {
        "start-up": (lambda e: e["type"] == "service" and e.get("event") == "start" and e["service"] == service,
                     f"{service} to start"),
        "injecting": (is_inject, "the first inject"),
        "healing": (lambda e: e["type"] == "fault" and e.get("phase") == "heal" and not e.get("final"),
                    "the first scheduled heal"),
    }[moment]
    delay = rnd.uniform(0.0, 0.5)
    out = ""
    try:
        wait_event(proc, timeline, trigger[0], 1, trigger[1])
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            out = proc.communicate()[0]
        left = find_leftovers(run_id)
        reap(run_id)
    info = (f"seed={seed} moment={moment} ({trigger[1]}) +{delay:.2f}s "
            f"(re-run with MONSOON_CENSUS_SEED={seed})\n{out[-4000:]}")
    assert proc.returncode != 0, info
    assert left == [], info
    assert CgroupBackend().census(run_id) == [], info
    assert run_id not in run_ids_in_place(), info
    events = read_events(timeline)
    census = [e for e in events if e["type"] == "fault-census"]
    if moment == "start-up":
        assert not [e for e in events if e["type"] == "fault"], info    # the plan never started
    else:
        assert census and census[0]["leftovers"] == {} and census[0]["errors"] == [], (census, info)
        injects = {(e["name"], e["window"]) for e in events if is_inject(e)}
        heals = {(e["name"], e["window"]) for e in events if e["type"] == "fault" and e.get("phase") == "heal"}
        assert injects and injects <= heals, (injects, heals, info)   # whatever went in came out
    s = analyze(runs / run_id)
    assert {"no_acked_loss", "faults_landed"} <= {c["name"] for c in s["results"][0]["checks"]}, info
