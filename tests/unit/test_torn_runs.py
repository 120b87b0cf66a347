"""Torn runs said out loud: a run directory whose files were cut off mid-line (a run killed mid-write) is read
without a crash, every torn file is named with its byte offset, the partial line is never taken for data,
the verdicts that rested on the missing part are ``unknown`` (never ``pass``), and an intact run reads and
judges exactly as before.  Offsets are drawn at random, seeded."""
from __future__ import annotations

import json
import random
import shutil
import tarfile
from pathlib import Path

import pytest

import monsoon.timeline.tail as tail_mod

from monsoon.checks.base import FAIL, INFO, PASS, UNKNOWN, RunData
from monsoon.checks.registry import CHECKS, evaluate
from monsoon.checks.torn import READS
from monsoon.analysis import analyze
from monsoon.rundir import ACKED_DATA, LATENCY_FILE, SENT_DATA, STORED_DATA, TIMELINE_FILE, legacy_csv, write_sent
from monsoon.timeline.hdrlog import IntervalLogWriter, new_histogram, phase_histograms
from monsoon.timeline.store import Events, read_events, read_timeline
from monsoon.timeline.tail import TAIL_CHUNK, secs, tail_end
from monsoon.timeline.torn import run_tears, torn_notes
from tests.unit.helpers import RunBuilder

REPO = Path(__file__).resolve().parents[2]
PRELAYOUT = REPO / "tests" / "data" / "prelayout-run" / "run.tar.xz"

DEVICES, SEQS = 5, 30          # every device acks seqs 0..29 and stores them, plus seq 30 stored unacked
CHECK_LIST = [
    ("no_acked_loss", {}), ("no_duplicates", {}), ("no_unexpected", {}), ("no_oom", {}),
    ("lag_recovers_within", {"seconds": 30}), ("lag_bounded", {"max": 5000}),
    ("no_memory_leak", {}), ("gc_time_fraction", {}), ("faults_landed", {}), ("throughput_drop", {}),
    ("latency_objective", {"max_ms": 100, "during": "all"}), ("error_budget", {"objective": 0.99, "latency_ms": 500}),
    ("load_valid", {}),
]
# the event each check reads the timeline up to (the spec of monsoon.checks.torn.READS, written out again)
READS_UNTIL = {"no_acked_loss": "stored", "no_duplicates": "stored", "no_unexpected": "stored", "no_oom": "stored",
               "lag_recovers_within": "drain", "lag_bounded": "drain", "no_memory_leak": "drain",
               "gc_time_fraction": "drain", "faults_landed": "fault-census", "throughput_drop": "load-end",
               "latency_objective": "load-end", "error_budget": "load-end", "load_valid": "load-end"}


def old_read_events(path: Path) -> list[dict]:
    """read_events as it was before torn files were said out loud: the reference for intact files."""
    out = []
    with open(path) as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


# the runs built here hold their datasets as CSV files (an older run's, line files that can be torn mid-line)
ACKED_CSV, STORED_CSV, SENT_CSV = (legacy_csv(n).name for n in (ACKED_DATA, STORED_DATA, SENT_DATA))

