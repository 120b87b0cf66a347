"""An interrupted run (Ctrl-C or SIGTERM mid-load) leaves no process, no listening port and no
temp cluster behind, and its run directory can still be analysed."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from monsoon.analysis import analyze
from monsoon.stack.reaper import find_leftovers, reap
from monsoon.stack.ports import port_open
from monsoon.timeline.columnar import dataset_state, parts_dir
from monsoon.timeline.store import read_events
from tests.integration.helpers import sigint_default, wait_for

pytestmark = pytest.mark.integration

SCENARIO = '''
def test_flood(monsoon):
    monsoon.run("{stack}", "burst-x10").assert_pass()
'''



@pytest.mark.parametrize("stack,sig", [("kafka", signal.SIGINT), ("inmemory", signal.SIGTERM)])
def test_interrupted_run_leaves_nothing_behind(tmp_path, stack, sig):
    (tmp_path / "test_it.py").write_text(SCENARIO.format(stack=stack))
    runs = tmp_path / "runs"
    run_id = f"interrupt-{stack}"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", str(tmp_path / "test_it.py"), "-p", "no:cacheprovider",
                             f"--monsoon-runs-dir={runs}", f"--monsoon-run-id={run_id}"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=sigint_default)
    exp_dir = runs / run_id / f"{stack}--burst-x10"
    timeline = exp_dir / "timeline.jsonl"
    try:
        # interrupt in the middle of the load, while every service is up and devices are connected
        wait_for(lambda: timeline.exists() and sum(e["type"] == "load" for e in read_events(timeline)) >= 5,
                 180, "5 seconds of load")
        assert find_leftovers(run_id), "the run's processes should be up before the interrupt"
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    left = find_leftovers(run_id)
    reap(run_id)                    # a failure here must not leave a loaded stack running under later tests
    assert proc.returncode != 0, out
    assert left == [], out
    events = read_events(timeline)
    ports = [e["ports"] for e in events if e.get("op") == "stack-start"][-1]   # the attempt that started
    assert not [p for p in ports.values() if port_open("127.0.0.1", p)]
    # temp clusters (Postgres data, Kafka log dirs) are gone; logs and timeline stay
    assert not (exp_dir / "services" / "postgres").exists()
    assert not list(Path("/tmp").glob(f"monsoon-pg-{run_id}-*"))  # the out-of-reach fallback cluster too
    assert (exp_dir / "logs" / "platform.log").stat().st_size > 0
    assert {"stop"} <= {e.get("event") for e in events if e["type"] == "service"}
    # the session still wrote and printed its checklist, naming the signal, the time and the load phase
    name = signal.Signals(sig).name
    written = json.loads((runs / run_id / "summary.json").read_text())
    cut = written["interrupted"]
    assert (cut["signal"], cut["stack"], cut["stage"]) == (name, stack, "load") and cut["t"] > 0, cut
    assert written["results"][0]["verdict"] == "unknown" and written["results"][0]["partial"] is True
    assert "monsoon sign-off checklist" in out and f"interrupted by {name} at t={cut['t']:.0f}s" in out, out
    assert "**Decision: NO-GO**" in out
    # the run directory is analysable offline, and still says it was cut short
    s = analyze(runs / run_id)
    assert s["interrupted"]["signal"] == name and s["results"][0]["verdict"] == "unknown"
    assert s["results"][0]["stack"] == stack and {c["name"] for c in s["results"][0]["checks"]} == \
        {"no_oom", "no_unexpected_exit", "no_acked_loss", "lag_recovers_within", "load_valid", "serves_throughout"}
    # the load was cut short: the generator's self-check can't call that load valid
    assert next(c for c in s["results"][0]["checks"] if c["name"] == "load_valid")["verdict"] == "unknown"
    assert dataset_state(parts_dir(exp_dir / "acked.csv")).rows > 0   # the fleet's parts, flushed before the signal
