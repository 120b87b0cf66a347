"""A docker-compose file read as a stack's services (``compose: path/to/docker-compose.yml`` in a stack).

The user keeps the file they have; monsoon maps what it can run on its container provider and refuses the
rest by name (file, line, key), never silently:

* top level: ``services``; ``version`` and ``name`` are accepted and ignored.
* per service: ``image``, ``command``, ``environment`` (a mapping or ``KEY=VALUE`` list), ``mem_limit``,
  ``deploy.resources.limits.memory`` / ``.cpus``, ``cpus``, ``restart`` (``no``, ``always``, ``on-failure``;
  ``unless-stopped`` runs as ``always``), ``depends_on`` (a list, or a mapping whose conditions are ignored:
  monsoon starts a service once the ones it depends on are ready), ``volumes`` (short ``HOST:CONTAINER[:ro]``
  form; a relative host path is relative to the compose file), ``stop_signal``, ``stop_grace_period``
  (seconds, or ``10s`` / ``1m``), and ``network_mode: host`` (the only network monsoon runs).
* anything else (ports, networks, healthcheck, build, entrypoint, ...) is refused: containers run on the host
  network (a service listens on its own port on 127.0.0.1), and readiness is monsoon's ``ready:``, which the
  stack may add per service under its own ``services:`` (merged over the compose file's).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from monsoon.spec.yamlio import LocatedDoc, SpecError, load_located


TOP_KEYS = {"services", "version", "name"}
SERVICE_KEYS = {"image", "command", "environment", "mem_limit", "deploy", "cpus", "restart", "depends_on",
                "volumes", "stop_signal", "stop_grace_period", "network_mode"}
RESTART = {"no": "no", "always": "always", "on-failure": "on-failure", "unless-stopped": "always"}
DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?$")


def _err(doc: LocatedDoc, path: tuple, msg: str) -> SpecError:
    return SpecError(doc.path, doc.line_of(path), ".".join(map(str, path)), msg)


def _refuse(doc: LocatedDoc, path: tuple, what: str) -> SpecError:
    return _err(doc, path, f"compose key {path[-1]!r} is not supported ({what}); supported: "
                + ", ".join(sorted(SERVICE_KEYS if len(path) == 3 else TOP_KEYS)))


def _seconds(doc: LocatedDoc, path: tuple, v: Any) -> float:
    if isinstance(v, (int, float)):
        return float(v)
    m = DURATION.match(str(v).strip())
    if not m or not any(m.groups()):
        raise _err(doc, path, f"a duration like 10s or 1m30s, not {v!r}")
    return float(m.group(1) or 0) * 60 + float(m.group(2) or 0)


def _service(doc: LocatedDoc, name: str, s: Any) -> dict[str, Any]:
    base = ("services", name)
    if not isinstance(s, dict):
        raise _err(doc, base, "a service is a mapping")
    for k in s:
        if k not in SERVICE_KEYS:
            raise _refuse(doc, base + (k,), "monsoon runs containers on the host network and waits for "
                          "readiness with the stack's ready:" if k in ("ports", "networks", "healthcheck",
                                                                         "expose") else "not mapped")
    if "image" not in s:
        raise _err(doc, base, "a service needs image (build: is not supported: build the image first)")
    out: dict[str, Any] = {"provider": "docker", "image": str(s["image"])}
    if "command" in s:
        out["command"] = s["command"]
    env = s.get("environment") or {}
    if isinstance(env, list):
        pairs = {}
        for i, kv in enumerate(env):
            k, sep, v = str(kv).partition("=")
            if not sep:
                raise _err(doc, base + ("environment", i), f"{kv!r}: give KEY=VALUE (monsoon passes no host "
                           "environment into containers)")
            pairs[k] = v
        env = pairs
    if not isinstance(env, dict):
        raise _err(doc, base + ("environment",), "a mapping or a list of KEY=VALUE")
    if env:
        out["env"] = {k: "" if v is None else str(v) for k, v in env.items()}
    deploy = s.get("deploy") or {}
    for k in deploy:
        if k != "resources":
            raise _refuse(doc, base + ("deploy", k), "only deploy.resources.limits is mapped")
    res = deploy.get("resources") or {}
    for k in res:
        if k != "limits":
            raise _refuse(doc, base + ("deploy", "resources", k), "only deploy.resources.limits is mapped")
    limits = res.get("limits") or {}
    for k in limits:
        if k not in ("memory", "cpus"):
            raise _refuse(doc, base + ("deploy", "resources", "limits", k), "only memory and cpus are mapped")
    mem = s.get("mem_limit", limits.get("memory"))
    if mem is not None:
        m = str(mem).strip().lower()
        out["mem_limit"] = m[:-1] if m.endswith(("kb", "mb", "gb")) else m     # compose's 256M / 256MB
    cpus = s.get("cpus", limits.get("cpus"))
    if cpus is not None:
        out["cpus"] = float(cpus)
    if "restart" in s:
        r = "no" if s["restart"] is False else str(s["restart"])
        if r.split(":")[0] not in RESTART:
            raise _err(doc, base + ("restart",), f"{r!r}: one of {', '.join(RESTART)}")
        out["restart"] = RESTART[r.split(":")[0]]
    dep = s.get("depends_on") or []
    out["depends_on"] = list(dep) if isinstance(dep, (list, dict)) else [dep]
    vols = []
    for i, v in enumerate(s.get("volumes") or []):
        if not isinstance(v, str):
            raise _err(doc, base + ("volumes", i), "only the short form HOST:CONTAINER[:ro] is supported")
        parts = v.split(":")
        if len(parts) < 2 or not parts[0].startswith((".", "/", "~")):
            raise _err(doc, base + ("volumes", i), f"{v!r}: a bind mount HOST:CONTAINER[:ro] (named volumes are "
                       "not supported)")
        host = Path(parts[0]).expanduser()
        parts[0] = str(host if host.is_absolute() else (doc.path.parent / host).resolve())
        vols.append(":".join(parts))
    if vols:
        out["volumes"] = vols
    if "stop_signal" in s:
        out["stop_signal"] = str(s["stop_signal"])
    if "stop_grace_period" in s:
        out["stop_timeout"] = _seconds(doc, base + ("stop_grace_period",), s["stop_grace_period"])
    if s.get("network_mode", "host") != "host":
        raise _err(doc, base + ("network_mode",), "monsoon runs containers on the host network only (host)")
    return out


def compose_services(path: Path) -> dict[str, dict[str, Any]]:
    """The stack services of a docker-compose file (every one ``provider: docker``)."""
    doc = load_located(path)
    if not isinstance(doc.data, dict) or not isinstance(doc.data.get("services"), dict):
        raise _err(doc, ("services",), "a compose file needs a services: mapping")
    for k in doc.data:
        if k not in TOP_KEYS:
            raise _refuse(doc, (k,), "networks, volumes, configs and secrets are not mapped")
    return {str(n): _service(doc, str(n), s) for n, s in doc.data["services"].items()}
