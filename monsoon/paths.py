"""Where monsoon lives: the repository root and the cache of downloaded and built parts (``MONSOON_CACHE``)."""
from __future__ import annotations
import os

from pathlib import Path


REPO = Path(__file__).resolve().parent.parent


CACHE = Path(os.environ.get("MONSOON_CACHE", REPO / ".cache"))
