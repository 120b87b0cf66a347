"""Parsers of what live systems say about deaths: Kubernetes pod statuses and ``docker inspect``."""
from __future__ import annotations

from typing import Any

MB = 1024 * 1024


def _int(v: Any) -> int | None:
    try:
        return int(v)
    except (TypeError, ValueError):
        return None


def _termination(term: dict | None) -> dict | None:
    if not isinstance(term, dict):
        return None
    reason = term.get("reason")
    return {"finished_at": term.get("finishedAt"), "reason": reason, "exit_code": _int(term.get("exitCode")),
            "oom_killed": 1 if reason == "OOMKilled" else 0}


def parse_pods(pods: list[dict]) -> dict[str, Any]:
    """A ``kube`` sample from pod objects as the API serialises them (``metadata``/``status`` in camelCase).

    One entry per container (init containers included) keyed ``<pod>/<container>``:
    restarts, state, and the terminations the status holds (current then last).
    """
    containers: dict[str, dict] = {}
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        pname = meta.get("name", "?")
        for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            state, last = cs.get("state") or {}, cs.get("lastState") or {}
            terms = [t for t in (_termination(state.get("terminated")), _termination(last.get("terminated"))) if t]
            entry = {"pod": pname, "container": cs.get("name", "?"), "restarts": _int(cs.get("restartCount")) or 0,
                     "state": next((k for k in ("running", "waiting", "terminated") if state.get(k)), "unknown"),
                     "terminations": terms}
            waiting = (state.get("waiting") or {}).get("reason")
            if waiting:
                entry["waiting_reason"] = waiting
            containers[f"{pname}/{entry['container']}"] = entry
    return {"pods": len(pods), "containers": containers,
            "restarts": sum(c["restarts"] for c in containers.values()),
            "oom_killed": sum(1 for c in containers.values() if any(t["oom_killed"] for t in c["terminations"]))}


NEVER = "0001-01-01T00:00:00Z"   # docker's FinishedAt of a container that never stopped


def parse_docker_inspect(items: list[dict], wanted: list[str] | tuple[str, ...] = ()) -> dict[str, Any]:
    """A ``docker`` sample from ``docker inspect`` JSON: per container its state, exit, OOMKilled, restarts."""
    containers: dict[str, dict] = {}
    for it in items:
        st = it.get("State") or {}
        name = (it.get("Name") or it.get("Id", "?")[:12]).lstrip("/")
        fin = st.get("FinishedAt")
        terms = []
        if fin and not str(fin).startswith("0001-01-01"):
            terms.append({"finished_at": fin, "reason": "OOMKilled" if st.get("OOMKilled") else None,
                          "exit_code": _int(st.get("ExitCode")), "oom_killed": 1 if st.get("OOMKilled") else 0})
        mem = ((it.get("HostConfig") or {}).get("Memory")) or 0
        containers[name] = {"id": str(it.get("Id", ""))[:12], "state": st.get("Status", "unknown"),
                            "restarts": _int(it.get("RestartCount")) or 0, "oom_killed": 1 if st.get("OOMKilled") else 0,
                            "exit_code": _int(st.get("ExitCode")), "pid": _int(st.get("Pid")) or 0,
                            "terminations": terms}
        if mem:
            containers[name]["memory_limit_mb"] = round(mem / MB, 1)
    out: dict[str, Any] = {"containers": containers,
                           "restarts": sum(c["restarts"] for c in containers.values()),
                           "oom_killed": sum(c["oom_killed"] for c in containers.values())}
    missing = [n for n in wanted if n.lstrip("/") not in containers]
    if missing:
        out["missing"] = missing
    return out
