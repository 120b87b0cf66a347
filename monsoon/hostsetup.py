"""``monsoon setup [piece ...]``: what ``make setup`` does, piece by piece, for a checkout or an installed monsoon.

Each piece is idempotent (fast when already done) and a refusal is one line naming what to install. Each installs
only what it names (``mosquitto`` is Mosquitto alone; ``debs`` is PostgreSQL, Mosquitto and Chromium), and none
stops, kills or reconfigures a service it did not start (tools/install-debs: a running system PostgreSQL or
Mosquitto is left running, said in one line). Downloaded
and built parts go to the cache (:func:`monsoon.settings.cache_dir`). For an installed monsoon, ``platform``
copies the shipped files (``monsoon/_shipped``) into ``<cache>/shipped`` and builds the reference platform's jar
there; :data:`monsoon.settings.ROOT` (``{repo}`` in a stack) is that copy from then on, so nothing is ever
written into site-packages."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

from monsoon import settings
from monsoon.load.loadgen_build import LoadgenBuildError, ensure_loadgen

PIECES = ("kafka", "postgres", "mosquitto", "chromium", "debs", "platform", "toxiproxy", "ferretdb", "infinispan", "cassandra", "loadgen",
          "docker", "images", "k8s")
DEMO = ("kafka", "postgres", "platform")   # what `make demo` uses (the python load engine, no faults)
JAR = Path("stacks/reference-platform/target/reference-platform.jar")


class SetupError(RuntimeError):
    """A piece that cannot be set up here; ``str()`` is one line."""


def _need(cmd: str, hint: str) -> str:
    found = shutil.which(cmd)
    if found is None:
        raise SetupError(f"{cmd} not found: {hint}")
    return found


def _run(cmd: list[str], what: str, env: dict | None = None) -> None:
    env = env or {**os.environ, settings.CACHE_ENV: str(settings.cache_dir())}
    r = subprocess.run(cmd, env=env)
    if r.returncode != 0:
        raise SetupError(f"{what} failed (exit {r.returncode}): {' '.join(map(str, cmd))}")


def _tool(name: str) -> Path:
    """A set-up script of monsoon's ``tools/`` (shipped with the package as ``_shipped/tools``)."""
    for root in (settings.ROOT, settings.PACKAGE / "_shipped"):
        if (root / "tools" / name).is_file():
            return root / "tools" / name
    raise SetupError(f"tools/{name} is not there: this piece needs a checkout of monsoon (`make setup` in it)")


def _script(name: str, *args: str) -> Callable[[], str]:
    """A piece done by a ``tools/install-*`` script: ``--check`` first (a refusal is the script's one line, nothing
    is installed), then the script itself (idempotent: it returns at once when its part is there)."""
    def piece() -> str:
        tool = _tool(name)
        env = {**os.environ, settings.CACHE_ENV: str(settings.cache_dir())}
        check = subprocess.run(["bash", str(tool), "--check", *args], env=env, capture_output=True, text=True)
        if check.returncode != 0:
            lines = [ln for ln in check.stderr.splitlines() if ln.strip()] or [f"exit {check.returncode}"]
            raise SetupError(lines[-1].removeprefix("monsoon: "))
        _run(["bash", str(tool), *args], f"tools/{name}")
        return "ok"
    return piece


def kafka() -> str:
    lib, stamp = settings.cache_dir() / "kafka" / "lib", settings.cache_dir() / "kafka" / ".fetched"
    pom = settings.ROOT / "stacks" / "kafka" / "pom.xml"
    fetched_for = hashlib.sha256(pom.read_bytes()).hexdigest() if pom.is_file() else ""   # the stamp: which pom
    if stamp.is_file() and stamp.read_text().strip() == fetched_for:
        return f"already in {lib}"
    _need("java", "install OpenJDK 17: apt-get install -y openjdk-17-jdk-headless")
    mvn = _need("mvn", "install Maven: apt-get install -y maven")
    _run([mvn, "-q", "-B", "-f", str(pom), "dependency:copy-dependencies",
          "-DincludeScope=runtime", f"-DoutputDirectory={lib}"], "fetching Kafka's jars")
    stamp.write_text(fetched_for + "\n")
    return f"Kafka's jars in {lib}"


