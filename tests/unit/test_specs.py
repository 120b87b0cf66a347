"""Spec loading: the shipped files validate; bad input names the file, the line and the key."""
import textwrap

import pytest

from monsoon.load.payloads import build_payload
from monsoon.paths import REPO
from monsoon.run.validate import load_checked
from monsoon.spec.stack import load_stack
from monsoon.spec.yamlio import SpecError

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
    exp = load_checked(path)
    assert exp.durations("quick").total > 0


def test_experiment_loads_by_name_and_resolves_per_profile_params(tmp_path):
    exp = load_checked(write(tmp_path, "e.yaml", GOOD_EXPERIMENT))
    assert exp.checks[1].resolved("quick") == {"seconds": 30}


@pytest.mark.parametrize("mutate,line,key,msg", [
    (lambda s: s.replace("base_rate: 100", "base_rate: 0"), 4, "load.base_rate", "greater than 0"),
    (lambda s: s.replace("kind: burst, multiplier: 10", "kind: zigzag"), 5, "load.shape.kind", "'steady' or 'burst'"),
    (lambda s: s.replace("  devices: 5\n", "  devices: 5\n  devcies: 7\n"), 4, "load.devcies", "unknown key"),
    (lambda s: s.replace("- no_oom", "- no_oomm"), 9, "checks.0", "unknown check 'no_oomm'"),
    (lambda s: s.replace("{seconds: {quick: 30}}", "{secs: 30}"), 10, "checks.1", "no parameter 'secs'"),
    (lambda s: s.replace("burst: 10, recovery", "burst: 0, recovery"), 1, "", "needs burst > 0"),
    (lambda s: s.replace("  devices: 5\n", "  devices: 50000\n  engine: native\n  workers: 2\n"), 5,
     "load.workers", "set workers >= 3"),
    (lambda s: s.replace("  devices: 5\n", "  devices: 5\n  engine: native\n  transport: http\n"), 4,
     "load.engine", "engine: native drives mqtt and hono-coap, not http"),
])
def test_bad_experiment_names_file_line_and_key(tmp_path, mutate, line, key, msg):
    p = write(tmp_path, "bad.yaml", mutate(GOOD_EXPERIMENT))
    with pytest.raises(SpecError) as ei:
        load_checked(p)
    e = ei.value
    assert e.path == str(p) and e.line == line and e.key == key, str(e)
    assert msg in str(e) and str(p) in str(e)


def test_invalid_yaml_syntax_names_the_line(tmp_path):
    p = write(tmp_path, "broken.yaml", "name: x\nload: [1, 2\nchecks: []\n")
    with pytest.raises(SpecError, match=r"broken.yaml:\d+: invalid YAML"):
        load_checked(p)


def test_unknown_experiment_name_lists_the_available_ones():
    with pytest.raises(SpecError, match="no experiment named 'nope'.*burst-x10"):
        load_checked("nope")


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
ports: {mqtt: auto}   # the devices' port: declared, since no service here names it
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
    from monsoon.stack.supervisor import Stack
    from monsoon.stack.ports import StackError
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
    (c,) = load_checked(p).checks
    assert not c.applies("quick") and c.applies("full") and c.resolved("full") == {"min_minutes": 60}
    p.write_text(p.read_text().replace("[full]", "[fast]"))
    with pytest.raises(SpecError, match="checks"):
        load_checked(p)


# ------------------------------------------------------- load shapes and payloads

SHAPED = """\
name: s
load:
  devices: 5
  base_rate: 100
  shape: SHAPE
profiles:
  quick: {warmup: 10, burst: 60, recovery: 30}
  full: {warmup: 100, burst: 600, recovery: 300}
checks: [no_oom]
"""


def shaped(tmp_path, shape: str, name: str = "s.yaml", extra: str = ""):
    return write(tmp_path, name, SHAPED.replace("SHAPE", shape).replace("checks:", extra + "checks:"))


