"""Seeded mutants of the shipped YAML: the bad input a user writes, one mistake per file.

``generate(seed)`` returns at least 40 :class:`Mutant`s across the three kinds of file (stack, experiment,
fault profile) and these categories: deleted keys, wrong types, zero/negative/absurd values, unknown kinds,
misspelt keys, misspelt port names, YAML syntax errors, empty and list-shaped files, duplicate keys, bytes that
are not UTF-8, and queries that are not SQL. ``live`` marks the mutants only a running stack can detect (SQL
that does not parse): validation passes them, the preflight must stop the run before the load.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASES = {"stack": REPO / "stacks" / "inmemory.yaml", "experiment": REPO / "experiments" / "burst-x3.yaml",
         "fault profile": REPO / "fault-profiles" / "network-latency.yaml"}


@dataclass(frozen=True)
class Mutant:
    id: str
    category: str
    kind: str          # stack | experiment | fault profile
    filename: str      # a fault profile's file name must be its kind
    data: bytes
    live: bool = False

    def write(self, folder: Path) -> Path:
        d = folder / self.id
        d.mkdir(parents=True, exist_ok=True)
        p = d / self.filename
        p.write_bytes(self.data)
        return p


def _set(text: str, key: str, value: str, nth: int = 0) -> str:
    """``key: <value>`` (the nth line with that key) replaced; the rest of the line's comment dropped."""
    lines = text.splitlines(keepends=True)
    hits = [i for i, ln in enumerate(lines) if re.match(rf"^\s*{re.escape(key)}:", ln)]
    i = hits[nth]
    indent = re.match(r"^(\s*)", lines[i]).group(1)
    lines[i] = f"{indent}{key}: {value}\n"
    return "".join(lines)


def _inline(text: str, key: str, value: str) -> str:
    """``key: v`` inside a flow mapping (``{kind: burst, multiplier: 3}``) replaced."""
    new, n = re.subn(rf"(\b{re.escape(key)}:\s*)[^,}}\n]+", rf"\g<1>{value}", text, count=1)
    assert n == 1, key
    return new


def _drop(text: str, key: str) -> str:
    lines = text.splitlines(keepends=True)
    i = next(i for i, ln in enumerate(lines) if re.match(rf"^\s*{re.escape(key)}:", ln))
    return "".join(lines[:i] + lines[i + 1:])


def _rename(text: str, key: str, to: str) -> str:
    new, n = re.subn(rf"(?m)^(\s*){re.escape(key)}:", rf"\g<1>{to}:", text, count=1)
    assert n == 1, key
    return new


