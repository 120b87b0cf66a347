"""The loss accounting's parts, each on its own (``monsoon.checks.accounting``): :func:`read` (the datasets
into one key space), :func:`join` (each key's outcome), :func:`tally` and :func:`tally_times` (the counts),
:func:`explain` (the keys a verdict names).  ``account`` is their composition (tests/unit/test_accounting.py
tests it whole; tests/unit/test_accounting_fixtures.py holds it to the figures of every kept run)."""
import csv
from pathlib import Path

import numpy as np

from monsoon.checks.accounting import Accounting, account, explain, join, read, tally, tally_times
from monsoon.checks.base import FAIL, RunData
from monsoon.checks.loss import no_acked_loss, no_duplicates, no_unexpected
from monsoon.rundir import write_sent
from tests.unit.helpers import RunBuilder

T0 = 1_700_000_000_000


def write(dir: Path, name: str, header, rows) -> None:
    with open(dir / name, "w", newline="") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(header)
        w.writerows(rows)


def run(dir: Path, acked, stored, sent=None, at_drain=None, stored_ms=False, drained=True) -> Path:
    """acked: (device, seq[, intended_ms]); stored: (device, seq[, stored_ms])."""
    b = RunBuilder(dir)
    b.ev("drain", 100, drained=drained, waited_s=3, backlog=0)
    b.write()
    write(dir, "acked.csv", ("device", "seq", "intended_ms", "acked_ms"),
          [(r[0], r[1], r[2] if len(r) > 2 else T0 + 10 * r[1], (r[2] if len(r) > 2 else T0) + 5) for r in acked])
    write(dir, "stored.csv", ("device", "seq", "stored_ms") if stored_ms else ("device", "seq"), stored)
    if at_drain is not None:
        write(dir, "stored-at-drain.csv", ("device", "seq"), at_drain)
    if sent is not None:
        write_sent(dir / "sent.csv", sent)
    return dir


def dense(keys, device: str) -> range:
    """The keys of ``device``'s dense range."""
    c = keys.names.code[device]
    return range(int(keys.offset[c]), int(keys.offset[c + 1]))


# ------------------------------------------------------------------ read

def test_read_lays_each_device_end_to_end_and_marks_the_acked_keys(tmp_path):
    d = run(tmp_path, acked=[("a", 0), ("a", 2), ("b", 1)], stored=[("a", 0), ("a", 0), ("b", 1), ("b", 7)],
            sent={"a": 3, "b": 1, "idle": -1})
    r = read(d)
    k = r.keys
    assert k.sent == {"a": 3, "b": 1, "idle": -1} and not k.timed and k.intended_of is None
    assert k.names.names[:3] == ["a", "b", "idle"]          # sent names the devices first
    assert k.ndev == 3 and k.bound.tolist() == [3, 1, -1]
    assert k.dense.tolist() == [4, 2, 0]                    # max(last sent, last acked) + 1
    assert k.offset.tolist() == [0, 4, 6, 6] and k.nkeys == 6
    assert k.acked.tolist() == [True, False, True, False, False, True]
    assert k.dev_of(np.arange(6)).tolist() == [0, 0, 0, 0, 1, 1]    # idle's empty range holds no key
    c = r.copies
    assert c.rows == 4 and c.timed_rows == 0 and c.first_ms is None
    assert c.count.tolist() == [2, 0, 0, 0, 0, 1]
    assert [s.tolist() for s in c.sparse] == [[1 << 40 | 7]] and c.sparse_bad == 0      # b#7: past b's range
    assert r.early is None                                  # storage was read once


def test_read_takes_a_device_only_stored_knows_as_sparse_and_reads_the_drains_read_back(tmp_path):
    d = run(tmp_path, acked=[("a", 0), ("a", 1)], stored=[("a", 1), ("ghost", 3)],
            at_drain=[("a", 0), ("ghost", 3), ("a", 99)])
    r = read(d)
    assert r.keys.sent is None and r.keys.ndev == 1 and r.keys.nkeys == 2
    assert r.keys.names.code["ghost"] == 1                 # named when stored was read: no dense range
    assert [s.tolist() for s in r.copies.sparse] == [[1 << 40 | 3]]
    assert r.early.tolist() == [True, False]                # a#0 read at the drain's end; off-range rows skipped


