"""The size sweep's pure parts: sized payloads, each size's ladder, the spec keys and the report's table."""
from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from monsoon.load.sweep import TransportResult, sized_payload
from monsoon.report import sweep as report
from monsoon.run.sweep import MIN_RATE, ladder_for
from monsoon.spec.experiment import LoadSpec
from monsoon.spec.sweep import SweepSpec


@pytest.mark.parametrize("size", [100, 1000, 10000, 100000])
def test_a_sized_payload_is_that_many_bytes_and_json(size):
    render = sized_payload(size).renderer(0, "monsoon-00000")
    msg = render(123456, 1_700_000_000_000, 1_700_000_000_001)
    assert len(msg) == size
    body = json.loads(msg)
    assert body["values"]["seq"] == 123456 and body["values"]["device"] == "monsoon-00000"


def test_a_size_too_small_for_the_fields_is_refused():
    with pytest.raises(ValueError, match="cannot hold"):
        sized_payload(60)


def test_the_smallest_size_ramps_from_base_rate_and_a_larger_one_from_the_previous_mb_s():
    assert ladder_for(100, None, 500, 8000) == (500.0, 8000.0)
    prev = {"size": 100, "capacity_msg_s": 4000.0}
    start, top = ladder_for(10000, prev, 500, 8000)
    assert start == 200.0                     # 1/20 of 4,000 msg/s (half of 0.4 MB/s at 10 KB would be 20)
    assert top == 8000.0                      # up to max_rate: the ramp stops at its first step not kept up
    assert ladder_for(10000, {"size": 100, "capacity_msg_s": 400000.0}, 500, 8000) == (8000.0, 8000.0)
    assert ladder_for(1000, {"size": 100, "capacity_msg_s": 2000.0}, 500, 8000)[0] == 100.0   # half the MB/s
    assert ladder_for(1000, {"size": 100, "capacity_msg_s": 50.0}, 500, 8000)[0] == MIN_RATE


def test_after_a_size_with_no_capacity_the_next_starts_at_base_rate_scaled():
    start, top = ladder_for(1000, {"size": 100, "capacity_msg_s": None}, 500, 8000)
    assert (start, top) == (50.0, 8000.0)


def test_spec_sizes_and_sweep():
    load = LoadSpec.model_validate({"devices": 2, "base_rate": 10, "shape": {"kind": "steady"},
                                    "payload": {"sizes": [100, 1000]}, "sweep": {"factor": 3}})
    assert load.payload.sizes == (100, 1000)
    assert load.sweep.resolved("nightly")["step_s"] == 10 and load.sweep.resolved("quick")["factor"] == 3
    for bad, msg in (({"sizes": [50]}, "from 100"), ({"sizes": [1000, 100]}, "increasing"),
                     ({"sizes": [100], "profile": "smart-meter"}, "drop profile")):
        with pytest.raises(ValidationError, match=msg):
            LoadSpec.model_validate({"devices": 2, "base_rate": 10, "shape": {"kind": "steady"}, "payload": bad})
    with pytest.raises(ValidationError, match="add payload"):
        LoadSpec.model_validate({"devices": 2, "base_rate": 10, "shape": {"kind": "steady"}, "sweep": {}})
    assert SweepSpec().resolved("full")["step_s"] == 60


def _record(caps, transport, lower=(False, False, False)):
    return {"stack": "kafka", "experiment": "size-sweep", "sizes": [
        {"size": s, "capacity_msg_s": c, "lower_bound": lb, "criterion": "acked-rate", "reason": "at x",
         "transport": TransportResult(s, produced=t * 3, consumed=t * 3, seconds=3.0).to_dict()}
        for s, c, t, lb in zip((100, 1000, 10000), caps, transport, lower)]}


def test_rows_trends_and_overhead():
    rec = _record([4000.0, 3000.0, 500.0], [60000, 40000, 5000])
    rows = report.rows(rec)
    assert [round(r["mb_s"], 2) for r in rows] == [0.4, 3.0, 5.0]
    assert rows[2]["overhead_pct"] == pytest.approx(90.0)
    assert report.trends(rec) == {"msg_s": "falls", "mb_s": "rises", "transport_msg_s": "falls",
                                  "transport_mb_s": "rises"}
    assert report.trends(_record([4000.0, 5000.0, 500.0], [1, 2, 3]))["msg_s"] == "mixed"
    assert report.trends(_record([4000.0, None, 500.0], [1, 2, 3]))["msg_s"] == "unknown"


def test_the_checklist_and_page_show_the_table_and_mark_lower_bounds(tmp_path):
    rec = _record([4000.0, 3000.0, 500.0], [60000, 40000, 5000], lower=(True, False, False))
    md = report.markdown(rec, [{"name": "gc_time_below", "verdict": "fail", "message": "for 12s"}])
    assert "| 100 B | >= 4,000 | >= 0.40 |" in md and "| 10 KB | 500 | 5.00 | 5,000 | 50.00 | 90% |" in md
    assert "msg/s **falls**" in md and "FAIL `gc_time_below`: for 12s" in md
    report.write(tmp_path, rec)
    assert (tmp_path / "sweep.png").stat().st_size > 1000
    assert "sweep.png" in (tmp_path / "report.html").read_text()
    assert "<td>&gt;= 4,000</td>" in (tmp_path / "report.html").read_text()


def test_bad_input_is_one_line(capsys):
    from monsoon.cli import main
    assert main(["sweep", "burst-x3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "load.payload.sizes" in err[0]
    assert main(["sweep", "size-sweep", "--sizes", "100,x"]) == 2
    assert "comma-separated" in capsys.readouterr().err


def test_analyze_judges_a_saved_sweep_again(tmp_path):
    from monsoon.checks.gc import gc_time_below  # noqa: F401 - registered
    from monsoon.analysis import analyze
    from tests.unit.helpers import RunBuilder
    sub = tmp_path / "run" / "kafka--size-sweep"
    b = RunBuilder(sub)
    b.events[0].update(kind="size-sweep", checks=[{"name": "gc_time_below", "params": {"fraction": 0.1}}])
    b.ev("op", 1.0, op="sweep-size", size=100)
    for i in range(20):
        b.metrics(1.0 + i, gc_seconds=0.5 * i)          # half of every second in GC
    b.write()
    (sub / "sweep.json").write_text(json.dumps(_record([4000.0, 3000.0, 500.0], [60000, 40000, 5000])))
    analyze(tmp_path / "run")
    rec = json.loads((sub / "sweep.json").read_text())
    assert [v["verdict"] for v in rec["checks"]] == ["fail"]
    assert "FAIL `gc_time_below`" in (sub / "checklist.md").read_text() and (sub / "sweep.png").exists()
