"""``python -m monsoon.selftest.analyze_bench`` (``make bench-analyze``): ``monsoon analyze`` on a day-long run.

It synthesises one experiment's run directory in the real formats (``timeline.jsonl`` with a meta event,
a phase, fault windows, one ``load`` event per second and the five 1 Hz collectors' samples; the ``acked``,
``sent`` and ``stored`` datasets and ``latency.hlog``), ``--messages`` messages spread evenly over ``--seconds`` of
load (default 24 h: 34.6 M is 400 msg/s, 5 M is ~58 msg/s) over ``--devices`` devices, with planted
accounting defects:

* ``lost``: acked keys left out of ``stored``;
* ``duplicates``: acked keys stored twice (the copy stored later);
* ``unexpected``: keys stored above the device's last sent sequence number;
* ``reordered``: pairs of a device's consecutive keys whose stored times are swapped (one each).

It then analyses the run with the real path (:func:`monsoon.analysis.analyze`, in a child process so its
peak RSS is its own), checks every planted figure in the verdicts it wrote, and prints one JSON line:
``messages``, ``analyze_s``, ``peak_rss_mb``, ``bytes_per_message`` (the experiment's files on disk),
``figures_exact`` and, with ``--baseline-src DIR`` (another checkout's source tree, e.g. ``git archive``
of main), the same analysis of the same run by that code under ``baseline``, side by side.
Progress goes to stderr.  Exit 0 only when every planted figure came out exact.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from monsoon.rundir import (ACKED_DATA, LATENCY_FILE, REPORT_FILES, RESULT_FILE, SENT_DATA, STORED_DATA,
                            TIMELINE_FILE, legacy_csv)
from monsoon.timeline.columnar import PartWriter, parts_dir
from monsoon.timeline.hdrlog import IntervalLogWriter, new_histogram

START_WALL = 1_790_000_000.0        # the synthetic run's epoch start (s)
LOAD_T0 = 20.0                      # timeline seconds from the meta event to the load start
FAULT_EVERY_S = 3600.0              # one mongo-slowdown window an hour ...
FAULT_LEN_S = 60.0                  # ... of a minute
LAT_MS = np.array([4, 6, 8, 10, 12, 15, 20, 30, 45, 80], dtype=np.int64)      # ack latencies, steady
LAT_FAULT_MS = np.array([300, 450, 520, 560, 600, 640, 700, 800, 900, 1300], dtype=np.int64)
E2E_MS = 250                        # stored_ms - intended_ms of every first copy
CHECKS = [
    {"name": "no_oom", "params": {}},
    {"name": "no_acked_loss", "params": {}},
    {"name": "no_duplicates", "params": {}},
    {"name": "no_unexpected", "params": {}},
    {"name": "error_budget", "params": {"objective": 0.99, "latency_ms": 500}},
    {"name": "latency_objective", "params": {"percentile": 99, "max_ms": 3000, "during": "faults"}},
    {"name": "latency_objective", "params": {"percentile": 99, "max_ms": 3000, "during": "steady"}},
    {"name": "throughput_drop", "params": {}},
    {"name": "lag_recovers_within", "params": {"seconds": 60}},
    {"name": "no_memory_leak", "params": {}},
    {"name": "faults_landed", "params": {}},
    {"name": "load_valid", "params": {}},
]


def _log(msg: str) -> None:
    print(f"bench-analyze: {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ CSV writing

_POW10 = 10 ** np.arange(19, dtype=np.int64)


def _digits(v: np.ndarray, width: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(ASCII digits right-aligned in ``w`` columns, mask of the digits to keep) of non-negative ints;
    ``width`` zero-pads to that many digits."""
    v = v.astype(np.int64)
    n = np.ones(len(v), dtype=np.int64)
    for k in range(1, 19):
        n += v >= _POW10[k]
    if width is not None:
        n = np.maximum(n, width)
    w = int(n.max()) if len(v) else 1
    d = (v[:, None] // _POW10[w - 1::-1][None, :]) % 10 + 48
    keep = np.arange(w)[None, :] >= (w - n)[:, None]
    return d.astype(np.uint8), keep


def csv_rows(prefix: bytes, dev: np.ndarray, cols: list[np.ndarray]) -> bytes:
    """``<prefix><dev:05d>,<col>,<col>...\\n`` for every row, built as one byte matrix (no per-row Python)."""
    rows = len(dev)
    parts, keeps = [], []
    p = np.frombuffer(prefix, dtype=np.uint8)
    parts.append(np.broadcast_to(p, (rows, len(p))))
    keeps.append(np.ones((rows, len(p)), dtype=bool))
    for i, c in enumerate([dev, *cols]):
        d, k = _digits(c, 5 if i == 0 else None)
        parts.append(d)
        keeps.append(k)
        sep = np.full((rows, 1), 10 if i == len(cols) else 44, dtype=np.uint8)
        parts.append(sep)
        keeps.append(np.ones((rows, 1), dtype=bool))
    return np.hstack(parts)[np.hstack(keeps)].tobytes()


# ------------------------------------------------------------------------------------------ the run


class Plan:
    """Which message goes where: message ``i`` is device ``i % D``, seq ``i // D``, intended at
    ``start + i * seconds * 1000 // n`` ms; the planted keys are disjoint sets of message indexes."""

    def __init__(self, messages: int, seconds: int, devices: int, planted: int, seed: int):
        self.n, self.seconds, self.devices = messages, int(seconds), devices
        self.rate = messages / self.seconds
        self.start_ms = int((START_WALL + LOAD_T0) * 1000)
        rng = np.random.default_rng(seed)
        # keep clear of each device's last two seqs (the reordered pair needs its next key)
        pool = rng.choice(messages - 2 * devices, size=4 * planted, replace=False)
        pool.sort()
        self.lost = np.sort(pool[0::4])
        self.dup = np.sort(pool[1::4])
        first = pool[2::4]
        # a reordered pair (i, i + D): i + D must be none of the other planted keys
        bad = np.isin(first + devices, pool) | np.isin(first, pool[0::4] - devices) \
            | np.isin(first, pool[1::4] - devices)
        self.swap = np.sort(first[~bad])
        self.swap = self.swap[~np.isin(self.swap + devices, self.swap)]
        self.unexpected_devs = np.sort(rng.choice(devices, size=min(devices, planted), replace=False))
        self.unexpected = planted
        self.last_seq = np.array([(messages - 1 - d) // devices for d in range(devices)], dtype=np.int64)

    def fault_windows(self) -> list[tuple[float, float]]:
        """Seconds from the load start."""
        out, t = [], 600.0
        while t + FAULT_LEN_S < self.seconds:
            out.append((t, t + FAULT_LEN_S))
            t += FAULT_EVERY_S
        return out

    def intended_ms(self, i: np.ndarray) -> np.ndarray:
        return self.start_ms + (i * (self.seconds * 1000)) // self.n

    def latency_ms(self, i: np.ndarray, in_fault: np.ndarray) -> np.ndarray:
        k = (i * 2654435761) % len(LAT_MS)
        return np.where(in_fault, LAT_FAULT_MS[k], LAT_MS[k])

    def expected(self) -> dict[str, int]:
        return {"acked": self.n, "acked_lost": len(self.lost), "duplicates": len(self.dup),
                "duplicate_keys": len(self.dup), "unexpected": self.unexpected,
                "unexpected_devices": len(self.unexpected_devs) if self.unexpected else 0,
                "reordered": len(self.swap), "stored": self.n - len(self.lost) + len(self.dup) + self.unexpected,
                "recovered": 0}


def _in_windows(sec: np.ndarray, windows: list[tuple[float, float]]) -> np.ndarray:
    out = np.zeros(len(sec), dtype=bool)
    for a, b in windows:
        out |= (sec >= a) & (sec < b)
    return out


class _Csv:
    def __init__(self, path: Path, header: bytes):
        self.fh = open(legacy_csv(path), "wb")  # closed by close(); an older run's CSV
        self.fh.write(header)

    def rows(self, dev: np.ndarray, *cols: np.ndarray) -> None:
        self.fh.write(csv_rows(b"monsoon-", dev, list(cols)))

    def close(self) -> None:
        self.fh.close()


class _Parts:
    def __init__(self, path: Path, header: bytes, devices: int):
        self.w = PartWriter(parts_dir(path), tuple(header.decode().strip().split(",")))
        self.names = [f"monsoon-{d:05d}" for d in range(devices)]

    def rows(self, dev: np.ndarray, *cols: np.ndarray) -> None:
        if len(dev):
            self.w.write_part(dev, self.names, *cols)

    def close(self) -> None:
        self.w.close()


def write_run(exp: Path, plan: Plan, chunk: int = 1 << 20, fmt: str = "csv") -> None:
    """The experiment directory ``exp`` (created) in the real formats: CSV, or Parquet parts (one per chunk)."""
    exp.mkdir(parents=True, exist_ok=True)
    opener = (lambda p, h: _Csv(p, h)) if fmt == "csv" else (lambda p, h: _Parts(p, h, plan.devices))
    windows = plan.fault_windows()
    D = plan.devices
    lost, dup, swap = plan.lost, plan.dup, plan.swap
    swap_next = swap + D
    hist_by_sec: dict[int, np.ndarray] = {}       # second -> counts per latency template index
    per_sec = np.zeros(plan.seconds + 1, dtype=np.int64)
    af = opener(exp / ACKED_DATA, b"device,seq,intended_ms,acked_ms\n")
    sf = opener(exp / STORED_DATA, b"device,seq,stored_ms\n")
    if True:
        for a in range(0, plan.n, chunk):
            i = np.arange(a, min(plan.n, a + chunk), dtype=np.int64)
            dev, seq = i % D, i // D
            intended = plan.intended_ms(i)
            sec = (intended - plan.start_ms) // 1000
            fault = _in_windows(sec, windows)
            lat = plan.latency_ms(i, fault)
            af.rows(dev, seq, intended, intended + lat)
            np.add.at(per_sec, sec, 1)
            k = (i * 2654435761) % len(LAT_MS) + np.where(fault, len(LAT_MS), 0)
            key = sec * (2 * len(LAT_MS)) + k
            u, c = np.unique(key, return_counts=True)
            for kk, cc in zip(u.tolist(), c.tolist()):
                s, t = divmod(kk, 2 * len(LAT_MS))
                hist_by_sec.setdefault(s, np.zeros(2 * len(LAT_MS), dtype=np.int64))[t] += cc
            stored = intended + E2E_MS
            # reordered: a planted key is stored just after its next one
            lo, hi = np.searchsorted(swap, [a, a + len(i)])
            sw = swap[lo:hi] - a
            stored[sw] = plan.intended_ms(swap[lo:hi] + D) + E2E_MS + 1
            keep = ~np.isin(i, lost[np.searchsorted(lost, a):np.searchsorted(lost, a + len(i))])
            sf.rows(dev[keep], seq[keep], stored[keep])
            lo, hi = np.searchsorted(dup, [a, a + len(i)])
            di = dup[lo:hi]
            if len(di):
                sf.rows(di % D, di // D, plan.intended_ms(di) + E2E_MS + 5000)
            _log(f"wrote {min(plan.n, a + chunk):,} of {plan.n:,} messages")
        del swap_next
        if plan.unexpected:
            ud = np.resize(plan.unexpected_devs, plan.unexpected)
            order = np.argsort(ud, kind="stable")
            ud = ud[order]
            nth = np.arange(len(ud)) - np.searchsorted(ud, ud)
            us = plan.last_seq[ud] + 1 + nth
            sf.rows(ud, us, np.full(len(ud), plan.start_ms + plan.seconds * 1000 + 10_000))
    af.close()
    sf.close()
    sent = opener(exp / SENT_DATA, b"device,last_seq\n")
    sent.rows(np.arange(D), plan.last_seq)
    sent.close()
    lat_all = np.concatenate([LAT_MS, LAT_FAULT_MS]) * 1000
    hlog = IntervalLogWriter(exp / LATENCY_FILE, START_WALL + LOAD_T0)
    cache: dict[bytes, str] = {}
    fh = hlog._fh
    assert fh is not None     # open until hlog.close() below
    for s in sorted(hist_by_sec):
        counts = hist_by_sec[s]
        hkey = counts.tobytes()
        enc = cache.get(hkey)
        if enc is None:
            h = new_histogram()
            for v, c in zip(lat_all.tolist(), counts.tolist()):
                if c:
                    h.record_value(v, c)
            enc = cache[hkey] = h.encode().decode("ascii")
            mx = h.get_max_value()
            cache[hkey + b"max"] = str(mx)
        fh.write(f"{s:.3f},1.000,{int(cache[hkey + b'max']) / 1000.0:.3f},{enc}\n")
    hlog.close()
    _write_timeline(exp, plan, per_sec, hist_by_sec, windows)


def _write_timeline(exp: Path, plan: Plan, per_sec: np.ndarray, hist_by_sec: dict, windows) -> None:
    lat_all = np.concatenate([LAT_MS, LAT_FAULT_MS]).astype(float)
    dumps = json.dumps
    cg = "/sys/fs/cgroup/memory/monsoon/synthetic"
    W = START_WALL
    total = plan.n
    with open(exp / TIMELINE_FILE, "w") as fh:
        def ev(type_: str, t: float, **f) -> None:
            fh.write(dumps({"type": type_, "t": round(t, 3), "wall": round(W + t, 3), **f}) + "\n")

        ev("meta", 0.0, run_id="bench-analyze", stack="kafka", experiment="soak-synthetic", profile="full",
           base_rate=plan.rate, base_rate_auto=None, env={}, shape="steady", multiplier=None,
           devices=plan.devices, qos=1, transport="mqtt", engine="native", workers=1,
           durations={"warmup": 0.0, "burst": 0, "recovery": float(plan.seconds), "drain_timeout": 120.0},
           checks=CHECKS, faults=[])
        ev("service", 1.0, service="platform", event="start", pid=4242, n=1)
        ev("service", 5.0, service="platform", event="ready", after_s=4.0)
        ev("phase", LOAD_T0, name="steady", start=LOAD_T0, end=LOAD_T0 + plan.seconds)
        ev("fault-plan", LOAD_T0, run_id="bench-analyze", horizon=float(plan.seconds),
           faults=[{"name": "mongo-slowdown", "kind": "mongo-slowdown", "backend": "toxiproxy",
                    "target": "platform->mongo", "windows": [list(w) for w in windows]}])
        faults = []
        for n, (a, b) in enumerate(windows):
            common = dict(name="mongo-slowdown", kind="mongo-slowdown", backend="toxiproxy",
                          target="platform->mongo", window=n, landed=True)
            faults.append((a, dict(common, phase="inject", intended=a, effective=a,
                                   evidence={"method": "probe:mongo", "added_ms": 500.0})))
            faults.append((b, dict(common, phase="heal", intended=b, effective=b,
                                   evidence={"method": "probe:mongo", "toxics_present": []})))
        fi = 0
        acked = stored = 0
        for s in range(plan.seconds):
            t = LOAD_T0 + s
            while fi < len(faults) and faults[fi][0] <= s:
                ev("fault", LOAD_T0 + faults[fi][0] + 0.01, **faults[fi][1])
                fi += 1
            n = int(per_sec[s])
            acked += n
            stored += n
            counts = hist_by_sec.get(s)
            p50: float | None
            p99: float | None
            mx: float | None
            if counts is not None and counts.sum():
                cum = np.cumsum(counts)
                def q(p: float, cum=cum) -> float:
                    return float(lat_all[np.searchsorted(cum, p * cum[-1])])
                p50, p99, mx = q(0.5), q(0.99), float(lat_all[np.flatnonzero(counts)[-1]])
            else:
                p50 = p99 = mx = None
            ev("sample", t + 0.05, collector="process", up=1, pid=4242, rss_mb=812.5, threads=104)
            ev("sample", t + 0.06, collector="cgroup", service="platform", available=1, pid=4242, cgroup=cg,
               oom_kills=0, limit_hits=0,
               cgroups={cg: {"version": 1, "oom_kill": 0, "limit_hits": 0, "shared": 0, "usage_mb": 900.0,
                             "limit_mb": None}})
            ev("sample", t + 0.07, collector="storage", stored=stored)
            ev("sample", t + 0.08, collector="metrics", gc_seconds=round(0.001 * s, 3), heap_max=1073741824.0,
               heap_used=float(300_000_000 + (s % 60) * 1_000_000), acked=float(acked), received=float(acked),
               stored=float(stored), queue_depth=0.0)
            ev("sample", t + 0.09, collector="kafka", lag=int(n // 10),
               partitions={"tb-0": {"end": acked, "committed": acked - n // 10, "lag": int(n // 10)}})
            ev("load", t + 1.0, target_rate=plan.rate, scheduled=n, sent=n, acked=n, failed=0, late=0,
               connected=plan.devices, p50_ms=p50, p99_ms=p99, max_ms=mx, sec=s)
        end = LOAD_T0 + plan.seconds
        ev("fault-census", end + 0.1, run_id="bench-analyze", swept={"toxiproxy": []}, leftovers={}, errors=[])
        ev("op", end + 0.2, op="load-end", scheduled=total, sent=total, acked=total, failed=0, late=0, dropped=0,
           unacked=0, p50_ms=None, p99_ms=None, max_ms=None, reconnects=0, elapsed_s=float(plan.seconds),
           lost_in_flight=0)
        for k in range(3):
            ev("sample", end + 1 + k, collector="kafka", lag=0, partitions={"tb-0": {"end": total, "committed": total,
                                                                                        "lag": 0}})
        ev("drain", end + 4, drained=True, waited_s=3.0, backlog=0)
        ev("stored", end + 5, path=STORED_DATA, rows=plan.n - len(plan.lost) + len(plan.dup) + plan.unexpected)
        ev("service", end + 6, service="platform", event="stop", code=0)


# ------------------------------------------------------------------------------------------ analysis

_CHILD = r"""
import json, resource, sys, time
t = time.perf_counter()
import monsoon
try:
    from monsoon.analysis import analyze
except ImportError:   # a --baseline-src from before monsoon.analysis
    from monsoon.cli import analyze
s = analyze(sys.argv[1])
dt = time.perf_counter() - t
print(json.dumps({"analyze_s": round(dt, 2), "code": monsoon.__path__[0],
                  "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))
"""


def analyze_in_child(run_dir: Path, src: Path | None) -> dict:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    # cwd: not this checkout, whose monsoon/ would shadow ``src`` (``python -c`` puts the cwd first on sys.path)
    p = subprocess.run([sys.executable, "-c", _CHILD, str(run_dir)], capture_output=True, text=True, env=env,
                       cwd=run_dir.parent)
    for line in p.stderr.splitlines():
        _log(f"analyze: {line}")
    if p.returncode != 0:
        raise SystemExit(f"bench-analyze: analyze exited {p.returncode}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def verify(exp: Path, plan: Plan) -> dict[str, list]:
    """Planted figure -> [expected, found] for every figure that differs (empty: all exact); crashed checks too."""
    res = json.loads((exp / RESULT_FILE).read_text())
    found: dict[str, float] = {}
    bad: dict[str, list] = {}
    for c in res["checks"]:
        if "crashed" in c.get("message", ""):
            bad[c["name"]] = ["no crash", c["message"]]
        if c["name"] in ("no_acked_loss", "no_duplicates", "no_unexpected"):
            for k, v in c["figures"].items():
                found.setdefault(k, v)
    for k, v in plan.expected().items():
        if found.get(k) != v:
            bad[k] = [v, found.get(k)]
    return bad


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()
               and p.name not in REPORT_FILES)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m monsoon.selftest.analyze_bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=float, default=5e6, help="messages in the run (default 5e6)")
    ap.add_argument("--seconds", type=int, default=86_400, help="seconds of load (default 86400: a day)")
    ap.add_argument("--devices", type=int, default=50)
    ap.add_argument("--planted", type=int, default=1000, help="keys planted of each kind (default 1000)")
    ap.add_argument("--seed", type=int, default=16)
    ap.add_argument("--format", choices=("csv", "parquet"), default="csv",
                    help="run data as the CSVs of today's runs or as Parquet parts (monsoon.timeline.columnar)")
    ap.add_argument("--dir", type=Path, help="where to write the run (default: a temp dir, removed after)")
    ap.add_argument("--keep", action="store_true", help="keep the run directory")
    ap.add_argument("--reuse", action="store_true", help="analyse the run already in --dir (no synthesis)")
    ap.add_argument("--baseline-src", type=Path, help="also analyse with the monsoon package under this source tree")
    ap.add_argument("--baseline-json", type=Path,
                    help="print the baseline of a previous run's JSON line (same run) instead of analysing it again")
    ap.add_argument("--src", type=Path, help="analyse with the monsoon package under this source tree (default: "
                    "the one this bench imports)")
    a = ap.parse_args(argv)
    n = int(a.messages)
    plan = Plan(n, a.seconds, a.devices, a.planted, a.seed)
    root = a.dir or Path(tempfile.mkdtemp(prefix="monsoon-bench-analyze-"))
    run_dir = root / "run"
    exp = run_dir / "kafka--soak-synthetic"
    try:
        if not (a.reuse and exp.exists()):
            shutil.rmtree(run_dir, ignore_errors=True)
            t = time.perf_counter()
            write_run(exp, plan, fmt=a.format)
            _log(f"synthesised {n:,} messages over {plan.seconds:,} s in {time.perf_counter() - t:.1f} s")
        size = dir_bytes(exp)
        out: dict = {"messages": n, "seconds": plan.seconds, "devices": a.devices, "format": a.format}
        if a.baseline_json is not None:
            out["baseline"] = json.loads(a.baseline_json.read_text().strip().splitlines()[-1])["baseline"]
        elif a.baseline_src is not None:
            _log(f"analysing with the baseline code in {a.baseline_src}")
            b = analyze_in_child(run_dir, a.baseline_src.resolve())
            b["figures_exact"] = not verify(exp, plan)
            out["baseline"] = b
        _log("analysing")
        r = analyze_in_child(run_dir, a.src.resolve() if a.src else None)
        bad = verify(exp, plan)
        out.update(r)
        out["bytes_per_message"] = round(size / n, 2)
        out["disk_mb"] = round(size / 2**20, 1)
        out["figures_exact"] = not bad
        if bad:
            out["mismatches"] = bad
        if "baseline" in out:
            out["speedup"] = round(out["baseline"]["analyze_s"] / max(out["analyze_s"], 1e-3), 1)
        print(json.dumps(out), flush=True)
        return 0 if not bad else 1
    finally:
        if a.dir is None and not a.keep:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
