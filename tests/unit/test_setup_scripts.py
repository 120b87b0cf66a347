"""Set-up scripts say what to install when a prerequisite is missing."""
import os
import shutil
import subprocess
import sys

from monsoon.specs import REPO


def path_without(tmp_path, *missing):
    """A PATH dir holding the usual tools but not ``missing``."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("bash", "sed", "head", "grep", "env", "python3", "java", "mvn", "go"):
        if tool in missing:
            continue
        real = sys.executable if tool == "python3" else shutil.which(tool)
        if real:
            (bin_ / tool).symlink_to(real)
    return str(bin_)


def run(script, path):
    return subprocess.run([shutil.which("bash"), str(REPO / "tools" / script)], env={**os.environ, "PATH": path},
                          capture_output=True, text=True, timeout=60)


def test_check_prereqs_passes_on_this_machine():
    r = subprocess.run([str(REPO / "tools/check-prereqs")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_missing_java_and_maven_say_what_to_install(tmp_path):
    r = run("check-prereqs", path_without(tmp_path, "java", "mvn"))
    assert r.returncode == 1
    assert "java not found. Install a Java 17 JDK: apt-get install -y openjdk-17-jdk-headless" in r.stderr
    assert "mvn (Maven) not found. Install Maven: apt-get install -y maven" in r.stderr


def test_missing_go_for_toxiproxy_says_what_to_install(tmp_path):
    env_cache = tmp_path / "cache"
    r = subprocess.run([shutil.which("bash"), str(REPO / "tools/install-toxiproxy")],
                       env={**os.environ, "PATH": path_without(tmp_path, "go"), "MONSOON_CACHE": str(env_cache)},
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "install Go" in r.stderr
