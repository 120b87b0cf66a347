"""``make defects``: prove the checks on seeded defects, and prove they stay quiet on a clean stack.

The reasoning, sources and measurements behind it: docs/design.md, "monsoon/selftest/defects.py"."""
from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import yaml

from monsoon.checks.base import check_base
from monsoon.checks.registry import CHECKS
from monsoon.paths import REPO
from monsoon.run.shield import sigterm_as_interrupt
from monsoon.run.validate import load_checked
from monsoon.selftest.neighbour import busy_neighbour
from monsoon.session import MonsoonSession
from monsoon.spec.stack import load_stack
from monsoon.stack import cpubudget


FLAG_PREFIX = "DEFECT_"
FAIL, UNKNOWN = "fail", "unknown"


@dataclass(frozen=True)
class Defect:
    letter: str
    slug: str
    stack: str
    expected: str          # the check that must fail
    flag: str              # the platform's environment variable that switches it on
    trigger: str           # what in the experiment makes it bite

    @property
    def key(self) -> str:
        return f"{self.letter}-{self.slug}"

    @property
    def experiment(self) -> str:
        return f"defect-{self.key}"

    def path(self, repo: Path = REPO) -> Path:
        return repo / "experiments" / f"{self.experiment}.yaml"


DEFECTS: tuple[Defect, ...] = (
    Defect("a", "drop-acked", "inmemory", "no_acked_loss", "DEFECT_DROP_ACKED_PCT",
           "none needed: 0.1% of every batch is skipped"),
    Defect("b", "duplicates", "kafka", "no_duplicates", "DEFECT_DUPLICATE_ON_REDELIVERY",
           "platform pauses longer than the Kafka session timeout: the consumer is expelled, its commit fails and "
           "the written batch is redelivered"),
    Defect("c", "memory-leak", "inmemory", "no_memory_leak", "DEFECT_LEAK_BYTES_PER_MSG",
           "none needed: steady load, 1 KiB kept per stored message"),
    Defect("d", "stall", "kafka-registry", "consumer_not_stalled", "DEFECT_STALL_AFTER_BROKER_RESTART",
           "kafka-broker-restart"),
    Defect("e", "early-commit", "kafka", "no_acked_loss", "DEFECT_COMMIT_BEFORE_WRITE",
           "pod-kill (SIGKILL) of the platform while a committed batch is being written"),
    Defect("f", "thread-leak", "inmemory", "no_thread_leak", "DEFECT_LEAK_THREAD_PER_RECONNECT",
           "a 40 s platform pause: every device's MQTT keepalive expires and it reconnects"),
    Defect("g", "pool-starvation", "cassandra-ack", "no_ingest_stall", "DEFECT_CASSANDRA_MAX_REQUESTS_PER_CONNECTION",
           "none needed: 2 requests in flight per connection; every Cassandra latency blip stalls the acks"),
)


# ------------------------------------------------------------------ specs

def load_doc(path: Path) -> dict:
    with open(path) as fh:
        doc = yaml.safe_load(fh)
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a YAML mapping")
    return doc


def defect_flags(doc: dict) -> dict[str, dict[str, str]]:
    """``{service: {DEFECT_*: value}}`` of an experiment document."""
    out: dict[str, dict[str, str]] = {}
    for svc, env in (doc.get("env") or {}).items():
        flags = {k: str(v) for k, v in (env or {}).items() if str(k).startswith(FLAG_PREFIX)}
        if flags:
            out[svc] = flags
    return out


def strip_flags(doc: dict) -> dict:
    """The experiment document without any ``DEFECT_*`` variable (services left with no env dropped)."""
    out = json.loads(json.dumps(doc))   # deep copy of plain YAML data
    env = {}
    for svc, e in (out.get("env") or {}).items():
        kept = {k: v for k, v in (e or {}).items() if not str(k).startswith(FLAG_PREFIX)}
        if kept:
            env[svc] = kept
    if env:
        out["env"] = env
    else:
        out.pop("env", None)
    return out


def layout_key(stack: str, doc: dict) -> str:
    """What makes two defect experiments share a clean control: everything but name, description and flags."""
    d = {k: v for k, v in strip_flags(doc).items() if k not in ("name", "description")}
    return json.dumps({"stack": stack, "experiment": d}, sort_keys=True, default=str)


