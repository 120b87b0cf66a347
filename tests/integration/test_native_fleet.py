"""NativeFleet / monsoon-loadgen on real parts: Mosquitto (started as in test_fleet_mosquitto)
and the loadgen's own ack-only sink. The binary is built with cargo on first use (skips
only if cargo is missing and no binary is there). No mocks, no timing assertions beyond
"the stall shows in the latency"."""
from __future__ import annotations

import csv
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from tests.integration.test_fleet_mosquitto import MOSQUITTO, Broker, free_port, make_devices, read_acked

from monsoon.timeline.hdrlog import read_intervals
from monsoon.load.schedule import Schedule
from monsoon.load.stats import SecondStats
from monsoon.load.native import LoadgenBuildError, NativeFleet, ensure_loadgen, loadgen_config, shard_range
from monsoon.load.payloads import Payload
from monsoon.load.shapes import Stage, Stages, Steady

pytestmark = pytest.mark.skipif(MOSQUITTO is None, reason="mosquitto binary not found (apt-get install -y mosquitto)")
TOPIC = "v1/devices/me/telemetry"


@pytest.fixture(scope="module")
def loadgen() -> Path:
    try:
        return ensure_loadgen()
    except LoadgenBuildError as e:
        pytest.skip(str(e))


@pytest.fixture
def broker(tmp_path: Path):
    b = Broker(tmp_path, free_port())
    try:
        b.start()
        yield b
    finally:
        b.stop()


