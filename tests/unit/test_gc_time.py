"""gc_time_below (monsoon/checks/gc.py) and the calibration's GC criterion: pure logic over hand-made runs."""
from __future__ import annotations

import pytest

from monsoon.checks.base import FAIL, PASS, UNKNOWN, RunData
from monsoon.checks.gc import gc_rate_series, gc_stretches, gc_time_below
from monsoon.checks.registry import CHECKS, validate_check
from monsoon.run.calibrate import Criteria, Step, decide, gc_window_fraction, measure_step
from tests.unit.helpers import RunBuilder


def counter(rates: list[float], start: float = 0.0, dt: float = 1.0, reset_at: int | None = None):
    """(t, cumulative gc seconds) from per-interval GC fractions; the counter restarts from 0 at ``reset_at``."""
    out, v = [(start, 0.0)], 0.0
    for i, r in enumerate(rates):
        v = (0.0 if reset_at is not None and i == reset_at else v) + r * dt
        out.append((start + (i + 1) * dt, v))
    return out


def run_with(tmp_path, points, phases=(("steady", 0.0, 100.0),)) -> RunData:
    b = RunBuilder(tmp_path)
    for n, a, e in phases:
        b.phase(n, a, e)
    for t, v in points:
        b.metrics(t, gc_seconds=v)
    return RunData(b.write())


def test_rate_series_is_the_trailing_window_fraction():
    s = gc_rate_series(counter([0.0] * 10 + [0.5] * 10), window_s=5)
    assert s[4] == (5.0, 0.0, 0.0)
    assert s[-1][2] == pytest.approx(0.5)              # 5 s window, all at 50 %
    assert s[11][2] == pytest.approx(0.5 * 2 / 5)      # two of the five seconds at 50 %


def test_a_counter_reset_counts_from_zero():
    s = gc_rate_series(counter([0.2] * 8, reset_at=4), window_s=1)
    assert [round(f, 3) for _, _, f in s] == [0.2] * 8


def test_one_young_pause_is_not_a_stretch_but_sustained_gc_is():
    one = counter([0.0] * 10 + [0.3] + [0.0] * 10)
    assert gc_stretches(one, 0.1, 5) == []       # 0.3 s in 5 s = 6 %
    hot = counter([0.0] * 10 + [0.4] * 8 + [0.0] * 10)
    (st,) = gc_stretches(hot, 0.1, 5)
    assert (st.start, st.end) == (10.0, 18.0) and st.worst == pytest.approx(0.4)


def test_fails_and_says_when_and_for_how_long(tmp_path):
    v = gc_time_below(run_with(tmp_path, counter([0.01] * 20 + [0.5] * 15 + [0.01] * 20)), fraction=0.1)
    assert v.verdict == FAIL
    assert v.figures["gc_stretches"] == 1 and 15 <= v.figures["gc_over_s"] <= 20
    assert v.figures["worst_gc_fraction"] == pytest.approx(0.5)
    assert "in steady" in v.message and "for " in v.message and "+2" in v.message   # starts ~20-22 s in


def test_passes_under_the_limit_and_within_the_allowance(tmp_path):
    assert gc_time_below(run_with(tmp_path / "a", counter([0.05] * 40)), fraction=0.1).verdict == PASS
    v = gc_time_below(run_with(tmp_path / "b", counter([0.0] * 20 + [0.5] * 3 + [0.0] * 20)), fraction=0.1,
                      max_seconds=30)
    assert v.verdict == PASS and v.figures["gc_stretches"] == 1


def test_unknown_without_a_gc_counter(tmp_path):
    assert gc_time_below(run_with(tmp_path, [(1.0, 0.0)])).verdict == UNKNOWN


def test_registered_and_validated():
    assert CHECKS["gc_time_below"] is gc_time_below
    validate_check("gc_time_below", {"fraction": 0.1, "window_s": 5})
    with pytest.raises(ValueError, match="fraction"):
        validate_check("gc_time_below", {"fraction": -1})


# ---------------------------------------------------------------- the calibration's GC criterion

def test_gc_window_fraction():
    assert gc_window_fraction(counter([0.25] * 8)) == pytest.approx(0.25)
    assert gc_window_fraction([(0.0, 1.0)]) is None
    st = measure_step(0, 100, [{"scheduled": 100, "sent": 100, "acked": 100}], [], [], gc=counter([0.3] * 4))
    assert st.gc_fraction == pytest.approx(0.3)


def _steps(gcs):
    return [Step(i, t, 8.0, scheduled=int(t * 8), sent=int(t * 8), acked=int(t * 8), gc_fraction=g)
            for i, (t, g) in enumerate(zip((100.0, 200.0, 400.0), gcs))]


def test_the_ramp_stops_on_gc_only_when_asked():
    assert decide(_steps([0.02, 0.05, 0.4])).criterion == "max-rate"
    d = decide(_steps([0.02, 0.05, 0.4]), Criteria(gc_fraction=0.2))
    assert (d.capacity_msg_s, d.criterion) == (200.0, "gc")
    assert "saturated by GC" in d.line() and "400" in d.line()