@dataclass(frozen=True)
class Control:
    """One clean control: the stripped experiment shared by ``letters``."""
    name: str
    stack: str
    doc: dict
    letters: tuple[str, ...]


def clean_controls(defects: Iterable[Defect], docs: dict[str, dict]) -> list[Control]:
    """Group the defects by layout; one clean control per group, named ``defect-clean-<letters>``."""
    groups: dict[str, list[Defect]] = {}
    for d in defects:
        groups.setdefault(layout_key(d.stack, docs[d.key]), []).append(d)
    out = []
    for ds in groups.values():
        letters = tuple(d.letter for d in ds)
        doc = strip_flags(docs[ds[0].key])
        doc["name"] = "defect-clean-" + "".join(letters)
        doc["description"] = (f"clean control of seeded defect(s) {', '.join(letters)}: "
                              f"{', '.join(d.experiment for d in ds)} without the DEFECT_* flags")
        out.append(Control(doc["name"], ds[0].stack, doc, letters))
    return out


# ------------------------------------------------------------------ the matrix (pure)

def _checks(result: dict | None) -> list[dict]:
    return list((result or {}).get("checks") or [])


def defect_entry(defect: Defect, result: dict | None) -> dict:
    """One row of the catch matrix from an experiment result (``ExperimentResult.to_dict()`` shape)."""
    checks = _checks(result)
    failed = [c["name"] for c in checks if c.get("verdict") == FAIL]
    # a check may give several verdicts (latency_objective[<phase>]): any of them failing catches the defect
    mine = [c for c in checks if check_base(c.get("name", "")) == defect.expected]
    exp = next((c for c in mine if c.get("verdict") == FAIL), mine[0] if mine else None)
    entry: dict[str, Any] = {
        "expected": defect.expected,
        "caught_by": failed,
        "caught": any(check_base(n) == defect.expected for n in failed),
        "expected_verdict": exp.get("verdict") if exp else ("not run" if result is None else "missing"),
        "stack": defect.stack,
        "experiment": defect.experiment,
    }
    if exp is not None:
        entry["figures"] = exp.get("figures", {})
        entry["message"] = exp.get("message", "")
    if result is not None and result.get("error"):
        entry["error"] = result["error"]
    if result is not None and result.get("dir"):
        entry["dir"] = result["dir"]
    return entry


def clean_entry(control: str, repeat: int, result: dict | None) -> dict:
    """A clean run: which checks failed (false alarms) and which could not decide."""
    checks = _checks(result)
    e: dict[str, Any] = {
        "experiment": control, "repeat": repeat,
        "verdict": (result or {}).get("verdict", "not run"),
        "false_alarms": [c["name"] for c in checks if c.get("verdict") == FAIL],
        "unknown": [c["name"] for c in checks if c.get("verdict") == UNKNOWN],
        "checks": {c["name"]: c.get("verdict") for c in checks},
    }
    if result is None or not checks:
        e["unknown"] = e["unknown"] or ["(no verdicts)"]
    if result is not None and result.get("error"):
        e["error"] = result["error"]
    if result is not None and result.get("dir"):
        e["dir"] = result["dir"]
    return e


def summarize(defects: list[Defect], defect_results: dict[str, dict | None],
              clean: list[tuple[str, int, dict | None]], seconds: float, repeats: int) -> dict:
    """The catch matrix as one JSON-able dict.

    ``defect_results``: defect key -> result dict (None = did not run); ``clean``: (control name, repeat, result).
    """
    matrix = {d.key: defect_entry(d, defect_results.get(d.key)) for d in defects}
    cleans = [clean_entry(n, i, r) for n, i, r in clean]
    out = {
        "defects": len(defects),
        "caught": sum(1 for m in matrix.values() if m["caught"]),
        "clean_runs": len(cleans),
        "clean_repeats": repeats,
        "false_alarms": sum(len(c["false_alarms"]) for c in cleans),
        "clean_unknown": sum(len(c["unknown"]) for c in cleans),
        "matrix": matrix,
        "clean": cleans,
        "seconds": round(seconds, 1),
    }
    return out


