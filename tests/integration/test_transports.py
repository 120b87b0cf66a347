"""HTTP and CoAP fleets (monsoon.transports) against the real reference platform and the Hono-style CoAP
adapter (stacks/bin/coap-adapter), on the ``inmemory-coap`` stack: Postgres + the platform (whose HTTP
port serves ThingsBoard's device API) + the adapter. Nothing is mocked.

Each fleet sends a short steady load; every acked message must be in Postgres (the stack's own loss
query), acked.csv must hold every device's sequence 0..n-1, the totals must add up, a device with an
invalid token must fail. Then the platform is SIGSTOPped for ~2 s under load: the open model counts the
stall (late sends, latency from the intended time >= the stall) instead of slowing down.
"""
from __future__ import annotations

import glob
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import psycopg
import pytest

from monsoon.observe.storage import stored_source
from monsoon.timeline.hdrlog import read_intervals
from monsoon.timeline.columnar import dataset_state, iter_dicts, parts_dir
from monsoon.stack.provision import Device
from monsoon.load.stats import FleetConnectError
from monsoon.stack.provision import TbRestProvisioner, device_names
from monsoon.load.shapes import Steady
from monsoon.paths import REPO
from monsoon.spec.stack import load_stack
from monsoon.stack.supervisor import Stack
from monsoon.stack.ports import StackError
from monsoon.stack.reaper import find_leftovers
from monsoon.load.coap import CoapFleet
from monsoon.load.http import HttpFleet
from monsoon.load.aio import RequestTotals
from monsoon.load.fleet import build_fleet

from tests.integration.helpers import wait_for

pytestmark = pytest.mark.integration

JAR = REPO / "stacks/reference-platform/target/reference-platform.jar"
ADAPTER = REPO / "stacks/bin/coap-adapter"
RATE, SECONDS, DEVICES = 200, 5, 19   # + one device with an invalid token = 20 devices, 50 messages each


def _missing() -> list[str]:
    out = []
    if shutil.which("java") is None:
        out.append("java (apt-get install -y openjdk-17-jdk-headless)")
    if not JAR.exists():
        out.append(f"{JAR} (make setup)")
    if not glob.glob("/usr/lib/postgresql/*/bin/postgres"):
        out.append("PostgreSQL server (apt-get install -y postgresql)")
    return out


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    missing = _missing()
    if missing:
        pytest.skip("needs " + "; ".join(missing))
    tmp = tmp_path_factory.mktemp("transports")
    spec = load_stack("inmemory-coap")
    st = Stack(spec, tmp / "run", run_id="transports-it", profile="nightly")   # 512m heap: no OOM here
    try:
        st.start()
    except StackError as e:
        logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((tmp / "run/logs").glob("*.log")))
        pytest.fail(f"{e}\n{logs}")
    try:
        yield st
    finally:
        st.stop()
        assert find_leftovers("transports-it") == []


def provision(stack: Stack, prefix: str, n: int) -> list[Device]:
    prov = stack.spec.provisioning
    with TbRestProvisioner(stack.endpoint(prov.url), prov.username, prov.password) as p:
        p.login()
        return p.ensure_devices(device_names(prefix, n))


def stored_count(stack: Stack, prefix: str) -> int:
    q = f"SELECT count(*) FROM ({stack.spec.storage.loss_query}) q WHERE q.device LIKE %s"
    with psycopg.connect(stack.endpoint(stack.spec.storage.dsn), connect_timeout=5) as c:
        return c.execute(q, (prefix + "-%",)).fetchone()[0]


def read_acked(path: Path) -> dict[str, list[int]]:
    by: dict[str, list[int]] = defaultdict(list)
    for row in iter_dicts(path):
        assert list(row) == ["device", "seq", "intended_ms", "acked_ms"]
        by[row["device"]].append(int(row["seq"]))
        assert int(row["acked_ms"]) >= int(row["intended_ms"]) - 5   # answered after it was due
    return by


def check_totals(t: RequestTotals, seconds: list) -> None:
    assert t.scheduled == t.sent + t.failed + t.dropped, t
    assert t.sent == t.acked + t.unacked, t
    assert t.failed == sum(t.failures.values()), t
    # per-second stats add up to the totals
    for k in ("scheduled", "sent", "acked", "failed", "late"):
        assert sum(getattr(s, k) for s in seconds) == getattr(t, k), k


def run_fleet(fleet, stop=None) -> tuple[RequestTotals, list]:
    seconds: list = []
    with fleet:
        fleet.connect()
        totals = fleet.run(stop or threading.Event(), seconds.append)
    return totals, seconds


