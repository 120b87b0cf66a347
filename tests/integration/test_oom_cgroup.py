"""no_oom on the REAL kernel: a stack service moved into a memory cgroup with a low limit (the cgroup fault
backend) is OOM-killed; the cgroup collector records the oom_kill increase and no_oom names the kernel OOM
killer.  The same exit 137 from a plain SIGKILL (what a pod-kill does) is not called an OOM."""
from __future__ import annotations

import os
import sys
import time

import pytest

from monsoon.checks.base import FAIL, PASS, RunData
from monsoon.observe.collectors import CgroupOomCollector, ProcessCollector, collectors_for
from monsoon.observe.sampler import Sampler
from monsoon.faults.base import FaultContext
from monsoon.faults.cgroup import CgroupBackend, CgroupFS
from monsoon.spec.fault import FaultSpec
from monsoon.checks.oom import no_oom, no_unexpected_exit
from monsoon.spec.stack import StackSpec
from monsoon.stack.supervisor import Stack
from monsoon.timeline.store import Timeline

FS = CgroupFS()
REASON = FS.available()
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(REASON is not None, reason=f"no writable memory cgroup here: {REASON}")]

RUN_ID = "oom-cg-1"
# allocates 16 MiB every 0.1 s after a "go" file appears, up to 400 MiB, then idles
HOG = ("import os, sys, time\n"
       "go = sys.argv[1]; blocks = []\n"
       "print('hog ready', flush=True)\n"
       "while not os.path.exists(go): time.sleep(0.05)\n"
       "for _ in range(25):\n"
       "    blocks.append(b\"\\x01\" * (16 << 20)); time.sleep(0.1)\n"
       "time.sleep(3600)\n")


def _spec(go) -> StackSpec:
    return StackSpec.model_validate({
        "name": "oom-cg",
        "services": {"hog": {"command": [sys.executable, "-c", HOG, str(go)], "stop_timeout": 3,
                             "ready": {"log": "hog ready", "timeout": 10}}},
        "devices": {"port": "1"}, "provisioning": {"kind": "none"},
        "storage": {"dsn": "x", "loss_query": "x"}, "observe": {"service": "hog"}})


def _wait_exit(tl_events, deadline_s: float) -> dict:
    deadline = time.monotonic() + deadline_s
    while True:
        ex = next((f for t, f in tl_events if t == "service" and f.get("event") == "exit"), None)
        if ex is not None:
            return ex
        assert time.monotonic() < deadline, "the hog did not exit"
        time.sleep(0.05)


def _run(tmp_path, limit_mb: int, sigkill: bool):
    """Start the hog, put it under ``limit_mb``, then let it allocate (or SIGKILL it); returns the run dir."""
    run_dir = tmp_path / "run"
    go = tmp_path / "go"
    seen: list[tuple[str, dict]] = []
    backend = CgroupBackend(state_dir=tmp_path / "state")
    fault = FaultSpec(name="mp", kind="memory-pressure", target="hog", backend="cgroup",
                      params={"limit_mb": limit_mb}, schedule={"duration": 30})
    with Timeline(run_dir / "timeline.jsonl") as tl:
        tl.add("meta", run_id=RUN_ID, stack="oom-cg", experiment="oom", profile="quick", base_rate=0)

        def on_event(type_: str, **f) -> None:
            tl.add(type_, **f)
            seen.append((type_, f))

        sampler = handle = None
        with Stack(_spec(go), run_dir, run_id=RUN_ID, on_event=on_event) as stack:
            try:
                sampler = Sampler(tl, [ProcessCollector(lambda: stack.pid("hog")),
                                       CgroupOomCollector("hog", lambda: stack.pid("hog"), run_id=RUN_ID)],
                                  period=0.25).start()
                time.sleep(0.6)
                handle = backend.inject(fault, FaultContext(run_id=RUN_ID, stack=stack))
                time.sleep(0.6)                                   # the collector sees the child cgroup
                if sigkill:
                    stack.kill("hog")                             # what pod-kill does
                else:
                    go.touch()                                    # allocate up to 400 MiB under the limit
                ex = _wait_exit(seen, 20)
                time.sleep(1.0)                                   # a few samples after the death
            finally:
                if sampler is not None:
                    sampler.stop()
                if handle is not None:
                    backend.heal(handle)
                backend.heal_all(RUN_ID)
        assert backend.census(RUN_ID) == []
    return run_dir, ex, handle