def build(dir: Path) -> Path:
    """A complete run as the runner writes it: load with a fault window in the burst, lag that recovers,
    samples, then ``load-end``, ``drain``, ``stored`` and the stack's stop; acked/stored/sent CSVs and a
    latency log.  Every check of CHECK_LIST passes on it."""
    b = RunBuilder(dir, base_rate=100)
    b.events[0]["checks"] = [{"name": n, "params": p} for n, p in CHECK_LIST]
    b.phases(10, 20, 10)                                        # warmup 0-10, burst 10-30, recovery 30-40
    b.service_start(0.0)
    b.ev("fault-plan", 0.5, run_id="r", horizon=40, faults=[])
    common = dict(name="slow-db", kind="network-latency", backend="toxiproxy", target="platform->db", window=0)
    b.ev("fault", 15.0, phase="inject", intended=14.5, effective=14.5, landed=True, evidence={"method": "probe"},
         **common)
    b.ev("fault", 20.0, phase="heal", intended=19.5, effective=19.5, landed=True, evidence={"method": "probe"},
         **common)
    for sec in range(40):
        b.load(sec, 100, 100)
    b.ev("fault-census", 40.2, run_id="r", swept={}, leftovers={})
    b.ev("op", 40.5, op="load-end", scheduled=4000, sent=4000, acked=4000, failed=0, late=0, dropped=0)
    lag = [(t, 0.0) for t in range(0, 10)] + [(t, (t - 9) * 100.0) for t in range(10, 31)] + \
          [(t, max(0.0, 2100 - (t - 30) * 400.0)) for t in range(31, 45)]
    b.lag([(t + 0.3, v) for t, v in lag])
    for t in range(45):
        b.process(t + 0.4, 200.0 + (t * 7 % 5) * 0.1)          # flat RSS: no leak
        b.metrics(t + 0.6, gc_seconds=0.01 * t)                 # 1 % of the time in GC
    b.ev("drain", 45.0, drained=True, waited_s=4.5, backlog=0)
    b.ev("stored", 46.0, path=STORED_DATA, rows=DEVICES * (SEQS + 1))
    b.ev("service", 47.0, service="platform", event="stop")
    devs = [f"dev{i}" for i in range(DEVICES)]
    b.acked([(d, s) for s in range(SEQS) for d in devs])
    b.stored([(d, s) for s in range(SEQS + 1) for d in devs])  # seq 30: sent, stored, never acked (recovered)
    write_sent(dir / SENT_CSV, {d: SEQS for d in devs})
    w = IntervalLogWriter(dir / LATENCY_FILE, 1e9)
    for sec in range(40):
        h = new_histogram()
        for v in range(5):
            h.record_value(150 + 10 * v, 20)                    # 100 acks, 0.15-0.19 ms (cheap to iterate)
        w.write(sec, h)
    w.close()
    return b.write()


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> tuple[Path, dict[str, tuple]]:
    d = build(tmp_path_factory.mktemp("clean") / "s--e")
    verdicts = {v.name: (v.verdict, v.figures, v.message) for v in evaluate(d, CHECK_LIST)}
    return d, verdicts


def torn_copy(clean_dir: Path, where: Path, file: str, k: int) -> Path:
    d = where / f"{file}-{k}"
    shutil.copytree(clean_dir, d)
    p = d / file
    p.write_bytes(p.read_bytes()[:k])
    return d


def offsets(data: bytes, n: int, seed: int) -> list[int]:
    """``n`` seeded offsets that cut a line (not just after a newline), always including the two ends."""
    cuts = [k for k in range(1, len(data)) if data[k - 1] != 10]
    rng = random.Random(seed)
    return sorted({cuts[0], cuts[-1], *rng.sample(cuts, n)})


def no_crash(verdicts) -> None:
    crashed = [f"{v.name}: {v.message}" for v in verdicts if "crashed" in v.message]
    assert not crashed, crashed


# ------------------------------------------------------------------ an intact run is unchanged

def test_an_intact_run_reads_and_judges_as_before(clean):
    d, verdicts = clean
    assert {n: v[0] for n, v in verdicts.items()} == {   # throughput_drop without a limit reports: info
        "latency_objective[all]" if n == "latency_objective" else n: INFO if n == "throughput_drop" else PASS
        for n, _ in CHECK_LIST}
    direct = RunData(d)      # the checks called directly, without the torn-file rule
    for name, params in CHECK_LIST:
        v = CHECKS[name](direct, **params)
        assert verdicts[v.name] == (v.verdict, v.figures, v.message)
    assert run_tears(d) == [] and torn_notes(d) == [] and RunData(d).torn == []
    ev = Events.load(d / TIMELINE_FILE)
    assert ev.events == old_read_events(d / TIMELINE_FILE) and ev.tears == [] and ev.damage_at is None


def test_the_saved_real_run_reads_the_same_events_as_before(tmp_path):
    with tarfile.open(PRELAYOUT) as t:
        members = [m for m in t.getmembers() if m.name.endswith(("/" + TIMELINE_FILE, ".csv", ".hlog"))]
        t.extractall(tmp_path, members=members, filter="data")
    timelines = sorted(tmp_path.rglob(TIMELINE_FILE))
    assert len(timelines) == 2
    for p in timelines:
        events, tears, damage_at = read_timeline(p)
        assert events == old_read_events(p) and tears == [] and damage_at is None
        assert run_tears(p.parent, Events(events)) == []


def test_every_built_in_check_says_what_it_reads():
    built_in = {"lag_recovers_within", "no_acked_loss", "no_duplicates", "no_unexpected", "no_oom",
                "no_unexpected_exit", "lag_bounded",
                "consumer_not_stalled", "error_budget", "no_memory_leak", "gc_time_fraction", "no_thread_leak",
                "faults_landed", "throughput_drop", "latency_objective", "load_valid"}
    assert built_in <= set(CHECKS) and set(READS) == built_in
    for name, until in READS_UNTIL.items():
        assert READS[name].until == until, name


