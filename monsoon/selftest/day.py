"""``python -m monsoon.selftest.day`` (``make bench-day``): a day's volume through monsoon's live path, in
compressed time.

``--messages`` QoS 1 messages (default 432 million: a 24-hour soak at 5,000 msg/s) at ``--rate`` msg/s
(default 100,000: 72 minutes) from the native engine (:class:`~monsoon.load.native.NativeFleet`, ``--workers``
processes, ``--devices`` connections) against the ack-only sink of ``make bench-load``
(:class:`~monsoon.selftest.bench.Sinks`, ``monsoon-loadgen sink``), through the pieces a soak runs: the
timeline (meta, phase, one ``load`` event a second through :meth:`~monsoon.run.harness.LoadHarness.record_second`),
the sampler and its collectors (the sink's ``process`` and ``cgroup`` samples, a ``storage`` count, and this
bench's own ``day`` collector), the live progress (:class:`~monsoon.observe.progress.LoadProgress`), the acked
dataset and ``latency.hlog`` the fleet writes, ``sent`` at the load's end, the drain
(:class:`~monsoon.run.drain.Drain`), the read-back and then ``monsoon analyze`` of the run directory in a child
process (as ``make bench-analyze`` times it: :func:`monsoon.selftest.analyze_bench.analyze_in_child`).

The storage stand-in: the sink acknowledges every PUBLISH and keeps nothing, so what it "stored" is every
message the engine handed out: ``(device, seq)`` for seq 0..last_seq of each device, from the fleet's own
``last_seq`` (:class:`StoredStandIn`, a :class:`~monsoon.observe.storage.StoredSource`). It is written without
reading the acked dataset, so the accounting (``no_acked_loss``, ``no_duplicates``, ``no_unexpected``) checks the
acked-data writer against the engine's sequence numbers: ``exact`` is true when the analysis finds every one of the
schedule's messages acked once, stored once, nothing lost, duplicated or unexpected, and the acked dataset holds
exactly as many rows as the engine counted acks.

Every ``--every`` seconds (60) the ``day`` collector samples the RSS and CPU of every monsoon process (this
Python process, which also writes the acked parts and the timeline; each engine worker; each sink process), the
run directory's size on disk (allocated blocks: the workers' CSV shards have their consumed bytes punched out)
and the bytes per acked message so far. Between samples it reads each process's RSS at every poll of the sampler
(about once a second) and keeps the highest: each sample carries ``rss_peak_mb`` beside ``rss_mb``.
``rss_growth_pct`` is each process's growth from its peak in the minute after ``--baseline-min`` (10; a third of
the load when the load is shorter than three times that) to its peak in the last minute of the load (peaks,
because RSS saw-tooths with the 30 s cycle that turns the shards into parts: one reading a minute lands on a
trough or a crest by chance). Progress goes to stderr; the last line on stdout is one JSON object.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from monsoon.load.fleet import FleetOptions, build_fleet
from monsoon.load.native import ensure_loadgen
from monsoon.load.shapes import Steady
from monsoon.load.stats import SecondStats
from monsoon.observe.collectors import CgroupOomCollector, Collector, ProcessCollector
from monsoon.observe.progress import LoadProgress, progress_fields
from monsoon.observe.sampler import Sampler
from monsoon.rundir import (ACKED_DATA, LATENCY_FILE, RESULT_FILE, SENT_DATA, STORED_DATA, TIMELINE_FILE,
                            experiment_dir_name, new_run_id)
from monsoon.run.drain import Drain
from monsoon.run.harness import LoadHarness, totals_dict
from monsoon.selftest.analyze_bench import analyze_in_child
from monsoon.selftest.bench import Sinks, proc_cpu_s, proc_rss_mb
from monsoon.stack.provision import Device
from monsoon.timeline.columnar import FLUSH_S, parts_dir, replacing, write_rows
from monsoon.timeline.store import Timeline

DEFAULT_MESSAGES = 432_000_000        # a 24 h soak at ThingsBoard's 5,000 msg/s
DEFAULT_RATE = 100_000.0              # ... in 72 minutes
STACK, EXPERIMENT = "day", "native-sink"
CHECKS = [
    {"name": "no_acked_loss", "params": {}},
    {"name": "no_duplicates", "params": {}},
    {"name": "no_unexpected", "params": {}},
    {"name": "load_valid", "params": {}},
    {"name": "latency_objective", "params": {"percentile": 99, "max_ms": 1000, "during": "steady"}},
    {"name": "no_memory_leak", "params": {}},
]
GOAL_GROWTH_PCT = 5.0
GOAL_BYTES_PER_MSG = 10.0


def log(msg: str) -> None:
    print(f"[bench-day] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ pure logic

def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m monsoon.selftest.day", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__.split("\n\n", 1)[1])
    ap.add_argument("--messages", type=float, default=DEFAULT_MESSAGES,
                    help=f"QoS 1 messages to send (default {DEFAULT_MESSAGES:.4g}; 30e6 is a 5-minute look)")
    ap.add_argument("--rate", type=float, default=DEFAULT_RATE, help=f"msg/s (default {DEFAULT_RATE:g})")
    ap.add_argument("--devices", type=int, default=50, help="devices (connections), default 50")
    ap.add_argument("--workers", type=int, default=1, help="engine worker processes (default 1)")
    ap.add_argument("--sinks", type=int, default=1, help="ack-only sink processes sharing the port (default 1)")
    ap.add_argument("--every", type=float, default=60.0, help="seconds between process/disk samples (default 60)")
    ap.add_argument("--baseline-min", type=float, default=10.0,
                    help="the minute RSS growth is measured from (default 10)")
    ap.add_argument("--progress-every", type=float, default=10.0, help="seconds between progress lines (10)")
    ap.add_argument("--drain-timeout", type=float, default=60.0, help="seconds the drain may wait (60)")
    ap.add_argument("--dir", type=Path, help="where to write the run (default: a temp dir, removed after)")
    ap.add_argument("--keep", action="store_true", help="keep the run directory (printed as run_dir)")
    ap.add_argument("--plot", type=Path, help="also draw the curve (RSS per process, run directory) into this PNG")
    ap.add_argument("--skip-analyze", action="store_true", help="no monsoon analyze at the end (no exact)")
    a = ap.parse_args(argv)
    a.messages = int(a.messages)
    if a.messages < 1 or not a.rate > 0:
        ap.error("--messages and --rate must be positive")
    if not 1 <= a.workers <= a.devices:
        ap.error("--workers must be from 1 to --devices")
    if not a.every > 0:
        ap.error("--every must be positive")
    return a


def load_seconds(messages: int, rate: float) -> float:
    """The steady load's duration: ``rate`` msg/s for this long is ``messages`` messages (the schedule sends
    floor(rate * duration))."""
    return messages / rate


def baseline_s(load_s: float, baseline_min: float) -> float:
    """When RSS growth is measured from: minute ``baseline_min``, or a third of the load when it is shorter than
    three times that (a shrunk run still has a warm-up to leave out and a stretch to measure)."""
    return min(baseline_min * 60.0, load_s / 3.0)


def growth_pct(base: float | None, end: float | None) -> float | None:
    """Growth from ``base`` to ``end`` in % of ``base`` (None when either is unknown or base is 0)."""
    if base is None or end is None or base <= 0:
        return None
    return round((end - base) / base * 100.0, 2)


PEAK_WINDOW_S = 2 * FLUSH_S     # RSS saw-tooths with the 30 s shard-to-part cycle: compare peaks over two


def rss_summary(samples: list[dict], base_at: float, window_s: float = PEAK_WINDOW_S) -> dict[str, Any]:
    """From the ``day`` samples (``t``: seconds into the load, ``procs``: name -> {rss_mb, cpu_s}): each
    process's RSS at the baseline and at the end, its growth, and the largest growth. Each is the peak over a
    window of ``window_s`` (the baseline's from the first sample at or after ``base_at``, the end's up to the
    last sample): a single sample of a saw-tooth lands on a trough or a crest by chance."""
    if not samples:
        return {"rss_mb": {}, "rss_growth_pct": {}, "rss_growth_pct_max": None, "baseline_t_s": None}
    base = next((s for s in samples if s["t"] >= base_at), samples[-1])
    end = samples[-1]
    first = [s for s in samples if base["t"] <= s["t"] < base["t"] + window_s] or [base]
    last = [s for s in samples if end["t"] - window_s < s["t"] <= end["t"]] or [end]

    def peak(window: list[dict], n: str) -> float | None:
        vals = [p.get("rss_peak_mb", p["rss_mb"]) for s in window
                if (p := s["procs"].get(n, {})).get("rss_mb") is not None]
        return max(vals) if vals else None

    names = list(dict.fromkeys(n for s in samples for n in s["procs"]))
    rss: dict[str, dict] = {}
    growth: dict[str, float | None] = {}
    for n in names:
        b = peak(first, n)
        e = end["procs"].get(n, {}).get("rss_mb") and peak(last, n)
        rss[n] = {"baseline": b, "end": e}
        growth[n] = growth_pct(b, e)
    known = [g for g in growth.values() if g is not None]
    return {"rss_mb": rss, "rss_growth_pct": growth, "rss_growth_pct_max": max(known) if known else None,
            "baseline_t_s": base["t"], "end_t_s": end["t"]}


def cpu_cores(samples: list[dict]) -> dict[str, float]:
    """Each process's mean CPU (cores: CPU seconds per second) between the first and the last sample."""
    if len(samples) < 2:
        return {}
    a, b = samples[0], samples[-1]
    dt = b["t"] - a["t"]
    out = {}
    for n, p in b["procs"].items():
        c0 = a["procs"].get(n, {}).get("cpu_s")
        if c0 is not None and p.get("cpu_s") is not None and dt > 0:
            out[n] = round((p["cpu_s"] - c0) / dt, 3)
    return out


