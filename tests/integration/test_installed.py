"""Proof that monsoon works from a wheel, in the user's own repository (issue 25).

In a temporary folder outside the checkout: build the wheel, install it into a fresh virtualenv (no extras; its
dependencies from a wheelhouse in monsoon's cache, the pins of requirements.txt), run ``monsoon init``, build the
reference platform (``monsoon setup platform``) and the native load engine (``monsoon setup loadgen``, its
dependencies' compiled crates reused from the checkout's build) into a cache of its own, run the example scenario
on the quick profile against the user's stack (``my-platform``) and a stack monsoon ships (``inmemory``), both
found by name, in one pytest run, and an unrelated test file in the same virtualenv. Checks the verdicts, that
nothing was written into site-packages, and that the unrelated run passes with the plugin loaded.

Then the user's door in a layout unlike ``monsoon init``'s (issue 39, :func:`user_door`): ``pyproject.toml`` at
the root with a package and its own tests, the specs under ``resilience/`` (``monsoon_specs``): ``monsoon validate``
reads them and lists them, a missing name lists where it looked, the dry run finds the project's stacks by name
and says the shadowing once, and ``-p no:monsoon`` stays quiet under ``--strict-config``.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
# the pinned dependencies as wheels, filled once per requirements.txt and kept with the user's caches (not the
# checkout's), so that a fresh clone (CI) does not build them again: ~40 s and 130 MB
WHEELHOUSE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "monsoon" / "wheelhouse"


def sh(cmd: list, cwd: Path, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    r = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def snapshot(tree: Path) -> dict[str, int]:
    return {str(p.relative_to(tree)): p.stat().st_mtime_ns for p in tree.rglob("*")}


def test_the_wheel_in_a_fresh_virtualenv_runs_the_users_and_monsoons_stacks_by_name(tmp_path):
    assert not tmp_path.resolve().is_relative_to(REPO)
    t0 = time.monotonic()
    # the wheel, from the files git knows (symlinks under monsoon/_shipped included), never in the checkout
    src = tmp_path / "tree"      # (a bare name like "src" would be looked up on the package index)
    files = sh(["git", "ls-files", "-co", "--exclude-standard", "pyproject.toml", "monsoon", "stacks", "experiments",
                "fault-profiles", "tools"], REPO).stdout.split()
    src.mkdir()
    subprocess.run(f"tar -cf - -T - | tar -xf - -C {src}", shell=True, input="\n".join(files), text=True, cwd=REPO,
                   check=True)
    sh([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist",
        src], tmp_path)
    wheel = next((tmp_path / "dist").glob("monsoon-*.whl"))
    # a fresh virtualenv: monsoon from the wheel; its dependencies from the wheelhouse (the pinned versions)
    venv = tmp_path / "venv"
    sh([sys.executable, "-m", "venv", venv], tmp_path)
    pip = [venv / "bin" / "python", "-m", "pip", "-q", "--disable-pip-version-check"]
    pins = (REPO / "requirements.txt").read_text()
    if not (WHEELHOUSE / ".requirements").is_file() or (WHEELHOUSE / ".requirements").read_text() != pins:
        WHEELHOUSE.mkdir(parents=True, exist_ok=True)    # once per requirements.txt (~40 s, 130 MB of wheels)
        sh([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--only-binary", ":all:",
            "-w", WHEELHOUSE, "-r", REPO / "requirements.txt"], tmp_path, timeout=900)
        (WHEELHOUSE / ".requirements").write_text(pins)
    sh([*pip, "install", "--no-index", "--find-links", WHEELHOUSE, wheel], tmp_path)   # no extras: not needed here
    built = time.monotonic() - t0
    site = Path(sh([venv / "bin" / "python", "-c", "import monsoon, pathlib; print(pathlib.Path(monsoon.__file__)"
                    ".parent.parent)"], tmp_path).stdout.strip())
    assert (site / "monsoon" / "_shipped" / "stacks" / "inmemory.yaml").is_file()
    assert os.access(site / "monsoon" / "_shipped" / "stacks" / "bin" / "run-postgres", os.X_OK)
    before = snapshot(site)

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "MONSOON_", "VIRTUAL_ENV"))}
    env.update(PATH=f"{venv / 'bin'}:{env['PATH']}", MONSOON_CACHE=str(tmp_path / "cache"))
    proj = tmp_path / "proj"
    sh(["monsoon", "init", proj], tmp_path, env)
    cache = tmp_path / "cache"
    crates = REPO / "monsoon" / "load" / "loadgen" / "target" / "release"   # `make setup` built them
    for sub in ("deps", "build", ".fingerprint"):     # not the binary: cargo builds monsoon-loadgen itself again
        if (crates / sub).is_dir():
            shutil.copytree(crates / sub, cache / "loadgen" / "release" / sub, symlinks=True)
    t2 = time.monotonic()
    setup = sh(["monsoon", "setup", "platform", "loadgen"], proj, env)
    assert "monsoon setup platform: built" in setup.stdout, setup.stdout
    binary = cache / "loadgen" / "release" / "monsoon-loadgen"
    assert f"monsoon setup loadgen: ready: {binary}" in setup.stdout, setup.stdout
    assert os.access(binary, os.X_OK)
    built_at = binary.stat().st_mtime_ns
    again = sh(["monsoon", "setup", "platform", "loadgen"], proj, env).stdout     # idempotent: nothing rebuilt
    assert "monsoon setup platform: already built" in again and binary.stat().st_mtime_ns == built_at, again
    set_up = time.monotonic() - t2
    (proj / "pytest" / "test_shipped.py").write_text(
        "import pytest\n\n\n@pytest.mark.burst\ndef test_shipped(monsoon):\n"
        "    monsoon.run('inmemory', 'my-burst').assert_pass()   # monsoon's stack, the user's experiment\n")
    t1 = time.monotonic()
    run = subprocess.run(["pytest", "-m", "burst", "-p", "no:cacheprovider", "--monsoon-run-id", "installed"],
                         cwd=proj, env=env, capture_output=True, text=True, timeout=900)
    ran = time.monotonic() - t1
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-3000:]
    summary = json.loads((proj / "runs" / "installed" / "summary.json").read_text())
    verdicts = {(r["stack"], r["experiment"]): r["verdict"] for r in summary["results"]}
    assert verdicts == {("my-platform", "my-burst"): "pass", ("inmemory", "my-burst"): "pass"}, verdicts

    other = tmp_path / "other"
    other.mkdir()
    (other / "test_plain.py").write_text("def test_plain():\n    assert sum([1, 2]) == 3\n")
    plain = sh(["pytest", "-q", "-p", "no:cacheprovider", "test_plain.py"], other, env)
    assert "1 passed" in plain.stdout and not (other / "runs").exists()
    assert "--monsoon-profile" in sh(["pytest", "-p", "no:cacheprovider", "--help"], other, env).stdout   # loaded

    user_door(tmp_path / "acme", env)     # a layout unlike monsoon init's, from the same wheel

    after = snapshot(site)
    written = sorted(set(after) - set(before)) + sorted(k for k in before if k in after and after[k] != before[k])
    assert written == [], f"written into site-packages: {written[:10]}"
    print(f"\ninstalled proof: wheel + venv + install {built:.0f} s, monsoon setup platform loadgen {set_up:.0f} s, "
          f"the two quick scenarios {ran:.0f} s")


def user_door(repo: Path, env: dict) -> None:
    """The installed ``monsoon`` command and plugin in a repository ``monsoon init`` did not make."""
    shipped = Path(sh(["python", "-c", "from monsoon import settings; print(settings.ROOT)"], repo.parent, env)
                   .stdout.strip())
    (repo / "acme").mkdir(parents=True)
    (repo / "acme" / "__init__.py").write_text("def add(a, b):\n    return a + b\n")
    (repo / "tests").mkdir()
    (repo / "tests" / "test_acme.py").write_text("from acme import add\n\n\ndef test_add():\n    assert add(1, 2) == 3\n")
    (repo / "tests" / "test_resilience.py").write_text(
        "import pytest\n\n\n@pytest.mark.burst\n@pytest.mark.parametrize('stack', ['acme-broker', 'kafka'])\n"
        "def test_burst(monsoon, stack):\n    monsoon.run(stack, 'acme-burst').assert_pass()\n")
    (repo / "pyproject.toml").write_text('[project]\nname = "acme"\nversion = "0.1"\n\n[tool.pytest.ini_options]\n'
                                         'pythonpath = ["."]\nmonsoon_specs = ["resilience"]\n')
    for kind, name, src in (("stacks", "acme-broker", "stacks/inmemory.yaml"), ("stacks", "kafka", "stacks/kafka.yaml"),
                            ("experiments", "acme-burst", "experiments/burst-x3.yaml")):
        (repo / "resilience" / kind).mkdir(parents=True, exist_ok=True)
        text = (shipped / src).read_text()
        (repo / "resilience" / kind / f"{name}.yaml").write_text(
            text.replace(f"\nname: {Path(src).stem}\n", f"\nname: {name}\n"))

    def monsoon(*args: str, cwd: Path = repo) -> subprocess.CompletedProcess:
        return subprocess.run(["monsoon", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)

    r = monsoon("validate", cwd=repo / "acme")        # from below the root, as pytest would find it
    assert r.returncode == 0 and r.stdout == "", r.stdout + r.stderr
    assert "read 2 stacks, 1 experiment, 0 fault profiles from " in r.stderr and "3 file(s): all valid" in r.stderr
    assert "resilience/stacks" in r.stderr and "resilience/experiments" in r.stderr
    assert r.stderr.count("shadow") == 1 and "stack kafka" in r.stderr, r.stderr
    r = monsoon("validate", "resilience")
    assert r.returncode == 0 and "3 file(s): all valid" in r.stderr, r.stderr
    r = monsoon("validate", "--stack", "acme-broker", "--experiment", "acme-burst")
    assert r.returncode == 0 and "stack acme-broker from resilience/stacks/acme-broker.yaml" in r.stderr, r.stderr
    r = monsoon("validate", "--stack", "acme-brokr", "--experiment", "acme-burst")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("monsoon validate: no stack named 'acme-brokr': looked for acme-brokr.yaml in "
                               f"resilience/stacks, stacks (missing), {shipped / 'stacks'}"), r.stderr
    empty = repo.parent / "bare"
    empty.mkdir()
    (empty / "pyproject.toml").write_text('[tool.pytest.ini_options]\nmonsoon_specs = ["resilience"]\n')
    r = monsoon("validate", cwd=empty)
    assert r.returncode == 2 and "nothing to validate" in r.stderr and len(r.stderr.strip().splitlines()) == 1

    dry = subprocess.run(["pytest", "-p", "no:cacheprovider", "--monsoon-dry-run", "-m", "burst", "-s"], cwd=repo,
                         env=env, capture_output=True, text=True, timeout=300)
    assert dry.returncode == 0 and "2 skipped" in dry.stdout, dry.stdout[-3000:] + dry.stderr[-2000:]
    assert dry.stdout.count("shadow monsoon's shipped ones") == 1, dry.stdout[-3000:]
    assert "DRY RUN acme-broker / acme-burst" in dry.stdout, dry.stdout[-3000:]
    plain = sh(["pytest", "-q", "-p", "no:cacheprovider", "--strict-config", "tests/test_acme.py"], repo, env)
    assert "1 passed" in plain.stdout
    off = subprocess.run(["pytest", "-q", "-p", "no:cacheprovider", "--strict-config", "-p", "no:monsoon",
                          "tests/test_acme.py"], cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert off.returncode == 0 and "1 passed" in off.stdout, off.stdout + off.stderr


# ------------------------------------------------------------------ the native engine inside the wheel (issue 41)
# setuptools and setuptools-rust as wheels, kept beside the wheelhouse: the wheel is built in pip's own isolated
# build environment (what pyproject.toml's [build-system] declares is all it gets), from this folder, offline
BUILDHOUSE = WHEELHOUSE.parent / "buildhouse"
BUILD_REQUIRES = ["setuptools>=70.1", "setuptools-rust>=1.9"]


def _without_rust(path: str) -> str:
    """``path`` without any folder that holds cargo or rustc."""
    return os.pathsep.join(d for d in path.split(os.pathsep)
                           if d and not any((Path(d) / t).exists() for t in ("cargo", "rustc", "rustup")))


def test_the_wheel_brings_the_native_engine_prebuilt_and_it_runs_without_cargo(tmp_path):
    """``pip wheel`` builds ``monsoon-loadgen`` (release) into a ``py3-none-<platform>`` wheel; installed into a
    fresh virtualenv and run with no cargo, rustc or ~/.cargo anywhere, ``ensure_loadgen()`` returns the binary
    the wheel installed (nothing built into the cache) and the native engine drives a small QoS 1 load against
    ``monsoon-loadgen sink`` (the ack-only sink of ``make bench-load``): every scheduled message acked."""
    import sysconfig
    import zipfile

    assert not tmp_path.resolve().is_relative_to(REPO)
    src = tmp_path / "tree"
    files = sh(["git", "ls-files", "-co", "--exclude-standard", "pyproject.toml", "setup.py", "monsoon"],
               REPO).stdout.split()
    src.mkdir()
    subprocess.run(f"tar -cf - -T - | tar -xf - -C {src}", shell=True, input="\n".join(files), text=True, cwd=REPO,
                   check=True)
    if not any(BUILDHOUSE.glob("setuptools_rust-*.whl")):
        sh([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "--only-binary", ":all:",
            "-d", BUILDHOUSE, *BUILD_REQUIRES], tmp_path, timeout=300)
    # cargo's target: the checkout's compiled dependencies (make setup / make loadgen built them), so only
    # monsoon-loadgen itself is compiled again; the checkout's target/ is not written
    target = tmp_path / "cargo-target"
    crates = REPO / "monsoon" / "load" / "loadgen" / "target" / "release"
    for sub in ("deps", "build", ".fingerprint"):
        if (crates / sub).is_dir():
            shutil.copytree(crates / sub, target / "release" / sub, symlinks=True)
    build_env = {**os.environ, "CARGO_TARGET_DIR": str(target)}
    t0 = time.monotonic()
    sh([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps", "--no-index",
        "--find-links", BUILDHOUSE, "-w", tmp_path / "dist", src], tmp_path, build_env, timeout=900)
    built = time.monotonic() - t0
    wheel = next((tmp_path / "dist").glob("monsoon-*.whl"))
    plat = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert wheel.name.endswith(f"-py3-none-{plat}.whl"), wheel.name
    names = zipfile.ZipFile(wheel).namelist()
    assert any(n.endswith(".data/scripts/monsoon-loadgen") for n in names), names[-20:]
    assert not [n for n in names if "/target/" in n], "cargo's target/ in the wheel"
    # what users install: the same wheel tagged manylinux by auditwheel (tools/build-wheel, make wheel), which
    # checks the engine's binary against the policies and grafts no library into it
    repaired = Path(sh([REPO / "tools" / "build-wheel", "--repair", wheel, tmp_path / "manylinux"], tmp_path,
                       timeout=300).stdout.strip().splitlines()[-1])
    assert re.fullmatch(r"monsoon-[\d.]+-py3-none-manylinux_2_\d+_" + plat.split("_", 1)[1] + r"\.whl",
                        repaired.name), repaired.name
    assert sorted(n for n in zipfile.ZipFile(repaired).namelist() if ".libs/" in n) == [], "auditwheel grafted"
    wheel = repaired

    venv = tmp_path / "venv"
    sh([sys.executable, "-m", "venv", venv], tmp_path)
    pins = (REPO / "requirements.txt").read_text()
    if not (WHEELHOUSE / ".requirements").is_file() or (WHEELHOUSE / ".requirements").read_text() != pins:
        WHEELHOUSE.mkdir(parents=True, exist_ok=True)
        sh([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--only-binary", ":all:",
            "-w", WHEELHOUSE, "-r", REPO / "requirements.txt"], tmp_path, timeout=900)
        (WHEELHOUSE / ".requirements").write_text(pins)
    sh([venv / "bin" / "python", "-m", "pip", "-q", "--disable-pip-version-check", "install", "--no-index",
        "--find-links", WHEELHOUSE, wheel], tmp_path)
    installed = venv / "bin" / "monsoon-loadgen"
    assert os.access(installed, os.X_OK)

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_", "MONSOON_", "VIRTUAL_ENV", "CARGO", "RUSTUP"))}
    env.update(PATH=f"{venv / 'bin'}:{_without_rust(env['PATH'])}", MONSOON_CACHE=str(tmp_path / "cache"),
               CARGO_HOME=str(tmp_path / "no-cargo"), RUSTUP_HOME=str(tmp_path / "no-rustup"),
               HOME=str(tmp_path / "home"))
    assert shutil.which("cargo", path=env["PATH"]) is None and shutil.which("rustc", path=env["PATH"]) is None
    assert "ack-only sink" in sh(["monsoon-loadgen", "--help"], tmp_path, env).stdout
    crate = (REPO / "monsoon" / "load" / "loadgen" / "Cargo.toml").read_text()
    version = crate.split('version = "', 1)[1].split('"', 1)[0]           # [package]'s, the first in the file
    assert sh(["monsoon-loadgen", "--version"], tmp_path, env).stdout.strip() == f"monsoon-loadgen {version}"
    script = r"""
