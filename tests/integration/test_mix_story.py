"""On the reference platform with its Mongo (FerretDB) registry (``kafka-registry`` stack), quick profile,
through the pytest plugin: ``monsoon.mix("kafka-registry", "mix-story")`` warms every device (found by name,
read once), then ramps reads by id, searches by filter, device writes and Kafka modifications together until a
step is not kept up; the result names the capacity and what stopped it (GC, latency or errors), with each
operation's p50/p99/p99.9, and joins the session's summary and checklist."""
import json

import pytest

pytestmark = pytest.mark.integration

SCENARIO = '''
import json
import pytest


@pytest.mark.sweep
def test_story(monsoon):
    r = monsoon.mix("kafka-registry", "mix-story")
    print("MIX-RESULT " + json.dumps(r.record["result"]))
    r.assert_pass()
'''


def test_request_mix_on_the_reference_platform_through_pytest(pytester, tmp_path):
    pytester.makepyfile(test_story=SCENARIO)
    runs = tmp_path / "runs"
    res = pytester.runpytest_subprocess("-m", "sweep", f"--monsoon-runs-dir={runs}", "--monsoon-run-id=story",
                                        "--monsoon-no-history", "-p", "no:cacheprovider", "-s", timeout=300)
    out = res.stdout.str()
    print(out[-8000:])
    run_dir = runs / "story" / "kafka-registry--mix-story"
    rec = json.loads((run_dir / "mix.json").read_text())
    assert not rec.get("error"), rec.get("error")

    # the warm-up touched every device, its numbers kept apart from the ramp's
    w = rec["warmup"]
    assert w["entities"] == w["found"] == 20 and w["read"]["ok"] == 20 and w["lookup"]["errors"] == 0, w
    # a capacity, and what stopped it: one of the platform's saturation signs, not the generator or the top
    assert rec["capacity_ops_s"] and rec["capacity_ops_s"] >= 20, rec["result"]
    assert rec["criterion"] in ("gc", "latency-knee", "errors", "acked-rate", "stored-rate", "backlog-growth",
                                "stack-died"), rec["result"]
    assert "MIX-RESULT " + json.dumps(rec["result"]) in out
    # every operation ran, with its percentiles, at the capacity step and over the ramp
    assert set(rec["shares"]) == {"read", "search", "write", "modify"}
    for op in ("read", "search", "modify"):
        c, tot = rec["capacity_step_ops"][op], rec["ops"][op]
        assert c["ok"] > 0 and c["p50_ms"] <= c["p99_ms"] <= c["p999_ms"], (op, c)
        assert tot["ok"] >= c["ok"] and tot["p999_ms"] >= tot["p50_ms"] > 0, (op, tot)
    kept = [s for s in rec["steps"] if s["ok"]]
    assert kept and all(s["acked"] > 0 for s in kept)          # the writes went through the fleet
    assert rec["steps"][-1]["ok"] is False and rec["steps"][-1]["criterion"] == rec["criterion"]

    # the report: per-operation tables, the warm-up apart; the session recorded it like any result
    md = (run_dir / "checklist.md").read_text()
    assert "| read |" in md and "| search |" in md and "| modify |" in md and "## Warm-up (judged apart)" in md
    assert "p99.9 ms" in (run_dir / "report.html").read_text()
    (r,) = json.loads((runs / "story" / "summary.json").read_text())["results"]
    assert r["kind"] == "request-mix" and r["dir"] == str(run_dir)
    verdicts = {c["name"]: c["verdict"] for c in r["checks"]}
    assert verdicts["mix_capacity"] == "pass" and verdicts["mix_warmup"] == "pass", r
    assert r["figures"]["capacity_ops_s"] == rec["capacity_ops_s"] and r["figures"]["p999_ms[read]"] > 0
    assert "mix-story" in (runs / "story" / "checklist.md").read_text()
    if verdicts["gc_time_below"] == "pass":
        res.assert_outcomes(passed=1)
    else:
        res.assert_outcomes(failed=1)
