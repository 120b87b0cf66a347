"""Jepsen-style accounting on hand-made run directories: every figure, every check, each case that must
fail or say unknown, the CSV reader's fast and slow paths against a naive reference, the stored-message
sources, and the memory/time of a large synthetic run (printed, not asserted)."""
import csv
import json
import os
import random
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import monsoon.checks.accounting as A
import monsoon.observe.storage as storage
from monsoon.observe.storage import PostgresSource, StoredSource, stored_source
from monsoon.timeline.columnar import export_csv, iter_dicts, parts_dir
from monsoon.checks.accounting import account
from monsoon.checks.loss import no_acked_loss, no_duplicates, no_unexpected
from monsoon.rundir import ACKED_DATA, legacy_csv, read_sent, write_sent
from monsoon.checks.registry import CHECKS, evaluate, validate_check
from monsoon.checks.base import FAIL, PASS, UNKNOWN, RunData
from tests.unit.helpers import RunBuilder

T0 = 1_700_000_000_000      # epoch ms of the first intended send


def write_acked(dir: Path, rows) -> None:
    """rows: (device, seq) or (device, seq, intended_ms)."""
    with open(dir / "acked.csv", "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")     # as the fleet writes it (plain names need no quotes)
        w.writerow(["device", "seq", "intended_ms", "acked_ms"])
        for r in rows:
            intended = r[2] if len(r) > 2 else T0 + 10 * r[1]
            w.writerow([r[0], r[1], intended, intended + 5])


