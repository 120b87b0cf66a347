"""Calibration's pure logic (the capacity decision on hand-made step tables) and ``base_rate: auto``
(spec validation, dry run, resolution from a calibration file) without a live stack."""
import json
import socket
import textwrap
import time

import pytest

from monsoon.run import calibrate as cal
from monsoon.run.calibrate import Criteria, Step, decide, judge_step, ladder_rates, measure_step
from monsoon.run.validate import load_checked
from monsoon.spec.stack import load_stack
from monsoon.spec.yamlio import SpecError


def step(i, target, *, send=None, ack=None, stored=None, slope=0.0, p99=10.0, late=0, exits=0, seconds=8.0):
    """A step whose rates are given in msg/s (defaults: everything follows the target)."""
    send = target if send is None else send
    ack = send if ack is None else ack
    stored = send if stored is None else stored
    return Step(i, float(target), seconds, scheduled=int(target * seconds), sent=int(send * seconds),
                acked=int(ack * seconds), late=late, stored_rate=stored, backlog_slope=slope,
                backlog_end=slope * seconds, p99_ms=p99, exits=exits)


def ladder(*targets, **last):
    """Steps that all keep up, the last one with ``last`` overrides."""
    out = [step(i, t) for i, t in enumerate(targets)]
    if last:
        out[-1] = step(len(targets) - 1, targets[-1], **last)
    return out


def test_every_step_kept_up_is_a_lower_bound_at_the_max_rate():
    d = decide(ladder(200, 250, 312))
    assert (d.capacity_msg_s, d.criterion, d.lower_bound, d.generator_bound) == (312, "max-rate", True, False)
    assert d.line().startswith("capacity >= 312 msg/s")


def test_stored_rate_below_sent_stops_and_capacity_is_the_previous_step():
    steps = ladder(1000, 1250, 1562, 1953, stored=1700)
    d = decide(steps)
    assert (d.capacity_msg_s, d.criterion, d.failed_step, d.lower_bound) == (1562, "stored-rate", 3, False)
    assert "stored 1,700/s" in d.reason and d.line().startswith("capacity 1,562 msg/s")
    assert [s.ok for s in steps] == [True, True, True, False]


def test_stored_within_tolerance_keeps_up():
    assert decide(ladder(1000, 1250, stored=1150)).criterion == "max-rate"     # 92 % of sent


def test_acked_rate_below_sent_stops():
    d = decide(ladder(1000, 1250, ack=900))
    assert (d.capacity_msg_s, d.criterion) == (1000, "acked-rate")


def test_backlog_growth_stops_even_when_storage_keeps_pace():
    d = decide(ladder(1000, 1250, slope=150.0))
    assert (d.capacity_msg_s, d.criterion) == (1000, "backlog-growth")
    assert decide(ladder(1000, 1250, slope=30.0)).criterion == "max-rate"     # 30 < 5 % of 1250: noise
    # real TB 4.2.1 on Cassandra: its Kafka lag saw-tooths a pack at a time (318, 132, ... at 200-488 msg/s); a
    # step whose lag "grew 26 msg/s" to 212 (0.43 s of 488 msg/s) is that saw-tooth, not growth
    saw = ladder(391, 488, slope=26.0)
    saw[-1].backlog_end = 212.0
    assert decide(saw).criterion == "max-rate"
    saw[-1].backlog_end = 400.0                                                # 0.82 s of the target: growth
    assert decide(saw).criterion == "backlog-growth"


def test_latency_knee_needs_k_times_the_first_step_and_the_floor():
    assert decide(ladder(1000, 1250, p99=400.0)).criterion == "latency-knee"  # 40 x 10 ms and > 250 ms
    assert decide(ladder(1000, 1250, p99=200.0)).criterion == "max-rate"     # 20 x but under the floor
    steps = [step(0, 1000, p99=100.0), step(1, 1250, p99=300.0)]            # above the floor, only 3 x
    assert decide(steps).criterion == "max-rate"
    assert decide(steps, Criteria(latency_k=2)).criterion == "latency-knee"


def test_generator_bound_is_reported_as_a_lower_bound():
    d = decide(ladder(5000, 6250, 7812, send=6500))
    assert (d.capacity_msg_s, d.criterion, d.generator_bound, d.lower_bound) == (6250, "generator", True, True)
    assert d.line().startswith("capacity >= 6,250 msg/s (generator-bound")


