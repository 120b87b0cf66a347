"""The interrupt monsoon raises for a signal: a KeyboardInterrupt that remembers which signal it was.

SIGTERM (and a signal received while teardown was shielded) raises :class:`Interrupted`, so a terminated
session unwinds like Ctrl-C and still knows, when it writes its checklist, what stopped it. A plain
KeyboardInterrupt is Python's own answer to SIGINT."""
from __future__ import annotations


class Interrupted(KeyboardInterrupt):
    def __init__(self, signal: str, message: str | None = None):
        super().__init__(message or f"monsoon: received {signal}")
        self.signal = signal


def signal_of(exc: BaseException) -> str:
    """The signal behind an interrupt: ``SIGTERM`` for monsoon's own, ``SIGINT`` for Python's KeyboardInterrupt."""
    return getattr(exc, "signal", None) or "SIGINT"
