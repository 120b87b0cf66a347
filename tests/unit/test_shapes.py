"""Load shapes: rates, phases and validation."""

from __future__ import annotations

import pytest

from monsoon.load.shapes import Burst, LoadShape, Phase, Steady


def test_steady_rate_and_phase() -> None:
    s = Steady(rate=250, duration=10)
    assert isinstance(s, LoadShape)
    assert s.rate_at(0) == 250
    assert s.rate_at(9.999) == 250
    assert s.rate_at(10) is None
    assert s.rate_at(11) is None
    assert s.phases() == [Phase("steady", 0.0, 10.0)]


def test_burst_rates_change_exactly_at_boundaries() -> None:
    b = Burst(base_rate=100, multiplier=10, start=5, burst_duration=3, duration=12)
    assert isinstance(b, LoadShape)
    assert b.rate_at(0) == 100
    assert b.rate_at(4.999999) == 100
    assert b.rate_at(5) == 1000
    assert b.rate_at(7.999999) == 1000
    assert b.rate_at(8) == 100
    assert b.rate_at(11.9) == 100
    assert b.rate_at(12) is None
    assert b.phases() == [
        Phase("warmup", 0.0, 5.0),
        Phase("burst", 5.0, 8.0),
        Phase("recovery", 8.0, 12.0),
    ]


def test_burst_phases_are_contiguous_and_cover_duration() -> None:
    b = Burst(base_rate=50, multiplier=3, start=2.5, burst_duration=4, duration=9)
    ph = b.phases()
    assert ph[0].start == 0.0 and ph[-1].end == b.duration
    for left, right in zip(ph, ph[1:]):
        assert left.end == right.start


def test_burst_zero_length_phases_are_omitted() -> None:
    assert [p.name for p in Burst(10, 3, 0, 5, 5).phases()] == ["burst"]
    assert [p.name for p in Burst(10, 3, 1, 4, 5).phases()] == ["warmup", "burst"]


def test_shapes_are_frozen() -> None:
    s = Steady(10, 1)
    with pytest.raises(AttributeError):
        s.rate = 20  # type: ignore[misc]


# ---------------------------------------------------------------- new shapes

import math  # noqa: E402

from monsoon.load.schedule import Schedule  # noqa: E402
from monsoon.load.shapes import Ladder, LadderStep, PythonShape, Ramp, ShapeContext, Spike, Stage, Stages, check_rates


def _contiguous(shape) -> None:
    ph = shape.phases()
    assert ph[0].start == 0.0 and ph[-1].end == pytest.approx(shape.duration)
    for left, right in zip(ph, ph[1:]):
        assert left.end == right.start
    assert len({p.name for p in ph}) == len(ph)


def test_ramp_is_a_midpoint_staircase_between_hold_levels() -> None:
    r = Ramp(start_rate=100, end_rate=300, start=1, ramp_duration=2, duration=4)
    assert isinstance(r, LoadShape)
    assert r.rate_at(0) == 100 and r.rate_at(0.999) == 100
    assert r.rate_at(1.0) == pytest.approx(105)      # middle of the first 0.1 s cell: 1.05 s
    assert r.rate_at(1.09) == pytest.approx(105)
    assert r.rate_at(2.95) == pytest.approx(295)
    assert r.rate_at(3.0) == 300 and r.rate_at(3.99) == 300 and r.rate_at(4) is None
    assert [p.name for p in r.phases()] == ["warmup", "ramp", "hold"]
    _contiguous(r)


def test_ramp_may_start_from_zero_or_go_down() -> None:
    up = Ramp(0, 50, 0, 10, 10)
    assert [p.name for p in up.phases()] == ["ramp"]
    assert up.rate_at(0) == pytest.approx(0.25)
    down = Ramp(50, 0, 0, 10, 12)
    assert down.rate_at(11) == 0


def test_stages_are_phases_with_constant_rates_and_pauses() -> None:
    s = Stages((Stage("warmup", 2, 10), Stage("pause", 1, 0), Stage("burst", 3, 40)))
    assert isinstance(s, LoadShape) and s.duration == 6
    assert [s.rate_at(t) for t in (0, 1.99, 2, 2.99, 3, 5.99)] == [10, 10, 0, 0, 40, 40]
    assert s.rate_at(6) is None
    assert s.phases() == [Phase("warmup", 0, 2), Phase("pause", 2, 3), Phase("burst", 3, 6)]


