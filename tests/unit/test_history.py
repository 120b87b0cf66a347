"""The run history's pure logic: the store's upsert on SQLite, strips, trends, flaky checks, the first failing run,
compare expressions, the sign-off (score, expiry with an injected clock, policy errors), schedules, and the plugin's
glue (a pytest session records its results; a regression fails the test naming the figure)."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

from monsoon.history import schedule as sched
from monsoon.history import signoff as so
from monsoon.history.compare import CompareError, Rule, compare, parse_rules, pick_baseline
from monsoon.history.record import host_class, record_not_run
from monsoon.history.store import EXPERIMENT, HistoryStore, Row
from monsoon.history.views import as_json, as_text, first_failing, flaky, strip, strip_text, trend
from monsoon.spec.yamlio import SpecError

DAY = 86400.0


def row(run: str, t: float, verdict: str, check: str = EXPERIMENT, commit: str = "c1", stack_sha: str = "s1",
        figures: dict | None = None, stack: str = "kafka", exp: str = "burst-x10", profile: str = "quick",
        hc: str | None = None) -> Row:
    return Row(run_id=run, stack=stack, experiment=exp, check_name=check, verdict=verdict, figures=figures or {},
               profile=profile, host_class=hc or host_class(), git_commit=commit, stack_sha256=stack_sha,
               started_at=t, ended_at=t + 60, duration_s=60, run_dir=f"/runs/{run}")


# ------------------------------------------------------------------ store

def test_the_sqlite_store_upserts_a_reanalysed_run_instead_of_duplicating_it(tmp_path):
    with HistoryStore(tmp_path / "h.sqlite") as st:
        st.upsert([row("r1", 1.0, "pass", figures={"recovery_s": 3}), row("r1", 1.0, "pass", check="no_oom")])
        first = st.rows()
        again = row("r1", 1.0, "fail", figures={"recovery_s": 9})
        again.git_commit = "other"   # provenance is kept from the run, a re-analysis changes verdicts only
        st.upsert([again])
        rows = st.rows()
    assert len(first) == len(rows) == 2
    mine = next(r for r in rows if r.check_name == EXPERIMENT)
    assert mine.verdict == "fail" and mine.figures == {"recovery_s": 9} and mine.git_commit == "c1"


def test_prune_deletes_only_runs_older_than_the_cutoff(tmp_path):
    with HistoryStore(tmp_path / "h.sqlite") as st:
        st.upsert([row("old", 10.0, "pass"), row("new", 1000.0, "pass")])
        assert st.prune(500.0) == [("old", "/runs/old")]
        assert [r.run_id for r in st.rows()] == ["new"]


# ------------------------------------------------------------------ views

def test_strip_trend_flaky_and_first_failing():
    rows = [row("r1", 1, "pass", figures={"recovery_s": 10, "peak_lag": 100}),
            row("r2", 2, "fail", figures={"recovery_s": 50, "peak_lag": 90}),
            row("r3", 3, "fail", figures={"recovery_s": 55}),
            row("r1", 1, "pass", check="lag_recovers_within"),
            row("r2", 2, "fail", check="lag_recovers_within", commit="c2"),   # a new commit: not flaky
            row("r3", 3, "fail", check="lag_recovers_within", commit="c2"),
            row("r1", 1, "pass", check="no_oom"),
            row("r2", 2, "fail", check="no_oom"),                              # same commit and stack: flaky
            row("r3", 3, "pass", check="no_oom")]
    s = strip(rows)
    assert strip_text(s[("kafka", "burst-x10")]) == "PFF"
    assert trend(rows)[("kafka", "burst-x10")] == {"recovery_s": [("r1", 10.0), ("r2", 50.0), ("r3", 55.0)],
                                                   "peak_lag": [("r1", 100.0), ("r2", 90.0)]}
    assert [(f.check, f.from_run, f.to_run) for f in flaky(rows)] == [("no_oom", "r1", "r2"), ("no_oom", "r2", "r3")]
    ff = first_failing(rows)
    assert [(f.check, f.run_id, f.commit, f.last_pass_run, f.failing_runs) for f in ff] == \
        [("lag_recovers_within", "r2", "c2", "r1", 2)]
    text = as_text(rows)
    assert "kafka / burst-x10: PFF" in text and "recovery_s: 10 -> 50 -> 55" in text
    assert "failing since r2, commit c2" in text
    assert json.loads(json.dumps(as_json(rows)))["experiments"][0]["strip"] == "PFF"


# ------------------------------------------------------------------ compare

@pytest.mark.parametrize("expr,base,now,regressed", [
    ("recovery_s:+20%", 10, 12, False), ("recovery_s:+20%", 10, 12.5, True), ("recovery_s:+20%", 0, 0.1, True),
    ("capacity:-10%", 1000, 950, False), ("capacity:-10%", 1000, 850, True),
    ("acked_lost:>0", 0, 0, False), ("acked_lost:>0", 0, 1, True), ("peak_lag:+500", 100, 700, True),
    ("p99:<5", 9, 3, True),
])
def test_compare_rules(expr, base, now, regressed):
    [rule] = parse_rules(expr)
    assert rule.regressed(base, now) is regressed


@pytest.mark.parametrize("expr,words", [("recovery_s", "is not FIGURE:RULE"), ("recovery_s:20%", "not FIGURE:RULE"),
                                        ("a:+1,,b:+2", "empty term"), ("acked_lost:>0%", "takes no %")])
def test_a_bad_compare_expression_is_one_line_naming_the_term(expr, words):
    with pytest.raises(CompareError) as e:
        parse_rules(expr)
    assert words in str(e.value) and "\n" not in str(e.value) and str(e.value).startswith("--monsoon-compare-fail")


def test_the_baseline_is_the_last_comparable_run_and_a_regression_names_figure_run_and_values():
    hist = [row("r1", 1, "pass", figures={"recovery_s": 10}), row("r2", 2, "pass", figures={"recovery_s": 11}),
            row("r3", 3, "pass", figures={"recovery_s": 1}, profile="full"),
            row("r4", 4, "pass", figures={"recovery_s": 1}, hc="other-64cpu")]
    base, _ = pick_baseline(hist, stack="kafka", experiment="burst-x10", run_id="now", profile="quick",
                            host_class=host_class(), which="last")
    assert base.run_id == "r2"
    [reg] = compare(parse_rules("recovery_s:+20%,acked_lost:>0"), base, {"recovery_s": 30, "acked_lost": 0},
                    "kafka", "burst-x10")
    assert "recovery_s = 30" in str(reg) and "against 11" in str(reg) and "baseline run r2" in str(reg)
    with pytest.raises(CompareError, match="not comparable"):
        pick_baseline(hist, stack="kafka", experiment="burst-x10", run_id="now", profile="quick",
                      host_class=host_class(), which="r3")
    forced, _ = pick_baseline(hist, stack="kafka", experiment="burst-x10", run_id="now", profile="quick",
                              host_class=host_class(), which="last", force=True)
    assert forced.run_id == "r4"
    none, why = pick_baseline([], stack="kafka", experiment="burst-x10", run_id="now", profile="quick",
                              host_class=host_class(), which="last")
    assert none is None and "no earlier run" in why


# ------------------------------------------------------------------ sign-off

def policy(tmp_path, text: str) -> so.SignoffPolicy:
    p = tmp_path / "signoff.yaml"
    p.write_text(textwrap.dedent(text))
    return so.load_policy(p)


POLICY = """\
    max_age: 1d
    items:
      - experiment: burst-x10
        stacks: [kafka]
        weight: 3
      - experiment: pod-kill
        stacks: [kafka]
        checks: [no_acked_loss]
