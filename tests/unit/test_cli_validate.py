"""``monsoon validate``: a file's kind from its content, any encoding read safely, a stack and an experiment
validated together (fault targets, env services, checks against what the stack observes), the shipped files
and every pair a scenario runs; one ``file:line: key: message`` line per problem, never a traceback."""
from __future__ import annotations

import importlib.util
import inspect
import itertools
import re
import textwrap
from pathlib import Path

import pytest
from pytest import ParameterSet

import monsoon.spec.base as spec_base
from monsoon.checks.base import UNKNOWN, RunData
from monsoon.checks.registry import CHECKS
from monsoon.cli import SCENARIO_PAIRS, main as cli_main, shipped_spec_files
from monsoon.paths import REPO
from monsoon.spec.experiment import CHECK_NEEDS
from tests.unit.helpers import RunBuilder

LINE = re.compile(r"^(?P<file>[^:]+):(?P<line>\d+): (?P<rest>.+)$")

STACK = """\
name: s
services:
  db:
    command: ["sh", "run-db", "{port:db}"]   # a program on PATH: validate checks
  app:
    command: sh app --db {port:db} --mqtt {port:mqtt}
    depends_on: [db]
devices: {port: "{port:mqtt}"}
provisioning: none
storage: {dsn: "postgresql://127.0.0.1:{port:db}/x", loss_query: "select 1, 2"}
observe: {service: app}
"""

EXPERIMENT = """\
name: e
load: {devices: 5, base_rate: 100, shape: {kind: burst, multiplier: 10}}
profiles:
  quick: {warmup: 5, burst: 10, recovery: 10}
checks:
  - no_oom
  - no_acked_loss
"""

FAULT = """\
name: app-pause
kind: process-pause
target: app
backend: process
schedule: {at: 5, duration: 3}
"""


def write(folder: Path, name: str, text: str, encoding: str = "utf-8") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / name
    p.write_bytes(textwrap.dedent(text).encode(encoding) if isinstance(text, str) else text)
    return p


def run(capsys, *args: str) -> tuple[int, list[str], str]:
    rc = cli_main(["validate", *args])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    lines = out.splitlines()
    for ln in lines:   # one problem per line, each file:line: ...
        assert LINE.match(ln), ln
    return rc, lines, err


# ------------------------------------------------------------------ kinds from the content

def test_the_kind_comes_from_the_content_not_the_folder(tmp_path, capsys):
    odd = tmp_path / "experiments"     # a folder named like another kind's: it must not matter
    files = [write(odd, "my-stack.yaml", STACK), write(odd, "process-pause.yaml", FAULT),
             write(tmp_path / "stacks", "exp.yaml", EXPERIMENT)]
    rc, lines, err = run(capsys, *map(str, files))
    assert (rc, lines) == (0, []) and "3 file(s): all valid" in err
    bad = write(tmp_path / "stacks", "exp2.yaml", EXPERIMENT.replace("base_rate: 100", "base_rate: 0"))
    rc, lines, _ = run(capsys, str(bad))
    assert rc == 1 and lines == [f"{bad}:2: load.base_rate: Input should be greater than 0 (x1 in msg/s, or auto), "
                                 "got 0"]


def test_it_says_when_it_cannot_tell_what_a_file_is(tmp_path, capsys, monkeypatch):
    neither = write(tmp_path, "n.yaml", "name: x\nchekcs: []\n")
    both = write(tmp_path, "b.yaml", STACK + "load: {devices: 1}\n")
    listing = write(tmp_path, "l.yaml", "- a\n- b\n")
    monkeypatch.setitem(spec_base.FOLDERS, "experiment", tmp_path / "experiments")   # the shipped folder, here
    in_folder = write(tmp_path / "experiments", "no-load.yaml", "name: x\n")
    rc, lines, _ = run(capsys, str(neither), str(both), str(listing), str(in_folder))
    assert rc == 1 and len(lines) == 4
    assert lines[0] == (f"{neither}:1: <top>: cannot tell what this file is: a stack has services:, an experiment load:, "
                        "a fault profile kind:, and it has none of them")
    assert lines[1] == (f"{both}:12: load: cannot tell what this file is: it has services: (a stack) and load: (an "
                        "experiment); a spec file is one of them")
    assert "it holds a list, not a mapping" in lines[2]
    assert lines[3].endswith("it has none of them; it is in experiments/: is load: missing?")