import json, sys, threading
from pathlib import Path
from monsoon.load.loadgen_build import ensure_loadgen, packaged_loadgen
from monsoon.load.native import NativeFleet
from monsoon.load.shapes import Steady
from monsoon.selftest.bench import Sinks
from monsoon.stack.provision import Device
binary = ensure_loadgen()
sinks = Sinks(binary, 1)
try:
    devs = [Device(f"whl-{i:03d}", "") for i in range(20)]
    with NativeFleet(devs, "127.0.0.1", sinks.port, shape=Steady(rate=2000, duration=2),
                     acked_path=Path(sys.argv[1]) / "acked.parquet", workers=1) as f:
        f.connect()
        t = f.run(threading.Event())
finally:
    sinks.close()
print(json.dumps({"binary": str(binary), "packaged": str(packaged_loadgen()), "scheduled": t.scheduled,
                  "acked": t.acked, "failed": t.failed}))
"""
    out = sh([venv / "bin" / "python", "-c", script, tmp_path], tmp_path, env, timeout=120).stdout
    r = json.loads(out.strip().splitlines()[-1])
    assert r["binary"] == r["packaged"] == str(installed.resolve()), r
    assert r["acked"] == r["scheduled"] >= 3_900 and r["failed"] == 0, r     # 2,000 msg/s for 2 s
    assert not (tmp_path / "cache" / "loadgen").exists(), "built into the cache: the packaged binary was not used"
    print(f"\nwheel with the native engine: {wheel.name}, {wheel.stat().st_size / 1e6:.2f} MB, built in {built:.0f} s")
