"""no_oom from every angle on hand-made timelines: process exits, the cgroup's oom_kill counter, Kubernetes pod
status, docker inspect, heap headroom; the parsers on realistic API payloads; the collectors on fake sources.

Each angle is shown passing, failing and saying unknown; an injected kill is not an OOM, unless the kernel's
oom_kill counter rose with it."""
from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from monsoon.checks.registry import CHECKS, evaluate, validate_check
from monsoon.checks.base import FAIL, PASS, UNKNOWN, RunData
from monsoon.observe.collectors import CgroupOomCollector, DockerCollector, KubePodsCollector, collectors_for
from monsoon.faults.cgroup import CgroupFS
from monsoon.stack.supervisor import exit_cause
from monsoon.checks.oom import cgroup_evidence, heap_headroom, no_oom, no_unexpected_exit
from monsoon.observe.parsers import parse_docker_inspect, parse_pods
from tests.unit.helpers import RunBuilder

CG = "/sys/fs/cgroup/memory/monsoon/m_r__platform"


def run(b: RunBuilder) -> RunData:
    return RunData(b.write())


def cgroup(b: RunBuilder, points, service="platform", path=CG, shared=0, version=1) -> RunBuilder:
    """cgroup samples: (t, raw oom_kill); the collector's cumulative increase starts at the first value."""
    base = points[0][1]
    for t, n in points:
        b.ev("sample", t, collector="cgroup", service=service, available=1, pid=1, cgroup=path,
             oom_kills=n - base, limit_hits=(n - base) * 7,
             cgroups={path: {"version": version, "oom_kill": n, "limit_hits": (n - base) * 7, "shared": shared,
                             "usage_mb": 95.9, "limit_mb": 96.0}})
    return b


def exit_(b: RunBuilder, t: float, code: int = 137, oom: bool = False, service: str = "platform",
          restart: bool = True, kernel_log: bool = False) -> RunBuilder:
    cause = ("java.lang.OutOfMemoryError (JVM exit 3)" if oom else
             "SIGKILL (exit 137), not sent by monsoon" if code == 137 else f"exit {code}")
    extra = {"kernel_log": "no OOM-kill line for this pid"} if kernel_log and code == 137 else {}
    b.ev("service", t, service=service, event="exit", code=code, oom=oom, cause=cause, pid=1, **extra)
    if restart:
        b.ev("service", t + 1.0, service=service, event="restart", n=2)
    return b


def kill_window(b: RunBuilder, start: float = 30.0, end: float = 35.0, target: str = "platform") -> RunBuilder:
    """A pod-kill window as FaultPlan writes it (plan started at t=0), with its census."""
    b.ev("fault-plan", 0.0, run_id="r", horizon=120, faults=[])
    ev = {"method": "pid", "service": target, "old_pid": 1, "new_pid": 2, "signal": "SIGKILL"}
    for phase, eff in (("inject", start), ("heal", end)):
        b.ev("fault", eff + 0.2, name="kill", kind="pod-kill", backend="process", target=target, window=0,
             phase=phase, intended=eff, effective=eff, landed=True, evidence=ev if phase == "inject" else {})
    b.ev("fault-census", 100.0, run_id="r", swept={}, leftovers={}, errors=[])
    return b


def every_second(a: int, b: int, n_at: dict[int, int] | None = None, start: int = 0):
    """(t + 0.5, raw count) for t in [a, b), the count stepping up at the given seconds."""
    out, n = [], start
    for t in range(a, b):
        n = (n_at or {}).get(t, n)
        out.append((t + 0.5, n))
    return out


# ================================================================ process angle (unchanged behaviour)

def test_the_check_lives_in_oom_and_is_still_registered():
    import monsoon.checks.registry
    assert CHECKS["no_oom"] is no_oom and monsoon.checks.registry.no_oom is no_oom
    validate_check("no_oom", {})
    validate_check("no_oom", {"min_headroom_pct": 10})
    with pytest.raises(ValueError, match="min_headroom_pct must be a number"):
        validate_check("no_oom", {"min_headroom_pct": -1})


def test_quiet_service_without_cgroup_samples_keeps_the_old_figures(tmp_path):
    v = no_oom(run(RunBuilder(tmp_path).service_start()))
    assert v.verdict == PASS and v.figures == {"oom_events": 0, "restarts": 0, "exits": 0}


def test_without_any_angle_it_is_unknown(tmp_path):
    v = no_oom(run(RunBuilder(tmp_path)))
    assert v.verdict == UNKNOWN and "did not supervise" in v.message


# ================================================================ cgroup angle

def test_exit_137_with_an_oom_kill_increase_is_the_kernel_oom_killer(tmp_path):
    b = RunBuilder(tmp_path).phases(10, 60, 30).service_start()
    cgroup(b, every_second(0, 80, {42: 1}))                 # the sample at 42.5 sees 0->1
    exit_(b, 42.3)
    v = no_oom(run(b))
    assert v.verdict == FAIL
    assert v.figures["cgroup_oom_kills"] == 1 and v.figures["oom_events"] == 1 and v.figures["restarts"] == 1
    assert v.figures["cgroup_limit_hits"] == 7
    assert v.message.startswith("platform died: exit 137, cgroup oom_kill 0→1: killed by the kernel OOM killer at "
                                "t=42s (32s into the burst)"), v.message


def test_the_counter_may_rise_in_the_sample_just_before_the_exit_is_recorded(tmp_path):
    b = RunBuilder(tmp_path).service_start()
    cgroup(b, [(29.0, 3), (30.05, 4), (31.0, 4)])           # kill at ~30.0, sampled, exit event at 30.1
    exit_(b, 30.1)
    v = no_oom(run(b))
    assert v.verdict == FAIL and "cgroup oom_kill 3→4: killed by the kernel OOM killer" in v.message


def test_an_injected_pod_kill_without_an_oom_kill_increase_is_not_an_oom(tmp_path):
    b = kill_window(RunBuilder(tmp_path).service_start())
    cgroup(b, every_second(0, 60))
    exit_(b, 30.1)
    v = no_oom(run(b))
    assert v.verdict == PASS, v.message
    assert v.figures == {"oom_events": 0, "restarts": 0, "exits": 0, "injected_kills": 1,
                         "cgroup_oom_kills": 0, "cgroup_limit_hits": 0}
    assert "1 exit(s) caused by injected kills" in v.message and "cgroup oom_kill +0" in v.message


