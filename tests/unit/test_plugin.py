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
