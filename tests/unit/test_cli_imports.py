"""``monsoon --help`` and ``monsoon validate`` stay quick: monsoon.cli imports the analysis, the report, the history,
matplotlib, pyarrow, ... only inside the commands that use them, and the checks import numpy and pyarrow only in
the functions that read a run. Each case runs in a fresh interpreter (this one has them all loaded already) and
fails when a heavy module is imported at the top of monsoon.cli, or of a module ``validate`` imports, again."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from monsoon.cli import main as cli_main
from monsoon.paths import REPO

#: What neither ``monsoon --help`` nor ``monsoon validate`` has any use for.
NEVER = ("matplotlib", "pandas", "psycopg", "confluent_kafka", "kubernetes", "aiohttp", "aiocoap", "paho", "rich",
         "monsoon.analysis", "monsoon.report", "monsoon.history", "monsoon.observe", "monsoon.session",
         "monsoon.run.harness", "monsoon.run.calibrate", "monsoon.run.sweep", "monsoon.selftest")
#: Nor does ``monsoon validate``: the check registry tells a check's name and parameters without a run to read
#: (numpy and pyarrow, ~0.5 s of CPU, are imported by the functions that read one).
NOT_FOR_VALIDATE = NEVER + ("pyarrow", "numpy", "hdrh")
#: What ``monsoon validate`` needs (the checks judge whether an experiment's checks fit its stack) but
#: ``monsoon --help`` does not.
NOT_FOR_HELP = NOT_FOR_VALIDATE + ("pydantic", "monsoon.checks", "monsoon.timeline", "monsoon.spec", "monsoon.run",
                                   "monsoon.faults", "monsoon.stack")

_CHILD = r"""
import contextlib, io, json, sys
from monsoon.cli import main
out, err = io.StringIO(), io.StringIO()
with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
    try:
        rc = main(json.loads(sys.argv[1]))
    except SystemExit as e:
        rc = e.code
print(json.dumps({"rc": rc, "out": out.getvalue(), "err": err.getvalue(), "modules": sorted(sys.modules)}))
"""


def run_fresh(argv: list[str]) -> dict:
    """``monsoon ARGV`` in a fresh interpreter started in monsoon's checkout: its exit code, output and the
    modules it had imported at the end."""
    p = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(argv)], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def loaded(modules: list[str], names: tuple[str, ...]) -> list[str]:
    """Those of ``names`` that are among ``modules`` (a package counts when any module of it is)."""
    return [n for n in names if any(m == n or m.startswith(n + ".") for m in modules)]


@pytest.mark.parametrize("argv", [["--help"], ["validate", "--help"]])
def test_help_imports_nothing_heavy(argv):
    r = run_fresh(argv)
    assert r["rc"] == 0 and "usage: monsoon" in r["out"]
    assert loaded(r["modules"], NOT_FOR_HELP) == []


@pytest.mark.parametrize("argv", [["validate", "experiments/burst-x10.yaml"],
                                  ["validate", "--stack", "kafka", "--experiment", "burst-x10"]])
def test_validate_imports_no_analysis_nor_plotting_nor_arrays(argv):
    r = run_fresh(argv)
    assert r["rc"] == 0, r["err"]
    assert "all valid" in r["err"]
    assert "monsoon.checks.registry" in r["modules"]      # the checks were consulted, without numpy nor pyarrow
    assert loaded(r["modules"], NOT_FOR_VALIDATE) == []


def test_a_deferred_subcommand_still_has_its_arguments(capsys):
    """calibrate's arguments (defaults from monsoon.run.calibrate) are added when it is used; --project after them."""
    with pytest.raises(SystemExit) as e:
        cli_main(["calibrate", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    from monsoon.run.calibrate import Params
    assert "--start-rate START_RATE" in out and f"(default {Params().start_rate:g})" in out
    assert out.index("--no-save") < out.index("--project")
    with pytest.raises(SystemExit) as e:
        cli_main(["payload", "--profile", "template"])   # choices from monsoon.spec.payload: template is not one
    assert e.value.code == 2
    assert "invalid choice: 'template'" in capsys.readouterr().err
