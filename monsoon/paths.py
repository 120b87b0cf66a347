"""monsoon's own files (``REPO``: the checkout, or the package data of an installed monsoon) and the cache.

Kept for the modules and tests that name them; where things are is decided in :mod:`monsoon.settings`."""
from __future__ import annotations

from monsoon.settings import ROOT as REPO, cache_dir

__all__ = ["CACHE", "REPO"]

CACHE = cache_dir()