def write_stored(dir: Path, rows, header=("device", "seq")) -> None:
    with open(dir / "stored.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(header)
        for r in rows:
            w.writerow(r)


def make_run(tmp_path, acked, stored, sent=None, header=("device", "seq"), drained=True) -> RunData:
    b = RunBuilder(tmp_path)
    if drained is not None:
        b.ev("drain", 100, drained=drained, waited_s=3, backlog=0)
    b.write()
    write_acked(tmp_path, acked)
    write_stored(tmp_path, stored, header)
    if sent is not None:
        write_sent(tmp_path / "sent.csv", sent)
    return RunData(tmp_path)


# ------------------------------------------------------------------ every figure at once

def mixed_run(tmp_path, **kw) -> RunData:
    acked = [("d1", s) for s in range(8)] + [("d2", s) for s in range(5)]
    stored = [("d1", s) for s in range(6)]          # d1#6, d1#7 acked and lost
    stored += [("d1", 3)]                           # one duplicate
    stored += [("d1", 8)]                           # sent (last_seq 9), never acked: recovered
    stored += [("d1", 12)]                          # beyond d1's last sent seq: unexpected
    stored += [("d3", 0)]                           # a device the fleet never had: unexpected
    stored += [("d2", s) for s in range(5)] + [("d2", 2), ("d2", 2)]   # d2#2 stored three times
    return make_run(tmp_path, acked, stored, sent={"d1": 9, "d2": 4}, **kw)


def test_every_figure_of_a_mixed_run(tmp_path):
    acc = mixed_run(tmp_path).accounting
    assert acc.acked == 13 and acc.acked_lost == 2 and acc.lost_sample == [("d1", 6), ("d1", 7)]
    assert acc.stored == 6 + 1 + 1 + 1 + 1 + 7
    assert acc.duplicates == 3 and acc.duplicate_keys == 2
    assert acc.dup_sample == [("d1", 3, 2), ("d2", 2, 3)]
    assert acc.stored_unacked == 3                  # d1#8, d1#12, d3#0
    assert acc.recovered == 1 and acc.unexpected == 2 and acc.unexpected_devices == 2
    assert acc.unexpected_sample == [("d1", 12), ("d3", 0)]
    assert acc.sent == 15
    assert acc.reordered is None and acc.e2e_ms is None      # no stored_ms column


def test_the_checks_of_a_mixed_run_fail_with_the_numbers(tmp_path):
    r = mixed_run(tmp_path)
    v = no_acked_loss(r)
    assert v.verdict == FAIL
    assert v.figures == {"acked": 13, "acked_lost": 2, "duplicates": 3, "stored": 17, "stored_unacked": 3,
                         "recovered": 1, "unexpected": 2, "acked_lost_pct": round(100 * 2 / 13, 4)}
    assert "2 of 13 acked messages lost" in v.message and "d1#6, d1#7" in v.message
    v = no_duplicates(r)
    assert v.verdict == FAIL and v.figures == {"duplicates": 3, "duplicate_keys": 2, "stored": 17}
    assert "2 message(s) stored more than once (3 extra copies" in v.message and "d2#2 x3" in v.message
    v = no_unexpected(r)
    assert v.verdict == FAIL and v.figures["unexpected"] == 2 and v.figures["unexpected_devices"] == 2
    assert "d1#12, d3#0" in v.message


def test_a_clean_run_passes_every_check(tmp_path):
    acked = [(d, s) for d in ("a", "b") for s in range(50) if s != 49]    # a#49, b#49 sent, PUBACK lost
    stored = [(d, s) for d in ("a", "b") for s in range(50)]
    r = make_run(tmp_path, acked, stored, sent={"a": 49, "b": 49})
    v = no_acked_loss(r)
    assert v.verdict == PASS and v.figures["recovered"] == 2 and v.figures["unexpected"] == 0
    assert v.figures["stored_unacked"] == 2 and v.figures["duplicates"] == 0
    assert no_duplicates(r).verdict == PASS
    v = no_unexpected(r)
    assert v.verdict == PASS and v.figures == {"unexpected": 0, "unexpected_devices": 0, "sent": 100, "stored": 100}


def test_a_device_that_sent_nothing_has_no_sent_messages(tmp_path):
    r = make_run(tmp_path, [("a", 0)], [("a", 0), ("idle", 0)], sent={"a": 0, "idle": -1})
    v = no_unexpected(r)
    assert v.verdict == FAIL and v.figures["unexpected"] == 1 and "idle#0" in v.message


def test_unexpected_copies_are_duplicates_too(tmp_path):
    r = make_run(tmp_path, [("a", 0)], [("a", 0), ("ghost", 7), ("ghost", 7), ("a", 99), ("a", 99)],
                 sent={"a": 0})
    acc = r.accounting
    assert acc.unexpected == 2 and acc.duplicates == 2 and acc.duplicate_keys == 2 and acc.stored_unacked == 2


def test_without_sent_csv_recovered_and_unexpected_are_not_reported(tmp_path):
    r = make_run(tmp_path, [("a", 0), ("a", 1)], [("a", 0), ("a", 1), ("a", 5), ("x", 0)])
    v = no_acked_loss(r)
    assert v.verdict == PASS and v.figures["stored_unacked"] == 2
    assert "recovered" not in v.figures and "unexpected" not in v.figures
    v = no_unexpected(r)
    assert v.verdict == UNKNOWN and "sent.parquet is missing" in v.message


def test_no_duplicates_and_no_unexpected_are_unknown_without_their_inputs(tmp_path):
    b = RunBuilder(tmp_path)
    b.write()
    write_acked(tmp_path, [("a", 0)])
    r = RunData(tmp_path)
    assert no_duplicates(r).verdict == UNKNOWN and "stored.parquet is missing" in no_duplicates(r).message
    assert no_unexpected(r).verdict == UNKNOWN


def test_no_duplicates_is_unknown_when_nothing_was_stored(tmp_path):
    r = make_run(tmp_path, [("a", 0)], [], sent={"a": 0})
    assert no_duplicates(r).verdict == UNKNOWN
    assert no_unexpected(r).verdict == PASS
    assert no_acked_loss(r).verdict == FAIL


def test_no_unexpected_is_unknown_when_nothing_was_sent(tmp_path):
    r = make_run(tmp_path, [], [], sent={"a": -1})
    assert no_unexpected(r).verdict == UNKNOWN


def test_lost_but_not_drained_is_unknown_and_duplicates_still_fail(tmp_path):
    r = make_run(tmp_path, [("a", 0), ("a", 1)], [("a", 0), ("a", 0)], sent={"a": 1}, drained=False)
    assert no_acked_loss(r).verdict == UNKNOWN
    assert no_duplicates(r).verdict == FAIL


def test_checks_are_registered_and_validated(tmp_path):
    assert {"no_acked_loss", "no_duplicates", "no_unexpected"} <= set(CHECKS)
    validate_check("no_duplicates", {})
    with pytest.raises(ValueError, match="has no parameter"):
        validate_check("no_unexpected", {"max": 1})
    mixed_run(tmp_path)
    got = {v.name: v.verdict for v in evaluate(tmp_path, [("no_acked_loss", {}), ("no_duplicates", {}),
                                                          ("no_unexpected", {})])}
    assert got == {"no_acked_loss": FAIL, "no_duplicates": FAIL, "no_unexpected": FAIL}


# ------------------------------------------------------------------ reordering and end-to-end latency

def timed_run(tmp_path, stored_rows, acked=None, sent=None) -> RunData:
    """stored_rows: (device, seq, stored_ms)."""
    acked = acked if acked is not None else sorted({(d, s) for d, s, _ in stored_rows})
    return make_run(tmp_path, acked, stored_rows, sent=sent, header=("device", "seq", "stored_ms"))


def test_reordered_counts_messages_stored_after_a_higher_seq(tmp_path):
    rows = [("a", s, T0 + 1000 + i) for i, s in enumerate([0, 1, 3, 2, 4])]      # 2 stored after 3
    rows += [("b", s, T0 + 1000 + i) for i, s in enumerate([5, 0, 1, 2, 3, 4])]  # 0..4 after 5
    assert timed_run(tmp_path, rows).accounting.reordered == 1 + 5


def test_reordered_uses_stored_ms_not_the_file_order(tmp_path):
    rows = [("a", 3, T0 + 1003), ("a", 1, T0 + 1001), ("a", 2, T0 + 1002), ("a", 0, T0 + 1000)]
    assert timed_run(tmp_path, rows).accounting.reordered == 0


def test_one_batch_committed_at_once_is_not_reordered(tmp_path):
    rows = [("a", s, T0 + 2000) for s in (4, 2, 3, 0, 1)]      # one commit timestamp
    assert timed_run(tmp_path, rows).accounting.reordered == 0


def test_a_late_duplicate_is_a_duplicate_not_a_reorder(tmp_path):
    rows = [("a", s, T0 + 1000 + s) for s in range(5)] + [("a", 1, T0 + 9000)]
    acc = timed_run(tmp_path, rows).accounting
    assert acc.reordered == 0 and acc.duplicates == 1


def test_devices_are_ordered_independently(tmp_path):
    rows = [("a", 5, T0 + 1000), ("b", 0, T0 + 1001), ("a", 6, T0 + 1002), ("b", 1, T0 + 1003)]
    assert timed_run(tmp_path, rows).accounting.reordered == 0


def test_without_stored_ms_reordered_and_e2e_are_not_reported(tmp_path):
    r = make_run(tmp_path, [("a", 0), ("a", 1)], [("a", 1), ("a", 0)])
    v = no_acked_loss(r)
    assert "reordered" not in v.figures and not any(k.startswith("e2e_") for k in v.figures)


def test_a_stored_ms_column_of_nulls_is_not_reported_either(tmp_path):
    r = make_run(tmp_path, [("a", 0), ("a", 1)], [("a", 1, ""), ("a", 0, "")], header=("device", "seq", "stored_ms"))
    acc = r.accounting
    assert acc.reordered is None and acc.e2e_ms is None and acc.acked_lost == 0


def test_end_to_end_latency_percentiles_from_intended_to_stored(tmp_path):
    lat = list(range(1, 1001))                  # ms, message i takes i+1 ms
    random.Random(3).shuffle(lat)
    acked = [("a", i, T0 + 100 * i) for i in range(1000)]
    stored = [("a", i, T0 + 100 * i + lat[i]) for i in range(1000)]
    stored.append(("a", 7, T0 + 10 ** 6))        # a later duplicate: the first copy counts
    stored.append(("a", 1000, T0 + 10 ** 6))     # never acked: no intended time, not in the percentiles
    r = make_run(tmp_path, acked, stored, sent={"a": 1000}, header=("device", "seq", "stored_ms"))
    v = no_acked_loss(r)
    assert v.verdict == PASS
    f = v.figures
    assert (f["e2e_samples"], f["e2e_p50_ms"], f["e2e_p99_ms"], f["e2e_p999_ms"], f["e2e_max_ms"], f["e2e_min_ms"]) \
        == (1000, 500, 990, 999, 1000, 1)
    assert f["recovered"] == 1 and f["reordered"] >= 1 and "send->stored p50 500 ms" in v.message


def test_e2e_over_intended_times_days_apart(tmp_path):
    acked = [("a", 0, T0), ("a", 1, T0 + 30 * 86_400_000)]     # beyond int32 ms offsets
    stored = [("a", 0, T0 + 7), ("a", 1, T0 + 30 * 86_400_000 + 9)]
    acc = make_run(tmp_path, acked, stored, header=("device", "seq", "stored_ms")).accounting
    assert acc.e2e_ms["min"] == 7 and acc.e2e_ms["max"] == 9


# ------------------------------------------------------------------ the CSV reader

def naive(acked, stored, sent):
    """The reference: sets and Counters of tuples (what the accounting must not build on 35M rows)."""
    a = set(acked)
    c = Counter(stored)
    unacked = set(c) - a
    unexpected = {(d, s) for d, s in unacked if s > sent.get(d, -1)}
    return {"acked": len(a), "acked_lost": len(a - set(c)), "duplicates": sum(n - 1 for n in c.values()),
            "duplicate_keys": sum(1 for n in c.values() if n > 1), "stored": sum(c.values()),
            "stored_unacked": len(unacked), "unexpected": len(unexpected), "recovered": len(unacked - unexpected)}


@pytest.mark.parametrize("chunk", [64, 1000, 2 << 20])
def test_matches_a_naive_reference_on_random_data(tmp_path, monkeypatch, chunk):
    monkeypatch.setattr(A, "_CHUNK", chunk)      # chunk boundaries everywhere
    rnd = random.Random(chunk)
    devs = [f"dev-{i}" for i in range(7)] + ["x"]
    sent = {d: rnd.randint(-1, 300) for d in devs}
    acked = [(d, s) for d in devs for s in range(sent[d] + 1) if rnd.random() < 0.9]
    stored = [(d, s) for d in devs for s in range(sent[d] + 1) if rnd.random() < 0.95]
    stored += rnd.sample(stored, 40) + [("ghost", 3), ("dev-1", 10_000), ("dev-1", 10_000)]
    rnd.shuffle(stored)
    r = make_run(tmp_path, acked, stored, sent=sent)
    acc = r.accounting
    got = {k: getattr(acc, k) for k in naive(acked, stored, sent)}
    assert got == naive(acked, stored, sent)


def test_the_slow_path_reads_what_the_fast_path_reads(tmp_path):
    """Quoted names (a comma inside) and CRLF lines go through the csv module: same answer."""
    names = ["plain", "with,comma", 'q"uote']
    acked = [(n, s) for n in names for s in range(20)]
    stored = [(n, s) for n in names for s in range(20) if s != 4]
    r = make_run(tmp_path, acked, stored, sent={n: 19 for n in names})
    acc = r.accounting
    assert acc.acked == 60 and acc.acked_lost == 3 and acc.unexpected == 0
    assert ("with,comma", 4) in acc.lost_sample


def test_unnamed_query_columns_are_read_by_position(tmp_path):
    r = make_run(tmp_path, [("a", 0), ("a", 1)], [("a", 1, T0 + 50), ("a", 0, T0 + 60)],
                 header=("name", "long_v", "ms"))
    acc = r.accounting
    assert acc.acked_lost == 0 and acc.reordered == 1


def test_torn_and_malformed_rows_are_skipped(tmp_path):
    r = make_run(tmp_path, [("a", 0), ("a", 1)], [("a", 0), ("a", 1)], sent={"a": 1})
    with open(tmp_path / "acked.csv", "a") as fh:
        fh.write("a,")                                  # the run was killed mid-write
    with open(tmp_path / "stored.csv", "a") as fh:
        fh.write("a,not-a-number\r\n,5\r\na,1.0\r\n")   # a decimal seq counts (int(float))
    acc = RunData(tmp_path).accounting
    assert acc.acked == 2 and acc.stored == 3 and acc.duplicates == 1


def test_a_row_without_its_seq_is_skipped_on_both_paths(tmp_path):
    for quoted in (False, True):
        d = tmp_path / str(quoted)
        d.mkdir()
        r = make_run(d, [("a", 0)], [("a", 0)], sent={"a": 0})
        with open(d / "stored.csv", "a") as fh:
            fh.write('"a",,\n' if quoted else "a,\n")     # the quote sends the chunk down the slow path
        acc = RunData(d).accounting
        assert (acc.stored, acc.unexpected) == (1, 0), quoted


# ------------------------------------------------------------------ sources and files

def test_sent_csv_round_trip(tmp_path):
    write_sent(tmp_path / "sent.csv", {"a": 9, "b,c": -1})
    assert read_sent(tmp_path / "sent.csv") == {"a": 9, "b,c": -1}
    assert read_sent(tmp_path / "nope.csv") is None


def test_write_stored_names_the_columns_keeps_nulls_and_leaves_no_tmp(tmp_path):
    (tmp_path / "stored.csv").write_text("device,seq\nstale,1\n")      # an earlier run's: replaced, not read
    n = storage.write_stored(tmp_path / "stored.csv", ["device", "seq", "stored_ms"], [("a", 1, 5), ("a", 2, None)])
    assert n == 2 and not (tmp_path / "stored.csv").exists()
    assert list(iter_dicts(tmp_path / "stored.csv")) == [{"device": "a", "seq": 1, "stored_ms": 5},
                                                          {"device": "a", "seq": 2, "stored_ms": None}]
    assert export_csv(parts_dir(tmp_path / "stored.csv"), tmp_path / "x.csv") == 2
    assert (tmp_path / "x.csv").read_text() == "device,seq,stored_ms\na,1,5\na,2,\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stored.parquet", "x.csv"]


