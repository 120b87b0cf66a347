"""The HTML report of a run: one self-contained file (:data:`monsoon.rundir.REPORT_FILE`): the sign-off
checklist on top, then per experiment six plots over time (rate, latency, backlog, memory, gc, stored) with
burst phases, fault windows, collector silences and service exits marked; long runs also get each fault
window zoomed. The plots and the choices behind them: docs/ (the report page).
"""
from __future__ import annotations

import base64
import html
import io
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

import json

from monsoon.checks.base import combine
from monsoon.checks.lag import lag_seconds_series
from monsoon.checks.memory import timeline_gc_pauses
from monsoon.checks.oom import deaths
from monsoon.report.checklist import ICON, KEY_FIGURES, _fmt, platform_line
from monsoon.report import sidebyside
from monsoon.rundir import REPORT_FILE, TIMELINE_FILE, experiment_dir_name
from monsoon.timeline.store import Events
from monsoon.timeline.views import fault_windows, silences
from monsoon.timeline.events import LOAD, META, PHASE, SAMPLE, SERVICE


MAX_POINTS = 2000
ZOOM_MIN_SPAN_S = 1800.0     # runs shorter than this show every fault window well enough at full width
MAX_ZOOMS = 6                # zoomed fault windows per experiment (6 plots each)
PLOTS = ("rate", "latency", "backlog", "memory", "gc", "stored")
TITLES = {
    "rate": "Load: target vs achieved rate (msg/s)",
    "latency": "Ack latency (ms, log scale)",
    "backlog": "Backlog",
    "memory": "Memory (MB)",
    "gc": "GC time (% of wall time)",
    "stored": "Stored rate (msg/s)",
}
BURST_COLOR, FAULT_COLOR, SILENCE_COLOR = "#ff9f1c", "#8e44ad", "#7f7f7f"
EXIT_COLOR, OOM_COLOR, RESTART_COLOR = "#d62728", "#8b0000", "#2ca02c"
FIG_W, FIG_H, DPI = 12.8, 2.8, 100
MARGINS = dict(left=0.06, right=0.93, top=0.84, bottom=0.17)  # equal for every plot, so time axes line up
PLOT_PIXELS = int(FIG_W * DPI * (MARGINS["right"] - MARGINS["left"]))   # pixel columns of a plot's time axis:
# a "minmax" line keeps each column's lowest and highest value, so a 24 h run's 10 s dip or spike survives


# ------------------------------------------------------------------ series helpers

