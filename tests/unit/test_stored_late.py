"""Late is not lost: storage is read at the drain's end and again after the platform stopped; a message found
only in the last read is "stored late", never lost; the stored set only grows. The platform stops first
(Stack.stop_service), its storage last."""
import csv
import sys
import time

from monsoon.checks.base import FAIL, PASS, UNKNOWN, RunData
from monsoon.checks.loss import no_acked_loss
from monsoon.observe.storage import storage_services
from monsoon.report.checklist import HEADLINE, KEY_FIGURES
from monsoon.spec.stack import load_stack
from monsoon.stack.supervisor import Stack
from monsoon.checks.accounting import account
from tests.unit.helpers import RunBuilder


def at_drain(b: RunBuilder, pairs) -> RunBuilder:
    with open(b.dir / "stored-at-drain.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["device", "seq"])
        w.writerows(pairs)
    return b


def tb_like(tmp_path, drained=True) -> RunBuilder:
    """The shape of real ThingsBoard's in-memory x10: 10,000 acked; the drain's read-back had 3,000 of them,
    ThingsBoard wrote 1,000 more during its graceful stop (read back after it stopped), 6,000 are gone."""
    b = RunBuilder(tmp_path).service_start()
    b.ev("drain", 100.0, drained=drained, waited_s=4.0, backlog=0 if drained else 5000, signal="queue depth")
    b.acked([("d0", s) for s in range(10000)])
    at_drain(b, [("d0", s) for s in range(3000)])
    b.stored([("d0", s) for s in range(4000)])
    return b


def test_rows_found_only_after_the_platform_stopped_are_stored_late_not_lost(tmp_path):
    run = RunData(tb_like(tmp_path).write())
    acc = account(run.dir)
    assert (acc.acked, acc.acked_lost, acc.stored, acc.stored_late, acc.stored_vanished) == (10000, 6000, 4000, 1000, 0)
    v = no_acked_loss(run)
    assert v.verdict == FAIL and v.figures["acked_lost"] == 6000 and v.figures["stored_late"] == 1000
    assert "6,000 of 10,000 acked messages lost" in v.message and "1,000 stored late" in v.message
    assert "stored_vanished" not in v.figures


def test_all_stored_by_the_stop_passes_and_says_how_many_came_late(tmp_path):
    b = RunBuilder(tmp_path).service_start()
    b.ev("drain", 100.0, drained=True, waited_s=4.0, backlog=0, signal="queue depth")
    b.acked([("d0", s) for s in range(500)])
    at_drain(b, [("d0", s) for s in range(480)])
    b.stored([("d0", s) for s in range(500)])
    v = no_acked_loss(RunData(b.write()))
    assert v.verdict == PASS and v.figures["acked_lost"] == 0 and v.figures["stored_late"] == 20, v.message
    assert "20 stored late" in v.message


def test_the_stored_set_only_grows(tmp_path):
    # a key read back at the drain's end and gone from the last read stays stored, and is named
    b = tb_like(tmp_path)
    at_drain(b, [("d0", s) for s in range(3000)] + [("d0", 9999)])
    acc = account(b.write())
    assert acc.acked_lost == 5999 and acc.stored_vanished == 1 and acc.stored_late == 1000
    assert "1 read back at the drain's end were gone" in no_acked_loss(RunData(b.dir)).message


def test_an_undrained_run_stays_unknown_and_names_the_late_rows(tmp_path):
    v = no_acked_loss(RunData(tb_like(tmp_path, drained=False).write()))
    assert v.verdict == UNKNOWN and "cannot tell lost from late" in v.message and "1,000 stored late" in v.message


def test_a_run_with_one_read_back_has_no_late_figure(tmp_path):
    b = tb_like(tmp_path)
    (b.dir / "stored-at-drain.csv").unlink()
    v = no_acked_loss(RunData(b.write()))
    assert v.figures["acked_lost"] == 6000 and "stored_late" not in v.figures and "late" not in v.message


def test_stored_late_is_a_key_figure_of_the_checklist_and_the_summary():
    assert "stored_late" in KEY_FIGURES["no_acked_loss"] and "stored_late" in HEADLINE


def test_storage_stops_last_with_what_it_depends_on():
    got = {n: storage_services(load_stack(n)) for n in ("inmemory", "kafka", "kafka-cassandra", "thingsboard-inmemory")}
    assert got == {"inmemory": {"postgres"}, "kafka": {"postgres"}, "kafka-cassandra": {"postgres", "cassandra"},
                   "thingsboard-inmemory": {"postgres"}}


STACK = """\
name: s
services:
  store:
    command: ["{py}", "-c", "import time; time.sleep(60)"]
  front:
    command: ["{py}", "-c", "import time; time.sleep(60)"]
    depends_on: [store]
    restart: always
    restart_delay: 0.1
devices: {{port: "1"}}
provisioning: {{kind: none}}
storage: {{dsn: "postgresql://x", loss_query: "select 1"}}
"""


def test_one_service_stops_for_good_and_the_rest_later(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(STACK.format(py=sys.executable))
    events = []
    with Stack(load_stack(p), tmp_path / "run", run_id="stop-one", on_event=lambda t, **f: events.append(f)) as st:
        front = st.services["front"].proc
        st.stop_service("front")
        assert front.poll() is not None and st.pid("store") is not None
        time.sleep(0.5)                      # past its restart_delay: a supervisor would have restarted it
        assert st.pid("front") is None and st.services["front"].starts == 1
    stops = [(e["service"], e["code"]) for e in events if e.get("event") == "stop"]
    assert stops == [("front", 143), ("store", 143)]        # each once, the front first; SIGTERM's exit code
    assert not [e for e in events if e.get("event") in ("exit", "restart")]
