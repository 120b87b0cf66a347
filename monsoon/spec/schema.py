"""JSON Schema and the format reference of the spec files, both generated from the pydantic models.

:func:`json_schema` is what a YAML language server needs to validate and complete ``stacks/*.yaml``,
``experiments/*.yaml`` and ``fault-profiles/*.yaml``. It describes what the loaders accept, short forms included
(``provisioning: none``, ``payload: smart-meter``, ``checks: [no_oom, {lag_recovers_within: {...}}]``,
``target: platform->postgres``, a string ``command``, numbers in ``env``); the rules that need more than one
value at a time (a fault's target against its kind, a check's parameters against the registry, a stack's
placeholders) stay with ``monsoon validate``. :func:`markdown` is the reference: every key, its type, default
and meaning, from the fields' descriptions and the models' docstrings (``docs/reference.md`` is its output).

The checks live above the specs, so a caller that knows them (the ``monsoon`` command) passes them in as
:class:`CheckInfo`; without them the schema accepts any check name.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from monsoon.spec.base import PROFILES
from monsoon.spec.experiment import ExperimentSpec
from monsoon.spec.fault import KEBAB, KINDS as FAULT_KINDS, FaultSpec, Target
from monsoon.spec.stack import PLACEHOLDERS, StackSpec


DRAFT = "https://json-schema.org/draft/2020-12/schema"

#: The kinds of spec file: the model, the folder the files live in, a title.
KINDS: dict[str, tuple[type[BaseModel], str, str]] = {
    "stack": (StackSpec, "stacks/<name>.yaml", "Stack"),
    "experiment": (ExperimentSpec, "experiments/<name>.yaml", "Experiment"),
    "fault-profile": (FaultSpec, "fault-profiles/<kind>.yaml", "Fault profile"),
}

INTERNAL = ("source",)   # set by the loaders, not written in a file

REQUIRED = object()      # a check parameter without a default


@dataclass(frozen=True)
class CheckParam:
    name: str
    default: Any = REQUIRED
    text: bool = False   # a string is accepted besides a number >= 0 (the registry's rule: a None or str default)


@dataclass(frozen=True)
class CheckInfo:
    """A check as an experiment names it: its parameters and its docstring."""
    name: str
    doc: str
    params: tuple[CheckParam, ...] = ()


# ------------------------------------------------------------------ JSON Schema

_SUBSCHEMA_MAPS = ("properties", "$defs", "patternProperties")
_SUBSCHEMA_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")
_SUBSCHEMAS = ("items", "additionalProperties", "propertyNames", "if", "then", "else", "not")


def _walk(schema: Any, fn) -> None:
    """Call ``fn`` on every (sub)schema dict, parents first."""
    if not isinstance(schema, dict):
        return
    fn(schema)
    for k in _SUBSCHEMA_MAPS:
        for sub in (schema.get(k) or {}).values():
            _walk(sub, fn)
    for k in _SUBSCHEMA_LISTS:
        for sub in schema.get(k) or ():
            _walk(sub, fn)
    for k in _SUBSCHEMAS:
        _walk(schema.get(k), fn)


def _prune(value: Any) -> Any:
    """A model's default as a file would write it: unset (null) and empty values dropped."""
    if isinstance(value, dict):
        out = {k: _prune(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v not in (None, {}, [])}
    return value


def _tidy(schema: dict) -> None:
    schema.pop("title", None)   # pydantic's "Metrics Url": the description says more
    if isinstance(schema.get("description"), str):
        schema["description"] = re.sub(r"``(.+?)``", r"`\1`", schema["description"])
    for prop in (schema.get("properties") or {}).values():
        if isinstance(prop.get("default"), dict):
            prop["default"] = _prune(prop["default"])


def _number_or_text(text: bool) -> dict:
    number = {"type": "number", "minimum": 0}
    return {"anyOf": [number, {"type": "string"}]} if text else number


def _per_profile(scalar: dict) -> dict:
    return {"anyOf": [scalar, {"type": "object", "propertyNames": {"enum": [*PROFILES, "default"]},
                               "additionalProperties": scalar, "minProperties": 1, "title": "a value per profile",
                               "description": "a value per profile, e.g. {quick: 60, full: 600}"}]}


def _check_schema(c: CheckInfo) -> dict:
    props: dict[str, Any] = {}
    for p in c.params:
        s = _per_profile(_number_or_text(p.text))
        if p.default is not REQUIRED:
            s["default"] = p.default
        props[p.name] = s
    props["profiles"] = {"type": "array", "items": {"enum": list(PROFILES)},
                         "description": "judge the check only in these profiles"}
    required = [p.name for p in c.params if p.default is REQUIRED]
    params: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        params["required"] = required
        out: dict[str, Any] = params
    else:
        out = {"anyOf": [params, {"type": "null"}]}
    out["description"] = _first_paragraph(c.doc)
    return out


def _experiment(root: dict, defs: dict, checks: Sequence[CheckInfo]) -> None:
    if not checks:
        return
    names = [c.name for c in checks]
    bare = [c.name for c in checks if all(p.default is not REQUIRED for p in c.params)]
    root["properties"]["checks"]["items"] = {"anyOf": [
        # a known check by name only when it needs no parameter; any other name may be a plugin's check
        {"anyOf": [{"enum": bare}, {"type": "string", "not": {"enum": names}}],
         "title": "a check name", "description": "a check with its default parameters"},
        {"type": "object", "minProperties": 1, "maxProperties": 1, "title": "{check: {parameter: value}}",
         "properties": {c.name: _check_schema(c) for c in checks},
         "additionalProperties": {"anyOf": [{"type": "object"}, {"type": "null"}]},
         "description": "{check: {parameter: value}}"},
        {"$ref": "#/$defs/CheckSpec"},
    ]}


def _fault_profile(root: dict, defs: dict) -> None:
    props = root["properties"]
    props["name"]["pattern"] = KEBAB.pattern
    props["kind"] = {"enum": list(FAULT_KINDS), "description": props["kind"].get("description", "")}
    props["params"] = {"type": "object", "description": props["params"].get("description", "")}
    rules = []
    for kind, info in FAULT_KINDS.items():
        then: dict[str, Any] = {"properties": {"params": {"$ref": f"#/$defs/{info.params.__name__}"},
                                               "backend": {"enum": list(info.backends)}}}
        if any(f.is_required() for f in info.params.model_fields.values()):
            then["required"] = ["params"]
        rules.append({"if": {"properties": {"kind": {"const": kind}}, "required": ["kind"]}, "then": then})
    root["allOf"] = rules
    defs["Target"] = {"description": Target.__doc__ and _clean(Target.__doc__),
                      "anyOf": [{"type": "string", "minLength": 1,
                                 "description": "a stack service, or a hop client->server"},
                                {"$ref": "#/$defs/KubeSelector"}]}


def json_schema(kind: str, checks: Sequence[CheckInfo] = ()) -> dict:
    """The JSON Schema (draft 2020-12) of one kind of spec file: ``stack``, ``experiment`` or ``fault-profile``."""
    model, _, title = KINDS[kind]
    extra = [info.params for info in FAULT_KINDS.values()] if kind == "fault-profile" else []
    models = list(dict.fromkeys([model, *extra]))
    _, top = models_json_schema([(m, "validation") for m in models], ref_template="#/$defs/{model}")
    defs = top["$defs"]
    root = defs.pop(model.__name__)
    for key in INTERNAL:
        root["properties"].pop(key, None)
    _walk(root, _tidy)
    _walk({"$defs": defs}, _tidy)
    if kind == "experiment":
        _experiment(root, defs, checks)
    if kind == "fault-profile":
        _fault_profile(root, defs)
    return {"$schema": DRAFT, "title": f"monsoon {title.lower()} ({KINDS[kind][1]})", **root,
            "$defs": dict(sorted(defs.items()))}


# ------------------------------------------------------------------ the reference

def _clean(text: str) -> str:
    """Docstring text for a table cell: rst ``code`` as Markdown `code`, one line."""
    return " ".join(re.sub(r"``(.+?)``", r"`\1`", text).split())


def _first_paragraph(doc: str) -> str:
    return _clean(re.split(r"\n\s*\n", doc.strip(), maxsplit=1)[0]) if doc else ""


def _cell(text: str) -> str:
    """A table cell: pipes escaped; outside `code`, < too (or a Markdown renderer takes <name> for HTML)."""
    parts = text.replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))