def test_ladder_steps_gaps_and_phase_names() -> None:
    lad = Ladder(100, (LadderStep("x3", 10, 40, 3), LadderStep("burst", 50, 80, 10)), 120)
    assert isinstance(lad, LoadShape)
    assert [(p.name, p.start, p.end) for p in lad.phases()] == [
        ("warmup", 0, 10), ("x3", 10, 40), ("after-x3", 40, 50), ("burst", 50, 80), ("recovery", 80, 120)]
    assert [lad.rate_at(t) for t in (0, 10, 39.9, 40, 50, 79.9, 80, 119.9)] == [100, 300, 300, 100, 1000, 1000,
                                                                                   100, 100]
    assert lad.rate_at(120) is None
    contiguous = Ladder(10, (LadderStep("x3", 0, 5, 3), LadderStep("x10", 5, 10, 10)), 10)
    assert [p.name for p in contiguous.phases()] == ["x3", "x10"]


def test_spike_rates_windows_and_phases() -> None:
    sp = Spike(base_rate=100, multiplier=10, every=10, width=2, start=5, end=30, duration=40)
    assert isinstance(sp, LoadShape)
    assert list(sp.spikes()) == [(5, 7), (15, 17), (25, 27)]
    assert [sp.rate_at(t) for t in (0, 4.9, 5, 6.9, 7, 14.9, 15, 27, 30, 39.9)] == [
        100, 100, 1000, 1000, 100, 100, 1000, 100, 100, 100]
    assert [p.name for p in sp.phases()] == ["warmup", "burst", "recovery"]
    _contiguous(sp)
    cut = Spike(1, 2, every=10, width=5, start=0, end=12, duration=12)
    assert list(cut.spikes()) == [(0, 5), (10, 12)]


# Shapes do not validate their parameters: the spec does, once, with file, line and key. What a shape
# would have refused, the experiment's load.shape refuses (tests/unit/test_specs.py has the messages).
SHAPED = ("name: e\nload:\n  devices: 1\n  base_rate: 10\n  shape: SHAPE\n"
          "profiles: {quick: {warmup: 10, burst: 20, recovery: RECOVERY}}\nchecks: [no_oom]\n")


@pytest.mark.parametrize("shape,recovery,needle", [
    ("{kind: ramp, from: 0, to: 0}", 10, "load.shape: a ramp from 0 to 0 sends nothing"),
    ("{kind: burst, multiplier: 0}", 10, "load.shape.multiplier: Input should be greater than 0"),
    ("{kind: stages, stages: [{duration: 1, rate: 0}, {duration: 1, rate: 0}]}", 10, "every stage has rate 0"),
    ("{kind: stages, stages: [{duration: 1, rate: 5}, {duration: 1, rate: 0}]}", 10, "the last stage has rate 0"),
    ("{kind: stages, stages: [{duration: 1, rate: -5}]}", 10, "load.shape.stages.0.rate: Input should be greater"),
    ("{kind: stages, stages: [{duration: 0, rate: 5}]}", 10, "load.shape.stages.0.duration: Input should be greater"),
    ("{kind: ladder, steps: [{multiplier: 3, duration: 0.5}, {multiplier: 9, start: 0.4, duration: 0.2}]}", 10,
     "steps.1 starts at 0.4, before steps.0 ends (0.5)"),
    ("{kind: ladder, steps: [{multiplier: 0, duration: 0.5}]}", 10, "load.shape.steps.0.multiplier: Input should be"),
    ("{kind: spike, multiplier: 3, every: 10, width: 0.25}", 10, "load.shape.width: must be a multiple of 0.1 s"),
    ("{kind: spike, multiplier: 3, every: 10, width: 10}", 10, "spike width (10 s) must be shorter than every"),
    # phase names are the spec's too: a stage named like another's default, a step named like a window
    ("{kind: stages, stages: [{duration: 1, rate: 5}, {duration: 1, rate: 5, name: stage-1}]}", 10,
     "load.shape: profile 'quick': stages: two phases are named 'stage-1'; give each a distinct name"),
    ("{kind: ladder, steps: [{multiplier: 3, duration: 0.5, name: warmup}]}", 10,
     "load.shape: profile 'quick': ladder: two phases are named 'warmup'; give each a distinct name"),
    ("{kind: ladder, steps: [{multiplier: 3, duration: 1, name: recovery}]}", 10,
     "load.shape: profile 'quick': ladder: two phases are named 'recovery'"),
])
def test_what_a_shape_would_refuse_the_spec_refuses_naming_file_line_and_key(tmp_path, shape, recovery, needle):
    from monsoon.run.validate import load_checked
    from monsoon.spec.yamlio import SpecError
    p = tmp_path / "e.yaml"
    p.write_text(SHAPED.replace("SHAPE", shape).replace("RECOVERY", str(recovery)))
    with pytest.raises(SpecError) as ei:
        load_checked(p)
    assert str(ei.value).startswith(f"{p}:5: ") and needle in str(ei.value)


def test_a_step_named_recovery_is_fine_when_the_profile_has_no_recovery_window(tmp_path):
    from monsoon.run.validate import load_checked
    p = tmp_path / "e.yaml"
    p.write_text(SHAPED.replace("SHAPE", "{kind: ladder, steps: [{multiplier: 3, duration: 1, name: recovery}]}")
                 .replace("RECOVERY", "0"))
    assert load_checked(p).load.shape.step_names() == ["recovery"]



