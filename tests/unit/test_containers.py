"""Container stacks without a daemon: the spec (provider, image, mem_limit), compose files read as stacks (and
their refusals, one line naming file, line and key), a container's exit cause, the docker sample keyed by service."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from monsoon.observe.collectors import by_service
from monsoon.spec.stack import load_stack
from monsoon.spec.yamlio import SpecError
from monsoon.stack.containers import mem_bytes
from monsoon.stack.supervisor import container_exit

STACK = """\
name: s
{extra}
devices: {{port: 1883}}
provisioning: none
storage: {{dsn: "postgresql://127.0.0.1:5432/x", loss_query: "select 1, 2"}}
"""


def _stack(tmp_path: Path, extra: str, compose: str | None = None):
    if compose is not None:
        (tmp_path / "docker-compose.yml").write_text(textwrap.dedent(compose))
    p = tmp_path / "stack.yaml"
    p.write_text(STACK.format(extra=textwrap.dedent(extra).strip()))
    return load_stack(p)


def test_shipped_container_stacks_mirror_the_process_ones():
    for name, base in (("inmemory-docker", "inmemory"), ("kafka-docker", "kafka")):
        d, p = load_stack(name), load_stack(base)
        assert d.containers() == list(d.services) and p.containers() == []
        assert list(d.services) == list(p.services) and d.storage == p.storage and d.devices == p.devices
        assert all(s.image.startswith("monsoon/") for s in d.services.values())
    assert mem_bytes(load_stack("inmemory-docker").services["platform"].mem_limit_for("quick")) < mem_bytes("512m")


def test_the_inmemory_container_heap_outgrows_its_limit_pre_touched():
    """The x10 story on containers: the heap may grow past the container's limit (the kernel's OOM kill comes
    before Java's OutOfMemoryError), and each heap expansion is touched at once (without it the container
    thrashes at its limit instead of being killed)."""
    platform = load_stack("inmemory-docker").services["platform"]
    for profile in ("quick", "nightly", "full"):
        assert mem_bytes(platform.env["TB_HEAP"][profile]) > mem_bytes(platform.mem_limit_for(profile)), profile
    assert "-XX:+AlwaysPreTouch" in platform.env["JAVA_OPTS"]


@pytest.mark.parametrize("extra, err", [
    ("services: {a: {provider: docker, command: x}}", "a docker service needs image"),
    ("services: {a: {image: busybox}}", "a process service needs command"),
    ("services: {a: {command: x, mem_limit: 64m}}", "mem_limit only apply to provider: docker"),
    ("provider: docker\nservices: {a: {image: x, mem_limit: lots}}", "memory size 'lots'"),
])
def test_bad_container_services_are_refused(tmp_path, extra, err):
    with pytest.raises(SpecError, match=err):
        _stack(tmp_path, extra)


COMPOSE = """\
version: "3.8"
services:
  db:
    image: monsoon/postgres
    command: ["/opt/monsoon/stacks/bin/run-postgres", "/tmp/x", "5432"]
    restart: no
    environment: ["A=1", "B=two=2"]
    deploy:
      resources:
        limits: {memory: 256M, cpus: "0.5"}
    stop_grace_period: 1m30s
  app:
    image: monsoon/platform
    depends_on: {db: {condition: service_healthy}}
    mem_limit: 300m
    restart: unless-stopped
    volumes: ["./conf:/etc/app:ro"]
