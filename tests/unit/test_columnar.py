"""Run data as Parquet parts (monsoon.timeline.columnar): a writer killed with -9 at a random moment leaves
a dataset readable up to its last flushed part, and analyze says where it ends; a Parquet run analyses to
the same figures as the same run in CSV; ``monsoon export --csv`` writes the CSVs back."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np

from monsoon.analysis import analyze
from monsoon.cli import main as cli_main
from monsoon.rundir import ACKED_DATA, SENT_DATA, STORED_DATA, legacy_csv
from monsoon.selftest.analyze_bench import Plan, verify, write_run
from monsoon.checks.accounting import account, read_columns
from monsoon.timeline.columnar import dataset_state, parts_dir, schema_columns
from monsoon.timeline.torn import torn_notes

WRITER = textwrap.dedent("""
    import sys, time
    from monsoon.timeline.columnar import PartWriter
    w = PartWriter(sys.argv[1], ("device", "seq", "intended_ms", "acked_ms"), flush_s=0.02)
    print("ready", flush=True)
    i = 0
    while True:                       # an endless soak: one row per device per step, flushed every 20 ms
        for d in range(20):
            w.append(f"dev-{d:03d}", i, 1_700_000_000_000 + i, 1_700_000_000_005 + i)
        i += 1
        w.maybe_flush()
        if i % 50 == 0:
            time.sleep(0.001)
""")


def test_a_writer_killed_with_minus_9_leaves_everything_up_to_its_last_flushed_part(tmp_path):
    exp = tmp_path / "exp"
    exp.mkdir()
    p = subprocess.Popen([sys.executable, "-c", WRITER, str(parts_dir(exp / ACKED_DATA))], stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        time.sleep(random.uniform(0.3, 1.2))
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    st = dataset_state(parts_dir(exp / ACKED_DATA))
    assert not st.closed and st.parts >= 2 and st.rows > 0
    found, chunks = read_columns(exp / ACKED_DATA, ["seq", "intended_ms"])
    seqs = np.concatenate([cols[0] for _codes, cols in chunks])
    assert len(seqs) == st.rows                     # every flushed row, nothing of the part being written
    per_dev = np.bincount(seqs)                     # a prefix: 0..k-1 for every device, all but the last step
    assert (per_dev[:-1] == 20).all() and 0 < per_dev[-1] <= 20
    notes = torn_notes(exp)
    assert len(notes) == 1 and "acked.parquet was not closed: the run was cut off" in notes[0]
    assert f"{st.parts} part(s), {st.rows:,} rows" in notes[0] and "intended_ms <= " in notes[0]


def test_a_parquet_run_analyses_to_the_same_figures_as_its_csv_and_exports_back(tmp_path, capsys):
    plan = Plan(40_000, 900, 7, 25, seed=3)
    figures = {}
    for fmt in ("csv", "parquet"):
        run = tmp_path / fmt / "run"
        exp = run / "kafka--soak-synthetic"
        write_run(exp, plan, chunk=9_000, fmt=fmt)
        analyze(run)
        assert verify(exp, plan) == {}                # every planted figure exact
        res = json.loads((exp / "result.json").read_text())
        figures[fmt] = {c["name"]: (c["verdict"], c["figures"]) for c in res["checks"]}
        assert "torn" not in res
    assert figures["csv"] == figures["parquet"]
    exp = tmp_path / "parquet" / "run" / "kafka--soak-synthetic"
    assert cli_main(["export", str(tmp_path / "parquet" / "run"), "--csv"]) == 0
    assert "acked.csv: 40,000 rows" in capsys.readouterr().out
    for name in (ACKED_DATA, STORED_DATA, SENT_DATA):
        csv_name = legacy_csv(name)
        assert (exp / csv_name).read_text() == (tmp_path / "csv" / "run" / "kafka--soak-synthetic" / csv_name).read_text()
    assert account(exp) == account(tmp_path / "csv" / "run" / "kafka--soak-synthetic")


def test_a_csv_stream_becomes_parts_whatever_its_blocks_and_nulls_stay_nulls(tmp_path):
    """Postgres COPY hands over blocks of any size: a header cut in two, a quoted device name holding a comma, an
    empty stored_ms (NULL), a column the run does not hold (dropped); 40-byte flushes give several parts."""
    from monsoon.timeline.columnar import CsvParts, iter_dicts
    data = (b'device,seq,stored_ms,extra\n"d,1",0,1700000000123,x\nd2,1,,y\n'
            + b"".join(b"d3,%d,%d,z\n" % (i, 1700000000000 + i) for i in range(50)))
    (tmp_path / "stored.csv").write_text("device,seq\nstale,9\n")     # an earlier run's file: replaced
    for step in (1, 7, len(data)):
        out = CsvParts(tmp_path / "stored.csv", flush_bytes=40)
        for i in range(0, len(data), step):
            out.write(data[i:i + step])
        assert out.commit() == 52
        rows = list(iter_dicts(tmp_path / "stored.csv"))
        assert rows[:2] == [{"device": "d,1", "seq": 0, "stored_ms": 1700000000123},
                            {"device": "d2", "seq": 1, "stored_ms": None}]
        assert rows[-1] == {"device": "d3", "seq": 49, "stored_ms": 1700000000049}
        assert (dataset_state(parts_dir(tmp_path / "stored.csv")).parts == 2) == (step == len(data))   # + part 0
        assert sorted(p.name for p in tmp_path.iterdir()) == ["stored.parquet"]
    empty = CsvParts(tmp_path / "stored.csv")       # the platform stored nothing: 0 rows, the columns still known
    empty.write(b"device,seq\n")
    assert empty.commit() == 0 and schema_columns(parts_dir(tmp_path / "stored.csv")) == ["device", "seq"]
    found, chunks = read_columns(tmp_path / "stored.csv", ["seq"])
    assert found == ["seq"] and list(chunks) == []
    bad = CsvParts(tmp_path / "stored.csv")
    try:
        bad.write(b"entity,seq\n")
        raise AssertionError("a stream without a device column was taken")
    except ValueError as e:
        assert "no device column" in str(e)
    bad.abort()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["stored.parquet"]


def test_released_bytes_leave_the_disk_and_the_rest_of_the_file_intact(tmp_path):
    """The native fleet's shards: bytes already turned into parts are punched out while the worker appends."""
    from monsoon.timeline.columnar import release
    p = tmp_path / "shard.csv"
    with open(p, "wb") as f:
        f.write(b"a" * (1 << 20) + b"tail\n")
    before = os.stat(p).st_blocks
    with open(p, "rb+") as f:
        if not release(f.fileno(), 1 << 20):
            import pytest
            pytest.skip("this file system cannot punch holes")
    st = os.stat(p)
    assert st.st_size == (1 << 20) + 5 and st.st_blocks < before / 4, (before, st.st_blocks)
    with open(p, "rb") as f:
        assert f.read(4) == b"\0\0\0\0" and (f.seek(1 << 20), f.read())[1] == b"tail\n"


