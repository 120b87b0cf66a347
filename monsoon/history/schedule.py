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
import os
import re
import shlex
import subprocess
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Callable

from monsoon.history.record import record_not_run
from monsoon.history.store import HistoryStore, default_location

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,40}[a-z0-9])?$")
_EVERY = re.compile(r"^\s*([0-9]+)\s*([mhd])\s*$")
_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12), ("day of week", 0, 7))
_DOW = ("Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


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
            history: int = 3, history_secret: str | None = None) -> dict:
    """A ``batch/v1`` CronJob: one pod per firing running ``command``; Forbid, a starting deadline, history limits.
    ``history_secret``: a Secret whose key ``url`` is the shared history's postgresql:// URL (MONSOON_HISTORY_URL)."""
    container: dict[str, Any] = {"name": "monsoon", "image": image, "command": command, "workingDir": "/monsoon"}
    if history_secret:
        container["env"] = [{"name": "MONSOON_HISTORY_URL",
                             "valueFrom": {"secretKeyRef": {"name": history_secret, "key": "url"}}}]
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
                    "template": {
                        "metadata": {"labels": dict(labels)},
                        "spec": {
                            "restartPolicy": "Never",
                            "containers": [container],
                        },
                    },
                },
            },
        },
    }


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
            fh.seek(0)
            holder = fh.read().strip() or "?"
            why = f"another run of schedule {name} is still running ({holder}); concurrency policy Forbid"
            with HistoryStore(default_location(runs_dir)) as store:
                record_not_run(store, run_id + f"-skipped-{os.getpid()}", name, "skipped", why, now=t)
            log(f"monsoon scheduled-run {name}: skipped: {why}")
            return 0
        fh.seek(0)
        fh.truncate()
        fh.write(f"pid {os.getpid()} since {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t))}")
        fh.flush()
        cmd = [sys.executable, "-m", "pytest", "--monsoon-runs-dir", str(runs_dir), *pytest_args]
        log(f"monsoon scheduled-run {name}: {shlex.join(cmd)}")
        return (run or subprocess.call)(cmd)
    finally:
        fh.close()   # releases the lock
