"""The busy neighbour of make story-budgets and make defects --neighbour: it burns a core while the block runs
and is gone after it, also when the block raises."""
import time
from pathlib import Path

import pytest

from monsoon.selftest.neighbour import busy_neighbour, cpu_seconds


def test_the_neighbour_burns_cpu_during_the_block_and_is_reaped_after_it():
    entry: dict = {}
    with busy_neighbour(entry) as pid:
        assert entry["neighbour_pid"] == pid
        time.sleep(0.6)
        assert cpu_seconds(pid) > 0.05          # it runs (at least a share of a core on a busy machine)
    assert not Path(f"/proc/{pid}").exists()
    assert 0.05 < entry["neighbour_cores"] <= 1.2


def test_a_failing_block_still_stops_the_neighbour():
    entry: dict = {}
    with pytest.raises(KeyboardInterrupt):
        with busy_neighbour(entry):
            raise KeyboardInterrupt
    assert not Path(f"/proc/{entry['neighbour_pid']}").exists()


def test_cpu_seconds_of_a_gone_process_is_none():
    assert cpu_seconds(2 ** 22 + 7) is None
