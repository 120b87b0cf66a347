"""A size sweep's report (``sweep.json`` -> ``checklist.md``, ``report.html``, ``sweep.png``): per size, the
platform's sustained capacity in msg/s and MB/s beside its bare transport's, and the platform's overhead.

MB/s is msg/s x the nominal size (10^6 bytes per MB, as Spring XD's write-up counts).  The overhead is
``1 - platform MB/s / transport MB/s``: how much less the platform sustains than its own transport moves
with nothing in between.  A capacity that is only a lower bound (the generator or the ladder's top was
reached first) is marked ``>=``, and then so is its overhead's upper bound.
"""
from __future__ import annotations

import html
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from monsoon.checks.base import Verdict
from monsoon.checks.gc import gc_rate_series
from monsoon.checks.registry import evaluate
from monsoon.report.result import ExperimentResult
from monsoon.rundir import CHECKLIST_FILE, REPORT_FILE, SWEEP_FILE, SWEEP_PLOT, TIMELINE_FILE
from monsoon.timeline.store import Events
from monsoon.timeline.events import OP, OP_SWEEP_SIZE


def rows(record: dict) -> list[dict]:
    """One row per size: ``size, msg_s, mb_s, bound, criterion, reason, transport_msg_s, transport_mb_s,
    overhead_pct`` (None where not measured)."""
    out = []
    for e in record.get("sizes", []):
        size = int(e["size"])
        cap = e.get("capacity_msg_s")
        tr = e.get("transport") or {}
        t_msg = tr.get("msg_s") if tr and not tr.get("error") and tr.get("consumed") else None
        mb = cap * size / 1e6 if cap is not None else None
        t_mb = t_msg * size / 1e6 if t_msg else None
        out.append({"size": size, "msg_s": cap, "mb_s": mb, "bound": bool(e.get("lower_bound")),
                    "criterion": e.get("criterion"), "reason": e.get("reason", ""),
                    "transport_msg_s": t_msg, "transport_mb_s": t_mb,
                    "overhead_pct": (100.0 * (1 - mb / t_mb)) if mb is not None and t_mb else None,
                    "transport_error": tr.get("error")})
    return out


def trend(values: list[float | None]) -> str:
    """``rises``, ``falls`` or ``mixed`` for a series in size order (``unknown`` with a gap or < 2 values)."""
    if len(values) < 2 or any(v is None for v in values):
        return "unknown"
    nums = [v for v in values if v is not None]     # all of them: a gap returned above
    pairs = list(zip(nums, nums[1:]))
    if all(b > a for a, b in pairs):
        return "rises"
    if all(b < a for a, b in pairs):
        return "falls"
    return "mixed"


def trends(record: dict) -> dict[str, str]:
    """What the sweep shows: the trend of msg/s and MB/s with size, for the platform and its transport."""
    rs = rows(record)
    return {"msg_s": trend([r["msg_s"] for r in rs]), "mb_s": trend([r["mb_s"] for r in rs]),
            "transport_msg_s": trend([r["transport_msg_s"] for r in rs]),
            "transport_mb_s": trend([r["transport_mb_s"] for r in rs])}


def _n(x: float | None, fmt: str = ",.0f", bound: bool = False) -> str:
    return "-" if x is None else (">= " if bound else "") + format(x, fmt)