def test_generator_late_sends_are_generator_bound_not_a_stack_limit():
    steps = ladder(5000, 6250, late=int(6250 * 8 * 0.8), stored=3000)   # stored low too, but the fleet was late
    d = decide(steps)
    assert (d.criterion, d.generator_bound, d.capacity_msg_s) == ("generator", True, 5000)


def test_sends_held_by_the_stack_are_its_limit_not_the_generators():
    """Run hono-mix-cal-b's step at 488 msg/s: 2,037 of 3,884 sends late, the generator at 0.33 cores, the sends
    waiting for HTTP request slots Hono held (command queries). That is the stack's limit, not a lower bound."""
    steps = ladder(391, 488)
    steps[-1] = Step(1, 488.0, 8.0, scheduled=3884, sent=3884, acked=3872, late=2037, held=1990,
                     stored_rate=None, backlog_slope=2.0, p99_ms=1458.0)
    d = decide(steps)
    assert (d.criterion, d.capacity_msg_s, d.generator_bound, d.lower_bound) == ("held", 391, False, False)
    assert "1,990 of them waiting for a request slot the stack held" in d.reason
    steps[-1].held = 0                                     # late without waiting for a slot: the generator's
    assert decide(steps).criterion == "generator" and decide(steps).generator_bound


def test_stack_died_during_a_step():
    d = decide(ladder(1000, 1250, exits=1))
    assert (d.capacity_msg_s, d.criterion) == (1000, "stack-died")


def test_no_step_kept_up():
    d = decide([step(0, 5000, stored=1600)])
    assert d.capacity_msg_s is None and d.criterion == "stored-rate" and not d.lower_bound
    assert d.line().startswith("no step kept up")
    g = decide([step(0, 50000, send=9000)])
    assert g.capacity_msg_s is None and g.generator_bound and not g.lower_bound


def test_the_first_failing_step_decides_later_steps_are_ignored():
    steps = ladder(1000, 1250, 1562, stored=100) + [step(3, 1953)]
    assert decide(steps).capacity_msg_s == 1250


def test_interrupted_and_empty_ramps():
    assert decide(ladder(200, 250), finished=False).criterion == "interrupted"
    d = decide([])
    assert d.capacity_msg_s is None and d.criterion == "interrupted"


def test_judge_step_without_storage_or_backlog_signals():
    s = Step(0, 1000.0, 8.0, scheduled=8000, sent=8000, acked=8000)
    assert judge_step(s, None) == (None, "")


def test_measure_step_from_seconds_and_samples():
    secs = [{"scheduled": 100, "sent": 100, "acked": 99, "late": 1, "failed": 0, "p99_ms": p, "held": 1}
            for p in (5, 7, 900)]
    stored = [(t, 50.0 * t) for t in range(10, 14)]
    backlog = [(t, 0.0) for t in range(10, 14)]
    s = measure_step(2, 100, secs, stored, backlog)
    assert (s.sent, s.acked, s.late, s.held, s.seconds) == (300, 297, 3, 3, 3.0)
    assert s.p99_ms == 7            # median of the per-second p99s: one GC pause is not a knee
    assert s.stored_rate == pytest.approx(50.0) and s.backlog_slope == pytest.approx(0.0) and s.backlog_end == 0
    assert measure_step(0, 100, [], [(1, 1.0)], []).stored_rate is None       # too few samples


def test_ladder_rates_geometric_up_to_the_max():
    assert ladder_rates(200, 1.25, 500) == [200, 250, 312, 391, 488, 500]
    assert ladder_rates(100, 2, 400) == [100, 200, 400]
    with pytest.raises(ValueError):
        ladder_rates(200, 1.0, 500)
    with pytest.raises(ValueError):
        cal.Params(step_seconds=4, settle_seconds=2)
    for bad in (-5, 2.5):
        with pytest.raises(ValueError, match="warmup_seconds"):
            cal.Params(warmup_seconds=bad)
    assert cal.Params().warmup_seconds == 20 and cal.Params(warmup_seconds=0).warmup_seconds == 0


# ------------------------------------------------------------ base_rate: auto

AUTO = """\
name: e
load:
  devices: 5
  base_rate: auto
  base_fraction: 0.25
  shape: {kind: burst, multiplier: 10}
profiles:
  quick: {warmup: 5, burst: 10, recovery: 10}
checks:
  - no_oom
"""