def _candidates() -> list[tuple[str, str, str, object, bool]]:
    """(category, kind, label, mutation of the text (or bytes), live)."""
    S, E, F = "stack", "experiment", "fault profile"
    return [
        # deleted keys
        ("deleted key", S, "no-devices", lambda t: t.replace(t[t.index("devices:\n"):t.index("provisioning:")], ""), False),
        ("deleted key", S, "no-dsn", lambda t: _drop(t, "dsn"), False),
        ("deleted key", S, "no-command", lambda t: _drop(t, "command"), False),
        ("deleted key", E, "no-base-rate", lambda t: _drop(t, "base_rate"), False),
        ("deleted key", E, "no-devices", lambda t: _drop(t, "devices"), False),
        ("deleted key", F, "no-kind", lambda t: _drop(t, "kind"), False),
        ("deleted key", F, "no-target", lambda t: _drop(t, "target"), False),
        # wrong types
        ("wrong type", S, "command-number", lambda t: _set(t, "command", "42"), False),
        ("wrong type", S, "depends-on-mapping", lambda t: _set(t, "depends_on", "{postgres: yes}"), False),
        ("wrong type", E, "devices-string", lambda t: _set(t, "devices", "many"), False),
        ("wrong type", E, "checks-mapping", lambda t: t[:t.index("checks:")] + "checks: {no_oom: 1}\n", False),
        ("wrong type", F, "latency-string", lambda t: _set(t, "latency_ms", "fast"), False),
        ("wrong type", F, "at-list", lambda t: _set(t, "at", "[1, 2]"), False),
        # zero / negative / absurd values
        ("zero/negative/absurd value", E, "devices-zero", lambda t: _set(t, "devices", "0"), False),
        ("zero/negative/absurd value", E, "rate-negative", lambda t: _set(t, "base_rate", "-400"), False),
        ("zero/negative/absurd value", E, "devices-ten-million", lambda t: _set(t, "devices", "10000000"), False),
        ("zero/negative/absurd value", E, "multiplier-1e9", lambda t: _inline(t, "multiplier", "1.0e+9"), False),
        ("zero/negative/absurd value", E, "duration-1e12", lambda t: _inline(t, "burst", "1.0e+12"), False),
        ("zero/negative/absurd value", F, "latency-negative", lambda t: _set(t, "latency_ms", "-1"), False),
        ("zero/negative/absurd value", F, "duration-zero", lambda t: _set(t, "duration", "0"), False),
        ("zero/negative/absurd value", S, "ready-timeout-zero", lambda t: t.replace("timeout: 30}", "timeout: 0}"), False),
        # unknown kinds
        ("unknown kind", E, "shape-sawtooth", lambda t: _inline(t, "kind", "sawtooth"), False),
        ("unknown kind", F, "fault-kind", lambda t: _set(t, "kind", "network-lag"), False),
        ("unknown kind", S, "storage-kind", lambda t: _set(t, "kind", "mysql", nth=1), False),
        ("unknown kind", E, "unknown-check", lambda t: t.replace("  - no_oom", "  - no_oomm"), False),
        # misspelt keys
        ("misspelt key", S, "servces", lambda t: _rename(t, "services", "servces"), False),
        ("misspelt key", S, "loss-qery", lambda t: _rename(t, "loss_query", "loss_qery"), False),
        ("misspelt key", E, "profiels", lambda t: _rename(t, "profiles", "profiels"), False),
        ("misspelt key", E, "devics", lambda t: _rename(t, "devices", "devics"), False),
        ("misspelt key", F, "latncy", lambda t: _rename(t, "latency_ms", "latncy_ms"), False),
        ("misspelt key", F, "schedul", lambda t: _rename(t, "schedule", "schedul"), False),
        # misspelt port names
        ("misspelt port name", S, "port-mqt", lambda t: t.replace('port: "{port:mqtt}"', 'port: "{port:mqt}"'), False),
        ("misspelt port name", S, "port-postgress", lambda t: t.replace("{port:postgres}/postgres\"\n  loss",
                                                                    "{port:postgress}/postgres\"\n  loss"), False),
        ("misspelt port name", S, "placeholder-prot", lambda t: t.replace("{port:http}/health", "{prot:http}/health"), False),
        # YAML syntax errors
        ("YAML syntax error", S, "unclosed-flow", lambda t: t.replace("depends_on: [postgres]", "depends_on: [postgres"), False),
        ("YAML syntax error", E, "bad-indent", lambda t: t.replace("  qos: 1\n", "   qos: 1\n"), False),
        ("YAML syntax error", F, "tab", lambda t: t.replace("  jitter_ms: 20", "\tjitter_ms: 20"), False),
        # empty and list-shaped files
        ("empty or list-shaped file", S, "empty", lambda t: "", False),
        ("empty or list-shaped file", E, "list", lambda t: "- name: burst-x3\n- load: {}\n", False),
        ("empty or list-shaped file", F, "comments-only", lambda t: "# nothing here\n", False),
        # duplicate keys
        ("duplicate key", S, "two-names", lambda t: t.replace("name: inmemory\n", "name: inmemory\nname: again\n"), False),
        ("duplicate key", E, "two-qos", lambda t: t.replace("  qos: 1\n", "  qos: 1\n  qos: 0\n"), False),
        ("duplicate key", F, "two-targets", lambda t: t.replace("target: platform->postgres\n",
                                                              "target: platform->postgres\ntarget: platform->kafka\n"), False),
        # bytes that are not UTF-8
        ("not UTF-8", S, "latin1", lambda t: t.encode().replace(b"unbounded in-memory", b"unbounded\xe9 in-memory"), False),
        ("not UTF-8", E, "stray-ff", lambda t: t.encode().replace(b"the measured capacity", b"the \xff\xfe measured capacity"), False),
        ("not UTF-8", F, "cp1252-quote", lambda t: t.encode().replace(b"200 ms", b"\x93200 ms\x94"), False),
        # queries that are not SQL: prose is plainly none (validate says so); broken SQL only a live stack can tell
        ("not SQL", S, "loss-query-prose", lambda t: _replace_block(t, "loss_query", "'all the stored messages, please'"), False),
        ("not SQL", S, "count-query-broken", lambda t: _replace_block(t, "count_query", "'SELECT count(* FROM ts_kv'"), True),
    ]


def _replace_block(text: str, key: str, value: str) -> str:
    """A folded ``key: >-`` block replaced by ``key: value`` on one line."""
    lines = text.splitlines(keepends=True)
    i = next(i for i, ln in enumerate(lines) if re.match(rf"^\s*{key}:", ln))
    indent = re.match(r"^(\s*)", lines[i]).group(1)
    j = i + 1
    while j < len(lines) and lines[j].startswith(indent + "  "):
        j += 1
    return "".join(lines[:i] + [f"{indent}{key}: {value}\n"] + lines[j:])


def generate(seed: int = 20261124) -> list[Mutant]:
    """Every candidate mutation, in a seeded order (so a failure names a reproducible mutant id)."""
    rng = random.Random(seed)
    cands = _candidates()
    rng.shuffle(cands)
    out = []
    for n, (category, kind, label, mutate, live) in enumerate(cands):
        text = BASES[kind].read_text()
        data = mutate(text)
        data = data if isinstance(data, bytes) else data.encode()
        filename = BASES[kind].name if kind == "fault profile" else f"m-{label}.yaml"
        out.append(Mutant(f"{n:02d}-{kind.split()[0]}-{label}", category, kind, filename, data, live))
    return out
