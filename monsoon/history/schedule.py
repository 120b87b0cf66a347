"""Scheduled runs: ``monsoon schedule --every 6h|--cron EXPR -- <pytest args>``.

Renders (and with ``--install`` installs under ``--root``, ``/`` by default) a systemd timer + service pair or a
crontab line (``/etc/cron.d``) for one host, and a Kubernetes ``batch/v1`` CronJob (``concurrencyPolicy:
Forbid``, ``startingDeadlineSeconds``, history limits) whose pod runs the same command. Each of them runs
``monsoon scheduled-run`` (:func:`scheduled_run`), which is where the local concurrency policy lives: a lock
per schedule. A run that finds the previous one still running does not start and is recorded in the history as
``skipped`` with the reason; a run that starts more than ``--deadline`` seconds after its due time (the machine
was off or asleep, systemd's ``Persistent=true`` catching up) is recorded as ``missed``.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import shlex
import socket
import ssl
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable

from monsoon.history.record import git_commit, host_class, record_not_run
from monsoon.history.store import EXPERIMENT, HistoryStore, Row, default_location
from monsoon import options as opt

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$")
_EVERY = re.compile(r"^\s*([0-9]+)\s*([mhd])\s*$")
_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))
_DOW = ("Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
ENV_CRONJOB = "MONSOON_SCHEDULE_CRONJOB"     # set in the CronJob's pod: its CronJob's name
SKIP_REASON = "JobAlreadyActive"             # the CronJob controller's event when Forbid skips a firing
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class ScheduleError(ValueError):
    """A schedule that can't be rendered (one line: what and why)."""


def check_name(name: str) -> str:
    if not _NAME.match(name or ""):
        raise ScheduleError(f"--name {name!r}: lower-case letters, digits and '-', at most 42 characters "
                            "(it names a systemd unit and a Kubernetes CronJob)")
    return name


def every_to_cron(every: str) -> str:
    """``15m``, ``6h``, ``1d`` -> a cron expression firing at those multiples (a divisor of the hour or day)."""
    m = _EVERY.match(every or "")
    if not m:
        raise ScheduleError(f"--every {every!r}: give minutes, hours or days, e.g. 30m, 6h, 1d")
    n, unit = int(m.group(1)), m.group(2)
    if unit == "m" and n in (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30):
        return f"*/{n} * * * *" if n > 1 else "* * * * *"
    if unit == "m" and n == 60 or unit == "h" and n == 1:
        return "0 * * * *"
    if unit == "h" and n in (2, 3, 4, 6, 8, 12):
        return f"0 */{n} * * *"
    if unit == "h" and n == 24 or unit == "d" and n == 1:
        return "0 0 * * *"
    raise ScheduleError(f"--every {every!r}: must divide an hour (minutes) or a day (hours), or be 1d; "
                        "use --cron for anything else")


def _field(text: str, lo: int, hi: int, what: str) -> set[int]:
    out: set[int] = set()
    for part in text.split(","):
        step = 1
        if "/" in part:
            part, s = part.split("/", 1)
            if not s.isdigit() or int(s) == 0:
                raise ScheduleError(f"cron {what}: bad step {s!r}")
            step = int(s)
        if part == "*":
            a, b = lo, hi
        elif "-" in part:
            x, y = part.split("-", 1)
            if not (x.isdigit() and y.isdigit()):
                raise ScheduleError(f"cron {what}: bad range {part!r}")
            a, b = int(x), int(y)
        elif part.isdigit():
            a = b = int(part)
            if step > 1:
                b = hi
        else:
            raise ScheduleError(f"cron {what}: {part!r} is not a number, range, list or */step")
        if not (lo <= a <= b <= hi):
            raise ScheduleError(f"cron {what}: {part!r} is outside {lo}-{hi}")
        out.update(range(a, b + 1, step))
    return out


def parse_cron(expr: str) -> tuple[set[int], ...]:
    """A five-field cron expression (numbers, ranges, lists, steps) -> the sets of each field."""
    parts = (expr or "").split()
    if len(parts) != 5:
        raise ScheduleError(f"--cron {expr!r}: five fields (minute hour day-of-month month day-of-week)")
    sets = tuple(_field(p, lo, hi, what) for p, (what, lo, hi) in zip(parts, _FIELDS))
    dow = {d % 7 for d in sets[4]}
    return sets[:4] + (dow,)


def previous_fire(expr: str, now: float, horizon_days: int = 8) -> float | None:
    """The newest time <= ``now`` (local time, as cron and systemd read it) the expression fires, looking back at
    most ``horizon_days`` (None past that)."""
    minute, hour, dom, month, dow = parse_cron(expr)
    parts = expr.split()
    dom_any, dow_any = parts[2] == "*", parts[4] == "*"
    t = datetime.fromtimestamp(now).replace(second=0, microsecond=0)
    for _ in range(horizon_days * 1440):
        day_ok = (t.day in dom) if dow_any else ((t.isoweekday() % 7) in dow) if dom_any else \
            (t.day in dom or (t.isoweekday() % 7) in dow)    # cron: both restricted = either matches
        if t.minute in minute and t.hour in hour and t.month in month and day_ok:
            return t.timestamp()
        t -= timedelta(minutes=1)
    return None


