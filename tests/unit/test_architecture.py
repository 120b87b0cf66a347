"""The layout is the architecture: import contracts hold, a cycle put back fails naming its modules, no
internal import hides inside a function, and a run analysed before the restructure analyses the same after."""
from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from monsoon.analysis import analyze

REPO = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).parent / "lint-imports"
PRELAYOUT = REPO / "tests" / "data" / "prelayout-run"
OPTIONAL = {"kubernetes"}   # extra "kube": imported only when a cluster is configured
# the pytest11 entry point loads the plugin in every pytest process, and the console script loads the CLI for every
# command (`monsoon --help` included): both import monsoon's own modules at first use
DEFERRED = {"monsoon/plugin.py", "monsoon/cli.py"}
# `monsoon --help` and `monsoon validate` load no numpy, pyarrow or HdrHistogram (tests/unit/test_cli_imports.py): the
# modules on their import path import those (and the CLI its output libraries) inside the functions that read a run
HEAVY = {"numpy", "pyarrow", "hdrh", "rich", "yaml", "monsoon.timeline.hdrlog"}
LAZY = {"monsoon/cli.py", "monsoon/checks/accounting.py", "monsoon/checks/base.py", "monsoon/checks/faults.py",
        "monsoon/checks/legs.py", "monsoon/checks/slo.py", "monsoon/timeline/columnar.py"}


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache", "--config", str(root / "pyproject.toml")], cwd=root,
                          env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                          timeout=300)


def copy_package(tmp: Path) -> Path:
    shutil.copytree(REPO / "monsoon", tmp / "monsoon", ignore=shutil.ignore_patterns("loadgen", "__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp / "pyproject.toml")
    return tmp


def test_the_import_contracts_hold():
    r = lint(REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 broken" in r.stdout


@pytest.mark.parametrize("module, line, named", [
    # a check module importing the check base's importer: a cycle inside checks/
    ("checks/base.py", "from monsoon.checks.lag import settled_at", ".lag -> .base"),
    # the specs importing the runner: a layer broken and a cycle between packages
    ("spec/experiment.py", "from monsoon.run.validate import check_experiment", "monsoon.spec.experiment -> monsoon.run.validate"),
])
def test_a_cycle_put_back_fails_naming_the_modules(tmp_path, module, line, named):
    root = copy_package(tmp_path)
    with open(root / "monsoon" / module, "a") as f:
        f.write(f"\n{line}  # a cycle, on purpose\n")
    r = lint(root)
    assert r.returncode != 0, r.stdout
    assert named in r.stdout, r.stdout


def function_level_imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    out = []
    for n in ast.walk(tree):
        if isinstance(n, (ast.Import, ast.ImportFrom)) and id(n) not in top:
            mod = (n.module or "") if isinstance(n, ast.ImportFrom) else n.names[0].name
            out.append((n.lineno, "." * getattr(n, "level", 0) + mod))
    return out


def test_a_function_level_import_is_only_an_optional_dependency_with_a_comment_saying_which():
    bad = []
    for p in sorted((REPO / "monsoon").rglob("*.py")):
        lines = p.read_text().splitlines()
        for lineno, mod in function_level_imports(p):
            said = "optional dependency" in lines[lineno - 2] or "optional dependency" in lines[lineno - 1]
            if str(p.relative_to(REPO)) in DEFERRED and mod.split(".")[0] == "monsoon":
                continue
            if str(p.relative_to(REPO)) in LAZY and (mod in HEAVY or mod.split(".")[0] in HEAVY):
                continue
            if mod.split(".")[0] not in OPTIONAL or not said:
                bad.append(f"{p.relative_to(REPO)}:{lineno}: {mod}")
    assert not bad, "function-level imports:\n" + "\n".join(bad)


def test_the_layout_section_of_the_architecture_page_matches_the_tree():
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text.split("## Layout", 1)[1].split("\n## ", 1)[0]
    listed = {ln.split("`")[1].rstrip("/") for ln in section.splitlines() if ln.startswith("- `monsoon/")}
    packages = {f"monsoon/{p.parent.relative_to(REPO / 'monsoon')}" for p in (REPO / "monsoon").glob("*/__init__.py")}
    modules = {f"monsoon/{p.name}" for p in (REPO / "monsoon").glob("*.py") if p.name != "__init__.py"}
    assert listed == packages | modules


def comparable(summary: dict) -> dict:
    s = json.loads(json.dumps(summary, sort_keys=True))
    for r in s["results"]:
        r.pop("dir")
    return s


def test_a_run_made_before_the_restructure_analyses_to_identical_verdicts_and_figures(tmp_path):
    with tarfile.open(PRELAYOUT / "run.tar.xz") as t:
        t.extractall(tmp_path, filter="data")
    expected = comparable(json.loads((PRELAYOUT / "expected.json").read_text()))
    got = comparable(analyze(tmp_path / "run"))
    assert [(r["stack"], r["experiment"], r["verdict"]) for r in got["results"]] == \
        [(r["stack"], r["experiment"], r["verdict"]) for r in expected["results"]]
    for g, e in zip(got["results"], expected["results"]):
        for gc, ec in zip(g["checks"], e["checks"]):
            assert (gc["name"], gc["verdict"], gc["figures"]) == (ec["name"], ec["verdict"], ec["figures"])
    assert got == expected   # messages, headline figures and the run id too
