"""One project resolution for both doors (issue 39): the ``monsoon`` command finds the project, ``monsoon_specs``,
the runs folder and the specs by name as the pytest plugin does, through the same settings; ``monsoon validate``
says what it read and refuses when it read nothing; a missing name says where it looked; shadowing is said once."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from monsoon import settings
from monsoon.cli import main as cli_main

REPO = Path(__file__).resolve().parents[2]


def user_repo(root: Path, ini: str = 'monsoon_specs = ["resilience"]\nmonsoon_runs_dir = "out/runs"') -> Path:
    """A repository monsoon init did not make: pyproject.toml at the root, a package and its tests, specs under
    resilience/, one of them named like a shipped stack."""
    (root / "acme").mkdir(parents=True)
    (root / "acme" / "__init__.py").write_text("")
    (root / "tests").mkdir()
    (root / "tests" / "test_acme.py").write_text("def test_acme():\n    assert True\n")
    (root / "pyproject.toml").write_text(f'[project]\nname = "acme"\nversion = "0"\n\n'
                                         f'[tool.pytest.ini_options]\n{ini}\n')
    for kind, name, src in (("stacks", "acme-broker", "stacks/inmemory.yaml"), ("stacks", "kafka", "stacks/kafka.yaml"),
                            ("experiments", "acme-burst", "experiments/burst-x3.yaml")):
        (root / "resilience" / kind).mkdir(parents=True, exist_ok=True)
        (root / "resilience" / kind / f"{name}.yaml").write_text((settings.ROOT / src).read_text())
    return root


def validate(capsys, *args: str) -> tuple[int, str, str]:
    rc = cli_main(["validate", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return rc, out, err


def test_the_command_reads_the_ini_as_pytest_does(tmp_path, monkeypatch):
    root = user_repo(tmp_path / "repo")
    monkeypatch.chdir(root / "acme")          # below the root: pytest's ini finder goes upwards
    s = settings.for_command()
    assert s.project == root.resolve() and s.inipath == root.resolve() / "pyproject.toml"
    assert s.specs == (root.resolve() / "resilience",)
    assert s.runs_dir == root.resolve() / "out" / "runs"
    assert s.spec_dirs("stack")[:2] == [root.resolve() / "resilience" / "stacks", root.resolve() / "stacks"]
    assert s.find("stack", "acme-broker") == root.resolve() / "resilience" / "stacks" / "acme-broker.yaml"
    assert s.find("stack", "kafka") == root.resolve() / "resilience" / "stacks" / "kafka.yaml"   # the project's wins
    assert s.find("stack", "inmemory") == settings.ROOT / "stacks" / "inmemory.yaml"
    # --specs wins over the ini, --project over the current directory
    other = tmp_path / "elsewhere"
    other.mkdir()
    assert settings.for_command(specs=[other]).specs == (other,)
    assert settings.for_command(project=other).project == other.resolve()


def test_the_plugin_sees_the_same_settings(tmp_path):
    """pytest in the same repository: the plugin's settings equal the command's, field by field."""
    root = user_repo(tmp_path / "repo")
    (root / "tests" / "test_settings.py").write_text(textwrap.dedent("""
        from monsoon import settings

        def test_settings():
            s = settings.current()
            print("SEEN", s.project, s.specs, s.runs_dir, s.inipath)
    """))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "--strict-config",
                        "../tests/test_settings.py"], cwd=root / "acme", capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    seen = next(ln for ln in r.stdout.splitlines() if "SEEN" in ln)
    c = subprocess.run([sys.executable, "-c", "from monsoon import settings; s = settings.for_command(); "
                        "print('SEEN', s.project, s.specs, s.runs_dir, s.inipath)"], cwd=root / "acme",
                       capture_output=True, text=True, timeout=60)
    assert seen.endswith(c.stdout.strip()), (seen, c.stdout)


def test_validate_reads_the_projects_specs_and_lists_them(tmp_path, monkeypatch, capsys):
    root = user_repo(tmp_path / "repo")
    monkeypatch.chdir(root)
    rc, out, err = validate(capsys)
    assert (rc, out) == (0, ""), err
    assert "monsoon validate: read 2 stacks, 1 experiment, 0 fault profiles from resilience/experiments, " \
           "resilience/stacks" in err
    assert "3 file(s): all valid" in err
    # said once: the project's kafka hides monsoon's
    assert err.count("shadow") == 1 and "stack kafka (resilience/stacks/kafka.yaml)" in err
    # a folder with no YAML directly inside stands for its stacks/, experiments/, fault-profiles/
    rc, _, err = validate(capsys, "resilience")
    assert rc == 0 and "read 2 stacks, 1 experiment" in err and "3 file(s): all valid" in err
    # a pair by name, found where a run finds it
    rc, _, err = validate(capsys, "--stack", "acme-broker", "--experiment", "acme-burst")
    assert rc == 0 and "stack acme-broker from resilience/stacks/acme-broker.yaml" in err, err


def test_a_broken_project_spec_is_a_problem_not_all_valid(tmp_path, monkeypatch, capsys):
    root = user_repo(tmp_path / "repo")
    (root / "resilience" / "stacks" / "acme-broker.yaml").write_text("services: [1\n")
    monkeypatch.chdir(root)
    rc, out, err = validate(capsys)
    assert rc == 1 and out.startswith("resilience/stacks/acme-broker.yaml:") and "all valid" not in err


def test_reading_nothing_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    root = user_repo(tmp_path / "repo", ini='monsoon_specs = ["nowhere"]')
    monkeypatch.chdir(root)
    rc, out, err = validate(capsys)
    assert rc == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith("monsoon validate: nothing to validate: no stack, experiment or fault-profile YAML in ")
    assert "nowhere" in err and "monsoon_specs from pyproject.toml" in err
    (root / "empty").mkdir()
    rc, _, err = validate(capsys, "empty")
    assert rc == 2 and err.startswith("monsoon validate: nothing to validate in empty") and err.count("\n") == 1


def test_a_name_not_found_lists_where_it_looked(tmp_path, monkeypatch, capsys):
    root = user_repo(tmp_path / "repo")
    monkeypatch.chdir(root)
    rc, _, err = validate(capsys, "--stack", "acme-brokr", "--experiment", "acme-burst")
    assert rc == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("monsoon validate: no stack named 'acme-brokr': looked for acme-brokr.yaml in "
                          "resilience/stacks, stacks (missing), ")
    assert str(settings.ROOT / "stacks") in err and "acme-broker" in err   # the shipped folder; what there is


def test_monsoons_own_checkout_still_validates_what_it_ships(monkeypatch, capsys):
    if settings.CHECKOUT is None:
        pytest.skip("an installed monsoon")
    monkeypatch.chdir(REPO)
    rc, _, err = validate(capsys)
    assert rc == 0 and "stack/experiment pair(s): all valid" in err


def test_the_settings_are_given_back_after_a_command(tmp_path, monkeypatch, capsys):
    before = settings.current()
    root = user_repo(tmp_path / "repo")
    monkeypatch.chdir(root)
    validate(capsys)
    assert settings.current() is before


def test_strict_config_with_the_plugin_switched_off(tmp_path):
    """``-p no:monsoon`` and an ini file that sets monsoon_specs: under --strict-config the keys stay known,
    because monsoon.settings is a plugin of its own (the ``monsoon-ini`` entry point) that registers them alone."""
    from importlib.metadata import entry_points
    assert [ep.value for ep in entry_points(group="pytest11") if ep.name == "monsoon-ini"] == ["monsoon.settings"]
    root = user_repo(tmp_path / "repo")
    base = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--strict-config", "tests/test_acme.py"]
    r = subprocess.run([*base, "-p", "no:monsoon"], cwd=root, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr
    # both switched off: pytest's own refusal of an unknown key, so the test above can fail
    r = subprocess.run([*base, "-p", "no:monsoon", "-p", "no:monsoon-ini"], cwd=root, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode != 0 and "Unknown config option: monsoon_" in r.stdout + r.stderr, r.stdout + r.stderr
