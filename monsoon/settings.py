"""Where monsoon finds things, in one place: the user's project, the specs, the runs, the cache.

The **project** is the user's repository: the pytest rootdir inside pytest when an ini file fixed it, else the
rootdir upwards to a ``pyproject.toml``/``pytest.ini``/``setup.cfg``/``tox.ini`` (:func:`project_of`). The
``monsoon`` command decides it the same way (:func:`for_command`: pytest's own ini finder, from ``--project DIR``
or the current directory) and reads the same ini keys (:data:`INI`), so both doors see the same project. Stacks, experiments and fault profiles are found by name in, in order:
the folders of ``monsoon_specs``/``--monsoon-specs`` (each one's ``stacks/``, ``experiments/``,
``fault-profiles/``, or the folder itself), the project's ``stacks/``, ``experiments/``, ``fault-profiles/``,
then the ones monsoon ships (:data:`ROOT`). Runs go to ``$MONSOON_RUNS_DIR`` or ``<project>/runs`` (the history
database under it), the git commit recorded with a run is the project's, and the cache of downloaded and built
parts is ``$MONSOON_CACHE``, else ``<checkout>/.cache`` in a checkout of monsoon, else ``~/.cache/monsoon``.

This module imports nothing of monsoon and nothing heavy (pytest's ini finder, which a pytest process has loaded
already): the pytest plugin reads it in every pytest process, and it is itself a pytest plugin that only registers
the ini keys (:func:`pytest_addoption`).
"""
from __future__ import annotations

import os
import shlex
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Sequence

from _pytest.config.argparsing import Parser
from _pytest.config.findpaths import determine_setup   # pytest's ini finder (pytest has it loaded already)

