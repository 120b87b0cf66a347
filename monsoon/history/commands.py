"""The ``monsoon history``, ``signoff``, ``schedule`` and ``scheduled-run`` commands (argparse), registered by
:mod:`monsoon.cli` the way ``calibrate`` is."""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import yaml

from monsoon.history import html as history_html
from monsoon.history import schedule as sched
from monsoon.history import signoff as so
from monsoon.history.store import HistoryStore, default_location
from monsoon.history.views import as_json, as_text
from monsoon import settings
from monsoon.paths import REPO
from monsoon.spec.yamlio import SpecError

EXAMPLE_POLICY = REPO / "docs" / "signoff.yaml"


def runs_dir(arg: Path | None) -> Path:
    return settings.runs_dir(arg)


def _runs_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs-dir", type=Path, default=None,
                   help="the runs directory whose history.sqlite to read (default: MONSOON_RUNS_DIR or runs/); "
                   "MONSOON_HISTORY_URL=postgresql://... reads a shared Postgres instead")


def add_history(sub) -> None:
    h = sub.add_parser("history", help="the run history: verdict strips, figure trends, flaky checks, first failures",
                       description="Reads the history every session and `monsoon analyze` write (one row per run x "
                       "stack x experiment x check): per stack x experiment the last N verdicts as a strip (P pass, "
                       "F fail, ? unknown, s skipped, m missed) and the trend of recovery_s, peak_lag, acked_lost, "
                       "calibrated capacity and error budget spent; checks whose verdict flipped with no change of "
                       "commit or stack file (flaky); and, for each check failing now, the run (and commit) where "
                       "it started failing. --keep-days prunes instead.")
    _runs_arg(h)
    h.add_argument("--last", type=int, default=20, help="runs per stack x experiment (default 20)")
    h.add_argument("--stack", default=None, help="only this stack")
    h.add_argument("--experiment", default=None, help="only this experiment")
    h.add_argument("--json", action="store_true", help="print JSON instead of text")
    h.add_argument("--html", nargs="?", const="", default=None, metavar="FILE",
                   help="write the history page with trend plots (default <runs>/history.html)")
    h.add_argument("--keep-days", type=float, default=None,
                   help="prune: delete the rows of runs that started more than this many days ago")
    h.add_argument("--prune-run-dirs", action="store_true", help="with --keep-days: delete those run directories too")


def history_cli(args) -> int:
    rd = runs_dir(args.runs_dir)
    with HistoryStore(default_location(rd)) as store:
        if args.keep_days is not None:
            if args.keep_days < 0:
                print("monsoon history: --keep-days must be >= 0", file=sys.stderr)
                return 2
            pruned = store.prune(time.time() - args.keep_days * 86400)
            for run_id, d in pruned:
                gone = ""
                if args.prune_run_dirs and d and Path(d).is_dir() and Path(d).resolve().parent == rd.resolve():
                    shutil.rmtree(d)
                    gone = f" (deleted {d})"
                print(f"pruned run {run_id}{gone}")
            print(f"monsoon history: pruned {len(pruned)} run(s) older than {args.keep_days:g} days")
            return 0
        rows = store.rows(stack=args.stack, experiment=args.experiment)
    if args.html is not None:
        out = history_html.write(Path(args.html) if args.html else rd / history_html.HISTORY_PAGE, rows, args.last)
        print(f"wrote {out}", file=sys.stderr)
    if args.json:
        print(json.dumps(as_json(rows, args.last), indent=2, default=str))
    elif args.html is None:
        print(as_text(rows, args.last), end="")
    return 0


def add_signoff(sub) -> None:
    s = sub.add_parser("signoff", help="GO / NO-GO / EXPIRED per item of a sign-off policy, from the run history",
                       description="Judges signoff.yaml against the run history (not the last session): per item x "
                       "stack GO (newest run passed, within max_age), EXPIRED (passed, too long ago) or NO-GO "
                       "(failed, unknown or never run), the evidence (run id, date, figures, report), a weighted "
                       "resilience score (100 GO, 75 expired, 50 failed/unknown, 0 never run) and how long a GO is "
                       "valid. Exit 0 GO, 1 NO-GO, 3 EXPIRED, 2 a bad policy.")
    _runs_arg(s)
    s.add_argument("--policy", type=Path, default=None,
                   help=f"the policy file (default: ./signoff.yaml, else {EXAMPLE_POLICY.relative_to(REPO)})")
    s.add_argument("--html", type=Path, default=None, help="also write the checklist as HTML here")
    s.add_argument("--markdown", type=Path, default=None, help="also write the checklist as Markdown here")
    s.add_argument("--now", type=float, default=None, help=argparse.SUPPRESS)   # the clock, for tests


def signoff_cli(args) -> int:
    path = args.policy or (Path("signoff.yaml") if Path("signoff.yaml").exists() else EXAMPLE_POLICY)
    try:
        policy = so.load_policy(path)
    except SpecError as e:
        print(str(e), file=sys.stderr)
        return 2
    with HistoryStore(default_location(runs_dir(args.runs_dir))) as store:
        rows = store.rows()
    result = so.judge(policy, rows, now=args.now)
    md = so.markdown(result)
    print(md, end="")
    if args.markdown:
        args.markdown.write_text(md)
    if args.html:
        args.html.write_text(so.to_html(result))
    return result.exit_code


