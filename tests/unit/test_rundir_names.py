"""``monsoon.rundir`` is the one owner of the names in a run directory: no other module of monsoon spells one as a
string literal (it imports the constant), and its dataset names are the Parquet directories runs write."""
from __future__ import annotations

import ast
from pathlib import Path

from monsoon import rundir
from monsoon.paths import REPO
from monsoon.timeline.columnar import parts_dir
from tests.unit.helpers import code_strings

NAMES = {rundir.SUMMARY_FILE, rundir.CHECKLIST_FILE, rundir.REPORT_FILE, rundir.TIMELINE_FILE, rundir.RESULT_FILE,
         rundir.SWEEP_FILE, rundir.SWEEP_PLOT, rundir.LATENCY_FILE, *rundir.DATASETS,
         rundir.STORED_FINAL_TMP, *(rundir.legacy_csv(n).name for n in rundir.DATASETS),
         rundir.CALIBRATION_RECORD, rundir.GC_LOG}
# the Kubernetes load Job's pod reads the timeline of its own work directory (monsoon.load, not a run directory's
# reader); its name is the same by choice
ELSEWHERE = {"monsoon/load/kube_job.py": {rundir.TIMELINE_FILE}}


def literals(path: Path) -> set[str]:
    """String constants of a module that are whole run-directory names (docstrings are not code)."""
    return code_strings(path) & NAMES


def test_no_module_but_rundir_spells_a_run_directory_name():
    found = {}
    for p in sorted((REPO / "monsoon").rglob("*.py")):
        rel = str(p.relative_to(REPO))
        if rel == "monsoon/rundir.py" or "/_shipped/" in rel:
            continue
        names = literals(p) - ELSEWHERE.get(rel, set())
        if names:
            found[rel] = sorted(names)
    assert found == {}, f"import these from monsoon.rundir: {found}"


def test_a_literal_name_is_found(tmp_path):
    p = tmp_path / "m.py"
    p.write_text('"""Writes report.html."""\nOUT = "report.html"\n')
    assert literals(p) == {"report.html"}


def test_each_dataset_is_the_parquet_directory_a_run_writes():
    assert rundir.DATASETS == ("acked.parquet", "stored.parquet", "stored-at-drain.parquet", "sent.parquet")
    assert all(rundir.dataset_dir(n).name == n for n in rundir.DATASETS)
    fixture = REPO / "tests" / "fixtures" / "inmemory-docker-x10-hung-second-life"
    assert all((fixture / n).is_dir() for n in rundir.DATASETS)          # the names on disk, as written


def test_an_older_runs_csv_and_its_dataset_name_each_other():
    """A run made before the Parquet change holds ``acked.csv``: the legacy name of ``acked.parquet``, and back."""
    assert [rundir.legacy_csv(n).name for n in rundir.DATASETS] == \
        ["acked.csv", "stored.csv", "stored-at-drain.csv", "sent.csv"]
    assert parts_dir(Path("run") / "acked.csv") == Path("run") / rundir.ACKED_DATA
    assert rundir.legacy_csv(Path("run") / rundir.ACKED_DATA) == Path("run") / "acked.csv"


def _builds_an_experiment_dir(node: ast.AST) -> bool:
    """An f-string ``f"{...}--{...}"``: an experiment directory's name spelled out."""
    if not isinstance(node, ast.JoinedStr):
        return False
    parts = node.values
    return any(isinstance(a, ast.FormattedValue) and isinstance(b, ast.Constant) and isinstance(b.value, str)
               and b.value == rundir.EXPERIMENT_DIR_SEP
               and isinstance(c, ast.FormattedValue) for a, b, c in zip(parts, parts[1:], parts[2:]))


EXPERIMENT_DIR_ELSEWHERE: set[str] = set()     # none: every module goes through rundir.experiment_dir_name


def test_no_module_but_rundir_builds_an_experiment_directory_name():
    found = []
    for p in sorted((REPO / "monsoon").rglob("*.py")):
        rel = str(p.relative_to(REPO))
        if rel == "monsoon/rundir.py" or "/_shipped/" in rel or rel in EXPERIMENT_DIR_ELSEWHERE:
            continue
        found += [f"{rel}:{n.lineno}" for n in ast.walk(ast.parse(p.read_text())) if _builds_an_experiment_dir(n)]
    assert found == [], f"use monsoon.rundir.experiment_dir_name: {found}"


def test_an_experiment_directory_name_and_its_repeats():
    assert rundir.experiment_dir_name("tb", "burst-x10") == "tb--burst-x10"
    assert rundir.experiment_dir_name("tb", "burst-x10", 2) == "tb--burst-x10-2"
    tree = ast.parse('out = run_dir / f"{stack}--{exp}"\nok = f"{a}-{b}"')
    assert sorted(_builds_an_experiment_dir(n) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr)) == [False, True]


def test_no_module_but_rundir_builds_a_calibration_directory_name():
    """``calibrate-<stack>`` has one owner too: an f-string starting with the prefix is spelled elsewhere."""
    found = []
    for p in sorted((REPO / "monsoon").rglob("*.py")):
        rel = str(p.relative_to(REPO))
        if rel == "monsoon/rundir.py" or "/_shipped/" in rel:
            continue
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.JoinedStr) and n.values and isinstance(n.values[0], ast.Constant) \
                    and str(n.values[0].value).startswith(rundir.CALIBRATE_DIR_PREFIX):
                found.append(f"{rel}:{n.lineno}")
    assert found == [], f"use monsoon.rundir.calibrate_dir_name: {found}"
    assert rundir.calibrate_dir_name("kafka") == "calibrate-kafka"
    assert rundir.calibrate_dir_name("kafka", 2) == "calibrate-kafka-2"
