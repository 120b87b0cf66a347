"""The scheduled run's CronJob in a cluster (pure parts): its pod spec, its ServiceAccount and Role, the Forbid
skips read from the controller's events into the history, the firing's own row, and monsoon's image contents."""
from __future__ import annotations

import re
import time

from monsoon.history import schedule as sched
from monsoon.history.store import HistoryStore
from monsoon.stack import selfimage


def _cronjob(**kw):
    cmd = sched.run_command("kc", ["-q", "t.py"], deadline=300, cron="* * * * *", runs_dir="/data/runs")
    return sched.cronjob("kc", cmd, "* * * * *", namespace="default", deadline=300, **kw)


def test_the_cronjob_pod_mounts_the_runs_hostpath_runs_as_its_account_and_never_pulls_a_local_image():
    cj = _cronjob(image="monsoon.local/monsoon:abc", runs_hostpath="/data/runs", service_account="monsoon-kc")
    pod = cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    [c] = pod["containers"]
    assert cj["spec"]["concurrencyPolicy"] == "Forbid" and pod["restartPolicy"] == "Never"
    assert pod["serviceAccountName"] == "monsoon-kc" and c["imagePullPolicy"] == "Never"
    assert pod["volumes"] == [{"name": "runs", "hostPath": {"path": "/data/runs", "type": "DirectoryOrCreate"}}]
    assert c["volumeMounts"] == [{"name": "runs", "mountPath": "/data/runs"}]
    assert {"name": sched.ENV_CRONJOB, "value": "monsoon-kc"} in c["env"]
    assert c["command"][:2] == ["monsoon", "scheduled-run"] and "--runs-dir" in c["command"]
    other = _cronjob(image="registry.example/monsoon:1", history_secret="hist")
    oc = other["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]
    assert "imagePullPolicy" not in oc and "volumes" not in other["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    assert {"name": "MONSOON_HISTORY_URL", "valueFrom": {"secretKeyRef": {"name": "hist", "key": "url"}}} in oc["env"]


def test_the_role_reads_events_only_and_is_bound_to_the_pods_account():
    sa, role, binding = sched.rbac("kc", "ns1")
    assert (sa["kind"], sa["metadata"]["name"], sa["metadata"]["namespace"]) == ("ServiceAccount", "monsoon-kc", "ns1")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list"]}]
    assert binding["roleRef"]["name"] == "monsoon-kc"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "monsoon-kc", "namespace": "ns1"}]


def _event(reason="JobAlreadyActive", name="monsoon-kc", count=1, uid="0123456789abcdef", last="2026-11-27T04:31:00Z"):
    return {"metadata": {"uid": uid}, "reason": reason, "count": count, "firstTimestamp": "2026-11-27T04:30:00Z",
            "lastTimestamp": last, "involvedObject": {"kind": "CronJob", "name": name},
            "message": "Not starting job because prior execution is running and concurrency policy is Forbid"}


def test_forbid_skips_come_from_the_controllers_events_one_row_per_event_counting_its_repeats(tmp_path):
    events = [_event(), _event(reason="SuccessfulCreate", uid="x"), _event(name="monsoon-other", uid="y"),
              _event(count=3, uid="fedcba9876543210")]
    skips = sched.kube_skips(events, "monsoon-kc")
    assert [s[0] for s in skips] == ["monsoon-kc-skipped-0123456789abc", "monsoon-kc-skipped-fedcba9876543"]
    assert "the firing at" in skips[0][2] and "3 firings" in skips[1][2] and "concurrencyPolicy Forbid" in skips[1][2]
    loc = str(tmp_path / "history.sqlite")
    assert sched.record_kube_skips(loc, "kc", events, "monsoon-kc") == 2
    assert sched.record_kube_skips(loc, "kc", events, "monsoon-kc") == 2      # again: upserted, not doubled
    with HistoryStore(loc) as st:
        rows = st.rows()
    assert len(rows) == 2 and {(r.status, r.verdict, r.stack, r.experiment) for r in rows} == \
        {("skipped", "skipped", "-", "kc")}
    assert all("JobAlreadyActive" in r.message for r in rows)