def test_an_oom_kill_inside_the_kill_window_is_still_an_oom(tmp_path):
    b = kill_window(RunBuilder(tmp_path).service_start())
    cgroup(b, every_second(0, 60, {30: 1}))
    exit_(b, 30.1)
    v = no_oom(run(b))
    assert v.verdict == FAIL
    assert v.figures["oom_events"] == 1 and v.figures["exits"] == 1 and "injected_kills" not in v.figures
    assert "killed by the kernel OOM killer at t=30s" in v.message


def test_exit_137_the_cgroup_saw_no_kill_for_is_not_an_oom_but_an_unexpected_exit(tmp_path):
    b = RunBuilder(tmp_path).service_start()
    cgroup(b, every_second(0, 60))
    exit_(b, 20.2)
    v = no_oom(run(b))
    assert v.verdict == PASS, v.message
    assert v.figures["oom_events"] == 0 and v.figures["exits"] == 1 and v.figures["cgroup_oom_kills"] == 0
    assert "1 death(s) without OOM evidence: see no_unexpected_exit" in v.message
    u = no_unexpected_exit(run(b))
    assert u.verdict == FAIL and u.figures == {"unexpected_exits": 1, "restarts": 1}
    assert u.message.startswith("platform died of SIGKILL, not sent by monsoon, with no OOM evidence (cgroup "
                                "oom_kill unchanged) at t=20s"), u.message


def test_exit_137_no_angle_could_see_is_unknown_to_no_oom_and_still_unexpected(tmp_path):
    b = RunBuilder(tmp_path).service_start()
    cgroup(b, every_second(0, 10))                          # sampling stopped before the exit
    exit_(b, 20.2)                                          # and no word from the kernel log
    v = no_oom(run(b))
    assert v.verdict == UNKNOWN and v.figures["oom_events"] == 0
    assert "no angle could tell whether the kernel OOM killer did it" in v.message
    assert no_unexpected_exit(run(b)).verdict == FAIL
    b2 = RunBuilder(tmp_path / "2").service_start()       # the kernel log was read and named no OOM kill
    exit_(b2, 20.2, kernel_log=True)
    assert no_oom(run(b2)).verdict == PASS
    assert "no kernel OOM-kill line for its pid" in no_unexpected_exit(run(b2)).message


def test_the_kernels_oom_line_is_an_oom_of_any_service(tmp_path):
    b = RunBuilder(tmp_path).service_start().service_start(service="kafka")
    b.ev("service", 20.2, service="kafka", event="exit", code=137, oom=True, pid=7,
         cause="SIGKILL (exit 137) by the kernel OOM killer: Memory cgroup out of memory: Killed process 7 (java)",
         kernel_log="Memory cgroup out of memory: Killed process 7 (java)")
    v = no_oom(run(b))
    assert v.verdict == FAIL and v.figures["oom_events"] == 1
    assert v.message.startswith("kafka died: SIGKILL (exit 137) by the kernel OOM killer"), v.message
    assert no_unexpected_exit(run(b)).verdict == PASS       # an OOM is no_oom's, not counted twice


def test_an_oom_kill_of_a_dependency_in_its_own_cgroup_is_that_dependencys_oom(tmp_path):
    b = RunBuilder(tmp_path).service_start().service_start(service="kafka")
    cgroup(b, every_second(0, 60))                                      # the platform's: quiet
    cgroup(b, every_second(0, 60, {30: 1}), service="kafka", path="/sys/fs/cgroup/memory/monsoon/m_r__kafka")
    exit_(b, 30.2, service="kafka")
    v = no_oom(run(b))
    assert v.verdict == FAIL and v.figures["oom_events"] == 1 and v.figures["cgroup_oom_kills"] == 1
    assert v.message.startswith("kafka died: exit 137, cgroup oom_kill 0→1: killed by the kernel OOM killer")


def test_an_increase_far_from_the_exit_is_not_its_cause(tmp_path):
    b = RunBuilder(tmp_path).service_start()
    cgroup(b, every_second(0, 80, {60: 1}))
    exit_(b, 20.2, restart=False)
    v = no_oom(run(b))
    assert v.verdict == FAIL and v.figures["oom_events"] == 0 and v.figures["cgroup_oom_kills"] == 1
    assert "without an exit 137 of platform: the kernel OOM killer killed a process of platform" in v.message


def test_an_oom_kill_of_a_child_process_in_the_services_own_cgroup_fails(tmp_path):
    b = RunBuilder(tmp_path).service_start()
    cgroup(b, every_second(0, 30, {12: 2}))                 # two workers killed, the service lives on
    v = no_oom(run(b))
    assert v.verdict == FAIL and v.figures["cgroup_oom_kills"] == 2 and v.figures["exits"] == 0
    assert f"cgroup oom_kill 0→2 in {CG} at t=12s" in v.message


def test_an_oom_kill_in_a_shared_cgroup_without_an_exit_is_unknown(tmp_path):
    b = RunBuilder(tmp_path).service_start()
    cgroup(b, every_second(0, 30, {12: 1}), shared=1)
    v = no_oom(run(b))
    assert v.verdict == UNKNOWN and "shared with other processes" in v.message


def test_an_exit_of_another_service_is_not_attributed_to_the_observed_cgroup(tmp_path):
    b = RunBuilder(tmp_path).service_start().service_start(service="postgres")
    cgroup(b, every_second(0, 30, {12: 1}))
    exit_(b, 12.2, service="postgres", restart=False)
    v = no_oom(run(b))
    assert v.verdict == FAIL
    assert "postgres died of SIGKILL (exit 137)" in v.message and "without an exit 137 of platform" in v.message


def test_cgroup_unavailable_is_noted_and_changes_nothing(tmp_path):
    b = RunBuilder(tmp_path).service_start()
    for t in range(5):
        b.ev("sample", t + 0.5, collector="cgroup", service="platform", available=0, pid=1,
             reason="no memory cgroup controller for this process")
    v = no_oom(run(b))
    assert v.verdict == PASS and "cgroup_oom_kills" not in v.figures
    assert "cgroup angle unavailable: no memory cgroup controller" in v.message


