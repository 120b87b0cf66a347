"""Limits known up front: absurd sizes are refused at validation, naming the limit, before anything starts."""
from __future__ import annotations

import pytest

from monsoon.run import validate as V
from monsoon.run.validate import validate
from monsoon.spec.experiment import load_experiment
from monsoon.spec.yamlio import SpecError

EXP = """name: e
load:
  devices: DEVICES
  base_rate: RATE
  shape: {kind: burst, multiplier: MULT}
profiles:
  quick: {warmup: WARMUP, burst: 10, recovery: 10}
checks: [no_oom]
"""


def exp(tmp_path, devices=10, rate=100, mult=10, warmup=10):
    p = tmp_path / "e.yaml"
    p.write_text(EXP.replace("DEVICES", str(devices)).replace("RATE", str(rate)).replace("MULT", str(mult))
                 .replace("WARMUP", str(warmup)))
    return load_experiment(p)   # parsed only: validate() applies the limits


def refused(e, **kw) -> SpecError:
    with pytest.raises(SpecError) as ei:
        validate(None, e, "quick", **kw)
    return ei.value


def test_a_sane_experiment_passes(tmp_path):
    assert validate(None, exp(tmp_path), "quick") == []


def test_an_absurd_multiplier_is_refused_unless_forced(tmp_path):
    e = exp(tmp_path, mult="1.0e+9", rate="0.00001")
    err = refused(e)
    assert (err.key, err.line) == ("load.shape", 5)
    assert "x1e+09 is above monsoon's ceiling of x100" in str(err) and "--monsoon-force" in str(err)
    validate(None, e, "quick", force=True)    # forced: the rate itself (0.1 msg/s at the peak) is fine


def test_a_duration_past_the_profile_is_refused_with_the_limit(tmp_path):
    err = refused(exp(tmp_path, warmup="1.0e+12"))
    assert err.key == "profiles.quick" and err.line == 7
    assert "past the quick profile's limit of 3,600 s (1 h)" in str(err)


def test_a_rate_past_the_generator_is_refused_and_says_what_would_do(tmp_path):
    err = refused(exp(tmp_path, rate=5000, mult=10))
    assert err.key == "load.shape" and "peaks at 50,000 msg/s" in str(err) and "engine: native" in str(err)


def test_more_devices_than_one_process_can_connect_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(V, "fd_limit", lambda: 20_000)
    monkeypatch.setattr(V, "port_range", lambda: 28_232)
    err = refused(exp(tmp_path, devices=10_000_000))
    assert (err.key, err.line) == ("load.devices", 3)
    assert "open-file limit (20,000 less 256 reserved)" in str(err) and "engine: native" in str(err)
    monkeypatch.setattr(V, "fd_limit", lambda: 1_000_000)
    assert "28,232 ephemeral ports" in str(refused(exp(tmp_path, devices=100_000)))
