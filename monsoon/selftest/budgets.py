"""``python -m monsoon.selftest.budgets`` (``make story-budgets``): the reference story under CPU budgets.

For each budget, ``monsoon demo`` runs once (in-memory x10 must FAIL by OOM with acked loss, Kafka x10 must
PASS with lag and no loss). A number of cores is ``MONSOON_SERVICE_CPUS`` for the demo: the stack's services
(Postgres, Kafka, the platform) share that CPU quota, the load generator (pytest) is outside it.
``neighbour``: no quota, beside a busy loop burning one core. Each budget calibrates afresh (its own
``MONSOON_CALIBRATION_DIR``), so x1 is a fraction of the capacity under that budget.

Writes ``budgets.md`` (the table) and ``budgets.json`` to the output directory (default
``runs/budgets-<time>/``), each budget's demo output to ``<budget>/demo.log``. Exit 0 only when the story
was reproduced under every budget; 2 when a budget cannot be applied here (nothing is run)."""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monsoon.cli import DEMO_CASES, story_problems
from monsoon.paths import REPO
from monsoon.rundir import SUMMARY_FILE
from monsoon.settings import RUNS_ENV
from monsoon.stack import cpubudget
from monsoon import options as opt
from monsoon.selftest.neighbour import busy_neighbour

NEIGHBOUR = "neighbour"
DEFAULT = "0.5,1,2,neighbour"
STACKS = ("inmemory", "kafka")
EXPERIMENT = "burst-x10"
HEARTBEAT_S = 60.0
STOP_WAIT_S = 180.0       # a demo told to stop tears its stacks down: give it time before killing it

RUN_DIR_RE = re.compile(r"Run directory: (\S+)")
RUN_ID_RE = re.compile(re.escape(opt.RUN_ID) + r"\s+(\S+)")


@dataclass(frozen=True)
class Budget:
    label: str                  # "0.5", "1", "neighbour"
    cores: float | None         # MONSOON_SERVICE_CPUS; None: no quota
    neighbour: bool = False     # a busy loop burns one core beside the run

    def env(self, base: dict[str, str], cal_dir: Path) -> dict[str, str]:
        """The demo's environment: the quota (or none) and a fresh calibration directory."""
        env = dict(base)
        env.pop(cpubudget.ENV, None)
        if self.cores is not None:
            env[cpubudget.ENV] = self.label
        env["MONSOON_CALIBRATION_DIR"] = str(cal_dir)
        return env


def parse_budgets(text: str) -> list[Budget]:
    """``0.5,1,2,neighbour`` -> budgets; ``none`` is a run with no quota and no neighbour. ValueError if bad."""
    out: list[Budget] = []
    for raw in (x.strip() for x in text.split(",")):
        if not raw:
            continue
        if raw.lower() in (NEIGHBOUR, "neighbor"):
            b = Budget(NEIGHBOUR, None, neighbour=True)
        elif raw.lower() == "none":
            b = Budget("none", None)
        else:
            cores = cpubudget.budget_from_env({cpubudget.ENV: raw})
            b = Budget(f"{cores:g}", cores)
        if b.label in {x.label for x in out}:
            raise ValueError(f"budget {raw!r} is listed twice")
        out.append(b)
    if not out:
        raise ValueError("no budget given (e.g. --budgets 0.5,1,2,neighbour)")
    return out


def run_dir_from_output(lines: list[str], runs: Path) -> Path | None:
    """The demo's run directory: ``Run directory: <dir>`` (a reproduced story; relative: to the checkout),
    else ``runs``/<the ``--monsoon-run-id`` of its first line ``monsoon demo: <cmd>``>."""
    for ln in reversed(lines):
        m = RUN_DIR_RE.search(ln)
        if m:
            return REPO / m.group(1)          # an absolute path stays itself
    run_id = run_id_from_output(lines)
    return runs / run_id if run_id else None


def run_id_from_output(lines: list[str]) -> str | None:
    """The ``--monsoon-run-id <id>`` of the demo's first line ``monsoon demo: <cmd>``."""
    for ln in lines:
        if ln.startswith("monsoon demo:"):
            m = RUN_ID_RE.search(ln)
            if m:
                return m.group(1)
    return None


def _fig(result: dict, check: str, key: str) -> Any:
    for c in result.get("checks", []):
        if c.get("name") == check and key in (c.get("figures") or {}):
            return c["figures"][key]
    return None