def passed(summary: dict) -> bool:
    """Every defect caught by its intended check; clean runs without false alarm or unknown."""
    return (summary["caught"] == summary["defects"] and summary["false_alarms"] == 0
            and summary["clean_unknown"] == 0 and (summary["clean_runs"] > 0 or summary["clean_repeats"] == 0))


def problems(summary: dict) -> list[str]:
    out = []
    for k, m in summary["matrix"].items():
        if not m["caught"]:
            out.append(f"defect {k} NOT caught: {m['expected']} was {m['expected_verdict']}"
                       + (f" (failed instead: {', '.join(m['caught_by'])})" if m["caught_by"] else "")
                       + (f"; error: {m['error']}" if m.get("error") else ""))
    for c in summary["clean"]:
        if c["false_alarms"]:
            out.append(f"FALSE ALARM on clean {c['experiment']} #{c['repeat']}: {', '.join(c['false_alarms'])}")
        if c["unknown"]:
            out.append(f"clean {c['experiment']} #{c['repeat']} could not decide: {', '.join(c['unknown'])}"
                       + (f"; error: {c['error']}" if c.get("error") else ""))
    return out


# ------------------------------------------------------------------ running

def select(only: str | None) -> list[Defect]:
    if not only:
        return list(DEFECTS)
    want = {x.strip() for x in only.split(",") if x.strip()}
    chosen = [d for d in DEFECTS if d.letter in want or d.key in want]
    unknown = want - {d.letter for d in chosen} - {d.key for d in chosen}
    if unknown:
        raise SystemExit(f"monsoon defects: unknown defect(s) {', '.join(sorted(unknown))} "
                         f"(known: {', '.join(d.key for d in DEFECTS)})")
    return chosen


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m monsoon.selftest.defects",
                                 description="Run every seeded defect's quick experiment and the clean controls; "
                                             "print the catch matrix as one JSON line.")
    ap.add_argument("--only", help="comma-separated defects (letters or keys, e.g. a,d); their clean controls only")
    ap.add_argument("--repeats", type=int, default=3, help="clean runs of each control (default 3; 0 = none)")
    ap.add_argument("--no-defects", action="store_true", help="only the clean controls")
    ap.add_argument("--profile", default="quick", choices=("quick", "nightly", "full"))
    ap.add_argument("--runs-dir", type=Path, default=None, help="default: runs/ (or MONSOON_RUNS_DIR)")
    ap.add_argument("--run-id", default=None)
    ap.add_argument("--neighbour", action="store_true",
                    help="run everything beside a busy loop that burns one core (a machine that is not idle); "
                         "the matrix records the cores it took. For a CPU quota on the services, set "
                         "MONSOON_SERVICE_CPUS (e.g. 0.5)")
    args = ap.parse_args(argv)
    if args.repeats < 0:
        ap.error("--repeats must be >= 0")


    try:
        service_cpus = cpubudget.budget_from_env()     # the services' CPU quota, if any: a bad one said now
    except ValueError as bad:
        raise SystemExit(f"monsoon defects: {bad}") from None
    defects = select(args.only)
    docs = {}
    for d in defects:   # validate everything before starting anything
        load_stack(d.stack)
        spec = load_checked(d.path())
        spec.durations(args.profile)
        if d.expected not in CHECKS:
            raise SystemExit(f"monsoon defects: {d.experiment} expects check {d.expected!r}, which is not registered")
        if d.expected not in {c.name for c in spec.checks}:
            raise SystemExit(f"monsoon defects: {d.path()} does not run its intended check {d.expected!r}")
        docs[d.key] = load_doc(d.path())
        if d.flag not in {k for f in defect_flags(docs[d.key]).values() for k in f}:
            raise SystemExit(f"monsoon defects: {d.path()} does not set {d.flag}")
    controls = clean_controls(defects, docs) if args.repeats else []

    t0 = time.monotonic()
    session = MonsoonSession(profile=args.profile, runs_dir=args.runs_dir, run_id=args.run_id,
                             progress=lambda s: print(s, flush=True))
    spec_dir = session.run_dir / "defect-specs"
    spec_dir.mkdir(parents=True, exist_ok=True)
    control_paths = {}
    for c in controls:
        p = spec_dir / f"{c.name}.yaml"
        p.write_text("# written by monsoon.selftest.defects: a defect experiment without its DEFECT_* flags\n"
                     + yaml.safe_dump(c.doc, sort_keys=False))
        load_checked(p)
        control_paths[c.name] = p

    sigterm_as_interrupt("monsoon defects")

    plan: list[tuple[str, Any, int]] = []           # (kind, defect or control, repeat)
    if not args.no_defects:
        plan += [("defect", d, 0) for d in defects]
    for i in range(1, args.repeats + 1):
        plan += [("clean", c, i) for c in controls]
    print(f"monsoon defects: run {session.run_id}: {len([p for p in plan if p[0] == 'defect'])} defect run(s), "
          f"{len([p for p in plan if p[0] == 'clean'])} clean run(s) ({', '.join(c.name for c in controls) or 'none'}"
          f" x {args.repeats}), profile {args.profile}", flush=True)

    defect_results: dict[str, dict | None] = {}
    clean: list[tuple[str, int, dict | None]] = []
    interrupted = False
    beside: dict[str, Any] = {}
    neighbour = contextlib.ExitStack()
    if args.neighbour:
        neighbour.enter_context(busy_neighbour(beside))
        print(f"monsoon defects: a busy-loop neighbour burns one core beside every run (pid "
              f"{beside['neighbour_pid']})", flush=True)
    try:
        for n, (kind, what, rep) in enumerate(plan, 1):
            if kind == "defect":
                print(f"\n=== [{n}/{len(plan)}] defect {what.key}: {what.stack} / {what.experiment} "
                      f"(expects {what.expected} to fail)", flush=True)
                r = session.run(what.stack, str(what.path())).to_dict()
                defect_results[what.key] = r
                e = defect_entry(what, r)
                print(f"=== defect {what.key}: {'CAUGHT' if e['caught'] else 'MISSED'} "
                      f"({what.expected} {e['expected_verdict']}; failed: {', '.join(e['caught_by']) or 'none'})",
                      flush=True)
            else:
                print(f"\n=== [{n}/{len(plan)}] clean {what.name} #{rep}: {what.stack} (defects "
                      f"{', '.join(what.letters)} with their flags off)", flush=True)
                r = session.run(what.stack, str(control_paths[what.name])).to_dict()
                clean.append((what.name, rep, r))
                e = clean_entry(what.name, rep, r)
                print(f"=== clean {what.name} #{rep}: {r['verdict'].upper()}"
                      + (f"; FALSE ALARM: {', '.join(e['false_alarms'])}" if e["false_alarms"] else "")
                      + (f"; unknown: {', '.join(e['unknown'])}" if e["unknown"] else ""), flush=True)
    except KeyboardInterrupt:
        interrupted = True
        print("\nmonsoon defects: interrupted; the matrix below covers what finished", flush=True)
    finally:
        neighbour.close()

    summary = summarize(defects if not args.no_defects else [], defect_results, clean,
                        time.monotonic() - t0, args.repeats)
    summary["run_id"] = session.run_id
    summary["service_cpus"] = service_cpus
    if args.neighbour:
        summary["neighbour_cores"] = beside.get("neighbour_cores")
    if interrupted:
        summary["interrupted"] = True
    session.run_dir.mkdir(parents=True, exist_ok=True)
    (session.run_dir / "defects.json").write_text(json.dumps(summary, indent=2))
    ok = passed(summary) and not interrupted
    print()
    for problem in problems(summary):
        print("monsoon defects:", problem, flush=True)
    print(f"monsoon defects: {summary['caught']}/{summary['defects']} caught, {summary['false_alarms']} false "
          f"alarm(s), {summary['clean_unknown']} unknown on {summary['clean_runs']} clean run(s) in "
          f"{summary['seconds']:.0f}s -> {'OK' if ok else 'NOT OK'}; run directory {session.run_dir}", flush=True)
    print(json.dumps(summary, separators=(",", ":")), flush=True)
    if interrupted:
        return 130
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
