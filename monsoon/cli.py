"""The ``monsoon`` command, every subcommand of it: each is an argparse subparser whose ``run`` default is its
handler (``handler(args) -> exit code``), dispatched in one place at the end of :func:`main`. The work itself
lives in the packages (``monsoon.analysis``, ``monsoon.run.calibrate``, ``monsoon.history``, ...).

Each handler imports what it works with itself, when it runs: the analysis, the report and the history pull in
matplotlib, pyarrow, numpy, psycopg, the checks and the specs (pydantic), which ``monsoon --help`` has no use for
and ``monsoon validate`` only in part. At the top are the few light modules the parser itself needs; a subcommand
whose arguments come from a heavy module (the calibration's defaults, the payload profiles, the schema's kinds)
gets them only when it is the one run or its help is asked for (:class:`_Subcommand`).
tests/unit/test_cli_imports.py fails when a heavy module is imported at the top again."""
from __future__ import annotations

import argparse
import inspect
import json
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import subprocess

from monsoon import hostsetup, settings
from monsoon.paths import REPO
from monsoon.rundir import (CHECKLIST_FILE, REPORT_FILE, SUMMARY_FILE, SWEEP_FILE, SWEEP_PLOT, calibrate_dir_name,
                            new_run_id)
from monsoon import options as opt

if TYPE_CHECKING:
    from monsoon.spec.schema import CheckInfo
    from monsoon.spec.yamlio import SpecError


#: What ``make demo`` runs: the two x10 cases of the reference story (the x3 cases: ``pytest -m burst``).
DEMO_CASES = ("test_burst_flood[inmemory-burst-x10]", "test_burst_flood[kafka-burst-x10]")


def story_problems(summary: dict, stacks: tuple[str, str] = ("inmemory", "kafka")) -> list[str]:
    """How a burst run differs from the reference ThingsBoard story (empty list: reproduced): the in-memory stack
    (``stacks[0]``; ``inmemory-k8s`` for the Kubernetes twin) at x10 fails by OOM and loses acked messages, the
    Kafka one (``stacks[1]``) at x10 passes with lag and no loss; x3, when it ran, passes on both."""
    by = {(r["stack"], r["experiment"]): r for r in summary["results"]}
    def fig(r, check, key):
        return next((c["figures"].get(key) for c in r["checks"] if c["name"] == check), None)
    mem_stack, kafka_stack = stacks
    problems = []
    for key in [(mem_stack, "burst-x10"), (kafka_stack, "burst-x10")]:
        if key not in by:
            problems.append(f"{key[0]} / {key[1]} did not run")
    if problems:
        return problems
    for stack in stacks:
        if (stack, "burst-x3") in by and by[(stack, "burst-x3")]["verdict"] != "pass":
            problems.append(f"{stack} x3 should PASS, got {by[(stack, 'burst-x3')]['verdict'].upper()}")
    im = by[(mem_stack, "burst-x10")]
    ooms = (fig(im, "no_oom", "oom_events") or 0) + (fig(im, "no_oom", "k8s_oom_killed") or 0) \
        + (fig(im, "no_oom", "docker_oom_killed") or 0)
    if im["verdict"] != "fail" or not ooms >= 1 or not (fig(im, "no_acked_loss", "acked_lost") or 0) > 0:
        problems.append(f"{mem_stack} x10 should FAIL by OOM with acked_lost > 0, got {im['verdict'].upper()} "
                        f"oom_events={fig(im, 'no_oom', 'oom_events')} "
                        f"acked_lost={fig(im, 'no_acked_loss', 'acked_lost')}")
    kf = by[(kafka_stack, "burst-x10")]
    if kf["verdict"] != "pass" or not (fig(kf, "lag_recovers_within", "peak_lag") or 0) > 0 \
            or fig(kf, "no_acked_loss", "acked_lost") != 0:
        problems.append(f"{kafka_stack} x10 should PASS with peak_lag > 0 and acked_lost = 0, got "
                        f"{kf['verdict'].upper()} peak_lag={fig(kf, 'lag_recovers_within', 'peak_lag')} "
                        f"acked_lost={fig(kf, 'no_acked_loss', 'acked_lost')}")
    return problems


def _runs_dir_arg(args: list[str]) -> str | None:
    """The ``--monsoon-runs-dir`` among pytest arguments (``=DIR`` or ``DIR`` next), or None."""
    for i, a in enumerate(args):
        if a.startswith(f"{opt.RUNS_DIR}="):
            return a.split("=", 1)[1]
        if a == opt.RUNS_DIR and i + 1 < len(args):
            return args[i + 1]
    return None


def demo(extra: list[str]) -> int:
    """Run the burst scenarios under pytest, print the checklist, and say whether the story was reproduced."""
    if not (REPO / "pytest" / "test_burst_floods.py").is_file():   # an installed monsoon: no scenarios of its own
        print("monsoon demo: monsoon's own scenarios run from a checkout of monsoon (make demo); in your project: "
              "monsoon init, monsoon setup platform postgres, pytest -m burst", file=sys.stderr)
        return 2
    run_id = new_run_id()
    scenario = REPO / "pytest" / "test_burst_floods.py"      # the reference story's two x10 cases only
    # said to pytest: the checkout's ini (monsoon_runs_dir) would win over $MONSOON_RUNS_DIR, which the demo honours
    runs = settings.runs_dir(_runs_dir_arg(extra) or settings.env(settings.RUNS_ENV))
    cmd = [sys.executable, "-m", "pytest", *(f"{scenario}::{case}" for case in DEMO_CASES),
           "-p", "no:cacheprovider", opt.RUN_ID, run_id, *extra, f"{opt.RUNS_DIR}={runs}"]
    print("monsoon demo:", " ".join(cmd), flush=True)
    rc = subprocess.call(cmd, cwd=REPO)
    run_dir = runs / run_id
    summary_path = run_dir / SUMMARY_FILE
    if not summary_path.exists():
        print(f"monsoon demo: pytest exited {rc} and wrote no {summary_path}", file=sys.stderr)
        return rc or 1
    summary = json.loads(summary_path.read_text())
    problems = story_problems(summary)
    print()
    for r in summary["results"]:   # the load, relative to what each stack took on this machine
        print(f"monsoon demo: {r['stack']} / {r['experiment']}: "
              f"{(r.get('base_rate') or {}).get('x1', 'x1 not recorded')}")
    if problems:
        print("monsoon demo: the reference story was NOT reproduced:")
        for p in problems:
            print("  -", p)
        return 1
    print("monsoon demo: reference story reproduced — in-memory queue dies of OOM at x10 and loses acked "
          "messages; Kafka queue absorbs x10 as lag, drains it and loses nothing (x3 on both: pytest -m burst).")
    print(f"monsoon demo: (pytest exits 1 because in-memory x10 fails its checks, as it should.) "
          f"Run directory: {run_dir}")
    return 0