@pytest.fixture
def sink(loadgen: Path):
    port = free_port()
    p = subprocess.Popen([str(loadgen), "sink", "--port", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert '"listening"' in p.stdout.readline()
        yield port
    finally:
        p.terminate()
        p.wait(5)
        p.stdout.close()


def per_device_seqs(rows: list[dict]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for r in rows:
        out[r["device"]].append(r["seq"])
    return out


def assert_seconds_sum_to_totals(secs: list[SecondStats], totals) -> None:
    for k in ("scheduled", "sent", "acked", "failed", "late"):
        assert sum(getattr(s, k) for s in secs) == getattr(totals, k), k
    assert [s.t for s in secs] == list(range(len(secs)))
    assert totals.scheduled == totals.sent + totals.failed + totals.dropped
    assert totals.sent == totals.acked + totals.unacked


def test_every_message_sent_acked_and_recorded_over_two_workers(broker: Broker, tmp_path: Path) -> None:
    devices = make_devices(10)
    secs: list[SecondStats] = []
    acked_path = tmp_path / "acked.csv"
    hlog = tmp_path / "latency.hlog"
    with NativeFleet(devices, "127.0.0.1", broker.port, shape=Steady(rate=500, duration=2),
                     acked_path=acked_path, latency_log_path=hlog, workers=2,
                     payload=Payload("smart-meter")) as fleet:
        fleet.connect()
        assert fleet.connected == 10
        totals = fleet.run(threading.Event(), secs.append)
    assert totals.scheduled == totals.sent == totals.acked == 1000
    assert totals.failed == totals.dropped == totals.unacked == totals.lost_in_flight == 0
    assert_seconds_sum_to_totals(secs, totals)
    assert all(s.connected == 10 for s in secs)
    rows = read_acked(acked_path)
    assert len(rows) == 1000
    seqs = per_device_seqs(rows)
    assert sorted(seqs) == [d.name for d in devices]
    for name, got in seqs.items():
        assert sorted(got) == list(range(100)), name          # exactly 0..n-1, no gap, no duplicate
        assert totals.last_seq[name] == 99
    # ts strictly increasing per device, acked after intended
    by_dev: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_dev[r["device"]].append(r)
    for rs in by_dev.values():
        rs.sort(key=lambda r: r["seq"])
        assert all(a["intended_ms"] < b["intended_ms"] for a, b in zip(rs, rs[1:]))
        assert all(r["acked_ms"] >= r["intended_ms"] for r in rs)
    # the latency log holds every ack
    from hdrh.histogram import HdrHistogram
    total = sum(HdrHistogram.decode(p).get_total_count() for _, _, p in read_intervals(hlog))
    assert total == 1000
    assert totals.p99_ms is not None and totals.max_ms >= totals.p99_ms >= totals.p50_ms > 0


def test_acks_taken_from_the_shards_in_small_slices_are_all_recorded_once(broker: Broker, tmp_path: Path,
                                                                          monkeypatch) -> None:
    """The shards become parts in slices of at most SLICE_BYTES (a fast run's 30 s of acks are never one
    transient of hundreds of MB): with slices of ~2 KB, every one of 2,000 acks is in the dataset exactly once,
    in more parts than flushes."""
    import monsoon.load.native as native_mod
    from monsoon.timeline.columnar import dataset_state, parts_dir
    monkeypatch.setattr(native_mod, "SLICE_BYTES", 2048)
    devices = make_devices(10)
    acked_path = tmp_path / "acked.csv"
    with NativeFleet(devices, "127.0.0.1", broker.port, shape=Steady(rate=1000, duration=2),
                     acked_path=acked_path, workers=2, payload=Payload("smart-meter")) as fleet:
        fleet.connect()
        totals = fleet.run(threading.Event(), lambda s: None)
    assert totals.acked == 2000
    rows = read_acked(acked_path)
    assert len(rows) == 2000
    for name, got in per_device_seqs(rows).items():
        assert sorted(got) == list(range(200)), name
    assert dataset_state(parts_dir(acked_path)).parts > 10
    assert not list(tmp_path.glob(".acked.csv.shard*"))       # the shards are gone at the end


def test_payloads_are_byte_identical_to_python(broker: Broker, tmp_path: Path) -> None:
    """What the native core publishes is what Payload.renderer would have built."""
    payload = Payload("template", template='{"d":"{device}","s":{seq},"t":{ts},"m":{sent_ms},'
                                           '"x":{rand_int:0:1000},"y":{rand_float:0:1.5},"p":"5%"}')
    devices = make_devices(3)
    got: list[bytes] = []
    sub = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="checker", protocol=mqtt.MQTTv311)
    ready = threading.Event()
    sub.on_message = lambda c, u, m: got.append(m.payload)
    sub.on_subscribe = lambda *a: ready.set()
    sub.connect("127.0.0.1", broker.port)
    sub.subscribe(TOPIC, qos=0)
    sub.loop_start()
    try:
        assert ready.wait(5)
        with NativeFleet(devices, "127.0.0.1", broker.port, shape=Steady(rate=60, duration=1),
                         acked_path=tmp_path / "acked.csv", payload=payload) as fleet:
            totals = fleet.run(threading.Event())
        deadline = time.monotonic() + 5
        while len(got) < totals.acked and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        sub.loop_stop()
        sub.disconnect()
    assert totals.acked == 60 and len(got) == 60
    idx = {d.name: i for i, d in enumerate(devices)}
    for raw in got:
        doc = json.loads(raw)
        want = payload.render(idx[doc["d"]], doc["d"], doc["s"], doc["t"], doc["m"])
        assert raw == want


def test_shards_are_disjoint_cover_all_and_match_python_schedule(loadgen: Path, tmp_path: Path) -> None:
    shape = Stages([Stage("a", duration=1.3, rate=37.5), Stage("pause", duration=0.7, rate=0.0),
                    Stage("b", duration=1.0, rate=101.0)])
    devices = make_devices(7)
    cfg = loadgen_config(devices, "127.0.0.1", 1, shape=shape)
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    want = list(Schedule(shape))

    def shard(spec: str, env: dict | None = None) -> list[tuple[int, int, float]]:
        out = subprocess.run([str(loadgen), "schedule", "--config", str(path), "--shard", spec],
                             capture_output=True, text=True, check=True, env=env).stdout
        return [(int(k), int(d), float(t)) for k, d, t in (ln.split() for ln in out.splitlines())]

    n = 3
    parts = [shard(f"{i}/{n}") for i in range(n)]
    seen: dict[int, float] = {}
    for i, part in enumerate(parts):
        lo, hi = shard_range(len(devices), i, n)
        assert part and all(lo <= d < hi and d == k % len(devices) for k, d, _ in part)
        for k, _, t in part:
            assert k not in seen        # disjoint
            seen[k] = t
    assert sorted(seen) == list(range(len(want)))      # cover every message
    assert [seen[k] for k in range(len(want))] == want  # bit-identical intended times
    # a Kubernetes Indexed Job pod: the index comes from JOB_COMPLETION_INDEX
    env = dict(os.environ, JOB_COMPLETION_INDEX="1")
    assert shard(f"auto/{n}", env) == parts[1]
    bad = subprocess.run([str(loadgen), "schedule", "--config", str(path), "--shard", "auto/3"],
                         capture_output=True, text=True, env={k: v for k, v in os.environ.items()
                                                              if k != "JOB_COMPLETION_INDEX"})
    assert bad.returncode == 2 and "JOB_COMPLETION_INDEX" in bad.stderr


def test_stalled_broker_shows_late_and_latency_from_intended_time(broker: Broker, tmp_path: Path) -> None:
    """SIGSTOP the broker for 2 s under ~4 MB/s of 20 KB payloads: the socket buffers fill,
    messages leave late, and their latency (from the *intended* time) covers the stall."""
    secs: list[SecondStats] = []
    stall = 2.0
    marks: dict[str, float] = {}

    def on_second(s: SecondStats) -> None:
        secs.append(s)
        if s.t == 0:
            def freeze() -> None:
                broker.signal(signal.SIGSTOP)
                marks["stop"] = time.monotonic()
                time.sleep(stall)
                broker.signal(signal.SIGCONT)
                marks["cont"] = time.monotonic()
            threading.Thread(target=freeze, daemon=True).start()

    with NativeFleet(make_devices(2), "127.0.0.1", broker.port, shape=Steady(rate=200, duration=4),
                     acked_path=tmp_path / "acked.csv", payload=Payload("industrial-plc", datapoints=999),
                     drain_timeout_s=10) as fleet:
        fleet.connect()
        totals = fleet.run(threading.Event(), on_second)
    assert "cont" in marks
    assert totals.scheduled == totals.sent == 800          # open model: the stall never slowed the schedule
    assert totals.acked == 800
    assert totals.late > 0
    assert fleet.extra["send_late_max_ms"] > 50          # the late tolerance
    assert totals.max_ms >= (marks["cont"] - marks["stop"]) * 1000 * 0.9
    assert_seconds_sum_to_totals(secs, totals)


def test_stop_counts_dropped_and_worker_stops_cleanly(sink: int, tmp_path: Path, monkeypatch) -> None:
    """Also: the workers' CSV shards become Parquet parts during the run (a part every FLUSH_S, here 0.5 s),
    the bytes taken are punched out of the shards, and the run ends with a closed dataset and no shard."""
    from monsoon.load import native
    from monsoon.timeline.columnar import dataset_state, parts_dir
    monkeypatch.setattr(native, "FLUSH_S", 0.5)
    stop = threading.Event()
    secs: list[SecondStats] = []
    on_disk: list[tuple[int, int]] = []

    def on_second(s: SecondStats) -> None:
        secs.append(s)
        if s.t == 2:
            on_disk.extend((p.stat().st_size, p.stat().st_blocks * 512) for p in tmp_path.glob(".acked.csv.shard*"))
        if s.t == 3:
            stop.set()

    with NativeFleet(make_devices(4), "127.0.0.1", sink, shape=Steady(rate=1000, duration=20),
                     acked_path=tmp_path / "acked.csv", workers=2) as fleet:
        fleet.connect()
        pids = fleet.pids
        totals = fleet.run(stop, on_second)
    assert totals.scheduled < 20_000
    assert totals.scheduled == totals.sent + totals.failed + totals.dropped
    assert totals.acked == totals.sent and totals.unacked == 0
    assert_seconds_sum_to_totals(secs, totals)
    assert len(read_acked(tmp_path / "acked.csv")) == totals.acked
    state = dataset_state(parts_dir(tmp_path / "acked.csv"))
    assert state.closed and state.rows == totals.acked and state.parts >= 3, state
    assert len(on_disk) == 2 and all(held < size for size, held in on_disk), on_disk   # released mid-run
    assert not list(tmp_path.glob(".acked.csv.shard*")) and not (tmp_path / "acked.csv").exists()
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


KILLED_PARENT = """
import sys, threading
from pathlib import Path
from monsoon.load import native
from monsoon.load.native import NativeFleet
from monsoon.load.shapes import Steady
from tests.integration.test_fleet_mosquitto import make_devices
native.FLUSH_S = 0.5
with NativeFleet(make_devices(4), "127.0.0.1", int(sys.argv[2]), shape=Steady(rate=1000, duration=60),
                 acked_path=Path(sys.argv[1]), workers=2) as fleet:
    fleet.connect()
    print("pids", *fleet.pids, flush=True)
    fleet.run(threading.Event(), lambda s: print("second", s.t, flush=True))
"""


def test_a_parent_killed_with_minus_9_leaves_its_last_acks_to_salvage_once_and_only_once(sink: int, tmp_path: Path,
                                                                                         loadgen: Path) -> None:
    """monsoon (the workers' parent) killed with -9 between two parts: the workers see stdin close, stop and exit;
    the acks they wrote since the last part are in their shards, and analyze's salvage makes them one more part,
    from where the last part's footer left each shard: nothing twice, no gap."""
    from monsoon.analysis import salvaged
    from monsoon.timeline.columnar import dataset_state, parts_dir, salvage_shards
    acked = tmp_path / "acked.csv"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_PARENT, str(acked), str(sink)], cwd=Path(__file__).parents[2],
                            stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in proc.stdout.readline().split()[1:]]
        for line in proc.stdout:
            if line.split() == ["second", "3"]:
                break
        time.sleep(0.25)                                        # between two 0.5 s parts
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.stdout.close()
    for pid in pids:                                            # stdin closed: they stop by themselves
        deadline = time.monotonic() + 20
        while Path(f"/proc/{pid}").exists() and "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            assert time.monotonic() < deadline, f"worker {pid} still runs 20 s after its parent died"
            time.sleep(0.1)
    before = dataset_state(parts_dir(acked))
    assert not before.closed and before.parts >= 4 and before.rows > 0, before
    notes = salvaged(tmp_path)                                 # what `monsoon analyze` does first, and says
    m = re.fullmatch(r"acked.parquet: ([\d,]+) acked rows recovered from the native fleet's shards .*", notes[0])
    assert len(notes) == 1 and m, notes
    recovered = int(m.group(1).replace(",", ""))
    assert recovered > 0
    assert not list(tmp_path.glob(".acked.csv.shard*")) and salvage_shards(acked) == 0
    rows = read_acked(acked)
    assert len(rows) == before.rows + recovered
    keys = [(r["device"], r["seq"]) for r in rows]
    assert len(keys) == len(set(keys)), "an ack salvaged twice"
    for dev, seqs in per_device_seqs(rows).items():             # a gap would be a part's worth (~125 per device)
        missing = set(range(max(seqs) + 1)) - set(seqs)
        assert len(missing) <= 5, (dev, sorted(missing)[:20], len(missing))