@pytest.mark.parametrize("transport", ["http", "coap"])
def test_steady_load_is_acked_stored_and_accounted(stack, tmp_path, transport):
    prefix = f"tr-{transport}"
    devices = provision(stack, prefix, DEVICES)
    bad = Device(f"{prefix}-bad", "no-such-token-0000")
    port = stack.ports["http" if transport == "http" else "coap"]
    fleet = build_fleet(transport, devices + [bad], "127.0.0.1", port, shape=Steady(rate=RATE, duration=SECONDS),
                        acked_path=tmp_path / "acked.csv", latency_log_path=tmp_path / "latency.hlog")
    assert isinstance(fleet, HttpFleet if transport == "http" else CoapFleet)
    totals, seconds = run_fleet(fleet)
    print(transport, totals)

    n_all = len(devices) + 1
    per_dev = RATE * SECONDS // n_all
    assert totals.scheduled == RATE * SECONDS
    check_totals(totals, seconds)
    assert totals.dropped == 0 and totals.unacked == 0
    # the invalid token fails every one of its messages, with the platform's (or adapter's) 401
    want = "http 401" if transport == "http" else "coap 4.01"
    assert totals.failures == {want: totals.last_seq[bad.name] + 1}, totals.failures
    assert totals.failed == per_dev
    assert totals.acked == totals.scheduled - per_dev

    # acked.csv: every good device's sequence 0..n-1, each once; nothing from the bad device
    acked = read_acked(tmp_path / "acked.csv")
    assert bad.name not in acked
    assert set(acked) == {d.name for d in devices}
    for d in devices:
        assert sorted(acked[d.name]) == list(range(per_dev)), d.name
        assert totals.last_seq[d.name] == per_dev - 1
    assert sum(1 for _ in read_intervals(tmp_path / "latency.hlog")) >= SECONDS - 1
    assert totals.p99_ms is not None and totals.p50_ms > 0

    # every acked message is in Postgres (the stack's own loss query)
    wait_for(lambda: stored_count(stack, prefix) >= totals.acked, 60, f"{totals.acked} stored {transport} messages")
    stored_csv = tmp_path / "stored.csv"
    stored_source(stack.spec.storage, stack.endpoint).export(stored_csv)
    stored = {(r["device"], int(r["seq"])) for r in iter_dicts(stored_csv) if r["device"].startswith(prefix + "-")}
    missing = [(dev, s) for dev, seqs in acked.items() for s in seqs if (dev, s) not in stored]
    assert missing == [], f"{len(missing)} acked messages not stored, e.g. {missing[:5]}"


def test_a_stalled_platform_is_counted_late_not_slowed_down(stack, tmp_path):
    """SIGSTOP the platform ~2 s under load from both fleets at once: the schedule goes on, the held
    messages go out late after SIGCONT, and latency from the intended time covers the stall."""
    http_devs = provision(stack, "tr-stall-http", 10)
    coap_devs = provision(stack, "tr-stall-coap", 10)
    shape = Steady(rate=100, duration=6)
    fleets = {
        "http": HttpFleet(http_devs, "127.0.0.1", stack.ports["http"], shape=shape, max_inflight=4,
                          acked_path=tmp_path / "http" / "acked.csv", latency_log_path=tmp_path / "http" / "l.hlog"),
        "coap": CoapFleet(coap_devs, "127.0.0.1", stack.ports["coap"], shape=shape,
                          acked_path=tmp_path / "coap" / "acked.csv", latency_log_path=tmp_path / "coap" / "l.hlog"),
    }
    results: dict[str, tuple] = {}
    errors: list[BaseException] = []

    def go(name: str) -> None:
        try:
            results[name] = run_fleet(fleets[name])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=go, args=(n,)) for n in fleets]
    for t in threads:
        t.start()
    t_stop = time.monotonic()
    try:
        time.sleep(1.5)
        t_stop = time.monotonic()
        stack.kill("platform", signal.SIGSTOP)
        time.sleep(2.0)
    finally:
        stack.kill("platform", signal.SIGCONT)
        stall = time.monotonic() - t_stop
    for t in threads:
        t.join(120)
    assert not errors, errors
    for name, (totals, seconds) in results.items():
        print(name, f"stall={stall:.2f}s", totals)
        check_totals(totals, seconds)
        assert totals.scheduled == 600            # the schedule did not slow down
        assert totals.failed == 0                 # 2 s is far below the request timeout: all answered
        assert totals.acked == 600
        # measured from the intended send time: a message due at the stall's start waits it out
        assert totals.late > 0 or totals.p99_ms >= stall * 1000, (name, totals)
        assert totals.max_ms >= (stall - 0.1) * 1000, (name, totals)
        assert totals.late > 0, (name, totals)    # each device's in-flight window is smaller than the stall's backlog
        # ... and those late ones waited for a slot the stalled platform held: the stack's lateness, which a
        # calibration does not take for the generator's (criterion "held")
        held = sum(s.held for s in seconds)
        assert 0 < held <= totals.late, (name, held, totals)


