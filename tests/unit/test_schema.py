"""``monsoon schema``: the JSON Schema of each kind of spec file accepts every shipped file (short forms
included) and refuses what the loaders refuse; ``monsoon schema --markdown`` is docs/reference.md, every key
with a type and a meaning."""
from __future__ import annotations

import json
import re

import pytest
import yaml

from monsoon.cli import check_catalogue, main as cli_main, reference
from monsoon.paths import REPO
from monsoon.spec.experiment import ExperimentSpec, LoadSpec
from monsoon.spec.fault import KINDS as FAULT_KINDS, FaultSpec
from monsoon.spec.schema import KINDS, json_schema, markdown
from monsoon.spec.stack import StackSpec

FOLDER = {"stack": "stacks", "experiment": "experiments", "fault-profile": "fault-profiles"}


# ------------------------------------------------- a JSON Schema subset, enough for what monsoon generates

KNOWN = {"$schema", "$defs", "$ref", "title", "description", "default", "examples", "type", "enum", "const",
         "properties", "additionalProperties", "required", "items", "anyOf", "allOf", "not", "if", "then",
         "propertyNames", "minProperties", "maxProperties", "minItems", "maxItems", "minLength", "pattern",
         "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "object": dict, "array": list,
         "null": type(None)}


def errors(schema: dict, value, root: dict | None = None, path: str = "") -> list[str]:
    """Why ``value`` does not match ``schema`` (draft 2020-12 semantics for the keywords in KNOWN); a keyword
    outside KNOWN fails loudly, so the schema can never use one this checker would silently ignore."""
    root = root or schema
    unknown = set(schema) - KNOWN
    assert not unknown, f"keywords this test does not check: {unknown}"
    out: list[str] = []
    if "$ref" in schema:
        out += errors(root["$defs"][schema["$ref"].rsplit("/", 1)[1]], value, root, path)
    t = schema.get("type")
    if t is not None:
        ok = isinstance(value, TYPES[t]) and not (t in ("integer", "number") and isinstance(value, bool))
        if t == "integer" and isinstance(value, float):
            ok = value.is_integer()
        if not ok:
            return out + [f"{path}: {value!r} is not {t}"]
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{path}: {value!r} not in {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        out.append(f"{path}: {value!r} != {schema['const']!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        for key, bad in (("minimum", lambda v, b: v < b), ("maximum", lambda v, b: v > b),
                         ("exclusiveMinimum", lambda v, b: v <= b), ("exclusiveMaximum", lambda v, b: v >= b)):
            if key in schema and bad(value, schema[key]):
                out.append(f"{path}: {value} breaks {key} {schema[key]}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            out.append(f"{path}: too short")
        if "pattern" in schema and not re.search(schema["pattern"], value):
            out.append(f"{path}: {value!r} does not match {schema['pattern']}")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for k in schema.get("required", ()):
            if k not in value:
                out.append(f"{path}: {k} is required")
        if not schema.get("minProperties", 0) <= len(value) <= schema.get("maxProperties", 10**9):
            out.append(f"{path}: {len(value)} keys")
        for k, v in value.items():
            if "propertyNames" in schema:
                out += errors(schema["propertyNames"], k, root, f"{path}.{k}(name)")
            if k in props:
                out += errors(props[k], v, root, f"{path}.{k}")
            elif schema.get("additionalProperties") is False:
                out.append(f"{path}: unknown key {k}")
            elif isinstance(schema.get("additionalProperties"), dict):
                out += errors(schema["additionalProperties"], v, root, f"{path}.{k}")
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", 10**9):
            out.append(f"{path}: {len(value)} items")
        if "items" in schema:
            for i, v in enumerate(value):
                out += errors(schema["items"], v, root, f"{path}[{i}]")
    if "anyOf" in schema:
        alts = [errors(s, value, root, path) for s in schema["anyOf"]]
        if all(alts):
            out.append(f"{path}: matches none of {len(alts)} forms: " + " / ".join(a[0] for a in alts))
    for s in schema.get("allOf", ()):
        out += errors(s, value, root, path)
    if "not" in schema and not errors(schema["not"], value, root, path):
        out.append(f"{path}: {value!r} matches what it must not")
    if "if" in schema and not errors(schema["if"], value, root, path):
        out += errors(schema.get("then", {}), value, root, path)
    return out


def test_the_checker_catches_what_it_claims():
    s = {"type": "object", "properties": {"a": {"anyOf": [{"type": "integer", "minimum": 1}, {"const": "x"}]}},
         "required": ["a"], "additionalProperties": False}
    assert errors(s, {"a": 2}) == [] and errors(s, {"a": "x"}) == []
    assert errors(s, {"a": 0}) and errors(s, {"a": "y"}) and errors(s, {}) and errors(s, {"a": 1, "b": 2})
    with pytest.raises(AssertionError, match="keywords this test does not check"):
        errors({"oneOf": []}, 1)


# ------------------------------------------------------------------ the schemas

@pytest.fixture(scope="module")
def schemas() -> dict[str, dict]:
    return {k: json_schema(k, check_catalogue()) for k in KINDS}


SHIPPED = [(k, p) for k, folder in FOLDER.items() for p in sorted((REPO / folder).glob("*.yaml"))]


@pytest.mark.parametrize("kind, path", SHIPPED, ids=[f"{k}:{p.name}" for k, p in SHIPPED])
def test_every_shipped_spec_file_matches_its_schema(schemas, kind, path):
    assert errors(schemas[kind], yaml.safe_load(path.read_text())) == []


def test_every_shipped_kind_is_covered():
    assert {k for k, _ in SHIPPED} == set(KINDS) and len(SHIPPED) >= 20


def doc(path: str) -> dict:
    return yaml.safe_load((REPO / path).read_text())


def test_the_short_forms_the_loaders_accept_are_in_the_schema(schemas):
    stack = doc("stacks/kafka.yaml")
    stack["provisioning"] = "none"
    stack["devices"]["port"] = 1883
    stack["services"]["platform"]["command"] = "java -jar platform.jar"
    stack["services"]["platform"]["env"]["WORKERS"] = 4
    assert errors(schemas["stack"], stack) == []
    exp = doc("experiments/burst-x10.yaml")
    exp["load"]["payload"] = "smart-meter"
    exp["load"]["base_rate"] = "auto"
    exp["checks"] += ["my_plugins_check", {"another_plugin_check": {"x": 1}},
                      {"name": "no_memory_leak", "params": {"min_minutes": {"full": 60}}, "profiles": ["full"]},
                      {"no_oom": None}]
    exp["faults"] = ["pod-kill", {"profile": "mongo-slowdown", "params": {"latency_ms": {"quick": 100}}}]
    assert errors(schemas["experiment"], exp) == []
    fault = doc("fault-profiles/network-latency.yaml")
    fault["target"] = {"namespace": "iot", "labelSelector": {"app": "x"}}
    fault["backend"] = "chaos-mesh"
    assert errors(schemas["fault-profile"], fault) == []


@pytest.mark.parametrize("kind, path, change, where", [
    ("stack", "stacks/kafka.yaml", lambda d: d["services"]["platform"].update(restart="sometimes"),
     ".services.platform.restart"),
    ("stack", "stacks/kafka.yaml", lambda d: d.update(provisoning="none"), "unknown key provisoning"),
    ("stack", "stacks/kafka.yaml", lambda d: d.update(provisioning="thingsboard"), ".provisioning"),
    ("stack", "stacks/kafka.yaml", lambda d: d["services"]["platform"]["env"].update(HEAP={"quik": "1g"}),
     ".services.platform.env.HEAP"),
    ("experiment", "experiments/burst-x10.yaml", lambda d: d["load"].update(qos=2), ".load.qos"),
    ("experiment", "experiments/burst-x10.yaml", lambda d: d["load"].update(payload="smart-metre"), ".load.payload"),
    ("experiment", "experiments/burst-x10.yaml", lambda d: d["load"].update(base_rate=0), ".load.base_rate"),
    ("experiment", "experiments/burst-x10.yaml", lambda d: d["checks"].append("lag_bounded"), ".checks[4]"),
    ("experiment", "experiments/burst-x10.yaml", lambda d: d["checks"].append({"lag_recovers_within": {"secs": 3}}),
     ".checks[4]"),
    ("experiment", "experiments/burst-x10.yaml", lambda d: d["profiles"].update(weekly={"warmup": 1}),
     ".profiles.weekly(name)"),
    ("fault-profile", "fault-profiles/mongo-slowdown.yaml", lambda d: d["params"].update(latency=5), ".params"),
    ("fault-profile", "fault-profiles/mongo-slowdown.yaml", lambda d: d.update(backend="process"), ".backend"),
    ("fault-profile", "fault-profiles/mongo-slowdown.yaml", lambda d: d.update(kind="mongo-slowness"), ".kind"),
    ("fault-profile", "fault-profiles/pod-kill.yaml", lambda d: d.update(name="Pod_Kill"), ".name"),
    ("fault-profile", "fault-profiles/bandwidth.yaml", lambda d: d.pop("params"), "params is required"),
])
def test_the_schema_refuses_what_the_loaders_refuse(schemas, kind, path, change, where):
    d = doc(path)
    change(d)
    errs = errors(schemas[kind], d)
    assert errs and any(where in e for e in errs), errs


def test_a_fault_profiles_params_follow_its_kind(schemas):
    rules = schemas["fault-profile"]["allOf"]
    assert {r["if"]["properties"]["kind"]["const"] for r in rules} == set(FAULT_KINDS)
    for r in rules:
        info = FAULT_KINDS[r["if"]["properties"]["kind"]["const"]]
        assert r["then"]["properties"]["params"]["$ref"].endswith("/" + info.params.__name__)
        assert r["then"]["properties"]["backend"]["enum"] == list(info.backends)


def test_the_schema_has_no_internal_keys_and_no_pydantic_titles(schemas):
    for kind, s in schemas.items():
        assert "source" not in s["properties"]
        assert s["$schema"].endswith("2020-12/schema") and s["title"].startswith("monsoon ")
        text = json.dumps(s["$defs"])
        assert '"title": "Metrics Url"' not in text and "``" not in text


# ------------------------------------------------------------------ the reference

def test_docs_reference_is_what_monsoon_schema_markdown_prints():
    committed = (REPO / "docs" / "reference.md").read_text()
    assert committed == reference(), ("docs/reference.md is out of date: regenerate it with "
                                      ".venv/bin/monsoon schema --markdown > docs/reference.md")


def rows(md: str) -> list[list[str]]:
    return [[c.strip() for c in re.split(r"(?<!\\)\|", ln)[1:-1]] for ln in md.splitlines()
            if ln.startswith("| `")]


def test_every_key_of_every_model_is_in_the_reference_with_a_type_and_a_meaning():
    md = reference()
    table = rows(md)
    keys = {r[0].strip("`") for r in table if len(r) == 4}
    for path in ("name", "services.<service>.command", "services.<service>.ready.timeout", "devices.transport",
                 "provisioning.kind", "observe.kafka.group", "observe.kubernetes.labelSelector", "chaos.toxiproxy",
                 "load.shape.stages[].rate", "load.shape.steps[].start", "load.shape.from", "load.payload.template",
                 "profiles.<profile>.drain_timeout", "checks[].profiles", "faults[].schedule", "env",
                 "target.labelSelector", "schedule.repeat_every", "params.latency_ms", "params.limit_mb"):
        assert path in keys, path
    for model in (StackSpec, ExperimentSpec, LoadSpec, FaultSpec):
        for name, f in model.model_fields.items():
            if name != "source":
                assert any(k.split(".")[-1].removesuffix("[]") == (f.alias or name) for k in keys), name
    for r in table:
        if len(r) == 4:
            assert r[1] and r[3], f"{r[0]}: no type or no meaning in the reference"
    assert "`{stack_file_dir}`" in md and "`{port:NAME}`" in md and "`lag_recovers_within`" in md


def test_a_table_cell_keeps_angle_brackets_and_pipes_from_breaking_the_markdown():
    md = markdown()
    assert "runs/&lt;run-id>/" in md     # outside code: not an HTML tag
    assert "`services.<service>.command`" in md   # inside code: as written
    for r in rows(md):
        assert len(r) in (2, 3, 4), r


# ------------------------------------------------------------------ the command

def test_monsoon_schema_prints_json_for_each_kind(capsys):
    for kind in KINDS:
        assert cli_main(["schema", kind]) == 0
        s = json.loads(capsys.readouterr().out)
        assert s == json.loads(json.dumps(json_schema(kind, check_catalogue())))
    assert cli_main(["schema", "--markdown"]) == 0
    assert capsys.readouterr().out == reference()
    assert cli_main(["schema", "--markdown", "stack"]) == 0
    out = capsys.readouterr().out
    assert "## Stack" in out and "## Experiment" not in out
    assert cli_main(["schema"]) == 2
    assert "name a kind (stack, experiment, fault-profile)" in capsys.readouterr().err


def test_check_parameters_come_from_the_registry(schemas):
    item = schemas["experiment"]["properties"]["checks"]["items"]["anyOf"]
    by_name = item[1]["properties"]
    assert by_name["lag_recovers_within"]["required"] == ["seconds"]
    assert set(by_name["lag_recovers_within"]["properties"]) == {"seconds", "tolerance", "grace", "profiles"}
    assert "lag_bounded" not in item[0]["anyOf"][0]["enum"] and "no_oom" in item[0]["anyOf"][0]["enum"]
