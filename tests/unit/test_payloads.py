"""Payload profiles: every payload carries device, seq and ts; templates are checked up front."""
from __future__ import annotations

import json

import pytest

from monsoon.spec.payload import TemplateError, compile_template
from monsoon.load.payloads import Payload

TS, SENT = 1_700_000_000_000, 1_700_000_000_007
TEMPLATE = ('{"ts": {ts}, "values": {"device": "{device}", "seq": {seq}, "sent": {sent_ms}, '
            '"temp": {rand_float:18.5:30}, "door": {rand_int:0:1}, "unit": "50%"}}')


def values(p: Payload, seq: int = 7, idx: int = 3, name: str = "monsoon-00003") -> dict:
    msg = json.loads(p.render(idx, name, seq, TS, SENT))
    assert msg["ts"] == TS
    return msg["values"]


def test_minimal_is_the_default_and_byte_identical_to_the_old_payload() -> None:
    name_json = json.dumps("monsoon-00003")
    for seq in (0, 7, 149, 150, 12345):
        old = (f'{{"ts":{TS},"values":{{"device":{name_json},"seq":{seq},'
               f'"sent_ms":{SENT},"temperature":{20.0 + (seq % 150) / 10:.1f},'
               f'"humidity":{30 + seq % 50}}}}}').encode()
        assert Payload().render(3, "monsoon-00003", seq, TS, SENT) == old


@pytest.mark.parametrize("profile,keys", [
    ("minimal", {"temperature", "humidity"}),
    ("smart-meter", {"pulseCounter", "leakage", "batteryLevel"}),
    ("smart-tracker", {"latitude", "longitude", "speed", "fuel", "batteryLevel"}),
    ("industrial-plc", {f"line{i:03d}" for i in range(60)}),
])
def test_every_profile_carries_device_seq_and_send_time(profile, keys) -> None:
    v = values(Payload(profile), seq=41)
    assert v["device"] == "monsoon-00003" and v["seq"] == 41 and v["sent_ms"] == SENT
    assert set(v) == {"device", "seq", "sent_ms"} | keys


def test_profile_values_have_thingsboard_shapes_and_vary() -> None:
    meters = [values(Payload("smart-meter"), seq=s) for s in range(2000)]
    assert all(isinstance(m["leakage"], bool) for m in meters)
    assert 0 < sum(m["leakage"] for m in meters) < 100          # ~1 %
    assert all(0 <= m["pulseCounter"] < 1_000_000 and 0 <= m["batteryLevel"] <= 100 for m in meters)
    assert len({m["pulseCounter"] for m in meters}) > 500
    trackers = [values(Payload("smart-tracker"), seq=s) for s in range(200)]
    assert all(-90 <= t["latitude"] <= 90 and -180 <= t["longitude"] <= 180 for t in trackers)
    assert all(0 <= t["speed"] <= 130 and 0 <= t["fuel"] <= 100 for t in trackers)
    plc = values(Payload("industrial-plc", datapoints=250))
    assert len([k for k in plc if k.startswith("line")]) == 250 and "line249" in plc
    assert all(isinstance(plc[f"line{i:03d}"], float) and 0 <= plc[f"line{i:03d}"] < 100 for i in range(250))


def test_payloads_are_reproducible_and_differ_between_devices() -> None:
    a = Payload("smart-tracker").render(1, "d1", 5, TS, SENT)
    assert a == Payload("smart-tracker").render(1, "d1", 5, TS, SENT)
    assert json.loads(a)["values"]["latitude"] != json.loads(Payload("smart-tracker").render(2, "d1", 5, TS, SENT))[
        "values"]["latitude"]