def phase_table(exp, profile):
    from monsoon.load.shapes import build_shape     # as RunPlan.shape() builds it
    shape = build_shape(exp.load.shape, float(exp.load.base_rate), exp.durations(profile), profile)
    return shape, [(p.name, p.start, p.end, shape.rate_at(p.start)) for p in shape.phases()]


def test_every_shape_kind_validates_and_keeps_its_ratios_across_profiles(tmp_path):
    (tmp_path / "wave.py").write_text("def rate_at(t, ctx):\n    return ctx.base_rate * (1 + t / ctx.duration)\n")
    kinds = {
        "steady": "{kind: steady}",
        "burst": "{kind: burst, multiplier: 10}",
        "ramp": "{kind: ramp, from: 1, to: 10}",
        "stages": "{kind: stages, stages: [{duration: 1, multiplier: 1, name: warmup}, {duration: 2, rate: 0}, "
                  "{duration: 3, multiplier: 3}, {duration: 4, rate: 250, name: burst}]}",
        "ladder": "{kind: ladder, steps: [{multiplier: 3, duration: 0.4}, {multiplier: 10, start: 0.5, duration: 0.5}]}",
        "spike": "{kind: spike, multiplier: 10, every: 10, width: 2}",
        "python": "{kind: python, file: wave.py, function: rate_at}",
    }
    for kind, text in kinds.items():
        exp = load_checked(shaped(tmp_path, text, f"{kind}.yaml"))
        assert exp.load.shape.kind == kind
        q_shape, quick = phase_table(exp, "quick")
        f_shape, full = phase_table(exp, "full")
        assert q_shape.duration == 100 and f_shape.duration == 1000
        assert [p[0] for p in quick] == [p[0] for p in full], kind
        if kind != "spike":   # spikes keep their absolute width; everything else scales with the profile
            for (n, a, b, r), (_, fa, fb, fr) in zip(quick, full):
                assert (fa, fb) == pytest.approx((10 * a, 10 * b)) and fr == pytest.approx(r, rel=0.01), (kind, n)
    assert [p[0] for p in quick] == ["warmup", "burst", "recovery"]   # the python shape: the profile's windows


def test_shape_phases_per_kind(tmp_path):
    def table(text):
        return phase_table(load_checked(shaped(tmp_path, text)), "quick")[1]
    assert table("{kind: ramp, to: 5}") == [("warmup", 0, 10, 100), ("ramp", 10, 70, pytest.approx(100.0 + 400 / 1200)),
                                            ("hold", 70, 100, 500)]
    assert table("{kind: stages, stages: [{duration: 1, multiplier: 1}, {duration: 2, rate: 0}, "
                 "{duration: 2, multiplier: 3}]}") == [("stage-1", 0, 20, 100), ("stage-2", 20, 60, 0),
                                                       ("stage-3", 60, 100, 300)]
    assert table("{kind: ladder, steps: [{multiplier: 3, duration: 0.4}, {multiplier: 10, start: 0.5, duration: 0.5}]}"
                 ) == [("warmup", 0, 10, 100), ("x3", 10, 34, 300), ("after-x3", 34, 40, 100), ("burst", 40, 70, 1000),
                       ("recovery", 70, 100, 100)]
    assert [p[0] for p in table("{kind: ladder, steps: [{multiplier: 3, duration: 0.5, name: burst}, "
                                "{multiplier: 10, duration: 0.5}]}")] == ["warmup", "burst", "x10", "recovery"]
    assert table("{kind: spike, multiplier: 10, every: 10, width: 2}") == [
        ("warmup", 0, 10, 100), ("burst", 10, 70, 1000), ("recovery", 70, 100, 100)]


