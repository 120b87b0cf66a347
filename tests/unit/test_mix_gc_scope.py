"""gc_time_below's scope (``over: kept-up``): a sweep's or a request mix's ramps end, by design, on a step the
platform did not keep up with; judged over the whole run, GC there failed every sweep. Pure, hand-made runs."""
from __future__ import annotations

import pytest

from monsoon.checks.base import FAIL, PASS, UNKNOWN, RunData
from monsoon.checks.gc import gc_time_below, kept_up_windows
from monsoon.checks.registry import validate_check
from monsoon.run.sweep import GC_CHECK, sweep_checks
from monsoon.spec.experiment import load_experiment
from tests.unit.helpers import RunBuilder
from tests.unit.test_gc_time import counter


def ramp_run(tmp_path, overload_gc: float = 0.6) -> RunData:
    """Three 10 s steps, GC 2 % in the two kept up, ``overload_gc`` in the third (not kept up)."""
    b = RunBuilder(tmp_path)
    b.phase("step00", 0.0, 10.0).phase("step01", 10.0, 20.0).phase("step02", 20.0, 30.0)
    for t, v in counter([0.02] * 20 + [overload_gc] * 10):
        b.metrics(t, gc_seconds=v)
    for i, ok in enumerate((True, True, False)):
        b.ev("calibration-step", 10.0 * i + 11, index=i, ok=ok, window=[10.0 * i + 1, 10.0 * i + 10])
    return RunData(b.write())


def test_the_whole_run_fails_on_the_overload_step_the_kept_up_steps_pass(tmp_path):
    run = ramp_run(tmp_path)
    whole = gc_time_below(run, fraction=0.1)
    assert whole.verdict == FAIL and "step02" in whole.message
    kept = gc_time_below(run, fraction=0.1, over="kept-up")
    assert kept.verdict == PASS, kept.message
    assert kept.figures["kept_up_steps"] == 2 and kept.figures["judged_s"] == 18.0
    assert kept.figures["worst_gc_fraction"] == pytest.approx(0.02)
    assert "judged over the 2 ramp steps that kept up" in kept.message


def test_gc_inside_a_kept_up_step_still_fails(tmp_path):
    b = RunBuilder(tmp_path)
    b.phase("step00", 0.0, 10.0).phase("step01", 10.0, 20.0)
    for t, v in counter([0.02] * 10 + [0.5] * 10):
        b.metrics(t, gc_seconds=v)
    b.ev("calibration-step", 11, index=0, ok=True, window=[1.0, 10.0])
    b.ev("calibration-step", 21, index=1, ok=True, window=[11.0, 20.0])
    v = gc_time_below(RunData(b.write()), fraction=0.1, over="kept-up")
    assert v.verdict == FAIL and "step01" in v.message


def test_no_kept_up_step_is_unknown_and_old_steps_without_windows_are_ignored(tmp_path):
    b = RunBuilder(tmp_path)
    for t, v in counter([0.5] * 10):
        b.metrics(t, gc_seconds=v)
    b.ev("calibration-step", 5, index=0, ok=True)          # a run from before windows were written
    b.ev("calibration-step", 9, index=1, ok=False, window=[1.0, 9.0])
    run = RunData(b.write())
    assert kept_up_windows(run.events) == []
    assert gc_time_below(run, fraction=0.1, over="kept-up").verdict == UNKNOWN


def test_the_scope_is_validated_and_the_sweeps_say_it():
    validate_check("gc_time_below", {"fraction": 0.1, "over": "kept-up"})
    with pytest.raises(ValueError, match="over must be one of"):
        validate_check("gc_time_below", {"over": "steps"})
    assert GC_CHECK[1]["over"] == "kept-up"
    for name in ("size-sweep", "size-sweep-story"):
        exp = load_experiment(name)
        assert ("gc_time_below", {"fraction": 0.1, "over": "kept-up"}) in sweep_checks(exp, "quick"), name