def _peak_backlog(result: dict) -> Any:
    """The peak backlog: Kafka consumer lag on a Kafka stack, the platform's queue depth otherwise."""
    for check in ("lag_recovers_within", "lag_bounded"):
        v = _fig(result, check, "peak_lag")
        if v is not None:
            return v
    return (result.get("figures") or {}).get("peak_lag")


def rows_for(summary: dict, experiment: str = EXPERIMENT) -> list[dict]:
    """One row per stack of the story: verdict, how x1 was set, and the check figures."""
    by = {(r.get("stack"), r.get("experiment")): r for r in summary.get("results", [])}
    rows: list[dict[str, Any]] = []
    for stack in STACKS:
        r = by.get((stack, experiment))
        if r is None:
            rows.append({"stack": stack, "experiment": experiment, "verdict": "did not run"})
            continue
        br = r.get("base_rate") or {}
        rows.append({
            "stack": stack, "experiment": experiment, "verdict": r.get("verdict"),
            "base_rate": {k: br.get(k) for k in ("base_rate", "capacity_msg_s", "fraction", "source",
                                                 "calibrated_at", "x1") if k in br or k != "x1"} if br else None,
            "oom_events": _fig(r, "no_oom", "oom_events"),
            "acked_lost": _fig(r, "no_acked_loss", "acked_lost"),
            "acked": _fig(r, "no_acked_loss", "acked"),
            "peak_lag": _fig(r, "lag_recovers_within", "peak_lag"),
            "recovery_s": _fig(r, "lag_recovers_within", "recovery_s"),
            "peak_backlog": _peak_backlog(r),
            "error": r.get("error"),
        })
    return rows


def judge(summary: dict | None, why_none: str = "") -> tuple[bool, list[str]]:
    """(story reproduced, what differs) from a demo's summary.json; None: not reproduced."""
    if summary is None:
        return False, [why_none or "the demo wrote no summary.json"]
    problems = story_problems(summary)
    return not problems, problems


def _num(v: Any, digits: int = 0) -> str:
    if v is None:
        return "-"
    if isinstance(v, (int, float)):
        return f"{v:,.{digits}f}"
    return str(v)


def table(entries: list[dict]) -> str:
    """The markdown table of every budget's rows."""
    head = ("| budget | stack | capacity msg/s | x1 msg/s | peak queue/lag | OOM events | acked lost | verdict "
            "| story reproduced |")
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for e in entries:
        yes = "yes" if e.get("reproduced") else "no"
        rows = e.get("rows") or [{"stack": "-", "verdict": e.get("status", "no summary")}]
        for r in rows:
            br = r.get("base_rate") or {}
            x1 = _num(br.get("base_rate"))
            if br.get("fraction") is not None and x1 != "-":
                x1 += f" ({br['fraction']:g}x)"
            lines.append(f"| {e['label']} | {r['stack']} | {_num(br.get('capacity_msg_s'))} | {x1} "
                         f"| {_num(r.get('peak_backlog'))} | {_num(r.get('oom_events'))} "
                         f"| {_num(r.get('acked_lost'))} | {str(r.get('verdict', '-')).upper()} | {yes} |")
    return "\n".join(lines)


