"""``monsoon heal`` after a run was killed with -9: real processes and a real Toxiproxy, no handles.

A paused service (SIGSTOP) left behind is thawed, then killed (or kept with
``--keep-processes``); toxics and disabled proxies named with the run's prefix
on a Toxiproxy that the run started (found by its label) are removed / re-enabled.

Every call names its run with ``--run-id``: ``--all`` would sweep every run of this
machine (it skips live ones, but a run killed by someone else is not this test's to
heal).  ``--all``'s choice of runs is unit-tested on a fake machine (tests/unit/test_heal_all.py).
"""
from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from monsoon.faults.process import proc_state
from monsoon.faults.toxiproxy import proxy_name, toxic_name
from monsoon.paths import REPO
from monsoon.stack.reaper import find_leftovers
from tests.integration.helpers import wait_for

pytestmark = pytest.mark.integration

TOXIPROXY = Path(os.environ.get("MONSOON_CACHE", REPO / ".cache")) / "bin" / "toxiproxy-server"


def new_run_id(what: str) -> str:
    return f"heal-{what}-{os.getpid()}-{secrets.token_hex(3)}"


def heal(*args: str, state: Path) -> subprocess.CompletedProcess:
    """``python -m monsoon.cli heal ...``; cgroup records are looked up under ``state`` only, so the sweep
    cannot restore limits of another run on this machine."""
    env = {**os.environ, "MONSOON_CACHE": str(state)}
    env.pop("MONSOON_RUN_ID", None)
    return subprocess.run([sys.executable, "-m", "monsoon.cli", "heal", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)



def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(10)


def paused_sleeper(run_id: str) -> subprocess.Popen:
    """A run's service, paused by a process-pause fault that nobody healed: state T, labelled with the run id."""
    proc = subprocess.Popen(["sleep", "300"], env={**os.environ, "MONSOON_RUN_ID": run_id},
                            start_new_session=True)
    try:
        wait_for(lambda: proc.pid in find_leftovers(run_id), 10, "the sleeper to exec")
        os.kill(proc.pid, signal.SIGSTOP)
        wait_for(lambda: proc_state(proc.pid) in ("T", "t"), 10, "the sleeper to stop")
    except BaseException:
        kill_group(proc)
        raise
    return proc


# ------------------------------------------------------------- paused processes

def test_heal_run_id_thaws_then_kills_a_paused_process(tmp_path):
    run_id = new_run_id("pause")
    proc = paused_sleeper(run_id)
    try:
        r = heal("--run-id", run_id, state=tmp_path)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert f"healed {run_id} process: pid {proc.pid} continued (SIGCONT)" in r.stdout, out
        assert f"healed {run_id}: killed 1 leftover process(es)" in r.stdout, out
        assert "STILL IN PLACE" not in r.stdout
        assert proc.wait(10) == -signal.SIGKILL
        assert find_leftovers(run_id) == []
    finally:
        kill_group(proc)


def test_heal_keep_processes_thaws_and_leaves_the_process_running(tmp_path):
    run_id = new_run_id("keep")
    proc = paused_sleeper(run_id)
    try:
        r = heal("--run-id", run_id, "--keep-processes", state=tmp_path)
        out = r.stdout + r.stderr
        assert r.returncode == 0, out
        assert f"healed {run_id} process: pid {proc.pid} continued (SIGCONT)" in r.stdout, out
        assert "killed" not in r.stdout
        assert proc.poll() is None
        assert proc_state(proc.pid) not in ("T", "t", "Z", None)
        assert find_leftovers(run_id) == [proc.pid]
        # healed already: a second sweep finds nothing
        again = heal("--run-id", run_id, "--keep-processes", state=tmp_path)
        assert again.returncode == 0 and "nothing to heal" in again.stdout, again.stdout + again.stderr
    finally:
        kill_group(proc)
    assert proc.returncode == -signal.SIGKILL   # it was alive until our own cleanup


def test_heal_needs_all_or_a_run_id(tmp_path):
    r = heal(state=tmp_path)
    assert r.returncode == 2 and "one of the arguments --all --run-id is required" in r.stderr


# ------------------------------------------------------------------- Toxiproxy

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def run_toxiproxy(tmp_path):
    """A Toxiproxy server as a run starts it: labelled with MONSOON_RUN_ID, own session, 127.0.0.1."""
    if not os.access(TOXIPROXY, os.X_OK):
        pytest.skip(f"{TOXIPROXY} not installed: run make setup")
    run_id = new_run_id("tox")
    port = free_port()
    log = open(tmp_path / "toxiproxy.log", "wb")
    proc = subprocess.Popen([str(TOXIPROXY), "-host", "127.0.0.1", "-port", str(port)], stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ, "MONSOON_RUN_ID": run_id},
                            start_new_session=True)
    api = f"http://127.0.0.1:{port}"

    def up() -> bool:
        assert proc.poll() is None, (tmp_path / "toxiproxy.log").read_text()
        try:
            return requests.get(api + "/version", timeout=0.5).ok
        except requests.RequestException:
            return False
    try:
        wait_for(up, 10, "toxiproxy-server")
        yield run_id, api, proc
    finally:
        kill_group(proc)
        log.close()


