"""The one run course (monsoon.run.course): each stage reported in one place, an error recorded as the run's,
a signal either recorded or passed on, the cleanup run on every path."""
from __future__ import annotations

import json

import pytest

from monsoon.run.course import CHECKS, DRAIN, LOAD, START, STAGES, Course
from monsoon.timeline.events import OP, OP_COURSE, OP_ERROR, OP_INTERRUPTED
from monsoon.timeline.store import Timeline


def _ops(path) -> list[dict]:
    return [e for e in map(json.loads, path.read_text().splitlines()) if e["type"] == OP]


def test_each_stage_is_where_the_run_is_and_an_op_on_the_timeline(tmp_path):
    said: list[str] = []
    with Timeline(tmp_path / "timeline.jsonl") as tl:
        c = Course(tl, "s/e", said.append)
        assert c.where == {"stage": START}
        c.enter(LOAD)
        c.where["phase"] = "burst"
        c.enter(DRAIN)
        assert c.where == {"stage": DRAIN}        # a phase belongs to the load stage only
    c.judge(type("R", (), {"evaluate": lambda self, out, checks: list(checks)})(), tmp_path, [("x", {})])
    assert c.where == {"stage": CHECKS}
    assert [(e["op"], e["stage"]) for e in _ops(tmp_path / "timeline.jsonl")] == [(OP_COURSE, LOAD), (OP_COURSE, DRAIN)]
    assert STAGES.index(LOAD) < STAGES.index(DRAIN) < STAGES.index(CHECKS)


def test_an_error_is_the_runs_with_its_traceback_and_the_cleanup_runs(tmp_path):
    said: list[str] = []
    closed: list[bool] = []
    with Timeline(tmp_path / "timeline.jsonl") as tl:
        c = Course(tl, "s/e", said.append)
        with c.guarded(cleanup=lambda: closed.append(True)):
            raise RuntimeError("no broker")
    assert c.error == "RuntimeError: no broker" and closed == [True]
    assert said == ["[s/e] ERROR RuntimeError: no broker"]
    (err,) = [e for e in _ops(tmp_path / "timeline.jsonl") if e["op"] == OP_ERROR]
    assert err["error"] == c.error and "RuntimeError" in err["traceback"]


def test_a_signal_is_recorded_by_a_ramp_and_passed_on_by_a_calibration(tmp_path):
    with Timeline(tmp_path / "timeline.jsonl") as tl:
        c = Course(tl, "s/e", lambda s: None)
        with c.guarded(on_interrupt=c.interrupted):
            raise KeyboardInterrupt
        assert c.error == "interrupted"
        closed: list[bool] = []
        with pytest.raises(KeyboardInterrupt):
            with Course(tl, "s/calibrate", lambda s: None).guarded(cleanup=lambda: closed.append(True)):
                raise KeyboardInterrupt
        assert closed == [True]
    assert [e["op"] for e in _ops(tmp_path / "timeline.jsonl")] == [OP_INTERRUPTED]