def load_job(args) -> int:
    from monsoon.faults.kube import to_yaml
    from monsoon.faults.resolve import kube_namespaces
    from monsoon.load.kube_job import LoadJobError, job_for_experiment
    from monsoon.run.validate import load_checked
    from monsoon.spec.yamlio import SpecError
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


# ------------------------------------------------------------------ validate

#: Every (stack, experiment) a scenario in pytest/*.py runs: ``monsoon validate`` with no argument validates each
#: pair together. tests/unit/test_cli_validate.py runs the scenarios against a recorder and fails when this list
#: and what they run differ.
SCENARIO_PAIRS: tuple[tuple[str, str], ...] = (
    ("inmemory", "burst-x3"), ("inmemory", "burst-x10"), ("kafka", "burst-x3"), ("kafka", "burst-x10"),
    ("kafka-registry", "mongo-slowdown"), ("kafka-registry", "infinispan-slowdown"),
    ("kafka", "pod-kill"), ("inmemory", "pod-kill"),
    ("kafka-registry", "soak"), ("kafka", "size-sweep"), ("kafka-registry", "mix"),
    ("inmemory-docker", "burst-x10"), ("kafka-docker", "burst-x10"), ("kafka-docker", "pod-kill"),
    ("thingsboard-inmemory", "thingsboard-burst-x3"), ("thingsboard-inmemory", "thingsboard-burst-x10"),
    ("thingsboard-kafka", "thingsboard-burst-x3"), ("thingsboard-kafka", "thingsboard-burst-x10"),
    ("thingsboard-cassandra", "thingsboard-burst-x3"), ("thingsboard-cassandra", "thingsboard-burst-x10"),
    ("thingsboard-kafka", "thingsboard-faults"), ("thingsboard-kafka", "size-sweep-thingsboard"),
    ("thingsboard-kafka", "mix-thingsboard"),
    ("hono-kafka", "hono-burst-x3"), ("hono-kafka-toxiproxy", "hono-commands"),
    ("hono-kafka-toxiproxy", "hono-infinispan-slowdown"), ("hono-kafka-toxiproxy", "hono-cold-warm"),
    ("hono-kafka", "hono-burst-x10"), ("hono-kafka-toxiproxy", "hono-pod-kill"),
    ("hono-kafka-toxiproxy", "hono-coap-commands"), ("hono-kafka-toxiproxy", "hono-coap-infinispan-slowdown"),
    ("kafka-cassandra", "burst-x10"), ("cassandra-ack", "pod-kill"), ("kafka-cassandra", "cassandra-slowdown"),
    ("kafka-cassandra", "cassandra-down"), ("cassandra-ack", "cassandra-node-kill"),
    ("kafka", "storage-compare"), ("kafka-cassandra", "storage-compare"),
    ("inmemory-k8s", "burst-x10"), ("kafka-k8s", "burst-x10"), ("kafka-k8s", "pod-kill-chaos-mesh"),
    ("kafka-k8s", "network-latency-chaos-mesh"), ("kafka-k8s", "burst-x10-load-job"),
    ("kafka-k8s", "pod-kill-litmus"), ("kafka-k8s", "charts-litmus"), ("inmemory-k8s", "pod-failure-chaos-mesh"),
    ("kafka-k8s", "container-kill-chaos-mesh"), ("inmemory-k8s", "memory-stress-chaos-mesh"),
)

def loaders() -> dict[str, Callable[[Path], object]]:
    """What reads each kind of spec file."""
    from monsoon.run.validate import load_checked
    from monsoon.spec.fault import load_fault
    from monsoon.spec.stack import load_stack
    return {"stack": load_stack, "experiment": load_checked, "fault profile": load_fault}


def shipped_spec_files() -> list[Path]:
    """Every YAML file in stacks/, experiments/ and fault-profiles/ (not their subfolders: launchers, sources)."""
    from monsoon.spec.base import FOLDERS
    return sorted(p for folder in FOLDERS.values() for p in folder.iterdir()
                  if p.suffix in (".yaml", ".yml") and p.is_file())


def project_spec_files() -> list[Path]:
    """Every YAML file in the project's spec folders (``monsoon_specs``/``--specs``, then the project's stacks/,
    experiments/, fault-profiles/), not monsoon's own; none in monsoon's checkout."""
    cur = settings.current()
    folders = {d for kind in settings.FOLDERS for d in cur.project_folders(kind)}
    return sorted({p for d in folders for p in d.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file()})


def _yaml_in(d: Path) -> list[Path]:
    return sorted(p for p in d.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file()) if d.is_dir() else []


def spec_files_in(d: Path) -> list[Path]:
    """The YAML files of a folder given on the command line: directly inside, and in its stacks/, experiments/,
    fault-profiles/ (a ``monsoon_specs`` folder's layout)."""
    return sorted({p for sub in ("", *settings.FOLDERS.values()) for p in _yaml_in(d / sub if sub else d)})


def in_monsoons_checkout() -> bool:
    """The project is monsoon's own checkout (``monsoon validate`` with no argument: the shipped specs)."""
    return settings.CHECKOUT is not None and settings.current().project_dir.resolve() == settings.CHECKOUT.resolve()


def not_found(kind: str, name: str) -> str | None:
    """None when ``name`` (a file, or a name the settings find); else one line saying where it looked."""
    if Path(name).suffix in (".yaml", ".yml") or Path(name).exists():
        return None
    cur = settings.current()
    if cur.find(kind, name) is not None:
        return None
    dirs = cur.spec_dirs(kind)
    avail = sorted({x.stem for d in dirs for x in d.glob("*.yaml")})
    return (f"no {kind} named {name!r}: looked for {name}.yaml in "
            + ", ".join(_shown(d) + ("" if d.is_dir() else " (missing)") for d in dirs)
            + f" (available: {', '.join(avail) or 'none'})")


def _where_specs() -> str:
    """The project and where its spec folders came from, for a line about them."""
    cur = settings.current()
    src = f"; monsoon_specs from {_shown(cur.inipath)}" if cur.specs and cur.inipath is not None else ""
    return f"project {_shown(cur.project_dir)}{src}"


def _shown(path: str | Path) -> str:
    """A path as the user would type it: relative to the current directory when under it."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve())) if p.is_absolute() else str(p)
    except (ValueError, OSError):
        return str(p)


def problem_line(e: SpecError) -> str:
    """``file:line: key: message`` on one line (line 1 when the problem is the whole file)."""
    msg = " ".join(str(e.message).split()).replace(str(Path.cwd().resolve()) + os.sep, "")
    where = f"{_shown(e.path)}:{e.line or 1}"
    return f"{where}: {e.key}: {msg}" if e.key else f"{where}: {msg}"


def validate_file(path: Path, force: bool = False, kinds: dict[str, int] | None = None) -> str:
    """Validate one spec file as what its content says it is; returns the kind, raises SpecError. ``kinds``
    counts the file's kind as soon as it is known (a file with a problem included)."""
    from monsoon.run.validate import load_checked
    from monsoon.spec.kinds import kind_of
    from monsoon.spec.stack import load_stack
    from monsoon.spec.yamlio import load_located
    kind = kind_of(load_located(path))
    if kinds is not None:
        kinds[kind] = kinds.get(kind, 0) + 1
    if kind == "experiment":
        load_checked(path, force=force)
    elif kind == "stack":
        load_stack(path, commands=True)   # and each service's program exists, where the file can tell
    else:
        loaders()[kind](path)
    return kind