def write(tmp_path, text, name="e.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def test_auto_validates_without_a_stack(tmp_path):
    exp = load_checked(write(tmp_path, AUTO))
    assert exp.load.auto and exp.load.fraction == 0.25 and exp.load.rate_for_checks == 1.0
    exp = load_checked(write(tmp_path, AUTO.replace("  base_fraction: 0.25\n", "")))
    assert exp.load.fraction == 0.25 and exp.load.base_fraction is None


@pytest.mark.parametrize("old,new,line,key,msg", [
    ("base_rate: auto", "base_rate: 0", 4, "load.base_rate", "greater than 0"),
    ("base_rate: auto", "base_rate: -5", 4, "load.base_rate", "greater than 0"),
    ("base_rate: auto", 'base_rate: "fast"', 4, "load.base_rate", "or auto (got 'fast')"),
    ("base_fraction: 0.25", "base_fraction: 2", 5, "load.base_fraction", "less than or equal to 1"),
    ("base_fraction: 0.25", "base_fraction: 0", 5, "load.base_fraction", "greater than 0"),
    ("base_rate: auto", "base_rate: 100", 5, "load.base_fraction", "base_fraction is for base_rate: auto"),
])
def test_bad_auto_input_names_file_line_and_key(tmp_path, old, new, line, key, msg):
    p = write(tmp_path, AUTO.replace(old, new), "bad.yaml")
    with pytest.raises(SpecError) as ei:
        load_checked(p)
    assert (ei.value.path, ei.value.line, ei.value.key) == (str(p), line, key), str(ei.value)
    assert msg in str(ei.value)


def test_auto_still_checks_the_shape_for_negative_rates(tmp_path):
    bad = AUTO.replace("{kind: burst, multiplier: 10}", "{kind: python, function: 'wave:rate_at', file: wave.py}")
    bad = bad.replace("function: 'wave:rate_at'", "function: rate_at")
    (tmp_path / "wave.py").write_text("def rate_at(t, ctx):\n    return ctx.base_rate * (1 - t)\n")
    with pytest.raises(SpecError) as ei:
        load_checked(write(tmp_path, bad))
    assert ei.value.key == "load.shape" and "negative" in str(ei.value)


def test_auto_accepts_a_python_shape_whose_sign_depends_on_x1_and_the_runner_checks_it(tmp_path, monkeypatch):
    import monsoon.session as runner
    shape = AUTO.replace("{kind: burst, multiplier: 10}", "{kind: python, function: rate_at, file: wave.py}")
    (tmp_path / "wave.py").write_text("def rate_at(t, ctx):\n    return ctx.base_rate - 150\n")
    exp = load_checked(write(tmp_path, shape))          # fine for x1 >= 150: not refused at validation
    fixed = exp.model_copy(update={"load": exp.load.model_copy(update={"base_rate": 100.0})})
    monkeypatch.setattr("monsoon.run.plan.resolve_experiment",
                        lambda stack_spec, exp, profile, out_dir, **kw: (fixed, {"base_rate": 100.0}))
    from monsoon.spec.stack import load_stack
    with pytest.raises(SpecError) as ei:                    # x1 resolved to 100: -50 msg/s, refused before start
        runner.run_one(load_stack("inmemory"), exp, "quick", tmp_path / "out", run_id="t")
    assert ei.value.key == "load.shape" and "base_rate: auto = 100 msg/s" in str(ei.value)
    assert "negative" in str(ei.value)


def _record(capacity=1600.0, host=None, created=None):
    return {"stack": "inmemory", "capacity_msg_s": capacity, "criterion": "stored-rate", "host": host or socket.gethostname(),
            "created": time.time() if created is None else created, "date": "2026-01-01T00:00:00+00:00",
            "lower_bound": False, "result": "capacity 1,600 msg/s", "steps": []}


def test_usable_calibration_same_host_and_recent():
    now = time.time()
    h = socket.gethostname()
    assert cal.usable(_record(), host=h, max_age=86400, now=now) == (True, "")
    assert cal.usable(None, host=h, max_age=86400, now=now) == (False, "not yet calibrated")
    assert "host" in cal.usable(_record(host="elsewhere"), host=h, max_age=86400, now=now)[1]
    assert "days ago" in cal.usable(_record(created=now - 3 * 86400), host=h, max_age=86400, now=now)[1]
    assert not cal.usable(_record(capacity=None), host=h, max_age=86400, now=now)[0]


def test_a_calibration_from_another_profile_or_jar_is_not_used():
    h, now = socket.gethostname(), time.time()
    rec = dict(_record(), profile="quick", jar_sha256={"reference-platform.jar": "aa"})
    assert cal.usable(rec, host=h, max_age=86400, now=now, profile="quick",
                      jars={"reference-platform.jar": "aa"}) == (True, "")
    ok, why = cal.usable(rec, host=h, max_age=86400, now=now, profile="full")
    assert not ok and "profile 'quick', this run is 'full'" in why
    ok, why = cal.usable(rec, host=h, max_age=86400, now=now, profile="quick", jars={"reference-platform.jar": "bb"})
    assert not ok and "reference-platform.jar changed" in why


def test_max_age_from_the_environment(monkeypatch):
    monkeypatch.setenv(cal.MAX_AGE_ENV, "0.5")
    assert cal.max_age_s() == 43200
    monkeypatch.setenv(cal.MAX_AGE_ENV, "soon")
    with pytest.raises(ValueError, match=cal.MAX_AGE_ENV):
        cal.max_age_s()


def test_resolve_auto_uses_a_recent_calibration_file(tmp_path):
    (tmp_path / "inmemory.json").write_text(json.dumps(_record(1600.0)))
    lines = []
    info = cal.resolve_auto(load_stack("inmemory"), 0.25, cal_dir=tmp_path, calibrate_dir=tmp_path / "unused",
                            run_id="r", profile="quick", progress=lines.append)
    assert info["base_rate"] == 400 and info["capacity_msg_s"] == 1600 and info["source"] == "calibration-file"
    assert info["calibration_file"] == str(tmp_path / "inmemory.json") and not (tmp_path / "unused").exists()
    assert "400 msg/s" in lines[-1]


def test_dry_run_says_auto_and_where_the_rate_comes_from(tmp_path):
    from monsoon.session import run_one
    exp = load_checked(write(tmp_path, AUTO))
    out = tmp_path / "runs" / "rid" / "inmemory--e"
    res = run_one(load_stack("inmemory"), exp, "quick", out, run_id="rid", dry_run=True,
                         calibration_dir=tmp_path / "cal")
    assert "base_rate: auto (fraction 0.25 of calibrated capacity;" in res.dry_run
    assert "not yet calibrated" in res.dry_run and not out.exists()
    (tmp_path / "cal").mkdir()
    (tmp_path / "cal" / "inmemory.json").write_text(json.dumps(_record(2000.0)))
    res = run_one(load_stack("inmemory"), exp, "quick", out, run_id="rid", dry_run=True,
                         calibration_dir=tmp_path / "cal")
    assert "fraction 0.25 of calibrated capacity 2,000 msg/s = 500 msg/s; calibration file" in res.dry_run


def test_result_figures_carry_the_resolved_base_rate(tmp_path):
    from monsoon.report.result import ExperimentResult
    r = ExperimentResult("inmemory", "e", "quick", tmp_path)
    r.base_rate = {"base_rate": 400.0, "capacity_msg_s": 1600.0, "fraction": 0.25, "source": "calibration-file"}
    d = r.to_dict()
    assert d["figures"] == {"base_rate_msg_s": 400.0, "calibrated_capacity_msg_s": 1600.0, "base_fraction": 0.25}
    assert d["base_rate"]["source"] == "calibration-file"


def test_resolve_auto_calibrates_first_when_there_is_no_usable_file(tmp_path, monkeypatch):
    calls = []

    def fake_calibrate(stack_spec, out_dir, *, run_id, profile, progress, stop, save_to, **kw):
        calls.append((out_dir, run_id, profile, save_to))
        rec = _record(2000.0)
        save_to.parent.mkdir(parents=True, exist_ok=True)
        save_to.write_text(json.dumps(rec))
        return rec

    monkeypatch.setattr(cal, "calibrate", fake_calibrate)
    (tmp_path / "cal").mkdir()
    (tmp_path / "cal" / "inmemory.json").write_text(json.dumps(_record(1600.0, host="elsewhere")))
    lines = []
    exp = load_checked(write(tmp_path, AUTO))
    out = tmp_path / "runs" / "rid" / "inmemory--e"
    exp2, info = cal.resolve_experiment(load_stack("inmemory"), exp, "quick", out, run_id="rid",
                                        progress=lines.append, cal_dir=tmp_path / "cal")
    assert calls == [(out.parent / "calibrate-inmemory", "rid", "quick", tmp_path / "cal" / "inmemory.json")]
    assert "calibrated on host 'elsewhere'" in lines[0] and "calibrating inmemory first" in lines[0]
    assert info["source"] == "calibrated-now" and info["base_rate"] == 500 and exp2.load.base_rate == 500.0
    assert exp.load.auto and not exp2.load.auto and exp2.name == exp.name


def test_a_failed_calibration_makes_the_run_unknown_not_a_crash(tmp_path, monkeypatch):
    from monsoon.session import run_one
    monkeypatch.setattr(cal, "calibrate", lambda *a, **k: {**_record(None), "result": "no step kept up: stored-rate"})
    exp = load_checked(write(tmp_path, AUTO))
    out = tmp_path / "runs" / "rid" / "inmemory--e"
    res = run_one(load_stack("inmemory"), exp, "quick", out, run_id="rid", calibration_dir=tmp_path / "cal")
    assert res.verdict == "unknown" and "could not calibrate inmemory: no step kept up" in res.error
    assert json.loads((out / "result.json").read_text())["verdict"] == "unknown"
    assert not (tmp_path / "cal" / "inmemory.json").exists()


def test_a_step_names_every_criterion_it_failed():
    st = Step(0, 100.0, 10.0, scheduled=1000, sent=1000, acked=700, stored_rate=50.0, p99_ms=2000.0, gc_fraction=0.5)
    crit, reason = judge_step(st, 100.0, Criteria(gc_fraction=0.25))
    assert crit == "acked-rate"
    assert reason == ("acked 70/s < 90% of sent 100/s; stored-rate: stored 50/s < 90% of sent 100/s; "
                      "latency-knee: p99 2,000 ms > 5 x the first step's 100 ms (and > 250 ms); "
                      "gc: saturated by GC: 50% of the window in GC (> 25%)")
    d = decide([st], Criteria(gc_fraction=0.25))   # its own p99 is the baseline: no knee
    assert d.criterion == "acked-rate" and st.criteria == ["acked-rate", "stored-rate", "gc"]
    assert Step.from_dict(st.to_dict()).criteria == st.criteria


def test_a_dry_run_judges_the_saved_calibration_by_the_whole_key_as_the_run_does(tmp_path):
    """A dry run that names a saved capacity is a run that will use it: a calibration of another stack file (or
    CPU budget) is refused by the dry run too, naming why, instead of being shown as the x1 to come."""
    from monsoon.session import run_one
    exp = load_checked(write(tmp_path, AUTO))
    out = tmp_path / "runs" / "rid" / "inmemory--e"
    (tmp_path / "cal").mkdir()
    (tmp_path / "cal" / "inmemory.json").write_text(json.dumps({**_record(2000.0), "stack_sha256": "0" * 64}))
    res = run_one(load_stack("inmemory"), exp, "quick", out, run_id="rid", dry_run=True,
                  calibration_dir=tmp_path / "cal")
    assert "the stack file changed since the calibration (sha256)" in res.dry_run, res.dry_run
    assert "2,000 msg/s" not in res.dry_run and not out.exists()


def test_the_x1_line_keeps_a_small_fraction_readable():
    info = {"base_rate": 20.1, "capacity_msg_s": 610.0, "calibrated_at": "2026-11-30T04:20:28+00:00"}
    assert cal.x1_line({**info, "fraction": 0.033}) == \
        "x1 = 20 msg/s = 3.3% of 610 msg/s measured at 2026-11-30 04:20:28 UTC"    # not "3%"
    assert cal.x1_line({**info, "base_rate": 152.5, "fraction": 0.25}).startswith("x1 = 152 msg/s = 25% of 610")
    assert cal.x1_line({**info, "fraction": 0.08}).startswith("x1 = 20 msg/s = 8% of 610")


def test_a_first_step_with_next_to_nothing_acked_says_the_stack_may_still_be_starting():
    """A cold platform (Hono's release 15-32 s after its pods were ready) acks nothing through a short warm-up:
    the decision says so and how to give it time, rather than only that 200 msg/s was not kept up."""
    d = decide([step(0, 200, ack=2)])
    assert d.capacity_msg_s is None and d.criterion == "acked-rate"
    assert "it acked 16 of 1,600 sent at the first step: was it still starting?" in d.reason, d.reason
    assert "--warmup-seconds" in d.reason
    d = decide([step(0, 200), step(1, 250, ack=2)])           # a later step: a capacity, no such hint
    assert d.capacity_msg_s == 200 and "still starting" not in d.reason
    assert "still starting" not in decide([step(0, 200, ack=150)]).reason      # 75 % acked: not a cold start
