"""Timeline events are declared once (monsoon/timeline/events.py): writers are checked against it, at run time
(Timeline.add) and in the source (every literal event a module writes), and readers name them by its constants."""
from __future__ import annotations

import ast
import dataclasses
import json
import timeit
from pathlib import Path

import pytest

from monsoon.timeline import events as E
from monsoon.timeline.events import UndeclaredEvent, check, missing
from monsoon.timeline.store import Events, Timeline

REPO = Path(__file__).resolve().parents[2]
WRITER_CALLS = {"add", "on_event"}     # Timeline.add, and the stack's event sink (StackEvents -> Timeline.add)


def test_every_declaration_has_a_doc_and_no_field_twice():
    for table in (E.EVENTS, E.OPS, E.SERVICE_EVENTS):
        for name, d in table.items():
            assert d.doc.strip() and d.name == name
            assert not d.required & d.optional, name
            assert not d.fields & E.ENVELOPE, f"{name}: t and wall are every event's own"
    assert set(E.KINDS) == {E.OP, E.SERVICE}
    assert len(E.EVENTS) == 15 and len(E.OPS) == 18 and len(E.SERVICE_EVENTS) == 7   # 18: course, helm-release


def test_an_undeclared_type_op_service_event_or_field_is_refused_before_anything_is_written(tmp_path):
    path = tmp_path / "timeline.jsonl"
    with Timeline(path) as tl:
        tl.add(E.PHASE, name="burst", start=1.0, end=2.0)
        tl.add(E.OP, op=E.OP_LOAD_END, sent=1, acked=1)
        tl.add(E.SERVICE, service="tb", event=E.SVC_EXIT, code=137, cause="OOM", oom=True, pid=4)
        tl.add(E.SAMPLE, collector="process", rss_mb=12.0, anything_a_collector_says=1)   # open
        tl.add(E.LOAD, t=3.0, sec=3, acked=10)             # a writer may give the time; required is not checked here
        for type_, fields, said in (
                ("phaze", {"name": "x"}, "type 'phaze' is not declared"),
                (E.PHASE, {"name": "x", "stat": 1.0}, "field(s) stat not declared"),
                (E.OP, {"op": "load-ended"}, "op='load-ended': no such op"),
                (E.OP, {}, "op=None: no such op"),
                (E.OP, {"op": ["load-end"]}, "no such op"),
                (E.OP, {"op": E.OP_CONNECTED, "device": 3}, "field(s) device not declared"),
                (E.SERVICE, {"service": "tb", "event": "exited"}, "event='exited'"),
                (E.SERVICE, {"service": "tb", "event": E.SVC_READY, "code": 0}, "field(s) code not declared")):
            with pytest.raises(UndeclaredEvent, match=said.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
                tl.add(type_, **fields)
    evs = [json.loads(line) for line in path.read_text().splitlines()]
    assert [e["type"] for e in evs] == ["phase", "op", "service", "sample", "load"]
    assert evs[-1]["t"] == 3.0


def test_missing_names_the_required_fields_of_the_type_and_of_its_kind():
    assert missing(E.OP, {"op": E.OP_PROVISIONED, "devices": 3}) == ["seconds"]
    assert missing(E.SERVICE, {"event": E.SVC_RESTART}) == ["n", "service"]
    assert missing(E.PHASE, {"name": "x", "start": 0, "end": 1}) == []


def test_the_check_costs_well_under_a_microsecond_on_the_per_second_events():
    load = {"sec": 1, "target_rate": 1e3, "scheduled": 1000, "sent": 1000, "acked": 999, "failed": 0, "late": 1,
            "connected": 100, "p50_ms": 3.0, "p99_ms": 9.0, "max_ms": 12.0, "gen_cpu_s": 0.1}
    sample = {"collector": "process", "pid": 1, "rss_mb": 100.0, "cpu_pct": 3.0, "threads": 40}
    op = {"op": E.OP_LOAD_END, "sent": 1, "acked": 1, "late": 0}
    for type_, fields in ((E.LOAD, load), (E.SAMPLE, sample), (E.OP, op)):
        n = 20000
        per = min(timeit.repeat(lambda: check(type_, fields), number=n, repeat=3)) / n
        assert per < 2e-6, f"{type_}: {per * 1e9:.0f} ns per check"    # ~0.2 us measured; generous for CI


# --- the writers in the source ----------------------------------------------------------------------------------
def _writer_calls(root: Path):
    """(file, line, type, keyword names, literal kind or None, spread) of every ``.add("type", ...)`` or
    ``on_event("type", ...)`` call whose first argument is a string literal and that is not a set's ``add``."""
    for p in sorted(root.rglob("*.py")):
        if ".venv" in p.parts or "target" in p.parts:
            continue
        tree = ast.parse(p.read_text(), str(p))
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name not in WRITER_CALLS:
                continue
            a0 = node.args[0]
            type_ = a0.value if isinstance(a0, ast.Constant) and isinstance(a0.value, str) else \
                getattr(E, a0.id, None) if isinstance(a0, ast.Name) and a0.id.isupper() else \
                getattr(E, a0.attr, None) if isinstance(a0, ast.Attribute) and a0.attr.isupper() else None
            if not isinstance(type_, str):
                continue
            if name == "add" and len(node.args) == 1 and not node.keywords:
                continue          # a set's add("...")
            kws = {k.arg: k.value for k in node.keywords if k.arg is not None}
            spread = any(k.arg is None for k in node.keywords)
            kind = None
            if type_ in E.KINDS:
                v = kws.get(E.KINDS[type_][0])
                kind = v.value if isinstance(v, ast.Constant) else getattr(E, v.id, None) \
                    if isinstance(v, ast.Name) else getattr(E, v.attr, None) if isinstance(v, ast.Attribute) else None
            yield p.relative_to(REPO), node.lineno, type_, set(kws), kind, spread


def _fields(names: set[str], kind_field: str | None, kind: str | None) -> dict:
    out: dict = dict.fromkeys(names, 0)
    if kind_field is not None and kind is not None:
        out[kind_field] = kind
    return out


@pytest.mark.parametrize("root", ["monsoon", "tests"])
def test_every_event_written_in_the_source_is_declared_with_its_fields(root):
    bad, seen = [], set()
    for path, line, type_, names, kind, spread in _writer_calls(REPO / root):
        kind_field = E.KINDS[type_][0] if type_ in E.KINDS else None
        if kind_field is not None and kind is None and kind_field not in names:
            if not spread:
                bad.append(f"{path}:{line}: {type_} without its {kind_field}")
            continue
        fields = _fields(names, kind_field, kind)
        try:
            check(type_, fields)
        except UndeclaredEvent as e:
            bad.append(f"{path}:{line}: {e}")
            continue
        seen.add((type_, kind))
        # a writer of monsoon's own that spells out every field writes the required ones (tests may write less)
        if root == "monsoon" and not spread and missing(type_, fields):
            bad.append(f"{path}:{line}: {type_} {kind or ''} lacks {', '.join(missing(type_, fields))}")
    assert not bad, "\n".join(bad)
    if root == "monsoon":     # the scan sees the writers: most declarations have a literal writer
        assert len(seen) >= 30, sorted(seen, key=str)


def test_what_the_writers_spread_is_declared():
    """The events written from a dataclass or a dict built elsewhere: their field names are declared too."""
    from monsoon.load.aio import RequestTotals
    from monsoon.load.stats import FleetTotals, SecondStats
    from monsoon.run.calibrate import Step
    from monsoon.run.experiment import interruption

    second = {f.name for f in dataclasses.fields(SecondStats)} - {"t"} | {"sec"}       # record_second
    assert second == E.EVENTS[E.LOAD].fields
    for totals in (FleetTotals, RequestTotals):                                        # _totals_dict
        check(E.OP, _fields({f.name for f in dataclasses.fields(totals)} - {"last_seq"}, "op", E.OP_LOAD_END))
    step = Step(index=0, target=10.0, seconds=5.0)
    check(E.CALIBRATION_STEP, {**step.to_dict(), "window": [0, 1]})
    assert not missing(E.CALIBRATION_STEP, {**step.to_dict(), "window": [0, 1]})
    check(E.OP, {"op": E.OP_INTERRUPTED, **interruption("SIGINT", 3.0, {"stage": "load", "phase": "burst"})})


def test_the_kept_runs_hold_only_declared_events():
    """Every event of the kept run directories is one this module declares (reading never validates: a run
    written before a declaration changed keeps loading; this says the declarations cover the runs kept)."""
    runs = sorted((REPO / "tests" / "fixtures").glob("*/timeline.jsonl"))
    assert runs
    for p in runs:
        for e in Events.load(p).events:
            fields = {k: v for k, v in e.items() if k != "type"}
            check(e["type"], fields)


# --- the readers ----------------------------------------------------------------------------------------------
READERS = ["monsoon/checks", "monsoon/report", "monsoon/analysis", "monsoon/timeline", "monsoon/history"]


def test_the_readers_name_events_by_their_declared_constants():
    """``events.of("load")`` / ``.first("meta")`` / ``op="load-end"`` spelled out in a reader: use the constant."""
    bad = []
    for d in READERS:
        for p in sorted((REPO / d).rglob("*.py")):
            if p.name == "events.py":
                continue
            for node in ast.walk(ast.parse(p.read_text())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr in ("of", "first") and node.args \
                        and isinstance(node.args[0], ast.Constant) and node.args[0].value in E.EVENTS:
                    bad.append(f"{p.relative_to(REPO)}:{node.lineno}: .{node.func.attr}({node.args[0].value!r})")
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr in ("of", "first"):
                    for k in node.keywords:
                        if k.arg in ("op", "event") and isinstance(k.value, ast.Constant):
                            bad.append(f"{p.relative_to(REPO)}:{node.lineno}: {k.arg}={k.value.value!r}")
    assert not bad, "\n".join(bad)


def test_every_fleet_s_totals_are_declared_on_load_end():
    """The load-end op carries a fleet's totals (harness.totals_dict): every field of every totals class must be
    declared, or the run stops with UndeclaredEvent at the end of its load. Hono's legs were not (its HTTP and
    CoAP mixes failed so on the real Hono, which CI cannot build)."""
    import dataclasses
    from monsoon.load.base import FleetTotals
    import monsoon.load.aio  # noqa: F401  (RequestTotals)
    import monsoon.load.hono  # noqa: F401  (HonoTotals)

    def subclasses(c):
        return [c, *(s for sub in c.__subclasses__() for s in subclasses(sub))]
    classes = subclasses(FleetTotals)
    assert {c.__name__ for c in classes} >= {"FleetTotals", "RequestTotals", "HonoTotals"}
    declared = E.OPS[E.OP_LOAD_END].fields
    for c in classes:
        missing = {f.name for f in dataclasses.fields(c)} - {"last_seq"} - declared
        assert not missing, (c.__name__, missing)
