"""monsoon's pytest plugin: markers, options, the ``monsoon`` fixture, the sign-off checklist.

Only hooks, options and fixtures live here; the logic is in plain modules.
"""
from __future__ import annotations

import signal
import threading
from pathlib import Path

import pytest

from .session import MonsoonSession
from .specs import PROFILES

MARKERS = {
    "burst": "burst: x3/x10 burst-flood scenario (monsoon); select with -m burst",
    "soak": "soak: long steady-load scenario with periodic faults (monsoon); select with -m soak",
    "chaos": "chaos: scenario that injects faults (monsoon); select with -m chaos",
    "integration": "integration: monsoon self-test on real services (Kafka, Postgres, the reference platform)",
}
SESSION_KEY = pytest.StashKey[MonsoonSession]()


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("monsoon", "monsoon chaos and soak testing")
    g.addoption("--monsoon-profile", choices=PROFILES, default=None,
                help="durations profile of every experiment: quick (minutes), nightly, full (hours). "
                     "Default: ini monsoon_profile or quick.")
    g.addoption("--monsoon-runs-dir", default=None,
                help="where run directories go (default: ini monsoon_runs_dir or <repo>/runs)")
    g.addoption("--monsoon-run-id", default=None, help="use this run id instead of a timestamped one")
    g.addoption("--monsoon-dry-run", action="store_true", default=False,
                help="validate every stack, experiment and fault, print what would be started and injected "
                     "(Kubernetes manifests included), and skip the scenarios: nothing is started")
    parser.addini("monsoon_profile", "default --monsoon-profile", default="quick")
    parser.addini("monsoon_runs_dir", "default --monsoon-runs-dir", default="")


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS.values():
        config.addinivalue_line("markers", line)
    profile = config.getoption("--monsoon-profile") or config.getini("monsoon_profile") or "quick"
    if profile not in PROFILES:
        raise pytest.UsageError(f"monsoon_profile = {profile!r}: choose one of {', '.join(PROFILES)}")
    runs = config.getoption("--monsoon-runs-dir") or config.getini("monsoon_runs_dir") or None
    if runs and not Path(runs).is_absolute():
        runs = str(config.rootpath / runs)
    lock = threading.Lock()

    def progress(msg: str) -> None:
        tr = config.pluginmanager.get_plugin("terminalreporter")
        capman = config.pluginmanager.get_plugin("capturemanager")
        with lock:
            if tr is None:
                print(msg, flush=True)
            elif capman is not None:
                # progress must reach the terminal while the test's output is captured
                with capman.global_and_fixture_disabled():
                    tr.write_line(msg)
            else:
                tr.write_line(msg)

    class Terminal:
        """The real terminal for the live load panel: each write passes pytest's output capture."""

        def isatty(self) -> bool:
            tr = config.pluginmanager.get_plugin("terminalreporter")
            return tr is not None and tr.isatty

        def write(self, text: str) -> int:
            tr = config.pluginmanager.get_plugin("terminalreporter")
            capman = config.pluginmanager.get_plugin("capturemanager")
            with lock:
                if capman is not None:
                    with capman.global_and_fixture_disabled():
                        tr._tw.write(text, flush=True)
                else:
                    tr._tw.write(text, flush=True)
            return len(text)

        def flush(self) -> None:
            pass

    config.stash[SESSION_KEY] = MonsoonSession(profile=profile, runs_dir=runs,
                                               run_id=config.getoption("--monsoon-run-id"), progress=progress,
                                               dry_run=config.getoption("--monsoon-dry-run"), live=Terminal())
    if threading.current_thread() is threading.main_thread():
        # SIGTERM unwinds like Ctrl-C, so every fault heals and every process stops; during that teardown
        # (final heal, census, stack stop) the runner's TeardownShield holds further SIGINT/SIGTERM back
        def on_term(signum, frame):
            raise KeyboardInterrupt(f"monsoon: received {signal.Signals(signum).name}")
        signal.signal(signal.SIGTERM, on_term)


@pytest.fixture
def monsoon(request: pytest.FixtureRequest) -> MonsoonSession:
    """The monsoon session: ``monsoon.run(stack, experiment)`` runs an experiment and returns its result."""
    return request.config.stash[SESSION_KEY]


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    session = config.stash.get(SESSION_KEY, None)
    if session is None or not session.results:
        return
    written = session.write_report()
    if not written:
        return
    _, md = written
    terminalreporter.section("monsoon sign-off checklist")
    for line in md.splitlines():
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"run directory: {session.run_dir}  (summary.json, checklist.md, report.html, timelines, logs)")
