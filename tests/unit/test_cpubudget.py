"""MONSOON_SERVICE_CPUS (monsoon.stack.cpubudget) and the budgets self-test's parsing and table
(monsoon.selftest.budgets). The last test makes a real cgroup v1 with a CPU quota."""
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from monsoon.selftest import budgets as bud
from monsoon.stack import cpubudget as cb
from monsoon.stack.cpubudget import CpuBudgetError, CpuCgroup


# ---------------------------------------------------------------- the variable

@pytest.mark.parametrize("raw, cores", [("0.5", 0.5), (" 2 ", 2.0), ("1", 1.0), ("0.01", 0.01)])
def test_the_budget_is_read_in_cores(raw, cores):
    assert cb.budget_from_env({cb.ENV: raw}) == cores


@pytest.mark.parametrize("env", [{}, {cb.ENV: ""}, {cb.ENV: "  "}])
def test_no_budget_when_unset_or_empty(env):
    assert cb.budget_from_env(env) is None


@pytest.mark.parametrize("raw", ["half", "0", "-1", "nan", "inf", "0.001", "1,5"])
def test_a_bad_budget_is_one_line_naming_the_variable(raw):
    with pytest.raises(ValueError) as e:
        cb.budget_from_env({cb.ENV: raw})
    assert "MONSOON_SERVICE_CPUS" in str(e.value) and "\n" not in str(e.value) and repr(raw) in str(e.value)


def test_the_budget_is_read_from_the_process_environment(monkeypatch):
    monkeypatch.setenv(cb.ENV, "1.5")
    assert cb.budget_from_env() == 1.5
    monkeypatch.delenv(cb.ENV)
    assert cb.budget_from_env() is None


@pytest.mark.parametrize("cores, period, quota", [(0.5, 100_000, 50_000), (2, 100_000, 200_000),
                                                  (0.2, 100_000, 20_000), (1.5, 50_000, 75_000),
                                                  (0.333, 100_000, 33_300)])
def test_the_quota_is_cores_times_the_period(cores, period, quota):
    assert cb.quota_us(cores, period) == quota


# ---------------------------------------------------------------- locating the controller

V1_MOUNTS = [("cgroup", "/sys/fs/cgroup/memory", "rw,memory"), ("cgroup", "{root}/cpu", "rw,relatime,cpu"),
             ("cgroup2", "/sys/fs/cgroup/unified", "rw")]


def _mounts(root: Path, mounts):
    return [(fs, mp.format(root=root), opts) for fs, mp, opts in mounts]


def test_v1_parent_is_the_process_own_cpu_cgroup(tmp_path):
    (tmp_path / "cpu" / "user" / "me").mkdir(parents=True)
    assert cb.locate(_mounts(tmp_path, V1_MOUNTS), "4:memory:/x\n1:cpu,cpuacct:/user/me\n0::/") \
        == (1, tmp_path / "cpu" / "user" / "me")
    # a cgroup path not visible here (another namespace's): the mount's root
    assert cb.locate(_mounts(tmp_path, V1_MOUNTS), "1:cpu:/docker/abc\n") == (1, tmp_path / "cpu")
    assert cb.locate(_mounts(tmp_path, V1_MOUNTS), "1:cpu:/\n") == (1, tmp_path / "cpu")


