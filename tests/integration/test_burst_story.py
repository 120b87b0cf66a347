"""End to end, on real Kafka, Postgres and the reference platform: ``monsoon demo`` itself, the README's first
command, runs its two x10 cases (the exact ones, ``monsoon.cli.DEMO_CASES``) and its own check says the story
was reproduced: the in-memory queue dies of OOM and loses acked messages, the Kafka queue absorbs x10 as lag,
drains it and loses nothing. x1 is a quarter of each stack's capacity measured on this machine (the user's
calibration cache: measured here the first time, kept while its key holds), and the in-memory burst lasts until
its backlog passes twice what fills the heap, so the story holds on a fast machine as on a slow one."""
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from monsoon.cli import DEMO_CASES, story_problems
from monsoon.paths import REPO
from monsoon.run.calibrate import calibration_dir, calibration_file, stack_sha256
from monsoon.spec.stack import load_stack
from monsoon.timeline.store import read_events

pytestmark = pytest.mark.integration


def test_make_demo_tells_the_reference_story(tmp_path):
    runs = tmp_path / "runs"
    env = {**os.environ, "MONSOON_RUNS_DIR": str(runs)}
    p = subprocess.run([sys.executable, "-m", "monsoon.cli", "demo"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=2400)
    out = p.stdout + p.stderr
    print(out[-8000:])
    assert p.returncode == 0 and "monsoon demo: reference story reproduced" in out, out[-4000:]
    assert all(case in out for case in DEMO_CASES)          # the demo's exact two cases, nothing else
    [run_dir] = [d for d in runs.iterdir() if not d.is_symlink() and (d / "summary.json").exists()]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert story_problems(summary) == []
    assert summary["profile"] == "quick"
    by = {r["stack"]: r for r in summary["results"]}
    assert {(r["stack"], r["experiment"]) for r in summary["results"]} == {("inmemory", "burst-x10"),
                                                                            ("kafka", "burst-x10")}
    fig = {s: {c["name"]: c["figures"] for c in r["checks"]} for s, r in by.items()}
    verdict = {s: {c["name"]: c["verdict"] for c in r["checks"]} for s, r in by.items()}
    print(json.dumps(fig, indent=1))

    # x1 is a quarter of the capacity measured on this machine, kept in the user's cache under its key
    for stack, r in by.items():
        info = r["base_rate"]
        cal_file = calibration_file(calibration_dir(), stack)
        cal = json.loads(cal_file.read_text())
        cap = cal["capacity_msg_s"]
        assert info["source"] in ("calibration-file", "calibrated-now") and info["calibration_file"] == str(cal_file)
        assert info["capacity_msg_s"] == cap and info["base_rate"] == pytest.approx(0.25 * cap)
        assert cal["host"] == socket.gethostname() and cal["cpu_count"] and cal["jar_sha256"]
        assert cal["stack_sha256"] == stack_sha256(load_stack(stack)) and not cal["generator_bound"]
        assert [s["ok"] for s in cal["steps"]][-1] is False and all(s["ok"] for s in cal["steps"][:-1])
        assert r["figures"]["base_rate_msg_s"] == pytest.approx(0.25 * cap) and r["figures"]["base_fraction"] == 0.25
        assert info["x1"].startswith(f"x1 = {0.25 * cap:,.0f} msg/s = 25% of {cap:,.0f} msg/s measured at ")
        assert f"monsoon demo: {stack} / burst-x10: {info['x1']}" in out
        events = read_events(Path(r["dir"]) / "timeline.jsonl")
        meta = events[0]
        assert meta["type"] == "meta" and meta["base_rate"] == pytest.approx(0.25 * cap)
        assert max(e["target_rate"] for e in events if e["type"] == "load") == pytest.approx(10 * 0.25 * cap)
    checklist = (run_dir / "checklist.md").read_text()
    assert f"- inmemory / burst-x10: {by['inmemory']['base_rate']['x1']}" in checklist

    # in-memory: the burst lasts until its backlog passes what fills the heap twice over
    mem = by["inmemory"]
    info = mem["base_rate"]
    fills = load_stack("inmemory").observe.fills_at_for("quick")
    assert info["fills_at"] == fills and info["fill"] == 2
    assert info["growth_msg_s"] == pytest.approx(1.25 * info["capacity_msg_s"], rel=1e-3)
    assert info["burst_s"] * info["growth_msg_s"] >= 2 * fills
    events = read_events(Path(mem["dir"]) / "timeline.jsonl")
    meta = events[0]
    burst = next(e for e in events if e["type"] == "phase" and e["name"] == "burst")
    assert meta["durations"]["burst"] == info["burst_s"]
    # in-memory: dies of OOM, is restarted, loses acked messages
    assert mem["verdict"] == "fail"
    assert fig["inmemory"]["no_oom"]["oom_events"] >= 1 and fig["inmemory"]["no_oom"]["restarts"] >= 1
    assert fig["inmemory"]["no_acked_loss"]["acked_lost"] > 0
    assert verdict["inmemory"]["no_oom"] == "fail" and verdict["inmemory"]["no_acked_loss"] == "fail"
    exits = [e for e in events if e["type"] == "service" and e.get("event") == "exit" and e.get("service") == "platform"]
    assert exits, "the platform never exited"
    print(f"OOM: x1={meta['base_rate']:.0f} msg/s, x10={10 * meta['base_rate']:.0f} msg/s, "
          f"capacity {info['capacity_msg_s']:.0f} msg/s, burst {info['burst_s']:g} s, "
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
    assert "- kafka: version=0.1.0, queue=kafka, ts_database=sql" in checklist

    # the failure message carries the numbers; the checklist is printed and written
    assert "OutOfMemoryError" in out and "acked messages lost" in out
    assert "monsoon resilience sign-off" in out and "Decision: NO-GO" in out
    assert checklist.count("| inmemory | burst-x10 |") == len(mem["checks"])
    assert (runs / "latest").resolve() == run_dir.resolve()

    # checks never talk to live systems: `monsoon analyze` on the saved run reproduces every verdict and figure
    saved = {r["stack"]: r for r in summary["results"]}
    done = subprocess.run([sys.executable, "-m", "monsoon.cli", "analyze", str(run_dir)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stderr          # exit 1: the re-analysed run is still NO-GO
    again = {r["stack"]: r for r in json.loads((run_dir / "summary.json").read_text())["results"]}
    for stack, r in saved.items():
        assert again[stack]["verdict"] == r["verdict"]
        assert again[stack]["platform"] == r["platform"]
        assert [(c["name"], c["verdict"], c["figures"]) for c in again[stack]["checks"]] == \
               [(c["name"], c["verdict"], c["figures"]) for c in r["checks"]], stack
