"""``Stack.kill`` signals the right thing: a pod through its PodProc (never ``os.killpg`` of a pid that may be 0,
which would signal monsoon's own process group), a process through its group."""
import os
import signal
from pathlib import Path

import pytest

from monsoon.stack.ports import StackError
from monsoon.stack.supervisor import Service, Stack


class _Proc:
    def __init__(self, pid: int):
        self.pid, self.signals = pid, []

    def poll(self):
        return None

    def signal(self, sig):
        self.signals.append(sig)


def _stack(svc: Service) -> Stack:
    st = object.__new__(Stack)        # only what kill() reads: no stack is started
    st.services = {svc.name: svc}
    return st


def _service(proc, **kind) -> Service:
    return Service("s", None, [], {}, Path("."), Path("s.log"), proc=proc, **kind)


def test_a_pod_whose_pid_is_unknown_is_signalled_through_its_pod(monkeypatch):
    groups = []
    monkeypatch.setattr(os, "killpg", lambda pid, sig: groups.append((pid, sig)))
    proc = _Proc(pid=0)
    _stack(_service(proc, pod=True)).kill("s", signal.SIGKILL)
    assert proc.signals == [signal.SIGKILL] and groups == []


def test_a_process_is_signalled_by_its_group_and_pid_0_is_refused(monkeypatch):
    groups = []
    monkeypatch.setattr(os, "killpg", lambda pid, sig: groups.append((pid, sig)))
    _stack(_service(_Proc(pid=4242))).kill("s", signal.SIGTERM)
    assert groups == [(4242, signal.SIGTERM)]
    with pytest.raises(StackError, match="no process to signal"):
        _stack(_service(_Proc(pid=0))).kill("s", signal.SIGTERM)
    assert groups == [(4242, signal.SIGTERM)]
