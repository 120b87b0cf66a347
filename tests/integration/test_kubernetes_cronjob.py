"""`monsoon schedule --target kubernetes --install` on monsoon's cluster: the CronJob fires, its pod (monsoon's own
image, made from this machine's Python and checkout) runs `monsoon scheduled-run`, and the run lands in the
history (SQLite on a hostPath). A firing due while that run still goes is skipped by ``concurrencyPolicy: Forbid``
(the controller's ``JobAlreadyActive`` event), and the run records that skip in the history as it ends.
`--uninstall` removes the CronJob, its Jobs and pods, and its ServiceAccount/Role/RoleBinding.

Lean on purpose (< ~90 s with the image cached): the first firing is the controller's own catch-up of a missed
schedule (the test sets ``status.lastScheduleTime`` a minute back, as if the controller had been down for the last
due time: it starts that firing at once, within ``startingDeadlineSeconds``), so there is no wait for a first minute
boundary; the second firing, which Forbid skips while the first run holds, is the same catch-up once more (not
the clock's next minute, 0-60 s away)."""
from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timezone

import pytest

from monsoon.history import schedule as sched
from monsoon.paths import REPO
from monsoon.stack.pods import ClusterUnavailable, Kube, cluster_for_session
from tests.integration.helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.kubernetes]
NAME, NS = "kcron-story", "default"
CJ = f"monsoon-{NAME}"
HOLD = """\
import os, socket, time
def test_hold():
    d = os.path.dirname(os.path.abspath(__file__))
    open(os.path.join(d, "started-" + socket.gethostname()), "w").close()
    t = time.time()
    while not os.path.exists(os.path.join(d, "release")) and time.time() - t < 150:
        time.sleep(0.5)
"""


@pytest.fixture(scope="module")
def kube_cluster(request):
    try:
        return cluster_for_session(request.config)
    except ClusterUnavailable as e:
        pytest.skip(str(e))


def monsoon(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "monsoon.cli", *args], capture_output=True, text=True,
                          timeout=600, cwd=REPO, env=dict(os.environ))


def test_the_cronjob_fires_runs_monsoon_records_the_run_and_forbid_skips_the_next(kube_cluster, tmp_path):
    from kubernetes import client as k
    kube = Kube()
    batch = k.BatchV1Api(kube.api_client)
    runs = tmp_path / "runs"
    runs.mkdir()
    (runs / "test_hold.py").write_text(HOLD)
    t0 = time.monotonic()
    try:
        r = monsoon("schedule", "--target", "kubernetes", "--install", "--every", "1m", "--name", NAME,
                    "--namespace", NS, "--runs-hostpath", str(runs), "--",
                    "-q", "-p", "no:cacheprovider", str(runs / "test_hold.py"))
        assert r.returncode == 0, r.stderr
        t_install = time.monotonic() - t0
        assert f"CronJob {NS}/{CJ}" in r.stderr
        # the controller's catch-up: the last due minute counts as missed, so it starts that firing now
        now = datetime.now(timezone.utc).replace(second=0, microsecond=0)
        back = now.timestamp() - 60
        batch.patch_namespaced_cron_job_status(CJ, NS, {"status": {"lastScheduleTime": datetime.fromtimestamp(
            back, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}})

        def jobs():
            return [j for j in batch.list_namespaced_job(NS, label_selector=f"monsoon.io/schedule={NAME}").items
                    if any(o.kind == "CronJob" and o.name == CJ for o in j.metadata.owner_references or [])]
        first = wait_for(lambda: jobs() or None, timeout=60, what="the CronJob's first Job")
        t_fired = time.monotonic() - t0
        [job] = first
        wait_for(lambda: list(runs.glob("started-*")) or None, timeout=120, what="the scheduled pytest to start")
        t_running = time.monotonic() - t0
        # a second firing due while the first run holds: the same catch-up again (the last due time marked
        # missed), so there is no wait for the clock's next minute (which would do the same, 0-60 s later).
        # The controller finds the first Job active and, under Forbid, starts none
        batch.patch_namespaced_cron_job_status(CJ, NS, {"status": {"lastScheduleTime": datetime.fromtimestamp(
            back, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}})
        skip = wait_for(lambda: [e for e in kube.core.list_namespaced_event(
            NS, field_selector=f"involvedObject.name={CJ}").items if e.reason == sched.SKIP_REASON] or None,
            timeout=75, what="the controller's JobAlreadyActive event")
        t_skipped = time.monotonic() - t0
        assert [j.metadata.name for j in jobs()] == [job.metadata.name]      # the skipped firing made no Job
        (runs / "release").write_text("")
        done = wait_for(lambda: (j := batch.read_namespaced_job(job.metadata.name, NS)).status.succeeded or
                        (j.status.failed and pytest.fail(f"the scheduled Job failed: {j.status}")),
                        timeout=60, what="the scheduled Job to complete")
        assert done == 1
        t_done = time.monotonic() - t0
        assert len(list(runs.glob("started-*"))) == 1                        # one run of the scenario, no more
        with sqlite3.connect(runs / "history.sqlite") as db:
            rows = db.execute("SELECT status, verdict, experiment, message FROM monsoon_history "
                              "ORDER BY status").fetchall()
        ran = [x for x in rows if x[0] == "ran"]
        skipped = [x for x in rows if x[0] == "skipped"]
        assert [(s, v, e) for s, v, e, _ in ran] == [("ran", "pass", NAME)], rows
        assert "pytest exit 0" in ran[0][3]
        assert skipped and all(e == NAME and "JobAlreadyActive" in m and "Forbid" in m for _, _, e, m in skipped), \
            rows
        assert skip[0].count >= 1
        print(f"\nkcron: install (image cached or built + imported) {t_install:.1f}s; first Job {t_fired:.1f}s; "
              f"pytest running in the pod {t_running:.1f}s; Forbid skip {t_skipped:.1f}s; Job complete "
              f"{t_done:.1f}s; history rows {rows}")
    finally:
        u = monsoon("schedule", "--target", "kubernetes", "--uninstall", "--name", NAME, "--namespace", NS)
    assert u.returncode == 0, u.stderr
    assert f"deleted CronJob {NS}/{CJ}" in u.stderr
    for read in (batch.read_namespaced_cron_job, kube.core.read_namespaced_service_account):
        with pytest.raises(k.ApiException) as e:
            read(CJ, NS)
        assert e.value.status == 404
    wait_for(lambda: not kube.pods(NS, f"monsoon.io/schedule={NAME}") and not batch.list_namespaced_job(
        NS, label_selector=f"monsoon.io/schedule={NAME}").items, timeout=60, what="the Jobs and pods to go")
    print(textwrap.shorten(f"kcron: uninstalled in {time.monotonic() - t0:.1f}s from the start", 200))