def _wave(t, ctx):
    return ctx.base_rate * (2 if ctx.warmup <= t < ctx.warmup + ctx.burst else 1)


def test_python_shape_calls_the_function_with_or_without_context() -> None:
    ctx = ShapeContext(base_rate=50, duration=10, warmup=2, burst=3, recovery=5)
    win = (Phase("warmup", 0, 2), Phase("burst", 2, 5), Phase("recovery", 5, 10))
    p = PythonShape(_wave, "tests:_wave", 10, win, ctx)
    assert isinstance(p, LoadShape)
    assert [p.rate_at(t) for t in (0, 2, 4.9, 5, 10)] == [50, 100, 100, 50, None]
    assert p.phases() == list(win)
    one = PythonShape(lambda t: 7 if t < 3 else None, "lam", 10, win)
    assert one.rate_at(1) == 7.0 and one.rate_at(3) is None


@pytest.mark.parametrize("fn,needle", [
    (lambda t: 10 - t, "python shape my.mod:f returned a negative rate -0.1 at t=10.1s"),
    (lambda t: "fast", "python shape my.mod:f returned 'fast' at t="),
    (lambda t: math.inf, "python shape my.mod:f returned a non-finite rate inf at t="),
    (lambda t: 1 / (t - t), "python shape my.mod:f raised at t=0s: ZeroDivisionError"),
])
def test_python_shape_bad_values_name_the_shape_and_t(fn, needle) -> None:
    p = PythonShape(fn, "my.mod:f", 20, (Phase("steady", 0, 20),))
    with pytest.raises(ValueError) as ei:
        check_rates(p)
    assert needle in str(ei.value)
    with pytest.raises(ValueError, match="python shape my.mod:f"):   # the same at run time, in the schedule
        list(Schedule(p))


# -------------------------------------------------- schedule integrates them


def _integral(shape, n: int = 200_000) -> float:
    """Midpoint-rule integral of rate_at over [0, duration), stopping at None."""
    dt = shape.duration / n
    total = 0.0
    for i in range(n):
        r = shape.rate_at((i + 0.5) * dt)
        if r is None:
            break
        total += r * dt
    return total


SHAPES = {
    "steady": Steady(97, 10),
    "burst": Burst(50, 10, 2, 3, 10),
    "ramp": Ramp(40, 400, 2, 5.05, 10),
    "ramp-down": Ramp(300, 0, 0, 7.3, 9),
    "stages": Stages((Stage("a", 2.5, 30), Stage("pause", 1.25, 0), Stage("b", 3.3, 210))),
    "ladder": Ladder(40, (LadderStep("x3", 1.5, 4.25, 3), LadderStep("burst", 5, 8.8, 10)), 10),
    "spike": Spike(60, 10, every=2.5, width=0.7, start=1.3, end=9.1, duration=11),
}


@pytest.mark.parametrize("name", list(SHAPES))
def test_schedule_message_count_is_the_integral_of_the_rate(name) -> None:
    shape = SHAPES[name]
    times = list(Schedule(shape))
    exact = {
        "steady": 970,
        "burst": 50 * 7 + 500 * 3,
        "ramp": 40 * 2 + (40 + 400) / 2 * 5.05 + 400 * (10 - 7.05),
        "ramp-down": 300 / 2 * 7.3,
        "stages": 30 * 2.5 + 210 * 3.3,
        "ladder": 40 * (10 - 2.75 - 3.8) + 120 * 2.75 + 400 * 3.8,
        "spike": 60 * 11 + 540 * (0.7 * 3 + 0.3),  # spikes at 1.3, 3.8, 6.3, 8.8 (the last cut at 9.1)
    }[name]
    # message k sits where the integral reaches k: ceil(integral) messages, give or take the float
    # rounding of the boundaries (8.8 - 5 = 3.8000000000000007)
    assert abs(len(times) - exact) <= 1
    assert _integral(shape) == pytest.approx(exact, rel=2e-3)
    assert all(b >= a for a, b in zip(times, times[1:])) and times[-1] < shape.duration
    check_rates(shape)


def test_schedule_puts_each_phase_s_messages_inside_it() -> None:
    lad = SHAPES["ladder"]
    times = list(Schedule(lad))
    per = {p.name: sum(p.start <= t < p.end for t in times) for p in lad.phases()}
    assert per["x3"] == pytest.approx(120 * 2.75, abs=1) and per["burst"] == pytest.approx(400 * 3.8, abs=1)
    sp = SHAPES["spike"]
    in_spikes = sum(any(a <= t < b for a, b in sp.spikes()) for t in Schedule(sp))
    assert in_spikes == pytest.approx(600 * (0.7 * 3 + 0.3), abs=2)