"""


def test_a_compose_file_is_read_as_a_container_stack(tmp_path):
    spec = _stack(tmp_path, "compose: docker-compose.yml\nservices: {app: {ready: {tcp: '127.0.0.1:8080'}}}",
                  COMPOSE)
    db, app = spec.services["db"], spec.services["app"]
    assert spec.provider == "docker" and spec.containers() == ["db", "app"]
    assert db.image == "monsoon/postgres" and db.restart == "no" and db.env == {"A": "1", "B": "two=2"}
    assert db.mem_limit == "256m" and db.cpus == 0.5 and db.stop_timeout == 90
    assert app.depends_on == ("db",) and app.restart == "always" and app.mem_limit == "300m"
    assert app.volumes == (f"{tmp_path / 'conf'}:/etc/app:ro",)
    assert app.ready.tcp == "127.0.0.1:8080"            # the stack's own keys merged over the compose file's
    assert spec.start_order() == ["db", "app"]


@pytest.mark.parametrize("edit, line, key", [
    (("    restart: unless-stopped\n", "    restart: unless-stopped\n    ports: ['8080:8080']\n"), 17,
     "services.app.ports"),
    (("        limits: {memory: 256M", "        reservations: {memory: 1M}\n        limits: {memory: 256M"), 10,
     "services.db.deploy.resources.reservations"),
    (('version: "3.8"\n', 'version: "3.8"\nnetworks: {x: {}}\n'), 2, "networks"),
    (("    mem_limit: 300m\n", "    mem_limit: 300m\n    healthcheck: {test: true}\n"), 16, "services.app.healthcheck"),
])
def test_unsupported_compose_keys_are_refused_by_name(tmp_path, edit, line, key):
    with pytest.raises(SpecError) as e:
        _stack(tmp_path, "compose: docker-compose.yml", COMPOSE.replace(*edit))
    assert str(e.value).startswith(f"{tmp_path / 'docker-compose.yml'}:{line}: {key}: compose key")
    assert "\n" not in str(e.value)


class _Proc:
    name = "monsoon-r-platform"

    def __init__(self, oom: bool):
        self.oom_killed = oom


def test_a_container_exit_says_oom_only_on_dockers_word():
    oom = container_exit(_Proc(True), 137, None, "SIGKILL (exit 137): killed, possibly by the kernel OOM killer", False)
    assert oom["oom"] is True and oom["signal"] == "SIGKILL" and "OOMKilled" in oom["cause"]
    kill = container_exit(_Proc(False), 137, 9, "killed by monsoon with SIGKILL (exit 137)", False)
    assert "oom" not in kill and "cause" not in kill and kill["signal"] == "SIGKILL"
    other = container_exit(_Proc(False), 137, None, "SIGKILL (exit 137): killed, possibly ...", False)
    assert "not by the OOM killer" in other["cause"]


def test_the_kernels_oom_line_counts_when_docker_missed_the_kill():
    """cgroup v2: Docker can report the exit before containerd's OOM event, State.OOMKilled false."""
    line = "Memory cgroup out of memory: Killed process 4242 (python3) total-vm:321000kB"
    ev = container_exit(_Proc(False), 137, None, "SIGKILL (exit 137): OOM-killed", True, line)
    assert ev["oom"] is True and "OOMKilled" in ev["cause"] and ev["kernel_log"] == line
    assert "oom" not in container_exit(_Proc(False), 143, None, "SIGTERM (exit 143)", False, None)


def test_docker_samples_are_keyed_by_service_with_the_exits_the_supervisor_saw():
    sample = {"containers": {"monsoon-r-platform": {
        "id": "abc", "state": "running", "restarts": 0, "oom_killed": 0, "exit_code": 0, "pid": 5,
        "terminations": [{"finished_at": "T1", "exit_code": 0, "oom_killed": 0, "reason": None}]}},
        "restarts": 0, "oom_killed": 0, "missing": ["monsoon-r-kafka"]}
    hist = {"platform": {"restarts": 1, "terminations": [
        {"finished_at": "T1", "exit_code": 137, "oom_killed": 1, "reason": "OOMKilled"}]}}
    out = by_service(sample, {"monsoon-r-platform": "platform", "monsoon-r-kafka": "kafka"}, hist)
    c = out["containers"]["platform"]
    assert c["terminations"] == hist["platform"]["terminations"]    # docker start reset OOMKilled: history wins
    assert c["oom_killed"] == 1 and c["restarts"] == 1 and out["oom_killed"] == 1 and out["missing"] == ["kafka"]


def test_memory_sizes():
    assert mem_bytes("64m") == 64 << 20 and mem_bytes("1g") == 1 << 30 and mem_bytes("512") == 512
