"""The stack runtime on real processes: readiness, logs, restarts, exit causes, teardown on every path."""
import os
import socket
import sys
import textwrap
import time

import pytest

from monsoon.spec.stack import load_stack
from monsoon.stack.supervisor import Stack
from monsoon.stack.ports import StackError
from monsoon.stack.reaper import find_leftovers
from monsoon.stack.ports import port_open

PY = sys.executable
LISTEN = ("import socket,sys,time,subprocess;"
          "child=subprocess.Popen(['sleep','300']);"  # a grandchild: teardown must reach it too
          "s=socket.socket();s.bind(('127.0.0.1',int(sys.argv[1])));s.listen();"
          "print('listening on',sys.argv[1],flush=True);time.sleep(300)")
# serves, then (first life only) dies the way a JVM with -XX:+ExitOnOutOfMemoryError does
OOM_THEN_SERVE = ("import os,sys,socket,time;"
                  "m=os.path.join(sys.argv[2],'died');"
                  "first=not os.path.exists(m);open(m,'a').close();"
                  "s=socket.socket();s.bind(('127.0.0.1',int(sys.argv[1])));s.listen();"
                  "time.sleep(1 if first else 300);"
                  "print('Terminating due to java.lang.OutOfMemoryError: Java heap space',flush=True);"
                  "sys.exit(3)")


def stack_file(tmp_path, services: str, name="t", ports=()):
    """A stack of ``services``; ``ports``: {port:NAME}s only their own service uses (declared, as load_stack wants)."""
    p = tmp_path / f"{name}.yaml"
    declared = "".join(f"ports: {{{', '.join(f'{n}: auto' for n in ports)}}}\n" for _ in [0] if ports)
    p.write_text(f"name: {name}\nservices:\n{textwrap.indent(textwrap.dedent(services), '  ')}"
                 "devices: {port: '1'}\nprovisioning: {kind: none}\n"
                 "storage: {dsn: 'postgresql://x', loss_query: 'select 1'}\n" + declared)
    return load_stack(p)


def listen_service(name, extra=""):
    return f"""\
{name}:
  command: ["{PY}", "-c", "{LISTEN}", "{{port:{name}}}"]
  ready: {{tcp: "127.0.0.1:{{port:{name}}}", timeout: 10}}
{extra}"""


def test_start_ready_logs_and_full_teardown(tmp_path):
    spec = stack_file(tmp_path, listen_service("a") + listen_service("b", "  depends_on: [a]\n"))
    events = []
    with Stack(spec, tmp_path / "run", run_id="rt-1", on_event=lambda t, **f: events.append((t, f))) as st:
        assert port_open("127.0.0.1", st.ports["a"]) and port_open("127.0.0.1", st.ports["b"])
        assert st.ports["a"] != st.ports["b"]
        assert len(find_leftovers("rt-1")) == 4  # two services, each with a child
        started = [f["service"] for t, f in events if t == "service" and f["event"] == "ready"]
        assert started == ["a", "b"]
    assert find_leftovers("rt-1") == []
    assert not port_open("127.0.0.1", st.ports["a"])
    assert "listening on" in (tmp_path / "run/logs/a.log").read_text()
    assert [f["service"] for t, f in events if t == "service" and f["event"] == "stop"] == ["b", "a"]


def test_restart_always_records_the_oom_exit_and_comes_back(tmp_path):
    spec = stack_file(tmp_path, f"""\
app:
  command: ["{PY}", "-c", "{OOM_THEN_SERVE}", "{{port:app}}", "{{dir}}"]
  ready: {{tcp: "127.0.0.1:{{port:app}}", timeout: 10}}
  restart: always
  restart_delay: 0.2
""")
    events = []
    with Stack(spec, tmp_path / "run", run_id="rt-2", on_event=lambda t, **f: events.append((t, f))) as st:
        deadline = time.time() + 10
        while time.time() < deadline and st.services["app"].starts < 2:
            time.sleep(0.1)
        while time.time() < deadline and not port_open("127.0.0.1", st.ports["app"]):
            time.sleep(0.1)
        assert st.services["app"].starts == 2 and port_open("127.0.0.1", st.ports["app"])
    exits = [f for t, f in events if t == "service" and f["event"] == "exit"]
    assert len(exits) == 1
    assert exits[0]["code"] == 3 and exits[0]["oom"] is True and "OutOfMemoryError" in exits[0]["cause"]
    assert any(f["event"] == "restart" for t, f in events if t == "service")
    assert find_leftovers("rt-2") == []


def test_a_half_started_stack_is_undone_and_the_error_names_the_service(tmp_path):
    spec = stack_file(tmp_path, listen_service("a") + f"""\
broken:
  command: ["{PY}", "-c", "import sys; print('cannot open config file'); sys.exit(7)"]
  depends_on: [a]
  ready: {{tcp: "127.0.0.1:{{port:broken}}", timeout: 10}}
""", ports=("broken",))
    with pytest.raises(StackError) as ei:
        Stack(spec, tmp_path / "run", run_id="rt-3").start()
    msg = str(ei.value)
    assert "'broken' exited with code 7" in msg and "cannot open config file" in msg
    assert find_leftovers("rt-3") == []