def test_heal_removes_the_toxics_of_a_run_on_its_own_toxiproxy(tmp_path, run_toxiproxy):
    run_id, api, proc = run_toxiproxy
    pg, kafka = proxy_name(run_id, ("platform", "postgres")), proxy_name(run_id, ("platform", "kafka"))
    toxic = toxic_name(run_id, "pg-latency", 0, "downstream")
    upstream = f"127.0.0.1:{free_port()}"
    for name in (pg, kafka):
        r = requests.post(api + "/proxies", json={"name": name, "listen": "127.0.0.1:0", "upstream": upstream,
                                                  "enabled": True}, timeout=5)
        assert r.status_code == 201, r.text
    r = requests.post(f"{api}/proxies/{pg}/toxics", json={"name": toxic, "type": "latency", "stream": "downstream",
                                                         "toxicity": 1.0, "attributes": {"latency": 500}}, timeout=5)
    assert r.status_code == 200, r.text
    # a dependency-down fault left the other hop cut
    assert requests.post(f"{api}/proxies/{kafka}", json={"enabled": False}, timeout=5).ok
    # someone else's toxic on the same server is not the run's to remove
    foreign = "latency-by-hand"
    assert requests.post(f"{api}/proxies/{pg}/toxics", json={"name": foreign, "type": "latency",
                                                            "attributes": {"latency": 1}}, timeout=5).ok

    r = heal("--run-id", run_id, "--keep-processes", state=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert f"healed {run_id} toxiproxy: toxic {pg}/{toxic}" in r.stdout, out
    assert f"healed {run_id} toxiproxy: proxy {kafka} re-enabled" in r.stdout, out
    assert f"STILL IN PLACE {run_id}" not in r.stdout
    proxies = requests.get(api + "/proxies", timeout=5).json()
    assert [t["name"] for t in proxies[pg]["toxics"]] == [foreign]
    assert proxies[kafka]["enabled"] is True
    assert proc.poll() is None                      # --keep-processes: the run's Toxiproxy still runs

    # without --keep-processes the run's proxies go and its Toxiproxy is reaped
    r = heal("--run-id", run_id, state=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert f"healed {run_id} toxiproxy: proxy {pg} deleted" in r.stdout, out
    assert f"healed {run_id}: killed 1 leftover process(es)" in r.stdout, out
    assert proc.wait(10) == -signal.SIGKILL
    assert find_leftovers(run_id) == []


# ------------------------------------------------------------- a shared Toxiproxy that refuses a deletion

@pytest.fixture
def refusing_toxiproxy(tmp_path):
    """A shared Toxiproxy (no run label: not reaped by anyone) behind a gateway on 127.0.0.1 that forwards every
    call to it but answers 403 to ``DELETE /proxies/...`` while ``gate["refuse"]``: (gateway API, real API, gate)."""
    import http.server
    import threading
    if not os.access(TOXIPROXY, os.X_OK):
        pytest.skip(f"{TOXIPROXY} not installed: run make setup")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "MONSOON_RUN_ID"}
    log = open(tmp_path / "toxiproxy.log", "wb")
    proc = subprocess.Popen([str(TOXIPROXY), "-host", "127.0.0.1", "-port", str(port)], stdout=log,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True)
    real = f"http://127.0.0.1:{port}"
    gate = {"refuse": True}

    class Gateway(http.server.BaseHTTPRequestHandler):
        def _forward(self):
            if self.command == "DELETE" and self.path.startswith("/proxies/") and gate["refuse"]:
                body, status = b'{"error": "deleting proxies is not allowed on this shared server"}', 403
            else:
                n = int(self.headers.get("Content-Length") or 0)
                r = requests.request(self.command, real + self.path, data=self.rfile.read(n) if n else None,
                                     headers={"Content-Type": "application/json"}, timeout=5)
                body, status = r.content, r.status_code
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        do_GET = do_POST = do_DELETE = _forward

        def log_message(self, *a):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Gateway)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def up() -> bool:
        assert proc.poll() is None, (tmp_path / "toxiproxy.log").read_text()
        try:
            return requests.get(real + "/version", timeout=0.5).ok
        except requests.RequestException:
            return False
    try:
        wait_for(up, 10, "toxiproxy-server")
        yield f"http://127.0.0.1:{server.server_address[1]}", real, gate
    finally:
        server.shutdown()
        server.server_close()
        kill_group(proc)
        log.close()


def test_heal_reports_a_proxy_a_shared_toxiproxy_refused_to_delete_and_exits_1(tmp_path, refusing_toxiproxy):
    api, real, gate = refusing_toxiproxy
    run_id = new_run_id("shared")
    pg = proxy_name(run_id, ("platform", "postgres"))
    r = requests.post(real + "/proxies", json={"name": pg, "listen": "127.0.0.1:0",
                                               "upstream": f"127.0.0.1:{free_port()}", "enabled": True}, timeout=5)
    assert r.status_code == 201, r.text

    r = heal("--run-id", run_id, "--toxiproxy-api", api, state=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert f"heal {run_id} toxiproxy: deleting the run's proxies on {api} FAILED: " in r.stdout, out
    assert f"STILL IN PLACE {run_id} toxiproxy: proxy {pg} on {api} not deleted" in r.stdout, out
    assert pg in requests.get(real + "/proxies", timeout=5).json()      # it really is still there

    gate["refuse"] = False                           # the server lets it go: heal again, and the census is clean
    r = heal("--run-id", run_id, "--toxiproxy-api", api, state=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert f"healed {run_id} toxiproxy: proxy {pg} deleted" in r.stdout, out
    assert f"STILL IN PLACE {run_id}" not in r.stdout, out
    assert pg not in requests.get(real + "/proxies", timeout=5).json()