def test_a_failed_export_leaves_no_file(tmp_path):
    def rows():
        yield ("a", 1, 5)
        raise RuntimeError("could not get commit timestamp data")

    with pytest.raises(RuntimeError):
        storage.write_stored(tmp_path / "stored.csv", ["device", "seq", "stored_ms"], rows())
    assert list(tmp_path.iterdir()) == []


class _Col:
    def __init__(self, name):
        self.name = name


class _FakeCursor:
    def __init__(self, rows, cols):
        self.rows, self.description, self.itersize = rows, [_Col(c) for c in cols], None

    def copy(self, sql):
        """What psycopg's ``Cursor.copy`` gives: the server's CSV in blocks (here one per row)."""
        self.query = sql
        cols = [c.name for c in self.description]
        blocks = [",".join(cols).encode() + b"\n"] + [",".join(map(str, r)).encode() + b"\n" for r in self.rows]
        cur = self

        class Copy:
            def __enter__(self):
                return iter(blocks)

            def __exit__(self, *a):
                cur.copied = True
        return Copy()

    def __enter__(self):
        return self

    def __exit__(self, *a):
        pass


class _FakeConn:
    def __init__(self, cur):
        self.cur = cur

    def cursor(self, name=None):
        return self.cur

    def __enter__(self):
        return self

    def __exit__(self, *a):
        pass


