"""What each device publishes (``load.payload``): the profiles and the template grammar (``{device}``,
``{seq}``, ``{ts}``, ``{rand_int:A:B}``...). Rendering lives in :mod:`monsoon.load.payloads`."""
from __future__ import annotations
from typing import Callable
from dataclasses import dataclass
import json
import math
import random

import re
from typing import Literal
from pydantic import Field, field_validator, model_validator

from monsoon.spec.base import _Frozen, _invalid


PAYLOAD_PROFILES = ("minimal", "smart-meter", "smart-tracker", "industrial-plc", "template")


PayloadProfile = Literal["minimal", "smart-meter", "smart-tracker", "industrial-plc", "template"]


class PayloadSpec(_Frozen):
    """What each device publishes (``load.payload``): see :mod:`monsoon.load.payloads`.

    ``{profile: smart-meter}``, ``{profile: industrial-plc, datapoints: 100}``,
    ``{profile: template, template: '{"ts": {ts}, "values": {"device": "{device}", "seq": {seq}}}'}``;
    a bare string is the profile. Default: ``minimal`` (temperature, humidity).
    """
    profile: PayloadProfile = Field("minimal", description="minimal (temperature, humidity), smart-meter, "
                                    "smart-tracker, industrial-plc or template")
    datapoints: int | None = Field(None, ge=1, le=999, description="industrial-plc only: values per message")
    template: str | None = Field(None, description="template only: JSON text with placeholders")
    sizes: tuple[int, ...] | None = Field(None, min_length=1, description="a size sweep (monsoon sweep): message "
                                          "sizes in bytes, each padded to that length, e.g. [100, 1000, 10000]")

    @field_validator("template")
    @classmethod
    def _template_ok(cls, v: str | None) -> str | None:
        if v is not None:
            try:
                compile_template(v)
            except ValueError as e:   # TemplateError: says what is wrong and where in the template
                raise _invalid(str(e)) from None
        return v

    @model_validator(mode="after")
    def _fits(self) -> "PayloadSpec":
        if self.sizes is not None:
            bad = [n for n in self.sizes if not MIN_SIZE <= n <= MAX_SIZE]
            if bad:
                raise _invalid(f"sizes must be from {MIN_SIZE} to {MAX_SIZE:,} bytes (the smallest carries the "
                               f"device, seq and timestamps), got {bad[0]}")
            if list(self.sizes) != sorted(set(self.sizes)):
                raise _invalid("sizes must be distinct and in increasing order")
            if self.profile != "minimal":
                raise _invalid("sizes pads monsoon's own fields to each size: drop profile")
        if self.datapoints is not None and self.profile != "industrial-plc":
            raise _invalid(f"datapoints is for the industrial-plc profile, not {self.profile!r}")
        if self.profile == "template":
            if self.template is None:
                raise _invalid("the template profile needs a template: JSON text with {device}, {seq}, {ts} "
                               "(and {sent_ms}, {rand_int:A:B}, {rand_float:A:B}) placeholders")
        elif self.template is not None:
            raise _invalid(f"template is for the template profile, not {self.profile!r}")
        return self


MAX_DATAPOINTS = 999

MIN_SIZE, MAX_SIZE = 100, 1_000_000     # a size sweep's bounds, bytes per message


DEFAULT_DATAPOINTS = 60


Renderer = Callable[[int, int, int], bytes]  # (seq, ts_ms, sent_ms) -> payload bytes


_POOL = 1024            # pre-rendered variants per profile (a power of two)


POOL_MASK = _POOL - 1


_SEED = 0x6D6F6E73      # "mons"


PLACEHOLDER_RE = re.compile(r"\{([a-z_]+)((?::[^{}:]*)*)\}")


_FIXED = ("device", "seq", "ts", "sent_ms")


_REQUIRED = ("device", "seq", "ts")


_HELP = "use {device}, {seq}, {ts}, {sent_ms}, {rand_int:A:B} or {rand_float:A:B}"


class TemplateError(ValueError):
    """A payload template that cannot be used (the message says why and where)."""


def _decimals(text: str) -> int:
    t = text.strip().lower()
    if "e" in t:
        return 6
    return len(t.split(".", 1)[1]) if "." in t else 0