def test_read_keeps_intended_and_first_stored_times_when_stored_has_them(tmp_path):
    d = run(tmp_path, acked=[("a", 0, T0), ("a", 1, T0 + 10)],
            stored=[("a", 1, T0 + 50), ("a", 1, T0 + 40), ("a", 0, "")], stored_ms=True)
    r = read(d)
    assert r.keys.timed and r.keys.base == T0 and r.keys.intended_of.tolist() == [0, 10]
    c = r.copies
    assert c.rows == 3 and c.timed_rows == 2 and c.count.tolist() == [1, 2]
    assert c.s_base == T0 + 50 and c.first_ms.tolist() == [np.iinfo(np.int32).max, -10]   # a#0: no time


# ------------------------------------------------------------------ join

def joined_of(tmp_path, **kw):
    r = read(run(tmp_path, **kw))
    return r, join(r)


def test_join_finds_the_missing_the_duplicated_and_the_never_acked(tmp_path):
    r, j = joined_of(tmp_path, acked=[("a", s) for s in range(5)],
                     stored=[("a", 0), ("a", 1), ("a", 1), ("a", 1), ("a", 3), ("a", 5), ("a", 9)], sent={"a": 6})
    assert j.lost.tolist() == [2, 4]                        # a#2, a#4 acked, never stored
    assert j.dup.tolist() == [1] and j.dup_copies.tolist() == [3]
    assert j.unacked.tolist() == [5] and j.beyond.tolist() == [False]   # a#5: sent, not acked (recovered)
    assert j.sparse_keys.tolist() == [9] and j.sparse_copies.tolist() == [1]   # a#9: past a's range (code 0)
    assert j.stored_late is None and j.stored_vanished is None


def test_join_counts_late_and_vanished_and_a_key_read_once_stays_stored(tmp_path):
    r, j = joined_of(tmp_path, acked=[("a", s) for s in range(6)],
                     at_drain=[("a", 0), ("a", 1), ("a", 4)],
                     stored=[("a", 0), ("a", 1), ("a", 2), ("a", 3)])
    assert j.stored_late == 2                              # a#2, a#3: only in the last read-back
    assert j.stored_vanished == 1                          # a#4: read at the drain's end, gone after
    assert j.lost.tolist() == [5]                          # a#4 is not lost
    assert r.early is None and r.copies.count is None and r.copies.sparse == []   # folded in, then released


def test_join_tells_unexpected_from_recovered_by_the_last_sent_seq(tmp_path):
    r, j = joined_of(tmp_path, acked=[("a", 0), ("b", 0), ("b", 2)],     # b#2 acked past b's last sent seq
                     stored=[("a", 0), ("a", 1), ("b", 0), ("b", 1), ("b", 2)], sent={"a": 1, "b": 0})
    assert j.unacked.tolist() == [1, 3] and j.beyond.tolist() == [False, True]   # a#1 recovered, b#1 never sent
    _, j = joined_of(tmp_path / "nosent", acked=[("a", 0)], stored=[("a", 0), ("a", 1)])
    assert j.beyond is None                                # without sent, no telling


# ------------------------------------------------------------------ tally

def test_tally_counts_every_outcome(tmp_path):
    r, j = joined_of(tmp_path, acked=[("a", s) for s in range(5)] + [("b", 0)],
                     stored=[("a", 0), ("a", 1), ("a", 1), ("a", 3), ("a", 5), ("a", 9), ("a", 9), ("g", 0),
                             ("b", 0), ("a", -1)],
                     sent={"a": 6, "b": 0})
    acc = tally(r, j)
    assert isinstance(acc, Accounting)
    assert (acc.devices, acc.acked, acc.stored, acc.acked_lost) == (3, 6, 10, 2)
    assert (acc.duplicates, acc.duplicate_keys) == (2, 2)            # a#1 and a#9 (off the key space) twice
    assert acc.stored_unacked == 1 + 2 + 1                          # a#5; a#9, g#0; a#-1 (cannot be keyed)
    assert (acc.sent, acc.recovered, acc.unexpected, acc.unexpected_devices) == (8, 1, 3, 2)
    assert acc.lost_sample == [] and acc.reordered is None and acc.e2e_ms is None   # left to the other parts


