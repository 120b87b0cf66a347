"""Where monsoon finds things, in one place: the user's project, the specs, the runs, the cache.

The **project** is the user's repository: the pytest rootdir inside pytest; for the ``monsoon`` command its
``--project DIR``, else the current directory upwards to a ``pyproject.toml``/``pytest.ini``/``setup.cfg``/
``tox.ini`` (else the current directory). Stacks, experiments and fault profiles are found by name in, in order:
the folders of ``monsoon_specs``/``--monsoon-specs`` (each one's ``stacks/``, ``experiments/``,
``fault-profiles/``, or the folder itself), the project's ``stacks/``, ``experiments/``, ``fault-profiles/``,
then the ones monsoon ships (:data:`ROOT`). Runs go to ``$MONSOON_RUNS_DIR`` or ``<project>/runs`` (the history
database under it), the git commit recorded with a run is the project's, and the cache of downloaded and built
parts is ``$MONSOON_CACHE``, else ``<checkout>/.cache`` in a checkout of monsoon, else ``~/.cache/monsoon``.

This module imports nothing of monsoon and nothing heavy: the pytest plugin reads it in every pytest process.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator

PROFILES = ("quick", "nightly", "full")

PACKAGE = Path(__file__).resolve().parent
CHECKOUT: Path | None = (PACKAGE.parent if (PACKAGE.parent / "pyproject.toml").is_file()
                         and (PACKAGE.parent / "stacks" / "bin").is_dir() else None)
"""monsoon's own source tree when monsoon runs from a checkout (``make venv``'s editable install), else None."""

SHIPPED_STAMP = ".monsoon-shipped"


def shipped_stamp() -> str:
    """Which installed package a copy of the shipped files was made from (its path and its files' mtime)."""
    return f"{PACKAGE}:{(PACKAGE / '_shipped').stat().st_mtime_ns if (PACKAGE / '_shipped').exists() else 0}\n"


def shipped_copy() -> Path:
    """Where ``monsoon setup platform`` copies the shipped files of an installed monsoon to build in them."""
    return cache_dir() / "shipped"


def _root() -> Path:
    if CHECKOUT is not None:
        return CHECKOUT
    copy = shipped_copy()
    try:
        if (copy / SHIPPED_STAMP).read_text() == shipped_stamp():
            return copy
    except OSError:
        pass
    return PACKAGE / "_shipped"


ROOT: Path
"""monsoon's own files (``{repo}`` in a stack): its stacks, experiments, fault profiles and service scripts.
In a checkout, the checkout. Installed, they are package data under ``monsoon/_shipped/`` (symlinks to the
checkout's top-level folders, copied into the wheel), or the copy of them in the cache where ``monsoon setup
platform`` built the reference platform (nothing is written into site-packages)."""

FOLDERS = {"stack": "stacks", "experiment": "experiments", "fault profile": "fault-profiles"}
PROJECT_MARKERS = ("pyproject.toml", "pytest.ini", "setup.cfg", "tox.ini")
RUNS_ENV, CACHE_ENV = "MONSOON_RUNS_DIR", "MONSOON_CACHE"
ENV = {   # every environment setting monsoon reads, in one place (labels a run gives its processes are not settings)
    CACHE_ENV: "the cache of downloaded and built parts",
    RUNS_ENV: "the runs directory (after --monsoon-runs-dir / monsoon_runs_dir)",
    "MONSOON_HISTORY_URL": "postgresql://... : a shared run history instead of <runs>/history.sqlite",
    "MONSOON_SERVICE_CPUS": "a CPU quota in cores for every service a stack starts (a cgroup; the load stays outside)",
    "MONSOON_CALIBRATION_DIR": "calibration files (default ~/.cache/monsoon/calibration: the user's cache)",
    "MONSOON_CALIBRATION_MAX_AGE_DAYS": "how old a calibration may be (default 7)",
    "MONSOON_LOADGEN": "a prebuilt monsoon-loadgen binary",
    "MONSOON_KUBE_NAMESPACES": "the namespaces Kubernetes faults may touch (a,b)",
    "MONSOON_DOCKERD_DIR": "monsoon's private Docker daemon's directory (default <cache>/dockerd)",
    "MONSOON_K8S_DIR": "monsoon's single-node cluster's directory (default <cache>/k8s)",
}


def env(name: str) -> str | None:
    """One of monsoon's environment settings (:data:`ENV`), read now (a run may set one for its children);
    empty is unset."""
    if name not in ENV:
        raise KeyError(f"{name} is not one of monsoon's settings")
    return os.environ.get(name) or None


def find_project(start: Path | str | None = None) -> Path:
    """``start`` (default: the current directory) upwards to the first folder with a project marker; else ``start``."""
    here = Path(start or os.getcwd()).resolve()
    for d in (here, *here.parents):
        if any((d / m).is_file() for m in PROJECT_MARKERS):
            return d
    return here


def cache_dir() -> Path:
    """``$MONSOON_CACHE``, else ``<checkout>/.cache`` in a checkout, else ``~/.cache/monsoon``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env)
    return CHECKOUT / ".cache" if CHECKOUT else Path.home() / ".cache" / "monsoon"


ROOT = _root()


@dataclass(frozen=True)
class Settings:
    project: Path | None = None          # None: found from the current directory when asked
    specs: tuple[Path, ...] = ()         # monsoon_specs / --monsoon-specs, relative to the project
    runs: Path | None = None             # --monsoon-runs-dir / monsoon_runs_dir

    @property
    def project_dir(self) -> Path:
        return self.project if self.project is not None else find_project()

    def spec_dirs(self, kind: str) -> list[Path]:
        """The folders a ``kind`` (stack, experiment, fault profile) is looked up in by name, first match wins."""
        sub = FOLDERS[kind]
        out: list[Path] = []
        for d in self.specs:
            d = d if d.is_absolute() else self.project_dir / d
            out.append(d / sub if (d / sub).is_dir() else d)
        out += [self.project_dir / sub, ROOT / sub]
        seen, uniq = set(), []
        for d in out:
            key = d.resolve() if d.exists() else d
            if key not in seen:
                seen.add(key)
                uniq.append(d)
        return uniq

    @property
    def runs_dir(self) -> Path:
        """``--monsoon-runs-dir``/``monsoon_runs_dir``, else ``$MONSOON_RUNS_DIR``, else ``<project>/runs``."""
        if self.runs is not None:
            return self.runs if self.runs.is_absolute() else self.project_dir / self.runs
        env = os.environ.get(RUNS_ENV)
        return Path(env) if env else self.project_dir / "runs"

    @property
    def cache(self) -> Path:
        return cache_dir()


_current = Settings()


def current() -> Settings:
    return _current


def configure(**changes) -> Settings:
    """Replace the settings (``project``, ``specs``, ``runs``); returns the previous ones (give them back to
    :func:`restore` when done: the pytest plugin does at ``pytest_unconfigure``)."""
    global _current
    previous = _current
    for k in ("project", "runs"):
        if changes.get(k) is not None:
            changes[k] = Path(changes[k])
    if "specs" in changes:
        changes["specs"] = tuple(Path(p) for p in changes["specs"] or ())
    _current = replace(_current, **changes)
    return previous


def restore(previous: Settings) -> None:
    global _current
    _current = previous


@contextmanager
def using(**changes) -> Iterator[Settings]:
    previous = configure(**changes)
    try:
        yield _current
    finally:
        restore(previous)


def runs_dir(explicit: Path | str | None = None) -> Path:
    """The runs directory: ``explicit`` when given, else the settings' (the one default, for every caller)."""
    return Path(explicit) if explicit else current().runs_dir