def curve(samples: list[dict]) -> dict[str, Any]:
    """The samples as columns (for the docs' plot): minutes, each process's RSS, run-directory MB, bytes/msg."""
    names = list(dict.fromkeys(n for s in samples for n in s["procs"]))
    return {"t_min": [round(s["t"] / 60.0, 2) for s in samples],
            "rss_mb": {n: [s["procs"].get(n, {}).get("rss_mb") for s in samples] for n in names},
            "cores": {n: [s["procs"].get(n, {}).get("cores") for s in samples] for n in names},
            "run_dir_mb": [round(s["disk_bytes"] / 2**20, 1) for s in samples],
            "bytes_per_message": [s.get("bytes_per_message") for s in samples]}


def exactness(figures: dict[str, Any], expected: int, acked_engine: int, acked_rows: int,
              sent_engine: int) -> dict[str, list]:
    """What differs from an exact account (empty: exact): the schedule's ``expected`` messages all acked by the
    engine, as many acked rows on disk, the analysis counting them acked, stored once each, none lost,
    duplicated or unexpected."""
    want = {"engine_acked": (acked_engine, expected), "acked_rows": (acked_rows, acked_engine),
            "acked": (figures.get("acked"), acked_engine), "stored": (figures.get("stored"), sent_engine),
            "acked_lost": (figures.get("acked_lost"), 0), "duplicates": (figures.get("duplicates"), 0),
            "unexpected": (figures.get("unexpected"), 0)}
    return {k: [found, exp] for k, (found, exp) in want.items() if found != exp}