def test_cgroup_evidence_finds_the_cgroup_that_rose(tmp_path):
    b = RunBuilder(tmp_path)
    parent = "/sys/fs/cgroup/memory/monsoon"
    b.ev("sample", 1.0, collector="cgroup", service="platform", available=1, cgroup=parent, oom_kills=0,
         limit_hits=0, cgroups={parent: {"oom_kill": 5, "shared": 1}})
    b.ev("sample", 2.0, collector="cgroup", service="platform", available=1, cgroup=CG, oom_kills=0, limit_hits=0,
         cgroups={parent: {"oom_kill": 5, "shared": 1}, CG: {"oom_kill": 0, "shared": 0}})
    b.ev("sample", 3.0, collector="cgroup", service="platform", available=1, cgroup=None, oom_kills=1,
         limit_hits=3, cgroups={parent: {"oom_kill": 5, "shared": 1}, CG: {"oom_kill": 1, "shared": 0}})
    ev = cgroup_evidence(run(b).events)["platform"]
    assert ev.oom_kills == 1 and ev.limit_hits == 3 and len(ev.increases) == 1
    inc = ev.increases[0]
    assert (inc.before, inc.after, inc.cgroup, inc.shared, inc.t_prev, inc.t) == (0, 1, CG, False, 2.0, 3.0)
    assert ev.increase_for_exit(2.9) is inc and ev.increase_for_exit(10.0) is None


# ================================================================ the cgroup collector on a fake tree

class FakeTree:
    """A /proc and a v1 or v2 memory hierarchy under tmp_path."""

    def __init__(self, root: Path, version: int = 1):
        self.version = version
        self.proc = root / "proc"
        self.mnt = root / ("memory" if version == 1 else "unified")
        mounts = [("cgroup", str(self.mnt), "rw,relatime,memory")] if version == 1 else \
            [("cgroup2", str(self.mnt), "rw,relatime")]
        self.fs = CgroupFS(proc=self.proc, mounts=mounts)
        (self.mnt / "svc").mkdir(parents=True)
        if version == 2:
            (self.mnt / "cgroup.controllers").write_text("cpu memory pids\n")
            (self.mnt / "svc" / "cgroup.controllers").write_text("memory\n")
        self.set_counts("svc", 4, 10)

    def set_counts(self, rel: str, oom: int, hits: int, parent_total: int | None = None) -> None:
        d = self.mnt / rel
        d.mkdir(parents=True, exist_ok=True)
        if self.version == 1:
            (d / "memory.oom_control").write_text(f"oom_kill_disable 0\nunder_oom 0\noom_kill {oom}\n")
            (d / "memory.failcnt").write_text(f"{hits}\n")
            (d / "memory.limit_in_bytes").write_text("100663296\n")
            (d / "memory.usage_in_bytes").write_text("52428800\n")
        else:
            local = f"low 0\nhigh 0\nmax {hits}\noom 0\noom_kill {oom}\noom_group_kill 0\n"
            (d / "memory.events.local").write_text(local)
            total = oom if parent_total is None else parent_total   # memory.events counts the subtree
            (d / "memory.events").write_text(f"low 0\nhigh 0\nmax {hits}\noom 0\noom_kill {total}\n")
            (d / "memory.max").write_text("max\n")
            (d / "memory.current").write_text("52428800\n")

    def put(self, pid: int, rel: str, pgrp: int | None = None) -> None:
        p = self.proc / str(pid)
        p.mkdir(parents=True, exist_ok=True)
        line = f"4:memory:/{rel}\n0::/\n" if self.version == 1 else f"0::/{rel}\n"
        (p / "cgroup").write_text(line)
        (p / "stat").write_text(f"{pid} (python3) S 1 {pgrp or pid} {pgrp or pid} 0 -1\n")
        for d in self.mnt.rglob("cgroup.procs"):
            d.write_text("\n".join(x for x in d.read_text().split() if x != str(pid)))
        (self.mnt / rel / "cgroup.procs").write_text(f"{pid}\n")


@pytest.mark.parametrize("version", [1, 2])
def test_cgroup_collector_follows_the_service_into_the_fault_child_and_counts_its_kill(tmp_path, version):
    tree = FakeTree(tmp_path, version)
    pid = [100]
    tree.put(100, "svc")
    c = CgroupOomCollector("platform", lambda: pid[0], run_id="r1", fs=tree.fs)
    s = c.sample()
    assert s["available"] == 1 and s["oom_kills"] == 0 and s["cgroup"] == str(tree.mnt / "svc")
    assert s["cgroups"][str(tree.mnt / "svc")]["oom_kill"] == 4           # raw; the 4 before the run don't count
    assert s["cgroups"][str(tree.mnt / "svc")]["shared"] == 0
    # memory-pressure: a child m_<run>__<svc>, the service moved in, then killed by the kernel
    tree.set_counts("svc/m_r1__platform", 0, 0, parent_total=4)
    tree.put(100, "svc/m_r1__platform")
    s = c.sample()
    assert s["cgroup"].endswith("m_r1__platform") and s["oom_kills"] == 0
    assert s["cgroups"][s["cgroup"]]["limit_mb"] in (96.0, None)
    tree.set_counts("svc/m_r1__platform", 1, 3, parent_total=5)
    pid[0] = None                                                            # dead: no pid to look up
    s = c.sample()
    assert s["oom_kills"] == 1 and s["limit_hits"] == 3 and s["pid"] is None   # v2: not counted twice
    # heal removes the child; the count stays; a repeated window makes it again from zero
    for f in (tree.mnt / "svc/m_r1__platform").iterdir():
        f.unlink()
    (tree.mnt / "svc/m_r1__platform").rmdir()
    assert c.sample()["oom_kills"] == 1
    tree.set_counts("svc/m_r1__platform", 1, 1, parent_total=6)
    assert c.sample()["oom_kills"] == 2


