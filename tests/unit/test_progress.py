"""Live load progress: a rich panel on a terminal, plain rate-limited lines elsewhere, same numbers."""
from __future__ import annotations

import io

from monsoon.load.stats import SecondStats
from monsoon.observe.progress import LoadProgress, progress_fields


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class Tty(io.StringIO):
    def isatty(self):
        return True


def second(t, sent=1200, late=3, p99=42.0):
    return SecondStats(t=t, target_rate=1500.0, scheduled=1500, sent=sent, acked=1100, failed=7, late=late,
                       connected=48, p50_ms=5.0, p99_ms=p99, max_ms=80.0)


SAMPLES = {("kafka", "lag"): 12345.0, ("metrics", "heap_used"): 300 * 2**20, ("metrics", "heap_max"): 512 * 2**20}


def sample(c, f):
    return SAMPLES.get((c, f))


def test_fields_carry_target_achieved_acks_errors_late_p99_connected_and_the_stack():
    f = progress_fields(12, "burst", second(12), sample, restarts=1)
    assert f["target/s"] == "1,500" and f["sent/s"] == "1,200" and f["acked/s"] == "1,100"
    assert f["errors"] == "7" and f["late"] == "3" and f["p99"] == "42ms" and f["connected"] == "48"
    assert f["lag"] == "12,345" and f["heap"] == "300/512MB" and f["queue"] is None and f["restarts"] == "1"


def test_without_a_terminal_one_line_every_period_and_the_last_second_at_the_end():
    lines, clock = [], Clock()
    with LoadProgress("s/e", lines.append, live=io.StringIO(), every=5, clock=clock) as view:
        for t in range(12):
            clock.t = t
            view.update(progress_fields(t, "steady", second(t, sent=1000 + t), sample, 0))
    assert len(lines) == 3 + 1          # t=0, 5, 10, then the final second
    assert lines[0].startswith("[s/e] 0s steady target/s=1,500 sent/s=1,000")
    assert "sent/s=1,011" in lines[-1] and "queue" not in lines[-1]


def test_on_a_terminal_a_live_table_is_drawn_instead_of_lines():
    lines, tty = [], Tty()
    with LoadProgress("inmemory/burst-x10", lines.append, live=tty, every=5) as view:
        view.update(progress_fields(3, "burst", second(3, sent=4321), sample, 0))
        view._live.refresh()
    out = tty.getvalue()
    assert "4,321" in out and "sent/s" in out and "connected" in out
    assert len(lines) == 1 and "sent/s=4,321" in lines[0]   # only the final line goes to the log
