"""monsoon.load.native without the binary: config rendering from a shape, shard ranges, and the
payload parts the native core composes (checked against Payload.renderer byte for byte)."""
from __future__ import annotations

import json

import pytest

from monsoon.stack.provision import Device
from monsoon.load.schedule import Schedule
from monsoon.load.hono import leg_cycle
from monsoon.load.native import NativeFleet, NativeHonoCoapFleet, loadgen_config, shard_range
from monsoon.load.payloads import Payload
from monsoon.load.shapes import Ramp, Stage, Stages, Steady


def compose(spec: dict, idx: int, name: str, seq: int, ts: int, sent_ms: int) -> bytes:
    """A Python reading of the parts spec, exactly as monsoon-loadgen's payload.rs reads it."""
    raw = json.dumps(name)[1:-1]
    out = []
    for p in spec["parts"]:
        if "lit" in p:
            out.append(p["lit"])
        elif "var" in p:
            v = p["var"]
            out.append({
                "ts": str(ts), "seq": str(seq), "sent_ms": str(sent_ms), "device_raw": raw,
                "device_json": f'"{raw}"', "temperature": f"{(200 + seq % 150) // 10}.{(200 + seq % 150) % 10}",
                "humidity": str(30 + seq % 50),
            }[v])
        else:
            pool = p["pool"]
            out.append(pool[(seq * p["seq_mul"] + idx * p["idx_mul"] + p["add"]) & (len(pool) - 1)])
    return "".join(out).encode()


def test_config_segments_come_from_the_schedule() -> None:
    shape = Stages([Stage("warm", 2.0, 100.0), Stage("pause", 1.0, 0.0), Stage("burst", 1.5, 2500.0)])
    devs = [Device(f"d{i}", f"t{i}") for i in range(3)]
    cfg = loadgen_config(devs, "127.0.0.1", 1883, shape=shape, qos=1, late_tolerance_s=0.02,
                         source_addrs=["127.0.0.2", "127.0.0.3"])
    assert cfg["segments"] == [list(s) for s in Schedule(shape).segments()]
    assert cfg["segments"] == [[0.0, 2.0, 100.0], [2.0, 3.0, 0.0], [3.0, 4.5, 2500.0]]
    assert cfg["devices"] == [{"name": "d0", "token": "t0"}, {"name": "d1", "token": "t1"}, {"name": "d2", "token": "t2"}]
    assert cfg["late_tolerance_ms"] == pytest.approx(20.0)
    assert cfg["source_addrs"] == ["127.0.0.2", "127.0.0.3"]
    assert cfg["qos"] == 1 and cfg["port"] == 1883
    json.dumps(cfg)  # serialisable as is


def test_ramp_becomes_a_staircase_of_steps() -> None:
    shape = Ramp(start_rate=10.0, end_rate=50.0, start=0.0, ramp_duration=2.0, duration=2.0)
    cfg = loadgen_config([Device("a", "")], "h", 1, shape=shape)
    segs = cfg["segments"]
    assert segs == [list(s) for s in Schedule(shape).segments()]
    assert len(segs) == 20 and segs[0][0] == 0.0 and segs[-1][1] == 2.0
    assert all(a[1] == b[0] for a, b in zip(segs, segs[1:]))
    assert segs[0][2] < segs[-1][2]


@pytest.mark.parametrize("d,n", [(1, 1), (7, 3), (10, 4), (50_000, 4), (12, 12), (5, 1)])
def test_shard_ranges_are_disjoint_and_cover(d: int, n: int) -> None:
    ranges = [shard_range(d, i, n) for i in range(n)]
    assert ranges[0][0] == 0 and ranges[-1][1] == d
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    sizes = [hi - lo for lo, hi in ranges]
    assert max(sizes) - min(sizes) <= 1


def test_shard_range_rejects_bad_index() -> None:
    with pytest.raises(ValueError):
        shard_range(10, 3, 3)
    with pytest.raises(ValueError):
        shard_range(10, 0, 0)


