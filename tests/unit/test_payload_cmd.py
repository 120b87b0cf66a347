"""``monsoon payload --example``: per transport, how a message is carried, its body as the fleets render it, and
where the device id and the seq are in it (issue 39)."""
from __future__ import annotations

import json

from monsoon.cli import TRANSPORT_CARRIES, main as cli_main, payload_example
from monsoon.load.payloads import Payload
from monsoon.spec.stack import DevicesSpec


def test_every_transport_a_stack_can_name_has_an_example():
    assert set(TRANSPORT_CARRIES) == set(DevicesSpec.model_fields["transport"].annotation.__args__)


def test_the_example_body_is_what_the_fleet_sends_and_says_where_device_and_seq_are(capsys):
    assert cli_main(["payload", "--example", "--transport", "mqtt"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("# mqtt: an MQTT PUBLISH to the stack's devices.topic")
    body = lines[2].encode()
    assert body == Payload("minimal").render(0, "monsoon-00000", 7, 1767225600000, 1767225600003)   # the real bytes
    doc = json.loads(body)
    assert doc["values"]["device"] == "monsoon-00000" and doc["values"]["seq"] == 7
    assert "device id: values.device = 'monsoon-00000'; seq: values.seq = 7" in lines[3]


def test_without_a_transport_every_one_is_printed_and_profiles_and_templates_are_followed(capsys):
    assert cli_main(["payload", "--example"]) == 0
    out = capsys.readouterr().out
    assert [ln.split(":")[0] for ln in out.splitlines() if ln.startswith("# ") and "body" not in ln
            and "device id" not in ln] == [f"# {t}" for t in TRANSPORT_CARRIES]
    smart = payload_example("http", "smart-meter")
    assert "POST /api/v1/{token}/telemetry" in smart and "pulseCounter" in smart and "values.seq = 7" in smart
    mine = payload_example("mqtt", "template", '{"t": {ts}, "who": "{device}", "n": {seq}, "x": {rand_int:0:9}}')
    assert "device id: who = 'monsoon-00000'; seq: n = 7" in mine


def test_a_bad_template_and_a_missing_flag_are_one_line(capsys):
    assert cli_main(["payload", "--example", "--template", '{"d": 1}']) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("monsoon payload: template must carry") and "\n" not in err
    assert cli_main(["payload"]) == 2
    assert "--example" in capsys.readouterr().err