def plot(c: dict[str, Any], path: Path, title: str) -> None:
    """The curve as a PNG: RSS of each process (left), the run directory's bytes per acked message (right)."""
    fig = Figure(figsize=(10, 4))
    FigureCanvasAgg(fig)
    ax, bx = fig.subplots(1, 2)
    for name, ys in c["rss_mb"].items():
        pts = [(t, y) for t, y in zip(c["t_min"], ys) if y is not None]
        ax.plot([t for t, _ in pts], [y for _, y in pts], marker=".", label=name)
    ax.set(xlabel="minutes of load", ylabel="RSS (MB)", title="RSS per process")
    ax.set_ylim(bottom=0)
    ax.legend()
    pts = [(t, y) for t, y in zip(c["t_min"], c["bytes_per_message"]) if y is not None]
    bx.plot([t for t, _ in pts], [y for _, y in pts], marker=".", color="tab:red")
    bx.axhline(GOAL_BYTES_PER_MSG, color="grey", linestyle="--", label=f"goal {GOAL_BYTES_PER_MSG:g} B")
    bx.set(xlabel="minutes of load", ylabel="bytes on disk per acked message", title="run directory")
    bx.set_ylim(bottom=0)
    bx.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def disk_bytes(path: Path) -> int:
    """Bytes allocated on disk under ``path`` (st_blocks: a punched-out shard counts what it still holds)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_blocks * 512
            except OSError:
                continue
    return total


def dataset_rows(path: Path) -> int:
    """Rows in a dataset's Parquet parts (from their footers)."""
    return sum(pq.ParquetFile(p).metadata.num_rows for p in sorted(parts_dir(path).glob("part-*.parquet")))


# ------------------------------------------------------------------------------------------ live pieces

