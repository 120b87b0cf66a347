"""A private dockerd killed with -9 (a session cut off mid-run) leaves its data root bind-mounted onto itself and
its netns mounted under the exec root; the next ``start``/``stop``/``monsoon reap`` unmounts them all, so the
directory can be removed. Found on a clone whose CI was cut off: ``rm -rf`` said "Device or resource busy"."""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from pathlib import Path

import pytest

from monsoon.stack import dockerd

pytestmark = pytest.mark.integration


@pytest.mark.skipif(shutil.which("dockerd") is None and not os.path.exists("/usr/sbin/dockerd"),
                    reason="dockerd not installed: `make setup` installs Docker")
@pytest.mark.skipif(os.geteuid() != 0, reason="a private dockerd needs root")
def test_a_killed_private_dockerd_leaves_no_mount_behind():
    d = Path(tempfile.mkdtemp(prefix="mdk-", dir="/tmp"))     # pytest's tmp_path is too deep for containerd's socket
    host, started = dockerd.start(d)
    assert started and host == f"unix://{dockerd.sock_path(d)}"
    pid = dockerd.running(d)
    assert pid is not None
    try:
        left = dockerd._mounts_under(d)
        assert str((d / "root").resolve()) in left, left       # dockerd's own bind mount of its data root
        os.killpg(os.getpgid(pid), signal.SIGKILL)               # dockerd and its containerd, as a cut session
        deadline = time.monotonic() + 10
        while dockerd.running(d) is not None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert dockerd._mounts_under(d), "the kill left nothing mounted: this test no longer tests anything"
    finally:
        assert dockerd.stop(d, timeout=5) in (True, False)
    assert dockerd._mounts_under(d) == []
    shutil.rmtree(d)                                             # EBUSY before the fix
    assert not d.exists()


def test_a_too_deep_dockerd_dir_is_one_line_before_anything_starts(tmp_path):
    d = tmp_path / ("x" * 80) / "dockerd"
    with pytest.raises(dockerd.DockerdError, match="too deep for a private dockerd.*MONSOON_DOCKERD_DIR"):
        dockerd.start(d)
    assert not d.exists()
