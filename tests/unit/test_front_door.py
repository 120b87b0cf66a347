"""The front door as a new user types it: `pytest -m soak|burst|chaos` at the repository root, one-line spec
errors, the figures in the JUnit XML."""
from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from monsoon.spec.experiment import experiments_marked

REPO = Path(__file__).resolve().parents[2]
PYTEST = str(Path(sys.executable).parent / "pytest")


def at_root(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTEST, "-p", "no:cacheprovider", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def test_pytest_m_soak_at_the_root_collects_the_soak_scenario():
    r = at_root("-m", "soak", "--monsoon-dry-run", "-rs")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "dry run of kafka-registry/soak: nothing was started" in r.stdout
    assert "1 skipped" in r.stdout and "passed" not in r.stdout


def test_pytest_m_burst_and_chaos_select_their_scenarios_and_only_them():
    burst = at_root("-m", "burst", "--co", "-q").stdout
    assert "pytest/test_burst_floods.py::test_burst_flood[inmemory-burst-x10]" in burst
    assert "test_soak" not in burst and "tests/" not in burst   # monsoon's own tests are `make test`
    chaos = at_root("-m", "chaos", "--co", "-q").stdout
    assert "pytest/test_soak.py::test_soak_with_periodic_faults" in chaos and "test_burst_flood" not in chaos


def test_a_bare_pytest_does_not_start_a_soak():
    r = at_root("--co", "-q")
    assert "test_burst_flood" in r.stdout and "test_soak" not in r.stdout
    assert "soak scenario(s) deselected by a bare `pytest`: run them with `pytest -m soak`" in r.stdout
    named = at_root("--co", "-q", "pytest/test_soak.py")   # naming the file asks for it
    assert "pytest/test_soak.py::test_soak_with_periodic_faults" in named.stdout


def test_a_broken_experiment_is_still_listed_so_only_its_own_scenarios_fail(tmp_path):
    (tmp_path / "burst-good.yaml").write_text("name: good\nmarks: [burst]\n")
    (tmp_path / "burst-other.yaml").write_text("name: other\nmarks: [soak]\n")
    (tmp_path / "burst-broken.yaml").write_text("name: broken\nmarks: [burst\n")     # YAML syntax error
    (tmp_path / "burst-latin1.yaml").write_bytes(b"name: caf\xe9\nmarks: [burst]\n")  # not UTF-8
    assert experiments_marked("burst", "burst-*.yaml", tmp_path) == ["burst-broken", "burst-good", "burst-latin1"]


def test_a_spec_error_in_a_scenario_is_one_line_and_the_others_still_run(pytester, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nload:\n  devices: 1\n  base_rate: 10\n  shape: {kind: steady}\n"
                   "profiles: {quick: {warmup: 5}}\nchecks: [no_oom]\nfaults:\n  - profile: pod-kill\n    target: nope\n")
    pytester.makepyfile(f"""
        def test_bad(monsoon):
            monsoon.run("inmemory", {str(bad)!r}).assert_pass()
        def test_good(monsoon):
            monsoon.run("inmemory", "burst-x3").assert_pass()
    """)
    res = pytester.runpytest_subprocess("--monsoon-dry-run", f"--monsoon-runs-dir={tmp_path / 'runs'}")
    res.assert_outcomes(failed=1, skipped=1)
    out = res.stdout.str()
    line = next(ln for ln in out.splitlines() if f"{bad}:" in ln and "faults.0" in ln)
    assert "target" in line or "nope" in line
    assert "Traceback" not in out and "raise " not in out and "SpecError" not in out


def test_every_results_headline_figures_go_to_the_junit_xml(pytester, tmp_path):
    pytester.makeconftest("""
        import monsoon.session
        from monsoon.checks.base import Verdict
        from monsoon.report.result import ExperimentResult
        def fake_run_one(stack_spec, exp, profile, out_dir, **kw):   # no stack is started in a unit test
            return ExperimentResult(stack_spec.name, exp.name, profile, out_dir,
                                    checks=[Verdict("no_acked_loss", "fail", {"acked": 1000, "acked_lost": 7})])
        monsoon.session.run_one = fake_run_one
    """)
    pytester.makepyfile("""
        def test_x(monsoon):
            monsoon.run("inmemory", "burst-x10").assert_pass()
    """)
    xml = tmp_path / "junit.xml"
    res = pytester.runpytest_subprocess(f"--junitxml={xml}", f"--monsoon-runs-dir={tmp_path / 'runs'}")
    res.assert_outcomes(failed=1)
    props = {p.get("name"): p.get("value") for p in ET.parse(xml).iter("property")}
    assert props["monsoon.inmemory.burst-x10.verdict"] == "fail"
    assert props["monsoon.inmemory.burst-x10.acked_lost"] == "7" and props["monsoon.inmemory.burst-x10.acked"] == "1000"
    assert "acked_lost=7" in res.stdout.str() and "Traceback" not in res.stdout.str()