@pytest.mark.parametrize("payload", [
    Payload(),
    Payload("smart-meter"),
    Payload("smart-tracker"),
    Payload("industrial-plc", datapoints=7),
    Payload("template", template='{"id":"{device}","n":{seq},"at":{ts},"s":{sent_ms},'
                                 '"a":{rand_int:-5:5},"b":{rand_float:0.5:2.125},"pct":"100%"}'),
])
def test_native_payload_parts_compose_what_python_renders(payload: Payload) -> None:
    spec = payload.native_spec()
    json.dumps(spec)
    for idx, name in [(0, "dev-0"), (3, 'we"ird\\näme'), (1234, "x")]:
        for seq in (0, 1, 149, 150, 1023, 1024, 99_999):
            ts, sent = 1_700_000_000_000 + seq, 1_700_000_000_005 + seq
            assert compose(spec, idx, name, seq, ts, sent) == payload.render(idx, name, seq, ts, sent)


def test_native_fleet_validates_like_mqtt_fleet(tmp_path) -> None:
    devs = [Device("a", ""), Device("b", "")]
    kw = dict(shape=Steady(rate=1, duration=1), acked_path=tmp_path / "a.csv")
    with pytest.raises(ValueError, match="empty"):
        NativeFleet([], "127.0.0.1", 1, **kw)
    with pytest.raises(ValueError, match="unique"):
        NativeFleet([devs[0], devs[0]], "127.0.0.1", 1, **kw)
    with pytest.raises(ValueError, match="qos"):
        NativeFleet(devs, "127.0.0.1", 1, qos=2, **kw)
    with pytest.raises(ValueError, match="workers"):
        NativeFleet(devs, "127.0.0.1", 1, workers=3, **kw)


def test_missing_cargo_names_what_to_install(tmp_path, monkeypatch) -> None:
    """A checkout without a built binary on a machine without cargo: the error says what to do."""
    import monsoon.load.loadgen_build as native

    crate = tmp_path / "loadgen"
    (crate / "src").mkdir(parents=True)
    monkeypatch.setattr(native, "CRATE_DIR", crate)
    monkeypatch.delenv("MONSOON_LOADGEN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setenv("CARGO_HOME", str(tmp_path / "no-cargo-home"))
    with pytest.raises(native.LoadgenBuildError, match="cargo.*rustup"):
        native.ensure_loadgen()
    monkeypatch.setenv("MONSOON_LOADGEN", str(tmp_path / "nope"))
    with pytest.raises(native.LoadgenBuildError, match="MONSOON_LOADGEN"):
        native.ensure_loadgen()


def test_loopback_targets_spread_over_source_addresses_past_one_address_worth():
    from monsoon.load.native import loopback_sources
    assert loopback_sources("127.0.0.1", 10_000) == []
    assert loopback_sources("127.0.0.1", 25_000) == ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    assert loopback_sources("10.1.2.3", 50_000) == []          # a remote target: the kernel picks


def test_too_many_devices_per_native_worker_is_refused(tmp_path):
    from monsoon.stack.provision import Device
    from monsoon.load.native import NativeFleet
    from monsoon.load.shapes import Steady
    devs = [Device(f"d{i}", "") for i in range(40_000)]
    with pytest.raises(ValueError, match="set load.workers >= 3"):
        NativeFleet(devs, "127.0.0.1", 1883, shape=Steady(rate=1, duration=1), acked_path=tmp_path / "a.csv")
    f = NativeFleet(devs, "127.0.0.1", 1883, shape=Steady(rate=1, duration=1), acked_path=tmp_path / "a.csv",
                    workers=3)
    assert f.source_addrs == ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5"]   # 10,000 per address


def test_the_hono_coap_config_carries_the_kinds_the_ttd_and_the_leg_timeout(tmp_path) -> None:
    devs = [Device(f"d{i}", f"d{i}@T", f"s{i}") for i in range(3)]
    f = NativeHonoCoapFleet(devs, "127.0.0.1", 5684, shape=Steady(rate=10, duration=1),
                            acked_path=tmp_path / "acked.parquet", legs={"telemetry": 1, "command": 1},
                            request_timeout_s=7.5)
    cfg = f.config()
    assert cfg["transport"] == "hono-coap" and cfg["ttd_s"] == 5 and cfg["leg_timeout_s"] == 7.5
    assert cfg["kinds"] == list(leg_cycle({"telemetry": 1, "command": 1}))
    assert cfg["kinds"].count("command") == 50 and "event" not in cfg["kinds"]
    assert cfg["devices"][1] == {"name": "d1", "token": "d1@T", "password": "s1"}
    assert "transport" not in NativeFleet(devs, "127.0.0.1", 1883, shape=Steady(rate=10, duration=1),
                                          acked_path=tmp_path / "a2.parquet").config()
