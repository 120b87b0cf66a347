"""Load shapes: rates, phases and validation."""

from __future__ import annotations

import pytest

from monsoon.shapes import Burst, LoadShape, Phase, Steady


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


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (dict(rate=0, duration=1), "rate must be > 0, got 0"),
        (dict(rate=-5, duration=1), "rate must be > 0, got -5"),
        (dict(rate=10, duration=0), "duration must be > 0, got 0"),
        (dict(rate=float("nan"), duration=1), "rate must be > 0, got nan"),
        (dict(rate="10", duration=1), "rate must be a number, got '10'"),
    ],
)
def test_steady_rejects_bad_parameters(kwargs: dict, needle: str) -> None:
    with pytest.raises(ValueError, match="^" + needle.replace("(", r"\(")):
        Steady(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        (dict(base_rate=0, multiplier=3, start=1, burst_duration=1, duration=5), "base_rate must be > 0, got 0"),
        (dict(base_rate=10, multiplier=0, start=1, burst_duration=1, duration=5), "multiplier must be > 0, got 0"),
        (dict(base_rate=10, multiplier=-3, start=1, burst_duration=1, duration=5), "multiplier must be > 0, got -3"),
        (dict(base_rate=10, multiplier=3, start=-1, burst_duration=1, duration=5), "start must be >= 0, got -1"),
        (dict(base_rate=10, multiplier=3, start=1, burst_duration=0, duration=5), "burst_duration must be > 0, got 0"),
        (dict(base_rate=10, multiplier=3, start=1, burst_duration=1, duration=0), "duration must be > 0, got 0"),
        (dict(base_rate=10, multiplier=3, start=4, burst_duration=2, duration=5), "burst must lie within duration"),
    ],
)
def test_burst_rejects_bad_parameters(kwargs: dict, needle: str) -> None:
    with pytest.raises(ValueError) as ei:
        Burst(**kwargs)
    assert needle in str(ei.value)


def test_burst_outside_duration_message_names_values() -> None:
    with pytest.raises(ValueError) as ei:
        Burst(base_rate=10, multiplier=3, start=4, burst_duration=2, duration=5)
    msg = str(ei.value)
    assert "start (4)" in msg and "burst_duration (2)" in msg and "duration (5)" in msg


def test_shapes_are_frozen() -> None:
    s = Steady(10, 1)
    with pytest.raises(AttributeError):
        s.rate = 20  # type: ignore[misc]
