"""Every hot check is linear in run length: fed a day-long synthetic timeline (86,400 s), each one's
operations are counted and bounded (never timed).

* ``no_oom``'s cgroup evidence: the samples it sets apart are found by identity, never by comparing
  sample dicts (a list's ``in`` made it quadratic: 86,403 samples took 722 s);
* ``error_budget`` and ``latency_objective``: ``latency.hlog`` is decoded once per interval for both,
  and never walked bucket by bucket in Python (``count_within``'s iterator);
* ``latency_objective`` over fault windows: the Python-level calls do not grow with ``acked.csv``'s rows.
"""
from __future__ import annotations

import sys

import numpy as np
import pytest
from hdrh.histogram import HdrHistogram

from monsoon.checks.base import RunData
from monsoon.checks.faults import in_spans, latency_objective, merged_spans
from monsoon.checks.oom import cgroup_evidence
from monsoon.checks.slo import error_budget
from monsoon.rundir import ACKED_DATA, LATENCY_FILE, legacy_csv
from monsoon.timeline.hdrlog import IntervalLogWriter, LatencyLog, count_within, new_histogram
from monsoon.timeline.store import Events

DAY = 86_400
WALL0 = 1_790_000_000.0


class _Budget(Exception):
    pass


class CountingSample(dict):
    """A timeline sample that counts how often it is compared (a list's ``in`` compares every element)."""
    compared = 0
    limit = 0

    def __eq__(self, other):
        CountingSample.compared += 1
        if CountingSample.compared > CountingSample.limit:
            raise _Budget(f"more than {CountingSample.limit} sample comparisons")
        return dict.__eq__(self, other)

    __hash__ = None


def test_no_oom_cgroup_evidence_is_linear_over_a_day():
    samples = [CountingSample(type="sample", t=float(s), collector="cgroup", service="platform", available=1,
                              oom_kills=0, limit_hits=0) for s in range(DAY)]
    for s in samples[::1000]:            # a sample without a reading now and then, with its reason
        s["available"] = 0
        s["reason"] = "cgroup gone"
    CountingSample.compared, CountingSample.limit = 0, DAY
    ev = cgroup_evidence(Events(samples))["platform"]
    assert ev.reasons == ["cgroup gone"]
    assert len(ev.good) == DAY - len(samples[::1000])
    assert CountingSample.compared <= DAY          # 0 today; the list membership made ~3.7e9


def _day_events(seconds: int = DAY) -> Events:
    ev = [{"type": "meta", "t": 0.0, "wall": WALL0},
          {"type": "phase", "t": 10.0, "wall": WALL0 + 10, "name": "steady", "start": 10.0, "end": 10.0 + seconds}]
    fp = {"type": "fault-plan", "t": 10.0, "wall": WALL0 + 10, "faults": []}
    ev.append(fp)
    for k, a in enumerate(range(600, seconds - 60, 3600)):     # a minute's fault window every hour
        for phase, at in (("inject", a), ("heal", a + 60)):
            ev.append({"type": "fault", "t": 10.0 + at, "wall": WALL0 + 10 + at, "name": "slow", "kind": "mongo-slowdown",
                       "target": "platform->mongo", "window": k, "phase": phase, "intended": float(at),
                       "effective": float(at), "landed": True})
    for s in range(seconds):
        ev.append({"type": "load", "t": 11.0 + s, "wall": WALL0 + 11 + s, "target_rate": 2.0, "scheduled": 2,
                   "sent": 2, "acked": 2, "failed": 0, "p50_ms": 10.0, "p99_ms": 12.0, "max_ms": 12.0, "sec": s})
    ev.append({"type": "op", "t": 11.0 + seconds, "wall": WALL0 + 11 + seconds, "op": "load-end"})
    return Events(ev)


