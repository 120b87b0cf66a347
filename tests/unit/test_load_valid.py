"""The generator's self-check (load_valid) on hand-made timelines: a load that fell behind is never a pass."""
from __future__ import annotations

import asyncio
import threading

import pytest

from monsoon.checks.registry import CHECKS, validate_check
from monsoon.checks.base import RunData
from monsoon.stack.provision import Device
from monsoon.checks.load import load_valid
from monsoon.load.shapes import Ramp, Spike
from monsoon.load.aio import AsyncFleet

from tests.unit.helpers import RunBuilder


def run(tmp_path, seconds, *, late=0, dropped=0, target=100.0, held=None):
    """``seconds``: per-second (scheduled, late) over a warmup/burst/recovery of 10/10/10 s at x1/x3/x1;
    ``held``: {second: late sends of it that waited for a request slot the platform held}."""
    b = RunBuilder(tmp_path).phases(10, 10, 10)
    for sec, (took, ls) in enumerate(seconds):
        want = target * (3 if 10 <= sec < 20 else 1)
        extra = {"held": held[sec]} if held and sec in held else {}
        b.ev("load", sec + 1.0, sec=sec, target_rate=want, scheduled=took, sent=took, acked=took, failed=0,
             late=ls, connected=10, p50_ms=5.0, p99_ms=9.0, max_ms=12.0, **extra)
    sent = sum(s for s, _ in seconds)
    b.ev("op", 31.0, op="load-end", scheduled=sent + dropped, sent=sent, acked=sent, failed=0,
         late=late if late else sum(x for _, x in seconds), dropped=dropped, unacked=0)
    return RunData(b.write())


def on_time(target=100):
    return [(target * (3 if 10 <= s < 20 else 1), 0) for s in range(30)]


def test_on_schedule_load_passes_with_its_figures(tmp_path):
    v = load_valid(run(tmp_path, on_time()))
    assert v.verdict == "pass", v.message
    assert v.figures["late_pct"] == 0 and v.figures["pacing_error_pct"] == 0
    assert v.figures["scheduled"] == 10 * 100 + 10 * 300 + 10 * 100


def test_a_generator_that_cannot_reach_the_burst_rate_is_invalid_load_not_pass(tmp_path):
    secs = on_time()
    for s in range(10, 20):
        secs[s] = (200, 0)     # asked 300/s, managed 200/s: a third of the burst never happened on time
    v = load_valid(run(tmp_path, secs))
    assert v.verdict == "unknown"
    assert "invalid load" in v.message and "burst" in v.message
    assert abs(v.figures["pacing_error_pct_burst"] - 33.333) < 0.01
    assert v.figures["pacing_error_pct_warmup"] == 0


def test_late_messages_beyond_the_limit_make_the_load_invalid(tmp_path):
    secs = on_time()
    secs[12] = (300, 300)
    secs[13] = (300, 300)      # 600 of 5,000 late = 12 %
    v = load_valid(run(tmp_path, secs))
    assert v.verdict == "unknown" and "late" in v.message
    assert v.figures["late_pct"] == 12.0
    assert load_valid(run(tmp_path / "b", secs), max_late_pct=15).verdict == "pass"


def test_during_judges_one_phase_and_keeps_the_whole_loads_lateness_as_a_figure(tmp_path):
    secs = on_time()
    for s in range(3):
        secs[s] = (100, 100)       # a cold start: the warm-up's first 3 s all late, 300 of 5,000 = 6 % overall
    assert load_valid(run(tmp_path, secs)).verdict == "unknown"
    v = load_valid(run(tmp_path / "b", secs), during="burst")
    assert v.verdict == "pass", v.message
    assert v.figures["late_pct"] == 0 and v.figures["late_pct_all"] == 6.0
    assert "in the burst phase (6% late over the whole load)" in v.message
    w = load_valid(run(tmp_path / "c", secs), during="warmup")
    assert w.verdict == "unknown" and "30% of messages left late (limit 5%) in the warmup phase" in w.message
    x = load_valid(run(tmp_path / "d", secs), during="steady")
    assert x.verdict == "unknown" and "no phase 'steady'" in x.message


def test_dropped_messages_make_the_load_invalid(tmp_path):
    v = load_valid(run(tmp_path, on_time(), dropped=100))
    assert v.verdict == "unknown" and "never sent" in v.message
    assert v.figures["dropped"] == 100


def test_a_run_without_load_totals_is_unknown(tmp_path):
    b = RunBuilder(tmp_path).phases(10, 10, 10)
    b.ev("load", 1.0, sec=0, target_rate=100.0, scheduled=100, sent=100, acked=100, failed=0, late=0,
         connected=1, p50_ms=1.0, p99_ms=1.0, max_ms=1.0)
    v = load_valid(RunData(b.write()))
    assert v.verdict == "unknown" and "did not run to its end" in v.message