def test_sigterm_prints_totals(loadgen: Path, sink: int, tmp_path: Path) -> None:
    cfg = loadgen_config(make_devices(3), "127.0.0.1", sink, shape=Steady(rate=300, duration=60))
    cfg["acked_path"] = str(tmp_path / "acked-{shard}.csv")
    (tmp_path / "c.json").write_text(json.dumps(cfg))
    p = subprocess.Popen([str(loadgen), "run", "--config", str(tmp_path / "c.json")],
                         stdout=subprocess.PIPE, text=True)
    lines = []
    assert p.stdout is not None
    for line in p.stdout:
        lines.append(json.loads(line))
        if lines[-1].get("t") == 1:
            p.send_signal(signal.SIGTERM)
    assert p.wait(10) == 0
    p.stdout.close()
    totals = lines[-1]["totals"]
    per_sec = [ln for ln in lines if "t" in ln]
    assert totals["scheduled"] == sum(ln["scheduled"] for ln in per_sec) < 300 * 60
    assert totals["acked"] == sum(ln["acked"] for ln in per_sec) == totals["sent"]
    assert sorted(totals["last_seq"]) == ["dev-00000", "dev-00001", "dev-00002"]
    with open(tmp_path / "acked-0.csv") as f:
        assert sum(1 for _ in csv.DictReader(f)) == totals["acked"]


