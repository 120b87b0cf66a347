"""monsoon's pytest plugin: markers, options, the ``monsoon`` fixture, the sign-off checklist.

Only hooks, options and fixtures live here; the logic is in plain modules.

The ``pytest11`` entry point loads this module in every pytest process, used or not: at import and at
configure it imports nothing heavy (only :mod:`monsoon.settings` and the hook specs) and changes nothing global.
The session (and with it the runner, the load engine, Kafka, matplotlib, ...) is built the first time a test asks
for the ``monsoon`` fixture; only then is SIGTERM turned into an interrupt, and the previous handler is put
back at ``pytest_unconfigure``. ``-p no:monsoon`` switches the plugin off.
"""
from __future__ import annotations

import signal
import threading
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, Callable, TextIO, cast

import pytest

from monsoon import hookspec, settings
from monsoon import options as opt
from monsoon.rundir import CHECKLIST_FILE, REPORT_FILE, SUMMARY_FILE
from monsoon.settings import PROFILES

if TYPE_CHECKING:
    from monsoon.report.result import ExperimentResult
    from monsoon.session import MonsoonSession


MARKERS = {
    "burst": "burst: x3/x10 burst-flood scenario (monsoon); select with -m burst",
    "soak": "soak: long steady-load scenario with periodic faults (monsoon); select with -m soak",
    "sweep": "sweep: capacity ramps, the size sweep (capacity per payload size beside the transport's) and the "
             "request mix (reads, searches, writes, modifies) (monsoon); select with -m sweep",
    "chaos": "chaos: scenario that injects faults (monsoon); select with -m chaos",
    "docker": "docker: scenario on a container stack (provider: docker); select with -m docker",
    "kubernetes": "kubernetes: scenario on a stack in Kubernetes form (provider: kubernetes) in monsoon's cluster; "
                  "select with -m kubernetes",
    "cassandra": "cassandra: scenario on a Cassandra stack (kafka-cassandra, cassandra-ack); select with -m cassandra",
    "integration": "integration: monsoon self-test on real services (Kafka, Postgres, the reference platform)",
}
SESSION_KEY = pytest.StashKey["MonsoonSession"]()
MAKE_SESSION = pytest.StashKey[Any]()        # builds the session on first use (the ``monsoon`` fixture)
RESTORE = pytest.StashKey[list[Callable[[], Any]]]()            # what pytest_unconfigure puts back: settings, the SIGTERM handler
DESELECTED = pytest.StashKey[dict]()   # mark -> scenarios a bare pytest left out (soak, sweep)
ASKED_FOR = ("soak", "sweep")          # marks whose scenarios run only when asked for
COMPARE_KEY = pytest.StashKey[tuple]()   # (baseline: "last" | run id, rules) of --monsoon-compare(-fail)


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("monsoon", "monsoon chaos and soak testing")
    g.addoption(opt.PROFILE, choices=PROFILES, default=None,
                help="durations profile of every experiment: quick (minutes), nightly, full (hours). "
                     "Default: ini monsoon_profile or quick.")
    g.addoption(opt.RUNS_DIR, default=None,
                help="where run directories go (default: ini monsoon_runs_dir, else MONSOON_RUNS_DIR, else "
                     "<rootdir>/runs)")
    g.addoption(opt.SPECS, action="append", default=None, metavar="DIR",
                help="look stacks, experiments and fault profiles up by name in DIR (its stacks/, experiments/, "
                     "fault-profiles/, or DIR itself) before <rootdir>'s and monsoon's own; repeatable. "
                     "Default: ini monsoon_specs")
    g.addoption(opt.RUN_ID, default=None, help="use this run id instead of a timestamped one")
    g.addoption(opt.DRY_RUN, action="store_true", default=False,
                help="validate every stack, experiment and fault, print what would be started and injected "
                     "(Kubernetes manifests included), and skip the scenarios: nothing is started")
    g.addoption(opt.FORCE, action="store_true", default=False,
                help="run experiments past monsoon's sanity ceilings (a multiplier above x100); the machine's "
                     "own limits (open files, ports, generator rate) still apply")
    g.addoption(opt.COMPARE, default=None, metavar="last|RUN_ID",
                help="compare each result's figures with a baseline run from the history: the last comparable run "
                     f"of the same stack x experiment, or RUN_ID (same profile and host class unless {opt.FORCE})")
    g.addoption(opt.COMPARE_FAIL, default=None, metavar="EXPR",
                help=f"with {opt.COMPARE}: fail on these regressions, e.g. 'recovery_s:+20%%,peak_lag:+50%%,"
                     "acked_lost:>0' (+P%%/-P%%: rose/fell more than P%% of the baseline; +N/-N: by more than N; "
                     ">N/<N: above/below N)")
    g.addoption(opt.NO_HISTORY, action="store_true", default=False,
                help="do not record this session's results in the run history (MONSOON_HISTORY_URL or "
                     "<runs>/history.sqlite)")
    settings.pytest_addoption(parser)   # the ini keys: monsoon_profile, monsoon_runs_dir, monsoon_specs


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS.values():
        config.addinivalue_line("markers", line)
    profile = config.getoption(opt.PROFILE) or config.getini("monsoon_profile") or "quick"
    if profile not in PROFILES:
        raise pytest.UsageError(f"monsoon_profile = {profile!r}: choose one of {', '.join(PROFILES)}")
    runs = config.getoption(opt.RUNS_DIR) or config.getini("monsoon_runs_dir") or None
    specs = config.getoption(opt.SPECS) or config.getini("monsoon_specs")
    # the user's project is the root: specs, runs and the recorded commit (put back at pytest_unconfigure)
    project = settings.project_of(config.rootpath, config.inipath)   # the monsoon command's rule too
    prev = settings.configure(project=project, specs=specs, runs=runs, inipath=config.inipath)
    config.stash[RESTORE] = [lambda: settings.restore(prev)]   # what configure() replaced, put back
    compare_to, fail_expr = config.getoption(opt.COMPARE), config.getoption(opt.COMPARE_FAIL)
    if compare_to is not None or fail_expr:
        from monsoon.history.compare import CompareError, parse_baseline, parse_rules
        try:   # a bad expression is one line before anything starts
            rules = parse_rules(fail_expr) if fail_expr else []
            config.stash[COMPARE_KEY] = (parse_baseline(compare_to or "last"), rules)
        except CompareError as e:
            raise pytest.UsageError(str(e)) from None
    config.stash[MAKE_SESSION] = lambda: _make_session(config, profile)