@dataclass(frozen=True)
class _Template:
    fmt: str                               # %-format, one positional %s per placeholder
    slots: tuple[str | int, ...]           # per %s: "device" | "seq" | "ts" | "sent_ms" | pool index
    pools: tuple[tuple[str, ...], ...]     # one pool of rendered values per random placeholder

    def renderer(self, idx: int, device: str) -> Renderer:
        """A closure ``render(seq, ts, sent_ms)``: one ``%`` formatting of a tuple per message.

        The closure is compiled from a source built only from fixed names and integers (never
        from the template's text, which reaches it as the constant ``F``)."""
        args = []
        for s in self.slots:
            if s == "device":
                args.append("D")
            elif isinstance(s, str):
                args.append(s)                       # seq, ts, sent_ms: the closure's parameters
            else:
                args.append(f"P{s}[(seq * 40503 + {idx * 9973 + s * 131}) & {POOL_MASK}]")
        src = f"lambda seq, ts, sent_ms: (F % ({', '.join(args)},)).encode()"
        ns: dict[str, object] = {"F": self.fmt, "D": json.dumps(device)[1:-1]}
        ns.update({f"P{j}": pool for j, pool in enumerate(self.pools)})
        return eval(src, ns)  # eval on purpose: see the docstring


def compile_template(text: str, *, seed: int = _SEED) -> _Template:
    """Parse and check a template; raise :class:`TemplateError` saying what is wrong."""
    if not isinstance(text, str) or not text.strip():
        raise TemplateError("template must be a non-empty JSON text")
    rng = random.Random(seed)
    parts: list[str] = []
    slots: list[str | int] = []
    pools: list[tuple[str, ...]] = []
    pos = 0
    for m in PLACEHOLDER_RE.finditer(text):
        name, args = m.group(1), m.group(2).split(":")[1:]
        where = f"{m.group(0)} at character {m.start() + 1}"
        parts.append(text[pos:m.start()].replace("%", "%%"))
        pos = m.end()
        if name in _FIXED:
            if args:
                raise TemplateError(f"placeholder {where} takes no arguments ({_HELP})")
            parts.append("%s")
            slots.append(name)
            continue
        if name not in ("rand_int", "rand_float"):
            raise TemplateError(f"unknown placeholder {where} ({_HELP})")
        if len(args) != 2:
            raise TemplateError(f"placeholder {where} needs two bounds, e.g. {{{name}:0:100}}")
        lo: float
        hi: float
        try:
            if name == "rand_int":
                lo, hi = int(args[0]), int(args[1])
            else:
                lo, hi = float(args[0]), float(args[1])
        except ValueError:
            kind = "integers" if name == "rand_int" else "numbers"
            raise TemplateError(f"placeholder {where}: the bounds must be {kind}") from None
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
            raise TemplateError(f"placeholder {where}: need finite bounds with A <= B")
        if name == "rand_int":
            pool = tuple(str(rng.randint(int(lo), int(hi))) for _ in range(_POOL))
        else:
            d = max(2, _decimals(args[0]), _decimals(args[1]))
            pool = tuple(f"{min(hi, lo + (hi - lo) * rng.random()):.{d}f}" for _ in range(_POOL))
        parts.append("%s")
        slots.append(len(pools))
        pools.append(pool)
    parts.append(text[pos:].replace("%", "%%"))
    missing = [n for n in _REQUIRED if n not in slots]
    if missing:
        raise TemplateError(
            "template must carry " + ", ".join("{" + n + "}" for n in _REQUIRED)
            + " (every payload carries the device, its sequence number and the send time); missing: "
            + ", ".join("{" + n + "}" for n in missing)
        )
    tpl = _Template("".join(parts), tuple(slots), tuple(pools))
    sample = tpl.renderer(0, "monsoon-00000")(12345, 1_700_000_000_000, 1_700_000_000_001).decode()
    try:
        json.loads(sample)
    except json.JSONDecodeError as e:
        snippet = sample[max(0, e.pos - 25):e.pos + 25]
        raise TemplateError(
            f"template is not valid JSON once rendered: {e.msg} at line {e.lineno} column {e.colno} "
            f"(near {snippet!r}; a string placeholder needs its quotes: \"{{device}}\")"
        ) from None
    return tpl