def validate_pair(stack: str | Path, experiment: str | Path, profiles: list[str] | None = None,
                  force: bool = False) -> list[SpecError]:
    """A stack and an experiment together, as a run would have them (:func:`monsoon.run.validate.validate`, for
    each of the experiment's profiles or ``profiles``), then every check against what the stack observes."""
    from monsoon.run.validate import validate
    from monsoon.spec.experiment import check_fits, load_experiment
    from monsoon.spec.stack import load_stack
    from monsoon.spec.yamlio import SpecError
    stack_spec, exp = load_stack(stack, commands=True), load_experiment(experiment)
    problems = []
    for profile in profiles or list(exp.profiles):
        try:
            validate(stack_spec, exp, profile, force=force)
        except SpecError as e:
            problems.append(e)
            break
    said = {str(e) for e in problems}   # validate() raises the first misfit itself
    return problems + [e for e in check_fits(exp, stack_spec) if str(e) not in said]


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def validate_cli(args) -> int:
    """``monsoon validate``: one line per problem, ``file:line: key: message``; exit 1 if any, never a traceback.
    What it read is said (how many stacks, experiments and fault profiles, from which folders); reading nothing
    is a refusal in one line (exit 2), never "all valid"."""
    from monsoon.spec.yamlio import SpecError

    def refuse(line: str) -> int:
        print(f"monsoon validate: {line}", file=sys.stderr)
        return 2

    if (args.stack is None) != (args.experiment is None):
        return refuse("--stack and --experiment go together (or give neither)")
    files: list[Path] = []
    pairs: list[tuple[str, str]] = []
    for p in args.files:
        if p.is_dir():
            found = spec_files_in(p)
            if not found:
                return refuse(f"nothing to validate in {_shown(p)}: no YAML file in it nor in its "
                              f"{', '.join(f + '/' for f in settings.FOLDERS.values())}")
            files += found
        else:
            files.append(p)
    if args.stack is not None:
        for kind, name in (("stack", args.stack), ("experiment", args.experiment)):
            missing = not_found(kind, name)
            if missing:
                return refuse(missing)
        pairs.append((args.stack, args.experiment))
        cur = settings.current()
        print("monsoon validate: " + ", ".join(
            f"{kind} {name} from {_shown(cur.find(kind, name) or name)}"
            for kind, name in (("stack", args.stack), ("experiment", args.experiment))), file=sys.stderr)
    note = None
    if not files and not pairs:
        files = project_spec_files()   # the user's project: monsoon_specs, then its stacks/, experiments/, ...
        note = settings.current().shadow_note()
        if not files:
            if not in_monsoons_checkout():
                looked = sorted({_shown(d) for kind in settings.FOLDERS for d in settings.current().spec_dirs(kind)
                                 if d.resolve() != (settings.ROOT / settings.FOLDERS[kind]).resolve()})
                return refuse(f"nothing to validate: no stack, experiment or fault-profile YAML in {', '.join(looked)} "
                              f"({_where_specs()}): set monsoon_specs in the ini file, or --specs DIR, or name files")
            files, pairs = shipped_spec_files(), list(SCENARIO_PAIRS)   # monsoon's own checkout: what it ships
    printed: set[str] = set()

    def report(line: str) -> None:
        if line not in printed:
            printed.add(line)
            print(line, flush=True)

    def guarded(what: str, fn) -> list[SpecError]:
        try:
            return fn() or []
        except SpecError as e:
            return [e]
        except (Exception, SystemExit) as e:   # a user's shape module, a bug of ours: one line, never a traceback
            return [SpecError(what, None, "", f"could not be validated: {type(e).__name__}: {e}")]

    kinds: dict[str, int] = {}
    for f in files:
        for e in guarded(str(f), lambda f=f: validate_file(f, args.force, kinds) and None):
            report(problem_line(e))
    for stack, exp in pairs:
        for e in guarded(f"{stack} + {exp}", lambda stack=stack, exp=exp: validate_pair(stack, exp, args.profile and [args.profile], args.force)):
            report(problem_line(e))
    if files:
        read = ", ".join(_plural(kinds.get(k, 0), k) for k in settings.FOLDERS)
        unknown = len(files) - sum(kinds.values())
        folders = list(dict.fromkeys(_shown(f.parent) for f in files))
        print(f"monsoon validate: read {read}{f' and {unknown} of no known kind' if unknown else ''} from "
              f"{', '.join(folders)}", file=sys.stderr)
    if note:
        print(note, file=sys.stderr)
    n_pairs = f" and {len(pairs)} stack/experiment pair(s)" if pairs else ""
    verdict = f"{len(printed)} problem(s)" if printed else "all valid"
    print(f"monsoon validate: {len(files)} file(s){n_pairs}: {verdict}", file=sys.stderr)
    return 1 if printed else 0


# ------------------------------------------------------------------ payload

#: How each transport carries a message: the same JSON body (:mod:`monsoon.load.payloads`), sent this way.
TRANSPORT_CARRIES: dict[str, str] = {
    "mqtt": "an MQTT PUBLISH to the stack's devices.topic (default v1/devices/me/telemetry), QoS load.qos (default "
            "1: acked by PUBACK), MQTT 3.1.1; the client id is the device's name, the username its token (its name "
            "with provisioning: none), the password its password if it has one",
    "http": "POST /api/v1/{token}/telemetry (ThingsBoard's device API; the token percent-encoded), Content-Type: "
            "application/json",
    "coap": "a confirmable CoAP POST to /api/v1/{token}/telemetry, content-format application/json",
    "hono-http": "POST /telemetry with QoS-Level: 1 (events: POST /event; a command query adds hono-ttd), HTTP basic "
                 "auth <auth-id>@<tenant>:<password>, Content-Type: application/json",
    "hono-coap": "a confirmable CoAP POST to /telemetry (events: /event; a command query: /telemetry?hono-ttd=5) "
                 "over DTLS with a pre-shared key (identity <auth-id>@<tenant>), content-format application/json",
}