def test_a_background_writer_spreads_the_conversion_over_the_seconds_and_keeps_parts_in_order(tmp_path, monkeypatch):
    """The fleets' writer: each second's rows become arrays at that second's maybe_flush, a part is written by a
    writer thread, parts keep their order, close() waits for them; a failed write is raised, not lost."""
    from monsoon.timeline import columnar
    from monsoon.timeline.columnar import PartWriter, iter_dicts
    now = [0.0]
    w = PartWriter(tmp_path / "acked.parquet", ("device", "seq", "intended_ms", "acked_ms"), flush_s=3,
                   clock=lambda: now[0], background=True)
    want = []
    for sec in range(10):
        for i in range(50):
            row = (f"d{i % 7}", sec * 50 + i, 1000 * sec + i, 1000 * sec + i + 5)
            w.append(*row)
            want.append(dict(zip(("device", "seq", "intended_ms", "acked_ms"), row)))
        now[0] = sec + 1.0
        w.maybe_flush()
        assert w._n == 0                  # this second's rows are arrays already: no list waits for the cut
    w.close()
    assert list(iter_dicts(tmp_path / "acked.csv")) == want
    st = dataset_state(tmp_path / "acked.parquet")
    assert st.closed and st.rows == 500 and st.parts == 1 + 4      # part 0, then one per 3 s (3, 6, 9, close)
    boom = PartWriter(tmp_path / "b.parquet", ("device", "seq"), flush_s=0, background=True)

    def full(*a, **k):
        raise OSError("No space left on device")
    monkeypatch.setattr(columnar.pq, "write_table", full)
    boom.append("d", 1)
    boom.maybe_flush()
    try:
        boom.close()
        raise AssertionError("a failed part write was lost")
    except OSError as e:
        assert "No space left" in str(e)
    assert not (tmp_path / "b.parquet" / "_closed.json").exists()


