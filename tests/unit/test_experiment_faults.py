"""An experiment's ``faults:``: real profiles from fault-profiles/ plus per-profile overrides, validated
for every profile before anything starts; errors name the experiment file, the line and ``faults.N``;
the dry run describes the plan and starts nothing."""
from __future__ import annotations

import secrets
import textwrap

import pytest

from monsoon.faults.resolve import describe, experiment_faults, resolve_fault
from monsoon.spec.fault import LatencyParams, PodKillParams
from monsoon.spec.experiment import FaultRef
from monsoon.run.plan import run_checks
from monsoon.run.validate import load_checked
from monsoon.spec.stack import load_stack
from monsoon.stack.reaper import find_leftovers
from monsoon.spec.yamlio import SpecError

HEAD = """\
name: chaos-test
load:
  devices: 2
  base_rate: 10
  shape: {kind: steady}
profiles:
  quick: {warmup: 30, recovery: 60}
  full: {warmup: 600, recovery: 6600}
checks: [no_oom]
faults:
"""
FAULTS_LINE = HEAD.count("\n") + 1   # the line of faults.0


def experiment(tmp_path, faults: str, name: str = "exp.yaml"):
    p = tmp_path / name
    p.write_text(HEAD + textwrap.indent(textwrap.dedent(faults), "  "))
    return p


def spec_error(fn, *args) -> SpecError:
    with pytest.raises(SpecError) as e:
        fn(*args)
    return e.value


KILL = """\
- profile: pod-kill
  name: kill
  schedule:
    at: {quick: 30, full: 3600}
    repeat_every: {quick: 40, full: 1800}
"""
LATENCY = """\
- profile: network-latency
  name: pg-latency
  params:
    latency_ms: {quick: 50, full: 500}
  schedule: {at: 20, duration: {quick: 30, default: 300}}
"""


# ------------------------------------------------------------------ resolving

def test_per_profile_schedule_values_resolve_per_profile(tmp_path):
    exp = load_checked(experiment(tmp_path, KILL))
    [quick] = experiment_faults(exp, "quick")
    [full] = experiment_faults(exp, "full")
    assert (quick.schedule.at, quick.schedule.repeat_every) == (30, 40)
    assert (full.schedule.at, full.schedule.repeat_every) == (3600, 1800)
    # keys the experiment does not override come from fault-profiles/pod-kill.yaml
    assert quick.schedule.duration == full.schedule.duration == 5
    assert quick.kind == "pod-kill" and quick.backend == "process" and str(quick.target) == "platform"
    assert isinstance(quick.params, PodKillParams) and quick.params.restart_timeout == 120
    assert quick.schedule.windows(90) == [(30, 35), (70, 75)]
    assert full.schedule.windows(7200) == [(3600, 3605), (5400, 5405)]


def test_params_merge_key_by_key_onto_the_profile(tmp_path):
    exp = load_checked(experiment(tmp_path, LATENCY))
    [q] = experiment_faults(exp, "quick")
    [f] = experiment_faults(exp, "full")
    assert isinstance(q.params, LatencyParams)
    assert q.params.latency_ms == 50 and f.params.latency_ms == 500
    # the rest of fault-profiles/network-latency.yaml's params stay
    assert (q.params.jitter_ms, q.params.stream, q.params.probe) == (20, "downstream", "postgres")
    assert q.target.hop == ("platform", "postgres")
    assert (q.schedule.at, q.schedule.duration, f.schedule.duration) == (20, 30, 300)
    assert q.name == "pg-latency"


def test_a_plain_profile_name_is_the_profile_as_shipped(tmp_path):
    exp = load_checked(experiment(tmp_path, "- network-latency\n- pod-kill\n"))
    lat, kill = experiment_faults(exp, "quick", load_stack("kafka"))
    assert (lat.name, lat.params.latency_ms, lat.schedule.at, lat.schedule.duration) == \
           ("platform-postgres-latency", 200, 30, 60)
    assert (kill.name, kill.schedule.at) == ("platform-pod-kill", 60)


def test_the_profile_file_is_not_changed_by_an_override(tmp_path):
    ref = FaultRef(profile="network-latency", params={"latency_ms": 999})
    assert resolve_fault(ref, "quick").params.latency_ms == 999
    assert resolve_fault(FaultRef(profile="network-latency"), "quick").params.latency_ms == 200


# -------------------------------------------------------------------- errors