def _ref(schema: dict, defs: dict) -> dict | None:
    ref = schema.get("$ref")
    return defs[ref.rsplit("/", 1)[1]] if ref else None


def _bound(s: dict) -> str:
    out = []
    for key, op in (("exclusiveMinimum", ">"), ("minimum", ">="), ("exclusiveMaximum", "<"), ("maximum", "<=")):
        if key in s:
            out.append(f"{op} {s[key]:g}")
    return " " + ", ".join(out) if out else ""


def _type(s: dict, defs: dict) -> str:
    if "title" in s:   # pydantic's titles are gone (_tidy): this one names a form of ours
        return s["title"]
    if "$ref" in s:
        ref = _ref(s, defs)
        assert ref is not None     # pydantic's $ref is never empty
        return "mapping" if "properties" in ref else _type(ref, defs)
    if "enum" in s:
        vals = [f"`{v}`" for v in s["enum"]]
        return vals[0] if len(vals) == 1 else ", ".join(vals[:-1]) + " or " + vals[-1]
    if "const" in s:
        return f"`{s['const']}`"
    if "anyOf" in s:
        alts = [x for x in s["anyOf"] if x.get("type") != "null"]
        if {"integer", "number"} <= {x.get("type") for x in alts}:
            alts = [x for x in alts if x.get("type") != "integer"]
        parts = list(dict.fromkeys(_type(x, defs) for x in alts))
        return " or ".join(parts) if parts else "null"
    t = s.get("type")
    if t == "array":
        return "list of " + _type(s.get("items") or {}, defs)
    if t == "object":
        if isinstance(s.get("additionalProperties"), dict) and s["additionalProperties"]:
            names = (s.get("propertyNames") or {}).get("enum")
            if names and set(names) <= {*PROFILES, "default"} and "default" in names:
                return "a value per profile"
            if names:
                return "map of " + _type(s["propertyNames"], defs) + " to " + _type(s["additionalProperties"], defs)
            return "map of " + _type(s["additionalProperties"], defs)
        return "mapping"
    if t in ("string", "number", "integer", "boolean", "null"):
        return t + _bound(s)
    return "any"


