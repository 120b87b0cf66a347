"""What Chaos Mesh's chaos-daemon serves: PodChaos container-kill and StressChaos memory. Rendering, the refusals
before the load (chaos-daemon not built, no memory cgroup to charge memStress to), the landing by the container's
effect (same pod, new container ID, restart count up; OOMKilled for the stressor), and the daemon's argv.
Pure logic with fakes of the API; the real daemon runs in tests/integration/test_kubernetes_daemon.py."""
from pathlib import Path
from types import SimpleNamespace as NS

import pytest

from monsoon.faults.base import FaultContext, FaultError
from monsoon.faults.kube import kernel_refusal, memory_cgroup_missing, render
from monsoon.spec.fault import FaultSpec
from monsoon.stack import cluster
from tests.unit.test_fault_kube import FakeClock, FakeCustomObjectsApi, polled_backend

POD = {"namespace": "iot", "labelSelector": {"monsoon.io/service": "platform"}, "container": "platform"}


def fault(kind, params, target=POD, duration=5):
    return FaultSpec(name=f"{kind}-x", kind=kind, target=target, backend="chaos-mesh", params=params,
                     schedule={"at": 5, "duration": duration})


def test_container_kill_is_a_podchaos_naming_the_container():
    (o,) = render(fault("container-kill", {}), "r1", ["iot"])
    assert o["kind"] == "PodChaos" and o["spec"]["action"] == "container-kill" and o["spec"]["mode"] == "one"
    assert o["spec"]["containerNames"] == ["platform"]
    assert o["spec"]["selector"] == {"namespaces": ["iot"], "labelSelectors": {"monsoon.io/service": "platform"}}


def test_container_kill_without_a_container_is_refused_naming_the_key():
    whole_pod = {k: v for k, v in POD.items() if k != "container"}
    with pytest.raises(FaultError, match="container-kill needs target.container"):
        render(fault("container-kill", {}, target=whole_pod), "r1", ["iot"])


def test_container_kill_is_chaos_mesh_or_litmus_only():
    with pytest.raises(Exception, match="container-kill"):
        FaultSpec(name="c", kind="container-kill", target="platform", backend="process", params={},
                  schedule={"at": 1, "duration": 1})
    assert FaultSpec(name="c", kind="container-kill", target=POD, backend="litmus", params={},
                     schedule={"at": 1, "duration": 1}).backend == "litmus"


def test_memory_stress_is_a_stresschaos_in_the_container():
    (o,) = render(fault("memory-pressure", {"hog_mb": 256, "workers": 1}, duration=20), "r1", ["iot"])
    assert o["kind"] == "StressChaos" and o["spec"]["containerNames"] == ["platform"]
    assert o["spec"]["stressors"] == {"memory": {"workers": 1, "size": "256MB"}} and o["spec"]["duration"] == "20s"


