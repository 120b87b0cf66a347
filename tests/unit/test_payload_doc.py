"""docs/stacks.md's example messages (issue 39: where a payload carries the device and seq) are what the real
encoder renders, for every transport monsoon's devices speak."""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import get_args

from monsoon.load.http import telemetry_path
from monsoon.load.payloads import Payload
from monsoon.spec.stack import Transport

DOC = Path(__file__).resolve().parents[2] / "docs" / "stacks.md"
SECTION = "## What a device sends: where the device and `seq` are"


def section() -> str:
    text = DOC.read_text()
    start = text.index(SECTION)
    nxt = text.find("\n## ", start + 1)
    return text[start:nxt if nxt != -1 else len(text)]


def test_every_transport_has_an_example_whose_body_is_the_encoders():
    sec = section()
    dev, seq, ts = "monsoon-00000", 7, 1767225600000
    body = Payload("minimal").render(0, dev, seq, ts, ts + 3).decode()
    examples = re.findall(r"^`([a-z-]+)` \(.*?```\n(.*?)```", sec, flags=re.S | re.M)
    assert [t for t, _ in examples] == list(get_args(Transport))          # mqtt, http, coap, hono-http, hono-coap
    for transport, block in examples:
        assert block.rstrip("\n").splitlines()[-1] == body, transport
    doc = json.loads(body)
    assert doc["values"]["device"] == dev and doc["values"]["seq"] == seq and doc["ts"] == ts
    assert f"POST {telemetry_path(dev)} HTTP/1.1" in sec and f"coap://127.0.0.1:<devices.port>{telemetry_path(dev)}" in sec
    smart = Payload("smart-meter").render(0, dev, seq, ts, ts + 3).decode()
    assert f"`{smart}`" in sec
    assert "`monsoon payload --example --transport <t>`" in sec
