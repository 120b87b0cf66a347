"""monsoon in the user's own repository: a plugin that is quiet where it is not used, specs found by name in the
user's project, errors printed once, and pins that agree with the package's ranges (issue 25)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

from monsoon import settings
from monsoon.cli import validate_pair      # imported here: pytester's in-process runs must not be the first import
from monsoon.spec.base import _resolve
from monsoon.spec.yamlio import SpecError, load_located

REPO = Path(__file__).resolve().parents[2]
HEAVY = ("docker", "testcontainers", "confluent_kafka", "cassandra", "matplotlib", "kubernetes", "pyarrow",
         "monsoon.session", "monsoon.stack")

PROBE = r"""
import json, os, signal, sys
import pytest
env, term = dict(os.environ), signal.getsignal(signal.SIGTERM)
rc = pytest.main(sys.argv[1:])
print("PROBE " + json.dumps({
    "rc": int(rc), "plugin": "monsoon.plugin" in sys.modules,
    "heavy": sorted(m for m in sys.modules if m.split(".")[0] in HEAVY or m in HEAVY),
    "env": sorted(k for k in set(os.environ) ^ set(env)) + sorted(k for k in env if os.environ.get(k) != env[k]),
    "sigterm_restored": signal.getsignal(signal.SIGTERM) == term}))
