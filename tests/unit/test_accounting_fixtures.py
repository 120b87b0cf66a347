"""The loss accounting of every kept run, field by field: each run directory the repository keeps with acked
data (tests/fixtures/*, the two experiments of tests/data/prelayout-run/run.tar.xz) is accounted for again and
every field of ``account`` (and of ``account(..., keep_lost=True)``'s lost keys), with the verdict, figures and
message of ``no_acked_loss``, ``no_duplicates`` and ``no_unexpected``, must be what accounting_fixtures.json
recorded.  The figures were recorded from the one-function ``account`` before it was split into read, join,
tally and explain; refresh them only when the accounting or a loss check changes on purpose:

    .venv/bin/python -m tests.unit.test_accounting_fixtures      # rewrites accounting_fixtures.json
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

import pytest

from monsoon.checks.accounting import account
from monsoon.checks.base import RunData
from monsoon.checks.loss import no_acked_loss, no_duplicates, no_unexpected

REPO = Path(__file__).resolve().parents[2]
EXPECTED = Path(__file__).with_name("accounting_fixtures.json")
FIXTURES = REPO / "tests" / "fixtures"
PRELAYOUT = REPO / "tests" / "data" / "prelayout-run" / "run.tar.xz"


def _has_acked(d: Path) -> bool:
    return d.is_dir() and any(d.glob("acked.*"))


def kept_runs() -> list[str]:
    """Every kept run directory with acked data, by name: ``fixtures/<dir>`` and ``prelayout-run/<dir>``."""
    names = [f"fixtures/{d.name}" for d in sorted(FIXTURES.iterdir()) if _has_acked(d)] if FIXTURES.is_dir() else []
    if PRELAYOUT.exists():
        with tarfile.open(PRELAYOUT) as t:
            tops = {Path(m.name).parts[1] for m in t.getmembers()
                    if len(Path(m.name).parts) == 3 and Path(m.name).name.startswith("acked.")}
        names += [f"prelayout-run/{n}" for n in sorted(tops)]
    return names


def materialise(name: str, into: Path) -> Path:
    """A copy of the kept run ``name`` under ``into`` (the checks read it; nothing is written to the repo)."""
    kind, dir = name.split("/", 1)
    if kind == "fixtures":
        out = into / "fixtures" / dir
        if not out.exists():
            shutil.copytree(FIXTURES / dir, out)
        return out
    root = into / "prelayout"
    if not root.exists():
        with tarfile.open(PRELAYOUT) as t:
            t.extractall(root, filter="data")
    return root / "run" / dir


def outcome(dir: Path) -> dict:
    """What the accounting says of a run: every field of ``account``, the lost keys of ``keep_lost`` (their
    count, first five and a digest), and each loss check's verdict, figures and message."""
    acc = dataclasses.asdict(account(dir))
    lost = account(dir, keep_lost=True).lost_keys or []
    digest = hashlib.sha256("".join(f"{d}#{s}\n" for d, s in lost).encode()).hexdigest()
    run = RunData(dir)
    verdicts = {}
    for check in (no_acked_loss, no_duplicates, no_unexpected):
        v = check(run)
        verdicts[v.name] = {"verdict": v.verdict, "figures": v.figures, "message": v.message}
    # through JSON, so tuples compare as the lists the file holds
    return json.loads(json.dumps({"account": acc, "lost_keys": {"count": len(lost), "first": lost[:5],
                                                                "sha256": digest}, "verdicts": verdicts}))


@pytest.fixture(scope="module")
def expected() -> dict:
    return json.loads(EXPECTED.read_text())


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kept-runs")


def test_every_kept_run_with_acked_data_is_recorded(expected):
    missing = sorted(set(kept_runs()) - set(expected))
    assert not missing, (f"kept runs without recorded accounting: {missing}; record them with "
                         "`.venv/bin/python -m tests.unit.test_accounting_fixtures`")


@pytest.mark.parametrize("name", kept_runs())
def test_the_accounting_of_a_kept_run_is_what_was_recorded_field_by_field(name, expected, scratch):
    if name not in expected:
        pytest.skip(f"{name} is not recorded (the test above fails for it)")
    got, want = outcome(materialise(name, scratch)), expected[name]
    for field in want["account"]:
        assert got["account"][field] == want["account"][field], f"{name}: account().{field}"
    assert set(got["account"]) == set(want["account"]), f"{name}: the fields of Accounting changed"
    for field in ("count", "first", "sha256"):
        assert got["lost_keys"][field] == want["lost_keys"][field], f"{name}: lost_keys {field}"
    for check, v in want["verdicts"].items():
        for field in ("verdict", "figures", "message"):
            assert got["verdicts"][check][field] == v[field], f"{name}: {check} {field}"


def record() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        return {name: outcome(materialise(name, Path(tmp))) for name in kept_runs()}


if __name__ == "__main__":
    EXPECTED.write_text(json.dumps(record(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {EXPECTED} ({', '.join(json.loads(EXPECTED.read_text()))})", file=sys.stderr)
