"""The kernel's own word on an OOM kill: its log line naming the process (``/dev/kmsg``), where readable.

The kernel OOM killer logs ``oom-kill:...,task=java,pid=1234,...`` and ``Killed process 1234 (java) ...``
(``Memory cgroup out of memory: Killed process ...`` inside a memory cgroup). A service that died of
SIGKILL with such a line naming its pid was killed for memory; one without was killed by something else.
"""
from __future__ import annotations

import errno
import os
import re

KMSG = "/dev/kmsg"
MAX_RECORDS = 20000        # the kernel's ring buffer holds far fewer; a bound against a stream that never ends


def _records(path: str, since: float | None) -> list[str]:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    out: list[str] = []
    try:
        while len(out) < MAX_RECORDS:
            try:
                rec = os.read(fd, 8192)
            except OSError as e:
                if e.errno == errno.EAGAIN:        # read everything the buffer holds
                    break
                if e.errno == errno.EPIPE:         # overwritten while reading: go on from the next one
                    continue
                raise
            if not rec:
                break
            head, _, msg = rec.decode(errors="replace").partition(";")
            fields = head.split(",")
            if since is not None and len(fields) > 2 and fields[2].isdigit() and int(fields[2]) / 1e6 < since - 5:
                continue                            # logged before the process started (its pid was another's)
            out.append(msg.strip())
    finally:
        os.close(fd)
    return out


def oom_kill_line(pid: int, since: float | None = None, path: str = KMSG) -> tuple[str | None, str | None]:
    """``(line, None)``: the kernel's OOM-kill line naming ``pid``; ``(None, None)``: the log was read and
    has none; ``(None, reason)``: the log could not be read (no permission, no /dev/kmsg). ``since``: the
    process's start, in ``time.monotonic()`` seconds (the kernel log's clock): older lines are skipped."""
    try:
        records = _records(path, since)
    except OSError as e:
        return None, f"kernel log unreadable ({path}: {e.strerror or e})"
    pat = re.compile(rf"(?:Killed process {pid}\b|oom-kill:.*\bpid={pid}\b)")
    hit = next((r for r in reversed(records) if pat.search(r)), None)
    return (hit[:300] if hit else None), None
