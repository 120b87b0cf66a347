"""``make defects``: the catch matrix on hand-made results, the defect experiments, and no_thread_leak."""
import json

import pytest
import yaml

from monsoon.selftest import defects as dx
from monsoon.checks.registry import CHECKS, validate_check
from monsoon.checks.base import FAIL, PASS, UNKNOWN, RunData
from monsoon.checks.memory import no_thread_leak
from monsoon.paths import REPO
from monsoon.spec.experiment import load_experiment
from monsoon.spec.stack import load_stack
from tests.unit.helpers import RunBuilder

D = {d.key: d for d in dx.DEFECTS}


def result(**verdicts):
    """An ExperimentResult.to_dict()-shaped result: check name -> verdict."""
    checks = [{"name": n, "verdict": v, "figures": {"x": 1}, "message": f"{n} said {v}"} for n, v in verdicts.items()]
    overall = "fail" if FAIL in verdicts.values() else ("unknown" if UNKNOWN in verdicts.values() else "pass")
    return {"stack": "s", "experiment": "e", "verdict": overall, "figures": {}, "checks": checks, "dir": "/tmp/x"}


# ------------------------------------------------------------------ the matrix

def test_a_defect_is_caught_when_its_intended_check_fails():
    e = dx.defect_entry(D["a-drop-acked"], result(no_acked_loss=FAIL, no_memory_leak=PASS, faults_landed=PASS))
    assert e["caught"] is True and e["caught_by"] == ["no_acked_loss"] and e["expected_verdict"] == FAIL
    assert e["figures"] == {"x": 1}


def test_a_defect_caught_only_by_another_check_is_missed():
    e = dx.defect_entry(D["b-duplicates"], result(no_acked_loss=FAIL, no_duplicates=PASS))
    assert e["caught"] is False and e["caught_by"] == ["no_acked_loss"] and e["expected_verdict"] == PASS


def test_unknown_is_not_caught_and_a_run_that_did_not_happen_is_not_caught():
    e = dx.defect_entry(D["c-memory-leak"], result(no_memory_leak=UNKNOWN))
    assert e["caught"] is False and e["expected_verdict"] == UNKNOWN
    e = dx.defect_entry(D["c-memory-leak"], None)
    assert e["caught"] is False and e["expected_verdict"] == "not run" and e["caught_by"] == []
    r = result(no_oom=PASS)
    r["error"] = "StackError: boom"
    e = dx.defect_entry(D["c-memory-leak"], r)
    assert e["expected_verdict"] == "missing" and e["error"] == "StackError: boom"


def test_clean_runs_count_false_alarms_and_unknowns_apart():
    ok = dx.clean_entry("defect-clean-acf", 1, result(no_acked_loss=PASS, no_thread_leak=PASS))
    assert ok["false_alarms"] == [] and ok["unknown"] == []
    bad = dx.clean_entry("defect-clean-acf", 2, result(no_acked_loss=FAIL, no_thread_leak=UNKNOWN))
    assert bad["false_alarms"] == ["no_acked_loss"] and bad["unknown"] == ["no_thread_leak"]
    crashed = dx.clean_entry("defect-clean-acf", 3, {"verdict": "unknown", "checks": [], "error": "boom"})
    assert crashed["unknown"] == ["(no verdicts)"] and crashed["error"] == "boom"


def summary_of(defect_verdicts: dict, clean_verdicts: list[dict], repeats: int = 3) -> dict:
    defects = [D[k] for k in defect_verdicts]
    res = {k: result(**v) for k, v in defect_verdicts.items()}
    clean = [("defect-clean-acf", i + 1, result(**v)) for i, v in enumerate(clean_verdicts)]
    return dx.summarize(defects, res, clean, 12.34, repeats)


def test_summary_all_caught_and_quiet_passes_and_serialises_to_one_json_line():
    s = summary_of({"a-drop-acked": {"no_acked_loss": FAIL}, "f-thread-leak": {"no_thread_leak": FAIL}},
                   [{"no_acked_loss": PASS, "no_thread_leak": PASS}] * 3)
    assert (s["defects"], s["caught"], s["clean_runs"], s["false_alarms"], s["clean_unknown"]) == (2, 2, 3, 0, 0)
    assert s["matrix"]["a-drop-acked"] == {**s["matrix"]["a-drop-acked"], "expected": "no_acked_loss",
                                           "caught_by": ["no_acked_loss"], "caught": True}
    assert s["seconds"] == 12.3
    assert dx.passed(s) and dx.problems(s) == []
    line = json.dumps(s, separators=(",", ":"))
    assert "\n" not in line and json.loads(line)["caught"] == 2


def test_summary_missed_defect_fails():
    s = summary_of({"a-drop-acked": {"no_acked_loss": PASS}, "f-thread-leak": {"no_thread_leak": FAIL}},
                   [{"no_acked_loss": PASS}] * 3)
    assert s["caught"] == 1 and not dx.passed(s)
    assert any("a-drop-acked NOT caught" in p for p in dx.problems(s))