def _make_session(config: pytest.Config, profile: str) -> "MonsoonSession":
    """The session, built when a test first asks for it: the heavy imports happen here, and SIGTERM becomes
    an interrupt from now until pytest_unconfigure."""
    from monsoon.checks.registry import CheckRegistry
    from monsoon.run.shield import sigterm_as_interrupt
    from monsoon.session import MonsoonSession

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
            if tr is None:      # isatty() is False then: the live panel never writes here
                raise RuntimeError("the live load panel writes to pytest's terminal reporter, and there is none")
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

    def on_result(result, session) -> None:
        config.pluginmanager.hook.pytest_monsoon_result(result=result, session=session)

    checks = CheckRegistry()   # this session's: the built-in checks and those the hook registers
    config.pluginmanager.hook.pytest_monsoon_add_checks(register=checks.register)
    session = MonsoonSession(profile=profile, run_id=config.getoption(opt.RUN_ID), progress=progress,
                             dry_run=config.getoption(opt.DRY_RUN),
                             live=cast(TextIO, Terminal()),   # write, flush, isatty: all the live panel uses
                             on_result=on_result, force=config.getoption(opt.FORCE), checks=checks)
    session.no_history = config.getoption(opt.NO_HISTORY)
    note = settings.current().shadow_note()   # said once per session, before its first plan
    if note:
        progress(note)
    config.stash[SESSION_KEY] = session
    if threading.current_thread() is threading.main_thread():
        before = signal.getsignal(signal.SIGTERM)
        config.stash[RESTORE].append(lambda: signal.signal(signal.SIGTERM, before))
    sigterm_as_interrupt("monsoon")
    return session


def pytest_unconfigure(config: pytest.Config) -> None:
    """Put back what the plugin changed: the SIGTERM handler of a run and the settings."""
    undos: list[Callable[[], Any]] = config.stash.get(RESTORE, [])
    for undo in reversed(undos):
        undo()
    config.stash[RESTORE] = []


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.add_hookspecs(hookspec)


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    """A scenario's spec error is one line (file:line: key: message) and no traceback; ``result.assert_pass()``
    fails with the numbers and no traceback; after a dry run it skips. Every result's headline figures go to
    the test's JUnit properties (``--junitxml``)."""
    session = pyfuncitem.config.stash.get(SESSION_KEY, None)
    if session is None:      # not a monsoon test: nothing of monsoon's is imported or caught
        return (yield)
    from monsoon.extras import MissingExtra
    from monsoon.report.result import DryRunSkipped, RunFailed, StackUnavailable
    from monsoon.spec.yamlio import SpecError
    before = len(session.results)
    fail = skip = None
    try:
        outcome = yield
    except (SpecError, RunFailed, MissingExtra) as e:
        fail = str(e)
    except (DryRunSkipped, StackUnavailable) as e:
        skip = str(e)
    finally:
        for r in session.results[before:]:
            pyfuncitem.user_properties.extend(junit_properties(r))
    # outside the except: one message, without "During handling of the above exception, another exception occurred"
    if fail is not None:
        pytest.fail(fail, pytrace=False)
    if skip is not None:
        pytest.skip(skip)
    if COMPARE_KEY in pyfuncitem.config.stash:   # --monsoon-compare: regressions fail
        from monsoon.history.compare import CompareError
        from monsoon.history.hooks import check_regressions
        try:
            found = check_regressions(session.runs_dir, session.run_id, session.results[before:],
                                      *pyfuncitem.config.stash[COMPARE_KEY],
                                      force=pyfuncitem.config.getoption(opt.FORCE), note=session.progress)
        except CompareError as e:
            found = [str(e)]
        if found:
            pytest.fail("\n".join(found), pytrace=False)
    return outcome