def test_unknown_profile_names_the_experiment_file_line_and_key(tmp_path):
    p = experiment(tmp_path, "- profile: pod-kil\n")
    e = spec_error(load_checked, p)
    assert (e.path, e.line, e.key) == (str(p), FAULTS_LINE, "faults.0")
    assert str(e).startswith(f"{p}:{FAULTS_LINE}: faults.0: ")
    assert "pod-kil" in str(e) and "pod-kill" in str(e)   # lists the available profiles


def test_the_second_fault_is_faults_1_at_its_line(tmp_path):
    p = experiment(tmp_path, KILL + "- profile: nope\n")
    e = spec_error(load_checked, p)
    assert (e.line, e.key) == (FAULTS_LINE + KILL.count("\n"), "faults.1")


@pytest.mark.parametrize("faults,msg", [
    ("- profile: network-latency\n  params: {latency_ms: -1}\n", "latency_ms"),
    ("- profile: network-latency\n  params: {latency_ms: 10, jitter_ms: 50}\n", "jitter_ms (50) larger"),
    ("- profile: network-latency\n  params: {latncy_ms: 10}\n", "latncy_ms"),
    ("- profile: network-latency\n  backend: cgroup\n", "backend 'cgroup' cannot do network-latency"),
    ("- profile: pod-kill\n  target: platform->postgres\n", "pod-kill targets a service"),
    ("- profile: pod-kill\n  schedule: {duration: 60, repeat_every: 30}\n", "repeat_every"),
    ("- profile: pod-kill\n  params: {signal: SIGHUP}\n", "signal"),
])
def test_a_bad_override_names_the_experiment_file_and_line(tmp_path, faults, msg):
    p = experiment(tmp_path, faults)
    e = spec_error(load_checked, p)
    assert e.path == str(p) and at_entry_or_override(e), (e.line, e.key)
    assert msg in str(e)


def at_entry_or_override(e) -> bool:
    """Blamed on the entry (faults.0, its line), or on the overriding key's own line (the second of the entry)."""
    return (e.key, e.line) == ("faults.0", FAULTS_LINE) or (e.key.startswith("faults.0.") and e.line == FAULTS_LINE + 1)


def test_an_override_bad_for_one_profile_only_is_caught_at_load(tmp_path):
    p = experiment(tmp_path, "- profile: network-latency\n  params: {latency_ms: {quick: 50, full: 0}}\n")
    e = spec_error(load_checked, p)
    assert (e.line, e.key) == (FAULTS_LINE + 1, "faults.0.params.latency_ms") and "latency_ms" in str(e)


def test_a_per_profile_value_missing_for_a_profile(tmp_path):
    p = experiment(tmp_path, "- profile: pod-kill\n  schedule: {at: {quick: 30}}\n")
    e = spec_error(load_checked, p)
    assert (e.line, e.key) == (FAULTS_LINE, "faults.0")
    assert "faults.schedule.at" in str(e) and "'full'" in str(e)


@pytest.mark.parametrize("target,bad", [("mongo", "mongo"), ("platform->ferretdb", "ferretdb")])
def test_a_target_the_stack_does_not_have(tmp_path, target, bad):
    kind = "network-latency" if "->" in target else "pod-kill"
    p = experiment(tmp_path, f"- profile: {kind}\n  target: {target}\n")
    exp = load_checked(p)                       # valid on its own: no stack yet
    e = spec_error(experiment_faults, exp, "quick", load_stack("kafka"))
    assert (e.path, e.line, e.key) == (str(p), FAULTS_LINE + 1, "faults.0.target")   # the overriding line
    assert f"unknown service {bad!r}" in str(e) and "kafka, platform, postgres" in str(e)


def test_duplicate_fault_names_are_refused(tmp_path):
    p = experiment(tmp_path, "- pod-kill\n- profile: pod-kill\n  schedule: {at: 50}\n")
    e = spec_error(load_checked, p)
    assert e.path == str(p) and e.key == "faults.1" and e.line is not None
    assert "fault name 'platform-pod-kill' is also the name of faults.0" in str(e)
    p2 = experiment(tmp_path, "- pod-kill\n- profile: pod-kill\n  name: kill-2\n  schedule: {at: 50}\n", "ok.yaml")
    assert [f.name for f in experiment_faults(load_checked(p2), "quick")] == ["platform-pod-kill", "kill-2"]


# ------------------------------------------------------------------ dry run