def downsample(t, y, n: int = MAX_POINTS, how: str = "mean") -> tuple[np.ndarray, np.ndarray]:
    """At most ~``n`` points: equal-width time buckets reduced by ``mean``, ``max`` or ``minmax`` (an envelope)."""
    t = np.asarray(t, dtype=float)
    y = np.asarray(y, dtype=float)
    ok = np.isfinite(t) & np.isfinite(y)
    t, y = t[ok], y[ok]
    if len(t) <= n:
        return t, y
    order = np.argsort(t, kind="stable")
    t, y = t[order], y[order]
    buckets = max(1, n // 2 if how == "minmax" else n)
    span = t[-1] - t[0]
    if span <= 0:
        return t[:1], y[:1]
    idx = np.minimum(((t - t[0]) / span * buckets).astype(np.int64), buckets - 1)
    starts = np.flatnonzero(np.r_[True, idx[1:] != idx[:-1]])
    counts = np.diff(np.r_[starts, len(t)])
    tm = np.add.reduceat(t, starts) / counts
    if how == "mean":
        return tm, np.add.reduceat(y, starts) / counts
    if how == "max":
        return tm, np.maximum.reduceat(y, starts)
    lo, hi = np.minimum.reduceat(y, starts), np.maximum.reduceat(y, starts)
    return np.repeat(tm, 2), np.column_stack([lo, hi]).ravel()


def per_second(points: list[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    """Rate of a cumulative counter: (t, dv/dt).  A counter that went down (a restarted process) restarts from 0."""
    if len(points) < 2:
        return np.array([]), np.array([])
    a = np.asarray(sorted(points), dtype=float)
    t, v = a[:, 0], a[:, 1]
    dt, dv = np.diff(t), np.diff(v)
    dv = np.where(dv < 0, v[1:], dv)
    ok = dt > 0
    return t[1:][ok], dv[ok] / dt[ok]


@dataclass
class Window:
    name: str
    start: float
    end: float | None
    kind: str  # "burst" | "phase" | "fault" | "silence" (a collector that gave no answer)


@dataclass
class Marker:
    t: float
    kind: str  # "exit" | "oom" | "restart"
    label: str


def _cols(points: list[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray]:
    a = np.asarray(points, dtype=float).reshape(-1, 2)
    return a[:, 0], a[:, 1]


def _human(v: float, _pos=None) -> str:
    a = abs(v)
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{v / div:g}{suffix}"
    return f"{v:g}"


def _num(v) -> TypeGuard[float]:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def windows_of(ev: Events) -> list[Window]:
    out = []
    for p in ev.of(PHASE):
        if _num(p.get("start")):
            name = str(p.get("name", "phase"))
            out.append(Window(name, float(p["start"]), float(p["end"]) if _num(p.get("end")) else None,
                              "burst" if "burst" in name.lower() else "phase"))
    for w in fault_windows(ev):
        out.append(Window(f"{w.name}#{w.window}" if w.window else w.name, w.start, w.end, "fault"))
    for s in silences(ev):
        out.append(Window(f"{s.collector} silent", s.start, s.end, "silence"))
    return out


def span_of(ev: Events, windows: list[Window] | None = None) -> tuple[float, float]:
    """(first, last) timeline t of the load, samples, services and windows of a timeline."""
    windows = windows_of(ev) if windows is None else windows
    ts = [e["t"] for e in ev.events if _num(e.get("t")) and e.get("type") in (LOAD, SAMPLE, SERVICE)]
    ts += [w.start for w in windows] + [w.end for w in windows if w.end is not None]
    return (min(ts), max(ts)) if ts else (0.0, 1.0)


def zoom_views(ev: Events, windows: list[Window] | None = None, limit: int = MAX_ZOOMS
               ) -> tuple[list[tuple[Window, tuple[float, float]]], int]:
    """The fault windows of a long run worth a zoom (each shorter than a tenth of the run, the run longer than
    ``ZOOM_MIN_SPAN_S``), with their views: the window plus half its length (at least 30 s) either side.
    Returns (the first ``limit``, how many more there were)."""
    windows = windows_of(ev) if windows is None else windows
    t0, t1 = span_of(ev, windows)
    span = t1 - t0
    if span < ZOOM_MIN_SPAN_S:
        return [], 0
    out = []
    for w in windows:
        end = t1 if w.end is None else w.end
        if w.kind != "fault" or end - w.start > span / 10:
            continue
        pad = max(30.0, (end - w.start) / 2)
        out.append((w, (max(t0, w.start - pad), min(t1, end + pad))))
    return out[:limit], max(0, len(out) - limit)


def markers_of(ev: Events) -> list[Marker]:
    """Exit and restart lines. An exit is drawn as an OOM only when ``no_oom`` would call it one (its
    evidence: ``monsoon.checks.oom.deaths``), so a pod kill's SIGKILL is an exit, not an OOM."""
    out = []
    ooms = {(e["service"], e["t"]) for e, _ in deaths(ev).ooms}
    for s in ev.of(SERVICE):
        if not _num(s.get("t")):
            continue
        svc = str(s.get("service", "?"))
        if s.get("event") == "exit":
            oom = (s.get("service"), s["t"]) in ooms
            code = f" {s['code']}" if s.get("code") is not None else ""
            out.append(Marker(float(s["t"]), "oom" if oom else "exit", f"{svc} {'OOM' if oom else 'exit'}{code}"))
        elif s.get("event") == "restart":
            out.append(Marker(float(s["t"]), "restart", f"{svc} restart"))
    return out


def _lag_seconds(ev: Events, max_polls: int = 1000) -> list[tuple[float, float]]:
    """Worst-partition lag in seconds (``monsoon.checks.lag.lag_seconds_series``; nothing when the samples
    cannot give it: the series is skipped).  Its interpolation table grows with every poll, so a long run's
    kafka samples are thinned to ~``max_polls`` first: plenty for a plot, and it keeps a 24 h report fast."""
    samples = [e for e in ev.of(SAMPLE, collector="kafka") if isinstance(e.get("partitions"), dict)]
    if not samples:
        return []
    step = max(1, -(-len(samples) // max_polls))
    try:
        out = lag_seconds_series(Events(samples[::step]))
        return [(float(t), float(v)) for t, v in out if _num(t) and _num(v)]
    except Exception:   # samples the series cannot be built from (an old run's shape): the plot goes without it
        return []


# ------------------------------------------------------------------ plotting

class Plotter:
    """The six plots of one timeline; with ``view`` (t0, t1), only that stretch, drawn from the samples in it
    (a zoom into a fault window of a long run: not the whole run's downsampled points)."""

    def __init__(self, ev: Events, run_dir: Path | None = None, view: tuple[float, float] | None = None,
                 memo: dict | None = None):
        self.ev = ev  # Events indexes by type and collector, so per-series look-ups don't rescan
        self.memo = memo if memo is not None else {}    # series already pulled out of ev (shared by the zooms)
        self.gc_pauses = self._memo("gc", lambda: self._gc_pauses(run_dir))
        self.windows = self._memo("windows", lambda: windows_of(ev))
        self.markers = self._memo("markers", lambda: markers_of(ev))
        self.t0, self.t1 = view if view is not None else span_of(ev, self.windows)
        self.view = view
        if self.t1 <= self.t0:
            self.t1 = self.t0 + 1.0
        span = self.t1 - self.t0
        self.unit, self.div = ("h", 3600.0) if span > 3 * 3600 else ("min", 60.0) if span > 900 else ("s", 1.0)

    # -- frame shared by all six plots
    def _axes(self, name: str):
        fig = Figure(figsize=(FIG_W, FIG_H), dpi=DPI)
        FigureCanvasAgg(fig)
        fig.subplots_adjust(**MARGINS)
        ax = fig.add_subplot(1, 1, 1)
        ax.set_title(TITLES[name], loc="left", fontsize=10, fontweight="bold", pad=16)
        ax.set_xlim(self.t0 / self.div, self.t1 / self.div)
        ax.set_xlabel(f"timeline t ({self.unit})", fontsize=8)
        ax.tick_params(labelsize=8)
        ax.grid(True, alpha=0.25, linewidth=0.6)
        ax.yaxis.set_major_formatter(FuncFormatter(_human))  # 6M, not "1e6" over the axis
        for w in self.windows:
            end = self.t1 if w.end is None else w.end
            x0, x1 = w.start / self.div, end / self.div
            if w.kind == "burst":
                ax.axvspan(x0, x1, color=BURST_COLOR, alpha=0.18, linewidth=0, zorder=0)
            elif w.kind == "fault":
                ax.axvspan(x0, x1, facecolor=FAULT_COLOR, alpha=0.16, hatch="//", edgecolor=FAULT_COLOR,
                           linewidth=0, zorder=0)
            elif w.kind == "silence":      # what was not seen there: lighter than a fault, grey, cross-hatched
                ax.axvspan(x0, x1, facecolor=SILENCE_COLOR, alpha=0.10, hatch="xx", edgecolor=SILENCE_COLOR,
                           linewidth=0, zorder=0)
            else:
                ax.axvline(x0, color="#999999", linewidth=0.6, linestyle=":", zorder=1)
        shown = [w for w in self.windows if self.t0 <= w.start <= self.t1]
        if len(shown) <= 12:  # phase / fault names along the top
            for w in shown:
                ax.text(w.start / self.div, 1.0, " " + w.name, transform=ax.get_xaxis_transform(), fontsize=7,
                        va="bottom", ha="left", color={"fault": FAULT_COLOR, "silence": SILENCE_COLOR}.get(w.kind, "#555555"),
                        clip_on=False)
        for m in self.markers:
            color = {"oom": OOM_COLOR, "exit": EXIT_COLOR, "restart": RESTART_COLOR}[m.kind]
            ax.axvline(m.t / self.div, color=color, linewidth=1.4 if m.kind != "restart" else 1.1,
                       linestyle="--" if m.kind == "restart" else "-", zorder=3)
        return fig, ax

    def _memo(self, key, make):
        if key not in self.memo:
            self.memo[key] = make()
        return self.memo[key]

    def _series(self, collector: str, field: str) -> list[tuple[float, float]]:
        return self._memo(("series", collector, field), lambda: self.ev.series(collector, field))

    def _x(self, t):
        return np.asarray(t, dtype=float) / self.div

    def _no_data(self, ax, why: str) -> None:
        ax.set_yticks([])
        ax.text(0.5, 0.5, f"no data: {why}", transform=ax.transAxes, ha="center", va="center", fontsize=11,
                color="#777777", bbox=dict(facecolor="white", edgecolor="#cccccc", boxstyle="round"))

    def _label_markers(self, ax) -> None:
        """Name the exit/restart lines; markers closer than ~1.5% of the axis share one label."""
        groups: list[list[Marker]] = []
        for m in sorted((m for m in self.markers if self.t0 <= m.t <= self.t1), key=lambda m: m.t):
            if groups and m.t - groups[-1][0].t <= 0.015 * (self.t1 - self.t0):
                groups[-1].append(m)
            else:
                groups.append([m])
        if len(groups) > 12:
            return
        colors = {"oom": OOM_COLOR, "exit": EXIT_COLOR, "restart": RESTART_COLOR}
        for g in groups:  # just left of the first line, on a white patch so the line doesn't strike it out
            labels = list(dict.fromkeys(m.label for m in g))
            text = ", ".join(labels[:3]) + (f" (+{len(labels) - 3})" if len(labels) > 3 else "")
            ax.annotate(text, (g[0].t / self.div, 0.96), xycoords=ax.get_xaxis_transform(), xytext=(-3, 0),
                        textcoords="offset points", fontsize=7, rotation=90, va="top", ha="right", zorder=5,
                        color=colors[g[0].kind], bbox=dict(facecolor="white", edgecolor="none", alpha=0.8, pad=0.6))

    @staticmethod
    def _png(fig) -> bytes:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=DPI)
        return buf.getvalue()

    def _ds(self, t, y, n: int, how: str) -> tuple[np.ndarray, np.ndarray]:
        """``downsample`` of the points in view (a zoom keeps one sample before and after it, so the lines
        reach the edges)."""
        t, y = np.asarray(t, dtype=float), np.asarray(y, dtype=float)
        if self.view is not None and len(t):
            i = max(0, int(np.searchsorted(t, self.t0, side="left")) - 1)
            j = int(np.searchsorted(t, self.t1, side="right")) + 1
            if bool(np.all(t[1:] >= t[:-1])):
                t, y = t[i:j], y[i:j]
            else:
                keep = (t >= self.t0 - 1.0) & (t <= self.t1 + 1.0)
                t, y = t[keep], y[keep]
        return downsample(t, y, n, how)

    def _line(self, ax, t, y, how: str, **kw) -> None:
        x, y = self._ds(t, y, 2 * PLOT_PIXELS if how == "minmax" else MAX_POINTS, how)
        ax.plot(self._x(x), y, linewidth=kw.pop("linewidth", 1.1), **kw)

    def _gc_pauses(self, run_dir: Path | None) -> list[tuple[float, float, float]]:
        """(timeline t, MB after GC, pause s) of every GC pause in the experiment's GC logs (every JVM life),
        mapped onto the timeline clock through the events' wall times."""
        if run_dir is None:
            return []
        return [(t, p.after_mb, p.pause_ms / 1000.0) for t, p in timeline_gc_pauses(run_dir, self.ev)]

    def _load_series(self, field: str, positive: bool = False) -> tuple[list[float], list[float]]:
        return self._memo(("load", field, positive), lambda: self._pull_load(field, positive))

    def _pull_load(self, field: str, positive: bool) -> tuple[list[float], list[float]]:
        t, y = [], []
        for e in self.ev.of(LOAD):
            v = e.get(field)
            if _num(v) and _num(e.get("t")) and (not positive or v > 0):
                t.append(e["t"])
                y.append(float(v))
        return t, y


    # -- the six plots; each returns (png bytes, has_data)
    def rate(self):
        fig, ax = self._axes("rate")
        tt, target = self._load_series("target_rate")
        ta, acked = self._load_series("acked")
        tf, failed = self._load_series("failed")
        if not tt and not ta:
            self._no_data(ax, "no load events")
        else:
            if tt:
                self._line(ax, tt, target, "mean", color="#555555", linestyle="--", label="target")
            if ta:
                self._line(ax, ta, acked, "minmax", color="#1f77b4", label="acked")
            if tf and max(failed) > 0:
                self._line(ax, tf, failed, "minmax", color=EXIT_COLOR, linewidth=0.9, label="failed")
            ax.set_ylim(bottom=0)
            ax.set_ylabel("msg/s", fontsize=8)
            ax.legend(loc="upper right", fontsize=7, framealpha=0.85)
        self._label_markers(ax)
        return self._png(fig), bool(tt or ta)

    def latency(self):
        fig, ax = self._axes("latency")
        t50, p50 = self._load_series("p50_ms", positive=True)
        t99, p99 = self._load_series("p99_ms", positive=True)
        if not t50 and not t99:
            self._no_data(ax, "no ack latency in load events")
        else:
            ax.set_yscale("log")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.yaxis.set_minor_formatter(FuncFormatter(
                lambda v, _: f"{v:g}" if f"{v:.0e}"[0] in "25" else ""))
            if t99:
                self._line(ax, t99, p99, "max", color="#d62728", label="p99")
            if t50:
                self._line(ax, t50, p50, "minmax", color="#1f77b4", label="p50")
            ax.set_ylabel("ms", fontsize=8)
            ax.legend(loc="upper right", fontsize=7, framealpha=0.85)
        return self._png(fig), bool(t50 or t99)

    def backlog(self):
        fig, ax = self._axes("backlog")
        series, what = self._series("kafka", "lag"), "Kafka consumer lag (messages)"
        if not series:
            series, what = self._series("metrics", "queue_depth"), "queue depth (messages)"
        secs = self._memo("lag_seconds", lambda: _lag_seconds(self.ev))
        ax.set_title(f"{TITLES['backlog']}: {what.split(' (')[0]}", loc="left", fontsize=10, fontweight="bold")
        if not series and not secs:
            self._no_data(ax, "no Kafka lag or queue depth samples")
        else:
            handles = []
            if series:
                t, y = _cols(series)
                self._line(ax, t, y, "max", color="#ff7f0e", label=what)
                ax.set_ylim(bottom=0)
                ax.set_ylabel("messages", fontsize=8)
                handles += ax.get_lines()[-1:]
            if secs:
                ax2 = ax.twinx() if series else ax
                t, y = _cols(secs)
                x, y = self._ds(t, y, MAX_POINTS, "max")
                (ln,) = ax2.plot(self._x(x), y, color="#9467bd", linewidth=1.0, linestyle="-.", label="lag (s)")
                ax2.set_ylim(bottom=0)
                ax2.set_ylabel("seconds", fontsize=8)
                ax2.tick_params(labelsize=8)
                ax2.yaxis.set_major_formatter(FuncFormatter(_human))
                handles.append(ln)
            ax.legend(handles=handles, loc="upper right", fontsize=7, framealpha=0.85)
        return self._png(fig), bool(series or secs)

    def memory(self):
        fig, ax = self._axes("memory")
        used = self._series("metrics", "heap_used")
        mx = self._series("metrics", "heap_max")
        rss = self._series("process", "rss_mb")
        after = self.gc_pauses
        if not used and not mx and not rss and not after:
            self._no_data(ax, "no heap or RSS samples")
        else:
            mb = 1024.0 * 1024.0
            if mx:
                t, y = _cols(mx)
                self._line(ax, t, y / mb, "max", color="#555555", linestyle="--", label="heap max")
            if used:
                t, y = _cols(used)
                self._line(ax, t, y / mb, "minmax", color="#2ca02c", label="heap used")
            if rss:
                t, y = _cols(rss)
                self._line(ax, t, y, "max", color="#9467bd", label="RSS")
            if after:   # the live set: what survives each collection (GC log), what no_memory_leak judges
                t, y = np.array([a for a, _, _ in after]), np.array([b for _, b, _ in after])
                x, y = self._ds(t, y, MAX_POINTS, "max")
                ax.plot(self._x(x), y, linestyle="none", marker=".", markersize=2.5, color="#d62728",
                        label="heap after GC")
            ax.set_ylim(bottom=0)
            ax.set_ylabel("MB", fontsize=8)
            ax.legend(loc="upper right", fontsize=7, framealpha=0.85)
        return self._png(fig), bool(used or mx or rss or after)

    def gc(self):
        fig, ax = self._axes("gc")
        t, r = per_second(self._series("metrics", "gc_seconds"))
        if not len(t) and self.gc_pauses:   # no gc_seconds metric: the GC log's pauses, summed per second
            secs: dict[int, float] = {}
            for at, _, d in self.gc_pauses:
                secs[int(at)] = secs.get(int(at), 0.0) + d
            lo, hi = min(secs), max(secs)
            t = np.arange(lo, hi + 1, dtype=float)
            r = np.array([secs.get(int(x), 0.0) for x in t])
        if not len(t):
            self._no_data(ax, "no gc_seconds samples and no GC log")
        else:
            self._line(ax, t, np.clip(r * 100.0, 0, 100), "max", color="#8c564b", label="GC time")
            ax.set_ylim(bottom=0)
            ax.set_ylabel("% of wall time", fontsize=8)
        return self._png(fig), bool(len(t))

    def stored(self):
        fig, ax = self._axes("stored")
        pts = self._series("storage", "stored") or self._series("metrics", "stored")
        t, r = per_second(pts)
        if not len(t):
            self._no_data(ax, "no stored-count samples")
        else:
            tt, target = self._load_series("target_rate")
            if tt:
                self._line(ax, tt, target, "mean", color="#aaaaaa", linestyle="--", linewidth=0.9, label="target")
            self._line(ax, t, r, "minmax", color="#17becf", label="stored")
            ax.set_ylim(bottom=0)
            ax.set_ylabel("msg/s", fontsize=8)
            ax.legend(loc="upper right", fontsize=7, framealpha=0.85)
        return self._png(fig), bool(len(t))


# rendered plots per timeline file (path, mtime, size): a session rewrites the report after each experiment
_CACHE: dict[tuple, list[tuple[str, str, bool]]] = {}


def plots_for(timeline: Path, events: Events | None = None, view: tuple[float, float] | None = None,
              memo: dict | None = None) -> list[tuple[str, str, bool]]:
    """[(plot name, base64 PNG, has data)] for the six plots of one timeline (``events``: the timeline, when
    the caller has it loaded already; ``monsoon analyze`` loads each timeline once); ``view``: a zoom."""
    st = timeline.stat()
    key = (str(timeline.resolve()), st.st_mtime_ns, st.st_size, view)
    if key in _CACHE:
        return _CACHE[key]
    p = Plotter(events if events is not None else Events.load(timeline), timeline.parent, view, memo)
    out = []
    for name in PLOTS:
        png, has = getattr(p, name)()
        out.append((name, base64.b64encode(png).decode("ascii"), has))
    if len(_CACHE) > 64:
        _CACHE.clear()
    _CACHE[key] = out
    return out


# ------------------------------------------------------------------ HTML

CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:24px;color:#222;max-width:1300px}
h1{font-size:22px;margin:0 0 12px}h2{font-size:18px;margin:28px 0 6px}h3{font-size:15px;margin:16px 0 6px}
.decision{font-size:20px;font-weight:bold;padding:10px 16px;border-radius:6px;margin:8px 0 14px;display:inline-block}
.decision.go{background:#d4edda;color:#155724;border:1px solid #9fd3ab}
.decision.nogo{background:#f8d7da;color:#721c24;border:1px solid #e6a5ab}
table{border-collapse:collapse;font-size:13px;width:100%}
th,td{border:1px solid #ccc;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#f2f2f2}
td.verdict{font-weight:bold;text-align:center;white-space:nowrap}
.pass{background:#d4edda;color:#155724}.fail{background:#f8d7da;color:#721c24}.unknown{background:#fff3cd;color:#856404}.info{background:#e2e3e5;color:#383d41}
.badge{font-size:13px;padding:2px 8px;border-radius:4px;margin-left:8px;vertical-align:middle}
td.msg{color:#444;font-size:12px}
ul.evidence li{margin:4px 0;font-size:13px}
section.experiment{border-top:2px solid #ddd;margin-top:26px;padding-top:4px}
.meta{font-size:12px;color:#555;margin:2px 0 8px}
.key{font-size:12px;color:#444;margin:6px 0 10px}
.key span.sw{display:inline-block;width:22px;height:11px;vertical-align:middle;margin:0 4px 0 12px}
figure{margin:0 0 6px}figure img{width:100%;max-width:1200px;display:block}
a{color:#0b5ea8}
footer{margin-top:30px;font-size:11px;color:#888}
details.zoom{margin:4px 0 8px}details.zoom summary{cursor:pointer;font-size:13px;color:#8e44ad}
"""

KEY_HTML = (
    '<div class="key">'
    f'<span class="sw" style="background:{BURST_COLOR};opacity:.35"></span>burst phase'
    f'<span class="sw" style="background:repeating-linear-gradient(45deg,{FAULT_COLOR}55 0 3px,transparent 3px 6px)">'
    '</span>fault window'
    f'<span class="sw" style="border-left:2px solid {OOM_COLOR};width:0;height:13px"></span>OOM exit'
    f'<span class="sw" style="border-left:2px solid {EXIT_COLOR};width:0;height:13px"></span>other exit'
    f'<span class="sw" style="border-left:2px dashed {RESTART_COLOR};width:0;height:13px"></span>restart'
    '<span class="sw" style="border-left:1px dotted #999;width:0;height:13px"></span>phase boundary'
    '</div>'
)


def _e(s) -> str:
    return html.escape(str(s), quote=True)


def _slug(s: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in s)


def _experiment_dirs(run_dir: Path, results: list[dict]) -> list[tuple[Path | None, dict | None, str]]:
    """(timeline dir or None, result or None, label): every result, plus timelines no result names yet."""
    subs = sorted(p for p in run_dir.iterdir() if p.is_dir() and (p / TIMELINE_FILE).exists()) \
        if run_dir.is_dir() else []
    by_name = {p.name: p for p in subs}
    used: set[str] = set()
    out: list[tuple[Path | None, dict | None, str]] = []
    for r in results:
        d = None
        if r.get("dir"):
            cand = Path(r["dir"])
            if cand.name in by_name:
                d = by_name[cand.name]
            elif (cand / TIMELINE_FILE).exists():
                d = cand
        if d is None:
            d = by_name.get(experiment_dir_name(str(r.get('stack')), str(r.get('experiment'))))
        if d is not None:
            used.add(d.name)
        out.append((d, r, f"{r.get('stack', '?')} / {r.get('experiment', '?')}"))
    for p in subs:
        if p.name not in used:
            meta = _meta_quick(p / TIMELINE_FILE)
            out.append((p, None, f"{meta.get('stack', '?')} / {meta.get('experiment', p.name)}"))
    return out


def _anchor(d: Path | None, label: str) -> str:
    return "exp-" + _slug(d.name if d is not None else label.replace(" / ", "--"))


def render(run_dir: Path, summary_: dict, events: dict[Path, Events] | None = None) -> str:
    """The report page; ``events``: loaded timelines by experiment directory (the others are read)."""
    run_dir = Path(run_dir)
    events = {Path(k).resolve(): v for k, v in (events or {}).items()}
    results = summary_.get("results", [])
    overall = combine([r["verdict"] for r in results])
    decision = "GO" if overall == "pass" else "NO-GO"
    npass = sum(r["verdict"] == "pass" for r in results)
    exps = _experiment_dirs(run_dir, results)
    anchors = {id(r): _anchor(d, label) for d, r, label in exps if r is not None}
    title = f"monsoon resilience sign-off — run {summary_.get('run_id', '?')} ({summary_.get('profile', '?')} profile)"

    h = ['<!DOCTYPE html>', '<html lang="en"><head><meta charset="utf-8">',
         '<meta name="viewport" content="width=device-width, initial-scale=1">',
         f'<title>{_e(title)}</title><style>{CSS}</style></head><body>',
         f'<h1>{_e(title)}</h1>', '<section id="checklist">',
         f'<div id="decision" class="decision {"go" if decision == "GO" else "nogo"}" data-decision="{decision}">'
         f'Decision: {decision} — {npass} of {len(results)} experiments pass.</div>',
         '<table id="checklist-table"><thead><tr><th>stack</th><th>experiment</th><th>check</th><th>verdict</th>'
         '<th>key figures</th><th>evidence</th></tr></thead><tbody>']
    for r in results:
        link = f'<a href="#{anchors.get(id(r), "")}">{_e(r["experiment"])}</a>'
        if r.get("error"):
            h.append(f'<tr data-stack="{_e(r["stack"])}" data-experiment="{_e(r["experiment"])}" data-check="(run)" '
                     f'data-verdict="unknown"><td>{_e(r["stack"])}</td><td>{link}</td><td>(run)</td>'
                     f'<td class="verdict unknown">UNKNOWN</td><td></td><td class="msg">{_e(r["error"])}</td></tr>')
        for c in r.get("checks", []):
            keys = KEY_FIGURES.get(c["name"], tuple(c.get("figures", {}))[:3])
            figs = ", ".join(f"{k}={_fmt(c['figures'][k])}" for k in keys if k in c.get("figures", {}))
            v = c["verdict"]
            h.append(f'<tr data-stack="{_e(r["stack"])}" data-experiment="{_e(r["experiment"])}" '
                     f'data-check="{_e(c["name"])}" data-verdict="{_e(v)}"><td>{_e(r["stack"])}</td><td>{link}</td>'
                     f'<td>{_e(c["name"])}</td><td class="verdict {_e(v)}">{_e(ICON.get(v, v))}</td>'
                     f'<td>{_e(figs)}</td><td class="msg">{_e(c.get("message", ""))}</td></tr>')
    h.append('</tbody></table>')
    fails = [(r, c) for r in results for c in r.get("checks", []) if c["verdict"] not in ("pass", "info")]
    if fails:
        h.append('<h3>Evidence</h3><ul class="evidence">')
        for r, c in fails:
            h.append(f'<li><b>{_e(r["stack"])} / {_e(r["experiment"])} / {_e(c["name"])}</b> '
                     f'(<span class="{_e(c["verdict"])}">{_e(c["verdict"])}</span>): {_e(c.get("message", ""))}</li>')
        h.append('</ul>')
    h.append('</section>')
    for exp, (ph, rows) in sidebyside.tables(results).items():   # one experiment on several stacks
        h.append(f'<section class="side-by-side" data-experiment="{_e(exp)}"><h2>Side by side: {_e(exp)}</h2>'
                 '<table><thead><tr>' + "".join(f'<th>{_e(x)}</th>' for x in sidebyside.headers(ph))
                 + '</tr></thead><tbody>')
        for r in rows:
            h.append(f'<tr data-stack="{_e(r["stack"])}">' + "".join(f'<td>{_e(x)}</td>'
                     for x in sidebyside.cells(r, ph)) + '</tr>')
        h.append('</tbody></table></section>')

    for d, r, label in exps:
        anchor = _anchor(d, label)
        v = r["verdict"] if r else "unknown"
        stack, exp = (r["stack"], r["experiment"]) if r else label.split(" / ", 1)
        h.append(f'<section class="experiment" id="{anchor}" data-stack="{_e(stack)}" data-experiment="{_e(exp)}" '
                 f'data-verdict="{_e(v)}">')
        h.append(f'<h2>{_e(label)}<span class="badge {_e(v)}">{_e(ICON.get(v, v))}</span></h2>')
        if d is None:
            h.append(f'<p class="meta">no {TIMELINE_FILE} for this experiment: nothing to plot</p></section>')
            continue
        meta = _meta_quick(d / TIMELINE_FILE)
        bits = [f"{k}={meta[k]}" for k in ("profile", "base_rate", "shape", "multiplier", "devices", "qos")
                if k in meta]
        h.append(f'<p class="meta">{_e(d.name)}/{TIMELINE_FILE}' + (f' — {_e(", ".join(bits))}' if bits else "")
                 + (' — <b>not yet checked</b>' if r is None else "") + '</p>')
        if r and (r.get("base_rate") or {}).get("x1"):
            h.append(f'<p class="meta x1">{_e(r["base_rate"]["x1"])}</p>')
        if r and r.get("platform"):
            h.append(f'<p class="meta platform" data-platform="{_e(json.dumps(r["platform"]))}">platform, as it said '
                     f'when it ran: {_e(platform_line(r["platform"]))}</p>')
        h.append(KEY_HTML)
        try:
            ev = events.get(d.resolve())
            ev = ev if ev is not None else Events.load(d / TIMELINE_FILE)    # once, for the plots and zooms
            memo: dict = {}                                                 # series pulled once per timeline
            plots = plots_for(d / TIMELINE_FILE, ev, memo=memo)
        except Exception as e:  # one unreadable timeline must not cost the others their plots
            h.append(f'<p class="meta">plots failed: {_e(type(e).__name__)}: {_e(e)}</p></section>')
            continue
        for name, b64, has in plots:
            h.append(f'<figure><img id="plot-{anchor[4:]}-{name}" data-plot="{name}" '
                     f'data-has-data="{"true" if has else "false"}" alt="{_e(label)}: {_e(TITLES[name])}" '
                     f'src="data:image/png;base64,{b64}"></figure>')
        h.extend(_zooms(d, ev, label, memo))
        h.append('</section>')
    h.append(f'<footer>generated by monsoon at {_e(time.strftime("%Y-%m-%d %H:%M:%S"))} from {_e(run_dir.name)}; '
             f'regenerate with <code>monsoon analyze {_e(run_dir.name)}</code>; '
             '<a id="history-link" href="../history.html">run history</a></footer></body></html>')
    return "\n".join(h) + "\n"


def _zooms(d: Path, ev: Events, label: str, memo: dict | None = None) -> list[str]:
    """A long run's fault windows, each zoomed (its six plots over the window and a margin), folded away."""
    memo = memo if memo is not None else {}
    try:
        views, more = zoom_views(ev)
        out = []
        for i, (w, (a, b)) in enumerate(views):
            end = "not healed" if w.end is None else f"{w.end:,.0f} s"
            out.append(f'<details class="zoom" data-window="{_e(w.name)}" data-start="{a:.1f}" data-end="{b:.1f}">'
                       f'<summary>Zoom into fault window {_e(w.name)}: t={w.start:,.0f} s to {_e(end)} '
                       f'(plots from {a:,.0f} s to {b:,.0f} s)</summary>')
            for name, b64, has in plots_for(d / TIMELINE_FILE, ev, (a, b), memo):
                out.append(f'<figure><img data-plot="{name}" data-zoom="{i}" data-has-data="{"true" if has else "false"}"'
                           f' alt="{_e(label)}: {_e(TITLES[name])}, {_e(w.name)}" src="data:image/png;base64,{b64}">'
                           '</figure>')
            out.append('</details>')
        if more:
            out.append(f'<p class="meta">{more} more fault window(s) not zoomed (the first {len(views)} are)</p>')
        return out
    except Exception as e:        # a zoom must not cost the page
        return [f'<p class="meta">zooms failed: {_e(type(e).__name__)}: {_e(e)}</p>']


def _meta_quick(path: Path) -> dict:
    """The meta event (the first line) without parsing the whole timeline."""
    try:
        with open(path) as fh:
            for line in fh:
                line = line.strip()
                if line:
                    ev = json.loads(line)
                    return ev if ev.get("type") == META else {}
    except (OSError, ValueError):
        pass
    return {}


def write(run_dir: Path, summary_: dict, events: dict[Path, Events] | None = None) -> Path:
    """Write ``report.html`` into ``run_dir`` atomically (a reader never sees half a file)."""
    run_dir = Path(run_dir)
    out = run_dir / REPORT_FILE
    tmp = run_dir / f".{REPORT_FILE}.{os.getpid()}.tmp"
    tmp.write_text(render(run_dir, summary_, events), encoding="utf-8")
    os.replace(tmp, out)
    return out
