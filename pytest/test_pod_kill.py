"""Pod kill under steady load, on both queues.

Run:  pytest -m chaos pytest/test_pod_kill.py   (quick profile: ~2 min per stack)

The platform's process group gets SIGKILL mid-run; the stack's supervisor
restarts it, the devices reconnect and the load goes on. Expected:

* Kafka queue: every acked message is in Kafka before its PUBACK, so nothing
  acked is lost and the consumer lag recovers; the scenario passes.
* In-memory queue: messages acked but still queued die with the heap. The
  scenario checks that the kill landed and that monsoon counted the loss
  (acked_lost > 0), and reports the number.
"""
import pytest


@pytest.mark.chaos
def test_kafka_queue_survives_pod_kill(monsoon):
    result = monsoon.run("kafka", "pod-kill")
    result.assert_pass()


@pytest.mark.chaos
def test_inmemory_queue_loses_in_flight_messages_on_pod_kill(monsoon, record_property):
    result = monsoon.run("inmemory", "pod-kill")
    if result.dry_run is not None:
        pytest.skip("dry run")
    landed = result.check("faults_landed")
    assert landed.verdict == "pass", result.failure_message()
    loss = result.check("no_acked_loss")
    lost = loss.figures.get("acked_lost", 0)
    record_property("acked_lost", lost)
    assert loss.verdict == "fail" and lost > 0, (
        "expected the pod kill to lose the in-memory queue's acked messages, but monsoon counted none:\n"
        + result.failure_message())
    print(f"\nin-memory pod kill: {lost:,} of {loss.figures['acked']:,} acked messages lost "
          f"({loss.figures.get('acked_lost_pct', 0):.3f}%) - expected for an in-memory queue")
