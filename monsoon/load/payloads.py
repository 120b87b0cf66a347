"""Telemetry payloads: what every device publishes, built cheaply per message.

The reasoning, sources and measurements behind it: docs/design.md, "monsoon/load/payloads.py"."""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from functools import cached_property

from monsoon.spec.payload import DEFAULT_DATAPOINTS, MAX_DATAPOINTS, PAYLOAD_PROFILES, PayloadSpec, Renderer, POOL_MASK, _POOL, _SEED, _Template, compile_template


__all__ = ["Payload"]


@dataclass(frozen=True)
class Payload:
    """A payload profile; :meth:`renderer` gives each device its builder.

    ``datapoints`` is used by ``industrial-plc`` only; ``template`` by ``template`` only.
    """

    profile: str = "minimal"
    datapoints: int = DEFAULT_DATAPOINTS
    template: str | None = None
    seed: int = field(default=_SEED, repr=False)

    def __post_init__(self) -> None:
        if self.profile not in PAYLOAD_PROFILES:
            raise ValueError(f"unknown payload profile {self.profile!r} (use one of: {', '.join(PAYLOAD_PROFILES)})")
        dp = self.datapoints
        if isinstance(dp, bool) or not isinstance(dp, int) or not 1 <= dp <= MAX_DATAPOINTS:
            raise ValueError(f"datapoints must be an integer from 1 to {MAX_DATAPOINTS}, got {dp!r}")
        if self.profile == "template":
            if self.template is None:
                raise ValueError("the template profile needs a template (a JSON text with placeholders)")
            compile_template(self.template, seed=self.seed)
        elif self.template is not None:
            raise ValueError(f"a template is only used by the template profile, not {self.profile!r}")

    # ------------------------------------------------------------------ pools
    @cached_property
    def _tails(self) -> tuple[str, ...]:
        """Pre-rendered ``"key":value,...`` tails of the ``values`` object."""
        rng = random.Random(self.seed)
        out = []
        for _ in range(_POOL):
            if self.profile == "smart-meter":
                out.append(f'"pulseCounter":{rng.randrange(1_000_000)},'
                           f'"leakage":{"true" if rng.random() < 0.01 else "false"},'
                           f'"batteryLevel":{rng.randrange(101)}')
            elif self.profile == "smart-tracker":
                out.append(f'"latitude":{rng.uniform(-90, 90):.6f},"longitude":{rng.uniform(-180, 180):.6f},'
                           f'"speed":{rng.uniform(0, 130):.1f},"fuel":{rng.randrange(101)},'
                           f'"batteryLevel":{rng.randrange(101)}')
            elif self.profile == "industrial-plc":
                out.append(",".join(f'"line{i:03d}":{rng.random() * 100!r}' for i in range(self.datapoints)))
            else:  # pragma: no cover - minimal/template have no tails
                raise AssertionError(self.profile)
        return tuple(out)

    @cached_property
    def _template(self) -> _Template:
        assert self.template is not None
        return compile_template(self.template, seed=self.seed)

    # -------------------------------------------------------------- builders
    def renderer(self, idx: int, device: str) -> Renderer:
        """``render(seq, ts_ms, sent_ms) -> bytes`` for device number ``idx`` named ``device``."""
        name_json = json.dumps(device)
        if self.profile == "minimal":
            def render(seq: int, ts: int, sent_ms: int) -> bytes:
                return (
                    f'{{"ts":{ts},"values":{{"device":{name_json},"seq":{seq},'
                    f'"sent_ms":{sent_ms},"temperature":{20.0 + (seq % 150) / 10:.1f},'
                    f'"humidity":{30 + seq % 50}}}}}'
                ).encode()
            return render
        if self.profile == "template":
            return self._template.renderer(idx, device)
        tails = self._tails
        off = idx * 97
        head = f'"values":{{"device":{name_json},"seq":'

        def render_tails(seq: int, ts: int, sent_ms: int) -> bytes:
            return f'{{"ts":{ts},{head}{seq},"sent_ms":{sent_ms},{tails[(seq + off) & POOL_MASK]}}}}}'.encode()
        return render_tails

    def render(self, idx: int, device: str, seq: int, ts: int, sent_ms: int) -> bytes:
        """One payload (slow path: builds the device's renderer each call; for tests and previews)."""
        return self.renderer(idx, device)(seq, ts, sent_ms)

    # -------------------------------------------------------------- native
    def native_spec(self) -> dict:
        """The payload as parts for the native generator (``monsoon-loadgen``'s ``payload``).

        ``{"parts": [...]}``; each part is ``{"lit": text}``, ``{"var": name}`` (``ts``, ``seq``,
        ``sent_ms``, ``device_json`` = the JSON string with quotes, ``device_raw`` = escaped,
        without quotes, ``temperature``/``humidity`` = the minimal profile's values) or
        ``{"pool": [...], "seq_mul": a, "idx_mul": b, "add": c}`` = the pre-rendered value at
        ``(seq*a + idx*b + c) & (len(pool)-1)``, exactly how :meth:`renderer` indexes its pools,
        so the native generator composes byte-identical payloads.
        """
        head: list[dict] = [
            {"lit": '{"ts":'}, {"var": "ts"}, {"lit": ',"values":{"device":'}, {"var": "device_json"},
            {"lit": ',"seq":'}, {"var": "seq"}, {"lit": ',"sent_ms":'}, {"var": "sent_ms"},
        ]
        if self.profile == "minimal":
            parts = head + [{"lit": ',"temperature":'}, {"var": "temperature"},
                            {"lit": ',"humidity":'}, {"var": "humidity"}, {"lit": "}}"}]
        elif self.profile == "template":
            tpl = self._template
            parts = []
            pos = 0
            slots = iter(tpl.slots)
            for m in re.finditer(r"%(%|s)", tpl.fmt):
                if m.start() > pos:
                    parts.append({"lit": tpl.fmt[pos:m.start()]})
                pos = m.end()
                if m.group(1) == "%":
                    parts.append({"lit": "%"})
                    continue
                slot = next(slots)
                if slot == "device":
                    parts.append({"var": "device_raw"})
                elif isinstance(slot, str):
                    parts.append({"var": slot})
                else:
                    parts.append({"pool": list(tpl.pools[slot]), "seq_mul": 40503, "idx_mul": 9973,
                                  "add": slot * 131})
            if pos < len(tpl.fmt):
                parts.append({"lit": tpl.fmt[pos:]})
        else:
            parts = head + [{"lit": ","}, {"pool": list(self._tails), "seq_mul": 1, "idx_mul": 97, "add": 0},
                            {"lit": "}}"}]
        merged: list[dict] = []
        for p in parts:   # adjacent literals in one part
            if "lit" in p and merged and "lit" in merged[-1]:
                merged[-1] = {"lit": merged[-1]["lit"] + p["lit"]}
            else:
                merged.append(p)
        return {"parts": merged}


def build_payload(spec: PayloadSpec) -> Payload:
    """The :class:`Payload` the fleet renders for an experiment's ``load.payload``."""
    return Payload(spec.profile, spec.datapoints or DEFAULT_DATAPOINTS, spec.template)
