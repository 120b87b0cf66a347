"""Deaths judged on evidence, on the real kafka stack: a ``kill -9`` of the broker from outside monsoon, under
load, is an unexpected death (``no_unexpected_exit`` names kafka and SIGKILL), not an OOM (``no_oom`` passes);
the supervisor brings the broker back (``restart: always``), the lag recovers, and the acked loss monsoon
counts equals our own set difference of acked.csv and the rows read back from Postgres."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from monsoon.rundir import ACKED_DATA, STORED_DATA, TIMELINE_FILE
from monsoon.session import MonsoonSession
from monsoon.timeline.columnar import iter_dicts
from monsoon.timeline.store import read_events

from tests.integration.helpers import wait_for

pytestmark = pytest.mark.integration

EXPERIMENT = """\
name: broker-kill-9
marks: [chaos]
load: {devices: 20, qos: 1, base_rate: 300, shape: {kind: steady}}
profiles:
  quick: {warmup: 25, recovery: 35, drain_timeout: 90}
checks:
  - no_oom
  - no_acked_loss
  - lag_recovers_within: {seconds: 60}
"""
KILL_AFTER_S = 20      # seconds of load before the outside kill


def test_an_outside_kill_9_of_the_broker_is_an_unexpected_death_not_an_oom(tmp_path):
    exp = tmp_path / "broker-kill-9.yaml"
    exp.write_text(EXPERIMENT)
    session = MonsoonSession(runs_dir=tmp_path / "runs", run_id="deaths", progress=lambda s: None)
    out = tmp_path / "runs" / "deaths" / "kafka--broker-kill-9"
    killed: dict = {}

    def kill_broker() -> None:      # as an unkind user would: from outside, by pid, with SIGKILL
        def loaded():
            if not (out / TIMELINE_FILE).exists():
                return None
            ev = read_events(out / TIMELINE_FILE)
            return ev if sum(e["type"] == "load" for e in ev) >= KILL_AFTER_S else None
        ev = wait_for(loaded, 240, f"{KILL_AFTER_S} s of load")
        pid = [e["pid"] for e in ev if e["type"] == "service" and e.get("service") == "kafka"
               and e.get("event") == "start"][-1]
        os.kill(pid, signal.SIGKILL)
        killed["pid"] = pid

    t = threading.Thread(target=kill_broker, daemon=True)
    t.start()
    result = session.run("kafka", str(exp))
    t.join(5)
    assert killed, "the broker was not killed"
    events = read_events(out / TIMELINE_FILE)
    exits = [e for e in events if e["type"] == "service" and e.get("event") == "exit" and e["service"] == "kafka"]
    restarts = [e for e in events if e["type"] == "service" and e.get("event") == "restart" and e["service"] == "kafka"]
    print("\n" + result.failure_message())
    assert [e["code"] for e in exits] == [137] and exits[0]["pid"] == killed["pid"] and not exits[0]["oom"]
    assert restarts, "the supervisor did not restart the broker"
    oom, unexpected = result.check("no_oom"), result.check("no_unexpected_exit")
    assert oom.verdict == "pass" and oom.figures["oom_events"] == 0, oom.message
    assert unexpected.verdict == "fail" and unexpected.figures["unexpected_exits"] == 1
    assert unexpected.message.startswith("kafka died of SIGKILL, not sent by monsoon, with no OOM evidence"), \
        unexpected.message
    assert result.check("lag_recovers_within").verdict == "pass", result.check("lag_recovers_within").message
    # acked loss: monsoon's figure is our own set difference of the acked log and the rows Postgres holds
    acked = {(r["device"], r["seq"]) for r in iter_dicts(out / ACKED_DATA)}
    stored = {(r["device"], r["seq"]) for r in iter_dicts(out / STORED_DATA)}
    loss = result.check("no_acked_loss")
    assert loss.figures["acked"] == len(acked) > 0
    assert loss.figures["acked_lost"] == len(acked - stored), loss.message