def test_readiness_timeout_is_reported_with_what_it_waited_for(tmp_path):
    spec = stack_file(tmp_path, f"""\
slow:
  command: ["sleep", "60"]
  ready: {{tcp: "127.0.0.1:{{port:slow}}", timeout: 1}}
""", ports=("slow",))
    with pytest.raises(StackError, match=r"'slow' not ready after 1s \(waiting for 127.0.0.1:\d+\)"):
        Stack(spec, tmp_path / "run", run_id="rt-4").start()
    assert find_leftovers("rt-4") == []


def test_a_fixed_port_in_use_is_named(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        p = tmp_path / "fixed.yaml"
        spec = stack_file(tmp_path, listen_service("mqtt"))
        spec = spec.model_copy(update={"ports": {"mqtt": port}})
        with pytest.raises(StackError, match=f"port {port} \\(mqtt\\) on 127.0.0.1 is already in use"):
            Stack(spec, tmp_path / "run", run_id="rt-5").start()
    finally:
        s.close()


def test_missing_binary_says_what_to_install(tmp_path):
    spec = stack_file(tmp_path, """\
jvm:
  command: ["definitely-not-java-xyz"]
  requires:
    - {binary: definitely-not-java-xyz, hint: "install OpenJDK 17: apt-get install -y openjdk-17-jdk-headless"}
""")
    with pytest.raises(StackError, match="needs `definitely-not-java-xyz` on PATH: install OpenJDK 17"):
        Stack(spec, tmp_path / "run", run_id="rt-6").start()
    assert not (tmp_path / "run" / "logs").exists()  # nothing was started or written


def test_kill_capability_and_exit_cause_of_sigkill(tmp_path):
    spec = stack_file(tmp_path, listen_service("a", "  restart: always\n  restart_delay: 0.1\n"))
    events = []
    with Stack(spec, tmp_path / "run", run_id="rt-7", on_event=lambda t, **f: events.append((t, f))) as st:
        pid = st.pid("a")
        st.kill("a")
        deadline = time.time() + 10
        while time.time() < deadline and (st.pid("a") in (None, pid) or not port_open("127.0.0.1", st.ports["a"])):
            time.sleep(0.1)
        assert st.pid("a") not in (None, pid)
    exits = [f for t, f in events if t == "service" and f["event"] == "exit"]
    assert exits[0]["code"] == 137 and exits[0]["oom"] is False
    assert exits[0]["cause"] == "killed by monsoon with SIGKILL (exit 137)", exits[0]
    assert find_leftovers("rt-7") == []


# binds the port of service a (taken: a real EADDRINUSE) while the marker file is missing, then its own port
STEAL = ("import os,socket,sys,time;m=sys.argv[3];first=not os.path.exists(m);open(m,'a').close();"
         "s=socket.socket();s.bind(('127.0.0.1',int(sys.argv[1] if first else sys.argv[2])));s.listen();"
         "print('listening',flush=True);time.sleep(300)")


def stealer(marker, always=False):
    return f"""\
b:
  command: ["{PY}", "-c", "{STEAL.replace("first=not", "first=True or not") if always else STEAL}", \
"{{port:a}}", "{{port:b}}", "{marker}"]
  ready: {{tcp: "127.0.0.1:{{port:b}}", timeout: 10}}
  depends_on: [a]
"""


def test_a_port_taken_at_start_up_restarts_the_stack_on_new_ports(tmp_path):
    spec = stack_file(tmp_path, listen_service("a") + stealer(tmp_path / "marker"))
    events = []
    with Stack(spec, tmp_path / "run", run_id="rt-port", on_event=lambda t, **f: events.append((t, f))) as st:
        assert port_open("127.0.0.1", st.ports["b"])
        ops = [f for t, f in events if t == "op"]
        starts = [f for f in ops if f["op"] == "stack-start"]
        assert [f["attempt"] for f in starts] == [1, 2] and starts[-1]["ports"] == st.ports
        retry = next(f for f in ops if f["op"] == "stack-retry")
        assert "'b' exited with code 1 during start-up" in retry["reason"] and "address was in use" in retry["reason"]
        assert len(find_leftovers("rt-port")) == 3   # a (and its child) and b of the second attempt only
    assert "Address already in use" in (tmp_path / "run" / "logs" / "b.log").read_text()
    assert find_leftovers("rt-port") == []


def test_a_port_that_stays_taken_fails_after_three_attempts_and_other_deaths_at_once(tmp_path):
    spec = stack_file(tmp_path, listen_service("a") + stealer(tmp_path / "marker", always=True))
    events = []
    with pytest.raises(StackError, match=r"'b' exited with code 1 during start-up .*\(its address was in use\)"):
        Stack(spec, tmp_path / "run", run_id="rt-port3", on_event=lambda t, **f: events.append((t, f))).start()
    assert sum(f["op"] == "stack-start" for t, f in events if t == "op") == 3
    assert find_leftovers("rt-port3") == []
    # a start-up death for another reason is not retried
    spec = stack_file(tmp_path, listen_service("a") + f"""\
b:
  command: ["{PY}", "-c", "import sys; sys.exit(4)"]
  ready: {{tcp: "127.0.0.1:{{port:b}}", timeout: 10}}
""", name="other", ports=("b",))
    events.clear()
    with pytest.raises(StackError, match=r"'b' exited with code 4 during start-up after [0-9.]+s; last log"):
        Stack(spec, tmp_path / "run2", run_id="rt-port4", on_event=lambda t, **f: events.append((t, f))).start()
    assert sum(f["op"] == "stack-start" for t, f in events if t == "op") == 1
