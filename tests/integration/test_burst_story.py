"""End to end, on real Kafka, Postgres and the reference platform, through the pytest plugin:
monsoon detects the in-memory x10 OOM and loss, and passes the Kafka x10 run."""
import json

import pytest

pytestmark = pytest.mark.integration

SCENARIO = '''
import pytest

@pytest.mark.burst
@pytest.mark.parametrize("stack", ["inmemory", "kafka"])
def test_x10(monsoon, stack):
    monsoon.run(stack, "burst-x10").assert_pass()
'''


def test_x10_story_is_detected_and_reported(pytester, tmp_path):
    pytester.makepyfile(test_story=SCENARIO)
    runs = tmp_path / "runs"
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

    # in-memory: dies of OOM, is restarted, loses acked messages
    assert by["inmemory"]["verdict"] == "fail"
    assert fig["inmemory"]["no_oom"]["oom_events"] >= 1 and fig["inmemory"]["no_oom"]["restarts"] >= 1
    assert fig["inmemory"]["no_acked_loss"]["acked_lost"] > 0
    assert verdict["inmemory"]["no_oom"] == "fail" and verdict["inmemory"]["no_acked_loss"] == "fail"
    # kafka: lag builds, drains, nothing acked is lost
    assert by["kafka"]["verdict"] == "pass", by["kafka"]
    assert fig["kafka"]["lag_recovers_within"]["peak_lag"] > 0
    assert "recovery_s" in fig["kafka"]["lag_recovers_within"]
    assert fig["kafka"]["no_acked_loss"]["acked_lost"] == 0 and fig["kafka"]["no_acked_loss"]["acked"] > 0
    assert fig["kafka"]["no_oom"]["oom_events"] == 0

    # what each running platform said it is (observe.facts: its actuator), in summary.json and the checklist
    assert by["inmemory"]["platform"] == {"version": "0.1.0", "queue": "in-memory", "ts_database": "sql"}
    assert by["kafka"]["platform"] == {"version": "0.1.0", "queue": "kafka", "ts_database": "sql"}
    assert "- kafka: version=0.1.0, queue=kafka, ts_database=sql" in (runs / "story" / "checklist.md").read_text()

    # the failure message carries the numbers; the checklist is printed and written
    assert "OutOfMemoryError" in out and "acked messages lost" in out
    assert "monsoon resilience sign-off" in out and "Decision: NO-GO" in out
    assert (runs / "story" / "checklist.md").read_text().count("| inmemory | burst-x10 |") == len(by["inmemory"]["checks"])
    assert (runs / "latest").resolve() == (runs / "story").resolve()

    # checks never talk to live systems: `monsoon analyze` on the saved run reproduces every verdict and figure
    import subprocess
    import sys
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