def test_cgroup_collector_catches_a_kill_before_it_ever_saw_the_service_moved(tmp_path):
    tree = FakeTree(tmp_path)
    tree.put(100, "svc")
    c = CgroupOomCollector("platform", lambda: None if gone else 100, run_id="r1", fs=tree.fs)
    gone = False
    c.sample()
    tree.set_counts("svc/m_r1__platform", 1, 5)     # moved, limited and killed between two samples
    gone = True
    assert c.sample()["oom_kills"] == 1


def test_cgroup_collector_marks_a_cgroup_shared_with_other_processes(tmp_path):
    tree = FakeTree(tmp_path)
    tree.put(100, "svc")
    tree.put(7, "svc", pgrp=7)
    (tree.mnt / "svc" / "cgroup.procs").write_text("7\n100\n")
    s = CgroupOomCollector("platform", lambda: 100, fs=tree.fs).sample()
    assert s["cgroups"][str(tree.mnt / "svc")]["shared"] == 1


def test_cgroup_collector_says_why_it_is_unavailable(tmp_path):
    tree = FakeTree(tmp_path)
    (tree.proc / "100").mkdir(parents=True)
    (tree.proc / "100" / "cgroup").write_text("0::/\n")
    s = CgroupOomCollector("platform", lambda: 100, fs=CgroupFS(proc=tree.proc, mounts=[])).sample()
    assert s["available"] == 0 and "no memory cgroup controller" in s["reason"]
    assert CgroupOomCollector("platform", lambda: None, fs=tree.fs).sample() == {
        "service": "platform", "available": 0, "pid": None, "reason": "service not running"}


# ================================================================ kubernetes

def pod(name: str, restarts: int = 0, last: dict | None = None, state: dict | None = None,
        container: str = "platform") -> dict:
    """A pod as ``ApiClient.sanitize_for_serialization`` (or ``kubectl get pod -o json``) gives it."""
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "iot", "labels": {"app": "platform"},
                     "uid": "5f0b6c1e-1111-4c1e-9a1e-0d9d2e6f1a11"},
        "spec": {"containers": [{"name": container, "image": "ghcr.io/x/platform:1.4",
                                 "resources": {"limits": {"memory": "512Mi"}}}]},
        "status": {
            "phase": "Running", "podIP": "10.42.0.17", "startTime": "2026-11-22T03:10:02Z",
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-11-22T03:10:12Z"}],
            "initContainerStatuses": [{
                "name": "migrate", "ready": True, "restartCount": 0, "image": "ghcr.io/x/migrate:1.4",
                "state": {"terminated": {"exitCode": 0, "reason": "Completed",
                                         "startedAt": "2026-11-22T03:10:03Z", "finishedAt": "2026-11-22T03:10:05Z",
                                         "containerID": "containerd://aa11"}},
                "lastState": {}}],
            "containerStatuses": [{
                "name": container, "ready": True, "started": True, "restartCount": restarts,
                "image": "ghcr.io/x/platform:1.4", "imageID": "ghcr.io/x/platform@sha256:12ab",
                "containerID": "containerd://bb22",
                "state": state or {"running": {"startedAt": "2026-11-22T03:14:40Z"}},
                "lastState": {"terminated": last} if last else {}}]}}


OOM_TERM = {"exitCode": 137, "reason": "OOMKilled", "startedAt": "2026-11-22T03:10:06Z",
            "finishedAt": "2026-11-22T03:14:38Z", "containerID": "containerd://9f3e"}


def test_parse_pods_reads_restarts_and_oomkilled_from_last_state():
    s = parse_pods([pod("platform-7d9c-abcde", restarts=1, last=OOM_TERM), pod("platform-7d9c-fghij")])
    assert s["pods"] == 2 and s["restarts"] == 1 and s["oom_killed"] == 1
    c = s["containers"]["platform-7d9c-abcde/platform"]
    assert c["restarts"] == 1 and c["state"] == "running"
    assert c["terminations"] == [{"finished_at": "2026-11-22T03:14:38Z", "reason": "OOMKilled", "exit_code": 137,
                                  "oom_killed": 1}]
    init = s["containers"]["platform-7d9c-abcde/migrate"]
    assert init["terminations"][0]["reason"] == "Completed" and init["terminations"][0]["oom_killed"] == 0


def test_parse_pods_sees_a_container_that_is_oomkilled_right_now():
    st = {"terminated": dict(OOM_TERM)}
    s = parse_pods([pod("p", restarts=3, state={"waiting": {"reason": "CrashLoopBackOff"}}, last=OOM_TERM),
                    pod("q", state=st)])
    assert s["containers"]["p/platform"]["waiting_reason"] == "CrashLoopBackOff"
    assert s["containers"]["q/platform"]["state"] == "terminated" and s["oom_killed"] == 2


def kube(b: RunBuilder, t: float, pods: list[dict]) -> RunBuilder:
    return b.ev("sample", t, collector="kube", namespace="iot", selector="app=platform", **parse_pods(pods))


def test_kubernetes_oomkilled_during_the_run_fails(tmp_path):
    b = RunBuilder(tmp_path)
    for t in range(0, 20):
        kube(b, t + 0.5, [pod("platform-a")])
    for t in range(20, 40):
        kube(b, t + 0.5, [pod("platform-a", restarts=1, last=OOM_TERM)])
    v = no_oom(run(b))                                       # no supervised process: the pods alone decide
    assert v.verdict == FAIL
    assert v.figures == {"k8s_oom_killed": 1}
    assert v.message.startswith("kubernetes: platform-a/platform OOMKilled (exit 137, finished "
                                "2026-11-22T03:14:38Z) at t=20s"), v.message
    u = no_unexpected_exit(run(b))                           # the restart that followed is the OOM's
    assert u.verdict == PASS and u.figures == {"k8s_exits": 0, "k8s_restarts": 0}


def test_kubernetes_oomkilled_from_before_the_run_does_not_count(tmp_path):
    b = RunBuilder(tmp_path)
    for t in range(30):
        kube(b, t + 0.5, [pod("platform-a", restarts=4, last=OOM_TERM)])
    v = no_oom(run(b))
    assert v.verdict == PASS and v.figures["k8s_oom_killed"] == 0
    assert "kubernetes: 2 container(s), 0 OOMKilled" in v.message
    u = no_unexpected_exit(run(b))
    assert u.verdict == PASS and u.figures["k8s_restarts"] == 0