def _default(s: dict, required: bool) -> str:
    if required:
        return "required"
    if "default" not in s or s["default"] is None:
        return ""
    d = s["default"]
    return f"`{json.dumps(d)}`" if d == "" or not isinstance(d, str) else f"`{d}`"


_NAMED_KEYS = {"services": "<service>", "profiles": "<profile>"}


def _children(s: dict, defs: dict, path: str, seen: tuple[str, ...]) -> Iterable[tuple[str, dict, tuple]]:
    """(path, model schema, seen) of the mappings under a key: a model, a list or a map of them, or a union."""
    if "$ref" in s:
        name = s["$ref"].rsplit("/", 1)[1]
        target = defs[name]
        if "properties" in target and name not in seen:
            yield path, target, seen + (name,)
        elif "anyOf" in target:
            yield from _children(target, defs, path, seen + (name,))
        return
    for alt in s.get("anyOf") or ():
        yield from _children(alt, defs, path, seen)
    if s.get("type") == "array" and isinstance(s.get("items"), dict):
        yield from _children(s["items"], defs, path + "[]", seen)
    if s.get("type") == "object" and isinstance(s.get("additionalProperties"), dict):
        key = _NAMED_KEYS.get(path.rsplit(".", 1)[-1], "<name>")
        yield from _children(s["additionalProperties"], defs, f"{path}.{key}", seen)