class StoredStandIn:
    """The storage stand-in (a :class:`~monsoon.observe.storage.StoredSource`): the ack-only sink stored every
    message the engine handed out, i.e. ``(device, seq)`` for seq 0..``last_seq[device]``, one copy each.
    Written in arrival order (every device's seq 0, then every device's seq 1, ...: 0.08 B a row in zstd
    Parquet, against 1.05 B device by device), about ``chunk`` rows a part, beside the dataset and renamed into
    place."""

    def __init__(self, last_seq: dict[str, int], chunk: int = 1 << 23):
        self.last_seq, self.chunk = dict(last_seq), chunk

    def check(self) -> None:
        pass

    def export(self, path: Path) -> int:
        names = sorted(self.last_seq)
        last = np.array([int(self.last_seq[n]) for n in names], dtype=np.int64)
        n_dev, rounds = len(names), int(last.max()) + 1 if len(names) else 0
        step = max(1, self.chunk // max(1, n_dev))
        with replacing(path, ("device", "seq")) as w:
            for a in range(0, rounds, step):   # in arrival order: round s is every device's seq s
                seq = np.repeat(np.arange(a, min(rounds, a + step), dtype=np.int64), n_dev)
                dev = np.tile(np.arange(n_dev, dtype=np.int32), len(seq) // max(1, n_dev))
                keep = seq <= last[dev]
                w.write_part(dev[keep], names, seq[keep])
        return w.rows


class StoredCount(Collector):
    """The stand-in storage's count (the ``storage`` collector): what the sink acknowledged so far, exact."""

    name = "storage"

    def __init__(self, count: Callable[[], int]):
        self.count = count

    def sample(self) -> dict[str, Any]:
        return {"stored": int(self.count()), "counted": "exact"}


class DayCollector(Collector):
    """Every ``every`` seconds of load: RSS and CPU of each named process, the run directory's size on disk and
    the bytes per acked message so far (kept in :attr:`samples` too: one a minute, ~1,500 for a day)."""

    name = "day"

    def __init__(self, procs: Callable[[], dict[str, int]], run_dir: Path, acked: Callable[[], int],
                 load_t: Callable[[], float | None], every: float = 60.0,
                 on_sample: Callable[[dict], None] | None = None):
        self.procs, self.run_dir, self.acked, self.load_t, self.every = procs, run_dir, acked, load_t, every
        self.samples: list[dict] = []
        self.on_sample = on_sample
        self._next = 0.0
        self._prev: dict[str, tuple[float, float]] = {}    # name -> (cpu seconds, monotonic) of its last sample
        self._peak: dict[str, float] = {}   # name -> the highest RSS read since its last sample (MB)
        self._lock = threading.Lock()
        self.done = False

    def finish(self, t: float) -> None:
        """The load's last second: one last sample (the workers still run), then no more."""
        with self._lock:
            if not self.done:
                self._take(t)
                self.done = True

    def take(self, t: float) -> dict | None:
        with self._lock:
            return None if self.done else self._take(t)

    def _take(self, t: float) -> dict:
        now = time.monotonic()
        procs: dict[str, dict] = {}
        for name, pid in self.procs().items():
            rss, cpu = proc_rss_mb(pid), proc_cpu_s(pid)
            if rss <= 0:            # exited (or a zombie not yet reaped): nothing to measure
                continue
            peak = max(rss, self._peak.pop(name, 0.0))
            p: dict[str, Any] = {"pid": pid, "rss_mb": round(rss, 1), "rss_peak_mb": round(peak, 1),
                                 "cpu_s": round(cpu, 2)}
            prev = self._prev.get(name)
            if prev is not None and now > prev[1]:
                p["cores"] = round((cpu - prev[0]) / (now - prev[1]), 3)
            self._prev[name] = (cpu, now)
            procs[name] = p
        size, acked = disk_bytes(self.run_dir), int(self.acked())
        s = {"t": round(t, 1), "procs": procs, "acked": acked, "disk_bytes": size,
             "bytes_per_message": round(size / acked, 3) if acked else None}
        self.samples.append(s)
        if self.on_sample is not None:
            self.on_sample(s)
        return s

    def watch_peaks(self) -> None:
        """Read every process's RSS now, keeping each one's highest since its last sample: a sample a minute
        alone lands on a trough or a crest of the saw-tooth by chance."""
        with self._lock:
            for name, pid in self.procs().items():
                rss = proc_rss_mb(pid)
                if rss > self._peak.get(name, 0.0):
                    self._peak[name] = rss

    def sample(self) -> dict[str, Any] | None:
        t = self.load_t()
        if t is None or self.done:
            return None
        if t < self._next:
            self.watch_peaks()
            return None
        self._next = (int(t // self.every) + 1) * self.every
        return self.take(t)


def log_sample(s: dict) -> None:
    procs = " ".join(f"{n}={p['rss_mb']:.0f}MB/{p.get('cores', 0):.2f}c" for n, p in s["procs"].items())
    bpm = s["bytes_per_message"]
    log(f"t={s['t'] / 60:.1f}min acked={s['acked']:,} run_dir={s['disk_bytes'] / 2**20:.1f}MB "
        f"({'-' if bpm is None else f'{bpm:.2f}'} B/msg) {procs}")


# ------------------------------------------------------------------------------------------ the run

def run_day(a: argparse.Namespace, root: Path) -> dict[str, Any]:
    binary = ensure_loadgen()
    run_id = "day-" + new_run_id()
    run_dir = root / run_id
    exp = run_dir / experiment_dir_name(STACK, EXPERIMENT)
    exp.mkdir(parents=True)
    load_s = load_seconds(a.messages, a.rate)
    shape = Steady(rate=a.rate, duration=load_s)
    drain_timeout = float(a.drain_timeout)
    acked = [0]
    load_t0: list[float | None] = [None]
    stop = threading.Event()
    out: dict[str, Any] = {"bench": "day", "run_id": run_id, "target_messages": a.messages, "target_rate": a.rate,
                           "load_s": round(load_s, 1), "devices": a.devices, "workers": a.workers}
    sinks = Sinks(binary, a.sinks)
    log(f"sink: `monsoon-loadgen sink` x{sinks.n} on 127.0.0.1:{sinks.port}; run directory {run_dir}")
    try:
        with Timeline(exp / TIMELINE_FILE) as tl:
            tl.add("meta", run_id=run_id, stack=STACK, experiment=EXPERIMENT, profile="full", base_rate=a.rate,
                   base_rate_auto=None, env={}, shape="steady", multiplier=None, devices=a.devices, qos=1,
                   transport="mqtt", engine="native", workers=a.workers,
                   durations={"warmup": 0.0, "burst": 0, "recovery": load_s, "drain_timeout": drain_timeout},
                   checks=CHECKS, faults=[])
            harness = LoadHarness(tl)
            devs = [Device(f"day-{i:05d}", "") for i in range(a.devices)]
            options = FleetOptions(shape=shape, acked_path=exp / ACKED_DATA, latency_log_path=exp / LATENCY_FILE,
                                   qos=1, workers=a.workers)
            fleet = build_fleet("mqtt", devs, "127.0.0.1", sinks.port, options, engine="native")
            harness._fleet = fleet
            fleet.connect()
            tl.add("op", op="connected", devices=len(devs))

            def procs() -> dict[str, int]:
                named = {"python": os.getpid()}
                named.update({f"worker{i}": pid for i, pid in enumerate(getattr(fleet, "pids", []))})
                named.update({f"sink{i}": p.pid for i, p in enumerate(sinks.procs)})
                return named

            day = DayCollector(procs, run_dir, lambda: acked[0],
                               lambda: None if load_t0[0] is None else tl.now() - load_t0[0], a.every, log_sample)
            sink_pid = sinks.procs[0].pid
            collectors = [ProcessCollector(lambda: sink_pid), CgroupOomCollector("sink", lambda: sink_pid),
                          StoredCount(lambda: acked[0]), day]
            harness.collectors = collectors
            sampler = harness.sampler = Sampler(tl, collectors).start()
            time.sleep(1.0)                     # one baseline sample before the load, as a run takes
            t0 = load_t0[0] = tl.now()
            for ph in shape.phases():
                tl.add("phase", name=ph.name, start=round(t0 + ph.start, 3), end=round(t0 + ph.end, 3))
            log(f"load: {a.messages:,} QoS 1 messages at {a.rate:,.0f} msg/s ({load_s / 60:.1f} min), "
                f"{a.devices} devices, {a.workers} worker(s); samples every {a.every:g}s")
            view = LoadProgress("day", log, every=a.progress_every)

            last_sec = max(0, math.ceil(load_s) - 2)     # the load's second to last second: the workers run

            def on_second(st: SecondStats) -> None:
                harness.record_second(st)
                acked[0] += st.acked
                view.update(progress_fields(st.t, "steady", st, sampler.value, 0))
                if st.t >= last_sec:
                    day.finish(tl.now() - t0)

            t_load = time.monotonic()
            try:
                with view:
                    totals = fleet.run(stop, on_second)
                day.finish(tl.now() - t0)         # (already taken at the last second, unless the load stopped early)
                tl.add("op", op="load-end", **totals_dict(totals))
                write_rows(exp / SENT_DATA, ("device", "last_seq"), totals.last_seq.items())
                fleet.close()
                log(f"load done in {time.monotonic() - t_load:.0f}s: sent={totals.sent:,} acked={totals.acked:,} "
                    f"failed={totals.failed:,} late={totals.late:,}; draining")
                drain = Drain(sampler, False).wait(drain_timeout, stop)
                tl.add("drain", **drain)
                sampler.stop()
                t = time.monotonic()
                rows = StoredStandIn(totals.last_seq).export(exp / STORED_DATA)
                tl.add("stored", path=STORED_DATA, rows=rows, seconds=round(time.monotonic() - t, 3))
                log(f"read-back (stand-in): {rows:,} stored rows in {time.monotonic() - t:.1f}s")
            finally:
                harness.close()
    finally:
        sinks.close()
    samples = day.samples
    acked_rows = dataset_rows(exp / ACKED_DATA)
    summary = rss_summary(samples, baseline_s(load_s, a.baseline_min))
    size = disk_bytes(run_dir)
    out.update({"messages": totals.acked, "rate": round(totals.acked / totals.elapsed_s, 1) if totals.elapsed_s else None,
                "sent": totals.sent, "failed": totals.failed, "late": totals.late, "dropped": totals.dropped,
                "elapsed_s": round(totals.elapsed_s, 1), "baseline_min": round(summary["baseline_t_s"] / 60.0, 2)
                if summary["baseline_t_s"] is not None else None,
                "rss_mb": summary["rss_mb"], "rss_growth_pct": summary["rss_growth_pct"],
                "rss_growth_pct_max": summary["rss_growth_pct_max"], "cpu_cores": cpu_cores(samples),
                "acked_rows": acked_rows, "stored_rows": rows})
    analysis: dict[str, Any] = {}
    if not a.skip_analyze:
        log("monsoon analyze of the run directory (a child process)")
        analysis = analyze_in_child(run_dir, None)
        res = json.loads((exp / RESULT_FILE).read_text())
        figures: dict[str, Any] = {}
        for c in res["checks"]:
            if c["name"] in ("no_acked_loss", "no_duplicates", "no_unexpected"):
                for k, v in c["figures"].items():
                    figures.setdefault(k, v)
        bad = exactness(figures, a.messages, totals.acked, acked_rows, totals.sent)
        out["exact"] = not bad
        if bad:
            out["mismatches"] = bad
        out["verdicts"] = {f"{c['name']}": c["verdict"] for c in res["checks"]}
        size = disk_bytes(run_dir)          # with the analysis's result, summary, checklist and report
    out["bytes_per_message"] = round(size / totals.acked, 3) if totals.acked else None
    out["run_dir_mb"] = round(size / 2**20, 1)
    out["run_dir_files_mb"] = {p.name: round(disk_bytes(p) / 2**20, 2) if p.is_dir()
                               else round(p.stat().st_blocks * 512 / 2**20, 2) for p in sorted(exp.iterdir())}
    out["analyze_s"] = analysis.get("analyze_s")
    out["analyze_peak_rss_mb"] = analysis.get("peak_rss_mb")
    g = out["rss_growth_pct_max"]
    out["goals_met"] = {"rss_growth<5%": g is not None and g < GOAL_GROWTH_PCT,
                        "bytes_per_message<=10": out["bytes_per_message"] is not None
                        and out["bytes_per_message"] <= GOAL_BYTES_PER_MSG,
                        "exact": out.get("exact")}
    out["curve"] = curve(samples)
    if a.plot is not None:
        plot(out["curve"], a.plot, f"make bench-day: {totals.acked:,} messages at {a.rate:,.0f} msg/s ({run_id})")
        out["plot"] = str(a.plot)
    if a.keep or a.dir is not None:
        out["run_dir"] = str(run_dir)
    return out


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    root = a.dir or Path(tempfile.mkdtemp(prefix="monsoon-bench-day-"))
    root.mkdir(parents=True, exist_ok=True)
    try:
        out = run_day(a, root)
    finally:
        if a.dir is None and not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    print(json.dumps(out), flush=True)
    return 0 if out.get("exact", True) else 1


if __name__ == "__main__":
    sys.exit(main())
