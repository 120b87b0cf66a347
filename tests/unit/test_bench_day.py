"""``make bench-day`` (monsoon.selftest.day): its arithmetic, its storage stand-in, and a tiny live run."""
from __future__ import annotations

import json
import os

import pytest

from monsoon.selftest import day
from monsoon.timeline.columnar import parts_dir, read_parts


def test_the_default_is_a_day_at_five_thousand_per_second_in_72_minutes() -> None:
    a = day.parse_args([])
    assert a.messages == 432_000_000 and a.rate == 100_000.0
    assert day.load_seconds(a.messages, a.rate) == 4320.0
    assert a.every == 60.0 and a.baseline_min == 10.0


def test_bench_day_args_shrink_it() -> None:
    a = day.parse_args(["--messages", "30e6", "--rate", "50000"])
    assert a.messages == 30_000_000 and isinstance(a.messages, int)
    assert day.load_seconds(a.messages, a.rate) == 600.0
    with pytest.raises(SystemExit):
        day.parse_args(["--messages", "0"])
    with pytest.raises(SystemExit):
        day.parse_args(["--workers", "3", "--devices", "2"])


def test_growth_is_measured_from_minute_ten_or_a_third_of_a_short_load() -> None:
    assert day.baseline_s(4320.0, 10.0) == 600.0
    assert day.baseline_s(300.0, 10.0) == 100.0
    assert day.growth_pct(100.0, 104.9) == 4.9
    assert day.growth_pct(100.0, 90.0) == -10.0
    assert day.growth_pct(None, 5.0) is None and day.growth_pct(0.0, 5.0) is None


def _sample(t: float, **rss: float) -> dict:
    return {"t": t, "procs": {n: {"rss_mb": v, "cpu_s": t / 10} for n, v in rss.items()}, "acked": int(t * 10),
            "disk_bytes": int(t * 1000), "bytes_per_message": 100.0}


def test_rss_summary_takes_the_first_sample_at_the_baseline_and_the_last_one() -> None:
    samples = [_sample(0, python=100, worker0=5), _sample(60, python=120, worker0=30),
               _sample(600, python=130, worker0=40), _sample(1200, python=132, worker0=40),
               _sample(4320, python=135, worker0=41)]
    s = day.rss_summary(samples, 600.0)
    assert s["baseline_t_s"] == 600 and s["end_t_s"] == 4320
    assert s["rss_mb"]["python"] == {"baseline": 130, "end": 135}
    assert s["rss_growth_pct"] == {"python": 3.85, "worker0": 2.5}
    assert s["rss_growth_pct_max"] == 3.85
    # a process gone by the end has no growth, and does not count
    gone = day.rss_summary([_sample(0, python=100, worker0=5), _sample(10, python=100)], 5.0)
    assert gone["rss_growth_pct"] == {"python": 0.0, "worker0": None}
    assert day.rss_summary([], 600.0)["rss_growth_pct_max"] is None