def test_summary_false_alarm_fails():
    s = summary_of({"a-drop-acked": {"no_acked_loss": FAIL}},
                   [{"no_acked_loss": PASS}, {"no_acked_loss": PASS, "no_memory_leak": FAIL}, {"no_acked_loss": PASS}])
    assert s["false_alarms"] == 1 and s["clean_unknown"] == 0 and not dx.passed(s)
    assert any("FALSE ALARM" in p and "#2" in p and "no_memory_leak" in p for p in dx.problems(s))


def test_summary_unknown_on_a_clean_run_is_counted_apart_and_is_not_a_pass():
    s = summary_of({"a-drop-acked": {"no_acked_loss": FAIL}},
                   [{"no_acked_loss": PASS}, {"no_acked_loss": UNKNOWN}, {"no_acked_loss": PASS}])
    assert s["false_alarms"] == 0 and s["clean_unknown"] == 1 and not dx.passed(s)


def test_summary_without_clean_runs_when_some_were_asked_for_is_not_a_pass():
    s = summary_of({"a-drop-acked": {"no_acked_loss": FAIL}}, [], repeats=3)
    assert s["clean_runs"] == 0 and not dx.passed(s)
    assert dx.passed(summary_of({"a-drop-acked": {"no_acked_loss": FAIL}}, [], repeats=0))


def test_select_by_letter_or_key_and_reject_unknown():
    assert [d.letter for d in dx.select("a,e-early-commit")] == ["a", "e"]
    assert len(dx.select(None)) == 7
    with pytest.raises(SystemExit, match="unknown defect"):
        dx.select("z")


# ------------------------------------------------------------------ the experiments

def test_every_defect_has_a_valid_quick_experiment_that_runs_its_intended_existing_check():
    files = sorted(p.stem for p in (REPO / "experiments").glob("defect-*.yaml"))
    assert files == sorted(d.experiment for d in dx.DEFECTS)
    for d in dx.DEFECTS:
        spec = load_experiment(d.path())
        assert "defect" in spec.marks
        spec.durations("quick")
        names = [c.name for c in spec.checks]
        assert d.expected in CHECKS and d.expected in names, d.key
        for c in spec.checks:
            assert c.name in CHECKS
            validate_check(c.name, c.resolved("quick"))
        stack = load_stack(d.stack)
        assert set(spec.env) <= set(stack.services)
        flags = dx.defect_flags(dx.load_doc(d.path()))
        assert d.flag in flags.get("platform", {}), f"{d.path()} does not set {d.flag}"
        # each experiment seeds exactly its own defect
        assert [k for f in flags.values() for k in f] == [d.flag]


def test_defect_experiments_are_quick():
    for d in dx.DEFECTS:
        dur = load_experiment(d.path()).durations("quick")
        assert dur.total <= 150, f"{d.experiment}: {dur.total}s of load"


def test_clean_controls_strip_the_flags_keep_everything_else_and_validate(tmp_path):
    docs = {d.key: dx.load_doc(d.path()) for d in dx.DEFECTS}
    controls = dx.clean_controls(dx.DEFECTS, docs)
    covered = sorted(x for c in controls for x in c.letters)
    assert covered == sorted(d.letter for d in dx.DEFECTS)
    for c in controls:
        assert dx.defect_flags(c.doc) == {}
        assert "DEFECT_" not in json.dumps(c.doc.get("env", {}))
        for letter in c.letters:
            d = next(x for x in dx.DEFECTS if x.letter == letter)
            assert d.stack == c.stack
            stripped = dx.strip_flags(docs[d.key])
            assert {k: v for k, v in stripped.items() if k not in ("name", "description")} == \
                   {k: v for k, v in c.doc.items() if k not in ("name", "description")}
        p = tmp_path / f"{c.name}.yaml"
        p.write_text(yaml.safe_dump(c.doc))
        spec = load_experiment(p)
        assert spec.name == c.name
        # the control runs every intended check of the defects it controls
        for letter in c.letters:
            d = next(x for x in dx.DEFECTS if x.letter == letter)
            assert d.expected in [x.name for x in spec.checks]


def test_strip_flags_drops_only_defect_variables():
    doc = {"name": "x", "env": {"platform": {"DEFECT_A": "1", "TB_HEAP": "128m"}, "kafka": {"DEFECT_B": "true"}}}
    assert dx.strip_flags(doc) == {"name": "x", "env": {"platform": {"TB_HEAP": "128m"}}}
    assert dx.strip_flags({"name": "x", "env": {"platform": {"DEFECT_A": "1"}}}) == {"name": "x"}
    assert doc["env"]["platform"]["DEFECT_A"] == "1"   # not modified in place