# ---------------------------------------------------------------- without the platform


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nothing_listening_is_a_clear_connect_error(tmp_path):
    port = _free_port()
    shape = Steady(rate=10, duration=1)
    for cls, what in ((HttpFleet, "HTTP endpoint"), (CoapFleet, "CoAP endpoint")):
        f = cls([Device("d0", "t0")], "127.0.0.1", port, shape=shape, acked_path=tmp_path / "a.csv",
                connect_timeout_s=3)
        with pytest.raises(FleetConnectError, match=what) as ei:
            f.connect()
        assert str(port) in str(ei.value)
        f.close()


UPSTREAM = r'''
import sys
from aiohttp import web
async def telemetry(req):
    await req.read()
    return web.Response(status=401 if req.match_info["token"] == "bad" else 200)
app = web.Application()
app.router.add_post("/api/v1/{token}/{kind}", telemetry)
web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), access_log=None, print=lambda *a: print("up", flush=True))
'''


def _spawn(args: list[str], log: Path, ready: str) -> subprocess.Popen:
    fh = open(log, "w")  # noqa: SIM115 - closed with the process
    p = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    fh.close()
    wait_for(lambda: ready in log.read_text() or p.poll() is not None, 30, f"{args[1]} to start")
    assert p.poll() is None, log.read_text()
    return p


def _stop(p: subprocess.Popen) -> None:
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_coap_adapter_maps_the_platform_answers(tmp_path):
    """The adapter in front of a small real HTTP server: 2xx -> 2.04, 401 -> 4.01, upstream gone -> 5.03;
    a wrong path -> 4.04. Driven by CoapFleet, so the failures are also the fleet's accounting."""
    up_port, coap_port = _free_port(), _free_port()
    (tmp_path / "upstream.py").write_text(UPSTREAM)
    upstream = _spawn([sys.executable, str(tmp_path / "upstream.py"), str(up_port)], tmp_path / "up.log", "up")
    adapter = _spawn([sys.executable, str(ADAPTER), "--bind", f"127.0.0.1:{coap_port}",
                      "--upstream", f"http://127.0.0.1:{up_port}", "--stats-every", "0.5"],
                     tmp_path / "adapter.log", "coap-adapter listening on")
    try:
        devs = [Device("good", "good"), Device("bad", "bad")]
        shape = Steady(rate=20, duration=1)
        t, _ = run_fleet(CoapFleet(devs, "127.0.0.1", coap_port, shape=shape, acked_path=tmp_path / "a1.csv"))
        assert (t.acked, t.failures) == (10, {"coap 4.01": 10}), t
        _stop(upstream)
        t, _ = run_fleet(CoapFleet(devs, "127.0.0.1", coap_port, shape=shape, acked_path=tmp_path / "a2.csv"))
        assert (t.acked, t.failures) == (0, {"coap 5.03": 20}), t

        import asyncio

        import aiocoap

        async def get(path: str) -> str:
            ctx = await aiocoap.Context.create_client_context()
            try:
                msg = aiocoap.Message(code=aiocoap.POST, uri=f"coap://127.0.0.1:{coap_port}{path}", payload=b"{}")
                return (await ctx.request(msg).response).code.dotted
            finally:
                await ctx.shutdown()

        assert asyncio.run(get("/api/v1/good/nothing")) == "4.04"
        assert asyncio.run(get("/other")) == "4.04"
    finally:
        _stop(adapter)
        _stop(upstream)
    assert adapter.returncode == 0, (tmp_path / "adapter.log").read_text()
    assert "coap-adapter stopped" in (tmp_path / "adapter.log").read_text()


def test_close_from_another_thread_stops_a_run(tmp_path):
    """close() while run() is active: the run stops, counts what was due as dropped, and everything closes."""
    up_port = _free_port()
    (tmp_path / "upstream.py").write_text(UPSTREAM)
    upstream = _spawn([sys.executable, str(tmp_path / "upstream.py"), str(up_port)], tmp_path / "up.log", "up")
    try:
        fleet = HttpFleet([Device(f"d{i}", f"t{i}") for i in range(5)], "127.0.0.1", up_port,
                          shape=Steady(rate=50, duration=60), acked_path=tmp_path / "a.csv")
        fleet.connect()
        out: list = []
        th = threading.Thread(target=lambda: out.append(fleet.run(threading.Event())))
        th.start()
        wait_for(lambda: fleet._acked > 10, 30, "some acks")   # noqa: SLF001
        fleet.close()
        th.join(30)
        assert not th.is_alive()
        (t,) = out
        assert 0 < t.scheduled < 3000
        assert t.scheduled == t.sent + t.failed + t.dropped
        fleet.close()                                           # idempotent
    finally:
        _stop(upstream)
    acked = dataset_state(parts_dir(tmp_path / "a.csv"))       # the acks made it into closed parts
    assert acked.closed and acked.rows > 10, acked