# ------------------------------------------------------------------ any encoding, never a traceback

def test_a_non_utf8_file_is_one_line_with_the_byte_offset_and_the_next_files_are_still_checked(tmp_path, capsys):
    latin = write(tmp_path, "latin.yaml", "name: s\ndescription: caf\xe9\n", encoding="latin-1")
    after = write(tmp_path, "after.yaml", EXPERIMENT.replace("- no_oom", "- no_oomm"))
    rc, lines, err = run(capsys, str(latin), str(after))
    assert rc == 1
    assert lines == [f"{latin}:2: not UTF-8 text: byte 0xe9 at byte offset 24 cannot be decoded (save the file as "
                     "UTF-8)",
                     f"{after}:6: checks.0: unknown check 'no_oomm' (known: {', '.join(sorted(CHECKS))})"]
    assert "2 problem(s)" in err


@pytest.mark.parametrize("encoding", ["utf-8-sig", "utf-16", "utf-32"])
def test_utf8_with_a_bom_and_utf16_or_32_with_one_are_read(tmp_path, capsys, encoding):
    f = write(tmp_path, "s.yaml", STACK.replace("name: s", "name: s\ndescription: café"), encoding=encoding)
    assert run(capsys, str(f))[:2] == (0, [])


@pytest.mark.parametrize("content, expected", [
    (b"\x00\x01\x02\xff\xfe\xfd" * 10, r":1: not UTF-8 text: byte 0xff at byte offset 3"),
    (b"name: x\nload: \x07\n", r":2: invalid YAML: character #x0007 is not allowed"),
    (b"name: [x\n", r":1: invalid YAML: [ opened here is not closed (while parsing a flow sequence, expected ',' or ']', "
                    r"but got '<stream end>' on line 2)"),
    (b"a: 1\n---\nb: 2\n", r":2: invalid YAML: expected a single document in the stream, but found another"),
    (b"name: !!python/object:os.system x\n", r":1: name: tag !!python/object:os.system is not allowed"),
    (b"a: &x [*x]\n", r":1: a.0: alias *x refers to the list or mapping that holds it (a loop)"),
    (b"? [a, b]\n: 1\n", r":1: a key must be a plain value"),
    (b"name: x\nname: y\n", r":2: name: duplicate key"),
    (b"", r":1: <top>: the file is empty"),
])
def test_broken_files_give_one_line_each(tmp_path, capsys, content, expected):
    f = write(tmp_path, "broken.yaml", content)
    rc, lines, _ = run(capsys, str(f))
    assert rc == 1 and len(lines) == 1 and lines[0].startswith(str(f)), lines
    assert re.search(re.escape(expected), lines[0]), lines[0]


def test_missing_files_folders_and_a_shape_that_exits_are_lines_too(tmp_path, capsys):
    (tmp_path / "exits.py").write_text("import sys\nsys.exit(3)\n")
    shaped = write(tmp_path / "exps", "e.yaml", EXPERIMENT.replace("{kind: burst, multiplier: 10}",
                                                                    "{kind: python, file: ../exits.py, function: f}"))
    write(tmp_path / "exps", "ok.yaml", EXPERIMENT)
    rc, lines, err = run(capsys, str(tmp_path / "nope.yaml"), str(tmp_path / "exps"))
    assert rc == 1 and "3 file(s)" in err
    assert lines[0] == f"{tmp_path / 'nope.yaml'}:1: file not found"
    assert lines[1].startswith(f"{shaped}:") and "SystemExit" in lines[1], lines