def test_postgres_source_writes_the_query_columns(tmp_path, monkeypatch):
    cur = _FakeCursor([("a", 0, 1700000000123), ("a", 1, 1700000000150)], ["device", "seq", "stored_ms"])
    seen = {}

    class FakePsycopg:
        @staticmethod
        def connect(dsn, connect_timeout):
            seen["dsn"] = dsn
            return _FakeConn(cur)

    monkeypatch.setattr(storage, "psycopg", FakePsycopg)   # the module the source connects with

    class Storage:
        kind, dsn, loss_query = "postgres", "postgresql://h:{port:pg}/db", "SELECT ..."

    src = stored_source(Storage, lambda s: s.replace("{port:pg}", "5432"))
    assert isinstance(src, PostgresSource) and isinstance(src, StoredSource)
    assert src.export(tmp_path / "stored.csv") == 2
    assert seen["dsn"] == "postgresql://h:5432/db" and cur.copied     # streamed: the server writes the CSV
    assert cur.query == "COPY (SELECT ...) TO STDOUT WITH (FORMAT csv, HEADER true)"
    assert list(iter_dicts(tmp_path / "stored.csv")) == [{"device": "a", "seq": 0, "stored_ms": 1700000000123},
                                                          {"device": "a", "seq": 1, "stored_ms": 1700000000150}]


