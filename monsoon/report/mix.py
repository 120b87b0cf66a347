"""A request mix's report (``mix.json`` -> ``checklist.md``, ``report.html``): the capacity the ramp found in
ops/s of the whole mix and what stopped it (GC, latency, errors, ...), per operation its rate, p50 / p99 /
p99.9 latency and errors at the capacity step and over the whole ramp, and the warm-up's own numbers (judged
apart: ``mix_warmup``)."""
from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from monsoon.checks.base import Verdict
from monsoon.report.result import ExperimentResult
from monsoon.rundir import CHECKLIST_FILE, REPORT_FILE

MIX_FILE = "mix.json"
CAPACITY_CHECK = "mix_capacity"
WARMUP_CHECK = "mix_warmup"
OP_HEAD = ("operation", "share", "ok/s", "p50 ms", "p99 ms", "p99.9 ms", "errors", "refused")


def _n(x, fmt: str = ",.1f") -> str:
    return "-" if x is None else format(x, fmt)


def op_rows(record: dict, where: str = "capacity") -> list[Sequence[str]]:
    """Table rows per operation: at the capacity step (``where="capacity"``: the last step kept up, its
    window) or over the whole ramp (``"ramp"``)."""
    shares = record.get("shares", {})
    ops = record.get("capacity_step_ops") if where == "capacity" else record.get("ops")
    out: list[Sequence[str]] = []
    for op, w in (ops or {}).items():
        out.append((op, f"{shares.get(op, 0):.0%}", _n(w.get("ok_rate")), _n(w.get("p50_ms")), _n(w.get("p99_ms")),
                    _n(w.get("p999_ms")), f"{w.get('errors', 0):,}", f"{w.get('refused', 0):,}"))
    return out


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    return ["| " + " | ".join(OP_HEAD) + " |", "|" + "---|" * len(OP_HEAD)] + \
        ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in rows]


def markdown(record: dict, verdicts: Sequence[dict] = ()) -> str:
    w = record.get("warmup") or {}
    lines = [f"# Request mix: {record.get('stack')} / {record.get('experiment')} ({record.get('profile')})", "",
             f"Run `{record.get('run_id')}` on {record.get('host')} ({record.get('cpu_count')} CPUs), "
             f"{record.get('date')}, {record.get('seconds', 0):.0f} s. Weights {record.get('weights')}.", "",
             f"**{record.get('result', '-')}**", "",
             "## At the capacity step (its measured window)", "", *_table(op_rows(record, "capacity")),
             "", "## Over the whole ramp (JVM warm-up and overload step included; entity warm-up apart)", "",
             *_table(op_rows(record, "ramp")), "",
             f"## Warm-up (judged apart): {w.get('found', 0)} of {w.get('entities', 0)} entities touched in "
             f"{w.get('seconds', 0)} s", ""]
    wrows = [(op, "-", _n((w.get(op) or {}).get("ok_rate")), _n((w.get(op) or {}).get("p50_ms")),
              _n((w.get(op) or {}).get("p99_ms")), _n((w.get(op) or {}).get("p999_ms")),
              f"{(w.get(op) or {}).get('errors', 0):,}", "0") for op in ("lookup", "read") if w.get(op)]
    lines += _table(wrows) + [""]
    lines += ["## Steps", "", "| step | ops/s | writes sent/s | acked/s | gc | verdict |", "|---|---|---|---|---|---|"]
    for s in record.get("steps", []):
        gc = "-" if s.get("gc_fraction") is None else f"{s['gc_fraction']:.0%}"
        lines.append(f"| {s['index']} | {(s.get('mix') or {}).get('ops_target', 0):,.0f} | {s.get('send_rate', 0):,.0f} "
                     f"| {s.get('ack_rate', 0):,.0f} | {gc} | "
                     + ("kept up" if s.get("ok") else f"{s.get('criterion')}: {s.get('reason', '')}".replace("|", "/"))
                     + " |")
    lines.append("")
    for v in verdicts:
        lines.append(f"- {v['verdict'].upper()} `{v['name']}`: {v['message']}")
    if record.get("error"):
        lines.append(f"- ERROR: {record['error']}")
    return "\n".join(lines) + "\n"