def _size(n: int) -> str:
    for unit, k in (("MB", 1_000_000), ("KB", 1000)):
        if n >= k and n % (k // 10 or 1) == 0:
            return f"{n / k:g} {unit}"
    return f"{n} B"


TABLE_HEAD = ("size", "platform msg/s", "platform MB/s", "transport msg/s", "transport MB/s", "overhead",
              "stopped by")


def table_cells(r: dict) -> tuple[str, ...]:
    return (_size(r["size"]), _n(r["msg_s"], bound=r["bound"]), _n(r["mb_s"], ",.2f", r["bound"]),
            _n(r["transport_msg_s"]) if not r["transport_error"] else f"- ({r['transport_error'][:60]})",
            _n(r["transport_mb_s"], ",.2f"),
            "-" if r["overhead_pct"] is None else (f"<= {r['overhead_pct']:.0f}%" if r["bound"]
                                                   else f"{r['overhead_pct']:.0f}%"),
            f"{r['criterion']}: {r['reason']}" if r["criterion"] else "-")


def markdown(record: dict, verdicts: Sequence[dict] = ()) -> str:
    """The sweep's checklist: the table, the trends, the GC verdict(s)."""
    t = trends(record)
    lines = [f"# Size sweep: {record.get('stack')} / {record.get('experiment')} ({record.get('profile')})", "",
             f"Run `{record.get('run_id')}` on {record.get('host')} ({record.get('cpu_count')} CPUs), "
             f"{record.get('date')}, {record.get('seconds', 0):.0f} s. Platform: sustained capacity per size "
             "(the calibration's ramp); transport: the stack's Kafka alone, one producer and one consumer, "
             "no platform in between.", "",
             "| " + " | ".join(TABLE_HEAD) + " |", "|" + "---|" * len(TABLE_HEAD)]
    for r in rows(record):
        lines.append("| " + " | ".join(c.replace("|", "/") for c in table_cells(r)) + " |")
    lines += ["", f"- platform: msg/s **{t['msg_s']}** and MB/s **{t['mb_s']}** as the size grows",
              f"- transport: msg/s **{t['transport_msg_s']}** and MB/s **{t['transport_mb_s']}** as the size grows"]
    for v in verdicts:
        lines.append(f"- {v['verdict'].upper()} `{v['name']}`: {v['message']}")
    if record.get("error"):
        lines.append(f"- ERROR: {record['error']}")
    if record.get("plot"):
        lines += ["", f"![msg/s and MB/s per size]({record['plot']})"]
    return "\n".join(lines) + "\n"


def html_page(record: dict, verdicts: Sequence[dict] = ()) -> str:
    t = trends(record)
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in TABLE_HEAD)
    body = "".join("<tr>" + "".join(f"<td>{e(c)}</td>" for c in table_cells(r)) + "</tr>" for r in rows(record))
    ver = "".join(f"<li><b>{e(v['verdict'].upper())}</b> <code>{e(v['name'])}</code>: {e(v['message'])}</li>"
                  for v in verdicts)
    img = f'<img src="{e(record["plot"])}" alt="msg/s and MB/s per size">' if record.get("plot") else ""
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>size sweep {e(str(record.get('stack')))}"
            f"</title><style>body{{font-family:sans-serif}} td,th{{padding:2px 8px;text-align:right}}</style>"
            f"</head><body><h1>Size sweep: {e(str(record.get('stack')))} / {e(str(record.get('experiment')))}</h1>"
            f"<table><tr>{head}</tr>{body}</table><ul><li>platform: msg/s {e(t['msg_s'])}, MB/s {e(t['mb_s'])}"
            f"</li><li>transport: msg/s {e(t['transport_msg_s'])}, MB/s {e(t['transport_mb_s'])}</li>{ver}</ul>"
            f"{img}</body></html>\n")


def gc_panel(ax, events: Events) -> None:
    """The platform's GC time (% of wall time over 5 s windows, from its gc_seconds counter) over the sweep,
    each size's ramp shaded and labelled."""
    ops = [e for e in events.of(OP) if e.get("op") == OP_SWEEP_SIZE]
    ends = [e["t"] for e in ops[1:]] + [None]
    series = gc_rate_series(events.series("metrics", "gc_seconds"), 5.0)
    for k, (e, end) in enumerate(zip(ops, ends)):
        b = end if end is not None else (series[-1][0] if series else e["t"] + 1)
        ax.axvspan(e["t"], b, color=("#eeeeee" if k % 2 else "#ddeeff"), lw=0)
        ax.text(e["t"], 0.95, f" {_size(int(e['size']))}", fontsize=8, va="top", transform=ax.get_xaxis_transform())
    if series:
        ax.plot([t for t, _, _ in series], [100 * f for _, _, f in series], "-", color="tab:red")
    else:
        ax.text(0.5, 0.5, "no gc_seconds samples", transform=ax.transAxes, ha="center")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("GC time (% of wall, 5 s windows)")
    ax.set_ylim(bottom=0)


