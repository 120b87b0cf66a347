"""The live run of monsoon's seeded defects kept as fixtures (tests/fixtures/README.md, ``defects/``): run
20261129-054612-6e25, every defect of ``monsoon.selftest.defects.DEFECTS`` caught (7 of 7) and its 4 clean controls
passed, on an idle machine. Each kept experiment folder is copied into a temporary run and judged again with
``monsoon analyze`` (never in place: it writes into the tree it reads), so a change to a check that stops it
catching a defect, or makes it fail on a clean run, or changes its arithmetic, shows up here without a stack.

Each defect's intended check must FAIL with the figures the reduced fixture gives (exact: the datasets keep
10 of the 50 devices, so the loss and duplicate counts are the kept devices', not the run's); each clean
control's checks must all PASS. Every verdict must be the one the run recorded (``result.json``, kept as it was),
and every check that reads only what was kept whole (the timeline, the GC log, the thread dumps) must give the
figures the run recorded."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from monsoon.selftest.defects import DEFECTS
from tests.unit.helpers import assert_as_recorded, rejudge

FAIL, PASS = "fail", "pass"
KEPT = Path(__file__).resolve().parents[1] / "fixtures" / "defects"

# each defect: the check that must fail, and its headline figures on the reduced fixture
DEFECT_FIGURES: dict[str, tuple[str, dict]] = {
    "a-drop-acked": ("no_acked_loss", {"acked": 7191, "acked_lost": 9, "stored": 7182, "duplicates": 0,
                                       "stored_late": 0, "acked_lost_pct": 0.1252}),
    "b-duplicates": ("no_duplicates", {"duplicates": 20, "duplicate_keys": 20, "stored": 9834}),
    "c-memory-leak": ("no_memory_leak", {"max_mb_per_hour": 600.0, "heap_slope_mb_per_h": 1558.73, "heap_t": 113.04,
                                         "heap_points": 18, "heap_span_min": 1.0, "rss_slope_mb_per_h": 63.83,
                                         "rss_t": 1.7, "rss_points": 67}),
    "d-stall": ("consumer_not_stalled", {"stalled_partitions": 2, "worst_status": 5, "partitions": 2,
                                         "window": 10, "warn_polls": 0}),
    "e-early-commit": ("no_acked_loss", {"acked": 9820, "acked_lost": 10, "stored": 9810, "duplicates": 0,
                                         "stored_late": 0, "acked_lost_pct": 0.1018}),
    "f-thread-leak": ("no_thread_leak", {"reconnects": 50, "threads_baseline": 149.0, "threads_end": 199.0,
                                         "thread_increase": 50.0, "threads_peak": 199.0,
                                         "threads_per_reconnect": 1.0}),
    "g-pool-starvation": ("no_ingest_stall", {
        "stalls": 4, "stalled_seconds": 31.0, "judged_seconds": 85, "stall_durations_s": [10.0, 10.0, 1.0, 10.0],
        "max_stall_s": 10.0, "mean_stall_s": 7.8, "cpu_during_stalls_pct": 2.9, "period_s": 15.0,
        "period_range_s": [10.0, 25.0], "thread_dumps": 6,
        "blocking_frame": "io.monsoon.platform.CassandraTs.awaitAvailableConnection", "blocking_frame_threads": 12}),
}
# what the message says beyond the figures (the two partitions' stuck offsets; their order follows set
# iteration in monsoon.checks.burrow.partition_history, so each is looked for on its own)
DEFECT_MESSAGES: dict[str, list[str]] = {
    "a-drop-acked": ["9 of 7,191 acked messages lost (0.13%), e.g. monsoon-00000#3, monsoon-00000#670"],
    "b-duplicates": ["20 message(s) stored more than once (20 extra copies of 9,834 rows), e.g. monsoon-00000#462 x2"],
    "c-memory-leak": ["heap after GC 24 -> 51 MB over the last 1 min: slope +1,558.7 MB/h"],
    "d-stall": ["worst status STALL (5); 2 partition(s) in error",
                "tb_rule_engine-0 STALL at t=55s (45s into the steady): committed offset stuck at 5,273 for 10 polls",
                "tb_rule_engine-1 STALL at t=55s (45s into the steady): committed offset stuck at 6,709 for 10 polls"],
    "e-early-commit": ["10 of 9,820 acked messages lost (0.10%), e.g. monsoon-00000#291, monsoon-00001#291"],
    "f-thread-leak": ["threads 149 before the first disconnect -> 199 at the end of the load (+50) across 50 device "
                      "reconnect(s): 1.00 per reconnect"],
    "g-pool-starvation": ["4 stall(s) of 7.8 s on average, one every 15.0 s, CPU 2.9% meanwhile; threads waiting in "
                          "io.monsoon.platform.CassandraTs.awaitAvailableConnection"],
}
# each clean control: the figures of the checks its defects fail, on the reduced fixture
CLEAN_FIGURES: dict[str, dict[str, dict]] = {
    "clean-acf": {"no_acked_loss": {"acked": 7199, "acked_lost": 0, "stored": 7199},
                  "no_memory_leak": {"heap_slope_mb_per_h": 0.0, "heap_points": 15, "rss_slope_mb_per_h": 233.29,
                                     "rss_t": 17.75, "rss_points": 68},
                  "no_thread_leak": {"reconnects": 50, "threads_baseline": 99.0, "threads_end": 99.0,
                                     "thread_increase": 0.0}},
    "clean-be": {"no_acked_loss": {"acked": 9851, "acked_lost": 0, "stored": 9851},
                 "no_duplicates": {"duplicates": 0, "duplicate_keys": 0, "stored": 9851}},
    "clean-d": {"consumer_not_stalled": {"stalled_partitions": 0, "worst_status": 1, "partitions": 2, "warn_polls": 0},
                "lag_recovers_within": {"peak_lag": 797.0, "faults": 1, "faults_recovered": 1, "lag_at_end": 0.0}},
    "clean-g": {"no_ingest_stall": {"stalls": 0, "stalled_seconds": 0, "judged_seconds": 85}},
}
NAMES = [*DEFECT_FIGURES, *CLEAN_FIGURES]


def test_the_fixtures_are_the_defect_catalogue_and_small():
    assert sorted(d.name for d in KEPT.iterdir() if d.is_dir()) == sorted(NAMES)
    assert {d.key: d.expected for d in DEFECTS} == {k: check for k, (check, _) in DEFECT_FIGURES.items()}
    for d in DEFECTS:                  # each fixture is the run of that defect's own experiment
        rec = json.loads((KEPT / d.key / "result.json").read_text())
        assert (rec["stack"], rec["experiment"]) == (d.stack, d.experiment)
    sizes = {d.name: sum(f.stat().st_size for f in d.rglob("*") if f.is_file()) for d in KEPT.iterdir()}
    assert all(s < 400_000 for s in sizes.values()), sizes
    assert sum(sizes.values()) < 3_000_000, sizes


def judged(name: str, tmp_path: Path) -> tuple[dict, dict]:
    """(the checks of a copy of the fixture judged again by name, the run's own result.json)."""
    return rejudge(KEPT / name, tmp_path)


@pytest.mark.parametrize("name", list(DEFECT_FIGURES))
def test_a_seeded_defect_fails_its_check_again(name, tmp_path):
    got, recorded = judged(name, tmp_path)
    check, figures = DEFECT_FIGURES[name]
    assert got[check]["verdict"] == FAIL, got[check]["message"]
    assert {k: got[check]["figures"].get(k) for k in figures} == figures
    for said in DEFECT_MESSAGES[name]:
        assert said in got[check]["message"]
    assert_as_recorded(got, recorded)


@pytest.mark.parametrize("name", list(CLEAN_FIGURES))
def test_a_clean_control_passes_every_check_again(name, tmp_path):
    got, recorded = judged(name, tmp_path)
    assert {n: c["verdict"] for n, c in got.items()} == dict.fromkeys(got, PASS), \
        {n: c["message"] for n, c in got.items() if c["verdict"] != PASS}
    for check, figures in CLEAN_FIGURES[name].items():
        assert {k: got[check]["figures"].get(k) for k in figures} == figures, check
    assert_as_recorded(got, recorded)


def test_the_kept_timelines_hold_only_declared_events():
    """As tests/unit/test_timeline_events.py holds the top-level fixtures to the declarations (its glob does not
    reach these folders)."""
    from monsoon.timeline.events import check
    from monsoon.timeline.store import Events
    for name in NAMES:
        for e in Events.load(KEPT / name / "timeline.jsonl").events:
            check(e["type"], {k: v for k, v in e.items() if k != "type"})