def test_connect_nothing_listening_names_endpoint(tmp_path: Path, loadgen: Path) -> None:
    from monsoon.load.stats import FleetConnectError

    port = free_port()
    fleet = NativeFleet(make_devices(2), "127.0.0.1", port, shape=Steady(rate=1, duration=1),
                        acked_path=tmp_path / "acked.csv")
    with pytest.raises(FleetConnectError, match=f"127.0.0.1:{port}.*refused"):
        fleet.connect(timeout=5)
    fleet.close()


def test_devices_with_a_password_log_in_with_it_and_a_wrong_one_is_refused(loadgen: Path, tmp_path: Path) -> None:
    """As Hono's MQTT adapter wants: user name and password in CONNECT. A broker that allows no anonymous client
    takes the devices whose password is right, and refuses the one whose password is wrong, naming it."""
    import shutil

    from monsoon.load.stats import FleetConnectError
    from monsoon.stack.provision import Device

    passwd = shutil.which("mosquitto_passwd")
    if passwd is None:
        pytest.skip("mosquitto_passwd not found (apt-get install -y mosquitto)")
    devices = [Device(f"dev-{i}", f"dev-{i}@tenant", f"secret-{i}") for i in range(3)]
    pw = tmp_path / "passwd"
    pw.touch()
    for d in devices:
        subprocess.run([passwd, "-b", str(pw), d.token, d.password], check=True, capture_output=True)
    pw.chmod(0o600)
    b = Broker(tmp_path, free_port(), anonymous=False, password_file=pw)
    try:
        b.start()
        with NativeFleet(devices, "127.0.0.1", b.port, shape=Steady(rate=30, duration=1),
                         acked_path=tmp_path / "acked.csv") as fleet:
            fleet.connect(timeout=10)
            assert fleet.connected == 3
            totals = fleet.run(threading.Event(), None)
        assert totals.scheduled == totals.acked == 30
        wrong = [Device("dev-0", "dev-0@tenant", "not-the-secret")]
        fleet = NativeFleet(wrong, "127.0.0.1", b.port, shape=Steady(rate=1, duration=1),
                            acked_path=tmp_path / "acked2.csv")
        with pytest.raises(FleetConnectError) as ei:
            fleet.connect(timeout=5)
        fleet.close()
        assert "dev-0" in str(ei.value) and "not authori" in str(ei.value).lower(), str(ei.value)
    finally:
        b.stop()