# ------------------------------------------------------------------ the timeline

def test_a_timeline_torn_anywhere_keeps_the_events_before_and_withholds_what_the_cut_hides(clean, tmp_path):
    d, verdicts = clean
    data = (d / TIMELINE_FILE).read_bytes()
    for k in offsets(data, 24, seed=11):
        t = torn_copy(d, tmp_path, TIMELINE_FILE, k)
        whole = [json.loads(ln) for ln in data[:k].split(b"\n") if ln.strip() and _is_json(ln)]
        assert read_events(t / TIMELINE_FILE) == whole, k
        notes = torn_notes(t)
        when = f"at t={secs(whole[-1]['t'])}s" if whole else "before its first event"
        assert notes == [f"timeline.jsonl ends mid-line at byte {k}: the run was cut off {when}"], k
        got = evaluate(t, CHECK_LIST)
        no_crash(got)
        present = {_marker(e) for e in whole}
        for v in got:
            base = v.name.split("[")[0]
            if READS_UNTIL[base] in present:        # everything it reads came before the cut: as if intact
                assert (v.verdict, v.figures, v.message) == verdicts[v.name], (k, v)
            else:
                assert v.verdict == UNKNOWN, (k, v)
                assert f"timeline.jsonl ends mid-line at byte {k}" in v.message, (k, v)


def test_a_timeline_cut_before_the_export_cannot_pass_no_acked_loss(clean, tmp_path):
    d, _ = clean
    data = (d / TIMELINE_FILE).read_bytes()
    k = data.index(b'"type": "stored"') + 3         # inside the stored event's line
    t = torn_copy(d, tmp_path, TIMELINE_FILE, k)
    v = {v.name: v for v in evaluate(t, CHECK_LIST)}
    assert v["no_acked_loss"].verdict == UNKNOWN
    assert v["no_acked_loss"].message.startswith(
        f"timeline.jsonl ends mid-line at byte {k}: the run was cut off at t=45s, before its stored-messages "
        f"export: a pass cannot stand on the part that was read (all 150 acked messages stored")
    assert v["lag_bounded"].verdict == PASS and v["load_valid"].verdict == PASS    # they read up to the drain


