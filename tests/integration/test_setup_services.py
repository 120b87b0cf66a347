"""`monsoon setup debs` leaves running services alone (issue 39): a running Mosquitto and a running system
PostgreSQL cluster survive it, even when it installs (the install path, driven with a stand-in apt-get), and each
piece asks apt-get for its own packages only (Mosquitto without Chromium).

The services are the test's own, on loopback and free ports: a Mosquitto process, and a cluster of Debian's
postgresql-common (what "a system Postgres" is on Debian) whose configuration lives under a private
``PG_CLUSTER_CONF_ROOT``, so the machine's own clusters are neither listed nor touched. The test stops only what
it started. It needs root (the cluster runs as the postgres user), pg_createcluster and mosquitto.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]
MOSQUITTO = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if os.access("/usr/sbin/mosquitto", os.X_OK) else None)
PG_VERSIONS = sorted((p.parent.parent.name for p in Path("/usr/lib/postgresql").glob("*/bin/postgres")), key=int)

needs = pytest.mark.skipif(
    os.geteuid() != 0 or MOSQUITTO is None or not PG_VERSIONS or shutil.which("pg_createcluster") is None,
    reason="needs root, mosquitto and postgresql-common's pg_createcluster (monsoon setup debs installs them)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mqtt_connack(port: int) -> bytes:
    """An MQTT 3.1.1 CONNECT on loopback; the broker's CONNACK (b'\\x20\\x02\\x00\\x00' when it accepts)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(bytes([0x10, 16, 0, 4]) + b"MQTT" + bytes([4, 2, 0, 30, 0, 4]) + b"t-39")
        return s.recv(4)


@needs
def test_a_running_mosquitto_and_a_system_postgres_survive_monsoon_setup_debs(tmp_path):
    work = Path(tempfile.mkdtemp(prefix="monsoon-setup-", dir="/tmp"))   # the postgres user must reach it
    work.chmod(0o755)
    conf_root, data, sock = work / "etc", work / "data", work / "sock"
    for d in (conf_root, data, sock):
        d.mkdir()
    shutil.chown(data, "postgres", "postgres")
    shutil.chown(sock, "postgres", "postgres")
    pg_env = {**os.environ, "PG_CLUSTER_CONF_ROOT": str(conf_root)}
    version, cluster, pg_port, mq_port = PG_VERSIONS[-1], "monsoon-t39", free_port(), free_port()
    own_clusters = subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True).stdout   # the machine's
    conf = tmp_path / "mosquitto.conf"
    conf.write_text(f"listener {mq_port} 127.0.0.1\nallow_anonymous true\npersistence false\n")
    broker = subprocess.Popen([MOSQUITTO, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    created = False
    try:
        subprocess.run(["pg_createcluster", version, cluster, "-d", str(data / "pg"), "-s", str(sock),
                        "-l", str(work / "pg.log"), "-p", str(pg_port), "--", "--auth=trust"],
                       env=pg_env, check=True, capture_output=True, timeout=120)
        created = True
        subprocess.run(["pg_ctlcluster", version, cluster, "start", "--", "-o", "-c listen_addresses=127.0.0.1"],
                       env=pg_env, check=True, capture_output=True, timeout=120)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if mqtt_connack(mq_port) == b"\x20\x02\x00\x00":
                    break
            except OSError:
                time.sleep(0.1)
        assert mqtt_connack(mq_port) == b"\x20\x02\x00\x00"

        # the install path, with apt-get standing in: it records what it is asked for and installs nothing
        bin_ = tmp_path / "bin"
        bin_.mkdir()
        asked = tmp_path / "apt-get.log"
        (bin_ / "apt-get").write_text(f"#!/bin/sh\necho \"$*\" >> {asked}\n")
        (bin_ / "apt-get").chmod(0o755)
        env = {**pg_env, "PATH": f"{bin_}:{os.environ['PATH']}", "MONSOON_CACHE": str(tmp_path / "cache"),
               "MONSOON_DEBS_ASSUME_MISSING": "postgres mosquitto chromium"}

        def setup(*pieces: str) -> str:
            r = subprocess.run([sys.executable, "-m", "monsoon.cli", "setup", *pieces], cwd=REPO, env=env,
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0, r.stdout + r.stderr
            return r.stdout + r.stderr

        t0 = time.monotonic()
        out = setup("debs")
        took = time.monotonic() - t0
        installs = [ln for ln in asked.read_text().splitlines() if " install " in f" {ln} "]
        assert len(installs) == 1 and installs[0].endswith("postgresql mosquitto chromium fonts-dejavu-core"), installs
        # both still there, and said once each: left running
        assert broker.poll() is None, "monsoon setup debs killed the test's Mosquitto"
        assert mqtt_connack(mq_port) == b"\x20\x02\x00\x00"
        listed = subprocess.run(["pg_lsclusters", "-h"], env=pg_env, capture_output=True, text=True).stdout.split()
        assert listed[:4] == [version, cluster, str(pg_port), "online"], listed
        ping = subprocess.run(["runuser", "-u", "postgres", "--", f"/usr/lib/postgresql/{version}/bin/psql", "-h",
                               str(sock), "-p", str(pg_port), "-Atc", "select 1"], capture_output=True, text=True,
                              timeout=30)
        assert ping.stdout.strip() == "1", ping.stderr
        said = [ln for ln in out.splitlines() if "left running" in ln]
        assert any(f"cluster {version}/{cluster} is running on port {pg_port}" in ln for ln in said), out
        assert any("Mosquitto is running" in ln and str(broker.pid) in ln for ln in said), out
        assert len([ln for ln in said if "PostgreSQL" in ln and cluster in ln]) == 1, out
        assert "stopped" not in out, out

        asked.unlink()   # each piece asks for its own packages only: Mosquitto without Chromium
        setup("mosquitto")
        assert [ln for ln in asked.read_text().splitlines() if " install " in f" {ln} "][0].endswith(
            "--no-install-recommends mosquitto")
        assert broker.poll() is None
        print(f"\nmonsoon setup debs (install path, stand-in apt-get): {took:.2f} s; Mosquitto pid {broker.pid} and "
              f"cluster {version}/{cluster} (port {pg_port}) still up")
    finally:
        broker.terminate()   # only what this test started
        broker.wait(timeout=10)
        if created:
            subprocess.run(["pg_dropcluster", "--stop", version, cluster], env=pg_env, capture_output=True, timeout=120)
        shutil.rmtree(work, ignore_errors=True)
    assert subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True).stdout == own_clusters