def test_the_latency_log_is_decoded_once_per_interval_for_every_check_over_a_day(tmp_path, monkeypatch):
    h = new_histogram()
    h.record_value(10_000)
    h.record_value(900_000)              # one of two acks a second is slow at a 500 ms objective
    payload = h.encode().decode("ascii")
    IntervalLogWriter(tmp_path / LATENCY_FILE, WALL0).close()        # the real header, then a line a second
    with open(tmp_path / LATENCY_FILE, "a") as fh:
        fh.writelines(f"{s}.000,1.000,900.000,{payload}\n" for s in range(DAY))
    calls = {"decode": 0, "iterate": 0}
    real_decode = HdrHistogram.decode

    def decode(*a, **k):
        calls["decode"] += 1
        return real_decode(*a, **k)

    def iterate(self):
        calls["iterate"] += 1
        raise AssertionError("a histogram walked bucket by bucket in Python")

    monkeypatch.setattr(HdrHistogram, "decode", staticmethod(decode))
    monkeypatch.setattr(HdrHistogram, "get_recorded_iterator", iterate)
    run = RunData(tmp_path, _day_events())
    v = error_budget(run, objective=0.99, latency_ms=500)
    assert v.figures["good_counted_from_histograms"] == 1
    assert v.figures["good"] == DAY and v.figures["valid"] == 2 * DAY        # exactly half good
    p = latency_objective(run, max_ms=1000, during="steady")
    assert p.figures["samples"] == 2 * DAY and p.figures["max_ms"] == pytest.approx(900, rel=0.01)
    assert calls == {"decode": DAY, "iterate": 0}      # once per interval, shared by both checks


def test_vectorised_good_counts_equal_the_bucket_walk(tmp_path):
    rng = np.random.default_rng(7)
    w = IntervalLogWriter(tmp_path / LATENCY_FILE, WALL0)
    hs = []
    for s in range(60):
        h = new_histogram()
        for v in rng.lognormal(10, 1.6, size=int(rng.integers(1, 200))):
            h.record_value(min(int(v) + 1, 3_000_000_000))
        w.write(s, h)
        hs.append(h)
    w.close()
    log = LatencyLog.read(tmp_path / LATENCY_FILE)
    for ms in (1, 5, 22.026, 100, 1000, 50_000):
        assert log.good_per_second(ms) == {s: count_within(h, ms * 1000) for s, h in enumerate(hs)}


def _python_calls(fn, limit: int):
    """``fn()`` and the number of Python-level function calls it made (C calls not counted); raises once
    the count passes ``limit``, so a per-row algorithm fails fast instead of crawling."""
    n = 0

    def prof(frame, event, arg):
        nonlocal n
        if event == "call":
            n += 1
            if n > limit:
                sys.setprofile(None)
                raise _Budget(f"more than {limit} Python calls")
    sys.setprofile(prof)
    try:
        out = fn()
    finally:
        sys.setprofile(None)
    return out, n