def test_stack_and_experiment_go_together(capsys):
    assert cli_main(["validate", "--stack", "kafka"]) == 2
    assert "--stack and --experiment go together" in capsys.readouterr().err


# ------------------------------------------------------------------ a stack and an experiment together

def test_a_pair_is_validated_as_a_run_would_have_it(capsys):
    assert run(capsys, "--stack", "kafka", "--experiment", "defect-d-stall")[:2] == (0, [])
    rc, lines, err = run(capsys, "--stack", "inmemory", "--experiment", "defect-d-stall")
    assert rc == 1 and "0 file(s) and 1 stack/experiment pair(s): 2 problem(s)" in err
    exp = REPO / "experiments" / "defect-d-stall.yaml"
    text = exp.read_text().splitlines()
    faults_line = text.index("faults:") + 2
    checks_line = text.index("checks:") + 2
    assert LINE.match(lines[0])["file"] in (str(exp), "experiments/defect-d-stall.yaml")
    assert f":{faults_line}: faults.0: fault profile 'kafka-broker-restart': " in lines[0]
    assert "target: unknown service 'kafka' (the stack has: platform, postgres)" in lines[0]
    assert f":{checks_line}: checks.0: consumer_not_stalled reads per-partition Kafka offsets (observe.kafka); " \
           "stack 'inmemory'" in lines[1] and lines[1].endswith("observes none of it, so the check could only say "
                                                                "unknown")


def pair(tmp_path, capsys, stack_text: str, exp_text: str, *extra: str):
    s = write(tmp_path, "stack.yaml", stack_text)
    e = write(tmp_path, "exp.yaml", exp_text)
    return run(capsys, "--stack", str(s), "--experiment", str(e), *extra)


@pytest.mark.parametrize("observe, check, refused", [
    ("{service: app}", "lag_recovers_within: {seconds: 30}", True),
    ("{service: app, metrics_url: 'http://127.0.0.1:{port:m}/metrics', metrics: {queue_depth: q}}",
     "lag_recovers_within: {seconds: 30}", False),
    ("{service: app, kafka: {bootstrap: '127.0.0.1:{port:k}', group: g}}", "lag_bounded: {max: 10}", False),
    ("{service: app, metrics_url: 'http://127.0.0.1:{port:m}/metrics', metrics: {heap_max: h}}",
     "lag_bounded: {max: 10}", True),
    ("{service: app, metrics_url: 'http://127.0.0.1:{port:m}/metrics', metrics: {queue_depth: q}}",
     "consumer_not_stalled", True),
    ("{}", "no_thread_leak", True),
    ("{}", "no_memory_leak", False),      # a GC log the launcher writes would do: not a clear impossibility
    ("{}", "gc_time_fraction", False),
    ("{}", "no_oom: {min_headroom_pct: 10}", False),
])
def test_each_check_is_refused_only_where_the_stack_cannot_observe_what_it_reads(tmp_path, capsys, observe, check,
                                                                                refused):
    stack = STACK.replace("observe: {service: app}", f"observe: {observe}") + "ports: {m: auto, k: auto}\n"
    rc, lines, _ = pair(tmp_path, capsys, stack,
                        EXPERIMENT.replace("  - no_acked_loss\n", f"  - {check}\n"))
    assert rc == int(refused), lines
    if refused:
        (line,) = lines
        assert line.startswith(f"{tmp_path / 'exp.yaml'}:7: checks.1: {check.split(':')[0]} reads "), line
        assert "stack 's'" in line


def test_a_pair_names_an_unknown_env_service_and_an_unknown_fault_target(tmp_path, capsys):
    rc, lines, _ = pair(tmp_path, capsys, STACK, EXPERIMENT + "env: {platform: {X: 1}}\n")
    assert rc == 1 and lines == [f"{tmp_path / 'exp.yaml'}:8: env: no service platform in stack 's' (it has: db, app)"]
    rc, lines, _ = pair(tmp_path, capsys, STACK,
                        EXPERIMENT + "faults:\n  - {profile: process-pause, target: kafka}\n")
    assert rc == 1 and len(lines) == 1
    assert lines[0].startswith(f"{tmp_path / 'exp.yaml'}:9: faults.0.target: ")   # the experiment's override
    assert "unknown service 'kafka' (the stack has: app, db) (overrides fault profile 'process-pause')" in lines[0]