def add_schedule(sub) -> None:
    s = sub.add_parser("schedule", help="render (or --install) a systemd timer, a crontab line or a Kubernetes "
                       "CronJob that runs pytest on a schedule",
                       description="Renders what runs `monsoon scheduled-run -- PYTEST_ARGS` on a schedule: a systemd "
                       "service + timer pair (Persistent=true), or a /etc/cron.d line, or a Kubernetes CronJob "
                       "(concurrencyPolicy: Forbid, startingDeadlineSeconds, history limits). --install writes the "
                       "systemd units or the cron.d file under --root (default /; on / the timer is enabled). "
                       "Locally a lock per schedule plays Forbid: a firing that finds the last run still going is "
                       "recorded in the history as skipped; one that starts past its deadline, as missed.")
    when = s.add_mutually_exclusive_group(required=True)
    when.add_argument("--every", help="an interval dividing an hour or a day: 15m, 6h, 1d")
    when.add_argument("--cron", help="a five-field cron expression, e.g. '0 2 * * 1-5'")
    s.add_argument("--name", default="chaos", help="the schedule's name (systemd unit, CronJob, lock); default chaos")
    s.add_argument("--target", choices=("systemd", "cron", "kubernetes"), default="systemd")
    s.add_argument("--deadline", type=int, default=600,
                   help="startingDeadlineSeconds: a firing this late is missed, not started (default 600)")
    s.add_argument("--history-limit", type=int, default=3, help="CronJob jobs history limits (default 3)")
    s.add_argument("--image", default=None, help="kubernetes: a container image with monsoon and the project")
    s.add_argument("--namespace", default="default", help="kubernetes: the CronJob's namespace")
    s.add_argument("--history-secret", default=None,
                   help="kubernetes: a Secret whose key `url` is MONSOON_HISTORY_URL (a shared Postgres history)")
    s.add_argument("--runs-dir", default=None, help="the scheduled runs' runs directory (default: the project's runs/)")
    s.add_argument("--install", action="store_true", help="install (systemd or cron) instead of printing")
    s.add_argument("--root", type=Path, default=Path("/"), help="with --install: write under this root (tests)")
    s.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then the pytest arguments, e.g. -- -m chaos")


def schedule_cli(args) -> int:
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    try:
        name = sched.check_name(args.name)
        cron = sched.every_to_cron(args.every) if args.every else (sched.parse_cron(args.cron) and args.cron)
        if args.deadline <= 0:
            raise sched.ScheduleError(f"--deadline {args.deadline}: must be > 0 seconds")
        if args.target == "kubernetes":
            if not args.image:
                raise sched.ScheduleError("--target kubernetes needs --image")
            if args.install:
                raise sched.ScheduleError("--install is for systemd and cron; apply the CronJob with kubectl")
            cmd = sched.run_command(name, pytest_args, deadline=args.deadline, cron=cron,
                                    runs_dir=args.runs_dir or "/monsoon/runs")
            obj = sched.cronjob(name, cmd, cron, image=args.image, namespace=args.namespace, deadline=args.deadline,
                                history=args.history_limit, history_secret=args.history_secret)
            sys.stdout.write(yaml.safe_dump(obj, sort_keys=False))
            return 0
        monsoon = shutil.which("monsoon") or f"{sys.executable} -m monsoon.cli"
        cmd = sched.run_command(name, pytest_args, deadline=args.deadline, cron=cron, runs_dir=args.runs_dir)
        cmd = monsoon.split() + cmd[1:]
        if args.install:
            for p in sched.install(args.root, name, cmd, cron, str(REPO), args.target):
                print(f"wrote {p}")
            return 0
        if args.target == "systemd":
            for fname, text in sched.systemd_units(name, cmd, cron, str(REPO)).items():
                print(f"# {fname}\n{text}")
        else:
            print(sched.crontab_line(name, cmd, cron, str(REPO)), end="")
        return 0
    except sched.ScheduleError as e:
        print(f"monsoon schedule: {e}", file=sys.stderr)
        return 2


def add_scheduled_run(sub) -> None:
    s = sub.add_parser("scheduled-run", help="one firing of a schedule (what `monsoon schedule` installs runs)")
    s.add_argument("--name", default="chaos")
    s.add_argument("--cron", default=None, help="the schedule, to tell a late (missed) firing")
    s.add_argument("--deadline", type=int, default=600)
    s.add_argument("--runs-dir", type=Path, default=None)
    s.add_argument("pytest_args", nargs=argparse.REMAINDER)


def scheduled_run_cli(args) -> int:
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    try:
        return sched.scheduled_run(sched.check_name(args.name), pytest_args, runs_dir(args.runs_dir), cron=args.cron,
                                   deadline=args.deadline)
    except sched.ScheduleError as e:
        print(f"monsoon scheduled-run: {e}", file=sys.stderr)
        return 2