def v1_root(tmp_path: Path) -> Path:
    (tmp_path / "memory").mkdir()
    (tmp_path / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    return tmp_path


def test_no_chaos_daemon_refuses_both_kinds_before_the_load_in_one_line(tmp_path):
    why = "chaos-daemon: not built (/x/bin/chaos-daemon): run tools/build-chaos-daemon"
    root = str(v1_root(tmp_path))
    for kind, params, what in (("container-kill", {}, "PodChaos container-kill"),
                               ("memory-pressure", {"hog_mb": 64}, "StressChaos memory")):
        line = kernel_refusal(fault(kind, params), daemon_missing=why, cgroup_root=root)
        assert line and "\n" not in line and line.startswith(f"{kind}-x: {what} needs Chaos Mesh's chaos-daemon")
        assert "tools/build-chaos-daemon" in line and line.endswith("refused before the load")


def test_memory_stress_without_a_memory_cgroup_is_refused_saying_where_it_looked(tmp_path):
    line = kernel_refusal(fault("memory-pressure", {"hog_mb": 64}), daemon_missing="", cgroup_root=str(tmp_path))
    assert line and "\n" not in line and "StressChaos memory needs a memory cgroup" in line
    assert f"no memory cgroup controller under {tmp_path}" in line and line.endswith("refused before the load")
    # container-kill needs no cgroup: served
    assert kernel_refusal(fault("container-kill", {}), daemon_missing="", cgroup_root=str(tmp_path)) is None


def test_cgroup_v2_needs_its_memory_controller_and_cgroup_namespaces(tmp_path):
    root, proc = tmp_path / "cg", tmp_path / "proc"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpuset cpu io pids\n")
    assert "cgroup v2 without its memory controller" in memory_cgroup_missing(str(root), str(proc))
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    assert "cgroup namespaces" in memory_cgroup_missing(str(root), str(proc))
    (proc / "1" / "ns").mkdir(parents=True)
    (proc / "1" / "ns" / "cgroup").write_text("")
    assert memory_cgroup_missing(str(root), str(proc)) is None


def test_cgroup_v1_memory_hierarchy_serves_it(tmp_path):
    assert memory_cgroup_missing(str(v1_root(tmp_path)), str(tmp_path / "proc")) is None
    assert kernel_refusal(fault("memory-pressure", {"hog_mb": 64}), daemon_missing="",
                          cgroup_root=str(tmp_path)) is None


class ContainerCore:
    """One pod (UID u1) whose platform container's ID, restart count and last termination the test sets."""

    def __init__(self):
        self.uid, self.cid, self.restarts, self.last = "u1", "containerd://aaa", 0, None

    def list_namespaced_pod(self, namespace, label_selector=None, **kw):
        last = NS(terminated=NS(reason=self.last[0], exit_code=self.last[1]) if self.last else None)
        cs = NS(name="platform", image="monsoon/platform", restart_count=self.restarts, container_id=self.cid,
                last_state=last, state=NS(running=NS(), terminated=None, waiting=None))
        pod = NS(metadata=NS(uid=self.uid, name="platform-abc", deletion_timestamp=None),
                 spec=NS(containers=[NS(name="platform", image="monsoon/platform")]),
                 status=NS(conditions=[NS(type="Ready", status="True")], container_statuses=[cs]))
        return NS(items=[pod])


def injected_backend(core):
    api, clock = FakeCustomObjectsApi(), FakeClock()
    be = polled_backend("chaos-mesh", api, clock)
    be._core = core
    api.controller = lambda a, k, o: o.update(status={"conditions": [{"type": "AllInjected", "status": "True"}]})
    return be


def test_container_kill_lands_on_a_new_container_id_and_a_restart_in_the_same_pod():
    core = ContainerCore()
    be = injected_backend(core)
    h = be.inject(fault("container-kill", {"restart_timeout": 5}), FaultContext(run_id="r1"))
    assert h.data["containers_before"]["u1"]["containers"]["platform"]["id"] == "containerd://aaa"
    land = be.verify(h)             # AllInjected, but the container was not restarted: not landed
    assert land.landed is False and "new ID with a restart" in land.evidence["not_landed"]
    core.cid, core.restarts, core.last = "containerd://bbb", 1, ("Error", 137)
    land = be.verify(h)
    (r,) = land.evidence["restarted"]
    assert land.landed is True and land.evidence["method"] == "api+container-id"
    assert (r["id_before"], r["id"], r["restarts_before"], r["restarts"]) == ("containerd://aaa", "containerd://bbb", 0, 1)
    assert land.evidence["same_uids"] == ["u1"] and r["last"] == "Error (137)"


def test_a_new_pod_is_not_a_container_kill():
    core = ContainerCore()
    be = injected_backend(core)
    h = be.inject(fault("container-kill", {"restart_timeout": 5}), FaultContext(run_id="r1"))
    core.uid, core.cid, core.restarts = "u2", "containerd://ccc", 0     # replaced, not restarted
    land = be.verify(h)
    assert land.landed is False and land.evidence["restarted"] == [] and land.evidence["same_uids"] == []


def test_memory_stress_lands_when_its_container_is_oomkilled_and_restarted():
    core = ContainerCore()
    be = injected_backend(core)
    h = be.inject(fault("memory-pressure", {"hog_mb": 256}), FaultContext(run_id="r1"))
    core.cid, core.restarts, core.last = "containerd://bbb", 1, ("Error", 137)    # killed, not by its limit
    assert be.verify(h).landed is False
    core.cid, core.restarts, core.last = "containerd://ccc", 2, ("OOMKilled", 137)
    land = be.verify(h)
    assert land.landed is True and land.evidence["oom_killed"] == ["platform-abc/platform"]


def test_chaos_daemon_runs_in_its_own_mount_namespace_with_host_sys_and_the_helpers(tmp_path):
    argv, env = cluster.daemon_argv("chaos-daemon", tmp_path / "cluster", tmp_path / "bin")
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "--"]
    script, args = argv[7], argv[8:]
    assert 'exec "$1" --runtime containerd --runtime-socket-path "$3"' in script
    assert args[:4] == ["chaos-daemon", str(tmp_path / "bin" / "chaos-daemon"), str(tmp_path / "chaos-daemon"),
                        str(tmp_path / "cluster" / "containerd" / "c.sock")]
    assert args[4] == "/host-sys" and "mount --rbind /sys" in script and "/usr/local/bin" in script
    assert env["PATH"].startswith("/usr/local/bin:")


def test_chaos_daemon_missing_names_the_build_command(tmp_path):
    c = cluster.Cluster(tmp_path / "k8s" / "cluster")
    assert "run tools/build-chaos-daemon" in cluster.chaos_daemon_missing(c)
    (tmp_path / "k8s" / "bin").mkdir(parents=True)
    exe = tmp_path / "k8s" / "bin" / "chaos-daemon"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    line = cluster.chaos_daemon_missing(c)
    assert "helpers pause, nsexec, memStress: not built" in line and "tools/build-chaos-daemon" in line
