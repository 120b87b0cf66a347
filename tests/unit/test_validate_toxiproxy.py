"""A Toxiproxy fault paired with a stack that has no ``chaos.toxiproxy`` is refused before anything starts, in one
line naming the experiment's file, line and ``faults.N``, the stack's file and the missing key: by ``monsoon
validate`` and by the run's pre-flight (:func:`monsoon.run.plan.plan_run`), which share the code."""
from __future__ import annotations

import pytest

from monsoon.cli import main as cli_main
from monsoon.run.plan import plan_run
from monsoon.spec.experiment import load_experiment
from monsoon.spec.stack import load_stack
from monsoon.spec.yamlio import SpecError
from tests.unit.test_cli_validate import STACK   # services db and app, no chaos section

TOXIPROXY = 'chaos: {toxiproxy: "http://127.0.0.1:{port:toxiproxy}"}\nports: {toxiproxy: auto}\n'

EXPERIMENT = """\
name: e
load: {devices: 5, base_rate: 100, shape: {kind: steady}}
profiles:
  quick: {warmup: 5, recovery: 30}
checks:
  - no_acked_loss
faults:
  - profile: process-pause
    target: app
  - profile: network-latency
    target: app->db
"""


def files(tmp_path, stack_extra: str = ""):
    s, e = tmp_path / "stack.yaml", tmp_path / "exp.yaml"
    s.write_text(STACK + stack_extra)
    e.write_text(EXPERIMENT)
    return s, e


def test_monsoon_validate_names_the_experiment_line_the_stack_file_and_the_key(tmp_path, capsys):
    s, e = files(tmp_path)
    rc = cli_main(["validate", "--stack", str(s), "--experiment", str(e)])
    out, err = capsys.readouterr()
    assert rc == 1 and "Traceback" not in out + err
    (line,) = out.splitlines()          # one line: the first toxiproxy fault, faults.1 (process-pause is fine)
    assert line.startswith(f"{e}:10: faults.1: fault 'platform-postgres-latency' (network-latency) goes through "
                           "Toxiproxy, but stack 's' ("), line
    assert f"{s}) has no chaos.toxiproxy" in line


def test_the_runs_pre_flight_refuses_the_same_pair_and_a_stack_with_toxiproxy_passes(tmp_path):
    s, e = files(tmp_path)
    with pytest.raises(SpecError) as info:
        plan_run(load_stack(s), load_experiment(e), "quick")
    assert (info.value.path, info.value.line, info.value.key) == (str(e), 10, "faults.1")
    assert "chaos.toxiproxy" in info.value.message and str(s) in info.value.message
    s.write_text(STACK + TOXIPROXY)
    plan = plan_run(load_stack(s), load_experiment(e), "quick")
    assert [f.backend for f in plan.faults] == ["process", "toxiproxy"]


def test_without_a_toxiproxy_fault_the_stack_needs_none(tmp_path):
    s, e = files(tmp_path)
    e.write_text(EXPERIMENT.split("  - profile: network-latency")[0])
    assert [f.backend for f in plan_run(load_stack(s), load_experiment(e), "quick").faults] == ["process"]


def test_the_shipped_hono_pair_is_refused_and_its_toxiproxy_twin_passes(capsys):
    assert cli_main(["validate", "--stack", "hono-kafka", "--experiment", "hono-infinispan-slowdown"]) == 1
    (line,) = capsys.readouterr().out.splitlines()
    assert "faults.0: fault 'command-router-infinispan-slowdown'" in line and "no chaos.toxiproxy" in line
    assert cli_main(["validate", "--stack", "hono-kafka-toxiproxy", "--experiment", "hono-infinispan-slowdown"]) == 0