def test_tally_without_sent_leaves_sent_recovered_and_unexpected_unknown(tmp_path):
    r, j = joined_of(tmp_path, acked=[("a", 0)], stored=[("a", 0), ("a", 4)])
    acc = tally(r, j)
    assert acc.stored_unacked == 1 and (acc.sent, acc.recovered, acc.unexpected, acc.unexpected_devices) == \
        (None, None, None, None)


def test_tally_times_takes_reordering_and_latency_from_the_first_copies(tmp_path):
    r = read(run(tmp_path, acked=[("a", s, T0 + 100 * s) for s in range(4)],
                 stored=[("a", 0, T0 + 7), ("a", 2, T0 + 209), ("a", 1, T0 + 300), ("a", 3, T0 + 311),
                         ("a", 3, T0 + 999)], stored_ms=True))
    reordered, samples, e2e = tally_times(r)
    assert reordered == 1                                  # a#2 stored before a#1
    assert samples == 4 and e2e == {"p50": 9.0, "p99": 200.0, "p999": 200.0, "max": 200.0, "min": 7.0}
    r = read(run(tmp_path / "untimed", acked=[("a", 0)], stored=[("a", 0)]))
    assert tally_times(r) == (None, 0, None)


# ------------------------------------------------------------------ explain

def test_explain_names_the_first_keys_by_device_name_then_seq(tmp_path):
    acked = [(d, s) for d in ("zz", "b", "a") for s in range(4)]
    stored = [("zz", 0), ("zz", 0), ("b", 3), ("b", 3), ("b", 3), ("a", 1), ("a", 9), ("new", 2), ("zz", 5)]
    r, j = joined_of(tmp_path, acked=acked, stored=stored, sent={"zz": 3, "b": 3, "a": 3})
    e = explain(r, j, limit=3)
    assert e.lost_sample == [("a", 0), ("a", 2), ("a", 3)] and e.lost_keys is None
    assert e.dup_sample == [("b", 3, 3), ("zz", 0, 2)]
    assert e.unexpected_sample == [("a", 9), ("new", 2), ("zz", 5)]
    e = explain(r, j, keep_lost=True)
    assert len(e.lost_keys) == 12 - 3 and e.lost_keys[:2] == [("a", 0), ("a", 2)] and e.lost_keys[-1] == ("zz", 3)


def test_the_verdicts_quote_what_explain_names(tmp_path):
    d = run(tmp_path, acked=[("d1", s) for s in range(8)], stored=[("d1", s) for s in range(6)] + [("d1", 3),
            ("d1", 12)], sent={"d1": 9})
    r = read(d)
    j = join(r)
    e = explain(r, j)
    assert e.lost_sample == [("d1", 6), ("d1", 7)] and e.dup_sample == [("d1", 3, 2)]
    assert e.unexpected_sample == [("d1", 12)]
    run_ = RunData(d)
    v = no_acked_loss(run_)
    assert v.verdict == FAIL and v.message == "2 of 8 acked messages lost (25.00%), e.g. d1#6, d1#7"
    assert no_duplicates(run_).message.endswith("e.g. d1#3 x2")
    assert no_unexpected(run_).message.endswith("e.g. d1#12")


def test_account_is_the_composition_of_the_parts(tmp_path):
    d = run(tmp_path, acked=[("a", s, T0 + 10 * s) for s in range(6)],
            stored=[("a", 0, T0 + 20), ("a", 2, T0 + 30), ("a", 1, T0 + 40), ("a", 1, T0 + 41), ("a", 7, T0 + 50)],
            at_drain=[("a", 0)], sent={"a": 6}, stored_ms=True)
    r = read(d)
    j = join(r)
    acc = tally(r, j)
    e = explain(r, j, keep_lost=True)
    acc.lost_sample, acc.lost_keys, acc.dup_sample, acc.unexpected_sample = \
        e.lost_sample, e.lost_keys, e.dup_sample, e.unexpected_sample
    acc.reordered, acc.e2e_samples, acc.e2e_ms = tally_times(r)
    assert account(d, keep_lost=True) == acc
    assert (acc.acked_lost, acc.stored_late, acc.duplicates, acc.unexpected, acc.reordered) == (3, 2, 1, 1, 1)