def _systemd_field(text: str, dow: bool = False) -> str:
    out = []
    for part in text.split(","):
        if part == "*":
            return "*"
        if part.startswith("*/"):
            part = "0" + part[1:] if not dow else part
        part = part.replace("-", "..")
        if dow:
            part = "..".join(_DOW[int(x)] for x in part.split("..")) if "/" not in part else part
        out.append(part)
    return ",".join(out)


def cron_to_oncalendar(expr: str) -> str:
    """A cron expression as systemd's ``OnCalendar=`` (``0 */6 * * *`` -> ``*-*-* 0/6:0:00``)."""
    parse_cron(expr)
    m, h, dom, mon, dow = expr.split()
    if "/" in dow:
        raise ScheduleError(f"--cron {expr!r}: a step in day-of-week has no systemd equivalent; list the days")
    cal = f"*-{_systemd_field(mon)}-{_systemd_field(dom)} {_systemd_field(h)}:{_systemd_field(m)}:00"
    return (f"{_systemd_field(dow, dow=True)} " if dow != "*" else "") + cal


def run_command(name: str, pytest_args: list[str], *, deadline: int, cron: str, monsoon: str = "monsoon",
                runs_dir: str | None = None) -> list[str]:
    cmd = [monsoon, "scheduled-run", "--name", name, "--cron", cron, "--deadline", str(deadline)]
    if runs_dir:
        cmd += ["--runs-dir", runs_dir]
    return cmd + ["--", *pytest_args]


def systemd_units(name: str, command: list[str], cron: str, workdir: str) -> dict[str, str]:
    """``monsoon-<name>.service`` and ``monsoon-<name>.timer``."""
    service = (f"[Unit]\nDescription=monsoon scheduled run {name}\n\n[Service]\nType=oneshot\n"
               f"WorkingDirectory={workdir}\nExecStart={shlex.join(command).replace('%', '%%')}\n")   # % is a specifier
    timer = (f"[Unit]\nDescription=monsoon scheduled run {name} ({cron})\n\n[Timer]\n"
             f"OnCalendar={cron_to_oncalendar(cron)}\nPersistent=true\nUnit=monsoon-{name}.service\n\n"
             f"[Install]\nWantedBy=timers.target\n")
    return {f"monsoon-{name}.service": service, f"monsoon-{name}.timer": timer}


def crontab_line(name: str, command: list[str], cron: str, workdir: str, user: str = "root") -> str:
    """One ``/etc/cron.d`` line (with the user field)."""
    line = f"cd {shlex.quote(workdir)} && {shlex.join(command)}".replace("%", "\\%")   # cron reads % as a newline
    return f"# monsoon scheduled run {name}\n{cron} {user} {line}\n"


def cronjob(name: str, command: list[str], cron: str, *, image: str, namespace: str, deadline: int,
            history: int = 3, history_secret: str | None = None, runs_hostpath: str | None = None,
            service_account: str | None = None) -> dict:
    """A ``batch/v1`` CronJob: one pod per firing running ``command``; Forbid, a starting deadline, history limits.
    ``history_secret``: a Secret whose key ``url`` is the shared history's postgresql:// URL (MONSOON_HISTORY_URL).
    ``runs_hostpath``: the node's directory mounted at the same path (the runs and a SQLite history on the node).
    ``service_account``: the pod's (:func:`rbac`: it reads the CronJob's events to record Forbid's skips)."""
    env: list[dict[str, Any]] = [{"name": "HOME", "value": "/tmp"}, {"name": "MPLCONFIGDIR", "value": "/tmp/mpl"},
                                 {"name": ENV_CRONJOB, "value": f"monsoon-{name}"}]
    if history_secret:
        env.append({"name": "MONSOON_HISTORY_URL",
                    "valueFrom": {"secretKeyRef": {"name": history_secret, "key": "url"}}})
    container: dict[str, Any] = {"name": "monsoon", "image": image, "command": command, "workingDir": "/monsoon",
                                 "env": env}
    pod: dict[str, Any] = {"restartPolicy": "Never", "containers": [container]}
    if runs_hostpath:
        container["volumeMounts"] = [{"name": "runs", "mountPath": runs_hostpath}]
        pod["volumes"] = [{"name": "runs", "hostPath": {"path": runs_hostpath, "type": "DirectoryOrCreate"}}]
    if service_account:
        pod["serviceAccountName"] = service_account
    if image.startswith("monsoon.local/"):
        container["imagePullPolicy"] = "Never"   # made on this machine and imported: there is no registry to ask
    labels = {"app.kubernetes.io/managed-by": "monsoon", "app.kubernetes.io/component": "scheduled-run",
              "monsoon.io/schedule": name}
    return {
        "apiVersion": "batch/v1", "kind": "CronJob",
        "metadata": {"name": f"monsoon-{name}", "namespace": namespace, "labels": labels},
        "spec": {
            "schedule": cron,
            "concurrencyPolicy": "Forbid",          # a firing while the last run is still going is skipped
            "startingDeadlineSeconds": deadline,     # a firing missed by more than this is not started late
            "successfulJobsHistoryLimit": history,
            "failedJobsHistoryLimit": history,
            "jobTemplate": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "backoffLimit": 0,               # a chaos run is not retried on its own
                    "template": {"metadata": {"labels": dict(labels)}, "spec": pod},
                },
            },
        },
    }