def test_describe_lists_every_fault_with_its_windows(tmp_path):
    p = experiment(tmp_path, KILL + LATENCY + "- profile: pod-kill\n  name: late-kill\n  schedule: {at: 500}\n")
    exp, stack = load_checked(p), load_stack("kafka")
    faults = experiment_faults(exp, "quick", stack)
    text = describe(stack, exp, "quick", faults, "rid-1", [n for n, _ in run_checks(exp, "quick", faults)])
    assert text.startswith("DRY RUN kafka / chaos-test (quick): nothing is started")
    assert "fault kill [pod-kill, process] on platform at 30-35s, 70-75s" in text
    assert "SIGKILL the process group of platform" in text
    assert "fault pg-latency [network-latency, toxiproxy] on platform->postgres at 20-50s" in text
    assert "latency 50 ms +/- 20 ms downstream" in text
    assert "fault late-kill [pod-kill, process] on platform at never (after the load)" in text
    assert "checks: no_oom, faults_landed, no_unexpected_exit, load_valid" in text     # the plan's: implied ones too
    full = describe(stack, exp, "full", experiment_faults(exp, "full", stack), "rid-1", [])
    assert "3600-3605s, 5400-5405s" in full and "latency 500 ms" in full and "20-320s" in full


def test_describe_elides_many_windows(tmp_path):
    p = experiment(tmp_path, "- profile: pod-kill\n  schedule: {at: 0, duration: 1, repeat_every: 10}\n")
    exp, stack = load_checked(p), load_stack("kafka")
    text = describe(stack, exp, "quick", experiment_faults(exp, "quick", stack), "r", [])
    assert "0-1s, 10-11s, 20-21s, 30-31s ... (9 windows)" in text


INNER = '''
import subprocess
import monsoon.run.experiment as runner_module
from monsoon.stack.reaper import find_leftovers


class NoStack:
    def __init__(self, *a, **kw):
        raise AssertionError("a dry run started the stack")


def test_chaos(monsoon, monkeypatch):
    monkeypatch.setattr(runner_module, "Stack", NoStack)
    monkeypatch.setattr(subprocess.Popen, "__init__", NoStack.__init__)
    result = monsoon.run("kafka-registry", {exp!r})   # its hops go through Toxiproxy (chaos.toxiproxy)
    assert find_leftovers({run_id!r}) == []
    assert result.verdict == "skipped" and "DRY RUN" in result.dry_run
    result.assert_pass()
'''


def test_plugin_dry_run_prints_the_plan_and_skips_without_starting_anything(pytester, tmp_path):
    p = experiment(tmp_path, KILL + LATENCY)
    run_id = f"dry-{secrets.token_hex(4)}"
    runs = tmp_path / "runs"
    pytester.makepyfile(INNER.format(exp=str(p), run_id=run_id))
    res = pytester.runpytest("--monsoon-dry-run", f"--monsoon-run-id={run_id}", f"--monsoon-runs-dir={runs}", "-rs")
    res.assert_outcomes(skipped=1)
    out = res.stdout.str()
    assert "DRY RUN kafka-registry / chaos-test (quick)" in out
    assert "fault kill [pod-kill, process] on platform at 30-35s, 70-75s" in out
    assert "fault pg-latency [network-latency, toxiproxy] on platform->postgres at 20-50s" in out
    assert "dry run of kafka-registry/chaos-test: nothing was started" in out
    assert find_leftovers(run_id) == []
    assert not runs.exists()          # no run directory, no timeline, no report


def test_plugin_dry_run_still_fails_on_a_bad_fault(pytester, tmp_path):
    p = experiment(tmp_path, "- profile: pod-kill\n  target: mongo\n")
    pytester.makepyfile(f'''
        def test_chaos(monsoon):
            monsoon.run("kafka", {str(p)!r}).assert_pass()
    ''')
    res = pytester.runpytest("--monsoon-dry-run", f"--monsoon-runs-dir={tmp_path / 'runs'}")
    res.assert_outcomes(failed=1)
    assert f"{p}:{FAULTS_LINE + 1}: faults.0.target: " in res.stdout.str() and "unknown service 'mongo'" in res.stdout.str()


# ------------------------------------------------------- Kubernetes faults: the allow-list before the stack

KUBE_KILL = """\
- profile: pod-kill
  backend: {backend}
  target: {{namespace: {ns}, labelSelector: {{app: hono-adapter}}}}
"""