"""


def probe(folder: Path, *args: str) -> dict:
    """pytest.main in a fresh interpreter (the plugin through its pytest11 entry point), then what it left."""
    code = f"HEAVY = {HEAVY!r}\n" + PROBE
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}   # not the outer run's
    r = subprocess.run([sys.executable, "-c", code, "-p", "no:cacheprovider", *args], cwd=folder, env=env,
                       capture_output=True, text=True, timeout=300)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("PROBE ")), None)
    assert line, r.stdout + r.stderr
    return {**json.loads(line[6:]), "out": r.stdout}


def unrelated(tmp_path: Path) -> Path:
    (tmp_path / "test_plain.py").write_text("def test_plain():\n    assert 1 + 1 == 2\n")
    return tmp_path


def test_an_unrelated_pytest_run_imports_nothing_heavy_and_changes_nothing(tmp_path):
    got = probe(unrelated(tmp_path), "-q", "test_plain.py")
    assert got["rc"] == 0 and got["plugin"], got["out"]        # loaded (its option group is there) ...
    assert got["heavy"] == [] and got["env"] == [] and got["sigterm_restored"], got   # ... and quiet


def test_the_plugin_can_be_switched_off(tmp_path):
    got = probe(unrelated(tmp_path), "-q", "-p", "no:monsoon", "test_plain.py")
    assert got["rc"] == 0 and not got["plugin"], got


def test_start_up_with_and_without_the_plugin_is_printed(tmp_path):
    """A printed figure (no timed assertion): the median of 3 `pytest --collect-only` start-ups each way."""
    unrelated(tmp_path)

    def median(*extra: str) -> float:
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider", *extra,
                            "test_plain.py"], cwd=tmp_path, capture_output=True, check=True, timeout=300)
            ts.append(time.perf_counter() - t0)
        return sorted(ts)[1]

    with_, without = median(), median("-p", "no:monsoon")
    print(f"\nunrelated pytest start-up: {with_:.2f} s with monsoon's plugin, {without:.2f} s with -p no:monsoon")
    assert with_ > 0 and without > 0


STACK = (REPO / "stacks" / "inmemory.yaml").read_text().replace("name: inmemory", "name: mystack")
EXP = (REPO / "experiments" / "burst-x3.yaml").read_text().replace("name: burst-x3", "name: my-x3")


def user_project(root: Path) -> Path:
    (root / "pyproject.toml").write_text("[tool.pytest.ini_options]\n")
    (root / "stacks").mkdir()
    (root / "stacks" / "mystack.yaml").write_text(STACK)
    (root / "experiments").mkdir()
    (root / "experiments" / "my-x3.yaml").write_text(EXP)
    return root


def test_a_dry_run_in_the_users_project_finds_its_specs_and_monsoons_by_name_and_gives_back_sigterm(tmp_path):
    root = user_project(tmp_path)
    (root / "test_mine.py").write_text(
        "def test_mine(monsoon):\n    monsoon.run('mystack', 'my-x3')\n\n"
        "def test_shipped(monsoon):\n    monsoon.run('inmemory', 'burst-x3')\n")
    got = probe(root, "-q", "-rs", "--monsoon-dry-run", "test_mine.py")
    assert got["rc"] == 0 and "2 passed" in got["out"], got["out"]
    assert "DRY RUN mystack / my-x3 (quick)" in got["out"] and "DRY RUN inmemory / burst-x3" in got["out"]
    extras = {m.split(".")[0] for m in got["heavy"]} & {"docker", "testcontainers", "cassandra", "kubernetes"}
    assert not extras, extras                          # the extras are imported when a run needs them, not before
    assert got["sigterm_restored"] and got["env"] == [], got       # the run's SIGTERM handler is given back
    assert not (root / "runs").exists()                               # a dry run writes no run directory


def test_the_project_is_found_upwards_and_its_specs_come_first(tmp_path):
    root = user_project(tmp_path)
    (root / "stacks" / "inmemory.yaml").write_text(STACK.replace("name: mystack", "name: inmemory"))
    deep = root / "a" / "b"
    deep.mkdir(parents=True)
    assert settings.find_project(deep) == root.resolve()
    with settings.using(project=settings.find_project(deep)):
        assert _resolve("stack", "mystack") == root.resolve() / "stacks" / "mystack.yaml"
        assert _resolve("stack", "inmemory") == root.resolve() / "stacks" / "inmemory.yaml"   # the user's wins
        assert _resolve("stack", "kafka") == settings.ROOT / "stacks" / "kafka.yaml"          # then monsoon's
        assert settings.current().runs_dir == root.resolve() / "runs"
        with pytest.raises(SpecError, match=r"no stack named 'nope' \(available: .*inmemory.*mystack"):
            _resolve("stack", "nope")


def test_monsoon_specs_folders_come_before_the_project(tmp_path):
    root = user_project(tmp_path)
    (root / "specs" / "stacks").mkdir(parents=True)
    (root / "specs" / "stacks" / "mystack.yaml").write_text(STACK)
    with settings.using(project=root, specs=["specs"]):
        assert _resolve("stack", "mystack") == root / "specs" / "stacks" / "mystack.yaml"
    assert settings.current().specs == ()     # given back


def test_a_spec_error_under_pytest_is_printed_once(pytester, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\nload:\n  devices: 0\n  base_rate: 10\n  shape: {kind: steady}\n"
                   "profiles: {quick: {warmup: 5}}\nchecks: [no_oom]\n")
    pytester.makepyfile(f"def test_x(monsoon):\n    monsoon.run('inmemory', {str(bad)!r})\n")
    out = pytester.runpytest(f"--monsoon-runs-dir={tmp_path / 'runs'}").stdout.str()
    # the failure's report, not the short summary line (which pytest prints in full, not cut, when CI is set)
    report = out.split("short test summary info")[0]
    assert report.count("load.devices: Input should be greater than 0") == 1, out
    assert "During handling of the above exception" not in out and "Traceback" not in out, out


def test_a_dry_run_starts_no_docker_daemon(pytester, tmp_path):
    pytester.makepyfile("""
        import pytest
        pytestmark = pytest.mark.usefixtures("docker_daemon")
        def test_x(docker_daemon):
            assert docker_daemon is None
    """)
    pytester.runpytest("--monsoon-dry-run").assert_outcomes(passed=1)


# ------------------------------------------------------------------ the package's dependencies


def requirement(line: str) -> tuple[str, str]:
    m = re.match(r"^\s*([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?\s*(.*)$", line)
    return m.group(1).lower().replace("_", "-"), m.group(2).strip()


def satisfies(version: str, spec: str) -> bool:
    """``version`` against a PEP 440 specifier set of ==, >=, <, <= and ~= (what pyproject uses)."""
    from packaging.specifiers import SpecifierSet
    return version in SpecifierSet(spec)


def test_the_pins_in_requirements_txt_fall_in_pyprojects_ranges():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    ranges = dict(requirement(d) for d in project["dependencies"])
    for extra, deps in project["optional-dependencies"].items():
        ranges.update(requirement(d) for d in deps)
    pins = dict(requirement(ln) for ln in (REPO / "requirements.txt").read_text().splitlines()
                if ln.strip() and not ln.startswith("#"))
    for name, spec in ranges.items():
        assert name in pins, f"{name} is a dependency of monsoon but has no pin in requirements.txt"
        assert satisfies(pins[name].removeprefix("=="), spec), f"requirements.txt pins {name}{pins[name]}, pyproject allows {spec}"
    assert {"docker", "testcontainers"} <= set(requirement(d)[0] for d in project["optional-dependencies"]["containers"])
    assert "cassandra-driver" in set(requirement(d)[0] for d in project["optional-dependencies"]["cassandra"])


def test_paho_mqtt_range_is_what_the_load_engine_accepts():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    spec = dict(requirement(d) for d in project["dependencies"])["paho-mqtt"]
    src = (REPO / "monsoon" / "load" / "mqtt.py").read_text()
    accepted = re.search(r'__version__\.startswith\("(\d+\.\d+)\."\)', src).group(1)   # what load/mqtt.py accepts
    assert satisfies(f"{accepted}.0", spec) and satisfies(f"{accepted}.99", spec)
    major, minor = map(int, accepted.split("."))
    assert not satisfies(f"{major}.{minor + 1}.0", spec) and not satisfies(f"{major}.{minor - 1}.0", spec)


# ------------------------------------------------------------------ bad input, blamed where it is written

PAUSE = "name: pause\nkind: process-pause\ntarget: postgres\nbackend: process\nschedule:\n  at: 60\n  duration: {d}\n"
PAUSING = (EXP.split("checks:")[0] + "checks: [no_oom]\nfaults:\n  - profile: process-pause\n"
           "    schedule:\n      duration: {d}\n")


def pair_errors(root: Path, profile_d, exp_d) -> list[str]:
    (root / "fault-profiles").mkdir(exist_ok=True)
    (root / "fault-profiles" / "process-pause.yaml").write_text(PAUSE.replace("{d}", str(profile_d)))
    (root / "experiments" / "pausing.yaml").write_text(PAUSING.replace("{d}", str(exp_d)))
    with settings.using(project=root):
        return [str(e) for e in validate_pair("mystack", "pausing")]


def test_a_broken_profile_value_is_caught_although_the_experiment_overrides_it(tmp_path):
    root = user_project(tmp_path)
    errors = pair_errors(root, -5, 5)
    line = PAUSE.splitlines().index("  duration: {d}") + 1
    assert errors and f"{root / 'fault-profiles' / 'process-pause.yaml'}:{line}: schedule.duration" in errors[0], errors


def test_a_broken_override_is_blamed_on_the_experiments_line(tmp_path):
    root = user_project(tmp_path)
    errors = pair_errors(root, 5, -5)
    line = PAUSING.splitlines().index("      duration: {d}") + 1
    exp = root / "experiments" / "pausing.yaml"
    assert errors and errors[0].startswith(f"{exp}:{line}: faults.0.schedule.duration: "), errors
    assert "process-pause.yaml" not in errors[0].split("(overrides")[0], errors


@pytest.mark.parametrize("text, line", [
    ("name: x\nload:\n  devices: 1\n  shape: {kind: steady\nprofiles: {quick: {warmup: 5}}\n", 4),
    ("name: x\nchecks: [no_oom,\n  no_acked_loss\n", 2),
])
def test_an_unclosed_bracket_is_reported_on_its_line(tmp_path, text, line):
    p = tmp_path / "e.yaml"
    p.write_text(text)
    with pytest.raises(SpecError) as e:
        load_located(p)
    assert e.value.line == line and "opened here is not closed" in str(e.value), str(e.value)


# ------------------------------------------------------------------ monsoon init, monsoon setup


def test_init_writes_a_project_that_validates_and_dry_runs_and_refuses_to_overwrite(tmp_path, capsys):
    from monsoon.cli import main
    assert main(["init", str(tmp_path)]) == 0
    for rel in ("stacks/my-platform.yaml", "experiments/my-burst.yaml", "fault-profiles", "pytest/test_burst.py",
                "conftest.py", "requirements.txt", "README.md", "pytest.ini"):
        assert (tmp_path / rel).exists(), rel
    before = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    capsys.readouterr()
    assert main(["init", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "exists" in err[0] and "nothing written" in err[0], err
    assert before == {p: p.stat().st_mtime_ns for p in tmp_path.rglob("*") if p.is_file()}
    assert main(["--project", str(tmp_path), "validate", "--stack", "my-platform", "--experiment", "my-burst"]) == 0
    got = probe(tmp_path, "-q", "--monsoon-dry-run")
    assert got["rc"] == 0 and "DRY RUN my-platform / my-burst (quick)" in got["out"], got["out"]


def test_init_keeps_an_existing_pytest_configuration(tmp_path):
    from monsoon import scaffold
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'mine'\n")
    written = {p.relative_to(tmp_path).as_posix() for p in scaffold.init(tmp_path)}
    assert "pytest.ini" not in written and "stacks/my-platform.yaml" in written


def test_setup_refuses_in_one_line(capsys, monkeypatch, tmp_path):
    from monsoon import hostsetup
    lines: list[str] = []
    assert hostsetup.setup(["nope"], say=lines.append) == 2 and len(lines) == 1 and "kafka" in lines[0]
    monkeypatch.setattr(hostsetup.settings, "ROOT", tmp_path)     # a tree without tools/build-k8s
    lines.clear()
    assert hostsetup.setup(["k8s"], say=lines.append) == 1
    assert lines == ["monsoon setup k8s: tools/build-k8s is not there (the single-node Kubernetes cluster is built "
                     "from a checkout of monsoon: `make k8s`)"]
    monkeypatch.setenv("MONSOON_CACHE", str(tmp_path))
    (tmp_path / "kafka").mkdir()
    (tmp_path / "kafka" / ".fetched").touch()                      # done before: nothing is fetched again
    lines.clear()
    assert hostsetup.setup(["kafka"], say=lines.append) == 0 and lines == [
        f"monsoon setup kafka: already in {tmp_path / 'kafka' / 'lib'}"]


def test_a_setup_refusal_is_one_line_naming_what_to_install_and_installs_nothing(monkeypatch, tmp_path):
    from monsoon import hostsetup
    bin_ = tmp_path / "bin"           # the usual tools, without go
    bin_.mkdir()
    for tool in ("bash", "dirname", "sed", "grep", "mktemp", "java", "mvn"):
        if shutil.which(tool):
            (bin_ / tool).symlink_to(shutil.which(tool))
    monkeypatch.setenv("PATH", str(bin_))
    monkeypatch.setenv("MONSOON_CACHE", str(tmp_path / "cache"))
    for piece, what in (("toxiproxy", "Toxiproxy"), ("ferretdb", "FerretDB")):
        lines: list[str] = []
        assert hostsetup.setup([piece], say=lines.append) == 1
        assert lines == [f"monsoon setup {piece}: {what} needs Go to build (go not found on PATH): install Go 1.22+: "
                         f"apt-get install -y golang (or https://go.dev/dl/), then re-run: tools/install-{piece}"]
    (bin_ / "mvn").unlink()
    lines = []
    assert hostsetup.setup(["cassandra"], say=lines.append) == 1 and len(lines) == 1, lines
    assert "needs Maven (mvn not found on PATH): install Maven: apt-get install -y maven" in lines[0], lines
    assert not (tmp_path / "cache" / "bin").exists() and not (tmp_path / "cache" / "cassandra").exists()


def test_make_s_set_up_targets_are_monsoon_setup_and_the_demo_sets_up_only_what_it_uses():
    from monsoon import hostsetup
    out = subprocess.run(["make", "-n", "-W", "requirements.txt", "setup", "demo", "kafka", "platform", "images"],
                         cwd=REPO, capture_output=True, text=True, timeout=60).stdout.splitlines()
    pieces = [ln.split("monsoon.hostsetup", 1)[1].split() for ln in out if "-m monsoon.hostsetup" in ln]
    assert pieces[0] == ["kafka", "debs", "platform", "toxiproxy", "ferretdb", "infinispan", "cassandra", "loadgen",
                         "docker", "images", "k8s"]
    assert pieces[1] == list(hostsetup.DEMO) == ["kafka", "postgres", "platform"]     # no Docker, images, Cassandra...
    assert pieces[2:] == [["kafka"], ["platform"], ["images"]]
    assert set(p for ps in pieces for p in ps) <= set(hostsetup.PIECES)
    recipes = [ln for ln in out if not ln.startswith(("test ", "touch ", "python3 -m venv")) and "pip install" not in ln]
    assert not [ln for ln in recipes if "mvn " in ln or "tools/install-" in ln or "tools/build-images" in ln], recipes


def test_the_demo_runs_the_two_x10_cases_and_judges_the_story_on_them():
    from monsoon.cli import DEMO_CASES, story_problems
    ids = subprocess.run([sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider",
                          *(f"pytest/test_burst_floods.py::{c}" for c in DEMO_CASES)],
                         cwd=REPO, capture_output=True, text=True, timeout=120).stdout
    assert sorted(ln for ln in ids.splitlines() if "::" in ln) == sorted(f"pytest/test_burst_floods.py::{c}"
                                                                         for c in DEMO_CASES)
    result = lambda stack, verdict, **figures: {"stack": stack, "experiment": "burst-x10", "verdict": verdict,
                                                 "checks": [{"name": k, "figures": v} for k, v in figures.items()]}
    told = [result("inmemory", "fail", no_oom={"oom_events": 1}, no_acked_loss={"acked_lost": 4100}),
            result("kafka", "pass", lag_recovers_within={"peak_lag": 90000}, no_acked_loss={"acked_lost": 0})]
    assert story_problems({"results": told}) == []
    assert story_problems({"results": told[:1]}) == ["kafka / burst-x10 did not run"]
    lossy = [told[0], result("kafka", "fail", lag_recovers_within={"peak_lag": 9}, no_acked_loss={"acked_lost": 3})]
    assert len(story_problems({"results": lossy})) == 1 and "acked_lost=3" in story_problems({"results": lossy})[0]
    x3 = {"stack": "kafka", "experiment": "burst-x3", "verdict": "fail", "checks": []}   # when x3 ran, it must pass
    assert story_problems({"results": [*told, x3]}) == ["kafka x3 should PASS, got FAIL"]
    # the Kubernetes twin: the same story on inmemory-k8s / kafka-k8s, the OOM as kubelet's OOMKilled
    pods = [result("inmemory-k8s", "fail", no_oom={"oom_events": 0, "k8s_oom_killed": 2},
                   no_acked_loss={"acked_lost": 900}),
            {**told[1], "stack": "kafka-k8s"}]
    assert story_problems({"results": pods}, ("inmemory-k8s", "kafka-k8s")) == []
    assert story_problems({"results": pods}) == ["inmemory / burst-x10 did not run", "kafka / burst-x10 did not run"]
    # the demo says where its runs go to pytest (the checkout's ini would win over $MONSOON_RUNS_DIR)
    from monsoon.cli import _runs_dir_arg
    assert _runs_dir_arg(["-x", "--monsoon-runs-dir=/r"]) == "/r" and _runs_dir_arg(["--monsoon-runs-dir", "/s"]) == "/s"
    assert _runs_dir_arg(["-x"]) is None


def test_every_monsoon_environment_setting_is_read_through_the_settings():
    """No module reads a MONSOON_* setting from os.environ itself: monsoon/settings.py's ENV lists them all."""
    reads = re.compile(r"os\.environ(?:\.get\(\s*[\"'](MONSOON_[A-Z_]+)|\[\s*[\"'](MONSOON_[A-Z_]+)[\"']\](?!\s*=[^=]))")
    own = {"monsoon/settings.py", "monsoon/stack/cluster.py"}   # cluster.py: the Kubernetes helper's, in progress
    found = [f"{p.relative_to(REPO)}: {m}" for p in sorted((REPO / "monsoon").rglob("*.py"))
             if str(p.relative_to(REPO)) not in own for m in map("".join, reads.findall(p.read_text()))
             if m not in ("MONSOON_RUN_ID",)]                # a run's label on its processes, not a setting
    assert found == [], found
    assert set(settings.ENV) >= {"MONSOON_CACHE", "MONSOON_RUNS_DIR", "MONSOON_HISTORY_URL", "MONSOON_LOADGEN"}


def test_a_missing_extra_is_one_line_naming_it(monkeypatch):
    from monsoon.extras import MissingExtra
    from monsoon.stack import containers
    monkeypatch.setitem(sys.modules, "docker", None)          # as if monsoon[containers] were not installed
    with pytest.raises(MissingExtra) as e:
        containers.client()
    assert str(e.value) == ("monsoon: a container stack (provider: docker) needs the 'containers' extra (docker is "
                            "not installed): pip install 'monsoon[containers]'")