def test_the_rendered_kubernetes_job_runs_as_pods_would(broker: Broker, loadgen: Path, tmp_path: Path) -> None:
    """`monsoon load-job`'s ConfigMap + Job, run the way Kubernetes runs an Indexed Job: the container's command,
    once per index with JOB_COMPLETION_INDEX set, all at once. Together the pods send the experiment's whole load,
    each device's sequence exactly once."""
    import csv
    import json
    import os
    import textwrap

    from monsoon.load.kube_job import CONFIG_KEY, CONFIG_PATH, job_for_experiment
    from monsoon.run.validate import load_checked

    exp = tmp_path / "tiny.yaml"
    exp.write_text(textwrap.dedent("""\
        name: tiny
        marks: [burst]
        load: {devices: 9, base_rate: 90, shape: {kind: steady}, payload: {profile: smart-meter}}
        profiles: {quick: {warmup: 3}}
        checks: [no_acked_loss]
        """))
    cm, job = job_for_experiment(load_checked(str(exp)), host="127.0.0.1", port=broker.port, profile="quick", shards=3,
                                 image="monsoon-loadgen:test", namespace="load", allowed_namespaces=["load"],
                                 run_id="20261122-000000-abcd")
    config = json.loads(cm["data"][CONFIG_KEY])
    config["acked_path"] = str(tmp_path / "acked-{shard}.csv")        # the pod's /tmp, here
    (tmp_path / CONFIG_KEY).write_text(json.dumps(config))
    spec = job["spec"]
    command = spec["template"]["spec"]["containers"][0]["command"]
    assert command[0] == "monsoon-loadgen" and command[3] == f"{CONFIG_PATH}/{CONFIG_KEY}"
    pods = []
    for i in range(spec["completions"]):
        argv = [str(loadgen)] + [str(tmp_path / CONFIG_KEY) if a == command[3] else a for a in command[1:]]
        pods.append(subprocess.Popen(argv, env={**os.environ, "JOB_COMPLETION_INDEX": str(i)},
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    totals = []
    for p in pods:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        totals.append(json.loads(out.strip().splitlines()[-1])["totals"])
    seqs: dict[str, list[int]] = {}
    for i in range(3):
        with open(tmp_path / f"acked-{i}.csv") as fh:
            for r in csv.DictReader(fh):
                seqs.setdefault(r["device"], []).append(int(r["seq"]))
    assert sum(t["acked"] for t in totals) == 90 * 3 == sum(len(v) for v in seqs.values())
    assert sorted(seqs) == [f"monsoon-{i:05d}" for i in range(9)]            # every device, once, across the pods
    assert all(sorted(v) == list(range(len(v))) for v in seqs.values())
