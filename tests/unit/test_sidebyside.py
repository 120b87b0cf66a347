"""One experiment on several stacks side by side (Postgres vs Cassandra): pure logic over summary results, the
checklist's section, the report's table, and a fixed-base_rate run's capacity from its saved calibration."""
import json
import socket
import time

from monsoon.report import sidebyside
from monsoon.report.checklist import checklist, summary
from monsoon.report.html import render
from monsoon.run import calibrate as cal
from monsoon.spec.stack import load_stack


def result(stack, *, capacity, p50_x1, p99_x1, p50_x3, p99_x3, drain, lost, acked=144000, experiment="storage-compare"):
    phases = {"p50_ms.warmup": p50_x1, "p99_ms.warmup": p99_x1, "p50_ms.burst": p50_x3, "p99_ms.burst": p99_x3}
    figures = {"acked": acked, "acked_lost": lost, "observed_drain_s": drain, "base_rate_msg_s": 400.0}
    if capacity is not None:
        figures["calibrated_capacity_msg_s"] = capacity
    return {"stack": stack, "experiment": experiment, "verdict": "pass" if not lost else "fail", "figures": figures,
            "checks": [{"name": "no_acked_loss", "verdict": "pass" if not lost else "fail",
                        "figures": {"acked": acked, "acked_lost": lost}},
                       {"name": "latency_objective[warmup]", "verdict": "pass", "figures": dict(phases)},
                       {"name": "latency_objective[burst]", "verdict": "pass", "figures": dict(phases)}]}


PG = result("kafka", capacity=1953.0, p50_x1=4.2, p99_x1=31.0, p50_x3=6.0, p99_x3=88.0, drain=0.0, lost=0)
CS = result("kafka-cassandra", capacity=1250.0, p50_x1=5.1, p99_x1=40.0, p50_x3=9.0, p99_x3=420.0, drain=12.5, lost=3)


def test_rows_put_capacity_latency_per_phase_drain_and_loss_of_each_stack_side_by_side():
    tables = sidebyside.tables([PG, CS, result("inmemory", capacity=None, p50_x1=1, p99_x1=2, p50_x3=3, p99_x3=4,
                                                      drain=0, lost=0, experiment="burst-x3")])
    assert list(tables) == ["storage-compare"]        # burst-x3 ran on one stack only: nothing to compare
    phases, rows = tables["storage-compare"]
    assert phases == ["warmup", "burst"]               # load order, not alphabetical
    assert [r["stack"] for r in rows] == ["kafka", "kafka-cassandra"]
    cs = rows[1]
    assert cs["capacity_msg_s"] == 1250.0 and cs["base_rate_msg_s"] == 400.0
    assert cs["latency"] == {"warmup": (5.1, 40.0), "burst": (9.0, 420.0)}
    assert cs["drain_s"] == 12.5 and cs["acked_lost"] == 3 and cs["verdict"] == "fail"


def test_a_missing_figure_is_a_dash_and_recovery_stands_in_for_an_unobserved_drain():
    r = result("kafka", capacity=None, p50_x1=4.2, p99_x1=31.0, p50_x3=6.0, p99_x3=88.0, drain=None, lost=0)
    r["figures"].pop("observed_drain_s")
    r["checks"].append({"name": "lag_recovers_within", "verdict": "pass", "figures": {"recovery_s": 7.0}})
    phases, rows = sidebyside.tables([r, CS])["storage-compare"]
    cells = sidebyside.cells(rows[0], phases)
    assert cells[2] == "-" and "7 (recovery)" in cells


def test_the_checklist_and_the_report_show_the_table(tmp_path):
    s = summary("r1", "quick", [PG, CS])
    md = checklist(s)
    assert "## Side by side: storage-compare" in md
    assert "| stack | verdict | capacity msg/s | x1 msg/s | ack p50 / p99 ms (warmup) | ack p50 / p99 ms (burst) |" in md
    assert "| kafka-cassandra | FAIL | 1,250 | 400 | 5.1 / 40 | 9 / 420 | 12 | 3 / 144,000 |" in md
    assert md.index("## Side by side") < md.index("## Evidence")
    page = render(tmp_path, s)
    assert '<section class="side-by-side" data-experiment="storage-compare">' in page
    assert '<tr data-stack="kafka"><td>kafka</td><td>PASS</td><td>1,953</td>' in page
    assert "Side by side" not in checklist(summary("r2", "quick", [PG]))


def test_a_fixed_base_rate_run_carries_its_stacks_saved_capacity(tmp_path):
    stack = load_stack("kafka")
    assert cal.saved_capacity(stack, 400, cal_dir=tmp_path, profile="quick") is None     # not calibrated
    rec = {"stack": "kafka", "capacity_msg_s": 1600.0, "host": socket.gethostname(), "created": time.time(),
           "date": "2026-11-24T11:00:00+00:00", "profile": "quick", "lower_bound": False, "criterion": "stored-rate"}
    (tmp_path / "kafka.json").write_text(json.dumps(rec))
    info = cal.saved_capacity(stack, 400, cal_dir=tmp_path, profile="quick")
    assert info["capacity_msg_s"] == 1600.0 and info["base_rate"] == 400.0 and info["fraction"] == 0.25
    assert cal.saved_capacity(stack, 400, cal_dir=tmp_path, profile="full") is None     # another profile's heap