def _newest(tree: Path) -> float:
    return max((p.stat().st_mtime for p in tree.rglob("*") if p.is_file()), default=0.0)


def platform() -> str:
    root = settings.ROOT
    if settings.CHECKOUT is None:     # installed: build in a copy of the shipped files in the cache
        root = settings.shipped_copy()
        stamp = root / settings.SHIPPED_STAMP
        if not stamp.is_file() or stamp.read_text() != settings.shipped_stamp():
            shutil.rmtree(root, ignore_errors=True)
            shutil.copytree(settings.PACKAGE / "_shipped", root)
    jar, src = root / JAR, root / "stacks" / "reference-platform"
    if jar.is_file() and jar.stat().st_mtime >= max(_newest(src / "src"), (src / "pom.xml").stat().st_mtime):
        msg = f"already built: {jar}"
    else:
        _need("java", "install OpenJDK 17: apt-get install -y openjdk-17-jdk-headless")
        mvn = _need("mvn", "install Maven: apt-get install -y maven")
        _run([mvn, "-q", "-B", "-f", str(src / "pom.xml"), "-DskipTests", "package"], "building the reference platform")
        jar.touch()
        msg = f"built {jar}"
    if settings.CHECKOUT is None:
        (root / settings.SHIPPED_STAMP).write_text(settings.shipped_stamp())   # ROOT is this copy from now on
    return msg


def loadgen() -> str:
    try:
        return f"ready: {ensure_loadgen()}"     # built now, or already (its sources unchanged)
    except LoadgenBuildError as e:
        raise SetupError(" ".join(str(e).split())[:300]) from None


def k8s() -> str:
    tool = settings.ROOT / "tools" / "build-k8s"
    if not tool.is_file():
        raise SetupError("tools/build-k8s is not there (the single-node Kubernetes cluster is built from a checkout "
                         "of monsoon: `make k8s`)")
    _run(["bash", str(tool)], "tools/build-k8s")
    return "ok"


def images() -> str:
    """monsoon's container images (tools/build-images), after what they hold: Docker, Kafka's jars, the platform's
    jar, Toxiproxy."""
    if settings.CHECKOUT is None:
        raise SetupError("the container images are built from a checkout of monsoon: `make images` in it")
    for need in ("docker", "kafka", "platform", "toxiproxy"):
        RUN[need]()
    _run(["bash", str(settings.CHECKOUT / "tools" / "build-images")], "tools/build-images",
         env={**os.environ, settings.CACHE_ENV: str(settings.cache_dir()), "PYTHON": sys.executable})
    return "ok"


RUN: dict[str, Callable[[], str]] = {
    "kafka": kafka, "postgres": _script("install-debs", "postgres"), "mosquitto": _script("install-debs", "mosquitto"),
    "chromium": _script("install-debs", "chromium"), "debs": _script("install-debs"),
    "platform": platform,
    "toxiproxy": _script("install-toxiproxy"), "ferretdb": _script("install-ferretdb"),
    "infinispan": _script("install-infinispan"), "cassandra": _script("install-cassandra"), "loadgen": loadgen,
    "docker": _script("install-docker"), "images": images, "k8s": k8s,
}


def setup(pieces: list[str], say: Callable[[str], None] = print) -> int:
    """Set up each piece (all but images and k8s when none is named: debs stands for postgres, mosquitto and
    chromium); 0 when every one is done."""
    names = list(pieces) or [p for p in PIECES if p not in ("images", "k8s", "postgres", "mosquitto", "chromium")]
    unknown = [p for p in names if p not in RUN]
    if unknown:
        say(f"monsoon setup: unknown piece {unknown[0]!r} (pieces: {', '.join(PIECES)})")
        return 2
    failed = 0
    for name in names:
        try:
            say(f"monsoon setup {name}: {RUN[name]()}")
        except SetupError as e:
            say(f"monsoon setup {name}: {e}")
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(setup(sys.argv[1:]))
