"""Loss accounting end to end: the platform is SIGKILLed mid-run on the real in-memory stack (Postgres,
reference platform; and the real ThingsBoard 4.2.1 when its jar is built, else that case skips). Every message the fleet saw acknowledged is either found in Postgres (read back here
with our own SQL, not monsoon's export) or counted lost by monsoon's accounting: monsoon's lost (device, seq)
set is exactly the acked keys our SQL does not find."""
from __future__ import annotations

import threading
import time

import psycopg
import pytest

from monsoon.timeline.accounting import account
from monsoon.observe.storage import stored_source
from monsoon.timeline.columnar import iter_dicts, write_rows
from monsoon.rundir import ACKED_FILE, STORED_FILE, TIMELINE_FILE
from monsoon.checks.base import RunData
from monsoon.checks.loss import no_acked_loss
from monsoon.load.fleet import build_fleet
from monsoon.stack.provision import TbRestProvisioner, device_names
from monsoon.load.shapes import Steady
from monsoon.spec.stack import load_stack
from monsoon.stack.ports import StackError
from monsoon.stack.supervisor import Stack
from monsoon.timeline.store import Timeline

from tests.integration.helpers import wait_for

pytestmark = pytest.mark.integration

RATE, SECONDS, KILL_AT = 3000.0, 14.0, 7.0   # above the in-memory platform's ~1,700 msg/s: a backlog is queued at the kill


@pytest.mark.parametrize("stack_name,engine,workers", [("inmemory", "python", 1), ("inmemory", "native", 2),
                                                       ("thingsboard-inmemory", "python", 1)])
def test_every_acked_message_is_stored_or_counted_lost_after_a_mid_run_kill(tmp_path, stack_name, engine, workers):
    spec = load_stack(stack_name)
    try:
        Stack(spec, tmp_path, run_id="killacct").preflight()
    except StackError as e:   # the real ThingsBoard's jar is not built here
        pytest.skip(" ".join(str(e).split()))
    events: list[tuple[str, dict]] = []
    with Stack(spec, tmp_path, run_id="killacct", on_event=lambda t, **f: events.append((t, f))) as stack:
        prov = spec.provisioning
        client = TbRestProvisioner(stack.endpoint(prov.url), prov.username, prov.password)
        client.login()
        devices = client.ensure_devices(device_names("kill-", 40))
        dev = spec.devices
        fleet = build_fleet("mqtt", devices, stack.endpoint(dev.host), int(stack.endpoint(dev.port)),
                            topic=dev.topic, qos=1, shape=Steady(RATE, SECONDS), acked_path=tmp_path / ACKED_FILE,
                            engine=engine, workers=workers)
        fleet.connect()
        pid0 = stack.pid("platform")
        killer = threading.Timer(KILL_AT, stack.kill, args=("platform",))
        killer.start()
        try:
            totals = fleet.run(threading.Event())
        finally:
            killer.cancel()
            fleet.close()
        write_rows(tmp_path / "sent.csv", ("device", "last_seq"), totals.last_seq.items())
        assert stack.pid("platform") not in (None, pid0), "the platform was not restarted after the kill"

        dsn = stack.endpoint(spec.storage.dsn)

        def stored_now():
            with psycopg.connect(dsn, connect_timeout=5) as c:
                return c.execute(spec.storage.count_query).fetchone()[0]
        last = [None]

        def settled():   # storage stopped moving: whatever survived the kill is written
            n = stored_now()
            done, last[0] = n == last[0], n
            return done
        wait_for(settled, 240, "storage to stop growing after the load", interval=3.0)

        # our own read of storage, independent of monsoon's export
        with psycopg.connect(dsn, connect_timeout=5) as c:
            stored = {(d, int(s)) for d, s in c.execute(
                "SELECT d.name, kv.long_v FROM ts_kv kv JOIN key_dictionary k ON k.key_id = kv.key "
                "JOIN device d ON d.id = kv.entity_id WHERE k.key = 'seq'")}
        stored_source(spec.storage, stack.endpoint).export(tmp_path / STORED_FILE)

    acked = {(r["device"], r["seq"]) for r in iter_dicts(tmp_path / ACKED_FILE)}
    lost = acked - stored                            # lost by our own SQL
    assert len(acked) == totals.acked > RATE * KILL_AT * 0.5, totals
    assert lost, "a SIGKILL with a queued backlog on the in-memory platform lost nothing: the test proves nothing"
    with Timeline(tmp_path / TIMELINE_FILE) as tl:   # what the runner records around the same files
        tl.add("meta", run_id="killacct", stack=spec.name, experiment="kill-accounting", base_rate=RATE)
        tl.add("op", op="load-end", scheduled=totals.scheduled, sent=totals.sent, acked=totals.acked)
    # monsoon's accounting (from acked.csv and its own stored.csv export) names exactly the same lost keys
    acc = account(tmp_path, keep_lost=True)
    monsoon_lost = set(acc.lost_keys)
    assert acc.acked == len(acked)
    assert len(acc.lost_keys) == len(monsoon_lost) == acc.acked_lost
    assert monsoon_lost == lost, (f"monsoon only: {sorted(monsoon_lost - lost)[:5]}, "
                                  f"SQL only: {sorted(lost - monsoon_lost)[:5]}")
    v = no_acked_loss(RunData(tmp_path))
    assert v.verdict == "fail" and v.figures["acked_lost"] == len(lost)
    assert f"{len(lost):,}" in v.message
    print(f"{stack_name} {engine}: acked={len(acked):,} stored={len(acked & stored):,} lost={len(lost):,} "
          f"scheduled={totals.scheduled:,} failed={totals.failed:,} lost_in_flight={totals.lost_in_flight:,}")
