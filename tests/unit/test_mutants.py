"""Bad input, as users write it: every seeded mutant of the shipped YAML (tests/mutants.py) gets one line naming
file, line and key, with no traceback, from `monsoon validate` and from the pytest dry run alike; the mutants
only a live stack can detect pass validation here (tests/integration/test_mutants_live.py runs them)."""
from __future__ import annotations

import re
from collections import Counter

import pytest

from monsoon import cli
from tests.mutants import generate

MUTANTS = generate()
STATIC = [m for m in MUTANTS if not m.live]
LINE = re.compile(r"^(?P<file>[^\s:][^:]*):(?P<line>\d+): (?P<key>[^:\s][^:]*?): (?P<msg>\S.*)$")


def test_the_generator_covers_every_category_and_kind():
    assert len(MUTANTS) >= 40
    cats = Counter(m.category for m in MUTANTS)
    assert set(cats) == {"deleted key", "wrong type", "zero/negative/absurd value", "unknown kind", "misspelt key",
                         "misspelt port name", "YAML syntax error", "empty or list-shaped file", "duplicate key",
                         "not UTF-8", "not SQL"}
    assert {m.kind for m in MUTANTS} == {"stack", "experiment", "fault profile"}
    assert [m.id for m in generate()] == [m.id for m in MUTANTS]   # seeded: the same mutants every time


@pytest.mark.parametrize("mutant", STATIC, ids=[m.id for m in STATIC])
def test_monsoon_validate_says_one_line_with_file_line_and_key(mutant, tmp_path, capsys):
    path = mutant.write(tmp_path)
    rc = cli.main(["validate", str(path)])
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert rc == 1 and len(lines) == 1, out + err
    m = LINE.match(lines[0])
    assert m, lines[0]
    assert m["file"].endswith(f"{mutant.id}/{mutant.filename}") and int(m["line"]) >= 1
    assert "Traceback" not in out + err


@pytest.mark.parametrize("mutant", [m for m in MUTANTS if m.live], ids=lambda m: m.id)
def test_a_mutant_only_a_live_stack_can_detect_passes_validation(mutant, tmp_path, capsys):
    assert cli.main(["validate", str(mutant.write(tmp_path))]) == 0


EXPERIMENT_WITH_FAULT = """name: with-fault
load: {{devices: 5, base_rate: 50, shape: {{kind: steady}}}}
profiles: {{quick: {{warmup: 60}}}}
checks: [no_acked_loss]
faults: [{{profile: "{path}"}}]
"""


def test_the_pytest_dry_run_says_the_same_one_line_for_every_mutant(pytester, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "4000")   # the short summary keeps each whole message
    cases = {}
    for m in STATIC:
        path = m.write(tmp_path / "mutants")
        if m.kind == "stack":
            cases[m.id] = (str(path), "burst-x3")
        elif m.kind == "experiment":
            cases[m.id] = ("inmemory", str(path))
        else:   # a fault profile, through an experiment that uses it on a stack with Toxiproxy
            exp = tmp_path / "mutants" / m.id / "with-fault.yaml"
            exp.write_text(EXPERIMENT_WITH_FAULT.format(path=path))
            cases[m.id] = ("kafka-registry", str(exp))
    pytester.makepyfile(f"""
        import pytest
        CASES = {cases!r}
        @pytest.mark.parametrize("mutant", sorted(CASES))
        def test_m(monsoon, mutant):
            stack, experiment = CASES[mutant]
            monsoon.run(stack, experiment).assert_pass()
    """)
    res = pytester.runpytest_subprocess("-rf", "--monsoon-dry-run", f"--monsoon-runs-dir={tmp_path / 'runs'}",
                                        "--monsoon-run-id=mutants")
    res.assert_outcomes(failed=len(STATIC))
    out = res.stdout.str()
    assert "Traceback" not in out and "SpecError(" not in out
    failed = {ln.split("[", 1)[1].split("]", 1)[0]: ln.split(" - ", 1)[1].removeprefix("Failed: ") for ln in out.splitlines()
              if ln.startswith("FAILED test_the_pytest_dry_run")}
    assert set(failed) == set(cases)
    for mid, msg in failed.items():
        m = LINE.match(msg)
        assert m and f"{mid}/" in m["file"] and int(m["line"]) >= 1, f"{mid}: {msg}"
    assert not (tmp_path / "runs" / "mutants").exists() or not any((tmp_path / "runs" / "mutants").iterdir())
