"""The real Litmus runs kept under tests/fixtures/litmus/ (see its README), judged again where Litmus cannot run
(a clean clone, CI): each fault window of a ChaosHub chart landed by its effect, recomputed from the evidence the
run recorded (pod-delete: a new pod UID; container-kill: the same pod, a new container ID, restarts up;
pod-memory-hog: the memory its samples show rising by half the hog), healed with nothing of its engine left, the
ChaosResult's verdict kept as evidence; and the loss checks, run again on the kept datasets, give the verdicts and
figures the run recorded (``result.json``)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from monsoon.checks.base import RunData
from monsoon.checks.faults import faults_landed
from monsoon.checks.lag import lag_recovers_within
from monsoon.checks.loss import no_acked_loss
from monsoon.checks.oom import no_oom, no_unexpected_exit
from monsoon.faults.litmus import judge_effect
from monsoon.timeline.store import read_events

KEPT = Path(__file__).resolve().parents[1] / "fixtures" / "litmus"
RUNS = sorted(d.name for d in KEPT.iterdir() if (d / "timeline.jsonl").is_file()) if KEPT.is_dir() else []
FAULTS = {"platform-pod-delete-chart": "pod-delete", "platform-container-kill-litmus": "container-kill",
          "platform-memory-hog-litmus": "pod-memory-hog"}
# what each kept run recorded: the experiment of each fault, and the ChaosResult's verdict read at each heal
# (evidence only: charts-kubectl-missing ran before the image had kubectl, so the helpers could not annotate their
# ChaosResult and Litmus said Error, while each fault landed by its effect)
EXPECTED = {
    "charts": {"faults": FAULTS, "verdicts_at_heal": dict.fromkeys(FAULTS, "Pass")},
    "charts-kubectl-missing": {"faults": FAULTS, "verdicts_at_heal": {"platform-pod-delete-chart": "Pass",
                                                                      "platform-container-kill-litmus": "Error",
                                                                      "platform-memory-hog-litmus": "Error"}},
}


def test_the_kept_runs_are_there_and_small():
    assert set(EXPECTED) <= set(RUNS), RUNS
    size = sum(f.stat().st_size for f in KEPT.rglob("*") if f.is_file())
    assert size < 2_000_000, f"tests/fixtures/litmus holds {size} bytes"


@pytest.fixture(params=RUNS)
def kept(request, tmp_path) -> Path:
    """A copy of one kept run (the checks may write beside what they read)."""
    out = tmp_path / request.param
    shutil.copytree(KEPT / request.param, out)
    return out


def _faults(d: Path) -> tuple[dict, dict]:
    events = [e for e in read_events(d / "timeline.jsonl") if e.get("type") == "fault"]
    return ({e["name"]: e for e in events if e["phase"] == "inject"},
            {e["name"]: e for e in events if e["phase"] == "heal"})


def test_each_chart_landed_by_its_effect_and_healed(kept):
    injects, heals = _faults(kept)
    want = EXPECTED[kept.name]["faults"]
    assert set(want) == set(injects) == set(heals)
    for name, exp in want.items():
        ev = injects[name]["evidence"]
        assert [x["name"] for x in ev["experiments"]] == [exp], name
        landed, why = judge_effect(exp, ev)
        assert landed and injects[name]["landed"] is True, f"{name}: {why}"
        assert ev["chaosresult"]["name"].endswith(exp)        # read as evidence (its verdict is not the judge)
        hv = heals[name]["evidence"]
        assert heals[name]["landed"] is True and hv["present"] is False and hv["runner_and_job_left"] == [], name
        assert hv["chaosresult"]["verdict"] == EXPECTED[kept.name]["verdicts_at_heal"][name], name


def test_a_tampered_effect_is_not_judged_landed(kept):
    injects, _ = _faults(kept)
    for name, e in injects.items():
        ev = json.loads(json.dumps(e["evidence"]))
        exp = ev["experiments"][0]["name"]
        if exp == "pod-delete":
            ev["new_uids"] = list(ev["uids_before"])
        elif exp == "container-kill":
            for r in ev["restarted"]:
                r["id"] = r["id_before"]
        elif exp == "pod-memory-hog":
            ev["samples"] = [[t, dict(ev["usage_before_mb"])] for t, _ in ev["samples"]]
        assert not judge_effect(exp, ev)[0], name


def test_monsoons_checks_judge_the_kept_run_again(kept):
    """Nothing acked lost (the recorded figures), no OOM, every fault landed and healed, the lag recovered, and
    every exit explained by an injected kill (charts-kubectl-missing recorded no_unexpected_exit FAIL: the container
    kill's exit came 7.6 s into its window, Litmus's Job being slower than the 3 s a SIGKILL was given; a kill
    landed by its effect now widens that, as a pod kill's did)."""
    recorded = {c["name"]: c for c in json.loads((kept / "result.json").read_text())["checks"]}
    run = RunData(kept)
    loss = no_acked_loss(run)
    assert loss.verdict == recorded["no_acked_loss"]["verdict"] == "pass"
    assert loss.figures["acked_lost"] == recorded["no_acked_loss"]["figures"]["acked_lost"] == 0
    assert loss.figures["acked"] == recorded["no_acked_loss"]["figures"]["acked"] > 0
    lag = lag_recovers_within(run, seconds=90)
    assert lag.verdict == recorded["lag_recovers_within"]["verdict"] == "pass"
    assert lag.figures["faults_recovered"] == lag.figures["faults"] == 3
    landed = faults_landed(run)
    assert landed.verdict == recorded["faults_landed"]["verdict"] == "pass"
    assert (landed.figures["faults_landed"], landed.figures["faults_healed"]) == (3, 3)
    assert no_oom(run).verdict == "pass"
    exits = no_unexpected_exit(run)
    assert exits.verdict == "pass" and exits.figures["injected_kills"] == 2, exits.message