def test_a_timeline_line_in_the_middle_that_is_not_json_is_named(clean, tmp_path):
    d, verdicts = clean
    lines = (d / TIMELINE_FILE).read_bytes().splitlines(keepends=True)
    rng = random.Random(5)
    for i in sorted(rng.sample(range(1, len(lines) - 1), 12)):
        t = tmp_path / f"line{i}"
        shutil.copytree(d, t)
        bad = lines[i][:len(lines[i]) // 2] + b"\n"               # a torn line, then the writing went on
        start = sum(len(x) for x in lines[:i])
        (t / TIMELINE_FILE).write_bytes(b"".join(lines[:i]) + bad + b"".join(lines[i + 1:]))
        notes = torn_notes(t)
        assert len(notes) == 1 and notes[0].startswith(
            f"timeline.jsonl line {i + 1} is not JSON (bytes {start}-{start + len(bad)}): an event between t="), i
        before = {_marker(json.loads(x)) for x in lines[:i]}
        for v in evaluate(t, CHECK_LIST):
            if READS_UNTIL[v.name.split("[")[0]] in before:
                assert (v.verdict, v.figures, v.message) == verdicts[v.name], (i, v)
            else:
                assert v.verdict != PASS and f"timeline.jsonl line {i + 1} is not JSON" in v.message, (i, v)


def test_a_timeline_cut_in_its_first_line_or_unterminated_or_not_json_at_the_end(tmp_path):
    p = tmp_path / TIMELINE_FILE
    a, b = json.dumps({"type": "meta", "t": 0.0}), json.dumps({"type": "load", "t": 1.25})
    p.write_text(a[:7])
    assert read_timeline(p)[0] == [] and \
        [x.note for x in read_timeline(p)[1]] == ["timeline.jsonl ends mid-line at byte 7: the run was cut off "
                                                  "before its first event"]
    p.write_text(f"{a}\n{b}")               # complete JSON, cut before its newline: kept, still said
    events, tears, damage_at = read_timeline(p)
    assert len(events) == 2 and damage_at == 2
    assert [x.note for x in tears] == [f"timeline.jsonl ends mid-line at byte {len(a) + 1 + len(b)}: the run was "
                                       f"cut off at t=1.25s"]
    p.write_text(f"{a}\n{b}\n{{\"type\": \"lo\n")
    assert [x.note for x in read_timeline(p)[1]] == [
        f"timeline.jsonl ends with a line that is not JSON (line 3, bytes {len(a) + len(b) + 2}-"
        f"{len(a) + len(b) + 15}): the run was cut off at t=1.25s"]
    p.write_text(f"{a}\n{b}\n\n  \n")        # blank lines at the end are not a tear
    assert read_timeline(p)[1] == []
    p.write_text(f"{a}\n")                  # a cut just after a newline leaves no trace to find: not said
    assert read_timeline(p)[1] == []
    p.write_bytes(f"{a}\n".encode() + b"\xff\xfe{\n" * 9 + f"{b}\n".encode())     # not even UTF-8
    events, tears, _ = read_timeline(p)
    assert len(events) == 2 and len(tears) == 6
    assert tears[0].note.startswith("timeline.jsonl line 2 is not JSON (bytes ")
    assert tears[-1].note == "timeline.jsonl: 4 more line(s), from line 7 to line 10, are not JSON events either"


# ------------------------------------------------------------------ the CSVs and the latency log

# per torn CSV: what each check it touches must say (UNKNOWN: withheld; "not fail": a pass may stand on it)
TOUCHED = {ACKED_CSV: {"no_acked_loss": UNKNOWN, "latency_objective[all]": UNKNOWN},
           STORED_CSV: {"no_acked_loss": "not fail", "no_duplicates": UNKNOWN, "no_unexpected": UNKNOWN},
           SENT_CSV: {"no_unexpected": UNKNOWN, "no_acked_loss": "stands"}}     # (its recovered figure)


# error_budget reads no CSV, and is the slow one (HdrHistogram iteration, ~6 ms per second of load)
CSV_CHECKS = [c for c in CHECK_LIST if c[0] != "error_budget"]


@pytest.mark.parametrize("file, seed", [(ACKED_CSV, 1), (STORED_CSV, 2), (SENT_CSV, 3)])
def test_a_csv_torn_anywhere_is_named_and_its_partial_row_never_counted(clean, tmp_path, file, seed):
    d, verdicts = clean
    data = (d / file).read_bytes()
    for k in offsets(data, 20, seed):
        t = torn_copy(d, tmp_path, file, k)
        end = data.rfind(b"\n", 0, k) + 1
        notes = torn_notes(t)
        assert len(notes) == 1 and notes[0].startswith(f"{file} ends mid-line at byte {k}"), (k, notes)
        assert ("inside its first line" if end == 0 else f"the partial row from byte {end} ") in notes[0], notes
        rows = [r.split(b",") for r in data[:end].split(b"\n")[1:] if r]       # the complete rows, header off
        acc = RunData(t).accounting
        if file == ACKED_CSV:
            assert acc.acked == len(rows), k
        elif file == STORED_CSV:
            assert acc.stored == len(rows), k
        else:
            assert acc.sent == sum(int(r[1]) + 1 for r in rows), k
        got = evaluate(t, CSV_CHECKS)
        no_crash(got)
        for v in got:
            want = TOUCHED[file].get(v.name)
            if want is None:
                assert (v.verdict, v.figures, v.message) == verdicts[v.name], (k, v)
                continue
            assert f"{file} ends mid-line at byte {k}" in v.message, (k, v)
            if want == "stands":
                assert v.verdict == verdicts[v.name][0] and v.message.endswith("stands on what was read)"), (k, v)
            else:
                assert v.verdict != FAIL if want == "not fail" else v.verdict == UNKNOWN, (k, v)


def test_a_stored_csv_cut_short_turns_a_loss_into_unknown_not_fail(clean, tmp_path):
    d, _ = clean
    data = (d / STORED_CSV).read_bytes()
    t = torn_copy(d, tmp_path, STORED_CSV, len(data) // 2 + 1)
    direct = CHECKS["no_acked_loss"](RunData(t))
    assert direct.verdict == FAIL                               # the rows after the cut look lost...
    v = evaluate(t, [("no_acked_loss", {})])[0]
    assert v.verdict == UNKNOWN and "a fail cannot stand on the part that was read" in v.message    # ...they are not


def test_a_sent_csv_cut_short_does_not_make_the_devices_after_it_unexpected(clean, tmp_path):
    d, _ = clean
    data = (d / SENT_CSV).read_bytes()
    t = torn_copy(d, tmp_path, SENT_CSV, len(data) - 3)        # dev4's row cut: "dev4,3" of "dev4,30"
    assert CHECKS["no_unexpected"](RunData(t)).verdict == FAIL  # its stored-unacked seq 30 looks never sent
    v = evaluate(t, [("no_unexpected", {})])[0]
    assert v.verdict == UNKNOWN and f"sent.csv ends mid-line at byte {len(data) - 3}" in v.message
    assert RunData(t).accounting.sent == (DEVICES - 1) * (SEQS + 1)      # "dev4,3" did not bound dev4 at 3


def test_a_torn_latency_log_withholds_the_latency_verdicts(clean, tmp_path):
    d, verdicts = clean
    data = (d / LATENCY_FILE).read_bytes()
    for k in offsets(data, 8, seed=4):
        t = torn_copy(d, tmp_path, LATENCY_FILE, k)
        complete = sum(1 for ln in data[:data.rfind(b"\n", 0, k) + 1].split(b"\n") if b",HIST" in ln)
        hs = phase_histograms(t / LATENCY_FILE, RunData(t).events.phases())
        assert hs["all"].get_total_count() == 100 * complete, k
        notes = torn_notes(t)
        assert len(notes) == 1 and notes[0].startswith(f"latency.hlog ends mid-line at byte {k}"), notes
        for v in evaluate(t, CHECK_LIST):
            if v.name in ("latency_objective[all]", "error_budget"):
                assert v.verdict == UNKNOWN and f"latency.hlog ends mid-line at byte {k}" in v.message, (k, v)
            else:
                assert (v.verdict, v.figures, v.message) == verdicts[v.name], (k, v)


def test_several_torn_files_are_each_named_in_file_order(clean, tmp_path):
    d, _ = clean
    t = tmp_path / "all"
    shutil.copytree(d, t)
    sizes = {}
    for f in (LATENCY_FILE, SENT_CSV, ACKED_CSV, STORED_CSV, TIMELINE_FILE):
        b = (t / f).read_bytes()
        sizes[f] = len(b) - 2
        (t / f).write_bytes(b[:-2])
    notes = RunData(t).torn
    assert [n.split(" ends mid-line at byte ")[0] for n in notes] == \
        [TIMELINE_FILE, ACKED_CSV, STORED_CSV, SENT_CSV, LATENCY_FILE]
    for n, f in zip(notes, [TIMELINE_FILE, ACKED_CSV, STORED_CSV, SENT_CSV, LATENCY_FILE]):
        assert n.startswith(f"{f} ends mid-line at byte {sizes[f]}")
    no_crash(evaluate(t, CHECK_LIST))


# ------------------------------------------------------------------ monsoon analyze, and the cost

def test_analyze_on_a_torn_run_does_not_crash(clean, tmp_path):
    d, _ = clean
    data = (d / TIMELINE_FILE).read_bytes()
    stop = data.rindex(b'"type": "service"')           # the stack's stop: after everything a check reads
    for k, verdict in ((5, UNKNOWN), (len(data) // 3, UNKNOWN), (stop, PASS)):
        run = tmp_path / f"run{k}"
        torn_copy(d, run, TIMELINE_FILE, k)
        s = analyze(run)
        assert [r["verdict"] for r in s["results"]] == [verdict], k


def test_the_tail_is_found_from_the_end_without_reading_the_file(tmp_path, monkeypatch):
    p = tmp_path / "big.csv"
    rows = b"".join(b"dev%d,%d,1700000000000,1700000000020\n" % (i % 50, i) for i in range(200_000))
    p.write_bytes(b"device,seq,intended_ms,acked_ms\n" + rows + b"dev1,2" + b"9" * (3 * TAIL_CHUNK))
    size = p.stat().st_size
    read = []

    class Spy:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *a):
            self.fh.close()

        def seek(self, *a):
            return self.fh.seek(*a)

        def read(self, n=-1):
            b = self.fh.read(n)
            read.append(len(b))
            return b

    monkeypatch.setattr(tail_mod, "open", lambda path, mode: Spy(open(path, mode)), raising=False)
    assert tail_end(p) == (size, size - 3 * TAIL_CHUNK - 6)     # a partial row longer than one chunk
    assert sum(read) <= 4 * TAIL_CHUNK + 1 < size // 20
    with open(p, "ab") as fh:
        fh.write(b"\n")
    read.clear()
    assert tail_end(p) == (size + 1, size + 1) and sum(read) == 1


# ------------------------------------------------------------------ helpers

def _is_json(line: bytes) -> bool:
    try:
        json.loads(line)
        return True
    except ValueError:
        return False


def _marker(e: dict) -> str | None:
    """The READS_UNTIL name of an event, if it is one."""
    if e.get("type") == "op" and e.get("op") == "load-end":
        return "load-end"
    return e.get("type") if e.get("type") in ("drain", "stored", "fault-census") else None