def test_a_profile_the_experiment_lacks_is_named(tmp_path, capsys):
    rc, lines, _ = pair(tmp_path, capsys, STACK, EXPERIMENT, "--profile", "full")
    assert rc == 1 and "experiment 'e' has no 'full' profile (has: quick)" in lines[0]


def test_what_each_check_needs_is_true_of_the_check(tmp_path):
    """CHECK_NEEDS refuses a check only when the stack cannot give it a signal: prove each entry on a run that
    has every other signal but none of the ones it lists, where the check can only say unknown."""
    signals = {"kafka": lambda b, t: b.kafka(t, {"q-0": (100 * t, 100 * t - 5)}),
               "metrics.queue_depth": lambda b, t: b.metrics(t, queue_depth=5.0),
               "process": lambda b, t: b.process(t, rss_mb=100 + t)}
    params = {"lag_recovers_within": {"seconds": 30}, "lag_bounded": {"max": 1000}}
    assert set(CHECK_NEEDS) <= set(CHECKS)
    for i, (name, (needs, _)) in enumerate(CHECK_NEEDS.items()):
        assert set(needs) <= set(signals), name
        b = RunBuilder(tmp_path / f"r{i}").phases(10, 20, 30).service_start()
        for t in range(60):
            b.load(t, 100, 100)
            b.metrics(t, heap_used=1e6, heap_max=1e8)
            for sig, add in signals.items():
                if sig not in needs:
                    add(b, float(t))
        b.ev("op", 60.0, op="load-end")
        v = CHECKS[name](RunData(b.write()), **params.get(name, {}))
        assert v.verdict == UNKNOWN, (name, v)


# ------------------------------------------------------------------ everything shipped

def test_with_no_argument_every_shipped_file_and_scenario_pair_validates(capsys):
    rc, lines, err = run(capsys)
    assert (rc, lines) == (0, []), lines
    n = len(shipped_spec_files())
    assert f"{n} file(s) and {len(SCENARIO_PAIRS)} stack/experiment pair(s): all valid" in err
    assert n == sum(len(list((REPO / f).glob("*.yaml"))) for f in ("stacks", "experiments", "fault-profiles"))


class _Check:
    verdict, figures, message = "pass", {}, ""


class _Result:
    """What ``monsoon.run`` returns, as a dry run: the scenario skips or asserts nothing of substance."""
    dry_run = "recorded by tests/unit/test_cli_validate.py"
    checks: list = []

    def assert_pass(self) -> None:
        pass

    def check(self, name: str) -> _Check:
        return _Check()

    def failure_message(self) -> str:
        return ""


class _Recorder:
    def __init__(self) -> None:
        self.pairs: set[tuple[str, str]] = set()
        self.calls = 0

    def run(self, stack: str, experiment: str, *args, **kwargs) -> _Result:
        self.calls += 1
        self.pairs.add((str(stack), str(experiment)))
        return _Result()

    sweep = run   # monsoon.sweep(stack, experiment): a size sweep, the same pair
    mix = run     # monsoon.mix(stack, experiment): a request mix, the same pair

    def progress(self, msg: str) -> None:
        pass


def _cases(fn):
    """Every parameter combination of a test function's parametrize marks."""
    axes = []
    for mark in getattr(fn, "pytestmark", []):
        if mark.name != "parametrize":
            continue
        names, values = mark.args[0], mark.args[1]
        names = [n.strip() for n in names.split(",")] if isinstance(names, str) else list(names)
        values = [tuple(v.values) if isinstance(v, ParameterSet) else tuple(v) if len(names) > 1 else (v,)
                  for v in values]
        axes.append([dict(zip(names, v)) for v in values])
    for combo in itertools.product(*axes):
        out: dict = {}
        for part in combo:
            out.update(part)
        yield out