def test_in_a_cluster_the_firing_is_recorded_and_the_skips_are_read_before_and_after_it(tmp_path, monkeypatch):
    monkeypatch.setenv(sched.ENV_CRONJOB, "monsoon-kc")
    monkeypatch.delenv("MONSOON_HISTORY_URL", raising=False)
    reads = []

    def events(cj, *a, **kw):
        reads.append(cj)
        return [_event()] if len(reads) > 1 else []       # the skip happened while the firing ran
    monkeypatch.setattr(sched, "incluster_events", events)
    t = [1000.0]
    rc = sched.scheduled_run("kc", ["-q", "t.py"], tmp_path, now=lambda: t[0],
                             run=lambda cmd: t.__setitem__(0, 1042.0) or 3, log=lambda s: None)
    assert rc == 3 and reads == ["monsoon-kc", "monsoon-kc"]
    with HistoryStore(tmp_path / "history.sqlite") as st:
        rows = {r.status: r for r in st.rows()}
    ran = rows["ran"]
    assert (ran.verdict, ran.duration_s, ran.experiment) == ("fail", 42.0, "kc") and "pytest exit 3" in ran.message
    assert "Forbid" in rows["skipped"].message


def test_outside_a_cluster_nothing_is_read_and_an_unreadable_event_list_is_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv(sched.ENV_CRONJOB, raising=False)
    monkeypatch.delenv("MONSOON_HISTORY_URL", raising=False)
    assert sched.scheduled_run("kc", [], tmp_path, run=lambda cmd: 0, log=lambda s: None) == 0
    with HistoryStore(tmp_path / "history.sqlite") as st:
        assert st.rows() == []                       # locally: pytest's own results are the history, as before
    monkeypatch.setenv(sched.ENV_CRONJOB, "monsoon-kc")
    said: list[str] = []
    sched.scheduled_run("kc", [], tmp_path / "b", run=lambda cmd: 0, log=said.append)   # no token here
    assert any("could not read CronJob monsoon-kc's events" in s and "not in a pod" in s for s in said)


def test_the_image_holds_monsoons_runtime_dependencies_and_prunes_what_no_run_loads():
    dists = selfimage.runtime_distributions()
    assert {"pytest", "pyyaml", "psycopg", "pyarrow", "pluggy"} <= set(dists)
    assert not {"mypy", "ruff", "kubernetes", "import-linter", "monsoon"} & set(dists)
    prune = selfimage._PRUNE
    for rel in ("numpy/_core/tests/test_x.py", "pyarrow/include/arrow/api.h", "pyarrow/libarrow_flight.so.2600",
                "pyarrow/_flight.cpython-311-x86_64-linux-gnu.so", "pyarrow/libarrow_python_flight.so",
                "x/__pycache__/y.cpython-311.pyc", "pydantic/main.pyi"):
        assert prune.search(rel), rel
    for rel in ("pyarrow/libarrow.so.2600", "pyarrow/parquet/core.py", "numpy/testing/__init__.py",
                "pytest/__init__.py"):
        assert not prune.search(rel), rel


def test_the_images_tag_follows_its_files(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("1")
    b.write_text("2")
    files = [("x/a", str(a), None), ("x/b", str(b), None), ("x/l", None, "a")]
    d1 = selfimage.digest(files)
    assert re.fullmatch(r"[0-9a-f]{12}", d1) and selfimage.digest(list(reversed(files))) == d1
    time.sleep(0.01)
    b.write_text("22")
    assert selfimage.digest(files) != d1


def test_the_cli_refuses_an_install_with_nowhere_for_the_history_and_an_uninstall_elsewhere(capsys):
    from monsoon.cli import main
    assert main(["schedule", "--target", "kubernetes", "--install", "--every", "1m", "--name", "kc"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--runs-hostpath" in err and "--history-secret" in err
    assert main(["schedule", "--uninstall", "--name", "kc"]) == 2
    assert "--uninstall is for --target kubernetes" in capsys.readouterr().err
    assert main(["schedule", "--target", "kubernetes", "--name", "kc"]) == 2
    assert "give --every INTERVAL or --cron EXPR" in capsys.readouterr().err


def test_the_cli_prints_the_account_role_binding_and_cronjob_as_one_yaml_stream(capsys):
    import yaml
    from monsoon.cli import main
    assert main(["schedule", "--target", "kubernetes", "--every", "30m", "--name", "kc", "--image", "img:1",
                 "--runs-hostpath", "/data/runs", "--", "-m", "chaos"]) == 0
    docs = list(yaml.safe_load_all(capsys.readouterr().out))
    assert [d["kind"] for d in docs] == ["ServiceAccount", "Role", "RoleBinding", "CronJob"]
    cj = docs[-1]
    assert cj["spec"]["schedule"] == "*/30 * * * *"
    assert cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["serviceAccountName"] == "monsoon-kc"
    assert cj["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["command"][-2:] == ["-m", "chaos"]