def test_rss_growth_compares_peaks_so_a_saw_tooth_is_not_growth() -> None:
    """bench-day's RSS rises and falls with the 30 s shard-to-part cycle: the sample at the baseline fell on a
    trough (277) and the last on a crest (309), +11.5 % of nothing. Peaks over a minute at each end compare
    like with like; a real rise still shows."""
    tooth = [_sample(t, python=(309 if (t // 20) % 3 == 2 else 277)) for t in range(0, 600, 20)]
    s = day.rss_summary(tooth, 100.0)
    assert s["rss_mb"]["python"] == {"baseline": 309, "end": 309} and s["rss_growth_pct"]["python"] == 0.0
    rising = [_sample(t, python=(309 if (t // 20) % 3 == 2 else 277) + t / 10) for t in range(0, 600, 20)]
    assert day.rss_summary(rising, 100.0)["rss_growth_pct"]["python"] > 5


def test_rss_growth_uses_the_peaks_read_between_one_minute_samples() -> None:
    """With a sample a minute, each end's window holds one reading: a trough at the baseline (277) and a crest at
    the end (309) read as +11.5 %. The peak kept between samples (309 at both ends) says there was no growth."""
    samples = [_sample(t, python=277 if t < 3000 else 309) for t in range(0, 3660, 60)]
    assert day.rss_summary(samples, 600.0)["rss_growth_pct"]["python"] == 11.55
    for s in samples:
        s["procs"]["python"]["rss_peak_mb"] = 309
    assert day.rss_summary(samples, 600.0)["rss_growth_pct"]["python"] == 0.0


def test_cpu_cores_and_the_curve_columns() -> None:
    samples = [_sample(0, python=100), _sample(60, python=110), _sample(120, python=111)]
    assert day.cpu_cores(samples) == {"python": 0.1}
    c = day.curve(samples)
    assert c["t_min"] == [0.0, 1.0, 2.0]
    assert c["rss_mb"] == {"python": [100, 110, 111]}
    assert set(c) == {"t_min", "rss_mb", "cores", "run_dir_mb", "bytes_per_message"}


def test_exactness_names_every_figure_that_is_off() -> None:
    ok = {"acked": 1000, "stored": 1000, "acked_lost": 0, "duplicates": 0, "unexpected": 0}
    assert day.exactness(ok, 1000, 1000, 1000, 1000) == {}
    bad = day.exactness({**ok, "acked_lost": 2, "acked": 998}, 1000, 1000, 999, 1000)
    assert bad == {"acked_rows": [999, 1000], "acked": [998, 1000], "acked_lost": [2, 0]}
    assert day.exactness(ok, 1001, 1000, 1000, 1000) == {"engine_acked": [1000, 1001]}


def test_the_storage_stand_in_stores_every_sent_seq_once_in_arrival_order(tmp_path) -> None:
    path = tmp_path / "stored.parquet"
    rows = day.StoredStandIn({"b": 2, "a": 3, "c": -1}, chunk=4).export(path)
    assert rows == 7
    got = []
    for dev, (seq,) in read_parts(parts_dir(path), ["seq"]):
        names = dev.dictionary.to_pylist()
        got += [(names[c], int(s)) for c, s in zip(dev.indices.to_pylist(), seq)]
    assert sorted(got) == [("a", 0), ("a", 1), ("a", 2), ("a", 3), ("b", 0), ("b", 1), ("b", 2)]
    assert got[:2] == [("a", 0), ("b", 0)]          # round by round, as the messages arrived
    assert day.dataset_rows(path) == 7
    assert not (tmp_path / "stored.parquet.tmp").exists()


def test_the_day_collector_samples_once_an_interval_and_stops_at_the_load_end(tmp_path) -> None:
    (tmp_path / "f").write_bytes(b"x" * 10000)
    t = [None]
    c = day.DayCollector(lambda: {"python": os.getpid(), "gone": 2 ** 22 + 7}, tmp_path, lambda: 1000,
                         lambda: t[0], every=60.0)
    assert c.sample() is None                       # before the load
    t[0] = 0.5
    s = c.sample()
    assert s is not None and set(s["procs"]) == {"python"} and s["procs"]["python"]["rss_mb"] > 0
    assert s["disk_bytes"] >= 10000 and s["bytes_per_message"] == s["disk_bytes"] / 1000
    t[0] = 30.0
    c._peak["python"] = 1e6                         # as if a crest had been read between samples
    assert c.sample() is None                       # the same minute: RSS read for the peak only
    assert c._peak["python"] == 1e6
    t[0] = 61.0
    assert c.sample()["t"] == 61.0 and "cores" in c.samples[-1]["procs"]["python"]
    p = c.samples[-1]["procs"]["python"]
    assert p["rss_peak_mb"] == 1e6 and p["rss_mb"] < 1e6    # the crest between samples is kept ...
    assert "python" not in c._peak                          # ... and the next interval starts afresh
    c.finish(62.0)
    t[0] = 200.0
    assert c.sample() is None and c.take(201.0) is None
    assert [x["t"] for x in c.samples] == [0.5, 61.0, 62.0]


def test_a_tiny_day_through_the_live_path_ends_exact_with_one_json_line(tmp_path, capsys) -> None:
    """~200k messages: the native engine, the sink, the timeline and collectors, the drain, the stand-in read-back
    and monsoon analyze; the JSON line carries every field the issue asks for."""
    rc = day.main(["--messages", "2e5", "--rate", "50000", "--every", "1", "--dir", str(tmp_path)])
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0
    for k in ("messages", "rate", "rss_mb", "rss_growth_pct", "bytes_per_message", "exact", "analyze_s",
              "analyze_peak_rss_mb"):
        assert k in out
    assert out["messages"] == 200_000 and out["exact"] is True
    assert out["acked_rows"] == out["stored_rows"] == 200_000
    assert {"python", "worker0", "sink0"} <= set(out["rss_mb"])
    assert out["bytes_per_message"] < 10
    assert out["verdicts"]["no_acked_loss"] == "pass"