def html_page(record: dict, verdicts: Sequence[dict] = ()) -> str:
    e = html.escape

    def table(rows: Sequence[Sequence[str]]) -> str:
        return ("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in OP_HEAD) + "</tr>"
                + "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in r) + "</tr>" for r in rows) + "</table>")
    ver = "".join(f"<li><b>{e(v['verdict'].upper())}</b> <code>{e(v['name'])}</code>: {e(v['message'])}</li>"
                  for v in verdicts)
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>request mix {e(str(record.get('stack')))}"
            f"</title><style>body{{font-family:sans-serif}} td,th{{padding:2px 8px;text-align:right}}</style></head>"
            f"<body><h1>Request mix: {e(str(record.get('stack')))} / {e(str(record.get('experiment')))}</h1>"
            f"<p><b>{e(str(record.get('result', '-')))}</b></p><h2>At the capacity step</h2>"
            f"{table(op_rows(record, 'capacity'))}<h2>Over the whole ramp</h2>{table(op_rows(record, 'ramp'))}"
            f"<ul>{ver}</ul></body></html>\n")


def write(run_dir: Path, record: dict, verdicts: Sequence[dict] = ()) -> None:
    run_dir = Path(run_dir)
    (run_dir / CHECKLIST_FILE).write_text(markdown(record, verdicts))
    (run_dir / REPORT_FILE).write_text(html_page(record, verdicts))


def capacity_verdict(record: dict) -> Verdict:
    """The ramp found a capacity and named what stopped it (``mix_capacity``); figures: the capacity in ops/s,
    and per operation its ok/s, p50/p99/p99.9 ms and errors at the capacity step (``p99_ms[read]``...)."""
    figures: dict[str, float] = {}
    if record.get("capacity_ops_s") is not None:
        figures["capacity_ops_s"] = float(record["capacity_ops_s"])
    for op, w in (record.get("capacity_step_ops") or {}).items():
        for k in ("ok_rate", "p50_ms", "p99_ms", "p999_ms", "errors"):
            if w.get(k) is not None:
                figures[f"{k}[{op}]"] = float(w[k])
    if record.get("error") and not record.get("steps"):
        return Verdict(CAPACITY_CHECK, "unknown", figures, f"no step was measured: {record['error']}")
    if record.get("capacity_ops_s") is None:
        return Verdict(CAPACITY_CHECK, "fail", figures, f"no step kept up: {record.get('result')}")
    if record.get("criterion") in ("max-rate", "interrupted") or record.get("generator_bound"):
        return Verdict(CAPACITY_CHECK, "fail", figures, f"only a lower bound, nothing on the platform stopped the "
                       f"ramp: {record.get('result')}")
    return Verdict(CAPACITY_CHECK, "pass", figures, str(record.get("result")))


def warmup_verdict(record: dict) -> Verdict:
    """Every entity was touched (found by name, read once) before the ramp, without error (``mix_warmup``)."""
    w = record.get("warmup") or {}
    figures = {k: float(v) for k, v in (("entities", w.get("entities")), ("found", w.get("found")),
                                        ("seconds", w.get("seconds"))) if v is not None}
    for op in ("lookup", "read"):
        for k in ("p50_ms", "p99_ms", "p999_ms", "errors"):
            v = (w.get(op) or {}).get(k)
            if v is not None:
                figures[f"warmup_{k}[{op}]"] = float(v)
    if not w:
        return Verdict(WARMUP_CHECK, "unknown", figures, "no warm-up ran")
    errs = sum((w.get(op) or {}).get("errors", 0) for op in ("lookup", "read"))
    msg = (f"{w.get('found', 0)} of {w.get('entities', 0)} entities found and read in {w.get('seconds')} s, "
           f"{errs} error(s); read p99 {_n((w.get('read') or {}).get('p99_ms'))} ms")
    return Verdict(WARMUP_CHECK, "pass" if not errs and w.get("found") == w.get("entities") else "fail", figures, msg)


@dataclass
class MixResult(ExperimentResult):
    """A request mix's result (``monsoon.mix(stack, experiment)``): the experiment's checks, ``mix_capacity``
    and ``mix_warmup``; its record (``mix.json``); a failure message with the per-operation table."""
    record: dict = field(default_factory=dict)

    @classmethod
    def from_record(cls, record: dict, out_dir: Path, profile: str) -> "MixResult":
        checks = [Verdict(v["name"], v["verdict"], dict(v.get("figures", {})), v.get("message", ""))
                  for v in record.get("checks", [])] + [capacity_verdict(record), warmup_verdict(record)]
        return cls(record.get("stack", "?"), record.get("experiment", "?"), profile, Path(out_dir), checks=checks,
                   error=record.get("error"), record=record)

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["kind"] = "request-mix"
        d["figures"].update({k: v for c in self.checks if c.name == CAPACITY_CHECK for k, v in c.figures.items()})
        return d

    def failure_message(self) -> str:
        head, *rest = super().failure_message().splitlines()
        table = ["  " + " | ".join(OP_HEAD)] + ["  " + " | ".join(r) for r in op_rows(self.record, "capacity")]
        return "\n".join([head, f"  {self.record.get('result')}", *table, *rest])
