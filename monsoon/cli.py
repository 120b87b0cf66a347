"""The ``monsoon`` command: analyze saved runs, validate specs, heal faults and reap leftovers."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import subprocess

from monsoon.checks.registry import evaluate
from monsoon.faults.heal import heal_everything
from monsoon.faults.kube import to_yaml
from monsoon.faults.resolve import kube_namespaces
from monsoon.load.kube_job import LoadJobError, job_for_experiment
from monsoon.paths import REPO
from monsoon.report.checklist import checklist
from monsoon.report.result import ExperimentResult
from monsoon.report.write import write as write_report
from monsoon.run import calibrate
from monsoon.run.validate import load_checked
from monsoon.rundir import RESULT_FILE, TIMELINE_FILE, new_run_id
from monsoon.spec.fault import load_fault
from monsoon.spec.stack import load_stack
from monsoon.spec.yamlio import SpecError
from monsoon.stack.reaper import reap
from monsoon.timeline.store import Events



def analyze(run_dir: Path) -> dict:
    """Re-run every check of every experiment in a saved run, offline; rewrite summary.json, checklist.md and report.html."""
    run_dir = Path(run_dir).resolve()
    if not run_dir.is_dir():
        raise SystemExit(f"monsoon analyze: {run_dir} is not a directory")
    results, run_id, profile = [], run_dir.name, "quick"
    for sub in sorted(p for p in run_dir.iterdir() if (p / TIMELINE_FILE).exists()):
        meta = Events.load(sub / TIMELINE_FILE).meta()
        if meta.get("kind") == "calibration":   # a calibrate-<stack>/ ramp (base_rate: auto), not an experiment
            continue
        profile = meta.get("profile", profile)
        run_id = meta.get("run_id", run_id)
        res = ExperimentResult(meta.get("stack", "?"), meta.get("experiment", sub.name), profile, sub)
        old = sub / RESULT_FILE
        if old.exists():
            res.error = json.loads(old.read_text()).get("error")
        res.checks = evaluate(sub, [(c["name"], c.get("params", {})) for c in meta.get("checks", [])])
        res.base_rate = meta.get("base_rate_auto")
        (sub / RESULT_FILE).write_text(json.dumps(res.to_dict(), indent=2))
        results.append(res.to_dict())
    if not results:
        raise SystemExit(f"monsoon analyze: no experiment timelines under {run_dir}")
    s, md = write_report(run_dir, run_id, profile, results)
    return s


def story_problems(summary: dict) -> list[str]:
    """How a burst run differs from the reference ThingsBoard story (empty list: reproduced)."""
    by = {(r["stack"], r["experiment"]): r for r in summary["results"]}
    fig = lambda r, check, key: next((c["figures"].get(key) for c in r["checks"] if c["name"] == check), None)
    problems = []
    for key in [("inmemory", "burst-x3"), ("kafka", "burst-x3"), ("inmemory", "burst-x10"), ("kafka", "burst-x10")]:
        if key not in by:
            problems.append(f"{key[0]} / {key[1]} did not run")
    if problems:
        return problems
    for stack in ("inmemory", "kafka"):
        if by[(stack, "burst-x3")]["verdict"] != "pass":
            problems.append(f"{stack} x3 should PASS, got {by[(stack, 'burst-x3')]['verdict'].upper()}")
    im = by[("inmemory", "burst-x10")]
    if im["verdict"] != "fail" or not (fig(im, "no_oom", "oom_events") or 0) >= 1 \
            or not (fig(im, "no_acked_loss", "acked_lost") or 0) > 0:
        problems.append(f"inmemory x10 should FAIL with oom_events >= 1 and acked_lost > 0, got "
                        f"{im['verdict'].upper()} oom_events={fig(im, 'no_oom', 'oom_events')} "
                        f"acked_lost={fig(im, 'no_acked_loss', 'acked_lost')}")
    kf = by[("kafka", "burst-x10")]
    if kf["verdict"] != "pass" or not (fig(kf, "lag_recovers_within", "peak_lag") or 0) > 0 \
            or fig(kf, "no_acked_loss", "acked_lost") != 0:
        problems.append(f"kafka x10 should PASS with peak_lag > 0 and acked_lost = 0, got {kf['verdict'].upper()} "
                        f"peak_lag={fig(kf, 'lag_recovers_within', 'peak_lag')} "
                        f"acked_lost={fig(kf, 'no_acked_loss', 'acked_lost')}")
    return problems


def demo(extra: list[str]) -> int:
    """Run the burst scenarios under pytest, print the checklist, and say whether the story was reproduced."""
    run_id = new_run_id()
    cmd = [sys.executable, "-m", "pytest", "-m", "burst", str(REPO / "pytest"), "-p", "no:cacheprovider",
           "--monsoon-run-id", run_id, *extra]
    print("monsoon demo:", " ".join(cmd), flush=True)
    rc = subprocess.call(cmd, cwd=REPO)
    summary_path = REPO / "runs" / run_id / "summary.json"
    if not summary_path.exists():
        print(f"monsoon demo: pytest exited {rc} and wrote no {summary_path}", file=sys.stderr)
        return rc or 1
    problems = story_problems(json.loads(summary_path.read_text()))
    print()
    if problems:
        print("monsoon demo: the reference story was NOT reproduced:")
        for p in problems:
            print("  -", p)
        return 1
    print("monsoon demo: reference story reproduced — in-memory queue dies of OOM at x10 and loses acked "
          "messages; Kafka queue absorbs x10 as lag, drains it and loses nothing; both survive x3.")
    print(f"monsoon demo: (pytest exits 1 because in-memory x10 fails its checks, as it should.) "
          f"Run directory: runs/{run_id}")
    return 0


def load_job(args) -> int:
    try:
        objs = job_for_experiment(load_checked(args.experiment), host=args.host, port=args.port, profile=args.profile,
                                  shards=args.shards, image=args.image, namespace=args.namespace,
                                  allowed_namespaces=set(kube_namespaces()) | set(args.allow_namespace),
                                  run_id=args.run_id or new_run_id(), base_rate=args.base_rate)
    except (LoadJobError, SpecError, ValueError) as e:
        print(f"monsoon load-job: {e}", file=sys.stderr)
        return 2
    text = to_yaml(objs)
    if args.output:
        args.output.write_text(text)
        print(f"wrote {args.output}: ConfigMap + Job {objs[1]['metadata']['name']} ({args.shards} pods)")
    else:
        sys.stdout.write(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="monsoon", description="monsoon: chaos and soak testing for IoT ingestion "
                                 "platforms. Scenarios run under pytest (pytest -m burst pytest/); this command "
                                 "works on saved runs and specs.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("analyze", help="re-run the checks of a saved run offline and rewrite its report")
    a.add_argument("run_dir", type=Path, help="a run directory, e.g. runs/latest")
    c = sub.add_parser("checklist", help="print the sign-off checklist of a run")
    c.add_argument("run_dir", type=Path)
    v = sub.add_parser("validate", help="validate stack and experiment YAML files without running anything")
    v.add_argument("files", nargs="+", type=Path)
    r = sub.add_parser("reap", help="kill processes left behind by a run that was killed with -9")
    r.add_argument("--run-id", default=None, help="only this run (default: every monsoon run)")
    h = sub.add_parser("heal", help="heal every fault left in place by a run that was killed with -9, "
                       "stop its processes, and print the census",
                       description="Thaws SIGSTOPped processes, restores cgroup memory limits, deletes the run's "
                       "Toxiproxy toxics and proxies, deletes labelled Chaos Mesh / Litmus objects (when a cluster "
                       "is configured: in the namespaces of MONSOON_KUBE_NAMESPACES), then kills the run's leftover "
                       "processes. --all leaves alone every run whose monsoon process is still alive (its "
                       "MONSOON_OWNER_PID label) and says so; --run-id heals that run regardless. "
                       "Exit 0 when the census is clean.")
    which = h.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true",
                       help="every monsoon run that left something behind and whose monsoon process is gone "
                       "(a live run is skipped)")
    which.add_argument("--run-id", help="only this run, even if its monsoon process is still alive")
    h.add_argument("--toxiproxy-api", action="append", default=[], metavar="URL",
                   help="also sweep this Toxiproxy server (e.g. a shared one); the servers monsoon started are "
                   "found by themselves")
    h.add_argument("--keep-processes", action="store_true", help="heal faults but leave the run's processes running")
    d = sub.add_parser("demo", help="run the reference burst story (pytest -m burst pytest/) and check it")
    d.add_argument("pytest_args", nargs=argparse.REMAINDER, help="extra pytest arguments")
    cal = sub.add_parser("calibrate", help="ramp the load on a stack until it stops keeping up; record its capacity",
                         description="Starts STACK, ramps the rate geometrically (--start-rate, x--factor per step of "
                         "--step-seconds) and stops at the first step the stack does not keep up with (stored or "
                         "acked rate below the sent rate, queue/lag growing, p99 latency knee) or the fleet cannot "
                         "send (generator-bound). Writes runs/<run-id>/calibrate-<stack>/ and "
                         "runs/calibration/<stack>.json, which base_rate: auto reads.")
    calibrate.add_arguments(cal)
    j = sub.add_parser("load-job", help="render an experiment's load as a Kubernetes Indexed Job (one shard per pod)",
                       description="Writes a ConfigMap (the load: devices, schedule, payload, endpoint) and a batch/v1 "
                       "Job with completionMode: Indexed whose pods run monsoon-loadgen --shard auto/N: pod i takes "
                       "devices [i*D/N, (i+1)*D/N), the same split as local worker processes. The devices are "
                       "monsoon's names and tokens (what its ThingsBoard provisioner creates): provision them first. "
                       "The namespace must be on the allow-list (MONSOON_KUBE_NAMESPACES or --allow-namespace).")
    j.add_argument("experiment", help="experiment name or file, e.g. burst-x10")
    j.add_argument("--host", required=True, help="the deployment's MQTT host, as the pods reach it")
    j.add_argument("--port", type=int, default=1883, help="its MQTT port (default 1883)")
    j.add_argument("--shards", type=int, required=True, help="pods (Job completions and parallelism)")
    j.add_argument("--image", required=True, help="a container image with monsoon-loadgen on its PATH")
    j.add_argument("--namespace", required=True)
    j.add_argument("--allow-namespace", action="append", default=[], metavar="NS",
                   help="add NS to the allow-list (besides MONSOON_KUBE_NAMESPACES)")
    j.add_argument("--profile", default="quick", help="the experiment's profile (durations); default quick")
    j.add_argument("--base-rate", type=float, default=None, help="x1 in msg/s (required for base_rate: auto)")
    j.add_argument("--run-id", default=None, help="label value monsoon.io/run-id (default: a new run id)")
    j.add_argument("-o", "--output", type=Path, default=None, help="write the YAML here (default: stdout)")
    args = ap.parse_args(argv)
    if args.cmd == "load-job":
        return load_job(args)
    if args.cmd == "calibrate":
        return calibrate.cli(args)
    if args.cmd == "demo":
        return demo(args.pytest_args)

    if args.cmd == "analyze":
        s = analyze(args.run_dir)
        print(checklist(s))
        return 0 if all(r["verdict"] == "pass" for r in s["results"]) else 1
    if args.cmd == "checklist":
        p = Path(args.run_dir) / "checklist.md"
        if not p.exists():
            print(f"monsoon checklist: no checklist.md in {args.run_dir}", file=sys.stderr)
            return 2
        print(p.read_text())
        return 0
    if args.cmd == "validate":
        bad = 0
        loaders = {"stacks": ("stack", load_stack), "fault-profiles": ("fault profile", load_fault)}
        for f in args.files:
            kind, load = loaders.get(f.resolve().parent.name, ("experiment", load_checked))
            try:
                load(f)
                print(f"ok   {f} ({kind})")
            except SpecError as e:
                print(f"FAIL {e}")
                bad += 1
        return 1 if bad else 0
    if args.cmd == "heal":
        done, census, notes = heal_everything(None if args.all else args.run_id,
                                              toxiproxy_apis=args.toxiproxy_api,
                                              reap_processes=not args.keep_processes)
        for line in notes:
            print(line)
        for line in done:
            print("healed", line)
        if not done:
            print("nothing to heal")
        for rid, left in census.items():
            for x in left:
                print(f"STILL IN PLACE {rid} {x}")
        return 1 if census else 0
    if args.cmd == "reap":
        pids = reap(args.run_id)
        print(f"killed {len(pids)} leftover process(es): {pids}" if pids else "nothing left behind")
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