@pytest.mark.parametrize("backend", ["chaos-mesh", "litmus"])
def test_a_namespace_off_the_allow_list_fails_when_the_faults_are_resolved(tmp_path, monkeypatch, backend):
    p = experiment(tmp_path, KILL + KUBE_KILL.format(backend=backend, ns="iot"))
    exp = load_checked(p)                       # valid on its own: the allow-list is the environment's
    monkeypatch.setenv("MONSOON_KUBE_NAMESPACES", "staging, lab")
    e = spec_error(experiment_faults, exp, "quick", load_stack("kafka"))
    assert (e.path, e.line, e.key) == (str(p), FAULTS_LINE + KILL.count("\n"), "faults.1")
    assert "namespace 'iot' is not on the allow-list (lab, staging)" in str(e)
    assert "MONSOON_KUBE_NAMESPACES" in str(e)
    monkeypatch.delenv("MONSOON_KUBE_NAMESPACES")
    assert "empty: no namespace allowed" in str(spec_error(experiment_faults, exp, "quick"))
    monkeypatch.setenv("MONSOON_KUBE_NAMESPACES", "iot")
    kill, kube = experiment_faults(exp, "quick", load_stack("kafka"))
    assert kube.backend == backend and kube.target.kube.namespace == "iot"
    assert experiment_faults(exp, "quick", namespaces=["iot"])[1].backend == backend


def test_a_kubernetes_fault_its_backend_cannot_render_fails_before_the_stack(tmp_path, monkeypatch):
    monkeypatch.setenv("MONSOON_KUBE_NAMESPACES", "iot")
    p = experiment(tmp_path, "- profile: network-latency\n  backend: chaos-mesh\n  params: {stream: upstream}\n"
                             "  target: {namespace: iot, labelSelector: {app: x}}\n")
    e = spec_error(experiment_faults, load_checked(p), "quick")
    assert (e.path, e.line, e.key) == (str(p), FAULTS_LINE, "faults.0") and "select the client pods" in str(e)


def test_the_dry_run_of_a_namespace_off_the_allow_list_fails_instead_of_printing_refused(tmp_path, monkeypatch):
    from monsoon.session import run_one
    monkeypatch.setenv("MONSOON_KUBE_NAMESPACES", "staging")
    p = experiment(tmp_path, KUBE_KILL.format(backend="chaos-mesh", ns="iot"))
    e = spec_error(lambda: run_one(load_stack("kafka"), load_checked(p), "quick", tmp_path / "out",
                                          run_id="r-dry", dry_run=True))
    assert e.key == "faults.0" and "not on the allow-list" in str(e)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------- ExperimentResult.check: per-phase latency_objective names

def test_result_check_finds_a_check_by_its_base_name(tmp_path):
    from monsoon.checks.base import Verdict
    from monsoon.report.result import ExperimentResult
    r = ExperimentResult("s", "e", "quick", tmp_path, checks=[
        Verdict("no_oom", "pass"),
        Verdict("latency_objective[steady]", "pass", {"p99_ms": 40.0}, "p99 40 ms"),
        Verdict("latency_objective[burst]", "fail", {"p99_ms": 900.0}, "p99 900 ms")])
    assert r.check("latency_objective[burst]").verdict == "fail"          # an exact name wins
    both = r.check("latency_objective")                                    # every phase of it, composed
    assert both.verdict == "fail" and both.name == "latency_objective"
    assert "latency_objective[steady]" in both.message and "latency_objective[burst]" in both.message
    one = ExperimentResult("s", "e", "quick", tmp_path, checks=[Verdict("latency_objective[all]", "pass", {"x": 1})])
    assert one.check("latency_objective") is one.checks[0]                 # a single one is itself
    with pytest.raises(KeyError, match="no check 'latency' .*has: latency_objective\\[all\\]"):
        one.check("latency")


def test_headline_figures_lift_the_new_checks_numbers_and_the_checklist_shows_them():
    from pathlib import Path
    from monsoon.checks.base import Verdict
    from monsoon.report.checklist import KEY_FIGURES
    from monsoon.report.result import ExperimentResult
    r = ExperimentResult("kafka", "soak", "quick", Path("."), checks=[
        Verdict("no_acked_loss", "pass", {"acked": 10, "acked_lost": 0, "duplicates": 0}, ""),
        Verdict("error_budget", "fail", {"budget_consumed_pct": 140.0, "worst_burn_rate": 9.0}, ""),
        Verdict("lag_recovers_within", "pass", {"peak_lag": 5.0, "predicted_drain_s": 12.0,
                                                "observed_drain_s": 14.0}, "")])
    h = r.headline()
    assert h["budget_consumed_pct"] == 140.0 and h["predicted_drain_s"] == 12.0 and h["observed_drain_s"] == 14.0
    assert "budget_consumed_pct" in KEY_FIGURES["error_budget"] and "heap_slope_mb_per_h" in KEY_FIGURES["no_memory_leak"]