"""


def test_signoff_go_then_expired_by_the_clock_then_nogo_after_a_failing_run(tmp_path):
    pol = policy(tmp_path, POLICY)
    rows = [row("r1", 0, "pass"), row("r1", 0, "fail", exp="pod-kill"),
            row("r1", 0, "pass", exp="pod-kill", check="no_acked_loss")]
    go = so.judge(pol, rows, now=3600)
    assert go.decision == "GO" and go.score == 100 and go.exit_code == 0
    assert go.valid_until == 60 + DAY
    exp = so.judge(pol, rows, now=2 * DAY)
    assert exp.decision == "EXPIRED" and exp.exit_code == 3 and exp.score == 75 and exp.valid_until is None
    rows.append(row("r2", 2 * DAY, "fail"))
    nogo = so.judge(pol, rows, now=2 * DAY + 100)
    assert [i.state for i in nogo.items] == ["NO-GO", "EXPIRED"] and nogo.decision == "NO-GO"
    assert nogo.score == pytest.approx((3 * 50 + 75) / 4, abs=0.1) and nogo.exit_code == 1
    md = so.markdown(nogo)
    assert "**Decision: NO-GO**" in md and "run r2" in md and "/runs/r2/report.html" in md
    assert 'data-decision="NO-GO"' in so.to_html(nogo)


def test_never_run_and_unknown_are_never_go(tmp_path):
    pol = policy(tmp_path, POLICY)
    s = so.judge(pol, [row("r1", 0, "unknown")], now=10)
    assert [(i.state, i.why, i.points) for i in s.items] == [("NO-GO", "unknown", 50), ("NO-GO", "never run", 0)]
    assert s.score == (3 * 50 + 0) / 4
    # a listed check the run does not have is unknown, not a pass
    s = so.judge(pol, [row("r1", 0, "pass"), row("r1", 0, "pass", exp="pod-kill")], now=10)
    assert s.items[1].state == "NO-GO" and s.items[1].checks == {"no_acked_loss": "unknown"}


@pytest.mark.parametrize("text,where", [
    ("items:\n  - experiment: x\n    stacks: [a]\n    wieght: 2\n", ":4: items.0.wieght: unknown key"),
    ("max_age: soon\nitems:\n  - {experiment: x, stacks: [a]}\n", ":1: max_age: "),
    ("items:\n  - experiment: x\n    stacks: []\n", ":3: items.0.stacks: "),
    ("items: []\n", ":1: items: "),
])
def test_a_bad_policy_is_one_line_with_file_line_and_key(tmp_path, text, where):
    p = tmp_path / "signoff.yaml"
    p.write_text(text)
    with pytest.raises(SpecError) as e:
        so.load_policy(p)
    assert f"{p}{where}" in str(e.value) and "\n" not in str(e.value)


def test_the_shipped_example_policy_is_valid():
    pol = so.load_policy(so.__file__.replace("monsoon/history/signoff.py", "docs/signoff.yaml"))
    assert pol.max_age == 7 * DAY and {i.experiment for i in pol.items} >= {"burst-x10", "pod-kill"}


# ------------------------------------------------------------------ schedules

def test_every_and_cron_become_cron_systemd_and_a_due_time():
    assert sched.every_to_cron("6h") == "0 */6 * * *" and sched.every_to_cron("15m") == "*/15 * * * *"
    assert sched.cron_to_oncalendar("0 */6 * * *") == "*-*-* 0/6:0:00"
    assert sched.cron_to_oncalendar("30 2 * * 1-5") == "Mon..Fri *-*-* 2:30:00"
    for bad in ("7h", "soon"):
        with pytest.raises(sched.ScheduleError):
            sched.every_to_cron(bad)
    with pytest.raises(sched.ScheduleError, match="outside 0-59"):
        sched.parse_cron("61 * * * *")
    now = time.mktime((2026, 11, 24, 14, 37, 12, 0, 0, -1))
    assert sched.previous_fire("0 */6 * * *", now) == time.mktime((2026, 11, 24, 12, 0, 0, 0, 0, -1))
    assert sched.previous_fire("30 2 * * 1-5", now) == time.mktime((2026, 11, 24, 2, 30, 0, 0, 0, -1))  # a Tuesday


def test_units_escape_percent_signs_and_install_under_a_root(tmp_path):
    cmd = sched.run_command("nightly", ["--monsoon-compare-fail=recovery_s:+20%"], deadline=600, cron="0 2 * * *")
    units = sched.systemd_units("nightly", cmd, "0 2 * * *", "/repo")
    assert "recovery_s:+20%%" in units["monsoon-nightly.service"]
    assert "OnCalendar=*-*-* 2:0:00" in units["monsoon-nightly.timer"] and "Persistent=true" in units["monsoon-nightly.timer"]
    assert "+20\\%" in sched.crontab_line("nightly", cmd, "0 2 * * *", "/repo")
    written = sched.install(tmp_path, "nightly", cmd, "0 2 * * *", "/repo", "systemd")
    assert sorted(p.name for p in written) == ["monsoon-nightly.service", "monsoon-nightly.timer"]
    assert (tmp_path / "etc/systemd/system/monsoon-nightly.timer").exists()
    [cron] = sched.install(tmp_path, "nightly", cmd, "0 2 * * *", "/repo", "cron")
    assert cron == tmp_path / "etc/cron.d/monsoon-nightly" and " root cd /repo && " in cron.read_text()
    cj = sched.cronjob("nightly", cmd, "0 2 * * *", image="img", namespace="ns", deadline=300)
    assert cj["spec"]["concurrencyPolicy"] == "Forbid" and cj["spec"]["startingDeadlineSeconds"] == 300
    assert cj["spec"]["successfulJobsHistoryLimit"] == cj["spec"]["failedJobsHistoryLimit"] == 3


def test_a_late_firing_is_recorded_missed_and_never_runs(tmp_path):
    now = time.mktime((2026, 11, 24, 12, 11, 0, 0, 0, -1))   # due 12:00, 11 min late, deadline 10 min
    ran = []
    rc = sched.scheduled_run("nightly", ["-m", "chaos"], tmp_path, cron="0 */6 * * *", deadline=600,
                             now=lambda: now, run=lambda cmd: ran.append(cmd) or 0, log=lambda s: None)
    assert rc == 0 and ran == []
    with HistoryStore(tmp_path / "history.sqlite") as st:
        [r] = st.rows()
    assert (r.status, r.verdict, r.experiment) == ("missed", "missed", "nightly") and "past its deadline of 600 s" in r.message
    sched.scheduled_run("nightly", ["-m", "chaos"], tmp_path, cron="0 */6 * * *", deadline=900,
                        now=lambda: now, run=lambda cmd: ran.append(cmd) or 0, log=lambda s: None)
    assert ran and ran[0][-2:] == ["-m", "chaos"] and "--monsoon-runs-dir" in ran[0]


def test_skipped_and_missed_rows_show_in_the_strip(tmp_path):
    with HistoryStore(tmp_path / "h.sqlite") as st:
        record_not_run(st, "a", "nightly", "skipped", "another run", now=1.0)
        record_not_run(st, "b", "nightly", "missed", "late", now=2.0)
        assert strip_text(strip(st.rows())[("-", "nightly")]) == "sm"


# ------------------------------------------------------------------ the plugin's glue (a fake run, a real session)

CONFTEST = """
    import os
    import monsoon.session
    from monsoon.checks.base import Verdict
    from monsoon.report.result import ExperimentResult
    def fake_run_one(stack_spec, exp, profile, out_dir, **kw):   # no stack is started in a unit test
        rec = float(os.environ["FAKE_RECOVERY_S"])
        return ExperimentResult(stack_spec.name, exp.name, profile, out_dir,
                                checks=[Verdict("lag_recovers_within", "pass", {"recovery_s": rec, "peak_lag": 10})])
    monsoon.session.run_one = fake_run_one
