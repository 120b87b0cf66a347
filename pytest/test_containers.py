"""The burst and pod-kill stories on container stacks (provider: docker).

Run:  pytest -m docker pytest/                   all three
      pytest -m burst pytest/ -k docker          the two x10 floods on containers
      pytest -m chaos pytest/ -k docker          the pod kill on the Kafka containers
The daemon is DOCKER_HOST's, or monsoon's private one (`monsoon dockerd start`); when none runs, the session
starts the private one and stops it at the end (`make images` builds the images once).

* in-memory x10 on containers: the platform container's heap may grow past its mem_limit, so the flood ends
  in a memory death and acked messages lost: either the kernel's OOM kill (exit 137, State.OOMKilled,
  docker_oom_killed >= 1) or, when the kernel keeps reclaiming file pages instead, a container alive at its
  limit that acks nothing (memory_limit_stalls >= 1); both fail no_oom;
* Kafka x10 on containers: lag, drained, nothing lost;
* pod-kill on kafka-docker (docker kill, then the supervisor's restart): nothing lost.
"""
import pytest

pytestmark = pytest.mark.usefixtures("docker_daemon")


@pytest.mark.docker
@pytest.mark.burst
def test_inmemory_x10_on_containers_dies_of_memory(monsoon):
    result = monsoon.run("inmemory-docker", "burst-x10")
    if result.dry_run is not None:
        pytest.skip("dry run")
    oom = result.check("no_oom")
    died = oom.figures.get("docker_oom_killed", 0) + oom.figures.get("memory_limit_stalls", 0)
    assert oom.verdict == "fail" and died >= 1, result.failure_message()
    assert result.check("no_acked_loss").figures["acked_lost"] > 0, result.failure_message()


@pytest.mark.docker
@pytest.mark.burst
def test_kafka_x10_on_containers_loses_nothing(monsoon):
    monsoon.run("kafka-docker", "burst-x10").assert_pass()


@pytest.mark.docker
@pytest.mark.chaos
def test_kafka_containers_survive_pod_kill(monsoon):
    monsoon.run("kafka-docker", "pod-kill").assert_pass()
