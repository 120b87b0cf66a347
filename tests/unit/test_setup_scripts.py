"""Set-up scripts say what to install when a prerequisite is missing."""
import os
import shutil
import subprocess
import sys

from monsoon.paths import REPO


def path_without(tmp_path, *missing):
    """A PATH dir holding the usual tools but not ``missing``."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    for tool in ("bash", "dirname", "sed", "head", "grep", "env", "python3", "java", "mvn", "go"):
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



def run_install(script, tmp_path, *missing):
    """Run tools/<script> with the cache in tmp_path/cache and ``missing`` tools absent from PATH."""
    path = path_without(tmp_path, *missing) if not (tmp_path / "bin").exists() else str(tmp_path / "bin")
    return subprocess.run([shutil.which("bash"), str(REPO / "tools" / script)],
                          env={**os.environ, "PATH": path, "MONSOON_CACHE": str(tmp_path / "cache")},
                          capture_output=True, text=True, timeout=60)


def test_missing_go_for_ferretdb_says_what_to_install(tmp_path):
    r = run_install("install-ferretdb", tmp_path, "go")
    assert r.returncode == 1
    assert "FerretDB needs Go to build (go not found on PATH)" in r.stderr
    assert "install Go 1.22+: apt-get install -y golang" in r.stderr
    assert "tools/install-ferretdb" in r.stderr
    assert not (tmp_path / "cache" / "bin" / "ferretdb").exists()


def test_installed_ferretdb_is_a_no_op_without_go(tmp_path):
    fake = tmp_path / "cache" / "bin" / "ferretdb"
    fake.parent.mkdir(parents=True)
    # many lines after the version: `ferretdb --version | grep -q` under pipefail fails now and then
    # (SIGPIPE), which made the script rebuild an installed FerretDB
    fake.write_text('#!/bin/sh\necho "version: v1.24.0"\n'
                    'i=0; while [ $i -lt 5000 ]; do echo "line $i"; i=$((i+1)); done\n')
    fake.chmod(0o755)
    for _ in range(5):
        r = run_install("install-ferretdb", tmp_path, "go")
        assert r.returncode == 0 and r.stderr == "", r.stderr


def test_missing_maven_for_infinispan_says_what_to_install(tmp_path):
    r = run_install("install-infinispan", tmp_path, "mvn")
    assert r.returncode == 1
    assert "mvn not found on PATH" in r.stderr
    assert "install Maven: apt-get install -y maven" in r.stderr
    assert "java not found" not in r.stderr
    assert not (tmp_path / "cache" / "infinispan").exists()


def test_missing_java_and_maven_for_infinispan_name_both(tmp_path):
    r = run_install("install-infinispan", tmp_path, "java", "mvn")
    assert r.returncode == 1
    assert "install a Java 17 JDK: apt-get install -y openjdk-17-jdk-headless" in r.stderr
    assert "install Maven: apt-get install -y maven" in r.stderr


def test_installed_infinispan_is_a_no_op_without_maven(tmp_path):
    lib = tmp_path / "cache" / "infinispan" / "lib"
    lib.mkdir(parents=True)
    for jar in ("infinispan-server-runtime-15.2.6.Final.jar", "infinispan-server-runtime-15.2.6.Final-loader.jar"):
        (lib / jar).write_bytes(b"")
    (tmp_path / "cache" / "infinispan" / "VERSION").write_text("15.2.6.Final\n")
    r = run_install("install-infinispan", tmp_path, "mvn", "java")
    assert r.returncode == 0 and r.stderr == "", r.stderr


def test_missing_maven_for_cassandra_says_what_to_install(tmp_path):
    r = run_install("install-cassandra", tmp_path, "mvn")
    assert r.returncode == 1 and "install Maven: apt-get install -y maven" in r.stderr, r.stderr
    assert not (tmp_path / "cache" / "cassandra").exists()


def test_installed_cassandra_is_a_no_op_without_maven(tmp_path):
    lib = tmp_path / "cache" / "cassandra" / "lib"
    lib.mkdir(parents=True)
    for jar in ("cassandra-all-5.0.9.jar", "jamm-0.4.0.jar"):
        (lib / jar).write_bytes(b"")
    (tmp_path / "cache" / "cassandra" / "VERSION").write_text("5.0.9\n")
    r = run_install("install-cassandra", tmp_path, "mvn", "java")
    assert r.returncode == 0 and r.stderr == "", r.stderr