def test_load_valid_is_registered_with_validated_parameters():
    assert CHECKS["load_valid"] is load_valid
    validate_check("load_valid", {"max_late_pct": 2})
    try:
        validate_check("load_valid", {"max_late": 2})
    except ValueError as e:
        assert "max_late_pct" in str(e)
    else:
        raise AssertionError("an unknown parameter was accepted")


class PerfectFleet(AsyncFleet):
    """The fleets' real run loop (Schedule, Pacer, per-second stats) on a fake clock, answering every
    request at once: a generator that keeps its schedule exactly."""

    transport = "fake"

    def __init__(self, shape, tmp_path) -> None:
        self.now = 100.0
        super().__init__([Device(f"d{i}", f"t{i}") for i in range(20)], "127.0.0.1", 1, shape=shape,
                         acked_path=tmp_path / "acked.csv", max_inflight=1000, clock=lambda: self.now,
                         wall=lambda: 1_700_000_000.0 + self.now)

    async def _open(self) -> None:
        pass

    async def _shut(self) -> None:
        pass

    async def _deliver(self, dev, payload) -> None:
        return None

    async def _sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)          # wake exactly on time
        await asyncio.sleep(0)


@pytest.mark.parametrize("shape", [
    Ramp(start_rate=100, end_rate=1000, start=5, ramp_duration=10, duration=20),
    Spike(base_rate=100, multiplier=10, every=2, width=0.5, start=5, end=15, duration=20),
], ids=["ramp", "spike"])
def test_a_perfect_generator_on_a_ramp_or_a_spike_is_on_target(tmp_path, shape) -> None:
    """The per-second target the fleet writes is what its schedule asks for in that second (not the rate
    sampled at the start of the second, which is off by half a ramp step or a whole spike edge)."""
    fleet, secs = PerfectFleet(shape, tmp_path), []
    totals = fleet.run(threading.Event(), secs.append)
    assert totals.late == totals.dropped == totals.failed == 0 and totals.sent == totals.scheduled > 4000
    b = RunBuilder(tmp_path / "run")
    for p in shape.phases():
        b.phase(p.name, p.start, p.end)
    for st in secs:
        fields = dict(vars(st))
        b.ev("load", st.t + 1.0, sec=fields.pop("t"), **fields)
    b.ev("op", len(secs) + 1.0, op="load-end", scheduled=totals.scheduled, sent=totals.sent, acked=totals.acked,
         failed=0, late=0, dropped=0, unacked=0)
    v = load_valid(RunData(b.write()))
    assert v.verdict == "pass", v.message
    assert v.figures["pacing_error_pct"] < 1.0, v.figures
    for p in shape.phases():
        assert v.figures[f"pacing_error_pct_{p.name}"] < 1.0, v.figures


def test_lateness_the_platform_held_is_reported_and_not_judged(tmp_path):
    """Run hono-coap-native-b's shape: during a slowed command hop every device's telemetry waited behind its
    ~2 s command query (NSTART = 1), so 30 % of the sends went out late while the generator idled. Those waited
    for the platform (held): reported, not judged. The same lateness without held is still invalid load."""
    secs = on_time()
    for s in range(10, 20):
        secs[s] = (300, 150)                      # 1,500 of 5,000 late = 30 %
    v = load_valid(run(tmp_path, secs, held={s: 140 for s in range(10, 20)}))
    assert v.verdict == "pass", v.message
    assert v.figures["held"] == 1400 and v.figures["held_pct"] == 28.0
    assert v.figures["late_pct"] == 2.0 and v.figures["late_pct_burst"] == round(100 * 100 / 3000, 3)
    assert "1,400 more (28%)" in v.message and "platform held" in v.message
    bad = load_valid(run(tmp_path / "b", secs))
    assert bad.verdict == "unknown" and bad.figures["late_pct"] == 30.0 and "held" not in bad.figures


def test_held_lateness_beside_the_generators_own_is_still_judged_on_the_rest(tmp_path):
    secs = on_time()
    for s in range(10, 20):
        secs[s] = (300, 150)
    v = load_valid(run(tmp_path, secs, held={s: 50 for s in range(10, 20)}))   # 1,000 of 5,000 not held: 20 %
    assert v.verdict == "unknown", v.message
    assert v.figures["late_pct"] == 20.0 and v.figures["held"] == 500
    assert "20% of messages left late" in v.message and "500 more (10%)" in v.message