def test_a_cut_off_native_fleets_shards_become_one_more_part_from_where_the_last_part_left_off(tmp_path):
    """The native fleet's parent killed with -9: its workers' shards hold the acks since the last part (and, for a
    part that never became durable, bytes already punched to zeros).  salvage_shards takes each shard from the
    offset in the newest part's footer, leaves out lines a hole cut and a torn last line, and never twice."""
    from monsoon.timeline.columnar import (PartWriter, csv_block_table, iter_dicts, salvage_shards, shard_offsets,
                                           shard_path)
    cols = ("device", "seq", "intended_ms", "acked_ms")
    acked = tmp_path / ACKED_DATA
    header = b"device,seq,intended_ms,acked_ms\n"
    line = lambda d, s: f"{d},{s},{1000 + s},{1005 + s}\n".encode()
    a = header + b"".join(line("a", s) for s in range(300))
    b = header + b"".join(line("b", s) for s in range(200))
    off_a, off_b = len(header) + len(b"".join(line("a", s) for s in range(100))), len(header)
    w = PartWriter(parts_dir(acked), cols)
    w.write_table(csv_block_table(a[len(header):off_a], cols), shard_offsets={shard_path(acked, 0).name: off_a,
                                                                              shard_path(acked, 1).name: off_b})
    assert shard_offsets(parts_dir(acked)) == {".acked.csv.shard0": off_a, ".acked.csv.shard1": off_b}
    # shard 0: the part's bytes punched (zeros), then a line that a hole cut in two, then a torn last line
    hole = len(header) + len(b"".join(line("a", s) for s in range(150))) + 3
    shard_path(acked, 0).write_bytes(b"\0" * hole + a[hole:] + b"a,300,13")
    shard_path(acked, 1).write_bytes(b)
    assert salvage_shards(acked) == 149 + 200                   # a:151..299 (150 cut by the hole), b: all
    assert not list(tmp_path.glob(".acked.csv.shard*"))
    rows = list(iter_dicts(acked))
    seqs = {d: sorted(r["seq"] for r in rows if r["device"] == d) for d in "ab"}
    assert seqs["a"] == list(range(100)) + list(range(151, 300)) and seqs["b"] == list(range(200))
    state = dataset_state(parts_dir(acked))
    assert not state.closed and state.rows == 100 + 349 and state.parts == 3, state   # part 0, the run's, salvage
    # a second pass (or shards written again past the same offsets) takes nothing twice
    shard_path(acked, 1).write_bytes(b + line("b", 200))
    assert salvage_shards(acked) == 1
    assert salvage_shards(acked) == 0 and dataset_state(parts_dir(acked)).rows == 450


def test_salvage_leaves_shards_alone_while_a_worker_holds_them_and_when_the_run_closed_its_data(tmp_path):
    from monsoon.timeline.columnar import PartWriter, salvage_shards, shard_path
    acked = tmp_path / ACKED_DATA
    w = PartWriter(parts_dir(acked), ("device", "seq", "intended_ms", "acked_ms"))
    shard_path(acked, 0).write_bytes(b"device,seq,intended_ms,acked_ms\nx,1,2,3\n")
    holder = subprocess.Popen([sys.executable, "-c", "import sys,time; f=open(sys.argv[1],'ab'); print(1, flush=True); "
                               "time.sleep(60)", str(shard_path(acked, 0))], stdout=subprocess.PIPE)
    try:
        holder.stdout.readline()
        assert salvage_shards(acked) is None and shard_path(acked, 0).exists()
    finally:
        holder.kill()
        holder.wait()
    w.close()                                                   # a closed dataset is whole: shards are not data
    assert salvage_shards(acked) == 0 and shard_path(acked, 0).exists()


def test_a_shard_read_in_limited_slices_gives_whole_lines_and_the_same_bytes(tmp_path):
    """shard_block(limit=N): at most N bytes, cut after the last whole line, and the next call goes on from
    there; the slices together are the unlimited block, header left out once."""
    from monsoon.timeline.columnar import shard_block
    sh = tmp_path / ".acked.csv.shard0"
    lines = [f"dev-{i % 7},{i},{1_700_000_000_000 + i},{1_700_000_000_100 + i}\n".encode() for i in range(500)]
    sh.write_bytes(b"device,seq,intended_ms,acked_ms\n" + b"".join(lines) + b"dev-0,500,17")   # a line in flight
    whole, end = shard_block(sh, 0)
    got, off, calls = b"", 0, 0
    while True:
        block, nxt = shard_block(sh, off, limit=1000)
        if nxt == off:
            break
        assert len(block) <= 1000 and block.endswith(b"\n"), (off, block[-20:])
        got, off, calls = got + block, nxt, calls + 1
    assert got == whole == b"".join(lines) and off == end and calls > 10