def pytest_monsoon_result(result: "ExperimentResult", session: "MonsoonSession") -> None:
    """monsoon's own: each result goes into the run history as soon as it is judged."""
    if result.verdict == "skipped" or session.dry_run or getattr(session, "no_history", False):
        return
    from monsoon.history.hooks import record
    warning = record(session.runs_dir, session.run_id, session.profile, [result.to_dict()], session.run_dir)
    if warning:
        session.progress(warning)


def junit_properties(result: "ExperimentResult") -> list[tuple[str, object]]:
    """``monsoon.<stack>.<experiment>.<figure>`` = value for the verdict and every headline figure."""
    key = f"monsoon.{result.stack}.{result.experiment}"
    return [(f"{key}.verdict", result.verdict)] + [(f"{key}.{k}", v) for k, v in result.headline().items()]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A bare ``pytest`` (no ``-m``, no paths: the ``testpaths``) starts no soak and no size sweep: they run
    when asked for, ``pytest -m soak`` / ``pytest -m sweep`` or by naming their file."""
    if config.option.markexpr or config.args_source != pytest.Config.ArgsSource.TESTPATHS:
        return
    left: dict[str, int] = {}
    for mark in ASKED_FOR:
        out = [i for i in items if i.get_closest_marker(mark) is not None]
        if out:
            items[:] = [i for i in items if i.get_closest_marker(mark) is None]
            config.hook.pytest_deselected(items=out)
            left[mark] = len(out)
    config.stash[DESELECTED] = left


@pytest.fixture(scope="session")
def docker_daemon(pytestconfig: pytest.Config):
    """A Docker daemon for container stacks (provider: docker): DOCKER_HOST's, or monsoon's private one started
    for the session and stopped after it; the test skips in one line when there is none to start. A dry run
    (``--monsoon-dry-run``) starts none: it yields None (the scenarios only print what they would start)."""
    if pytestconfig.getoption(opt.DRY_RUN):
        yield None
        return
    from monsoon.stack import dockerd
    with ExitStack() as stack:
        try:
            host = stack.enter_context(dockerd.ensure())
        except dockerd.DockerdError as e:
            pytest.skip(f"no Docker daemon: {str(e).splitlines()[0]} (`make setup` installs Docker)")
        yield host


@pytest.fixture
def monsoon(request: pytest.FixtureRequest) -> "MonsoonSession":
    """The monsoon session: ``monsoon.run(stack, experiment)`` runs an experiment and returns its result;
    ``monsoon.sweep(stack, experiment)`` runs a size sweep (``load.payload.sizes``) and returns its result."""
    session = request.config.stash.get(SESSION_KEY, None)
    return session if session is not None else request.config.stash[MAKE_SESSION]()


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    for mark, n in config.stash.get(DESELECTED, {}).items():
        terminalreporter.write_line(f"monsoon: {n} {mark} scenario(s) deselected by a bare "
                                    f"`pytest`: run them with `pytest -m {mark}`")
    session = config.stash.get(SESSION_KEY, None)
    if session is None or not session.results:
        return
    written = session.write_report()
    if not written:
        return
    _, md = written
    terminalreporter.section("monsoon sign-off checklist")
    if session.interrupted:
        from monsoon.report.checklist import describe_interruption
        i = session.interrupted
        terminalreporter.write_line(f"monsoon: the session was {describe_interruption(i)} in {i['stack']} / "
                                    f"{i['experiment']}: every fault was healed and every process stopped; "
                                    f"the checklist judges the data up to then", yellow=True, bold=True)
    for line in md.splitlines():
        terminalreporter.write_line(line)
    terminalreporter.write_line(f"run directory: {session.run_dir}  ({SUMMARY_FILE}, {CHECKLIST_FILE}, {REPORT_FILE}, "
                                "timelines, logs)")