def plot(record: dict, path: Path, events: Events | None = None) -> Path | None:
    """Two panels, msg/s and MB/s against size (log-log), platform and transport, and with ``events`` (the
    sweep's timeline) a third: the platform's GC time over the sweep; None when nothing to plot."""
    rs = rows(record)
    if not any(r["msg_s"] or r["transport_msg_s"] for r in rs):
        return None
    fig = Figure(figsize=(15 if events is not None else 10, 4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3 if events is not None else 2)
    if events is not None:
        gc_panel(axes[2], events)
    for ax, key, label in ((axes[0], "msg_s", "msg/s"), (axes[1], "mb_s", "MB/s")):
        for who, k, style in (("platform", key, "o-"), ("transport (Kafka alone)", f"transport_{key}", "s--")):
            pts = [(r["size"], r[k]) for r in rs if r[k]]
            if pts:
                ax.plot(*zip(*pts), style, label=who)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(f"size sweep: {record.get('stack')}")
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    return path


def write(run_dir: Path, record: dict, verdicts: Sequence[dict] = ()) -> None:
    """``sweep.png`` (with the GC panel when the run directory has its timeline), ``checklist.md`` and
    ``report.html`` of a sweep run directory."""
    run_dir = Path(run_dir)
    try:
        events = Events.load(run_dir / TIMELINE_FILE) if (run_dir / TIMELINE_FILE).exists() else None
        if plot(record, run_dir / SWEEP_PLOT, events):
            record = dict(record, plot=SWEEP_PLOT)
    except Exception as e:   # a plot that cannot be drawn must not lose the table
        record = dict(record, plot_error=f"{type(e).__name__}: {e}")
    (run_dir / CHECKLIST_FILE).write_text(markdown(record, verdicts))
    (run_dir / REPORT_FILE).write_text(html_page(record, verdicts))


def reanalyze(run_dir: Path, events: Events) -> list[dict]:
    """``monsoon analyze`` of a sweep's directory: its checks (the timeline's ``meta``) judged again offline,
    ``sweep.json`` and the report rewritten; the verdicts."""
    run_dir = Path(run_dir)
    checks = [(c["name"], c.get("params", {})) for c in events.meta().get("checks", [])]
    verdicts = [v.to_dict() for v in evaluate(run_dir, checks, events=events)]
    path = run_dir / SWEEP_FILE
    record = json.loads(path.read_text()) if path.exists() else {"stack": events.meta().get("stack"), "sizes": []}
    record["checks"] = verdicts
    path.write_text(json.dumps(record, indent=2))
    write(run_dir, record, verdicts)
    return verdicts


CAPACITY_CHECK = "sweep_capacity"


def capacity_verdict(record: dict) -> Verdict:
    """Every size found a sustained capacity (``sweep_capacity``): fail naming the sizes where no step kept
    up, and say where a capacity is only a lower bound (``lower_bounds``: the ladder's top or the generator
    came first); its figures are each size's msg/s and MB/s, the platform's and its transport's
    (``msg_s[100B]``...)."""
    rs = rows(record)
    figures: dict[str, float] = {}
    for r in rs:
        for k in ("msg_s", "mb_s", "transport_msg_s", "transport_mb_s", "overhead_pct"):
            if r[k] is not None:
                figures[f"{k}[{r['size']}B]"] = round(float(r[k]), 3)
    missing = [_size(r["size"]) for r in rs if not r["msg_s"]]
    t = trends(record)
    said = f"msg/s {t['msg_s']} and MB/s {t['mb_s']} with size (transport: {t['transport_msg_s']}, " \
           f"{t['transport_mb_s']})"
    if not rs:
        return Verdict(CAPACITY_CHECK, "unknown", figures, "no size was swept")
    bounded = [f"{_size(r['size'])} ({r['criterion']})" for r in rs if r["msg_s"] and r["bound"]]
    if bounded:      # the ladder's top or the generator came first: the platform may sustain more there
        figures["lower_bounds"] = len(bounded)
        said += f"; only a lower bound at {', '.join(bounded)}"
    if missing:
        return Verdict(CAPACITY_CHECK, "fail", figures, f"no step kept up at {', '.join(missing)}; {said}")
    return Verdict(CAPACITY_CHECK, "pass", figures, f"a capacity at each of {len(rs)} sizes; {said}")


@dataclass
class SweepResult(ExperimentResult):
    """A size sweep's result (``monsoon.sweep(stack, experiment)``): its checks (the experiment's, judged over
    the whole sweep, and ``sweep_capacity``), its record (``sweep.json``), and a failure message with the
    table: per size, msg/s and MB/s of the platform and of its transport alone, and what stopped each ramp."""
    record: dict = field(default_factory=dict)

    @classmethod
    def from_record(cls, record: dict, out_dir: Path, profile: str) -> "SweepResult":
        checks = [Verdict(v["name"], v["verdict"], dict(v.get("figures", {})), v.get("message", ""))
                  for v in record.get("checks", [])] + [capacity_verdict(record)]
        return cls(record.get("stack", "?"), record.get("experiment", "?"), profile, Path(out_dir), checks=checks,
                   error=record.get("error"), record=record)

    @property
    def rows(self) -> list[dict]:
        return rows(self.record)

    @property
    def trends(self) -> dict[str, str]:
        return trends(self.record)

    def to_dict(self) -> dict:
        d = super().to_dict()
        d["kind"] = "size-sweep"
        d["figures"].update({k: v for c in self.checks if c.name == CAPACITY_CHECK for k, v in c.figures.items()})
        return d

    def failure_message(self) -> str:
        head, *rest = super().failure_message().splitlines()
        table = ["  " + " | ".join(TABLE_HEAD)] + ["  " + " | ".join(table_cells(r)) for r in self.rows]
        return "\n".join([head, *table, *rest])