def test_an_unknown_storage_kind_names_the_known_ones():
    class Storage:
        kind = "mongo"

    with pytest.raises(ValueError, match="no stored-message source for storage kind 'mongo'.*cassandra, kafka, postgres"):
        stored_source(Storage)


# ------------------------------------------------------------------ memory and time at scale

BENCH = textwrap.dedent("""
    import json, sys, time
    from collections import Counter
    def hwm():
        return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM")) / 1024
    d, mode = sys.argv[1], sys.argv[2]
    import numpy
    import monsoon.checks.registry
    base = hwm()
    t = time.perf_counter()
    if mode == "numpy":
        from monsoon.checks.accounting import account
        a = account(d)
        out = [a.acked, a.acked_lost, a.duplicates, a.unexpected, a.reordered]
    else:   # what no_acked_loss used to build: a set of tuples and a Counter
        import csv
        acked = {(r["device"], int(r["seq"])) for r in csv.DictReader(open(d + "/acked.csv"))}
        stored = Counter((r["device"], int(r["seq"])) for r in csv.DictReader(open(d + "/stored.csv")))
        out = [len(acked), len(acked - stored.keys()), sum(n - 1 for n in stored.values() if n > 1), None, None]
    print(json.dumps({"mode": mode, "seconds": round(time.perf_counter() - t, 2), "base_mb": round(base, 1),
                      "peak_mb": round(hwm(), 1), "figures": out}))
""")