def test_template_fills_every_placeholder() -> None:
    p = Payload("template", template=TEMPLATE)
    seen_temp, seen_door = set(), set()
    for seq in range(300):
        msg = json.loads(p.render(3, "monsoon-00003", seq, TS, SENT))
        v = msg["values"]
        assert msg["ts"] == TS and v["device"] == "monsoon-00003" and v["seq"] == seq and v["sent"] == SENT
        assert 18.5 <= v["temp"] <= 30 and v["door"] in (0, 1) and v["unit"] == "50%"
        seen_temp.add(v["temp"])
        seen_door.add(v["door"])
    assert len(seen_temp) > 100 and seen_door == {0, 1}
    # decimals follow the more precise bound (at least 2)
    raw = p.render(3, "monsoon-00003", 1, TS, SENT).decode()
    assert len(raw.split('"temp": ')[1].split(",")[0].split(".")[1]) == 2


def test_template_escapes_the_device_name() -> None:
    p = Payload("template", template='{"d": "{device}", "seq": {seq}, "ts": {ts}}')
    assert json.loads(p.render(0, 'we"ird\\name', 1, TS, SENT))["d"] == 'we"ird\\name'


@pytest.mark.parametrize("template,needle", [
    ('{"seq": {seq}}', "template must carry {device}, {seq}, {ts}"),
    ('{"d": "{device}", "seq": {seq}}', "missing: {ts}"),
    ('{"d": {device}, "seq": {seq}, "ts": {ts}}', "not valid JSON once rendered"),
    ('{"d": "{device}", "seq": {seq}, "ts": {ts}, "x": {temperature}}', "unknown placeholder {temperature} at character"),
    ('{"d": "{device}", "seq": {seq}, "ts": {ts}, "x": {rand_int:9:1}}', "need finite bounds with A <= B"),
    ('{"d": "{device}", "seq": {seq}, "ts": {ts}, "x": {rand_int:1.5:3}}', "the bounds must be integers"),
    ('{"d": "{device}", "seq": {seq}, "ts": {ts}, "x": {rand_float:1}}', "needs two bounds"),
    ('{"d": "{device}", "seq": {seq:2}, "ts": {ts}}', "takes no arguments"),
    ("   ", "non-empty JSON text"),
])
def test_bad_templates_say_what_is_wrong(template, needle) -> None:
    with pytest.raises(TemplateError) as ei:
        compile_template(template)
    assert needle in str(ei.value)
    with pytest.raises(ValueError):
        Payload("template", template=template)


@pytest.mark.parametrize("kwargs,needle", [
    (dict(profile="SMART_METER"), "unknown payload profile 'SMART_METER' (use one of: minimal, smart-meter"),
    (dict(profile="industrial-plc", datapoints=0), "datapoints must be an integer from 1 to 999, got 0"),
    (dict(profile="industrial-plc", datapoints=1000), "got 1000"),
    (dict(profile="template"), "needs a template"),
    (dict(profile="smart-meter", template='{"a": 1}'), "only used by the template profile"),
])
def test_bad_payload_parameters(kwargs, needle) -> None:
    with pytest.raises(ValueError) as ei:
        Payload(**kwargs)
    assert needle in str(ei.value)


def test_profiles_listed_match_the_spec_literal() -> None:
    from monsoon.spec.payload import PAYLOAD_PROFILES, PayloadSpec
    assert set(PayloadSpec.model_fields["profile"].annotation.__args__) == set(PAYLOAD_PROFILES)


def test_fleet_gives_each_device_its_renderer(tmp_path) -> None:
    pytest.importorskip("paho.mqtt")
    from monsoon.stack.provision import Device
    from monsoon.load.mqtt import MqttFleet
    from monsoon.load.shapes import Steady
    devs = [Device(f"dev-{i}", f"tok-{i}") for i in range(3)]
    fleet = MqttFleet(devs, "127.0.0.1", 1, shape=Steady(1, 1), acked_path=tmp_path / "a.csv",
                      payload=Payload("industrial-plc", datapoints=5))
    v = json.loads(fleet._conns[2].render(9, TS, SENT))["values"]
    assert v["device"] == "dev-2" and v["seq"] == 9 and "line004" in v
    default = MqttFleet(devs, "127.0.0.1", 1, shape=Steady(1, 1), acked_path=tmp_path / "b.csv")
    assert default._conns[0].render(1, TS, SENT) == Payload().render(0, "dev-0", 1, TS, SENT)