def report(entries: list[dict]) -> str:
    """The table and, under it, each budget's run and what differed from the story."""
    out = ["# The reference story under CPU budgets", "",
           f"`monsoon demo` ({', '.join(DEMO_CASES)}) once per budget. A number: `{cpubudget.ENV}`, a CPU "
           "quota on the stack's services (the load generator outside it); neighbour: no quota, a busy loop "
           "burning one core beside the run. Peak queue/lag: the platform's queue depth (in-memory), Kafka "
           "consumer lag (Kafka).", "", table(entries), ""]
    for e in entries:
        bits = [f"run {e.get('run_dir') or '-'}", f"demo exit {e.get('rc')}", f"{e.get('elapsed_s', 0):.0f} s"]
        if e.get("neighbour_cores") is not None:
            bits.append(f"neighbour used {e['neighbour_cores']:.2f} cores")
        out.append(f"* **{e['label']}**: " + ", ".join(bits))
        out += [f"  * {p}" for p in e.get("problems", [])]
    return "\n".join(out) + "\n"


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc/*/stat)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    return out


def _stop(proc: subprocess.Popen, first: int, wait_s: float, *, children: bool = False) -> None:
    """Send ``first`` to a process (the leader of its own session), or to its children when ``children``
    (``monsoon demo``'s pytest: told directly, it tears its stacks down, and the demo then ends by itself),
    wait up to ``wait_s``, then SIGKILL the process group (also when interrupted meanwhile)."""
    try:
        if proc.poll() is None:
            for pid in (_children(proc.pid) if children else []) or [proc.pid]:
                try:
                    os.kill(pid, first)
                except ProcessLookupError:
                    pass
            proc.wait(timeout=wait_s)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


#: run the demo through this: SIGINT back to its default, then exec. A process that a script started in the
#: background inherits SIGINT ignored, and Python then leaves it ignored: the demo would not hear the SIGINT
#: that stops it (and tears its stacks down), and would be SIGKILLed STOP_WAIT_S later with its stacks left up
HEAR_SIGINT = (sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
               "os.execvp(sys.argv[1], sys.argv[1:])")


def _elapsed(s: float) -> str:
    return f"{int(s // 60)}m{int(s % 60):02d}s"


def run_budget(b: Budget, out: Path, *, n: int, of: int, t_all: float, demo_args: list[str],
               verbose: bool, demo: list[str] | None = None, runs: Path | None = None) -> dict:
    """One demo under one budget; its entry for the report. ``demo`` and ``runs`` (the command and where
    its run directories are) are for tests."""
    bdir = out / b.label
    bdir.mkdir(parents=True, exist_ok=True)
    log_path = bdir / "demo.log"
    cmd = [*(demo or [sys.executable, "-m", "monsoon.cli", "demo"]), *demo_args]
    env = b.env(dict(os.environ), bdir / "calibration")
    runs = runs or REPO / (env.get(RUNS_ENV) or "runs")      # where the demo (cwd: the checkout) puts runs
    entry: dict[str, Any] = {"label": b.label, "cores": b.cores, "neighbour": b.neighbour, "cmd": cmd,
                             "log": str(log_path), "calibration_dir": str(bdir / "calibration")}
    print(f"[{n}/{of}] budget {b.label}: "
          + (f"{cpubudget.ENV}={b.label}" if b.cores is not None else "no quota")
          + (", a busy-loop neighbour on one core" if b.neighbour else "")
          + f" (total elapsed {_elapsed(time.monotonic() - t_all)})", flush=True)
    lines: list[str] = []
    t0 = time.monotonic()
    beside = contextlib.ExitStack()      # the neighbour, when the budget has one: stopped after the demo
    try:
        if b.neighbour:
            beside.enter_context(busy_neighbour(entry))
        # its own session: a Ctrl-C reaches it once, from here, and it tears its stacks down
        with open(log_path, "w") as log:
            proc = subprocess.Popen([*HEAR_SIGINT, *cmd], cwd=REPO, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    text=True, errors="replace", bufsize=1, start_new_session=True)

            def pump() -> None:
                assert proc.stdout is not None     # stdout=PIPE
                for ln in proc.stdout:
                    log.write(ln)
                    log.flush()
                    lines.append(ln.rstrip("\n"))
                    if verbose:
                        print(f"  [{b.label}] {ln}", end="", flush=True)
            reader = threading.Thread(target=pump, name="demo-output", daemon=True)
            reader.start()
            try:
                next_beat = time.monotonic() + HEARTBEAT_S
                while proc.poll() is None:
                    time.sleep(0.5)
                    if not verbose and time.monotonic() >= next_beat:
                        next_beat += HEARTBEAT_S
                        last = lines[-1][:100] if lines else ""
                        print(f"  [{b.label}] {_elapsed(time.monotonic() - t0)} ... {last}", flush=True)
            except BaseException:
                print(f"  [{b.label}] stopping the demo (SIGINT to its pytest, SIGKILL after {STOP_WAIT_S:.0f} s)",
                      flush=True)
                _stop(proc, signal.SIGINT, STOP_WAIT_S, children=True)
                if proc.returncode == -signal.SIGKILL:
                    print(f"  [{b.label}] the demo was killed: `make reap` removes what it left running", flush=True)
                raise
            finally:
                reader.join(timeout=10)
        entry["rc"] = proc.returncode
    finally:
        entry["elapsed_s"] = round(time.monotonic() - t0, 1)
        beside.close()
    run_dir = run_dir_from_output(lines, runs)
    entry["run_id"] = run_dir.name if run_dir else None
    entry["run_dir"] = str(run_dir) if run_dir else None
    summary = None
    why = ""
    if run_dir is None:
        why = f"no run directory in the demo's output (exit {entry['rc']}; see {log_path})"
    else:
        path = run_dir / SUMMARY_FILE
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            why = f"{path}: {type(e).__name__}: {e} (demo exit {entry['rc']}; see {log_path})"
    entry["rows"] = rows_for(summary) if summary is not None else []
    entry["reproduced"], entry["problems"] = judge(summary, why)
    entry["status"] = "reproduced" if entry["reproduced"] else "not reproduced"
    print(f"[{n}/{of}] budget {b.label}: story {'REPRODUCED' if entry['reproduced'] else 'NOT reproduced'} "
          f"in {_elapsed(entry['elapsed_s'])}" + (f" ({run_dir})" if run_dir else ""), flush=True)
    for p in entry["problems"]:
        print(f"  - {p}", flush=True)
    return entry


def write(out: Path, entries: list[dict], *, started: str, complete: bool) -> None:
    (out / "budgets.md").write_text(report(entries))
    doc = {"started": started, "complete": complete, "budgets": entries,
           "all_reproduced": complete and bool(entries) and all(e["reproduced"] for e in entries)}
    (out / "budgets.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")


def check(budgets: list[Budget]) -> list[str]:
    """What stops these budgets from running here (nothing is left behind)."""
    problems = []
    if not (REPO / "pytest" / "test_burst_floods.py").is_file():
        problems.append(f"no pytest/test_burst_floods.py under {REPO}: run from a checkout of monsoon")
    quotas = [b.cores for b in budgets if b.cores is not None]
    if quotas:
        try:
            cpubudget.check(min(quotas))
        except (cpubudget.CpuBudgetError, ValueError) as e:
            problems.append(str(e))
    return problems


def _sigterm(_sig: int, _frame: Any) -> None:
    raise KeyboardInterrupt("SIGTERM")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m monsoon.selftest.budgets",
                                 description="Run monsoon demo under CPU budgets of the stack's services and "
                                             "say whether the reference story holds under each.")
    ap.add_argument("--budgets", default=DEFAULT,
                    help=f"comma-separated: cores (a CPU quota on the services), 'neighbour' (no quota, a "
                         f"busy loop on one core beside), 'none' (default {DEFAULT})")
    ap.add_argument("--only-check", action="store_true",
                    help="check the budgets can be applied here (a cgroup made and removed); run nothing")
    ap.add_argument("--out", type=Path, default=None, help="output directory (default runs/budgets-<time>)")
    ap.add_argument("--demo-args", default="", help="extra arguments for monsoon demo (pytest's), one string")
    ap.add_argument("--verbose", action="store_true", help="echo the demo's output (else a line a minute)")
    args = ap.parse_args(argv)
    try:
        budgets = parse_budgets(args.budgets)
    except ValueError as e:
        ap.error(str(e))
    problems = check(budgets)
    if problems:
        for p in problems:
            print(f"monsoon budgets: {p}", file=sys.stderr)
        return 2
    plan = ", ".join(b.label for b in budgets)
    if args.only_check:
        print(f"monsoon budgets: ok: {plan} can run here (cgroup cpu controller writable)")
        return 0
    out = args.out or REPO / "runs" / f"budgets-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    print(f"monsoon budgets: {plan}: one demo each, results in {out}", flush=True)
    signal.signal(signal.SIGTERM, _sigterm)
    entries: list[dict] = []
    t_all = time.monotonic()
    try:
        for i, b in enumerate(budgets, 1):
            entries.append(run_budget(b, out, n=i, of=len(budgets), t_all=t_all,
                                      demo_args=shlex.split(args.demo_args), verbose=args.verbose))
            write(out, entries, started=started, complete=False)
    except KeyboardInterrupt:
        write(out, entries, started=started, complete=False)
        print(f"\nmonsoon budgets: interrupted after {len(entries)} of {len(budgets)} budgets; "
              f"partial results in {out}", file=sys.stderr)
        return 130
    write(out, entries, started=started, complete=True)
    print()
    print(table(entries))
    ok = all(e["reproduced"] for e in entries)
    print(f"\nmonsoon budgets: story {'reproduced under every budget' if ok else 'NOT reproduced under every budget'}"
          f" ({_elapsed(time.monotonic() - t_all)}); {out / 'budgets.md'}, {out / 'budgets.json'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
