"""ServicesCollector: every service's RSS, summed over its process group, from one pass over a (fake) /proc; and
collectors_for adds it to a stack of local processes only."""
from __future__ import annotations

import os
import subprocess
import sys

from monsoon.observe.collectors import ServicesCollector, collectors_for
from monsoon.spec.stack import StackSpec

PAGE = os.sysconf("SC_PAGE_SIZE")


def stat(pid: int, comm: str, pgrp: int, rss_pages: int) -> str:
    # pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime
    # priority nice threads itrealvalue starttime vsize rss ...
    return f"{pid} ({comm}) S 1 {pgrp} {pgrp} 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 100 12345 {rss_pages} 0 0\n"


def fake_proc(tmp_path, procs):
    root = tmp_path / "proc"
    for pid, comm, pgrp, pages in procs:
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "stat").write_text(stat(pid, comm, pgrp, pages))
    (root / "self").mkdir()                 # not a pid
    (root / "77").mkdir()                   # a process gone between the listing and the read
    return root


def test_rss_is_summed_over_each_services_process_group_every_nth_sample(tmp_path):
    proc = fake_proc(tmp_path, [
        (100, "postgres", 100, 2560),       # 10 MiB
        (101, "postgres: writer (x) )", 100, 1280),   # a backend in the same group, with ") " in its name
        (200, "java", 200, 51200),          # 200 MiB
        (300, "other", 300, 99999),         # not a service of the stack
    ])
    pids = {"postgres": 100, "registry": 200, "done": None}
    c = ServicesCollector(lambda: pids, every=3, proc=proc)
    s = c.sample()
    assert s == {"rss_mb": {"postgres": round(3840 * PAGE / 1048576, 1), "registry": round(51200 * PAGE / 1048576, 1)},
                 "procs": {"postgres": 2, "registry": 1}}
    assert c.sample() is None and c.sample() is None          # every 3rd sample
    pids["registry"] = None                                   # killed, not yet restarted
    assert c.sample() == {"rss_mb": {"postgres": round(3840 * PAGE / 1048576, 1)}, "procs": {"postgres": 2}}


def test_a_real_process_group_is_measured():
    child = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(64 << 20); time.sleep(30)"],
                             start_new_session=True, stdout=subprocess.PIPE)
    try:
        import time
        c = ServicesCollector(lambda: {"svc": child.pid}, every=1)
        deadline = time.monotonic() + 20
        while (s := c.sample())["rss_mb"]["svc"] < 64 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert s["procs"] == {"svc": 1} and 64 <= s["rss_mb"]["svc"] < 200
    finally:
        child.kill()
        child.wait()


def _spec(**observe) -> StackSpec:
    return StackSpec.model_validate({
        "name": "s", "services": {"platform": {"command": ["true"]}, "db": {"command": ["true"]}},
        "devices": {"port": "1"}, "provisioning": {"kind": "none"}, "storage": {"dsn": "x", "loss_query": "x"},
        "observe": {"service": "platform", **observe}})


def test_collectors_for_adds_it_to_local_processes_only(monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    pids = {"platform": 11, "db": 22}
    stack = type("S", (), {"spec": _spec(), "run_id": "r1", "pid": lambda self, s: pids[s]})()
    (svc,) = [c for c in collectors_for(stack) if c.name == "services"]
    assert svc.pids() == {"platform": 11, "db": 22}
    stack.spec = _spec(docker=["platform"])       # watched through Docker: not local processes
    assert "services" not in [c.name for c in collectors_for(stack)]