def rbac(name: str, namespace: str) -> list[dict]:
    """The scheduled pod's ServiceAccount, and a Role (bound to it) that reads events: each run records the
    firings Kubernetes skipped under Forbid (:func:`record_kube_skips`)."""
    meta = {"name": f"monsoon-{name}", "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "monsoon", "monsoon.io/schedule": name}}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": dict(meta)},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": dict(meta),
         "rules": [{"apiGroups": [""], "resources": ["events"], "verbs": ["get", "list"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": dict(meta),
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": meta["name"]},
         "subjects": [{"kind": "ServiceAccount", "name": meta["name"], "namespace": namespace}]},
    ]


# ------------------------------------------------------------------ Forbid in a cluster: the controller's skips

def _k8s_time(text: str | None) -> float | None:
    if not text:
        return None
    return datetime.strptime(text.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S%z").timestamp()


def kube_skips(events: list[dict], cronjob_name: str) -> list[tuple[str, float, str]]:
    """(history run id, time, reason) per event in which the CronJob controller did not start a firing because
    the last Job was still running (reason ``JobAlreadyActive``). Kubernetes folds repeats into one event with a
    ``count``: one row per event, its message saying how many firings and between when."""
    out = []
    for e in events:
        obj = e.get("involvedObject") or {}
        if e.get("reason") != SKIP_REASON or obj.get("name") != cronjob_name or obj.get("kind", "CronJob") != "CronJob":
            continue
        first = _k8s_time(e.get("firstTimestamp") or e.get("eventTime"))
        last = _k8s_time(e.get("lastTimestamp")) or first
        if last is None:
            continue
        n = int(e.get("count") or 1)
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(first or last))
        span = f"{n} firings, {when} to {time.strftime('%H:%M:%S', time.localtime(last))}" if n > 1 else \
            f"the firing at {when}"
        uid = (e.get("metadata") or {}).get("uid") or f"{first or last:.0f}"
        out.append((f"{cronjob_name}-skipped-{uid[:13]}", last,
                    f"Kubernetes skipped {span}: the previous Job of CronJob {cronjob_name} was still running; "
                    f"concurrencyPolicy Forbid (event {SKIP_REASON}: {e.get('message', '')})"))
    return out


def incluster_events(cronjob_name: str, sa: Path = SA_DIR, timeout: float = 10) -> list[dict]:
    """The events about CronJob ``cronjob_name`` in the pod's namespace, through the API server with the pod's
    service-account token (no Kubernetes client in the image: the standard library's HTTPS)."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    if not host or not (sa / "token").is_file():
        raise ScheduleError("not in a pod with a service account (no KUBERNETES_SERVICE_HOST or token)")
    ns = (sa / "namespace").read_text().strip()
    sel = urllib.parse.quote(f"involvedObject.name={cronjob_name},involvedObject.kind=CronJob")
    host = f"[{host}]" if ":" in host else host
    req = urllib.request.Request(f"https://{host}:{port}/api/v1/namespaces/{ns}/events?fieldSelector={sel}",
                                 headers={"Authorization": f"Bearer {(sa / 'token').read_text().strip()}"})
    ctx = ssl.create_default_context(cafile=str(sa / "ca.crt"))
    with urllib.request.urlopen(req, timeout=timeout, context=ctx) as resp:
        return json.load(resp).get("items", [])


def record_kube_skips(location: str, schedule: str, events: list[dict], cronjob_name: str) -> int:
    """Record (upsert: an event's count grows) each of ``events``' Forbid skips as a ``skipped`` row."""
    skips = kube_skips(events, cronjob_name)
    if skips:
        with HistoryStore(location) as store:
            for run_id, t, why in skips:
                record_not_run(store, run_id, schedule, "skipped", why, now=t)
    return len(skips)


def record_firing(location: str, run_id: str, schedule: str, rc: int, started: float, ended: float,
                  pytest_args: list[str]) -> None:
    """A firing that ran, as a row of its own (stack ``-``, the schedule's name): in a cluster the pod and its log
    go with the Job's history limit, and the history is what stays."""
    why = f"pytest exit {rc}: {shlex.join(pytest_args)}"
    with HistoryStore(location) as store:
        store.upsert([Row(run_id=run_id, stack="-", experiment=schedule, check_name=EXPERIMENT,
                          verdict="pass" if rc == 0 else "fail", status="ran", message=why,
                          host=socket.gethostname(), host_class=host_class(), cpu_count=os.cpu_count(),
                          git_commit=git_commit(), started_at=started, ended_at=ended, duration_s=ended - started,
                          recorded_at=ended)])


def _sync_kube_skips(location: str, name: str, log: Callable[[str], None]) -> None:
    cj = os.environ.get(ENV_CRONJOB)
    if not cj:
        return
    try:
        n = record_kube_skips(location, name, incluster_events(cj), cj)
    except (OSError, ValueError, ScheduleError) as e:      # urllib's errors are OSErrors; a bad answer, ValueError
        log(f"monsoon scheduled-run {name}: could not read CronJob {cj}'s events ({e}): Forbid's skips not recorded")
        return
    if n:
        log(f"monsoon scheduled-run {name}: recorded {n} firing(s) Kubernetes skipped under Forbid")


def install(root: Path, name: str, command: list[str], cron: str, workdir: str, kind: str) -> list[Path]:
    """Write the unit files (``kind`` systemd) or the cron.d file (``kind`` cron) under ``root``; on the real root
    also enable the timer."""
    root = Path(root)
    written = []
    if kind == "systemd":
        d = root / "etc/systemd/system"
        d.mkdir(parents=True, exist_ok=True)
        for fname, text in systemd_units(name, command, cron, workdir).items():
            (d / fname).write_text(text)
            written.append(d / fname)
        if root == Path("/"):
            subprocess.run(["systemctl", "daemon-reload"], check=True)
            subprocess.run(["systemctl", "enable", "--now", f"monsoon-{name}.timer"], check=True)
    else:
        d = root / "etc/cron.d"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"monsoon-{name}").write_text(crontab_line(name, command, cron, workdir))
        written.append(d / f"monsoon-{name}")
    return written


def scheduled_run(name: str, pytest_args: list[str], runs_dir: Path, *, cron: str | None = None,
                  deadline: int = 600, now: Callable[[], float] = time.time,
                  run: Callable[[list[str]], int] | None = None, log: Callable[[str], None] = print) -> int:
    """One firing of a schedule: missed (past its deadline) or skipped (the last one still running) are recorded
    in the history and return 0; otherwise pytest runs with ``pytest_args`` under the schedule's lock."""
    runs_dir = Path(runs_dir)
    runs_dir.mkdir(parents=True, exist_ok=True)
    t = now()
    run_id = time.strftime("%Y%m%d-%H%M%S", time.localtime(t)) + f"-{name}"
    due = previous_fire(cron, t) if cron else None
    if due is not None and t - due > deadline:
        why = (f"started {t - due:.0f} s after its due time {time.strftime('%Y-%m-%d %H:%M', time.localtime(due))}"
               f", past its deadline of {deadline} s")
        with HistoryStore(default_location(runs_dir)) as store:
            record_not_run(store, run_id + "-missed", name, "missed", why, now=t)
        log(f"monsoon scheduled-run {name}: missed: {why}")
        return 0
    lock_path = runs_dir / f".schedule-{name}.lock"
    fh = open(lock_path, "a+")
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder, until = "", time.monotonic() + 2   # the holder writes its pid just after taking the lock
            while True:
                fh.seek(0)
                holder = fh.read().strip()
                if holder or time.monotonic() > until:
                    break
                time.sleep(0.02)
            holder = holder or "?"
            why = f"another run of schedule {name} is still running ({holder}); concurrency policy Forbid"
            with HistoryStore(default_location(runs_dir)) as store:
                record_not_run(store, run_id + f"-skipped-{os.getpid()}", name, "skipped", why, now=t)
            log(f"monsoon scheduled-run {name}: skipped: {why}")
            return 0
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t))}")
        fh.flush()
        location = default_location(runs_dir)
        _sync_kube_skips(location, name, log)
        cmd = [sys.executable, "-m", "pytest", opt.RUNS_DIR, str(runs_dir), *pytest_args]
        log(f"monsoon scheduled-run {name}: {shlex.join(cmd)}")
        rc = (run or subprocess.call)(cmd)
        if os.environ.get(ENV_CRONJOB):
            record_firing(location, run_id, name, rc, t, now(), pytest_args)
            _sync_kube_skips(location, name, log)        # the firings skipped while this one ran
        return rc
    finally:
        fh.close()   # releases the lock