def scenario_pairs(folder: Path = REPO / "pytest") -> set[tuple[str, str]]:
    """The (stack, experiment) pairs the scenarios in pytest/ run: each test function called with every
    parameter combination and a recording ``monsoon`` fixture."""
    rec = _Recorder()
    files = sorted(folder.glob("test_*.py"))
    assert files
    for path in files:
        spec = importlib.util.spec_from_file_location(f"monsoon_scenario_{abs(hash(path))}_{path.stem}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if hasattr(module, "dtls_missing"):   # a scenario that skips without DTLSSocket still names its pair
            module.dtls_missing = lambda: None
        for name, fn in inspect.getmembers(module, inspect.isfunction):
            if not name.startswith("test") or fn.__module__ != module.__name__:
                continue
            for params in _cases(fn):
                fixtures = {"monsoon": rec, "record_property": lambda *a: None}
                args = {}
                for p in inspect.signature(fn).parameters:
                    assert p in params or p in fixtures, \
                        f"{path.name}::{name} uses fixture {p!r}: teach scenario_pairs() in {__file__} about it"
                    args[p] = params[p] if p in params else fixtures[p]
                before = rec.calls
                try:
                    fn(**args)
                except (Exception, pytest.skip.Exception, pytest.fail.Exception):
                    pass
                assert rec.calls > before, f"{path.name}::{name}{params or ''} ran no monsoon.run()"
    return rec.pairs


def test_every_pair_a_scenario_runs_is_validated_by_monsoon_validate():
    ran = scenario_pairs()
    assert ("kafka", "burst-x10") in ran and ("kafka-registry", "soak") in ran   # the recorder sees them
    missing = sorted(ran - set(SCENARIO_PAIRS))
    stale = sorted(set(SCENARIO_PAIRS) - ran)
    assert not missing, f"scenarios run pairs that monsoon.cli.SCENARIO_PAIRS lacks: {missing}"
    assert not stale, f"monsoon.cli.SCENARIO_PAIRS lists pairs no scenario runs: {stale}"


def test_the_recorder_sees_every_parameter_combination_and_literal(tmp_path):
    write(tmp_path, "test_mine.py", """\
        import pytest

        STACKS = ["a", "b"]

        @pytest.mark.parametrize("experiment", ["x", pytest.param("y", id="why")])
        @pytest.mark.parametrize("stack", STACKS)
        def test_grid(monsoon, stack, experiment):
            monsoon.run(stack, experiment).assert_pass()

        @pytest.mark.parametrize("stack, experiment", [("c", "z")])
        def test_tuple(monsoon, stack, experiment, record_property):
            result = monsoon.run(stack, experiment)
            if result.dry_run is not None:
                pytest.skip("dry run")
            assert False

        def test_literal(monsoon):
            monsoon.run("d", "w")

        def helper(monsoon):
            monsoon.run("never", "called")
        """)
    assert scenario_pairs(tmp_path) == {("a", "x"), ("a", "y"), ("b", "x"), ("b", "y"), ("c", "z"), ("d", "w")}
    write(tmp_path, "test_other.py", "def test_no_run(monsoon, tmp_path):\n    pass\n")
    with pytest.raises(AssertionError, match="uses fixture 'tmp_path': teach scenario_pairs"):
        scenario_pairs(tmp_path)


def test_a_file_whose_marker_is_misspelt_is_judged_as_the_kind_its_other_keys_say(tmp_path, capsys):
    stack = write(tmp_path, "s.yaml", STACK.replace("services:", "servces:"))
    exp = write(tmp_path, "e.yaml", "name: x\nchecks: [no_oom]\nprofiles: {quick: {warmup: 5}}\n")
    rc, lines, _ = run(capsys, str(stack), str(exp))
    assert rc == 1
    assert lines[0] == f"{stack}:2: servces: unknown key (did you mean services?)"
    assert lines[1].startswith(f"{exp}:1: load: Field required")