def synthetic_run(dir: Path, rows: int, devices: int = 100, rate: float = 400.0) -> None:
    """``rows`` acked messages over ``devices`` at ``rate`` msg/s, all stored (shuffled, with stored_ms),
    0.1 % lost, 0.1 % duplicated: the shape of a soak's files."""
    rng = np.random.default_rng(7)
    k = np.arange(rows)
    dev, seq = k % devices, k // devices
    intended = T0 + (k * 1000 / rate).astype(np.int64)
    names = np.array([f"monsoon-dev-{i:04d}" for i in range(devices)])
    step = 1_000_000
    with open(dir / "acked.csv", "w") as fh:
        fh.write("device,seq,intended_ms,acked_ms\n")
        for a in range(0, rows, step):
            sl = slice(a, a + step)
            fh.write("".join(f"{d},{s},{i},{i + 20}\n" for d, s, i in
                             zip(names[dev[sl]].tolist(), seq[sl].tolist(), intended[sl].tolist())))
    keep = rng.random(rows) >= 0.001
    idx = np.concatenate([np.flatnonzero(keep), rng.choice(rows, rows // 1000)])
    idx = idx[rng.permutation(len(idx))]
    stored_ms = intended + rng.integers(30, 800, rows)
    with open(dir / "stored.csv", "w") as fh:
        fh.write("device,seq,stored_ms\n")
        for a in range(0, len(idx), step):
            p = idx[a:a + step]
            fh.write("".join(f"{d},{s},{m}\n" for d, s, m in
                             zip(names[dev[p]].tolist(), seq[p].tolist(), stored_ms[p].tolist())))
    write_sent(dir / "sent.csv", {str(n): int(seq[dev == i].max()) for i, n in enumerate(names)})


def test_memory_and_time_on_a_large_synthetic_run(tmp_path, capsys):
    """Default 200k rows; MONSOON_BENCH_ROWS=5000000 for the 24 h-soak-sized measurement.  Printed only."""
    rows = int(os.environ.get("MONSOON_BENCH_ROWS", "200000"))
    synthetic_run(tmp_path, rows)
    env = dict(os.environ, PYTHONPATH=str(Path(A.__file__).parents[2]))
    results = []
    for mode in ("numpy", "sets"):
        p = subprocess.run([sys.executable, "-c", BENCH, str(tmp_path), mode], capture_output=True, text=True,
                           env=env, timeout=1800)
        assert p.returncode == 0, p.stderr
        results.append(json.loads(p.stdout))
    numpy_, sets = results
    assert numpy_["figures"][:3] == sets["figures"][:3]          # same accounting
    with capsys.disabled():
        for r in results:
            print(f"\n[accounting {rows:,} acked / ~{rows:,} stored rows] {r['mode']:5}: "
                  f"{r['seconds']:.1f} s, peak RSS {r['peak_mb']:.0f} MB "
                  f"(+{r['peak_mb'] - r['base_mb']:.0f} MB over the interpreter), figures {r['figures']}")


def test_the_key_space_is_worked_a_block_at_a_time_with_the_same_figures(tmp_path, monkeypatch):
    """The acked scatter (a chunk at a time, acked read twice) and the first-copy pass (e2e latencies, reordering as a suffix minimum) go a
    block of keys at a time so nothing acked.csv-sized is held twice: tiny blocks give the figures of one
    block, with reordering across block and device edges, duplicates, NULL stored times and two-day gaps."""
    r = random.Random(7)
    t0 = 1_790_000_000_000
    acked, stored = [], []
    for d in range(6):
        for s in range(300):
            t = t0 + s * 10 + (2 * 86_400_000 if (d == 3 and s > 150) else 0)
            if r.random() < 0.95:
                acked.append((f"d{d}", s, t, t + 5))
            for _ in range(r.choice([1] * 12 + [0, 2])):
                stored.append((f"d{d}", s, "" if r.random() < 0.05 else t + r.randint(0, 300)))
    r.shuffle(stored)
    write_acked(tmp_path, acked)
    write_stored(tmp_path, stored, header=("device", "seq", "stored_ms"))
    whole = account(tmp_path)
    assert whole.reordered > 100 and whole.e2e_samples > 1000 and whole.duplicates > 0
    monkeypatch.setattr(A, "_BLOCK", 7)
    monkeypatch.setattr(A, "_CHUNK", 64)       # acked read (twice) and scattered a few rows at a time
    assert account(tmp_path) == whole


def test_acked_read_twice_takes_only_the_rows_the_first_pass_saw(tmp_path, monkeypatch):
    """acked is read twice (each device's top seq, then the scatter): rows a live fleet appends in between,
    with seqs past the first pass's top, are left for the next analysis instead of overflowing the key space."""
    write_acked(tmp_path, [("d0", s, 1000 + s, 1005 + s) for s in range(10)])
    write_stored(tmp_path, [("d0", s) for s in range(10)])
    before = account(tmp_path)
    real, reads = A.read_columns, []

    def growing(path, *a, **k):
        if path.name == ACKED_DATA:
            reads.append(path)
            if len(reads) == 2:                       # the fleet writes on between the two passes
                with open(legacy_csv(path), "a") as fh:
                    fh.write("".join(f"d0,{s},{1000 + s},{1005 + s}\n" for s in range(10, 5000)))
        return real(path, *a, **k)

    monkeypatch.setattr(A, "read_columns", growing)
    assert account(tmp_path) == before and len(reads) == 2
    assert before.acked == 10 and before.acked_lost == 0