def test_defects_sharing_a_layout_share_one_control():
    a = {"name": "a", "description": "A", "env": {"platform": {"DEFECT_X": "1"}}, "load": {"devices": 1}}
    b = {"name": "b", "description": "B", "env": {"platform": {"DEFECT_Y": "1"}}, "load": {"devices": 1}}
    c = {"name": "c", "description": "C", "env": {"platform": {"DEFECT_Z": "1"}}, "load": {"devices": 2}}
    ds = [dx.Defect("a", "x", "s", "no_acked_loss", "DEFECT_X", ""), dx.Defect("b", "y", "s", "no_acked_loss",
          "DEFECT_Y", ""), dx.Defect("c", "z", "s", "no_acked_loss", "DEFECT_Z", "")]
    controls = dx.clean_controls(ds, {"a-x": a, "b-y": b, "c-z": c})
    assert [(x.name, x.letters) for x in controls] == [("defect-clean-ab", ("a", "b")), ("defect-clean-c", ("c",))]
    other_stack = dx.Defect("b", "y", "t", "no_acked_loss", "DEFECT_Y", "")
    assert len(dx.clean_controls([ds[0], other_stack], {"a-x": a, "b-y": b})) == 2


# ------------------------------------------------------------------ no_thread_leak

def thread_run(tmp_path, threads_after: float, *, drop_at: float = 20.0, reconnect_at: float = 30.0,
               devices: int = 50, pid_change_at: float | None = None, end: float = 60.0) -> RunData:
    """1 Hz process samples (40 threads, then ``threads_after`` from the reconnect on) and per-second load
    events: every device connected, all dropped at ``drop_at``, all back at ``reconnect_at``."""
    b = RunBuilder(tmp_path)
    for s in range(int(end)):
        t = float(s)
        pid = 2 if pid_change_at is not None and t >= pid_change_at else 1
        n = 40.0 if t < reconnect_at else threads_after
        b.ev("sample", t + 0.5, collector="process", up=1, pid=pid, rss_mb=100.0, threads=n)
        conn = 0 if drop_at <= t < reconnect_at else devices
        b.ev("load", t + 1.0, sec=s, target_rate=10.0, scheduled=10, sent=10, acked=10, failed=0, late=0,
             connected=conn, p50_ms=1.0, p99_ms=2.0, max_ms=3.0)
    b.ev("op", end + 1.0, op="load-end", reconnects=devices * 2)
    return RunData(b.write())


def test_no_thread_leak_fails_when_threads_grow_with_the_reconnects(tmp_path):
    v = no_thread_leak(thread_run(tmp_path, 90.0))
    assert v.verdict == FAIL
    assert v.figures["thread_increase"] == 50 and v.figures["reconnects"] == 50
    assert v.figures["threads_per_reconnect"] == 1.0 and v.figures["reconnect_attempts"] == 100
    assert "thread leak" in v.message


def test_no_thread_leak_passes_when_threads_come_back_after_the_reconnects(tmp_path):
    v = no_thread_leak(thread_run(tmp_path, 44.0))
    assert v.verdict == PASS and v.figures["thread_increase"] == 4


def test_no_thread_leak_passes_a_bounded_step_small_per_reconnect(tmp_path):
    # +25 threads (a pool growing once) across 500 reconnects: 0.05 per reconnect
    v = no_thread_leak(thread_run(tmp_path, 65.0, devices=500), min_increase=20, max_per_reconnect=0.25)
    assert v.verdict == PASS and v.figures["threads_per_reconnect"] == 0.05


def test_no_thread_leak_is_unknown_without_reconnects_or_samples(tmp_path):
    v = no_thread_leak(thread_run(tmp_path / "a", 40.0, drop_at=1000, reconnect_at=1000))
    assert v.verdict == UNKNOWN and "not exercised" in v.message
    b = RunBuilder(tmp_path / "b")
    v = no_thread_leak(RunData(b.write()))
    assert v.verdict == UNKNOWN and "no process thread samples" in v.message
    # a disconnect right at the start: no baseline before it
    v = no_thread_leak(thread_run(tmp_path / "c", 90.0, drop_at=1.0, reconnect_at=5.0))
    assert v.verdict == UNKNOWN and "too few" in v.message


def test_no_thread_leak_judges_only_the_last_pid(tmp_path):
    # the service restarted (new pid) after the reconnects: its own history has no disconnect
    v = no_thread_leak(thread_run(tmp_path, 90.0, pid_change_at=40.0))
    assert v.verdict == UNKNOWN and v.figures["reconnects"] == 0


def test_no_thread_leak_is_registered_and_validated():
    assert CHECKS["no_thread_leak"] is no_thread_leak
    validate_check("no_thread_leak", {"min_increase": 20, "max_per_reconnect": 0.5})
    with pytest.raises(ValueError):
        validate_check("no_thread_leak", {"per_device": 1})