def _rows(schema: dict, defs: dict, prefix: str = "", seen: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    required = set(schema.get("required") or ())
    for key, s in (schema.get("properties") or {}).items():
        path = f"{prefix}.{key}" if prefix else key
        meaning = s.get("description") or _first_paragraph((_ref(s, defs) or {}).get("description", ""))
        rows.append((f"`{path}`", _type(s, defs), _default(s, key in required), _clean(meaning)))
        done = set()
        for sub_path, sub, sub_seen in _children(s, defs, path, seen):
            if id(sub) not in done:
                done.add(id(sub))
                rows.extend(_rows(sub, defs, sub_path, sub_seen))
    return rows


def _param_default(p: CheckParam) -> str:
    return "required" if p.default is REQUIRED else "optional" if p.default is None else f"{p.default:g}" \
        if isinstance(p.default, (int, float)) else str(p.default)


def _table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]
    return out


def _section(kind: str, checks: Sequence[CheckInfo]) -> list[str]:
    model, files, title = KINDS[kind]
    schema = json_schema(kind, checks)
    defs = schema["$defs"]
    out = [f"## {title}: `{files}`", "", _clean(model.__doc__ or ""), "",
           f"JSON Schema: `monsoon schema {kind}`.", ""]
    out += _table(("key", "type", "default", "meaning"), _rows(schema, defs))
    if kind == "stack":
        out += ["", "### Placeholders", "",
                "Any string of a stack may hold these; `monsoon validate` refuses any other.", ""]
        out += _table(("placeholder", "stands for"),
                      [(f"`{{{n}:NAME}}`" if n in ("port", "host") else f"`{{{n}}}`", what)
                       for n, what in PLACEHOLDERS.items()])
    if kind == "experiment" and checks:
        out += ["", "### Checks", "",
                "What `checks:` may name (more may be added by a plugin's `pytest_monsoon_add_checks`). A parameter "
                "may differ per profile, `seconds: {quick: 60, full: 600}`.", ""]
        out += _table(("check", "parameters (default)", "judges"),
                      [(f"`{c.name}`",
                        ", ".join(f"`{p.name}` ({_param_default(p)})" for p in c.params) or "none",
                        _first_paragraph(c.doc)) for c in checks])
    if kind == "fault-profile":
        out += ["", "### `params` by kind", ""]
        for k, info in FAULT_KINDS.items():
            ps = info.params.model_json_schema(ref_template="#/$defs/{model}")
            _walk(ps, _tidy)
            targets = " or ".join({"service": "a service", "hop": "a hop client->server",
                                   "kube": "a Kubernetes selector"}[t] for t in info.targets)
            out += [f"#### `kind: {k}`", "", f"Backends: {', '.join(f'`{b}`' for b in info.backends)}; "
                    f"target: {targets}.", ""]
            out += _table(("key", "type", "default", "meaning"), _rows(ps, ps.get("$defs", {}), "params"))
            out.append("")
        out.pop()
    return out


def markdown(checks: Sequence[CheckInfo] = (), kinds: Sequence[str] = tuple(KINDS)) -> str:
    """The format reference of the spec files (docs/reference.md), in Markdown."""
    out = ["# Spec file reference", "",
           "Generated by `monsoon schema --markdown` from the pydantic models in `monsoon/spec/`; do not edit it by "
           "hand (a unit test fails when it differs from what the command prints). `a.b` is key `b` inside `a`, "
           "`a[]` each item of the list `a`, `<service>` a name of yours. Every file is checked by "
           "`monsoon validate`, with file, line and key in every error.", ""]
    for kind in kinds:
        out += _section(kind, checks)
        out.append("")
    return "\n".join(out)