def test_kubernetes_pod_kill_replaces_the_pod_and_is_not_an_oom(tmp_path):
    b = kill_window(RunBuilder(tmp_path))
    for t in range(30):
        kube(b, t + 0.5, [pod("platform-a")])
    for t in range(30, 60):                                  # deleted; the Deployment made a new one
        kube(b, t + 0.5, [pod("platform-b")])
    assert no_oom(run(b)).verdict == PASS


def test_kubernetes_restart_in_a_kill_window_is_the_fault_but_oomkilled_never_is(tmp_path):
    b = kill_window(RunBuilder(tmp_path))
    for t in range(30):
        kube(b, t + 0.5, [pod("platform-a")])
    killed = {"exitCode": 137, "reason": "Error", "finishedAt": "2026-11-22T03:14:38Z"}
    for t in range(30, 60):
        kube(b, t + 0.5, [pod("platform-a", restarts=1, last=killed)])
    assert no_oom(run(b)).verdict == PASS
    v = no_unexpected_exit(run(b))
    assert v.verdict == PASS and v.figures["k8s_injected_kills"] == 2   # its termination and its restart
    b2 = kill_window(RunBuilder(tmp_path / "2"))
    for t in range(30):
        kube(b2, t + 0.5, [pod("platform-a")])
    for t in range(30, 60):
        kube(b2, t + 0.5, [pod("platform-a", restarts=1, last=OOM_TERM)])
    v2 = no_oom(run(b2))
    assert v2.verdict == FAIL and v2.figures["k8s_oom_killed"] == 1


def test_kubernetes_plain_crash_restart_fails(tmp_path):
    b = RunBuilder(tmp_path)
    kube(b, 0.5, [pod("platform-a")])
    kube(b, 9.5, [pod("platform-a", restarts=1, last={"exitCode": 1, "reason": "Error",
                                                       "finishedAt": "2026-11-22T03:14:38Z"})])
    assert no_oom(run(b)).verdict == PASS                    # a crash is not an OOM
    v = no_unexpected_exit(run(b))
    assert v.verdict == FAIL and v.figures["k8s_restarts"] == 1
    assert "platform-a/platform terminated: Error (exit 1)" in v.message


def test_kubernetes_unknown_when_nothing_matches_or_every_query_failed(tmp_path):
    b = RunBuilder(tmp_path)
    for t in range(5):
        kube(b, t + 0.5, [])
    v = no_oom(run(b))
    assert v.verdict == UNKNOWN and "no container matched" in v.message
    b2 = RunBuilder(tmp_path / "2").service_start()
    for t in range(5):
        b2.ev("sample", t + 0.5, collector="kube", error="ApiException: (403) Forbidden")
    v2 = no_oom(run(b2))
    assert v2.verdict == UNKNOWN and "every kubernetes query failed (5), e.g. ApiException: (403)" in v2.message


def test_kube_collector_lists_pods_through_the_client():
    class Api:
        api_client = type("C", (), {"sanitize_for_serialization": staticmethod(lambda p: p)})()

        def list_namespaced_pod(self, ns, label_selector, _request_timeout):
            self.args = (ns, label_selector, _request_timeout)
            return type("L", (), {"items": [pod("platform-a", restarts=1, last=OOM_TERM)]})()

    api = Api()
    s = KubePodsCollector("iot", "app=platform", api=api).sample()
    assert api.args == ("iot", "app=platform", 2.0)
    assert s["namespace"] == "iot" and s["oom_killed"] == 1 and s["restarts"] == 1


# ================================================================ docker

def inspect(name: str = "platform", oom: bool = False, code: int = 0, restarts: int = 0, status: str = "running",
            finished: str = "0001-01-01T00:00:00Z", cid: str = "4f1d2a9c7b3e") -> dict:
    """One element of ``docker inspect`` output (the fields that matter, as Docker 26 writes them)."""
    return {
        "Id": cid + "8a0e5c2d1f7b6a9e3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d",
        "Created": "2026-11-22T03:09:58.120044531Z", "Path": "java", "Args": ["-Xmx64m", "-jar", "platform.jar"],
        "State": {"Status": status, "Running": status == "running", "Paused": False, "Restarting": False,
                  "OOMKilled": oom, "Dead": False, "Pid": 43121 if status == "running" else 0, "ExitCode": code,
                  "Error": "", "StartedAt": "2026-11-22T03:10:01.533Z", "FinishedAt": finished},
        "Name": f"/{name}", "RestartCount": restarts, "Driver": "overlay2", "Platform": "linux",
        "HostConfig": {"Memory": 104857600, "MemorySwap": 209715200,
                       "RestartPolicy": {"Name": "on-failure", "MaximumRetryCount": 0}},
        "Config": {"Hostname": "4f1d2a9c7b3e", "Image": "monsoon-base", "Labels": {"monsoon.run-id": "r"}}}


def test_parse_docker_inspect_reads_oomkilled_exit_and_restarts():
    s = parse_docker_inspect([inspect(oom=True, code=137, status="exited", finished="2026-11-22T03:14:38.1Z"),
                              inspect("postgres", restarts=2)], ["platform", "postgres", "kafka"])
    p = s["containers"]["platform"]
    assert (p["oom_killed"], p["exit_code"], p["state"], p["memory_limit_mb"]) == (1, 137, "exited", 100.0)
    assert p["terminations"] == [{"finished_at": "2026-11-22T03:14:38.1Z", "reason": "OOMKilled",
                                  "exit_code": 137, "oom_killed": 1}]
    assert s["containers"]["postgres"]["terminations"] == []        # never stopped
    assert s["restarts"] == 2 and s["oom_killed"] == 1 and s["missing"] == ["kafka"]


def docker(b: RunBuilder, t: float, items: list[dict], wanted=("platform",)) -> RunBuilder:
    return b.ev("sample", t, collector="docker", **parse_docker_inspect(items, list(wanted)))


