"""Every run says how much CPU its generator took: the per-second ``gen_cpu_s`` in the progress line, the
timeline's ``load`` events and ``load_valid`` (a warning with the numbers above 25 % of the machine,
``unknown`` above 75 %), and the native engine's batching knob in its config."""
from __future__ import annotations

import time

from monsoon.checks.base import RunData
from monsoon.checks.load import load_valid
from monsoon.checks.registry import validate_check
from monsoon.load.native import loadgen_config
from monsoon.load.shapes import Steady
from monsoon.load.stats import FleetTotals, SecondStats, SecondTicker, machine_cpus
from monsoon.observe.progress import progress_fields
from monsoon.stack.provision import Device

from tests.unit.helpers import RunBuilder


def run(tmp_path, cpu_per_s, *, cpus=2, sent_per_s=1000):
    """30 s on schedule (warmup/burst/recovery 10/10/10), the generator using ``cpu_per_s(sec)`` CPU s each second."""
    b = RunBuilder(tmp_path).phases(10, 10, 10)
    for sec in range(30):
        b.ev("load", sec + 1.0, sec=sec, target_rate=float(sent_per_s), scheduled=sent_per_s, sent=sent_per_s,
             acked=sent_per_s, failed=0, late=0, connected=10, p50_ms=5.0, p99_ms=9.0, max_ms=12.0,
             **({} if cpu_per_s is None else {"gen_cpu_s": cpu_per_s(sec)}))
    extra = {} if cpus is None else {"cpus": cpus}
    b.ev("op", 31.0, op="load-end", scheduled=30 * sent_per_s, sent=30 * sent_per_s, acked=30 * sent_per_s,
         failed=0, late=0, dropped=0, unacked=0, **extra)
    return RunData(b.write())


def test_a_light_generator_passes_and_says_its_cores_and_cpu_per_message(tmp_path):
    v = load_valid(run(tmp_path, lambda s: 0.1 if 10 <= s < 20 else 0.02))
    assert v.verdict == "pass", v.message
    assert "the generator used 0.10 cores of 2 (5%) in its busiest phase (burst)" in v.message
    assert "WARNING" not in v.message
    f = v.figures
    assert f["gen_cores_peak_phase"] == 0.1 and f["cpus"] == 2 and f["gen_pct_of_machine"] == 5.0
    assert f["gen_cpu_s"] == round(10 * 0.1 + 20 * 0.02, 3) and f["gen_cores"] == round(1.4 / 30, 3)
    assert f["gen_cpu_us_per_msg"] == round(1.4 / 30_000 * 1e6, 3)


def test_a_generator_over_a_quarter_of_the_machine_is_a_warning_with_numbers(tmp_path):
    v = load_valid(run(tmp_path, lambda s: 0.8 if 10 <= s < 20 else 0.1))
    assert v.verdict == "pass"
    assert v.message.count("WARNING") == 1 and "0.80 cores of 2 (40%)" in v.message and "burst" in v.message


def test_a_generator_taking_most_of_the_machine_makes_the_load_invalid(tmp_path):
    v = load_valid(run(tmp_path, lambda s: 1.7 if 10 <= s < 20 else 0.2))
    assert v.verdict == "unknown" and v.message.startswith("invalid load: the generator used 1.70 cores of 2 (85%)")
    assert v.figures["gen_pct_of_machine"] == 85.0
    # the limits are parameters of the check
    assert load_valid(run(tmp_path / "b", lambda s: 1.7), max_generator_pct=90).verdict == "pass"
    validate_check("load_valid", {"max_generator_pct": 50, "warn_generator_pct": 10})


def test_runs_without_the_measure_are_judged_as_before(tmp_path):
    v = load_valid(run(tmp_path, None))
    assert v.verdict == "pass" and "gen_cpu_s" not in v.figures and "generator used" not in v.message
    # CPU measured but no CPU count (a run saved before it was written): cores, no share, no judgement
    v = load_valid(run(tmp_path / "b", lambda s: 1.9, cpus=None))
    assert v.verdict == "pass" and "1.90 cores in its busiest phase" in v.message
    assert "gen_pct_of_machine" not in v.figures


def second(sent=1200, gen=None):
    return SecondStats(t=3, target_rate=1500.0, scheduled=1500, sent=sent, acked=1100, failed=0, late=0,
                       connected=48, p50_ms=5.0, p99_ms=9.0, max_ms=80.0, gen_cpu_s=gen)


def test_the_progress_line_carries_the_generators_cores_and_cpu_per_message():
    f = progress_fields(3, "burst", second(gen=0.3), lambda c, k: None, 0)
    assert f["gen_cpu"] == "0.30cores" and f["gen_us/msg"] == "250.0"
    assert list(f).index("gen_cpu") == list(f).index("connected") + 1
    f = progress_fields(3, "burst", second(sent=0, gen=0.01), lambda c, k: None, 0)
    assert f["gen_cpu"] == "0.01cores" and f["gen_us/msg"] is None
    f = progress_fields(3, "burst", second(gen=None), lambda c, k: None, 0)
    assert f["gen_cpu"] is None and f["gen_us/msg"] is None   # not measured: not shown


def test_the_in_process_ticker_measures_its_process_cpu_each_second():
    got: list[SecondStats] = []
    t = SecondTicker(0.0, [10.0, 10.0], lambda: (0, 0, 0, 0, 0), lambda: 1, _Hist(), _Hist(), None,
                     lambda: None, got.append)
    end = time.process_time() + 0.05
    while time.process_time() < end:      # burn 50 ms of CPU inside second 0
        pass
    t.catch_up(1.0)
    t.finish(1.5)
    assert [s.t for s in got] == [0, 1]
    assert got[0].gen_cpu_s >= 0.04 and got[1].gen_cpu_s >= 0.0


def test_totals_carry_the_machines_cpus():
    t = FleetTotals(0, 0, 0, 0, 0, 0, 0, {}, None, None, None)
    assert t.cpus == machine_cpus() >= 1


def test_batch_ms_goes_into_the_engine_config_only_when_given():
    devs = [Device("d0", "")]
    assert "batch_ms" not in loadgen_config(devs, "127.0.0.1", 1, shape=Steady(rate=1, duration=1))
    assert loadgen_config(devs, "127.0.0.1", 1, shape=Steady(rate=1, duration=1), batch_ms=0)["batch_ms"] == 0.0


class _Hist:
    def get_total_count(self):
        return 0


