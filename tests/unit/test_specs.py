"""Spec loading: the shipped files validate; bad input names the file, the line and the key."""
import textwrap

import pytest

from monsoon.specs import REPO, load_experiment, load_stack
from monsoon.yamlio import SpecError

GOOD_EXPERIMENT = """\
name: e
load:
  devices: 5
  base_rate: 100
  shape: {kind: burst, multiplier: 10}
profiles:
  quick: {warmup: 5, burst: 10, recovery: 10}
checks:
  - no_oom
  - lag_recovers_within: {seconds: {quick: 30}}
"""


def write(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


@pytest.mark.parametrize("path", sorted((REPO / "stacks").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_stacks_validate(path):
    spec = load_stack(path)
    assert spec.services and spec.observe.service in spec.services


@pytest.mark.parametrize("path", sorted((REPO / "experiments").glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_experiments_validate(path):
    exp = load_experiment(path)
    assert exp.durations("quick").total > 0


def test_experiment_loads_by_name_and_resolves_per_profile_params(tmp_path):
    exp = load_experiment(write(tmp_path, "e.yaml", GOOD_EXPERIMENT))
    assert exp.checks[1].resolved("quick") == {"seconds": 30}


@pytest.mark.parametrize("mutate,line,key,msg", [
    (lambda s: s.replace("base_rate: 100", "base_rate: 0"), 4, "load.base_rate", "greater than 0"),
    (lambda s: s.replace("kind: burst, multiplier: 10", "kind: zigzag"), 5, "load.shape.kind", "'steady' or 'burst'"),
    (lambda s: s.replace("  devices: 5\n", "  devices: 5\n  devcies: 7\n"), 4, "load.devcies", "unknown key"),
    (lambda s: s.replace("- no_oom", "- no_oomm"), 9, "checks.0", "unknown check 'no_oomm'"),
    (lambda s: s.replace("{seconds: {quick: 30}}", "{secs: 30}"), 10, "checks.1", "no parameter 'secs'"),
    (lambda s: s.replace("burst: 10, recovery", "burst: 0, recovery"), 1, "", "needs burst > 0"),
])
def test_bad_experiment_names_file_line_and_key(tmp_path, mutate, line, key, msg):
    p = write(tmp_path, "bad.yaml", mutate(GOOD_EXPERIMENT))
    with pytest.raises(SpecError) as ei:
        load_experiment(p)
    e = ei.value
    assert e.path == str(p) and e.line == line and e.key == key, str(e)
    assert msg in str(e) and str(p) in str(e)


def test_invalid_yaml_syntax_names_the_line(tmp_path):
    p = write(tmp_path, "broken.yaml", "name: x\nload: [1, 2\nchecks: []\n")
    with pytest.raises(SpecError, match=r"broken.yaml:\d+: invalid YAML"):
        load_experiment(p)


def test_unknown_experiment_name_lists_the_available_ones():
    with pytest.raises(SpecError, match="no experiment named 'nope'.*burst-x10"):
        load_experiment("nope")


STACK = """\
name: s
services:
  db:
    command: ["run-db", "{port:db}"]
    ready: {tcp: "127.0.0.1:{port:db}"}
  app:
    command: app --db {port:db}
    depends_on: [db]
devices: {port: "{port:mqtt}"}
provisioning: {kind: none}
storage: {dsn: "postgresql://127.0.0.1:{port:db}/x", loss_query: "select 1, 2"}
observe: {service: app}
"""


def test_stack_order_ports_and_string_commands(tmp_path):
    s = load_stack(write(tmp_path, "s.yaml", STACK))
    assert s.start_order() == ["db", "app"]
    assert s.port_names() == ["db", "mqtt"]
    assert s.services["app"].command == ("app", "--db", "{port:db}")


@pytest.mark.parametrize("mutate,line,key,msg", [
    (lambda s: s.replace("depends_on: [db]", "depends_on: [dbb]"), 8, "services.app.depends_on.0", "unknown service 'dbb'"),
    (lambda s: s.replace("{port:db}/x", "{prot:db}/x"), 11, "storage.dsn", "unknown placeholder {prot:db}"),
    (lambda s: s.replace("observe: {service: app}", "observe: {service: ap}"), 12, "observe.service", "unknown service 'ap'"),
    (lambda s: s.replace('ready: {tcp: "127.0.0.1:{port:db}"}', 'ready: {}'), 5, "services.db.ready", "exactly one of tcp, http, log"),
    (lambda s: s.replace("    depends_on: [db]\n", "    depends_on: [db]\n    restart: sometimes\n"), 9, "services.app.restart", "'no', 'always' or 'on-failure'"),
])
def test_bad_stack_names_file_line_and_key(tmp_path, mutate, line, key, msg):
    p = write(tmp_path, "bad-stack.yaml", mutate(STACK))
    with pytest.raises(SpecError) as ei:
        load_stack(p)
    e = ei.value
    assert (e.line, e.key) == (line, key), str(e)
    assert msg in str(e) and "bad-stack.yaml" in str(e)


def test_dependency_cycle_is_reported(tmp_path):
    p = write(tmp_path, "c.yaml", STACK.replace('    ready: {tcp: "127.0.0.1:{port:db}"}',
                                                '    ready: {tcp: "127.0.0.1:{port:db}"}\n    depends_on: [app]'))
    with pytest.raises(SpecError, match="dependency cycle: .*db -> app -> db|app -> db -> app"):
        load_stack(p)


def test_env_values_may_differ_per_profile(tmp_path):
    text = STACK.replace("    depends_on: [db]\n", "    depends_on: [db]\n    env:\n      HEAP: {quick: 64m, full: 768m}\n"
                                                     "      MODE: {default: x, nightly: y}\n      PLAIN: 3\n")
    s = load_stack(write(tmp_path, "p.yaml", text))
    app = s.services["app"]
    assert app.env_for("quick") == {"HEAP": "64m", "MODE": "x", "PLAIN": "3"}
    assert app.env_for("full") == {"HEAP": "768m", "MODE": "x", "PLAIN": "3"}
    with pytest.raises(ValueError, match="env HEAP has no value for profile 'nightly' and no default"):
        app.env_for("nightly")


def test_env_profile_keys_are_checked(tmp_path):
    text = STACK.replace("    depends_on: [db]\n", "    depends_on: [db]\n    env:\n      HEAP: {quik: 64m}\n")
    with pytest.raises(SpecError) as ei:
        load_stack(write(tmp_path, "p.yaml", text))
    assert ei.value.line == 10 and ei.value.key.startswith("services.app.env.HEAP")


def test_experiment_env_overrides_reach_the_service_and_unknown_services_are_refused(tmp_path):
    from monsoon.stack import Stack, StackError
    stack = load_stack("kafka")
    st = Stack(stack, tmp_path, run_id="env-1", env_overrides={"platform": {"DEFECT_X": "1"}})
    st.ports = {n: 1 for n in stack.port_names()}
    st.ctx = st._base_ctx()
    svc = st._build("platform")
    assert svc.env["DEFECT_X"] == "1" and svc.env["TB_QUEUE_TYPE"] == "kafka"
    with pytest.raises(StackError, match="env for unknown service.*nope"):
        Stack(stack, tmp_path, run_id="env-2", env_overrides={"nope": {"A": "1"}})


def test_a_check_may_apply_to_some_profiles_only(tmp_path):
    p = tmp_path / "e.yaml"
    p.write_text("name: e\nload: {devices: 1, base_rate: 1, shape: {kind: steady}}\n"
                 "profiles: {quick: {warmup: 1}, full: {warmup: 1}}\n"
                 "checks:\n  - no_memory_leak: {min_minutes: {full: 60}, profiles: [full]}\n")
    (c,) = load_experiment(p).checks
    assert not c.applies("quick") and c.applies("full") and c.resolved("full") == {"min_minutes": 60}
    p.write_text(p.read_text().replace("[full]", "[fast]"))
    with pytest.raises(SpecError, match="checks"):
        load_experiment(p)