def test_docker_oomkilled_fails_with_the_number(tmp_path):
    b = RunBuilder(tmp_path)
    for t in range(10):
        docker(b, t + 0.5, [inspect()])
    docker(b, 10.5, [inspect(oom=True, code=137, status="exited", finished="2026-11-22T03:14:38.1Z")])
    v = no_oom(run(b))
    assert v.verdict == FAIL and v.figures["docker_oom_killed"] == 1
    assert "docker: platform OOMKilled (exit 137, finished 2026-11-22T03:14:38.1Z) at t=10s" in v.message


def test_docker_restart_without_oomkilled_still_fails_as_a_restart(tmp_path):
    b = RunBuilder(tmp_path)
    docker(b, 0.5, [inspect()])
    docker(b, 5.5, [inspect(restarts=1, finished="2026-11-22T03:14:38.1Z", code=0)])  # docker reset OOMKilled
    assert no_oom(run(b)).figures["docker_oom_killed"] == 0
    v = no_unexpected_exit(run(b))
    assert v.verdict == FAIL and v.figures["docker_restarts"] == 1


def test_docker_quiet_passes_and_a_missing_container_is_unknown(tmp_path):
    b = RunBuilder(tmp_path)
    for t in range(10):
        docker(b, t + 0.5, [inspect(restarts=3, finished="2026-11-22T01:00:00Z")])   # history before the run
    assert no_oom(run(b)).verdict == PASS
    b2 = RunBuilder(tmp_path / "2")
    for t in range(10):
        docker(b2, t + 0.5, [inspect()], wanted=("platform", "kafka"))
    v = no_oom(run(b2))
    assert v.verdict == UNKNOWN and "docker: container(s) kafka not found" in v.message


def fake_docker(tmp_path: Path, stdout: str, code: int = 0, stderr: str = "") -> str:
    p = tmp_path / "docker"
    p.write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path}/args\ncat <<'EOF'\n{stdout}\nEOF\n"
                 f"echo '{stderr}' >&2\nexit {code}\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def test_docker_collector_shells_out_to_docker_inspect(tmp_path):
    exe = fake_docker(tmp_path, json.dumps([inspect(oom=True, code=137, status="exited",
                                                    finished="2026-11-22T03:14:38.1Z")]), code=1,
                      stderr="Error: No such object: kafka")
    s = DockerCollector(["platform", "kafka"], docker=exe).sample()
    assert (tmp_path / "args").read_text().split() == ["inspect", "platform", "kafka"]
    assert s["oom_killed"] == 1 and s["missing"] == ["kafka"]


def test_docker_collector_raises_when_there_is_no_engine(tmp_path):
    exe = fake_docker(tmp_path, "[]", code=1, stderr="Cannot connect to the Docker daemon")
    with pytest.raises(RuntimeError, match="Cannot connect to the Docker daemon"):
        DockerCollector(["platform"], docker=exe).sample()
    with pytest.raises(FileNotFoundError):
        DockerCollector(["platform"], docker=str(tmp_path / "no-docker")).sample()


# ================================================================ headroom

def gc_line(uptime: float, n: int, after_mb: float, total: int = 64, kind: str = "Young (Normal)") -> str:
    return (f"[2026-11-22T03:14:{10 + uptime:06.3f}+0000][{uptime:.3f}s][info][gc          ] GC({n}) Pause {kind} "
            f"(G1 Evacuation Pause) 45M->{after_mb:g}M({total}M) 3.566ms")


HEADER = "[2026-11-22T03:13:53.543+0000][0.018s][info][gc,init] Heap Max Capacity: 64M\n"


def test_headroom_is_reported_from_the_gc_log_and_the_heap_max_metric(tmp_path):
    b = RunBuilder(tmp_path).service_start()
    b.gc_log("\n".join(gc_line(1.0 + i, i, a) for i, a in enumerate([8, 12, 20, 9, 11])) + "\n")
    for t in range(5):
        b.metrics(t + 0.5, heap_max=64.0 * 1024 * 1024, heap_used=3e7)
    v = no_oom(run(b))
    assert v.verdict == PASS
    assert (v.figures["heap_headroom_pct"], v.figures["heap_peak_after_gc_mb"], v.figures["heap_max_mb"]) == \
        (68.8, 20.0, 64.0)
    assert "heap headroom 68.8%: platform's heap after GC peaked at 20 MB of 64 MB max (heap_max metric)" \
        in v.message


def test_near_oom_fails_only_with_min_headroom_pct(tmp_path):
    b = RunBuilder(tmp_path).service_start()
    b.gc_log(HEADER + "\n".join(gc_line(1.0 + i, i, a, kind="Full (G1 Compaction Pause)")
                                for i, a in enumerate([30, 50, 61, 62])) + "\n")
    r = run(b)
    v = no_oom(r)
    assert v.verdict == PASS and v.figures["heap_headroom_pct"] == 3.1        # reported only
    assert "GC log Heap Max Capacity" in v.message
    v = no_oom(r, min_headroom_pct=10)
    assert v.verdict == FAIL and v.figures["min_headroom_pct"] == 10
    assert "heap headroom 3.1%: platform's heap after GC peaked at 62 MB of 64 MB max" in v.message
    assert "below the 10% minimum: a near-OOM" in v.message
    assert no_oom(r, min_headroom_pct=3).verdict == PASS


def test_headroom_asked_for_but_not_measurable_is_unknown(tmp_path):
    r = run(RunBuilder(tmp_path).service_start())
    assert "heap_headroom_pct" not in no_oom(r).figures
    v = no_oom(r, min_headroom_pct=10)
    assert v.verdict == UNKNOWN and "heap headroom not measurable: no GC log" in v.message
    b = RunBuilder(tmp_path / "2").service_start()
    b.gc_log(gc_line(1.0, 0, 20) + "\n")                                      # no Heap Max line, no metric
    v = no_oom(run(b), min_headroom_pct=10)
    assert v.verdict == UNKNOWN and "no max heap" in v.message


def test_headroom_takes_the_worst_service(tmp_path):
    b = RunBuilder(tmp_path).service_start()
    b.gc_log(HEADER + gc_line(1.0, 0, 16) + "\n", service="platform")
    b.gc_log(HEADER.replace("64M", "128M") + gc_line(1.0, 0, 120, total=128) + "\n", service="kafka")
    rows, _ = heap_headroom(run(b))
    assert sorted((r.service, r.pct) for r in rows) == [("kafka", 6.2), ("platform", 75.0)]
    v = no_oom(run(b), min_headroom_pct=10)
    assert v.verdict == FAIL and v.figures["heap_headroom_pct"] == 6.2 and v.figures["heap_headroom_pct.platform"] == 75