"""


def test_a_session_records_its_results_and_a_seeded_regression_fails_naming_the_figure(pytester, tmp_path,
                                                                                      monkeypatch):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile("def test_x(monsoon):\n    monsoon.run('kafka', 'burst-x10').assert_pass()\n")
    runs = tmp_path / "runs"
    monkeypatch.delenv("MONSOON_HISTORY_URL", raising=False)
    monkeypatch.setenv("FAKE_RECOVERY_S", "10")
    args = [f"--monsoon-runs-dir={runs}", "--monsoon-compare=last", "--monsoon-compare-fail=recovery_s:+20%"]
    pytester.runpytest_subprocess(*args, "--monsoon-run-id=base").assert_outcomes(passed=1)
    monkeypatch.setenv("FAKE_RECOVERY_S", "30")
    res = pytester.runpytest_subprocess(*args, "--monsoon-run-id=slow")
    res.assert_outcomes(failed=1)
    out = res.stdout.str()
    assert "regression in kafka/burst-x10: recovery_s = 30 against 10 in baseline run base" in out
    assert "Traceback" not in out
    with HistoryStore(runs / "history.sqlite") as st:
        assert [r.run_id for r in st.rows(check=EXPERIMENT)] == ["base", "slow"]
    assert (runs / "history.html").exists()


def test_a_bad_compare_expression_stops_the_session_before_anything_runs(pytester, tmp_path):
    pytester.makepyfile("def test_x(monsoon):\n    raise SystemExit('must not run')\n")
    res = pytester.runpytest_subprocess(f"--monsoon-runs-dir={tmp_path}", "--monsoon-compare-fail=recovery_s:20%")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    err = res.stderr.str().strip().splitlines()
    assert err == ["ERROR: --monsoon-compare-fail: 'recovery_s:20%' is not FIGURE:RULE (RULE: +20%, -10%, +5, -5, "
                   ">0 or <100)"]