def _paths_of(obj, value, prefix: str = "") -> list[str]:
    """The dotted paths in a decoded JSON document whose value is ``value``."""
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _paths_of(v, value, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(obj, list):
        return [p for i, v in enumerate(obj) for p in _paths_of(v, value, f"{prefix}[{i}]")]
    return [prefix] if obj == value and type(obj) is type(value) else []


def payload_example(transport: str, profile: str = "minimal", template: str | None = None,
                    device: str = "monsoon-00000", seq: int = 7, ts: int = 1767225600000) -> str:
    """An example message of ``transport`` as monsoon sends it: how it is carried, its body, and where in the
    body the device id and the sequence number are (found in the rendered body itself)."""
    from monsoon.load.payloads import Payload
    from monsoon.spec.payload import POOL_MASK
    pay = Payload(profile, template=template)
    render = pay.renderer(0, device)
    body = render(seq, ts, ts + 3)
    # the same message with another seq and every other value unchanged (the pools repeat every POOL_MASK + 1 seqs;
    # the minimal profile's readings every 150): the paths that moved with seq are where it is carried
    other = seq + 150 * (POOL_MASK + 1)
    doc, doc2 = json.loads(body), json.loads(render(other, ts, ts + 3))
    seq_at = [p for p in _paths_of(doc, seq) if p in _paths_of(doc2, other)]
    dev_at = _paths_of(doc, device)
    lines = [f"# {transport}: {TRANSPORT_CARRIES[transport]}",
             f"# body ({profile} payload, {len(body)} bytes):",
             body.decode()]
    lines.append(f"# device id: {', '.join(dev_at) or 'not in the body (the template has no {device})'}"
                 f" = {device!r}; seq: {', '.join(seq_at) or 'not in the body (the template has no {seq})'} = {seq} "
                 "(each device counts 0, 1, 2, ... in the order it sends); "
                 + ("sent_ms: values.sent_ms (epoch ms at send); ts: ts (epoch ms)" if profile != "template"
                    else "the other placeholders as the template places them"))
    return "\n".join(lines)


def payload_cli(args) -> int:
    if not args.example:
        print("monsoon payload: --example prints an example message per transport (the only action so far)",
              file=sys.stderr)
        return 2
    profile = "template" if args.template else args.profile
    try:
        out = [payload_example(t, profile, args.template) for t in ([args.transport] if args.transport
                                                                     else list(TRANSPORT_CARRIES))]
    except ValueError as e:   # a template that cannot be used: says what and where
        print(f"monsoon payload: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    print("\n\n".join(out))
    return 0


# ------------------------------------------------------------------ schema

def check_catalogue() -> list[CheckInfo]:
    """monsoon's own checks (not those a plugin registers) with their parameters, as an experiment names them."""
    from monsoon.checks.registry import CHECKS
    from monsoon.spec.schema import REQUIRED, CheckInfo, CheckParam
    out = []
    for name, fn in sorted(CHECKS.items()):
        if not fn.__module__.startswith("monsoon.checks."):
            continue
        params = []
        for p in list(inspect.signature(fn).parameters.values())[1:]:
            default = REQUIRED if p.default is inspect.Parameter.empty else p.default
            params.append(CheckParam(p.name, default, text=default is None or isinstance(default, str)))
        out.append(CheckInfo(name, inspect.getdoc(fn) or "", tuple(params)))
    return out


def reference() -> str:
    """docs/reference.md: what ``monsoon schema --markdown`` prints."""
    from monsoon.spec.schema import markdown
    return markdown(check_catalogue())


def schema_cli(args) -> int:
    from monsoon.spec.schema import KINDS as SCHEMA_KINDS, json_schema, markdown
    if args.markdown:
        sys.stdout.write(markdown(check_catalogue(), [args.kind] if args.kind else list(SCHEMA_KINDS)))
        return 0
    if args.kind is None:
        print(f"monsoon schema: name a kind ({', '.join(SCHEMA_KINDS)}), or --markdown for the reference",
              file=sys.stderr)
        return 2
    print(json.dumps(json_schema(args.kind, check_catalogue()), indent=2))
    return 0


def dockerd_cli(args) -> int:
    from monsoon.stack import dockerd
    action = args.action
    if action == "status":
        pid = dockerd.running()
        print(f"running (pid {pid}): DOCKER_HOST=unix://{dockerd.sock_path()}" if pid else "not running")
        return 0 if pid else 1
    if action == "stop":
        print("stopped" if dockerd.stop() else "not running")
        return 0
    try:
        host, new = dockerd.start()
    except dockerd.DockerdError as e:
        print(f"monsoon dockerd: {e}", file=sys.stderr)
        return 1
    print(f"DOCKER_HOST={host}" + ("" if new else "   (already running)"))
    return 0


def cluster_cli(args) -> int:
    from monsoon.stack import cluster
    action = args.action
    if action == "status":
        rows = cluster.status()
        for piece, ok, line in rows:
            print(f"{piece:26s} {'ok ' if ok else '-- '} {line}")
        return 0 if all(ok for _, ok, _ in rows) else 1
    if action == "down":
        done = cluster.down()
        print("stopped: " + ", ".join(done) if done else "nothing was running")
        return 0
    try:
        took = cluster.up(chaos_mesh=args.chaos_mesh, say=print)
    except cluster.ClusterError as e:
        print(f"monsoon cluster: {e}", file=sys.stderr)
        return 1
    c = cluster.Cluster()
    print(f"node {c.node} Ready in {took:.1f}s: KUBECONFIG={c.kubeconfig}" if took else
          f"already running: KUBECONFIG={c.kubeconfig}")
    return 0


# ------------------------------------------------------------------ calibrate

def add_calibrate_arguments(p) -> None:
    from monsoon.run import calibrate
    d = calibrate.Params()
    p.add_argument("stack", help="a stack name (stacks/NAME.yaml) or a stack file")
    p.add_argument("--start-rate", type=float, default=d.start_rate, help=f"first step, msg/s (default {d.start_rate:g})")
    p.add_argument("--max-rate", type=float, default=d.max_rate, help=f"last step at most, msg/s (default {d.max_rate:g})")
    p.add_argument("--factor", type=float, default=d.factor, help=f"rate multiplier per step (default {d.factor:g})")
    p.add_argument("--step-seconds", type=int, default=int(d.step_seconds),
                   help=f"seconds per step, settle included (default {d.step_seconds:g})")
    p.add_argument("--warmup-seconds", type=int, default=int(d.warmup_seconds),
                   help=f"seconds at --start-rate before the first step, not judged (default {d.warmup_seconds:g}): "
                   "a platform just started is slower than it will be")
    p.add_argument("--settle-seconds", type=int, default=int(d.settle_seconds),
                   help=f"seconds at the start of each step not measured (default {d.settle_seconds:g})")
    p.add_argument("--devices", type=int, default=d.devices, help=f"devices (default {d.devices})")
    p.add_argument("--tolerance", type=float, default=d.criteria.tolerance,
                   help="achieved rates may fall this fraction below the sent rate (default 0.10)")
    p.add_argument("--latency-k", type=float, default=d.criteria.latency_k,
                   help="latency knee: p99 > K x the first step's p99 (default 5)")
    p.add_argument("--latency-floor-ms", type=float, default=d.criteria.latency_floor_ms,
                   help="... and above this many ms (default 250)")
    p.add_argument("--gc-fraction", type=float, default=None,
                   help="also stop at a step whose window the JVM spent more than this fraction of in GC "
                   "(its gc_seconds metric; e.g. 0.2; default: off)")
    p.add_argument("--profile", default="quick", choices=("quick", "nightly", "full"),
                   help="the stack's per-profile settings to start it with, e.g. its heap (default quick)")
    p.add_argument("--runs-dir", type=Path, default=None, help="default: $MONSOON_RUNS_DIR or <repo>/runs")
    p.add_argument("--run-id", default=None, help="default: a timestamped id")
    p.add_argument("--no-save", action="store_true", help="do not write the calibration to the user's cache (~/.cache/monsoon/calibration/<stack>.json, $MONSOON_CALIBRATION_DIR)")


def calibrate_cli(args) -> int:
    from monsoon.run import calibrate
    from monsoon.spec.stack import load_stack
    from monsoon.spec.yamlio import SpecError
    try:
        stack_spec = load_stack(args.stack)
    except SpecError as e:
        print(f"monsoon calibrate: {e}", file=sys.stderr)
        return 2
    try:
        params = calibrate.Params(start_rate=args.start_rate, factor=args.factor, max_rate=args.max_rate,
                        step_seconds=args.step_seconds, settle_seconds=args.settle_seconds,
                        warmup_seconds=args.warmup_seconds, devices=args.devices,
                        criteria=calibrate.Criteria(tolerance=args.tolerance, latency_k=args.latency_k,
                                          latency_floor_ms=args.latency_floor_ms,
                                          gc_fraction=args.gc_fraction))
    except ValueError as e:
        print(f"monsoon calibrate: {e}", file=sys.stderr)
        return 2
    runs = settings.runs_dir(args.runs_dir)
    run_id = args.run_id or new_run_id()
    out = runs / run_id / calibrate_dir_name(stack_spec.name)
    save = None if args.no_save else calibrate.calibration_file(calibrate.calibration_dir(), stack_spec.name)
    stop = threading.Event()
    rec = calibrate.calibrate(stack_spec, out, run_id=run_id, profile=args.profile, params=params,
                    progress=lambda s: print(s, flush=True), stop=stop, save_to=save)
    print_calibration(rec)
    print(f"monsoon calibrate {stack_spec.name}: {rec['result']}")
    print(f"  run directory: {out}" + (f"; saved {rec['saved_to']}" if rec.get("saved_to") else ""))
    return 0 if rec.get("capacity_msg_s") is not None and not rec.get("error") else 1


def print_calibration(rec: dict) -> None:
    from rich.console import Console
    from rich.table import Table
    t = Table(title=f"calibration of {rec['stack']} on {rec['host']} ({rec['cpu_count']} CPUs, {rec['date']})")
    for col in ("step", "target/s", "sent/s", "acked/s", "stored/s", "backlog slope/s", "backlog", "p99 ms",
                "late", "kept up"):
        t.add_column(col, justify="right" if col != "kept up" else "left")

    def n(x):
        return "-" if x is None else f"{x:,.0f}"
    for s in rec["steps"]:
        t.add_row(str(s["index"]), n(s["target"]), n(s["send_rate"]), n(s["ack_rate"]), n(s["stored_rate"]),
                  n(s["backlog_slope"]), n(s["backlog_end"]), n(s["p99_ms"]), n(s["late"]),
                  "yes" if s["ok"] else f"NO: {s['criterion']}")
    Console(width=None if sys.stdout.isatty() else 140).print(t)


# ------------------------------------------------------------------ history, signoff, schedule

EXAMPLE_POLICY = REPO / "docs" / "signoff.yaml"


def _runs_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--runs-dir", type=Path, default=None,
                   help="the runs directory whose history.sqlite to read (default: MONSOON_RUNS_DIR or runs/); "
                   "MONSOON_HISTORY_URL=postgresql://... reads a shared Postgres instead")


def add_history(sub) -> argparse.ArgumentParser:
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
    return h


def history_cli(args) -> int:
    from monsoon.history.store import HistoryStore, default_location
    from monsoon.history.views import as_json, as_text
    rd = settings.runs_dir(args.runs_dir)
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
        from monsoon.history import html as history_html   # matplotlib: only for the page
        out = history_html.write(Path(args.html) if args.html else rd / history_html.HISTORY_PAGE, rows, args.last)
        print(f"wrote {out}", file=sys.stderr)
    if args.json:
        print(json.dumps(as_json(rows, args.last), indent=2, default=str))
    elif args.html is None:
        print(as_text(rows, args.last), end="")
    return 0


def add_signoff(sub) -> argparse.ArgumentParser:
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
    return s


def signoff_cli(args) -> int:
    from monsoon.history import signoff as so
    from monsoon.history.store import HistoryStore, default_location
    from monsoon.spec.yamlio import SpecError
    path = args.policy or (Path("signoff.yaml") if Path("signoff.yaml").exists() else EXAMPLE_POLICY)
    try:
        policy = so.load_policy(path)
    except SpecError as e:
        print(str(e), file=sys.stderr)
        return 2
    with HistoryStore(default_location(settings.runs_dir(args.runs_dir))) as store:
        rows = store.rows()
    result = so.judge(policy, rows, now=args.now)
    md = so.markdown(result)
    print(md, end="")
    if args.markdown:
        args.markdown.write_text(md)
    if args.html:
        args.html.write_text(so.to_html(result))
    return result.exit_code


def add_schedule(sub) -> argparse.ArgumentParser:
    s = sub.add_parser("schedule", help="render (or --install) a systemd timer, a crontab line or a Kubernetes "
                       "CronJob that runs pytest on a schedule",
                       description="Renders what runs `monsoon scheduled-run -- PYTEST_ARGS` on a schedule: a systemd "
                       "service + timer pair (Persistent=true), or a /etc/cron.d line, or a Kubernetes CronJob "
                       "(concurrencyPolicy: Forbid, startingDeadlineSeconds, history limits). --install writes the "
                       "systemd units or the cron.d file under --root (default /; on / the timer is enabled). "
                       "Locally a lock per schedule plays Forbid: a firing that finds the last run still going is "
                       "recorded in the history as skipped; one that starts past its deadline, as missed. "
                       "--target kubernetes --install creates the CronJob (and a ServiceAccount that reads its "
                       "events: each run records the firings the controller skipped under Forbid) in the cluster "
                       "(KUBECONFIG, else monsoon's); without --image, monsoon's own image is made from this "
                       "machine's Python and checkout and imported into monsoon's cluster. --uninstall removes it.")
    when = s.add_mutually_exclusive_group()
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
    s.add_argument("--runs-hostpath", default=None, metavar="DIR",
                   help="kubernetes: the node's directory for the runs and a SQLite history (a hostPath at the "
                   "same path in the pod)")
    s.add_argument("--install", action="store_true", help="install instead of printing (kubernetes: in the cluster)")
    s.add_argument("--uninstall", action="store_true", help="kubernetes: remove the schedule's CronJob, its Jobs "
                   "and its ServiceAccount/Role/RoleBinding")
    s.add_argument("--root", type=Path, default=Path("/"), help="with --install: write under this root (tests)")
    s.add_argument("pytest_args", nargs=argparse.REMAINDER, help="-- then the pytest arguments, e.g. -- -m chaos")
    return s


def schedule_cli(args) -> int:
    from monsoon.history import schedule as sched
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    try:
        name = sched.check_name(args.name)
        if args.uninstall:
            if args.target != "kubernetes":
                raise sched.ScheduleError("--uninstall is for --target kubernetes (systemctl disable / rm the "
                                          "cron.d file for the others)")
            return _schedule_kube(args, name, "", pytest_args)
        if not (args.every or args.cron):
            raise sched.ScheduleError("give --every INTERVAL or --cron EXPR")
        if args.every:
            cron = sched.every_to_cron(args.every)
        else:
            sched.parse_cron(args.cron)   # a bad expression: ScheduleError
            cron = args.cron
        if args.deadline <= 0:
            raise sched.ScheduleError(f"--deadline {args.deadline}: must be > 0 seconds")
        if args.target == "kubernetes":
            return _schedule_kube(args, name, cron, pytest_args)
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


def _schedule_kube(args, name: str, cron: str, pytest_args: list[str]) -> int:
    """--target kubernetes: print the CronJob (and its ServiceAccount/Role/RoleBinding), or --install/--uninstall
    them in the cluster."""
    def say(s: str) -> None:
        print(f"monsoon schedule: {s}", file=sys.stderr)

    import yaml

    from monsoon.history import schedule as sched
    from monsoon.stack import cluster, schedule_kube, selfimage
    from monsoon.stack.pods import PodError
    try:
        if args.uninstall:
            gone = schedule_kube.uninstall(name, args.namespace, say=say)
            if not gone:
                say(f"no CronJob monsoon-{name} in namespace {args.namespace}")
            return 0
        if args.install and not (args.runs_hostpath or args.history_secret):
            raise sched.ScheduleError("--target kubernetes --install needs where the history goes: --runs-hostpath "
                                      "DIR (SQLite on the node) or --history-secret NAME (MONSOON_HISTORY_URL)")
        image = args.image
        if not image:
            if not args.install:
                raise sched.ScheduleError("--target kubernetes needs --image (or --install: monsoon's own image "
                                          "is made and imported into monsoon's cluster)")
            image = selfimage.ensure(say=say)
        runs = args.runs_dir or args.runs_hostpath or "/monsoon/runs"
        cmd = sched.run_command(name, pytest_args, deadline=args.deadline, cron=cron, runs_dir=runs)
        objs = sched.rbac(name, args.namespace) + [sched.cronjob(
            name, cmd, cron, image=image, namespace=args.namespace, deadline=args.deadline,
            history=args.history_limit, history_secret=args.history_secret, runs_hostpath=args.runs_hostpath,
            service_account=f"monsoon-{name}")]
        if args.install:
            schedule_kube.apply(objs, say=say)
            return 0
        sys.stdout.write(yaml.safe_dump_all(objs, sort_keys=False))
        return 0
    except (cluster.ClusterError, PodError) as e:
        print(f"monsoon schedule: {e}", file=sys.stderr)
        return 2


def add_scheduled_run(sub) -> argparse.ArgumentParser:
    s = sub.add_parser("scheduled-run", help="one firing of a schedule (what `monsoon schedule` installs runs)")
    s.add_argument("--name", default="chaos")
    s.add_argument("--cron", default=None, help="the schedule, to tell a late (missed) firing")
    s.add_argument("--deadline", type=int, default=600)
    s.add_argument("--runs-dir", type=Path, default=None)
    s.add_argument("pytest_args", nargs=argparse.REMAINDER)
    return s


def scheduled_run_cli(args) -> int:
    from monsoon.history import schedule as sched
    pytest_args = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    try:
        return sched.scheduled_run(sched.check_name(args.name), pytest_args, settings.runs_dir(args.runs_dir),
                                   cron=args.cron, deadline=args.deadline)
    except sched.ScheduleError as e:
        print(f"monsoon scheduled-run: {e}", file=sys.stderr)
        return 2


# ------------------------------------------------------------------ the rest, and main

def analyze_cli(args) -> int:
    from monsoon.analysis import analyze
    from monsoon.report.checklist import checklist
    s = analyze(args.run_dir)
    if "sweeps" in s:                     # a monsoon sweep's directory: its own checklist
        for name in s["sweeps"]:
            print((Path(args.run_dir).resolve() / name / CHECKLIST_FILE).read_text())
        return 0 if all(v["verdict"] == "pass" for vs in s["sweeps"].values() for v in vs) else 1
    print(checklist(s))
    return 0 if all(r["verdict"] == "pass" for r in s["results"]) else 1


def export_cli(args) -> int:
    from monsoon.analysis import export_csv
    return export_csv(args.run_dir)


def checklist_cli(args) -> int:
    p = Path(args.run_dir) / CHECKLIST_FILE
    if not p.exists():
        print(f"monsoon checklist: no {CHECKLIST_FILE} in {args.run_dir}", file=sys.stderr)
        return 2
    print(p.read_text())
    return 0


def heal_cli(args) -> int:
    from monsoon.faults.heal import heal_everything
    rep = heal_everything(None if args.all else args.run_id, toxiproxy_apis=args.toxiproxy_api,
                          reap_processes=not args.keep_processes)
    for line in rep.notes:
        print(line)
    for line in rep.done:
        print("healed", line)
    for failure in rep.failed:
        print(failure)                  # "heal <what> FAILED: <reason>"
    if not rep.done and not rep.failed:
        print("nothing to heal")
    for rid, left in rep.census.items():
        for x in left:
            print(f"STILL IN PLACE {rid} {x}")
    return 1 if rep.census or rep.failed else 0


def reap_cli(args) -> int:
    from monsoon.faults.heal import reap_left_behind
    from monsoon.stack import cluster, dockerd
    rep = reap_left_behind(args.run_id)
    for line in rep.notes:
        print(line)
    print(f"killed {len(rep.pids)} leftover process(es): {rep.pids}" if rep.pids else "nothing left behind")
    if rep.containers:
        print(f"removed {len(rep.containers)} leftover container(s): {', '.join(rep.containers)}")
    if rep.releases:
        print(f"uninstalled {len(rep.releases)} leftover Helm release(s): {', '.join(rep.releases)}")
    if rep.namespaces:
        print(f"deleted {len(rep.namespaces)} leftover namespace(s) and their pods: {', '.join(rep.namespaces)}")
    if args.run_id is not None:
        return 0
    if rep.shared_in_use:      # a live run may be on them
        print("left monsoon's private dockerd and cluster running (a live run may use them)")
        return 0
    if dockerd.stop():
        print(f"stopped monsoon's private dockerd ({dockerd.root()})")
    why = cluster.left_behind()
    if why:
        print(f"stopped monsoon's cluster ({why}): " + ", ".join(cluster.down()))
    return 0


def init_cli(args) -> int:
    from monsoon import scaffold
    try:
        written = scaffold.init(args.dir)
    except scaffold.InitError as e:
        print(e, file=sys.stderr)
        return 1
    print(f"monsoon init: wrote {len(written)} files in {args.dir.resolve()}: "
          + ", ".join(str(p.relative_to(args.dir)) for p in written))
    return 0


def setup_cli(args) -> int:
    return hostsetup.setup(args.pieces)


def demo_cli(args) -> int:
    return demo(args.pytest_args)


class _Subcommand(argparse.ArgumentParser):
    """A subcommand's parser, some of whose arguments may be added only when it is used: parsed (it is the
    subcommand run) or its help or usage printed. A subcommand whose arguments take their defaults or choices from
    a heavy module (:meth:`defer`) costs nothing to ``monsoon --help`` nor to another subcommand."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._deferred: list[Callable[[argparse.ArgumentParser], None]] = []

    def defer(self, add: Callable[[argparse.ArgumentParser], None]) -> None:
        """``add(self)`` when the parser is first used, not now."""
        self._deferred.append(add)

    def then(self, add: Callable[[argparse.ArgumentParser], None]) -> None:
        """``add(self)`` now, or after what is deferred when something is (the arguments keep their order)."""
        if self._deferred:
            self._deferred.append(add)
        else:
            add(self)

    def _complete(self) -> None:
        while self._deferred:
            self._deferred.pop(0)(self)

    def parse_known_args(self, args=None, namespace=None):
        self._complete()
        return super().parse_known_args(args, namespace)

    def format_usage(self) -> str:
        self._complete()
        return super().format_usage()

    def format_help(self) -> str:
        self._complete()
        return super().format_help()


def add_schema_arguments(p: argparse.ArgumentParser) -> None:
    from monsoon.spec.schema import KINDS as SCHEMA_KINDS
    p.add_argument("kind", nargs="?", choices=list(SCHEMA_KINDS), help="which kind of file")
    p.add_argument("--markdown", action="store_true", help="the format reference in Markdown (every kind, or KIND)")


def add_payload_arguments(p: argparse.ArgumentParser) -> None:
    from monsoon.spec.payload import PAYLOAD_PROFILES
    p.add_argument("--example", action="store_true", help="print an example message")
    p.add_argument("--transport", choices=list(TRANSPORT_CARRIES), default=None,
                   help="only this transport (default: every one)")
    p.add_argument("--profile", choices=[x for x in PAYLOAD_PROFILES if x != "template"], default="minimal",
                   help="the payload profile (load.payload.profile; default minimal)")
    p.add_argument("--template", default=None, metavar="JSON",
                   help="a template payload (load.payload.template, profile template) instead of --profile")


def add_sweep_arguments(p: argparse.ArgumentParser) -> None:
    from monsoon.run import sweep as size_sweep
    size_sweep.add_arguments(p)


def sweep_cli(args) -> int:
    from monsoon.run import sweep as size_sweep
    return size_sweep.cli(args)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="monsoon", description="monsoon: chaos and soak testing for IoT ingestion "
                                 "platforms. Scenarios run under pytest (pytest -m burst); this command "
                                 "works on saved runs and specs.")
    add_project_arguments(ap, None)
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=_Subcommand)
    a = sub.add_parser("analyze", help="re-run the checks of a saved run offline and rewrite its report")
    a.add_argument("run_dir", type=Path, help="a run directory, e.g. runs/latest")
    ex = sub.add_parser("export", help="write a run's Parquet run data (acked, stored, sent) back as CSV files")
    ex.add_argument("run_dir", type=Path, help="a run directory, e.g. runs/latest (or one experiment's folder)")
    ex.add_argument("--csv", action="store_true", required=True, help="as CSV (the only format so far)")
    c = sub.add_parser("checklist", help="print the sign-off checklist of a run")
    c.add_argument("run_dir", type=Path)
    v = sub.add_parser("validate", help="validate stack, experiment and fault-profile YAML without running anything",
                       description="Validates each FILE as what its content says it is (a stack has services:, an "
                       "experiment load:, a fault profile kind:); a folder stands for its YAML files. --stack and "
                       "--experiment validate the two together, as a run would: fault targets and env services "
                       "exist in the stack, and every check can be judged from what the stack observes. With no "
                       "argument: every YAML file in stacks/, experiments/ and fault-profiles/, and every "
                       "(stack, experiment) pair a scenario in pytest/ runs. Prints one line per problem, "
                       "FILE:LINE: KEY: MESSAGE; exit 1 if there is any.")
    v.add_argument("files", nargs="*", type=Path, metavar="FILE", help="spec files or folders")
    v.add_argument("--stack", help="a stack name or file, validated with --experiment")
    v.add_argument("--experiment", help="an experiment name or file, validated with --stack")
    v.add_argument("--profile", choices=("quick", "nightly", "full"),
                   help="with --stack/--experiment: only this profile (default: each of the experiment's)")
    v.add_argument("--force", action="store_true",
                   help=f"accept what is past monsoon's sanity ceilings (a multiplier above x100), as {opt.FORCE}")
    sc = sub.add_parser("schema", help="print the JSON Schema of a kind of spec file (for YAML language servers), "
                        "or the format reference (--markdown)",
                        description="Prints the JSON Schema (draft 2020-12) of stack, experiment or fault-profile "
                        "files, generated from monsoon's models, for a YAML language server to validate and "
                        "complete them. --markdown prints the format reference instead (docs/reference.md): every "
                        "key, its type, default and meaning.")
    sc.defer(add_schema_arguments)
    r = sub.add_parser("reap", help="kill processes and remove containers, Helm releases and namespaces left behind "
                      "by a run that was killed with -9 (without --run-id: every run whose monsoon process is gone, "
                      "live runs named and left alone; then monsoon's private dockerd and its cluster when no run "
                      "is live)")
    r.add_argument("--run-id", default=None, help="only this run, even while its monsoon process still runs "
                   "(default: every run whose monsoon process is gone)")
    h = sub.add_parser("heal", help="heal every fault left in place by a run that was killed with -9, "
                       "stop its processes, and print the census",
                       description="Thaws SIGSTOPped processes, restores cgroup memory limits, deletes the run's "
                       "Toxiproxy toxics and proxies, deletes labelled Chaos Mesh / Litmus objects (when a cluster "
                       "is configured: in the namespaces of MONSOON_KUBE_NAMESPACES), unpauses the run's paused containers "
                       "and restores their memory limits, then kills the run's leftover processes and removes its "
                       "containers (label monsoon.run-id). --all leaves alone every run whose monsoon process is still alive (its "
                       "MONSOON_OWNER_PID label) and says so; --run-id heals that run regardless. "
                       "Exit 0 when every step worked and the census is clean; a step that failed is printed \"heal ... FAILED: <reason>\".")
    which = h.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true",
                       help="every monsoon run that left something behind and whose monsoon process is gone "
                       "(a live run is skipped)")
    which.add_argument("--run-id", help="only this run, even if its monsoon process is still alive")
    h.add_argument("--toxiproxy-api", action="append", default=[], metavar="URL",
                   help="also sweep this Toxiproxy server (e.g. a shared one); the servers monsoon started are "
                   "found by themselves")
    h.add_argument("--keep-processes", action="store_true", help="heal faults but leave the run's processes running")
    dk = sub.add_parser("dockerd", help="start or stop monsoon's private Docker daemon (own socket and data root, "
                        "no bridge, no iptables)",
                        description="start: runs dockerd under <cache>/dockerd (MONSOON_DOCKERD_DIR) with its own "
                        "socket, data root and exec root, --bridge=none --iptables=false; prints the DOCKER_HOST "
                        "to use. stop: stops it and unmounts what it left. status: says whether it runs.")
    dk.add_argument("action", choices=("start", "stop", "status"))
    kc = sub.add_parser("cluster", help="start, stop or inspect monsoon's single-node Kubernetes cluster (make k8s)",
                        description="up: starts etcd, the API server, controller-manager, scheduler, a private "
                        "containerd and kubelet inside the network namespace monsoon-k8s, waits for the node to be "
                        "Ready and writes <cache>/k8s/cluster/kubeconfig (server https://127.0.0.1:PORT, a "
                        "forwarder). down: stops all of it and restores what kubelet changed. status: one line "
                        "per piece.")
    kc.add_argument("action", choices=("up", "down", "status"))
    kc.add_argument("--chaos-mesh", action="store_true", help="up: also apply Chaos Mesh's CRDs and run "
                    "chaos-controller-manager")
    ini = sub.add_parser("init", help="write a starting project: stacks/, experiments/, fault-profiles/, pytest/, "
                         "conftest.py, requirements.txt, README.md (never overwrites a file)")
    ini.add_argument("dir", type=Path, nargs="?", default=Path("."), help="the project folder (default: .)")
    su = sub.add_parser("setup", help="install/build what the shipped stacks need, piece by piece (idempotent)",
                        description="Pieces: " + ", ".join(hostsetup.PIECES) + " (postgres, mosquitto, chromium: that "
                        "Debian package alone; debs: the three, for monsoon's own tests). With none: all "
                        "but images and k8s. Nothing already running is stopped: a system PostgreSQL or Mosquitto is "
                        "left running, said in one line. Downloads and builds go to the cache (MONSOON_CACHE, else .cache in a "
                        "checkout, else ~/.cache/monsoon); each refusal is one line naming what to install.")
    su.add_argument("pieces", nargs="*", metavar="PIECE")
    d = sub.add_parser("demo", help="run the reference burst story (x10 on the in-memory and Kafka stacks) and check it")
    d.add_argument("pytest_args", nargs=argparse.REMAINDER, help="extra pytest arguments")
    pl = sub.add_parser("payload", help="print an example message per transport: where the device id and the seq are",
                        description="--example prints, per transport (or --transport's), how monsoon carries a "
                        "message (topic, path, headers, credentials), the JSON body it sends, and where in that body "
                        "the device id (values.device) and the per-device sequence number (values.seq) are.")
    pl.defer(add_payload_arguments)
    cal = sub.add_parser("calibrate", help="ramp the load on a stack until it stops keeping up; record its capacity",
                         description="Starts STACK, ramps the rate geometrically (--start-rate, x--factor per step of "
                         "--step-seconds) and stops at the first step the stack does not keep up with (stored or "
                         "acked rate below the sent rate, queue/lag growing, p99 latency knee) or the fleet cannot "
                         "send (generator-bound). Writes runs/<run-id>/calibrate-<stack>/ and "
                         "~/.cache/monsoon/calibration/<stack>.json (the user's cache), which base_rate: auto reads.")
    cal.defer(add_calibrate_arguments)
    sw = sub.add_parser("sweep", help="a size sweep: the platform's capacity per payload size beside its transport's",
                        description="Starts STACK once and, for each of the experiment's load.payload.sizes, ramps "
                        "the load as monsoon calibrate does (plus GC saturation) and measures the stack's Kafka "
                        "alone at that size. Writes runs/<run-id>/<stack>--<experiment>/ with "
                        f"{SWEEP_FILE}, {CHECKLIST_FILE}, {REPORT_FILE} and {SWEEP_PLOT}.")
    sw.defer(add_sweep_arguments)
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
    for p, run in ((a, analyze_cli), (ex, export_cli), (c, checklist_cli), (v, validate_cli), (sc, schema_cli),
                   (r, reap_cli), (h, heal_cli), (dk, dockerd_cli), (kc, cluster_cli), (ini, init_cli),
                   (su, setup_cli), (d, demo_cli), (cal, calibrate_cli), (sw, sweep_cli), (j, load_job),
                   (pl, payload_cli), (add_history(sub), history_cli), (add_signoff(sub), signoff_cli),
                   (add_schedule(sub), schedule_cli), (add_scheduled_run(sub), scheduled_run_cli)):
        p.set_defaults(run=run)
        assert isinstance(p, _Subcommand)   # every one is made by sub.add_parser
        # before or after the subcommand: `monsoon validate --project D` (after a deferred subcommand's own)
        p.then(lambda p: add_project_arguments(p, argparse.SUPPRESS))
    args = ap.parse_args(argv)
    try:
        chosen = settings.for_command(args.project, [d.resolve() for d in args.specs or ()], None)
    except Exception as e:   # pytest's ini finder: an unreadable pyproject.toml, ... (pytest would refuse it too)
        print(f"monsoon: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    with settings.using(project=chosen.project, specs=chosen.specs, runs=chosen.runs, inipath=chosen.inipath):
        return args.run(args)


def add_project_arguments(p: argparse.ArgumentParser, default) -> None:
    """``--project`` and ``--specs``: where the command finds the project, as pytest there would (the main parser's
    defaults are None; a subcommand's are SUPPRESS, so that either place works)."""
    p.add_argument("--project", type=Path, default=default, metavar="DIR",
                   help="the user's project, as a `pytest` started in DIR sees it: its ini file (pyproject.toml, "
                   "pytest.ini, tox.ini, setup.cfg: monsoon_specs, monsoon_runs_dir), its stacks/, experiments/, "
                   "fault-profiles/ and runs/ (default: what pytest finds from the current directory: the folder "
                   "of its ini file, else upwards to a pyproject.toml, pytest.ini, setup.cfg or tox.ini)")
    p.add_argument("--specs", type=Path, action="append", default=default, metavar="DIR",
                   help="look stacks, experiments and fault profiles up by name in DIR (its stacks/, experiments/, "
                   f"fault-profiles/, or DIR itself) before the project's and monsoon's own, as {opt.SPECS}; "
                   "repeatable (default: the ini file's monsoon_specs)")


if __name__ == "__main__":
    sys.exit(main())
