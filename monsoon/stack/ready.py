"""Readiness: a service is ready when its tcp port answers, its http URL answers 2xx, or its log matches."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable
import requests

from monsoon.spec.stack import ReadySpec
from monsoon.stack.ports import port_open


def _ready_once(ready: ReadySpec, log_path: Path, render_: Callable[[str], str]) -> bool:
    if ready.tcp:
        target = render_(ready.tcp)
        host, _, port = target.rpartition(":")
        return port_open(host or "127.0.0.1", int(port))
    if ready.http:
        try:
            return requests.get(render_(ready.http), timeout=1).ok
        except requests.RequestException:
            return False
    try:
        return re.search(render_(ready.log), log_path.read_text(errors="replace")) is not None
    except FileNotFoundError:
        return False
