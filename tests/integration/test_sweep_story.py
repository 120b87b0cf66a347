"""On real Kafka, Postgres and the reference platform (``kafka`` stack), quick profile, through the pytest
plugin: ``monsoon.sweep("kafka", "size-sweep-story")`` finds the platform's capacity at 100 B and at 10 KB and
measures the stack's Kafka alone at both; as in Spring XD's message-size benchmark, msg/s falls and MB/s rises
with the size, on both. The sweep's result joins the session's summary and checklist. (``monsoon sweep``, the
CLI, is the same :func:`monsoon.run.sweep.run_sweep`: tests/unit/test_sweep.py checks that it dispatches.)"""
import json

import pytest

pytestmark = pytest.mark.integration

SCENARIO = '''
import json
import pytest


@pytest.mark.sweep
def test_story(monsoon):
    r = monsoon.sweep("kafka", "size-sweep-story")
    print("SWEEP-TRENDS " + json.dumps(r.trends))
    r.assert_pass()
'''


def test_size_sweep_on_kafka_through_pytest(pytester, tmp_path):
    pytester.makepyfile(test_story=SCENARIO)
    runs = tmp_path / "runs"
    res = pytester.runpytest_subprocess("-m", "sweep", f"--monsoon-runs-dir={runs}", "--monsoon-run-id=story",
                                        "--monsoon-no-history", "-p", "no:cacheprovider", "-s", timeout=400)
    out = res.stdout.str()
    print(out[-8000:])
    outcomes = res.parseoutcomes()
    assert outcomes.get("passed", 0) + outcomes.get("failed", 0) == 1, outcomes

    run_dir = runs / "story" / "kafka--size-sweep-story"
    rec = json.loads((run_dir / "sweep.json").read_text())
    assert not rec.get("error"), rec.get("error")
    assert [e["size"] for e in rec["sizes"]] == [100, 10000]
    stages = [json.loads(ln).get("stage") for ln in (run_dir / "timeline.jsonl").read_text().splitlines()
              if '"op": "course"' in ln]
    assert stages == ["starting the stack", "load", "drain", "load", "drain", "teardown"], stages
    for e in rec["sizes"]:
        assert e["capacity_msg_s"], e["result"]
        assert e["steps"] and all(s["ok"] for s in e["steps"][:-1])
        assert e["transport"]["consumed"] == e["transport"]["produced"] > 0, e["transport"]
    assert rec["trends"] == {"msg_s": "falls", "mb_s": "rises", "transport_msg_s": "falls",
                             "transport_mb_s": "rises"}, rec["rows"]
    assert "SWEEP-TRENDS " + json.dumps(rec["trends"]) in out
    # the sweep's own report: the table in the checklist and the page, the plot, GC from the JVM's own counter
    md = (run_dir / "checklist.md").read_text()
    assert "| 100 B |" in md and "| 10 KB |" in md and "platform: msg/s **falls** and MB/s **rises**" in md
    assert "sweep.png" in (run_dir / "report.html").read_text() and (run_dir / "sweep.png").stat().st_size > 1000
    (gc,) = [v for v in rec["checks"] if v["name"] == "gc_time_below"]
    assert gc["verdict"] in ("pass", "fail") and gc["figures"]["worst_gc_fraction"] > 0, gc

    # the session recorded it like any result: summary, checklist, page; the test's outcome is its verdict
    (r,) = json.loads((runs / "story" / "summary.json").read_text())["results"]
    assert r["kind"] == "size-sweep" and r["dir"] == str(run_dir)
    verdicts = {c["name"]: c["verdict"] for c in r["checks"]}
    assert verdicts == {"gc_time_below": gc["verdict"], "sweep_capacity": "pass"}, r
    assert r["figures"]["mb_s[10000B]"] > r["figures"]["mb_s[100B]"] > 0
    assert "size-sweep-story" in (runs / "story" / "checklist.md").read_text()
    assert "size-sweep-story" in (runs / "story" / "report.html").read_text()
    if gc["verdict"] == "pass":
        res.assert_outcomes(passed=1)
    else:   # assert_pass failed with the numbers: the table, then the failing check
        res.assert_outcomes(failed=1)
        assert "kafka / size-sweep-story (quick): FAIL" in out and "stopped by" in out, out
        assert "10 KB | " in out and "FAIL    gc_time_below" in out, out
