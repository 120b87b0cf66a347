"""``Stack.kill`` signals a process's (or a pod's first process's) group, and refuses a pid of 0: a pod whose host
pid was not found reports 0, and ``os.killpg(0, ...)`` would signal monsoon's own process group."""
import os
import signal
from pathlib import Path

import pytest

from monsoon.stack.ports import StackError
from monsoon.stack.supervisor import Service, Stack


class _Proc:
    def __init__(self, pid: int):
        self.pid = pid

    def poll(self):
        return None


def _stack(svc: Service) -> Stack:
    st = object.__new__(Stack)        # only what kill() reads: no stack is started
    st.services = {svc.name: svc}
    return st


def _service(proc, **kind) -> Service:
    return Service("s", None, [], {}, Path("."), Path("s.log"), proc=proc, **kind)


@pytest.mark.parametrize("kind", [{}, {"pod": True}], ids=["process", "pod"])
def test_the_group_is_signalled_and_pid_0_is_refused(monkeypatch, kind):
    groups = []
    monkeypatch.setattr(os, "killpg", lambda pid, sig: groups.append((pid, sig)))
    _stack(_service(_Proc(pid=4242), **kind)).kill("s", signal.SIGTERM)
    assert groups == [(4242, signal.SIGTERM)]
    with pytest.raises(StackError, match="no process to signal"):
        _stack(_service(_Proc(pid=0), **kind)).kill("s", signal.SIGKILL)
    assert groups == [(4242, signal.SIGTERM)]
