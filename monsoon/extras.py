"""Optional parts of monsoon (``pip install 'monsoon[EXTRA]'``), imported when a run needs them, never before.

``need("docker", "containers", "a container stack (provider: docker)")`` returns the module, or raises
:class:`MissingExtra` whose message is one line naming the extra to install."""
from __future__ import annotations

import importlib
from types import ModuleType

EXTRAS = {"containers": ("docker", "testcontainers"), "cassandra": ("cassandra-driver",), "kube": ("kubernetes",)}


class MissingExtra(ImportError):
    """A part of monsoon that needs an extra which is not installed; ``str()`` is one line."""


def need(module: str, extra: str, what: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = e.name or module
        raise MissingExtra(f"monsoon: {what} needs the {extra!r} extra ({missing} is not installed): "
                           f"pip install 'monsoon[{extra}]'") from None