from monsoon import options as opt

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
INI = {   # the keys monsoon reads from pytest's ini file: name -> (help, pytest's ini type, default)
    "monsoon_profile": (f"default {opt.PROFILE}", "string", "quick"),
    "monsoon_runs_dir": (f"default {opt.RUNS_DIR}", "string", ""),
    "monsoon_specs": (f"default {opt.SPECS}: folders of specs, relative to the ini file", "paths", []),
}
RUNS_ENV, CACHE_ENV = "MONSOON_RUNS_DIR", "MONSOON_CACHE"
ENV = {   # every environment setting monsoon reads, in one place (labels a run gives its processes are not settings)
    CACHE_ENV: "the cache of downloaded and built parts",
    RUNS_ENV: f"the runs directory (after {opt.RUNS_DIR} / monsoon_runs_dir)",
    "MONSOON_HISTORY_URL": "postgresql://... : a shared run history instead of <runs>/history.sqlite",
    "MONSOON_SERVICE_CPUS": "a CPU quota in cores for every service a stack starts (a cgroup; the load stays outside)",
    "MONSOON_CALIBRATION_DIR": "calibration files (default ~/.cache/monsoon/calibration: the user's cache)",
    "MONSOON_CALIBRATION_MAX_AGE_DAYS": "how old a calibration may be (default 7)",
    "MONSOON_LOADGEN": "a prebuilt monsoon-loadgen binary",
    "MONSOON_KUBE_NAMESPACES": "the namespaces Kubernetes faults may touch (a,b)",
    "MONSOON_DOCKERD_DIR": "monsoon's private Docker daemon's directory (default <cache>/dockerd)",
    "MONSOON_K8S_DIR": "monsoon's single-node cluster's directory (default <cache>/k8s)",
    "MONSOON_CHAOS_CHARTS": "a clone of github.com/litmuschaos/chaos-charts that litmus: {chart: ...} names "
                            "(default <cache>/litmus/chaos-charts)",
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


def pytest_addoption(parser: Parser) -> None:
    """monsoon's ini keys (:data:`INI`), registered by the plugin and by this module alone: ``-p no:monsoon``
    switches the plugin off, and an ini file that still sets ``monsoon_specs`` would warn ``Unknown config option``
    (an error under ``--strict-config``) unless this module is a plugin too (its own ``pytest11`` entry point,
    ``monsoon-ini``, or ``-p monsoon.settings``). It adds nothing else."""
    for name, (text, kind, default) in INI.items():
        parser.addini(name, text, type=kind, default=default)  # type: ignore[arg-type]


def project_of(rootdir: Path, inipath: Path | None) -> Path:
    """The project for pytest's ``rootdir`` and ini file: the rootdir when an ini file fixed it, else the rootdir
    upwards to a project marker. The plugin and the ``monsoon`` command both decide it here."""
    return rootdir if inipath is not None else find_project(rootdir)


def read_ini(start: Path | str | None = None) -> tuple[Path, Path | None, dict[str, object]]:
    """What a ``pytest`` started in ``start`` (default: the current directory) with no arguments takes as its
    rootdir and ini file, and monsoon's keys (:data:`INI`) in that file, found by pytest's own code."""
    here = Path(start or os.getcwd()).resolve()
    try:
        found = determine_setup(inifile=None, override_ini=None, args=[], rootdir_cmd_arg=None, invocation_dir=here)
    except TypeError:   # pytest 8: no override_ini (and plain values, not ConfigValue)
        found = determine_setup(inifile=None, args=[], rootdir_cmd_arg=None, invocation_dir=here)  # type: ignore[call-arg]
    rootdir, inipath, cfg = found[0], found[1], found[2]
    return rootdir, inipath, {k: getattr(v, "value", v) for k, v in cfg.items() if k in INI}


def ini_paths(value: object, base: Path) -> list[Path]:
    """An ini value of type ``paths`` as pytest's ``getini`` gives it: a list (TOML) or a shell-split string,
    each relative to ``base`` (the ini file's folder)."""
    items = shlex.split(value) if isinstance(value, str) else [str(x) for x in value] if isinstance(value, list) else []
    return [base / x for x in items]


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
    inipath: Path | None = None          # the ini file these came from (pytest's), if any

    @property
    def project_dir(self) -> Path:
        return self.project if self.project is not None else find_project()

    def spec_dirs(self, kind: str) -> list[Path]:
        """The folders a ``kind`` (stack, experiment, fault profile) is looked up in by name, first match wins."""
        sub = FOLDERS[kind]
        out: list[Path] = []
        for d in self.specs:
            d = d if d.is_absolute() else self.project_dir / d
            out.append(spec_folder(d, kind))
        out += [self.project_dir / sub, ROOT / sub]
        seen, uniq = set(), []
        for d in out:
            key = d.resolve() if d.exists() else d
            if key not in seen:
                seen.add(key)
                uniq.append(d)
        return uniq

    def find(self, kind: str, name: str) -> Path | None:
        """``<dir>/<name>.yaml`` in the first of :meth:`spec_dirs` that has it, else None (what a run finds)."""
        return next((d / f"{name}.yaml" for d in self.spec_dirs(kind) if (d / f"{name}.yaml").is_file()), None)

    def project_folders(self, kind: str) -> list[Path]:
        """:meth:`spec_dirs` that exist and are the project's, not monsoon's shipped ones."""
        own = (ROOT / FOLDERS[kind]).resolve()
        return [d for d in self.spec_dirs(kind) if d.is_dir() and d.resolve() != own]

    def shadowed(self) -> list[tuple[str, Path, Path]]:
        """(kind, the project's file, the shipped file it hides) for each project spec named like a shipped one."""
        out = []
        for kind, sub in FOLDERS.items():
            shipped = ROOT / sub
            for name in sorted({p.stem for d in self.project_folders(kind) for p in d.glob("*.yaml")}):
                mine = self.find(kind, name)
                if mine is not None and (shipped / f"{name}.yaml").is_file() and mine.parent.resolve() != shipped.resolve():
                    out.append((kind, mine, shipped / f"{name}.yaml"))
        return out

    def shadow_note(self) -> str | None:
        """One line naming every project spec that hides a shipped one of the same name (None: none does)."""
        found = self.shadowed()
        if not found:
            return None
        base = self.project_dir
        def shown(p: Path) -> str:
            try:
                return str(p.resolve().relative_to(base.resolve()))
            except ValueError:
                return str(p)
        return ("monsoon: the project's specs shadow monsoon's shipped ones of the same name (the project's are "
                "used): " + ", ".join(f"{kind} {mine.stem} ({shown(mine)})" for kind, mine, _ in found))

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


def spec_folder(d: Path, kind: str) -> Path:
    """Where a spec folder keeps its ``kind``: its ``stacks/`` (``experiments/``, ``fault-profiles/``), else itself."""
    return d / FOLDERS[kind] if (d / FOLDERS[kind]).is_dir() else d


def for_command(project: Path | str | None = None, specs: Sequence[Path | str] | None = None,
                runs: Path | str | None = None) -> Settings:
    """The settings of the ``monsoon`` command, decided as the pytest plugin decides them for a ``pytest``
    started in the same place: the ini file pytest would read (from ``project``, else the current directory),
    the project (:func:`project_of`; ``project`` when given), then ``specs`` (``--specs``) else the ini's
    ``monsoon_specs`` (relative to the ini file), ``runs`` else the ini's ``monsoon_runs_dir``."""
    here = Path(project).resolve() if project is not None else Path(os.getcwd()).resolve()
    rootdir, inipath, ini = read_ini(here)
    where = here if project is not None else project_of(rootdir, inipath)
    chosen = tuple(Path(p) for p in specs) if specs else tuple(
        ini_paths(ini.get("monsoon_specs"), inipath.parent if inipath is not None else here))
    ini_runs = ini.get("monsoon_runs_dir")
    return Settings(project=where, specs=chosen, inipath=inipath,
                    runs=Path(runs) if runs else Path(ini_runs) if isinstance(ini_runs, str) and ini_runs else None)


_current = Settings()


def current() -> Settings:
    return _current


def configure(**changes) -> Settings:
    """Replace the settings (``project``, ``specs``, ``runs``, ``inipath``); returns the previous ones (give them back to
    :func:`restore` when done: the pytest plugin does at ``pytest_unconfigure``)."""
    global _current
    previous = _current
    for k in ("project", "runs", "inipath"):
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