def test_v2_parent_is_the_own_cgroup_when_it_delegates_cpu_else_the_mount_root(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (tmp_path / "cgroup.subtree_control").write_text("cpu memory\n")
    own = tmp_path / "user.slice" / "me.scope"
    own.mkdir(parents=True)
    mounts = [("cgroup2", str(tmp_path), "rw")]
    (own / "cgroup.subtree_control").write_text("cpu\n")
    assert cb.locate(mounts, "0::/user.slice/me.scope\n") == (2, own)
    (own / "cgroup.subtree_control").write_text("memory\n")
    # "+cpu" is written (a real cgroup would then list cpu; this file does not): the mount's root
    assert cb.locate(mounts, "0::/user.slice/me.scope\n") == (2, tmp_path)
    assert (own / "cgroup.subtree_control").read_text() == "+cpu"
    (own / "cgroup.subtree_control").unlink()
    (own / "cgroup.subtree_control").mkdir()          # cannot be written at all: the mount's root too
    assert cb.locate(mounts, "0::/user.slice/me.scope\n") == (2, tmp_path)
    (tmp_path / "cgroup.subtree_control").write_text("memory\n")
    (tmp_path / "cgroup.subtree_control").chmod(0o444)
    if os.access(tmp_path / "cgroup.subtree_control", os.W_OK):   # root writes anyway: make it unwritable
        (tmp_path / "cgroup.subtree_control").unlink()
        (tmp_path / "cgroup.subtree_control").mkdir()
    with pytest.raises(CpuBudgetError, match="cannot enable the cpu controller for children"):
        cb.locate(mounts, "0::/user.slice/me.scope\n")


def test_no_cpu_controller_is_a_clear_error(tmp_path):
    (tmp_path / "cgroup.controllers").write_text("memory pids\n")
    with pytest.raises(CpuBudgetError) as e:
        cb.locate([("cgroup2", str(tmp_path), "rw")], "0::/\n")
    assert str(e.value).startswith("MONSOON_SERVICE_CPUS needs a writable cgroup cpu controller: ")
    with pytest.raises(CpuBudgetError):
        cb.locate([], "")


# ---------------------------------------------------------------- the cgroup's files (a tmp dir for the mount)

def test_v1_create_writes_period_then_quota(tmp_path):
    cg = CpuCgroup.create(0.5, parent=tmp_path, version=1, name="monsoon-cpus-1")
    assert cg.path == tmp_path / "monsoon-cpus-1" and cg.path.is_dir()
    assert (cg.path / "cpu.cfs_period_us").read_text() == "100000"
    assert (cg.path / "cpu.cfs_quota_us").read_text() == "50000"
    assert list(cg.quota_files()) == ["cpu.cfs_period_us", "cpu.cfs_quota_us"]


def test_v2_create_writes_cpu_max(tmp_path):
    cg = CpuCgroup.create(2, parent=tmp_path, version=2)
    assert cg.path.name == f"monsoon-cpus-{os.getpid()}"
    assert (cg.path / "cpu.max").read_text() == "200000 100000"


def test_create_in_a_read_only_place_is_the_clear_error(tmp_path):
    (tmp_path / "ro").write_text("")        # a file: nothing can be made under it
    with pytest.raises(CpuBudgetError) as e:
        CpuCgroup.create(1, parent=tmp_path / "ro", version=1)
    assert str(e.value).startswith("MONSOON_SERVICE_CPUS needs a writable cgroup cpu controller: cannot create ")


def test_a_refused_quota_removes_the_cgroup_again(tmp_path):
    class Refused(CpuCgroup):
        def set_quota(self):
            raise PermissionError(13, "Permission denied")
    with pytest.raises(CpuBudgetError, match="cannot set the quota .* to 0.5 cores: Permission denied"):
        Refused.create(0.5, parent=tmp_path, version=1, name="x")
    assert not (tmp_path / "x").exists()


def test_preexec_writes_the_child_pid_into_cgroup_procs(tmp_path):
    cg = CpuCgroup.create(1, parent=tmp_path, version=1, name="g")
    cg.procs_file.write_text("")         # the kernel's file exists in a real cgroup
    p = subprocess.Popen([sys.executable, "-c", "import os; print(os.getpid())"], stdout=subprocess.PIPE,
                         text=True, preexec_fn=cg.preexec(), start_new_session=True)
    out, _ = p.communicate(timeout=30)
    assert cg.pids() == [int(out)] == [p.pid]
    cg.procs_file.write_text("")
    cg.probe()                               # the same through a short `true`
    assert len(cg.pids()) == 1 and cg.pids() != [p.pid]


def test_a_child_that_cannot_join_fails_its_probe(tmp_path):
    cg = CpuCgroup(1, tmp_path / "absent", 1.0)
    with pytest.raises(CpuBudgetError, match="cannot be moved into"):
        cg.probe()


def test_remove_moves_leftovers_to_the_parent_then_removes(tmp_path):
    cg = CpuCgroup.create(1, parent=tmp_path, version=1, name="g")
    cg.add(4242)
    assert cg.remove(wait_s=0) is False               # a fake cgroup keeps its files: rmdir fails
    assert (tmp_path / "cgroup.procs").read_text() == "4242"
    for f in cg.path.iterdir():
        f.unlink()
    assert cg.remove(wait_s=0) is True and not cg.path.exists()
    assert cg.remove(wait_s=0) is True                # already gone


def test_stale_cgroups_of_gone_processes_are_removed(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    for name in (f"monsoon-cpus-{dead.pid}", f"monsoon-cpus-{os.getpid()}", "monsoon-cpus-1", "other"):
        (tmp_path / name).mkdir()
    (tmp_path / "monsoon-cpus-999999999").mkdir()
    (tmp_path / "monsoon-cpus-999999999" / "busy").write_text("")       # not empty: kept
    assert cb.remove_stale(tmp_path) == [tmp_path / f"monsoon-cpus-{dead.pid}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"monsoon-cpus-{os.getpid()}", "monsoon-cpus-1", "monsoon-cpus-999999999", "other"])


def test_the_service_cgroup_is_made_once_and_only_with_a_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(cb, "locate", lambda: (1, tmp_path))
    monkeypatch.setattr(cb, "_active", None)
    monkeypatch.setattr(cb.atexit, "register", lambda f: None)
    probes = []
    monkeypatch.setattr(cb.CpuCgroup, "probe", lambda self: probes.append(self.path))
    monkeypatch.delenv(cb.ENV, raising=False)
    assert cb.service_preexec() is None and cb.problems() == []
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(cb.ENV, "0.5")
    first = cb.service_cgroup()
    assert first is not None and cb.service_cgroup() is first and probes == [first.path]
    assert first.path == tmp_path / f"monsoon-cpus-{os.getpid()}"
    assert (first.path / "cpu.cfs_quota_us").read_text() == "50000"
    assert callable(cb.service_preexec())
    monkeypatch.setenv(cb.ENV, "2")              # changed within the process: the same cgroup, a new quota
    assert cb.service_cgroup() is first and (first.path / "cpu.cfs_quota_us").read_text() == "200000"
    monkeypatch.setenv(cb.ENV, "lots")
    assert cb.problems() == ["MONSOON_SERVICE_CPUS='lots' is not a number of cores (e.g. 0.5, 1, 2)"]


def test_preflight_problem_when_the_controller_is_not_writable(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(cb, "locate", lambda: (1, tmp_path / "file"))
    monkeypatch.setattr(cb, "_active", None)
    monkeypatch.setenv(cb.ENV, "1")
    [problem] = cb.problems()
    assert problem.startswith("MONSOON_SERVICE_CPUS needs a writable cgroup cpu controller: cannot create ")


# ---------------------------------------------------------------- the budgets self-test

def test_budgets_parse():
    got = bud.parse_budgets("0.5, 1,2,neighbour,none")
    assert [(b.label, b.cores, b.neighbour) for b in got] == [("0.5", 0.5, False), ("1", 1.0, False),
                                                             ("2", 2.0, False), ("neighbour", None, True),
                                                             ("none", None, False)]
    for bad in ("0.5,abc", "1,1.0", "", "0"):
        with pytest.raises(ValueError):
            bud.parse_budgets(bad)


def test_the_budget_environment(tmp_path):
    base = {"PATH": "/bin", cb.ENV: "7"}
    env = bud.Budget("0.5", 0.5).env(base, tmp_path / "cal")
    assert env[cb.ENV] == "0.5" and env["MONSOON_CALIBRATION_DIR"] == str(tmp_path / "cal") and env["PATH"] == "/bin"
    env = bud.Budget("neighbour", None, neighbour=True).env(base, tmp_path)
    assert cb.ENV not in env and base[cb.ENV] == "7"


def test_the_run_directory_is_found_in_the_demo_output(tmp_path):
    first = ("monsoon demo: /v/bin/python -m pytest /r/pytest/test_burst_floods.py::test_burst_flood[x] -p "
             "no:cacheprovider --monsoon-run-id 20260101-120000-ab12")
    assert bud.run_id_from_output([first, "....", "boom"]) == "20260101-120000-ab12"
    assert bud.run_dir_from_output([first, "boom"], tmp_path) == tmp_path / "20260101-120000-ab12"
    said = "monsoon demo: (pytest exits 1 because ...) Run directory: "
    assert bud.run_dir_from_output([first, said + "/data/runs/other-id"], tmp_path) == Path("/data/runs/other-id")
    assert bud.run_dir_from_output([first, said + "runs/rel-id"], tmp_path) == bud.REPO / "runs" / "rel-id"
    assert bud.run_id_from_output(["pytest: error", "--monsoon-run-id x"]) is None
    assert bud.run_dir_from_output(["pytest: error", "--monsoon-run-id x"], tmp_path) is None


def _result(stack, verdict, base_rate=None, **checks):
    r = {"stack": stack, "experiment": "burst-x10", "verdict": verdict, "figures": {},
         "checks": [{"name": k, "verdict": "pass", "figures": v} for k, v in checks.items()]}
    if base_rate:
        r["base_rate"] = base_rate
    return r


STORY = {"run_id": "r1", "profile": "quick", "results": [
    _result("inmemory", "fail", {"base_rate": 370.0, "capacity_msg_s": 1850.0, "fraction": 0.2,
                                 "source": "calibrated-now", "calibrated_at": "2026-01-01T12:00:00",
                                 "calibration_file": "/x"},
            no_oom={"oom_events": 2}, no_acked_loss={"acked": 200000, "acked_lost": 41000},
            lag_recovers_within={"peak_lag": 62000.0, "recovery_s": 32.0}),
    _result("kafka", "pass", {"base_rate": 420.0, "capacity_msg_s": 2100.0, "fraction": 0.2,
                              "source": "calibrated-now", "calibrated_at": "2026-01-01T12:05:00"},
            no_oom={"oom_events": 0}, no_acked_loss={"acked": 250000, "acked_lost": 0},
            lag_recovers_within={"peak_lag": 91000.0, "recovery_s": 75.5}),
]}


def test_rows_from_a_summary():
    im, kf = bud.rows_for(STORY)
    assert im["verdict"] == "fail" and im["oom_events"] == 2 and im["acked_lost"] == 41000 and im["acked"] == 200000
    assert im["peak_backlog"] == 62000.0 and im["recovery_s"] == 32.0
    assert im["base_rate"] == {"base_rate": 370.0, "capacity_msg_s": 1850.0, "fraction": 0.2,
                               "source": "calibrated-now", "calibrated_at": "2026-01-01T12:00:00"}
    assert kf["verdict"] == "pass" and kf["acked_lost"] == 0 and kf["peak_lag"] == 91000.0
    missing = bud.rows_for({"results": STORY["results"][:1]})[1]
    assert missing == {"stack": "kafka", "experiment": "burst-x10", "verdict": "did not run"}
    fixed = bud.rows_for({"results": [_result("kafka", "pass", lag_bounded={"peak_lag": 5.0})]})[1]
    assert fixed["base_rate"] is None and fixed["peak_backlog"] == 5.0 and fixed["peak_lag"] is None


def test_the_story_is_judged_by_the_demo_rules():
    assert bud.judge(STORY) == (True, [])
    broken = {"results": [STORY["results"][0], _result("kafka", "fail", no_acked_loss={"acked_lost": 3},
                                                       lag_recovers_within={"peak_lag": 9})]}
    ok, problems = bud.judge(broken)
    assert not ok and "acked_lost=3" in problems[0]
    assert bud.judge(None, "no run id") == (False, ["no run id"])


def test_the_table():
    entries = [{"label": "0.5", "reproduced": True, "rows": bud.rows_for(STORY)},
               {"label": "neighbour", "reproduced": False, "rows": [], "status": "not reproduced"}]
    lines = bud.table(entries).splitlines()
    assert lines[0].count("|") == lines[1].count("|") == lines[2].count("|") == 10
    assert lines[2] == "| 0.5 | inmemory | 1,850 | 370 (0.2x) | 62,000 | 2 | 41,000 | FAIL | yes |"
    assert lines[3] == "| 0.5 | kafka | 2,100 | 420 (0.2x) | 91,000 | 0 | 0 | PASS | yes |"
    assert lines[4] == "| neighbour | - | - | - | - | - | - | NOT REPRODUCED | no |"
    doc = bud.report(entries + [{"label": "1", "reproduced": False, "rows": [], "problems": ["kafka boom"],
                                 "rc": 1, "elapsed_s": 3.0}])
    assert "  * kafka boom" in doc and "| 1 | - |" in doc


def test_write_says_all_reproduced_only_when_complete(tmp_path):
    entries = [{"label": "0.5", "reproduced": True, "rows": bud.rows_for(STORY)}]
    bud.write(tmp_path, entries, started="t", complete=False)
    import json
    assert json.loads((tmp_path / "budgets.json").read_text())["all_reproduced"] is False
    bud.write(tmp_path, entries, started="t", complete=True)
    assert json.loads((tmp_path / "budgets.json").read_text())["all_reproduced"] is True
    assert "| 0.5 | kafka |" in (tmp_path / "budgets.md").read_text()


def test_stop_kills_a_process_that_ignores_the_first_signal():
    p = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); "
                          "print('ready', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True,
                         start_new_session=True)
    assert p.stdout.readline().strip() == "ready"
    t0 = time.monotonic()
    bud._stop(p, bud.signal.SIGINT, 0.5)
    assert p.returncode == -9 and time.monotonic() - t0 < 10


# ---------------------------------------------------------------- a real cgroup v1 quota

V1_CPU = Path("/sys/fs/cgroup/cpu")


@pytest.mark.integration
def test_a_real_quota_throttles_a_busy_child():
    if not (V1_CPU / "cpu.cfs_quota_us").exists() or not os.access(V1_CPU, os.W_OK):
        pytest.skip(f"no writable cgroup v1 cpu controller at {V1_CPU}")
    version, parent = cb.locate()
    assert version == 1
    cg = CpuCgroup.create(0.2, parent=parent, version=1, name=f"monsoon-cpus-{os.getpid()}-test")
    child = None
    try:
        assert (cg.path / "cpu.cfs_quota_us").read_text().strip() == "20000"
        child = subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=cg.preexec(),
                                 start_new_session=True)
        t0 = time.monotonic()
        time.sleep(1.5)
        assert child.pid in cg.pids()
        stat = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu_s = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")
        wall = time.monotonic() - t0
        throttled = cg.stat()
        assert cpu_s / wall < 0.5, f"{cpu_s:.2f} CPU s in {wall:.2f} s under a 0.2-core quota"
        assert throttled.get("nr_throttled", 0) > 0, throttled
    finally:
        if child is not None:
            child.kill()
            child.wait()
        assert cg.remove() is True
    assert not cg.path.exists()
    # this process never joined it
    assert f"{cg.path.name}" not in Path("/proc/self/cgroup").read_text()


FAKE_DEMO = r'''
import json, os, sys
from pathlib import Path
runs, summary = Path(sys.argv[1]), json.loads(sys.argv[2])
print("monsoon demo: python -m pytest x -p no:cacheprovider --monsoon-run-id fake-1", flush=True)
(runs / "fake-1").mkdir(parents=True)
(runs / "fake-1" / "summary.json").write_text(json.dumps(summary))
print("seen", os.environ.get("MONSOON_SERVICE_CPUS"), os.environ["MONSOON_CALIBRATION_DIR"], flush=True)
sys.exit(1)
'''


@pytest.mark.parametrize("budget", ["0.5", "neighbour"])
def test_one_budget_runs_the_demo_and_judges_its_summary(tmp_path, budget, capsys):
    [b] = bud.parse_budgets(budget)
    runs = tmp_path / "runs"
    demo = [sys.executable, "-c", FAKE_DEMO, str(runs), __import__("json").dumps(STORY)]
    e = bud.run_budget(b, tmp_path / "out", n=1, of=1, t_all=time.monotonic(), demo_args=[], verbose=False,
                       demo=demo, runs=runs)
    assert e["rc"] == 1 and e["run_id"] == "fake-1" and e["reproduced"] is True and e["problems"] == []
    assert e["run_dir"] == str(runs / "fake-1")
    assert [r["stack"] for r in e["rows"]] == ["inmemory", "kafka"]
    log = (tmp_path / "out" / budget / "demo.log").read_text()
    cal = tmp_path / "out" / budget / "calibration"
    assert f"seen {'0.5' if budget == '0.5' else None} {cal}" in log
    if budget == "neighbour":
        assert not Path(f"/proc/{e['neighbour_pid']}").exists()      # killed (and reaped) at the end
        assert e["neighbour_cores"] is not None
    assert "story REPRODUCED" in capsys.readouterr().out


def test_a_demo_without_a_summary_is_not_reproduced(tmp_path):
    [b] = bud.parse_budgets("1")
    demo = [sys.executable, "-c", "print('pytest: error: unrecognized arguments'); raise SystemExit(4)"]
    e = bud.run_budget(b, tmp_path, n=1, of=1, t_all=time.monotonic(), demo_args=[], verbose=False, demo=demo,
                       runs=tmp_path / "runs")
    assert e["rc"] == 4 and e["reproduced"] is False and e["rows"] == []
    assert e["problems"][0].startswith("no run directory in the demo's output (exit 4")


@pytest.mark.parametrize("started_in_the_background", [False, True])
def test_an_interrupt_stops_the_demo_and_kills_the_neighbour(tmp_path, monkeypatch, started_in_the_background):
    """Also when monsoon was started in the background by a script, which leaves SIGINT ignored in it (and, but
    for budgets.HEAR_SIGINT, in the demo: it then slept its 60 s through the SIGINT)."""
    import signal
    was = signal.signal(signal.SIGINT, signal.SIG_IGN) if started_in_the_background else None
    [b] = bud.parse_budgets("neighbour")
    pids = []
    real_popen = bud.subprocess.Popen

    def popen(*a, **k):
        p = real_popen(*a, **k)
        pids.append(p.pid)
        return p
    monkeypatch.setattr(bud.subprocess, "Popen", popen)
    # the demo interrupts us itself once it runs (its SIGINT handler in place): a timer could fire while the
    # demo is still being started on a busy machine, and a demo that is not running yet cannot show the stop
    demo = [sys.executable, "-c", "import os, signal, time; print('started', flush=True); "
            "os.kill(os.getppid(), signal.SIGALRM); time.sleep(60)"]

    def interrupt(*_):
        raise KeyboardInterrupt
    old = signal.signal(signal.SIGALRM, interrupt)
    t0 = time.monotonic()
    try:
        with pytest.raises(KeyboardInterrupt):
            bud.run_budget(b, tmp_path, n=1, of=1, t_all=t0, demo_args=[], verbose=False, demo=demo,
                           runs=tmp_path / "runs")
    finally:
        signal.signal(signal.SIGALRM, old)
        if was is not None:
            signal.signal(signal.SIGINT, was)
    assert time.monotonic() - t0 < 20 and len(pids) == 2       # the neighbour, the demo
    assert [p for p in pids if Path(f"/proc/{p}").exists()] == []


def test_an_interrupt_reaches_the_demo_s_pytest_not_only_the_demo(tmp_path):
    """monsoon demo runs pytest with subprocess.call, which SIGKILLs it when the demo itself is interrupted:
    the SIGINT goes to pytest, which tears its stacks down and exits; the demo then ends by itself."""
    told = tmp_path / "told"
    pytest_ = tmp_path / "fake_pytest.py"
    pytest_.write_text("import pathlib, signal, sys, time\n"
                       "def bye(*_):\n"
                       f"    pathlib.Path({str(told)!r}).write_text('SIGINT')\n"
                       "    sys.exit(2)\n"
                       "signal.signal(signal.SIGINT, bye)\n"
                       "print('ready', flush=True)\n"
                       "time.sleep(60)\n")
    demo = subprocess.Popen([sys.executable, "-c", "import subprocess, sys; "
                             f"sys.exit(subprocess.call([sys.executable, {str(pytest_)!r}]))"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert demo.stdout.readline().strip() == "ready"
    bud._stop(demo, bud.signal.SIGINT, 20, children=True)
    assert told.read_text() == "SIGINT" and demo.returncode == 2