def test_kernel_oom_kill_is_seen_by_the_cgroup_and_named_by_no_oom(tmp_path):
    run_dir, ex, handle = _run(tmp_path, limit_mb=96, sigkill=False)
    assert ex["code"] == 137
    r = RunData(run_dir)
    samples = list(r.events.of("sample", collector="cgroup"))
    assert any(s.get("cgroup", "") and s["cgroup"].endswith(f"m_{RUN_ID}__hog") for s in samples)
    v = no_oom(r)
    t_exit = r.events.first("service", event="exit")["t"]
    print(f"\n{handle.data['cgroup']} (v{handle.data['version']}): exit {ex['code']} at t={t_exit:.2f}s; "
          f"{len(samples)} cgroup samples; {v.verdict}: {v.figures}\n  {v.message}")
    assert v.verdict == FAIL
    assert v.figures["cgroup_oom_kills"] >= 1 and v.figures["oom_events"] == 1
    assert v.message.startswith("hog died: ") and "by the kernel OOM killer" in v.message, v.message
    assert "without an exit 137" not in v.message          # the cgroup's count is this death's, not another
    assert not os.path.exists(handle.data["cgroup"])              # healed: the child cgroup is gone


def test_a_plain_sigkill_under_the_same_limit_is_not_called_an_oom(tmp_path):
    run_dir, ex, _ = _run(tmp_path, limit_mb=96, sigkill=True)
    assert ex["code"] == 137
    v = no_oom(RunData(run_dir))
    print(f"\nSIGKILL: {v.verdict}: {v.figures}\n  {v.message}")
    assert v.verdict == PASS                                     # not an OOM ...
    assert v.figures["cgroup_oom_kills"] == 0 and v.figures["oom_events"] == 0
    u = no_unexpected_exit(RunData(run_dir))                     # ... but an unexpected death all the same
    assert u.verdict == FAIL and u.message.startswith("hog died of SIGKILL, sent by monsoon outside any kill fault, "
                                                      "with no OOM evidence (cgroup oom_kill unchanged"), u.message


DEP_STACK = {
    "name": "oom-dep",
    "services": {"platform": {"command": [sys.executable, "-c", "import time; print('up', flush=True); "
                                                                "time.sleep(3600)"],
                              "stop_timeout": 3, "ready": {"log": "up", "timeout": 10}}},
    "devices": {"port": "1"}, "provisioning": {"kind": "none"},
    "storage": {"dsn": "x", "loss_query": "x"}, "observe": {"service": "platform"}}


def test_a_dependency_the_kernel_kills_is_an_oom_named_by_no_oom(tmp_path):
    """Every service's cgroup is sampled (collectors_for), not only the observed one: the dependency "dep",
    squeezed by the memory-pressure fault until the kernel kills it, is named by no_oom."""
    go = tmp_path / "go"
    spec = StackSpec.model_validate({**DEP_STACK, "services": {**DEP_STACK["services"], "dep": {
        "command": [sys.executable, "-c", HOG, str(go)], "stop_timeout": 3, "ready": {"log": "hog ready", "timeout": 10}}}})
    run_dir, seen = tmp_path / "run", []
    backend = CgroupBackend(state_dir=tmp_path / "state")
    fault = FaultSpec(name="mp", kind="memory-pressure", target="dep", backend="cgroup",
                      params={"limit_mb": 96}, schedule={"duration": 30})
    with Timeline(run_dir / "timeline.jsonl") as tl:
        tl.add("meta", run_id="oom-dep", stack="oom-dep", experiment="oom", profile="quick", base_rate=0)

        def on_event(type_: str, **f) -> None:
            tl.add(type_, **f)
            seen.append((type_, f))

        with Stack(spec, run_dir, run_id="oom-dep", on_event=on_event) as stack:
            sampler = Sampler(tl, collectors_for(stack), period=0.25).start()
            handle = None
            try:
                time.sleep(0.6)
                handle = backend.inject(fault, FaultContext(run_id="oom-dep", stack=stack))
                time.sleep(0.6)
                go.touch()
                ex = _wait_exit(seen, 20)
                time.sleep(1.0)
            finally:
                sampler.stop()
                if handle is not None:
                    backend.heal(handle)
                backend.heal_all("oom-dep")
    assert ex["service"] == "dep" and ex["code"] == 137
    r = RunData(run_dir)
    assert {s.get("service") for s in r.events.of("sample", collector="cgroup")} == {"platform", "dep"}
    v = no_oom(r)
    print(f"\ndependency: {v.verdict}: {v.figures}\n  {v.message}")
    assert v.verdict == FAIL and v.figures["oom_events"] == 1
    assert v.message.startswith("dep died: ") and "kernel OOM killer" in v.message
