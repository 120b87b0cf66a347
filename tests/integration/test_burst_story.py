"""End to end, on real Kafka, Postgres and the reference platform, through the pytest plugin: ``monsoon calibrate
inmemory`` measures the in-memory stack's capacity; then `pytest -m burst`, as a user types it, runs the in-memory
stack's ``burst-x10-auto`` (x1 = 1/4 of that capacity, no hand-tuned rate) and the Kafka stack's ``burst-x10``:
monsoon detects the in-memory x10 OOM and its acked loss, and passes the Kafka x10 run. One in-memory x10 run
serves both stories (the calibrated rate and the OOM), to keep `make test` lean."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from monsoon.paths import REPO
from monsoon.timeline.store import read_events

pytestmark = pytest.mark.integration

SCENARIO = '''
import pytest

@pytest.mark.burst
@pytest.mark.parametrize("stack,experiment", [("inmemory", "burst-x10-auto"), ("kafka", "burst-x10")])
def test_x10(monsoon, stack, experiment):
    monsoon.run(stack, experiment).assert_pass()
'''


def calibrate_inmemory(runs) -> dict:
    """``monsoon calibrate inmemory`` for real, through the command (a short ramp: 8 s steps from 800 msg/s)."""
    p = subprocess.run([sys.executable, "-m", "monsoon.cli", "calibrate", "inmemory", "--runs-dir", str(runs),
                        "--run-id", "cal", "--start-rate", "800", "--step-seconds", "8"],
                       cwd=REPO, capture_output=True, text=True, timeout=400)
    print(p.stdout[-6000:], p.stderr[-3000:])
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    cal = json.loads((runs / "calibration" / "inmemory.json").read_text())
    cap = cal["capacity_msg_s"]
    assert cap and cap >= 800 and not cal["generator_bound"] and not cal["lower_bound"], cal["result"]
    assert cal["criterion"] in ("stored-rate", "acked-rate", "backlog-growth", "latency-knee")
    assert [s["ok"] for s in cal["steps"]][-1] is False and all(s["ok"] for s in cal["steps"][:-1])
    assert cal["host"] and cal["cpu_count"] and cal["jar_sha256"]
    assert f"monsoon calibrate inmemory: capacity {cap:,.0f} msg/s" in p.stdout
    cal_dir = runs / "cal" / "calibrate-inmemory"
    assert (cal_dir / "timeline.jsonl").exists() and (cal_dir / "calibration.json").exists()
    assert sum(1 for e in read_events(cal_dir / "timeline.jsonl") if e["type"] == "calibration-step") == len(cal["steps"])
    return cal


def test_calibrated_x10_story_is_detected_and_reported(pytester, tmp_path):
    runs = tmp_path / "runs"
    cal = calibrate_inmemory(runs)
    cap, cal_file = cal["capacity_msg_s"], runs / "calibration" / "inmemory.json"

    pytester.makepyfile(test_story=SCENARIO)
    res = pytester.runpytest_subprocess("-m", "burst", f"--monsoon-runs-dir={runs}", "--monsoon-run-id=story",
                                        "-p", "no:cacheprovider", timeout=1500)
    out = res.stdout.str()
    res.assert_outcomes(passed=1, failed=1)

    summary = json.loads((runs / "story" / "summary.json").read_text())
    assert summary["run_id"] == "story" and summary["profile"] == "quick"
    by = {r["stack"]: r for r in summary["results"]}
    fig = {s: {c["name"]: c["figures"] for c in r["checks"]} for s, r in by.items()}
    verdict = {s: {c["name"]: c["verdict"] for c in r["checks"]} for s, r in by.items()}
    print(json.dumps(fig, indent=1))

    # in-memory: x1 came from the calibration file, with no second calibration
    mem = by["inmemory"]
    assert mem["base_rate"]["source"] == "calibration-file" and mem["base_rate"]["calibration_file"] == str(cal_file)
    assert mem["base_rate"]["base_rate"] == pytest.approx(0.25 * cap) and mem["base_rate"]["capacity_msg_s"] == cap
    assert mem["figures"]["base_rate_msg_s"] == pytest.approx(0.25 * cap)
    assert mem["figures"]["calibrated_capacity_msg_s"] == cap and mem["figures"]["base_fraction"] == 0.25
    assert not (runs / "story" / "calibrate-inmemory").exists()
    events = read_events(Path(mem["dir"]) / "timeline.jsonl")
    meta = events[0]
    assert meta["type"] == "meta" and meta["base_rate"] == pytest.approx(0.25 * cap)
    assert meta["base_rate_auto"]["fraction"] == 0.25
    assert max(e["target_rate"] for e in events if e["type"] == "load") == pytest.approx(10 * 0.25 * cap)

    # in-memory: dies of OOM, is restarted, loses acked messages
    assert mem["verdict"] == "fail"
    assert fig["inmemory"]["no_oom"]["oom_events"] >= 1 and fig["inmemory"]["no_oom"]["restarts"] >= 1
    assert fig["inmemory"]["no_acked_loss"]["acked_lost"] > 0
    assert verdict["inmemory"]["no_oom"] == "fail" and verdict["inmemory"]["no_acked_loss"] == "fail"
    burst = next(e for e in events if e["type"] == "phase" and e["name"] == "burst")
    exits = [e for e in events if e["type"] == "service" and e.get("event") == "exit" and e.get("service") == "platform"]
    assert exits, "the platform never exited"
    print(f"OOM: x1={meta['base_rate']:.0f} msg/s, x10={10 * meta['base_rate']:.0f} msg/s, capacity {cap:.0f} msg/s, "
          f"first exit {exits[0]['t'] - burst['start']:.1f} s into the burst ({exits[0].get('cause')}), "
          f"acked_lost={fig['inmemory']['no_acked_loss']['acked_lost']}")
    # kafka: lag builds, drains, nothing acked is lost
    assert by["kafka"]["verdict"] == "pass", by["kafka"]
    assert fig["kafka"]["lag_recovers_within"]["peak_lag"] > 0
    assert "recovery_s" in fig["kafka"]["lag_recovers_within"]
    assert fig["kafka"]["no_acked_loss"]["acked_lost"] == 0 and fig["kafka"]["no_acked_loss"]["acked"] > 0
    assert fig["kafka"]["no_oom"]["oom_events"] == 0

    # what each running platform said it is (observe.facts: its actuator), in summary.json and the checklist
    assert mem["platform"] == {"version": "0.1.0", "queue": "in-memory", "ts_database": "sql"}
    assert by["kafka"]["platform"] == {"version": "0.1.0", "queue": "kafka", "ts_database": "sql"}
    checklist = (runs / "story" / "checklist.md").read_text()
    assert "- kafka: version=0.1.0, queue=kafka, ts_database=sql" in checklist

    # the failure message carries the numbers; the checklist is printed and written
    assert "OutOfMemoryError" in out and "acked messages lost" in out
    assert "monsoon resilience sign-off" in out and "Decision: NO-GO" in out
    assert checklist.count("| inmemory | burst-x10-auto |") == len(mem["checks"])
    assert (runs / "latest").resolve() == (runs / "story").resolve()

    # checks never talk to live systems: `monsoon analyze` on the saved run reproduces every verdict and figure
    saved = {r["stack"]: r for r in summary["results"]}
    done = subprocess.run([sys.executable, "-m", "monsoon.cli", "analyze", str(runs / "story")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr          # exit 1: the re-analysed run is still NO-GO
    again = {r["stack"]: r for r in json.loads((runs / "story" / "summary.json").read_text())["results"]}
    for stack, r in saved.items():
        assert again[stack]["verdict"] == r["verdict"]
        assert again[stack]["platform"] == r["platform"]
        assert [(c["name"], c["verdict"], c["figures"]) for c in again[stack]["checks"]] == \
               [(c["name"], c["verdict"], c["figures"]) for c in r["checks"]], stack