# ================================================================ combining and evaluate

def test_fail_beats_unknown_beats_pass_across_angles(tmp_path):
    b = RunBuilder(tmp_path).service_start()
    cgroup(b, every_second(0, 30, {12: 1}), shared=1)         # unknown
    for t in range(30):
        docker(b, t + 0.5, [inspect()])                     # pass
    assert no_oom(run(b)).verdict == UNKNOWN
    exit_(b, 20.0, code=3, oom=True)                        # fail
    v = no_oom(run(b))
    assert v.verdict == FAIL and v.message.index("OutOfMemoryError") < v.message.index("shared")


def test_evaluate_passes_min_headroom_pct_through(tmp_path):
    b = RunBuilder(tmp_path).service_start()
    b.gc_log(HEADER + gc_line(1.0, 0, 62) + "\n")
    (v,) = evaluate(b.write(), [("no_oom", {"min_headroom_pct": 5})])
    assert v.verdict == FAIL and v.figures["heap_headroom_pct"] == 3.1


# ================================================================ collectors_for

def test_collectors_for_adds_the_oom_collectors_from_the_observe_section(tmp_path, monkeypatch, caplog):
    from monsoon.spec.stack import StackSpec
    spec = StackSpec.model_validate({
        "name": "s", "services": {"platform": {"command": ["true"]}}, "devices": {"port": "1"},
        "provisioning": {"kind": "none"}, "storage": {"dsn": "x", "loss_query": "x"},
        "observe": {"service": "platform", "docker": ["platform"],
                    "kubernetes": {"namespace": "iot", "labelSelector": {"app": "platform", "tier": "ingest"}}}})
    assert spec.observe.kubernetes.selector_string() == "app=platform,tier=ingest"
    stack = type("S", (), {"spec": spec, "run_id": "r1", "pid": lambda self, s: None})()
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "none"))
    names = [c.name for c in collectors_for(stack)]
    assert names == ["process", "cgroup", "docker"]                   # no cluster: no kube collector
    assert "no cluster is configured" in caplog.text
    (tmp_path / "none").write_text("apiVersion: v1\n")
    assert [c.name for c in collectors_for(stack)] == ["process", "cgroup", "kube", "docker"]
    cg = collectors_for(stack)[1]
    assert cg.child_name == "m_r1__platform"


def test_headroom_reads_the_gc_logs_the_jvm_rotated_away_at_each_restart(tmp_path):
    """-Xlog:gc*:file=gc.log rotates the crashed JVM's log to gc.log.N on restart: its near-full heap is there."""
    b = RunBuilder(tmp_path).service_start()
    b.gc_log(HEADER + gc_line(1.0, 0, 19) + "\n")                          # the JVM that survived
    (tmp_path / "services" / "platform" / "gc.log.0").write_text(
        HEADER + "\n".join(gc_line(1.0 + i, i, a, kind="Full (G1 Compaction Pause)")
                           for i, a in enumerate([40, 61, 62])) + "\n")  # the one that died of OOM
    (tmp_path / "services" / "platform" / "gc.log.lck").write_text("not a log\n")
    v = no_oom(run(b))
    assert v.figures["heap_headroom_pct"] == 3.1 and v.figures["heap_peak_after_gc_mb"] == 62


@pytest.mark.parametrize("code, log, sent, cause, oom", [
    (137, "", 9, "killed by monsoon with SIGKILL (exit 137)", False),
    (137, "", None, "SIGKILL (exit 137), not sent by monsoon", False),
    (137, "java.lang.OutOfMemoryError: Java heap space", 9,
     "SIGKILL (exit 137) after OutOfMemoryError in log", True),
    (137, "", 15, "SIGKILL (exit 137), not sent by monsoon", False),  # sent TERM, died of KILL
    (143, "", 15, "killed by monsoon with SIGTERM (exit 143)", False),
    (3, "java.lang.OutOfMemoryError: Java heap space", 9, "java.lang.OutOfMemoryError (JVM exit 3)", True),
])
def test_exit_cause_names_monsoons_own_kill_and_never_hides_an_oom(code, log, sent, cause, oom):
    assert exit_cause(code, log, sent) == (cause, oom)


def test_exit_cause_takes_the_kernels_oom_line_as_evidence():
    line = "Memory cgroup out of memory: Killed process 42 (java) total-vm:1kB"
    assert exit_cause(137, "", None, line) == (f"SIGKILL (exit 137) by the kernel OOM killer: {line}", True)
    assert exit_cause(137, "", 9, line)[1] is True           # even inside a pod-kill window: the kernel's word wins


def test_the_kernel_log_is_read_for_the_pid_and_only_since_the_process_started(tmp_path):
    from monsoon.stack.kernel import oom_kill_line
    kmsg = tmp_path / "kmsg"        # /dev/kmsg records: "prio,seq,usec,flags;message", one per read
    kmsg.write_text("6,1,5000000,-;Memory cgroup out of memory: Killed process 42 (java) total-vm:1kB\n")
    assert oom_kill_line(42, path=str(kmsg))[0].startswith("Memory cgroup out of memory: Killed process 42")
    assert oom_kill_line(4, path=str(kmsg)) == (None, None)              # another pid (42 is not 4)
    assert oom_kill_line(42, since=100.0, path=str(kmsg)) == (None, None)  # logged before the process started
    line, why = oom_kill_line(42, path=str(tmp_path / "nope"))
    assert line is None and why.startswith("kernel log unreadable")


# ================================================================ stalled at the memory limit (no kill)