def test_python_shape_by_module_and_function(tmp_path, monkeypatch):
    (tmp_path / "myshapes.py").write_text("def flat(t):\n    return 42.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    exp = load_checked(shaped(tmp_path, '{kind: python, function: "myshapes:flat"}'))
    shape, _ = phase_table(exp, "quick")
    assert shape.rate_at(50) == 42.0 and exp.load.shape.label == "myshapes:flat"


@pytest.mark.parametrize("shape,key,msg", [
    # rates <= 0
    ("{kind: burst, multiplier: 0}", "load.shape.multiplier", "Input should be greater than 0"),
    ("{kind: spike, multiplier: -3, every: 10, width: 2}", "load.shape.multiplier", "greater than 0"),
    ("{kind: ramp, from: -1, to: 3}", "load.shape.from", "greater than or equal to 0"),
    ("{kind: ramp, from: 0, to: 0}", "load.shape", "a ramp from 0 to 0 sends nothing"),
    ("{kind: stages, stages: [{duration: 1, rate: 5}, {duration: 1, rate: -5}]}", "load.shape.stages.1.rate",
     "greater than or equal to 0"),
    ("{kind: stages, stages: [{duration: 1, rate: 0}]}", "load.shape.stages", "every stage has rate 0"),
    ("{kind: stages, stages: [{duration: 1, rate: 5}, {duration: 1, multiplier: 0}]}", "load.shape.stages",
     "stages.1: the last stage has rate 0"),
    ("{kind: ladder, steps: [{multiplier: 0, duration: 0.5}]}", "load.shape.steps.0.multiplier", "greater than 0"),
    # structure
    ("{kind: steady, multiplier: 3}", "load.shape", "a steady shape takes nothing but kind (got multiplier)"),
    ("{kind: burst, every: 3}", "load.shape", "a burst shape takes multiplier (got every)"),
    ("{kind: ramp}", "load.shape", "a ramp shape needs to (the final multiplier"),
    ("{kind: spike, multiplier: 3, every: 10}", "load.shape", "a spike shape needs width"),
    ("{kind: spike, multiplier: 3, every: 10, width: 0.25}", "load.shape.width", "must be a multiple of 0.1 s"),
    ("{kind: spike, multiplier: 3, every: 2, width: 2}", "load.shape", "must be shorter than every"),
    ("{kind: stages, stages: [{duration: 1}]}", "load.shape.stages.0", "give exactly one of rate (msg/s) or multiplier"),
    ("{kind: stages, stages: [{duration: 1, rate: 1, name: a}, {duration: 1, rate: 1, name: a}]}", "load.shape.stages",
     "two stages are named 'a'"),
    ("{kind: ladder, steps: [{multiplier: 3, start: 0.6, duration: 0.6}]}", "load.shape.steps.0",
     "start (0.6) + duration (0.6) > 1"),
    ("{kind: ladder, steps: [{multiplier: 3, duration: 0.6}, {multiplier: 9, start: 0.5, duration: 0.2}]}",
     "load.shape.steps", "steps.1 starts at 0.5, before steps.0 ends (0.6)"),
    ("{kind: ladder, steps: [{multiplier: 3, duration: 0.6}, {multiplier: 9, duration: 0.6}]}",
     "load.shape.steps", "steps.1 ends at 1.2 of the burst window"),
    ("{kind: python}", "load.shape", "a python shape needs function"),
    ("{kind: python, function: nosuchmodule_xyz:f}", "load.shape", "cannot import module 'nosuchmodule_xyz'"),
    ("{kind: python, function: rate_at}", "load.shape", "function must be 'module:function'"),
    ("{kind: python, file: nope.py, function: f}", "load.shape", "python shape file not found"),
    ("{kind: python, function: 'math:nosuch'}", "load.shape", "module 'math' has no function 'nosuch'"),
    ("{kind: python, function: 'math:pi'}", "load.shape", "'pi' is not callable"),
])
def test_bad_shapes_name_file_line_and_key(tmp_path, shape, key, msg):
    p = shaped(tmp_path, shape, "bad.yaml")
    with pytest.raises(SpecError) as ei:
        load_checked(p)
    e = ei.value
    assert e.path == str(p) and e.key == key and e.line == 5, str(e)
    assert msg in str(e) and f"{p}:5: {key}: " in str(e), str(e)


def test_a_shape_returning_a_negative_rate_is_refused_at_validation(tmp_path):
    (tmp_path / "neg.py").write_text("def rate_at(t):\n    return 50 - t\n")
    p = shaped(tmp_path, "{kind: python, file: neg.py, function: rate_at}", "neg.yaml")
    with pytest.raises(SpecError) as ei:
        load_checked(p)
    e = ei.value
    assert (e.line, e.key) == (5, "load.shape")
    assert f"profile 'quick': python shape {tmp_path / 'neg.py'}:rate_at returned a negative rate -0.1 at t=50.1s" \
        in str(e)
    assert f"neg.yaml:5: load.shape: profile 'quick'" in str(e)


def test_burst_window_shapes_need_a_burst_window(tmp_path):
    p = write(tmp_path, "nb.yaml", SHAPED.replace("SHAPE", "{kind: ladder, steps: [{multiplier: 3, duration: 1}]}")
              .replace("burst: 60", "burst: 0"))
    with pytest.raises(SpecError, match="profile 'quick': a ladder experiment needs burst > 0 seconds"):
        load_checked(p)


def test_payload_profiles_validate(tmp_path):
    for text, profile in [("smart-meter", "smart-meter"), ("{profile: smart-tracker}", "smart-tracker"),
                          ("{profile: industrial-plc, datapoints: 120}", "industrial-plc")]:
        assert load_checked(shaped(tmp_path, "{kind: steady}", name="p.yaml")).load.payload.profile == "minimal"
        p = write(tmp_path, "p.yaml", SHAPED.replace("SHAPE", "{kind: steady}")
                  .replace("  base_rate: 100\n", f"  base_rate: 100\n  payload: {text}\n"))
        exp = load_checked(p)
        assert exp.load.payload.profile == profile
    assert build_payload(exp.load.payload).datapoints == 120
    p = write(tmp_path, "t.yaml", SHAPED.replace("SHAPE", "{kind: steady}").replace(
        "  base_rate: 100\n",
        "  base_rate: 100\n  payload:\n    profile: template\n"
        "    template: '{\"ts\": {ts}, \"values\": {\"device\": \"{device}\", \"seq\": {seq}, \"t\": {rand_float:18:30}}}'\n"))
    tpl = build_payload(load_checked(p).load.payload)
    assert b'"device": "d-1", "seq": 4' in tpl.render(1, "d-1", 4, 1, 2)


@pytest.mark.parametrize("payload,key,line,msg", [
    ("SMART_METER", "load.payload.profile", 4,
     "Input should be 'minimal', 'smart-meter', 'smart-tracker', 'industrial-plc' or 'template'"),
    ("{profile: xml}", "load.payload.profile", 4, "Input should be 'minimal', 'smart-meter'"),
    ("{profile: industrial-plc, datapoints: 0}", "load.payload.datapoints", 4, "greater than or equal to 1"),
    ("{profile: smart-meter, datapoints: 10}", "load.payload", 4, "datapoints is for the industrial-plc profile"),
    ("{profile: template}", "load.payload", 4, "the template profile needs a template"),
    ("{profile: template, template: '{\"seq\": {seq}}'}", "load.payload.template", 4, "template must carry {device}, {seq}, {ts}"),
    ("{profile: template, template: '{\"d\": \"{device}\", \"seq\": {seq}, \"ts\": {ts}, \"x\": {rnd:1:2}}'}",
     "load.payload.template", 4, "unknown placeholder {rnd:1:2}"),
    ("{profile: minimal, colour: red}", "load.payload.colour", 4, "unknown key"),
])
def test_bad_payloads_name_file_line_and_key(tmp_path, payload, key, line, msg):
    p = write(tmp_path, "badp.yaml", SHAPED.replace("SHAPE", "{kind: steady}")
              .replace("  base_rate: 100\n", f"  base_rate: 100\n  payload: {payload}\n"))
    with pytest.raises(SpecError) as ei:
        load_checked(p)
    e = ei.value
    assert (e.key, e.line) == (key, line + 1), str(e)
    assert msg in str(e) and "badp.yaml" in str(e)


def test_rates_must_be_finite_and_positive(tmp_path):
    for bad, msg in [("0", "greater than 0"), ("-400", "greater than 0"), (".inf", "finite number")]:
        p = write(tmp_path, "r.yaml", SHAPED.replace("SHAPE", "{kind: steady}").replace("base_rate: 100",
                                                                                         f"base_rate: {bad}"))
        with pytest.raises(SpecError) as ei:
            load_checked(p)
        assert (ei.value.key, ei.value.line) == ("load.base_rate", 4) and msg in str(ei.value)


# ------------------------------------------------------- provisioning, placeholders, observe

def test_provisioning_none_works_as_written(tmp_path):
    s = load_stack(write(tmp_path, "s.yaml", STACK.replace("provisioning: {kind: none}", "provisioning: none")))
    assert s.provisioning.kind == "none" and s.provisioning.url is None
    with pytest.raises(SpecError) as ei:
        load_stack(write(tmp_path, "t.yaml", STACK.replace("provisioning: {kind: none}",
                                                           "provisioning: thingsboard-rest")))
    assert (ei.value.line, ei.value.key) == (10, "provisioning")
    assert "thingsboard-rest provisioning needs url, username and password" in str(ei.value)
    with pytest.raises(SpecError) as ei:
        load_stack(write(tmp_path, "u.yaml", STACK.replace("provisioning: {kind: none}", "provisioning: nope")))
    assert ei.value.key == "provisioning.kind" and "'thingsboard-rest', 'hono-registry' or 'none'" in str(ei.value)


def test_stack_file_dir_is_the_folder_of_the_stack_file_and_stack_dir_the_run_directory(tmp_path):
    from monsoon.stack.supervisor import Stack
    text = STACK.replace('command: app --db {port:db}',
                         'command: "{stack_file_dir}/bin/app --db {port:db} --logs {stack_dir}/x {run_dir}/y"')
    (tmp_path / "mystacks").mkdir()
    spec = load_stack(write(tmp_path / "mystacks", "s.yaml", text))
    st = Stack(spec, tmp_path / "runs" / "r1" / "s--e", run_id="placeholders-1")
    st.ports = {n: 5 for n in spec.port_names()}
    st.ctx = st._base_ctx()
    assert st._build("app").command == [f"{tmp_path}/mystacks/bin/app", "--db", "5", "--logs",
                                        f"{tmp_path}/runs/r1/s--e/x", f"{tmp_path}/runs/r1/s--e/y"]


def test_an_unknown_placeholder_lists_the_known_ones(tmp_path):
    with pytest.raises(SpecError) as ei:
        load_stack(write(tmp_path, "s.yaml", STACK.replace("command: app --db {port:db}",
                                                           "command: app --db {port:db} --x {stack_folder}/y")))
    assert ei.value.key == "services.app.command" and "unknown placeholder {stack_folder}" in str(ei.value)
    assert "{stack_file_dir}" in str(ei.value) and "{stack_dir}" in str(ei.value)


def test_metrics_without_a_metrics_url_are_refused(tmp_path):
    with pytest.raises(SpecError) as ei:
        load_stack(write(tmp_path, "s.yaml", STACK.replace("observe: {service: app}",
                                                           "observe: {service: app, metrics: {queue_depth: q}}")))
    assert (ei.value.line, ei.value.key) == (12, "observe") and "metrics needs metrics_url" in str(ei.value)


def test_a_port_name_used_only_once_is_refused_with_the_likely_misspelling(tmp_path):
    text = STACK.replace("ports: {mqtt: auto}   # the devices' port: declared, since no service here names it\n", "")
    text = text.replace("command: app --db {port:db}", "command: app --db {port:db} --mqtt {port:mqtt}")
    load_stack(write(tmp_path, "ok.yaml", text))                       # bound by app, used by the devices
    with pytest.raises(SpecError) as ei:
        load_stack(write(tmp_path, "typo.yaml", text.replace('devices: {port: "{port:mqtt}"}',
                                                              'devices: {port: "{port:mqt}"}')))
    # at the misspelt one (mqtt is a port word, mqt none), naming the other side too
    assert ei.value.key == "devices.port" and ei.value.line == 9
    assert "{port:mqt} is used only here" in str(ei.value)
    assert "({port:mqtt} at services.app.command, line 7: one is misspelt?)" in str(ei.value)


def test_the_kinds_top_level_keys_are_the_models_fields():
    from monsoon.spec.kinds import MARKERS, TOP_KEYS
    from monsoon.spec.experiment import ExperimentSpec
    from monsoon.spec.fault import FaultSpec
    from monsoon.spec.stack import StackSpec
    set_by_monsoon = {"name", "description", "source"}
    for kind, model in (("stack", StackSpec), ("experiment", ExperimentSpec), ("fault profile", FaultSpec)):
        marker = next(m for m, k in MARKERS.items() if k == kind)
        assert TOP_KEYS[kind] | {marker} == set(model.model_fields) - set_by_monsoon, kind


def test_an_experiment_may_turn_a_services_restart_policy_off_and_names_a_wrong_service(tmp_path):
    from monsoon.run.validate import validate
    from monsoon.spec.experiment import load_experiment
    from monsoon.spec.stack import load_stack
    from monsoon.spec.yamlio import SpecError
    base = (REPO / "experiments" / "pod-kill.yaml").read_text()
    ok = tmp_path / "no-restart.yaml"
    ok.write_text(base.replace("name: pod-kill", "name: no-restart") + 'restart: {kafka: "no"}\n')
    exp = load_experiment(str(ok))
    assert exp.restart == {"kafka": "no"}
    validate(load_stack("kafka"), exp, "quick")
    assert load_stack("kafka").services["kafka"].restart == "always"     # the shipped broker is supervised
    bad = tmp_path / "bad-restart.yaml"
    bad.write_text(base.replace("name: pod-kill", "name: bad-restart") + 'restart: {kafak: "no"}\n')
    with pytest.raises(SpecError) as e:
        validate(load_stack("kafka"), load_experiment(str(bad)), "quick")
    assert "restart" in str(e.value) and "no service kafak" in str(e.value) and f"{bad}:" in str(e.value)


def test_the_platform_jars_are_found_in_the_cache_and_told_apart_by_folder(tmp_path, monkeypatch):
    """The calibration's key and the history name the platform build by its jars' sha256: a jar in the cache
    (TB's, Hono's) counts, and Hono's components, each a quarkus-run.jar, are told apart by their folder."""
    import hashlib
    from monsoon.spec import stack as stack_mod
    monkeypatch.setattr(stack_mod, "CACHE", tmp_path / "cache")
    for rel in ("cache/tb/platform.jar", "cache/hono/auth/quarkus-run.jar", "here/mqtt/quarkus-run.jar"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(rel.encode())
    text = STACK.replace('    ready: {tcp: "127.0.0.1:{port:db}"}\n', '    ready: {tcp: "127.0.0.1:{port:db}"}\n'
                         '    requires: [{path: "{cache}/tb/platform.jar"}, {path: "{cache}/hono/auth/quarkus-run.jar"},\n'
                         '               {path: "{stack_file_dir}/mqtt/quarkus-run.jar"}, {path: "{cache}/nope.jar"}]\n')
    s = load_stack(write(tmp_path / "here", "s.yaml", text))
    sha = {rel: hashlib.sha256(rel.encode()).hexdigest()
           for rel in ("cache/tb/platform.jar", "cache/hono/auth/quarkus-run.jar", "here/mqtt/quarkus-run.jar")}
    assert stack_mod.jar_sha256(s) == {"platform.jar": sha["cache/tb/platform.jar"],
                                       "auth/quarkus-run.jar": sha["cache/hono/auth/quarkus-run.jar"],
                                       "mqtt/quarkus-run.jar": sha["here/mqtt/quarkus-run.jar"]}
