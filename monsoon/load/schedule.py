"""The open-model schedule (intended send time of every message) and the pacer that hands messages out."""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from fractions import Fraction
from math import ceil

from monsoon.load.shapes import LoadShape


class Schedule:
    """Intended send times (seconds since start) of an open-model load.

    The shape's rate is sampled at the start of each phase and then every
    ``step`` seconds inside it; consecutive samples with the same rate are
    merged into one segment. For piecewise-constant shapes (all built-in ones)
    each phase is therefore one exact segment; a continuously varying shape
    (a ramp) is approximated by a staircase of ``step`` seconds.

    Message k is sent at the time t where the integral of the rate from 0 to t
    equals k (message 0 at the first instant with a positive rate). Segment
    boundaries are integrated exactly (``Fraction``), so R msg/s for D
    seconds yields exactly ``floor(R*D)`` messages (R*D when that is whole).
    """

    def __init__(self, shape: LoadShape, *, step: float = 0.1) -> None:
        if not step > 0:
            raise ValueError(f"step must be > 0, got {step!r}")
        duration = float(shape.duration)
        if not duration > 0:
            raise ValueError(f"shape duration must be > 0, got {duration!r}")
        self.shape = shape
        self.step = float(step)
        self.duration = duration

    def _boundaries(self) -> list[float]:
        points = {0.0, self.duration}
        for p in self.shape.phases():
            for x in (float(p.start), float(p.end)):
                if 0.0 < x < self.duration:
                    points.add(x)
        return sorted(points)

    def segments(self) -> Iterator[tuple[float, float, float]]:
        """Constant-rate segments ``(start, end, rate)``, merged, in order.

        Stops early at the first ``rate_at(t) is None``.
        """
        cur: list[float] | None = None  # [start, end, rate]
        bounds = self._boundaries()
        for a, b in zip(bounds, bounds[1:]):
            i = 0
            while True:
                x = a + i * self.step  # computed, not accumulated
                if x >= b:
                    break
                y = min(a + (i + 1) * self.step, b)
                r = self.shape.rate_at(x)
                if r is None:
                    if cur is not None:
                        yield (cur[0], cur[1], cur[2])
                    return
                r = float(r)
                if r < 0:
                    raise ValueError(f"rate_at({x:g}) returned a negative rate {r!r}")
                if cur is not None and cur[2] == r and cur[1] == x:
                    cur[1] = y
                else:
                    if cur is not None:
                        yield (cur[0], cur[1], cur[2])
                    cur = [x, y, r]
                i += 1
        if cur is not None:
            yield (cur[0], cur[1], cur[2])

    def __iter__(self) -> Iterator[float]:
        area = Fraction(0)  # messages "owed" at the start of the segment
        for a, b, r in self.segments():
            if r <= 0:
                continue
            fr = Fraction(r)
            end_area = area + fr * (Fraction(b) - Fraction(a))
            k0 = ceil(area)
            # first message of the segment lies this far (in messages) past a
            frac0 = float(k0 - area)
            n = ceil(end_area) - k0  # messages k with area <= k < end_area
            for j in range(n):
                t = a + (frac0 + j) / r
                # guard against float rounding pushing t onto b
                yield t if t < b else _prev_float(b)
            area = end_area

    def count(self) -> int:
        """Total number of messages (walks the schedule; O(messages))."""
        return sum(1 for _ in self)

    def expected_per_second(self) -> list[float]:
        """Messages the schedule asks for in each second ``[s, s+1)`` of the load (index ``s``):
        the integral of its (segment) rate over that second, integrated exactly like the send
        times, so a generator that keeps its schedule takes this many off it in that second
        (within one message: the fractional carry). This is the fleets' per-second target: the
        rate sampled at the start of a second is not, on a ramp or around a spike edge.
        O(segments + seconds), no message is walked."""
        out: list[float] = []
        area = Fraction(0)          # integral of the rate from 0 to the start of the segment
        at_boundary = Fraction(0)   # ... to the last whole second passed
        n = 1                       # next whole second boundary
        for a, b, r in self.segments():
            fa, fr = Fraction(a), Fraction(r)
            while n <= b:
                cur = area + fr * (n - fa)
                out.append(float(cur - at_boundary))
                at_boundary, n = cur, n + 1
            area += fr * (Fraction(b) - fa)
        if area > at_boundary:      # the last, partial second
            out.append(float(area - at_boundary))
        return out


def _prev_float(x: float) -> float:
    return math.nextafter(x, -math.inf)


class Pacer:
    """Feeds due messages of a schedule to a sink and counts what happened.

    ``start`` is the absolute clock value of t=0. ``send(k, intended)`` gets
    the message index and its absolute intended time and returns True if the
    message went out, False if it was refused (counted ``failed``). A message
    sent more than ``late_tolerance`` seconds after its intended time (clock
    read just before calling the sink) is counted ``late``.
    """

    def __init__(
        self,
        schedule: Iterable[float],
        start: float,
        *,
        clock: Callable[[], float],
        late_tolerance: float = 0.05,
    ) -> None:
        self._it = iter(schedule)
        self.start = start
        self._clock = clock
        self.late_tolerance = late_tolerance
        self._next: float | None = next(self._it, None)
        self.index = 0
        self.scheduled = 0
        self.sent = 0
        self.failed = 0
        self.late = 0
        self.dropped = 0
        self.stopped = False

    @property
    def next_due(self) -> float | None:
        """Absolute intended time of the next message, None if none left."""
        if self._next is None or self.stopped:
            return None
        return self.start + self._next

    @property
    def exhausted(self) -> bool:
        """True once every message has been handed out (or the pacer stopped)."""
        return self._next is None or self.stopped

    def pump(
        self,
        now: float,
        send: Callable[[int, float], bool],
        max_batch: int | None = None,
    ) -> int:
        """Hand every message with intended time <= now to ``send``.

        Returns the number handed out. ``max_batch`` bounds one call so the
        caller can interleave network reads while working off a backlog.
        """
        n = 0
        start = self.start
        tol = self.late_tolerance
        clock = self._clock
        it = self._it
        while not self.stopped and self._next is not None:
            intended = start + self._next
            if intended > now or (max_batch is not None and n >= max_batch):
                break
            k = self.index
            self.index = k + 1
            self.scheduled += 1
            self._next = next(it, None)
            t = clock()
            if send(k, intended):
                self.sent += 1
                if t - intended > tol:
                    self.late += 1
            else:
                self.failed += 1
            n += 1
        return n

    def stop(self, now: float) -> int:
        """Stop: messages already due (intended <= now) but not handed out are
        counted ``scheduled`` and ``dropped``; later ones never existed."""
        if self.stopped:
            return 0
        n = 0
        while self._next is not None and self.start + self._next <= now:
            self.index += 1
            self._next = next(self._it, None)
            n += 1
        self.scheduled += n
        self.dropped += n
        self.stopped = True
        return n
