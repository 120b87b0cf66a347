"""Schedule (pure intended send times) and Pacer (open-model bookkeeping),
driven by a fake clock: no sockets, no sleeping."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import pytest

from monsoon.load import shapes
from monsoon.load.schedule import Pacer, Schedule
from monsoon.load.shapes import Burst, Phase, Steady


class FakeClock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def drive(pacer: Pacer, clock: FakeClock, send, *, stop_at: float | None = None, max_batch=None):
    """The fleet's loop without the network: sleep (jump) to the next due
    time, pump, repeat; stop when the schedule ends or at ``stop_at``."""
    while not pacer.exhausted:
        now = clock()
        if stop_at is not None and now >= stop_at:
            pacer.stop(now)
            break
        pacer.pump(now, send, max_batch)
        nd = pacer.next_due
        if nd is not None and nd > clock.t:
            clock.t = nd if stop_at is None else min(nd, stop_at)


# ------------------------------------------------------------------ Schedule


def test_steady_yields_rate_times_duration_at_exact_times() -> None:
    times = list(Schedule(Steady(rate=1000, duration=3)))
    assert len(times) == 3000
    assert times == [k / 1000 for k in range(3000)]


def test_steady_has_no_drift_over_a_long_run() -> None:
    # 997 msg/s for 500 s: the k-th time is computed, so even message
    # 498,499 lands exactly on k/997 (accumulating 1/997 would drift).
    times = list(Schedule(Steady(rate=997, duration=500)))
    assert len(times) == 997 * 500
    for k in (0, 1, 996, 997, 250_000, len(times) - 1):
        assert times[k] == k / 997
    assert all(b > a for a, b in zip(times, times[1:]))


def test_non_integer_product_rounds_down_and_stays_inside_duration() -> None:
    times = list(Schedule(Steady(rate=3, duration=1.5)))  # 4.5 messages owed
    assert times == [0.0, 1 / 3, 2 / 3, 1.0, 4 / 3]  # k < 4.5 -> k = 0..4
    assert all(t < 1.5 for t in times)


def test_burst_ladder_changes_rate_exactly_at_boundaries() -> None:
    shape = Burst(base_rate=10, multiplier=3, start=1, burst_duration=1, duration=3)
    times = list(Schedule(shape))
    assert len(times) == 10 + 30 + 10
    warm, burst, rec = times[:10], times[10:40], times[40:]
    assert warm == [k / 10 for k in range(10)]
    assert burst == [1 + j / 30 for j in range(30)]
    assert rec == [2 + j / 10 for j in range(10)]
    # first message of each phase exactly at the boundary, none straddles
    assert burst[0] == 1.0 and rec[0] == 2.0
    assert max(warm) < 1.0 <= min(burst) and max(burst) < 2.0 <= min(rec)


def test_x10_burst_counts_per_phase() -> None:
    shape = Burst(base_rate=100, multiplier=10, start=2, burst_duration=3, duration=8)
    times = list(Schedule(shape))
    per_phase = {p.name: sum(p.start <= t < p.end for t in times) for p in shape.phases()}
    assert per_phase == {"warmup": 200, "burst": 3000, "recovery": 300}


def _owed(shape, t: float) -> float:
    """Reference integral of a piecewise-constant shape from 0 to t."""
    total = 0.0
    for p in shape.phases():
        lo, hi = p.start, min(p.end, t)
        if hi > lo:
            total += shape.rate_at(lo) * (hi - lo)
    return total


def test_fractional_carry_across_boundaries() -> None:
    # boundaries at awkward times: message k sits where the integral equals k
    shape = Burst(base_rate=7, multiplier=3, start=0.5, burst_duration=1.3, duration=3.3)
    times = list(Schedule(shape))
    assert len(times) == 42  # 7*0.5 + 21*1.3 + 7*1.5 = 41.3 -> k = 0..41
    for k, t in enumerate(times):
        assert _owed(shape, t) == pytest.approx(k, abs=1e-9)


@dataclass(frozen=True)
class Ramp:
    """A continuous ramp 100 -> 300 msg/s over 2 s (not a built-in shape)."""

    duration: float = 2.0

    def rate_at(self, t: float) -> float | None:
        return None if t >= self.duration else 100 + 100 * t

    def phases(self) -> list[Phase]:
        return [Phase("ramp", 0.0, self.duration)]


def test_continuous_shape_is_a_staircase_of_step_seconds() -> None:
    sched = Schedule(Ramp(), step=0.1)
    segs = list(sched.segments())
    assert len(segs) == 20
    assert segs[0] == (0.0, 0.1, 100.0)
    assert segs[-1][2] == pytest.approx(290.0)
    # sum over steps of rate(step start) * 0.1 = 390
    assert sched.count() == 390


def test_rate_none_before_duration_stops_the_schedule() -> None:
    @dataclass(frozen=True)
    class StopsEarly:
        duration: float = 10.0

        def rate_at(self, t: float):
            return 10.0 if t < 2 else None

        def phases(self):
            return [Phase("a", 0.0, 2.0), Phase("b", 2.0, 10.0)]

    assert list(Schedule(StopsEarly())) == [k / 10 for k in range(20)]


def test_zero_rate_segment_sends_nothing_and_resumes_in_phase() -> None:
    @dataclass(frozen=True)
    class Pause:
        duration: float = 3.0

        def rate_at(self, t: float):
            return None if t >= 3 else (0.0 if 1 <= t < 2 else 4.0)

        def phases(self):
            return [Phase("on", 0.0, 1.0), Phase("off", 1.0, 2.0), Phase("on2", 2.0, 3.0)]

    assert list(Schedule(Pause())) == [0.0, 0.25, 0.5, 0.75, 2.0, 2.25, 2.5, 2.75]


def test_invalid_shapes_raise_clear_errors() -> None:

    @dataclass(frozen=True)
    class Negative:
        duration: float = 1.0

        def rate_at(self, t: float):
            return -5.0

        def phases(self):
            return [Phase("x", 0.0, 1.0)]

    with pytest.raises(ValueError, match=r"rate_at\(0\) returned a negative rate -5.0"):
        list(Schedule(Negative()))

    @dataclass(frozen=True)
    class NoDuration:
        duration: float = 0.0

        def rate_at(self, t: float):
            return 1.0

        def phases(self):
            return []

    with pytest.raises(ValueError, match="shape duration must be > 0, got 0.0"):
        Schedule(NoDuration())
    with pytest.raises(ValueError, match="step must be > 0"):
        Schedule(Steady(1, 1), step=0)


# the per-second target (what a generator that keeps the schedule sends in each second)
RAMP = shapes.Ramp(start_rate=100, end_rate=1000, start=5, ramp_duration=10, duration=20)
SPIKE = shapes.Spike(base_rate=100, multiplier=10, every=2, width=0.5, start=5, end=15, duration=20)


@pytest.mark.parametrize("shape", [
    RAMP, SPIKE, Steady(rate=3, duration=1.5), Steady(rate=997, duration=4),
    Burst(base_rate=7, multiplier=3, start=0.5, burst_duration=1.3, duration=3.3),
    shapes.Ramp(start_rate=400, end_rate=0, start=0, ramp_duration=7.5, duration=7.5),
], ids=["ramp", "spike", "fractional", "steady", "burst-off-grid", "ramp-down-partial-second"])
def test_expected_per_second_is_what_the_schedule_sends_in_each_second(shape) -> None:
    sched = Schedule(shape)
    want = sched.expected_per_second()
    times = list(sched)
    sent = Counter(int(t) for t in times)
    assert len(want) == max(sent) + 1
    assert sum(want) == pytest.approx(len(times), abs=1.0)
    owed = done = 0.0
    for s, w in enumerate(want):
        owed, done = owed + w, done + sent[s]
        assert abs(done - owed) < 1.0 + 1e-9, f"second {s}: sent {sent[s]}, expected {w}"


def test_expected_per_second_integrates_ramps_and_spike_edges_not_the_rate_at_the_second_start() -> None:
    ramp = Schedule(RAMP).expected_per_second()
    assert ramp[4] == 100 and ramp[19] == 1000
    assert ramp[5] == pytest.approx(145.0)          # the ramp from 100 to 190 over [5, 6); rate_at(5) = 104.5
    assert sum(ramp[5:15]) == pytest.approx(5500.0)
    spike = Schedule(SPIKE).expected_per_second()
    assert spike[5] == pytest.approx(550.0)         # 0.5 s at 1000/s + 0.5 s at 100/s; rate_at(5) = 1000
    assert spike[6] == pytest.approx(100.0)
    assert sum(spike[5:15]) == pytest.approx(3250.0)


# --------------------------------------------------------------------- Pacer


def test_pacer_on_time_sink_sends_everything_never_late() -> None:
    clock = FakeClock()
    sent: list[tuple[int, float]] = []

    def sink(k: int, intended: float) -> bool:
        assert clock() == intended  # the fake sleep lands exactly on time
        sent.append((k, intended))
        return True

    p = Pacer(Schedule(Steady(200, 2)), clock(), clock=clock, late_tolerance=0.05)
    drive(p, clock, sink)
    assert p.scheduled == p.sent == 400
    assert p.late == p.failed == p.dropped == 0
    assert [k for k, _ in sent] == list(range(400))
    assert sent[123][1] == 1000.0 + 123 / 200  # absolute timeline: start + k/R


def test_stalled_sink_backlog_is_sent_and_counted_late() -> None:
    clock = FakeClock(0.0)

    def sink(k: int, intended: float) -> bool:
        if k == 100:  # t = 1.0: the sink blocks for 2 s
            clock.t += 2.0
        return True

    p = Pacer(Schedule(Steady(100, 5)), 0.0, clock=clock, late_tolerance=0.05)
    drive(p, clock, sink)
    # open model: the stall did not shift the schedule; everything went out
    assert p.scheduled == p.sent == 500
    assert p.dropped == p.failed == 0
    # message 100 was handed over on time (the clock is read before the
    # sink); 101..299 were due during the stall (intended 1.01 .. 2.99, sent
    # at 3.0); of those, the ones more than 50 ms late: intended < 2.95,
    # i.e. k = 101..294
    late_expected = sum(1 for k in range(101, 301) if 3.0 - k / 100 > 0.05)
    assert late_expected == 194
    assert p.late == late_expected


def test_clock_jump_then_stop_counts_backlog_as_dropped() -> None:
    clock = FakeClock(0.0)
    calls: list[int] = []

    def sink(k: int, intended: float) -> bool:
        calls.append(k)
        return True

    p = Pacer(Schedule(Steady(100, 10)), 0.0, clock=clock, late_tolerance=0.05)
    while p.next_due is not None and p.next_due < 1.0:  # k = 0..99 on time
        clock.t = p.next_due
        p.pump(clock(), sink)
    assert p.sent == 100 and p.late == 0 and not p.stopped
    clock.t = 3.0  # the process froze for 2 s: 1.00 .. 3.00 are due (201)
    assert p.pump(clock(), sink, max_batch=50) == 50  # worked off part of it
    dropped = p.stop(clock())
    assert dropped == 201 - 50 == p.dropped
    assert p.scheduled == 100 + 201  # messages after 3.0 never existed
    assert p.scheduled == p.sent + p.failed + p.dropped
    assert p.late == 50 - 0  # all 50 backlog sends were > 50 ms late
    # after stop nothing else is handed out
    clock.t = 100.0
    assert p.pump(clock(), sink) == 0 and p.exhausted and p.next_due is None
    assert calls == list(range(150))


def test_refused_messages_count_failed_not_sent_and_not_late() -> None:
    clock = FakeClock(0.0)

    def sink(k: int, intended: float) -> bool:
        return k % 4 != 0  # one device in four is "disconnected"

    p = Pacer(Schedule(Steady(100, 1)), 0.0, clock=clock)
    clock.t = 5.0  # everything due at once and > 50 ms late
    p.pump(clock(), sink)
    assert p.failed == 25 and p.sent == 75 and p.late == 75
    assert p.scheduled == 100 == p.sent + p.failed


def test_stop_before_anything_due_drops_nothing() -> None:
    clock = FakeClock(10.0)
    p = Pacer(Schedule(Steady(100, 1)), 10.5, clock=clock)
    assert p.stop(clock()) == 0
    assert p.scheduled == p.dropped == 0
    assert p.stop(clock()) == 0  # idempotent