def _acked(dir, rows: int, seconds: int = DAY):
    """``rows`` acked messages spread over ``seconds`` of load (load start: timeline t=11, wall WALL0 + 11)."""
    i = np.arange(rows)
    intended = ((WALL0 + 11) * 1000 + i * (seconds * 1000 // rows)).astype(np.int64)
    lat = 5 + (i * 7919) % 1000
    with open(dir / legacy_csv(ACKED_DATA), "w") as fh:
        fh.write("device,seq,intended_ms,acked_ms\n")
        fh.writelines(f"monsoon-{k % 50:05d},{k // 50},{a},{a + b}\n"
                      for k, a, b in zip(i.tolist(), intended.tolist(), lat.tolist()))
    return intended, lat


@pytest.mark.parametrize("rows", [DAY // 10, DAY])
def test_latency_objective_over_fault_windows_does_not_do_python_work_per_row(tmp_path, rows):
    intended, lat = _acked(tmp_path, rows)
    run = RunData(tmp_path, _day_events())
    v, calls = _python_calls(lambda: latency_objective(run, max_ms=2000, during="faults"), limit=5_000)
    # the exact answer: every row whose intended time (on the timeline) is inside a window, both ends included
    t = intended / 1000.0 - WALL0
    inside = np.zeros(rows, dtype=bool)
    for a in range(600, DAY - 60, 3600):
        inside |= (t >= 10 + a) & (t <= 10 + a + 60)
    want = np.sort(lat[inside].astype(float))
    assert v.figures["samples"] == len(want) > 0
    assert v.figures["max_ms"] == want[-1]
    assert calls < 5_000          # the same budget for 8,640 rows and 86,400: nothing per row


def test_merged_spans_match_any_of_the_spans():
    rng = np.random.default_rng(3)
    spans = [(float(a), float(a + d)) for a, d in zip(rng.uniform(0, 100, 30), rng.uniform(0, 8, 30))]
    t = np.concatenate([rng.uniform(-5, 110, 2000), [a for a, _ in spans], [b for _, b in spans]])
    got = in_spans(t, *merged_spans(spans))
    assert got.tolist() == [any(a <= x <= b for a, b in spans) for x in t.tolist()]
    assert not in_spans(t, *merged_spans([])).any()


def _many_devices_run(dir, rows: int, devices: int):
    i = np.arange(rows)
    dev, seq = i % devices, i // devices
    intended = 1_700_000_000_000 + i * 10
    with open(dir / legacy_csv(ACKED_DATA), "w") as fh:
        fh.write("device,seq,intended_ms,acked_ms\n")
        fh.writelines(f"d{d:06d},{s},{t},{t + 5}\n" for d, s, t in zip(dev.tolist(), seq.tolist(), intended.tolist()))
    with open(dir / "stored.csv", "w") as fh:
        fh.write("device,seq,stored_ms\n")
        fh.writelines(f"d{d:06d},{s},{t + 50}\n" for d, s, t in zip(dev.tolist(), seq.tolist(), intended.tolist())
                      if s != 3)                              # seq 3 of every device lost
    with open(dir / "sent.csv", "w") as fh:
        fh.write("device,last_seq\n")
        fh.writelines(f"d{d:06d},{(rows - 1 - d) // devices}\n" for d in range(devices))


def test_accounting_does_no_python_work_per_device_and_chunk(tmp_path, monkeypatch):
    """The accounting is one vectorised pass: 100x the devices adds a few Python calls per device (naming
    it, once), never calls per device *and* per chunk read (a per-device loop made 10,000 devices cost
    6.5x what 50 did).  The per-chunk calls (numpy's Python wrappers) do not depend on the devices."""
    import monsoon.checks.accounting as A
    monkeypatch.setattr(A, "_CHUNK", 1 << 16)            # ~60 chunks of acked.csv and stored.csv
    rows = 120_000
    calls = {}
    for devices in (50, 5_000):
        d = tmp_path / str(devices)
        d.mkdir()
        _many_devices_run(d, rows, devices)
        acc, calls[devices] = _python_calls(lambda: A.account(d), limit=20_000 + 10 * devices)
        assert acc.acked == rows and acc.acked_lost == devices and acc.devices == devices
        assert acc.reordered == 0 and acc.e2e_ms["p50"] == 50.0
    assert calls[5_000] - calls[50] <= 8 * (5_000 - 50)     # ~6 today: sent.csv's row, the name, the sum


def test_a_day_long_plot_keeps_a_ten_second_dip_and_spike_per_pixel():
    from monsoon.report.html import PLOT_PIXELS, downsample
    t = np.arange(DAY, dtype=float)
    y = np.full(DAY, 400.0)
    y[50_000:50_010] = 0.0            # a pod kill's ten seconds without acks
    y[70_000:70_003] = 4000.0         # a three-second burst
    x, v = downsample(t, y, 2 * PLOT_PIXELS, "minmax")
    assert len(x) <= 2 * PLOT_PIXELS and v.min() == 0.0 and v.max() == 4000.0
    assert abs(x[np.argmin(v)] - 50_000) < DAY / PLOT_PIXELS        # where it happened, to the pixel


def test_a_timeline_is_parsed_a_block_at_a_time_and_the_same_events_and_tears_come_out(tmp_path, monkeypatch):
    """One ``json.loads`` per block of lines (the keys shared: a day's 500k events in ~40 % less memory); a
    block with a damaged line is read line by line, so events, tears and damage point are what a line-by-line
    read gives, wherever the block boundaries fall."""
    import json

    from monsoon.timeline import store
    lines = [json.dumps({"type": "sample", "t": i / 10, "wall": WALL0 + i, "collector": "process", "rss_mb": i})
             for i in range(400)]
    lines[150] = lines[150][:20]                       # a line cut short in the middle
    lines[260] = "[1, 2]"                              # JSON, not an event
    lines[300] = ""                                    # a blank line
    path = tmp_path / "timeline.jsonl"
    path.write_text("\n".join(lines) + "\n" + lines[5][:30])     # and a torn tail
    got = {}
    for size in (1, 700, 5000, 1 << 22):
        monkeypatch.setattr(store, "_BLOCK_BYTES", size)
        evs, tears, damage = store.read_timeline(path)
        got[size] = (evs, [t.note for t in tears], damage)
    assert len(got[1][0]) == 397 and len(got[1][1]) == 3 and got[1][2] == 150
    assert all(g == got[1] for g in got.values())
    # the fast path ran: two events of one block share their key strings
    monkeypatch.setattr(store, "_BLOCK_BYTES", 1 << 22)
    whole = store._whole_block([(ln + "\n").encode() for ln in lines[:100]])
    assert whole is not None and list(whole[0])[4] is list(whole[99])[4]
    assert store._whole_block([(ln + "\n").encode() for ln in lines[140:160]]) is None


def test_a_long_runs_fault_window_is_zoomed_from_the_samples_in_it(tmp_path):
    """A 60 s pod kill in a 2 h run is a few pixels on the full plot; the report adds its six plots over the
    window and a margin, drawn from the seconds in that stretch (not the whole run's downsampled points)."""
    import json

    from monsoon.report.html import Plotter, _zooms, zoom_views
    from monsoon.timeline.store import Events
    from tests.unit.helpers import RunBuilder
    hours = 7200
    b = RunBuilder(tmp_path)
    b.ev("phase", 0, name="steady", start=0, end=hours)
    b.ev("fault-plan", 0.0, run_id="r", horizon=hours, faults=[])
    for phase, eff in (("inject", 3600.0), ("heal", 3660.0)):
        b.ev("fault", eff, name="kill", kind="pod-kill", backend="process", target="platform", window=0,
             phase=phase, intended=eff, effective=eff, landed=True, evidence={})
    for s in range(hours):
        b.load(s, 400, 0 if 3600 <= s < 3610 else 400)
    (tmp_path / "timeline.jsonl").write_text("".join(json.dumps(e) + "\n" for e in b.events))
    ev = Events.load(tmp_path / "timeline.jsonl")
    views, more = zoom_views(ev)
    assert [(w.name, v) for w, v in views] == [("kill", (3570.0, 3690.0))] and more == 0
    p = Plotter(ev, tmp_path, views[0][1])
    x, y = p._ds([e["t"] for e in ev.of("load")], [e["acked"] for e in ev.of("load")], 2000, "minmax")
    assert 3569 <= x.min() and x.max() <= 3692 and len(x) >= 120 and y.min() == 0   # every second in view
    assert (p.unit, p.t0, p.t1) == ("s", 3570.0, 3690.0)
    html = "\n".join(_zooms(tmp_path, ev, "s / e"))
    assert html.count('<details class="zoom" data-window="kill"') == 1 and html.count("data-zoom=\"0\"") == 6
    short = [e for e in b.events if e["type"] != "load" or e["t"] < 1700]     # 28 min: the full plot will do
    short[1]["end"] = 1700
    (tmp_path / "short.jsonl").write_text("".join(json.dumps(e) + "\n" for e in short if e["t"] < 1700))
    assert zoom_views(Events.load(tmp_path / "short.jsonl")) == ([], 0)
