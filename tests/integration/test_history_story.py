"""The run history's story on real stores: three sessions' runs (the saved kafka-registry mongo-slowdown run of
tests/data/prelayout-run, three times, the third with a seeded slower drain and lost messages) analysed into
SQLite and recorded into a real Postgres; ``monsoon history`` shows the strip and the trend; the regression fails
the comparison naming the figure; ``monsoon signoff`` says GO, EXPIRED once the clock passes the max age, then
NO-GO. Then two scheduled runs fired at once: one runs, the other is recorded as skipped.

Feeding saved runs through ``monsoon analyze`` is the cheap real path: the checks, the report and the history
see exactly what a session writes (a fresh session costs minutes of stack and load per run)."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import textwrap
import time
from pathlib import Path

import psycopg
import pytest

from monsoon.history.compare import parse_rules
from monsoon.history.hooks import record, regressions
from monsoon.history.store import ENV_URL, EXPERIMENT, HistoryStore
from monsoon.paths import REPO
from monsoon.timeline.columnar import iter_dicts, write_rows
from tests.integration.helpers import wait_for
from tests.integration.test_run_postgres import free_port

pytestmark = pytest.mark.integration
EXP = "kafka-registry--mongo-slowdown-allchecks"
HOUR = 3600.0


def monsoon(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "monsoon.cli", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})}, cwd=REPO)


def make_run(src: Path, runs: Path, run_id: str, shift: float) -> Path:
    """A copy of the saved run as ``runs/<run_id>``: its own run id, started ``shift`` seconds later."""
    d = runs / run_id / EXP
    shutil.copytree(src / EXP, d)
    tl = d / "timeline.jsonl"
    lines = tl.read_text().splitlines()
    meta = json.loads(lines[0])
    meta.update(run_id=run_id, wall=meta["wall"] + shift)
    tl.write_text("\n".join([json.dumps(meta)] + lines[1:]) + "\n")
    return runs / run_id


def seed_slow_drain_and_loss(run: Path, slow_s: float = 20.0, lose: int = 10) -> None:
    """The third run regressed: Kafka lag stays at 3,000 for ``slow_s`` after the fault heals, and ``lose`` acked
    messages never reached storage."""
    tl = run / EXP / "timeline.jsonl"
    events = [json.loads(x) for x in tl.read_text().splitlines()]
    heal = next(e["t"] for e in events if e.get("type") == "fault" and e.get("phase") == "heal")
    for e in events:
        if e.get("type") == "sample" and e.get("collector") == "kafka" and heal <= e["t"] <= heal + slow_s:
            e["lag"] = 3000
    tl.write_text("".join(json.dumps(e) + "\n" for e in events))
    stored = run / EXP / "stored.csv"
    rows = list(iter_dicts(stored))
    write_rows(stored, tuple(rows[0]), [tuple(r.values()) for r in rows[lose:]])


def analyze(run: Path) -> dict:
    r = monsoon("analyze", str(run), env={ENV_URL: ""})
    assert r.returncode in (0, 1), r.stderr
    assert "history not written" not in r.stderr, r.stderr
    return json.loads((run / "summary.json").read_text())


def signoff(runs: Path, policy: Path, now: float) -> tuple[int, str]:
    r = monsoon("signoff", "--runs-dir", str(runs), "--policy", str(policy), "--now", str(now), env={ENV_URL: ""})
    assert r.returncode in (0, 1, 3), r.stderr
    return r.returncode, r.stdout


@pytest.fixture
def postgres(tmp_path):
    port = free_port()
    proc = subprocess.Popen([str(REPO / "stacks/bin/run-postgres"), str(tmp_path / "pg"), str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def up():
        if proc.poll() is not None:
            pytest.fail(f"run-postgres exited {proc.returncode}:\n{proc.stdout.read()}")
        try:
            with psycopg.connect(url, connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False
    try:
        assert wait_for(up, 60, "postgres to accept connections")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(30)


def test_three_runs_history_compare_and_signoff_on_sqlite_and_postgres(tmp_path, postgres):
    with tarfile.open(REPO / "tests/data/prelayout-run/run.tar.xz") as tar:
        tar.extractall(tmp_path / "saved", filter="data")
    src, runs = tmp_path / "saved" / "run", tmp_path / "runs"
    r1, r2, r3 = (make_run(src, runs, f"story-{i}", i * HOUR) for i in (1, 2, 3))
    policy = tmp_path / "signoff.yaml"
    policy.write_text(textwrap.dedent(f"""\
        name: story sign-off
        max_age: 1d
        items:
          - experiment: mongo-slowdown-allchecks
            stacks: [kafka-registry]
            checks: [no_acked_loss, lag_recovers_within, faults_landed]
    """))

    s1, s2 = analyze(r1), analyze(r2)
    with HistoryStore(runs / "history.sqlite") as st:
        end2 = next(r.ended_at for r in st.rows(run_id="story-2", check=EXPERIMENT))
    rc, out = signoff(runs, policy, end2 + HOUR)
    assert rc == 0 and "**Decision: GO**" in out and "resilience score 100/100" in out and "run story-2" in out, out
    rc, out = signoff(runs, policy, end2 + 2 * 86400)
    assert rc == 3 and "**Decision: EXPIRED**" in out and "score 75/100" in out, out

    analyze(r3)                                   # the third run as it was, then seeded and analysed again
    with HistoryStore(runs / "history.sqlite") as st:
        before = len(st.rows())
    seed_slow_drain_and_loss(r3)
    s3 = analyze(r3)
    with HistoryStore(runs / "history.sqlite") as st:
        rows = st.rows()
    assert len(rows) == before, "re-analysis duplicated rows"
    assert {r.run_id for r in rows} == {"story-1", "story-2", "story-3"}
    assert len(rows) == 3 * (1 + len(s1["results"][0]["checks"]))
    loss3 = next(r for r in rows if r.run_id == "story-3" and r.check_name == "no_acked_loss")
    assert loss3.verdict == "fail" and loss3.figures["acked_lost"] == 10
    mine = next(r for r in rows if r.run_id == "story-3" and r.check_name == EXPERIMENT)
    assert mine.git_commit and mine.host and mine.cpu_count and mine.duration_s > 100 and mine.run_dir == str(r3)

    rc, out = signoff(runs, policy, mine.ended_at + HOUR)
    assert rc == 1 and "**Decision: NO-GO**" in out and "failed" in out and "score 50/100" in out, out

    r = monsoon("history", "--runs-dir", str(runs), env={ENV_URL: ""})
    assert r.returncode == 0, r.stderr
    assert "kafka-registry / mongo-slowdown-allchecks: ??F" in r.stdout, r.stdout
    rec = s3["results"][0]["figures"]["recovery_s"]
    assert rec >= 15 and f"recovery_s: 0 -> 0 -> {rec:g}" in r.stdout, r.stdout
    assert "no_acked_loss: failing since story-3" in r.stdout, r.stdout
    assert (runs / "history.html").read_text().count('data-plot="trend"') == 1
    assert 'href="../history.html"' in (r3 / "report.html").read_text()   # each run's report links the page

    found, why = regressions(runs, "story-3", s3["results"][0], "quick", "last",
                             parse_rules("recovery_s:+20%,peak_lag:+50%,acked_lost:>0"))
    assert why == "" and len(found) == 3, found   # the slower drain's peak lag (3,000 against 127) too
    assert found[0].startswith(f"regression in kafka-registry/mongo-slowdown-allchecks: recovery_s = {rec:g} "
                               "against 0 in baseline run story-2"), found
    assert "peak_lag = 3000 against 127" in found[1] and "acked_lost = 10 against 0" in found[2], found

    # the same rows, by the same code, in a real Postgres (what a team shares); recording twice changes nothing
    os.environ[ENV_URL] = postgres
    try:
        for _ in range(2):
            for run, s in ((r1, s1), (r2, s2), (r3, s3)):
                assert record(runs, s["run_id"], s["profile"], s["results"], run) is None
        with HistoryStore(postgres) as pg:
            assert pg.postgres
            pg_rows = pg.rows()
    finally:
        del os.environ[ENV_URL]
    key = lambda r: (r.run_id, r.check_name, r.verdict, json.dumps(r.figures, sort_keys=True), r.started_at)
    assert sorted(map(key, pg_rows)) == sorted(map(key, rows))
    r = monsoon("history", "--runs-dir", str(runs), "--json", env={ENV_URL: postgres})
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["experiments"][0]["strip"] == "??F"


def test_two_scheduled_runs_fired_at_once_one_runs_one_is_recorded_skipped(tmp_path):
    work = tmp_path / "scenario"
    work.mkdir()
    (work / "test_slow.py").write_text(textwrap.dedent("""\
        import os, time
        def test_slow():
            with open(os.environ["MARK"], "a") as fh:
                fh.write(f"{os.getpid()}\\n")
            deadline = time.monotonic() + 60      # runs until the other firing has ended (not a guessed sleep)
            while not os.path.exists(os.environ["RELEASE"]) and time.monotonic() < deadline:
                time.sleep(0.05)
    """))
    runs, mark = tmp_path / "runs", tmp_path / "ran.txt"
    cmd = [sys.executable, "-m", "monsoon.cli", "scheduled-run", "--name", "story", "--runs-dir", str(runs), "--",
           "-q", "-p", "no:cacheprovider", str(work / "test_slow.py")]
    release = tmp_path / "release"
    env = {**os.environ, "MARK": str(mark), "RELEASE": str(release), ENV_URL: ""}
    procs = [subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    # the scenario holds its schedule's lock until one firing has ended, however slowly either process starts:
    # the one that ends first must be the skipped one (if both ran, neither ends before the scenario's own 60 s)
    deadline = time.monotonic() + 120
    while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
        time.sleep(0.05)
    release.touch()
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert len(mark.read_text().splitlines()) == 1, outs          # exactly one ran the scenario
    assert sum("skipped: another run of schedule story is still running" in o for o in outs) == 1, outs
    with HistoryStore(runs / "history.sqlite") as st:
        [row] = st.rows()
    assert (row.status, row.experiment) == ("skipped", "story") and "concurrency policy Forbid" in row.message
    assert "pid " in row.message
