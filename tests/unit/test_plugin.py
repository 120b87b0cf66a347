"""The pytest plugin's surface: markers, options, fixture, bad input (no live services)."""


def test_markers_are_registered_with_usage_lines(pytester):
    res = pytester.runpytest("--markers")
    out = res.stdout.str()
    for m in ("burst", "soak", "chaos"):
        assert f"@pytest.mark.{m}: " in out and f"select with -m {m}" in out


def test_markers_pass_strict_mode(pytester):
    pytester.makepyfile("""
        import pytest
        @pytest.mark.burst
        @pytest.mark.soak
        @pytest.mark.chaos
        def test_x(monsoon):
            assert monsoon.profile == "quick"
    """)
    pytester.runpytest("--strict-markers").assert_outcomes(passed=1)


def test_profile_option_reaches_the_fixture(pytester):
    pytester.makepyfile("""
        def test_x(monsoon):
            assert monsoon.profile == "full"
    """)
    pytester.runpytest("--monsoon-profile=full").assert_outcomes(passed=1)


def test_unknown_profile_is_a_usage_error(pytester):
    res = pytester.runpytest("--monsoon-profile=weekly")
    assert res.ret != 0
    assert "invalid choice: 'weekly'" in res.stderr.str()


def test_a_bad_experiment_fails_the_test_with_file_line_and_key_before_starting_anything(pytester, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nload:\n  devices: 0\n  base_rate: 10\n  shape: {kind: steady}\n"
                   "profiles: {quick: {warmup: 5}}\nchecks: [no_oom]\n")
    pytester.makepyfile(f"""
        def test_x(monsoon):
            monsoon.run("inmemory", {str(bad)!r})
    """)
    res = pytester.runpytest(f"--monsoon-runs-dir={tmp_path / 'runs'}")
    res.assert_outcomes(failed=1)
    assert f"{bad}:3: load.devices: Input should be greater than 0" in res.stdout.str()
    assert not (tmp_path / "runs").exists()  # nothing was started or written


def test_missing_profile_in_an_experiment_is_reported(pytester, tmp_path):
    exp = tmp_path / "e.yaml"
    exp.write_text("name: e\nload:\n  devices: 1\n  base_rate: 10\n  shape: {kind: steady}\n"
                   "profiles: {quick: {warmup: 5}}\nchecks: [no_oom]\n")
    pytester.makepyfile(f"""
        def test_x(monsoon):
            monsoon.run("inmemory", {str(exp)!r})
    """)
    res = pytester.runpytest("--monsoon-profile=full", f"--monsoon-runs-dir={tmp_path / 'runs'}")
    res.assert_outcomes(failed=1)
    assert "has no 'full' profile (has: quick)" in res.stdout.str()


# ------------------------------------------------------------------ monsoon's own hooks (monsoon/hookspec.py)

CUSTOM_EXP = ("name: e\nload:\n  devices: 1\n  base_rate: 10\n  shape: {kind: steady}\n"
              "profiles: {quick: {warmup: 5}}\nchecks:\n  - stored_within: {seconds: 3}\n")


def test_a_check_added_through_the_hook_is_validated_like_a_built_in_one(pytester, tmp_path):
    exp = tmp_path / "e.yaml"
    exp.write_text(CUSTOM_EXP)
    pytester.makeconftest("""
        from monsoon.checks.base import PASS, Verdict
        def stored_within(run, seconds):
            return Verdict("stored_within", PASS, {"seconds": seconds})
        def pytest_monsoon_add_checks(register):
            register("stored_within", stored_within)
    """)
    pytester.makepyfile(f"""
        from monsoon.checks.registry import CHECKS
        def test_x(monsoon):
            assert "stored_within" in monsoon.checks and "stored_within" not in CHECKS   # the session's alone
            monsoon.run("inmemory", {str(exp)!r}).assert_pass()   # a dry run: validated, then skipped
    """)
    # in-process: the check lives in that session's registry, not in this process's
    res = pytester.runpytest("-rs", "--monsoon-dry-run", f"--monsoon-runs-dir={tmp_path / 'runs'}")
    res.assert_outcomes(skipped=1)
    assert "dry run of inmemory/e" in res.stdout.str()


def test_without_the_hook_the_same_experiment_names_the_unknown_check(pytester, tmp_path):
    exp = tmp_path / "e.yaml"
    exp.write_text(CUSTOM_EXP)
    pytester.makepyfile(f"""
        def test_x(monsoon):
            monsoon.run("inmemory", {str(exp)!r})
    """)
    res = pytester.runpytest("--monsoon-dry-run", f"--monsoon-runs-dir={tmp_path / 'runs'}")
    res.assert_outcomes(failed=1)
    assert f"{exp}:8: checks.0: unknown check 'stored_within'" in res.stdout.str()


def test_each_result_reaches_the_result_hook_before_the_report(pytester, tmp_path):
    pytester.makeconftest("""
        import monsoon.session
        from monsoon.report.result import ExperimentResult
        seen = []
        def pytest_monsoon_result(result, session):
            seen.append((result.stack, result.experiment, (session.run_dir / "summary.json").exists()))
        def fake_run_one(stack_spec, exp, profile, out_dir, **kw):   # no stack is started in a unit test
            return ExperimentResult(stack_spec.name, exp.name, profile, out_dir)
        monsoon.session.run_one = fake_run_one
    """)
    pytester.makepyfile("""
        from conftest import seen
        def test_x(monsoon):
            monsoon.run("inmemory", "burst-x3")
            assert seen == [("inmemory", "burst-x3", False)]   # seen before summary.json was written
    """)
    pytester.runpytest_subprocess(f"--monsoon-runs-dir={tmp_path / 'runs'}").assert_outcomes(passed=1)