def _limit_run(tmp_path, usage: float, acked: int, secs=range(0, 50), stall=range(22, 44), kill_at=None):
    """CI's inmemory-docker x10 (cgroup v1, 200 MB limit): acks at 4,000/s, then none from sec 22 while the
    container sits at 199.9 of 200 MB, 97 % anonymous, re-reading evicted file pages."""
    b = RunBuilder(tmp_path).service_start().phases(5, 45, 5)
    refaults = 1000
    for s in secs:
        inside = s in stall
        b.load(s, 4000, acked if inside else 4000)
        refaults += 900 if inside else 0
        g = {"version": 1, "oom_kill": 0, "limit_hits": 0, "shared": 0, "limit_mb": 200.0,
             "usage_mb": usage if inside else 150.0, "anon_mb": 194.0 if inside else 120.0, "refaults": refaults}
        b.ev("sample", s + 1.3, collector="cgroup", service="platform", available=1, pid=1, cgroup=CG,
             oom_kills=0, limit_hits=0, cgroups={CG: g})
    if kill_at is not None:
        exit_(b, kill_at, code=137, oom=True)
    return run(b)


def test_a_service_alive_at_its_memory_limit_and_acking_nothing_fails_no_oom(tmp_path):
    v = no_oom(_limit_run(tmp_path, usage=199.9, acked=0))
    assert v.verdict == FAIL, v.message
    assert v.figures["memory_limit_stalls"] == 1 and v.figures["memory_limit_stall_s"] == 22.0, v.figures
    assert ("platform stalled at its memory limit for 22 s from t=23s (18s into the burst): cgroup usage 199.9 "
            "of 200 MB (194 MB anonymous), 0 of 88,000 messages acked meanwhile, 18,900 evicted file pages "
            "re-read (thrashing); the kernel did not OOM-kill it") in v.message, v.message


def test_a_stall_the_kernel_ends_with_a_kill_says_so(tmp_path):
    v = no_oom(_limit_run(tmp_path, usage=199.9, acked=0, kill_at=45.0))
    assert v.verdict == FAIL and "then the kernel OOM-killed it" in v.message, v.message


def test_at_the_limit_but_serving_is_page_cache_not_a_stall(tmp_path):
    """Postgres' page cache fills a cgroup v1 limit all the time: at the limit while the acks flow is fine."""
    v = no_oom(_limit_run(tmp_path, usage=199.9, acked=3990))
    assert v.verdict == PASS and v.figures["memory_limit_stalls"] == 0, v.message


def test_starved_below_the_limit_is_not_a_memory_stall(tmp_path):
    v = no_oom(_limit_run(tmp_path, usage=150.0, acked=0))
    assert v.verdict == PASS and v.figures["memory_limit_stalls"] == 0, v.message


def test_a_stall_shorter_than_ten_seconds_is_a_pause_not_a_stall(tmp_path):
    v = no_oom(_limit_run(tmp_path, usage=199.9, acked=0, stall=range(22, 30)))
    assert v.verdict == PASS and v.figures["memory_limit_stalls"] == 0, v.message


@pytest.mark.parametrize("version,stat", [
    (1, "cache 1000\nrss 4194304\ntotal_rss 8388608\ntotal_workingset_refault_file 77\n"),
    (2, "anon 8388608\nfile 1000\nworkingset_refault_anon 3\nworkingset_refault_file 77\n")])
def test_cgroup_collector_reads_anonymous_memory_and_refaults_from_memory_stat(tmp_path, version, stat):
    tree = FakeTree(tmp_path, version)
    tree.put(100, "svc")
    (tree.mnt / "svc" / "memory.stat").write_text(stat)
    s = CgroupOomCollector("platform", lambda: 100, fs=tree.fs).sample()
    g = s["cgroups"][str(tree.mnt / "svc")]
    assert g["anon_mb"] == 8.0 and g["refaults"] == 77, g


def test_at_the_limit_with_mostly_page_cache_is_not_a_memory_stall(tmp_path):
    """A broker's page cache fills its limit; when something else starves the load, it is not its memory."""
    b = RunBuilder(tmp_path).service_start().phases(5, 45, 5)
    for s in range(0, 50):
        b.load(s, 4000, 0 if 22 <= s < 44 else 4000)
        b.ev("sample", s + 1.3, collector="cgroup", service="kafka", available=1, pid=1, cgroup=CG, oom_kills=0,
             limit_hits=0, cgroups={CG: {"version": 1, "oom_kill": 0, "usage_mb": 199.9, "limit_mb": 200.0,
                                         "anon_mb": 60.0, "refaults": 5}})
    v = no_oom(run(b))
    assert v.verdict == PASS and v.figures["memory_limit_stalls"] == 0, v.message


def test_a_starved_load_an_injected_kill_explains_is_not_a_memory_stall(tmp_path):
    """The killed platform restarting (TB took 49 s) starves the load; the fault explains it, not memory."""
    b = kill_window(RunBuilder(tmp_path).service_start(), start=20.0, end=21.0)
    for s in range(0, 50):
        b.load(s, 4000, 0 if 20 <= s < 44 else 4000)
        b.ev("sample", s + 1.3, collector="cgroup", service="kafka", available=1, pid=1, cgroup=CG, oom_kills=0,
             limit_hits=0, cgroups={CG: {"version": 1, "oom_kill": 0, "usage_mb": 199.9, "limit_mb": 200.0}})
    v = no_oom(run(b))
    assert v.figures.get("memory_limit_stalls", 0) == 0, v.message


def test_the_report_draws_an_exit_as_an_oom_only_when_no_oom_calls_it_one(tmp_path):
    """A 30-min soak's report drew the pod kill's SIGKILL as "platform OOM 137" while no_oom said "no
    out-of-memory death (2 exit(s) caused by injected kills)": the plot must say what the check says."""
    from monsoon.report.html import markers_of
    b = kill_window(RunBuilder(tmp_path).service_start(), start=30.0, end=35.0)
    b.ev("service", 30.2, service="platform", event="exit", code=137, oom=False, pid=1,
         cause="killed by monsoon with SIGKILL (exit 137)")
    b.ev("service", 31.0, service="platform", event="restart", n=2)
    exit_(b, 80.0, code=3, oom=True)
    r = run(b)
    assert no_oom(r).figures["oom_events"] == 1
    got = [(m.t, m.kind, m.label) for m in markers_of(r.events)]
    assert (30.2, "exit", "platform exit 137") in got and (80.0, "oom", "platform OOM 3") in got, got
