"""On the real reference platform: ``monsoon calibrate inmemory`` measures the in-memory stack's capacity,
then ``burst-x10-auto`` (base_rate: auto = 1/4 of that capacity) reproduces the x10 OOM and the acked loss
with no hand-tuned rate."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from monsoon.session import MonsoonSession
from monsoon.timeline.store import read_events

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_calibrate_then_auto_x10_dies_of_oom(tmp_path):
    runs = tmp_path / "runs"
    # 1. calibrate for real, through the command (a short ramp: 8 s steps from 800 msg/s)
    p = subprocess.run([sys.executable, "-m", "monsoon.cli", "calibrate", "inmemory", "--runs-dir", str(runs),
                        "--run-id", "cal", "--start-rate", "800", "--step-seconds", "8"],
                       cwd=REPO, capture_output=True, text=True, timeout=400)
    print(p.stdout[-6000:], p.stderr[-3000:])
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    cal_file = runs / "calibration" / "inmemory.json"
    cal = json.loads(cal_file.read_text())
    cap = cal["capacity_msg_s"]
    assert cap and cap >= 800 and not cal["generator_bound"] and not cal["lower_bound"], cal["result"]
    assert cal["criterion"] in ("stored-rate", "acked-rate", "backlog-growth", "latency-knee")
    assert [s["ok"] for s in cal["steps"]][-1] is False and all(s["ok"] for s in cal["steps"][:-1])
    assert cal["host"] and cal["cpu_count"] and cal["jar_sha256"]
    assert f"monsoon calibrate inmemory: capacity {cap:,.0f} msg/s" in p.stdout
    cal_dir = runs / "cal" / "calibrate-inmemory"
    assert (cal_dir / "timeline.jsonl").exists() and (cal_dir / "calibration.json").exists()
    assert sum(1 for e in read_events(cal_dir / "timeline.jsonl") if e["type"] == "calibration-step") == len(cal["steps"])

    # 2. burst-x10-auto on a fresh in-memory stack, quick profile: x1 comes from the calibration file
    lines: list[str] = []
    session = MonsoonSession(profile="quick", runs_dir=runs, run_id="auto",
                             progress=lambda s: (lines.append(s), print(s, flush=True)))
    res = session.run("inmemory", "burst-x10-auto")
    print(res.failure_message())
    assert res.base_rate["source"] == "calibration-file" and res.base_rate["calibration_file"] == str(cal_file)
    assert res.base_rate["base_rate"] == pytest.approx(0.25 * cap) and res.base_rate["capacity_msg_s"] == cap
    assert not (runs / "auto" / "calibrate-inmemory").exists()    # no second calibration
    assert any("base_rate: auto = 0.25 x capacity" in x for x in lines)

    events = read_events(res.dir / "timeline.jsonl")
    meta = events[0]
    assert meta["type"] == "meta" and meta["base_rate"] == pytest.approx(0.25 * cap)
    assert meta["base_rate_auto"]["fraction"] == 0.25
    burst = next(e for e in events if e["type"] == "phase" and e["name"] == "burst")
    targets = {e["target_rate"] for e in events if e["type"] == "load"}
    assert max(targets) == pytest.approx(10 * 0.25 * cap)

    # the platform died of OutOfMemoryError and lost acknowledged messages
    oom = res.check("no_oom")
    assert oom.verdict == "fail" and oom.figures["oom_events"] >= 1, res.failure_message()
    assert "OutOfMemoryError" in oom.message or "exit 3" in oom.message or "code 3" in oom.message, oom.message
    loss = res.check("no_acked_loss")
    assert loss.verdict == "fail" and loss.figures["acked_lost"] > 0, res.failure_message()

    exits = [e for e in events if e["type"] == "service" and e.get("event") == "exit" and e.get("service") == "platform"]
    assert exits, "the platform never exited"
    first = exits[0]
    acked_in_burst = sum(e["acked"] for e in events if e["type"] == "load" and e["t"] <= first["t"])
    print(f"OOM: x1={meta['base_rate']:.0f} msg/s, x10={10 * meta['base_rate']:.0f} msg/s, capacity {cap:.0f} msg/s, "
          f"first exit {first['t'] - burst['start']:.1f} s into the burst ({first.get('cause')}), "
          f"acked before it {acked_in_burst}, acked_lost={loss.figures['acked_lost']}")

    summary = json.loads((runs / "auto" / "summary.json").read_text())
    figs = summary["results"][0]["figures"]
    assert figs["base_rate_msg_s"] == pytest.approx(0.25 * cap) and figs["calibrated_capacity_msg_s"] == cap
    assert figs["base_fraction"] == 0.25 and summary["results"][0]["base_rate"]["source"] == "calibration-file"
