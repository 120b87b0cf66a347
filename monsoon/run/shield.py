"""Signals during a run: SIGTERM unwinds like Ctrl-C, and teardown cannot be cut short by a second one."""
from __future__ import annotations

import queue
import signal
import threading
from typing import Any

from monsoon.observe.progress import Progress
from monsoon.signals import Interrupted


class TeardownShield:
    """Teardown (the final heal and census, the stack's stop) that a second Ctrl-C or SIGTERM cannot cut short.

    ``with shield.around_exit(cm):`` runs ``cm.__exit__`` with SIGINT and SIGTERM *recorded* instead of
    raised: each one is answered with ``monsoon: still healing/stopping, please wait`` and lands in
    ``received``.  When the shield comes down, a KeyboardInterrupt naming them is raised unless one (or
    SystemExit) is already on its way, so the interruption is honoured once teardown is done.

    ``hold=True`` (an inner teardown, with an outer ``around_exit`` still to come): when the exit leaves by
    an exception, the shield stays up until the outer exit, so no signal slips in between the two.
    Signal handlers belong to the main thread: in any other thread the shield does nothing.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, say: Progress = print):
        self.say = say
        self.received: list[str] = []
        self._old: dict[int, Any] | None = None
        self._notes: queue.SimpleQueue = queue.SimpleQueue()   # put() is safe in a signal handler
        self._teller: threading.Thread | None = None

    @property
    def armed(self) -> bool:
        return self._old is not None

    def _on_signal(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        self.received.append(name)
        self._notes.put(name)   # said from a thread: the progress sink takes locks a signal handler must not

    def _tell(self) -> None:
        while (name := self._notes.get()) is not None:
            try:
                self.say(self._note(name))
            except Exception:   # safe to ignore: only a courtesy note; the signal itself is kept in self.received
                pass

    def _note(self, name: str) -> str:
        return f"monsoon: still healing/stopping, please wait ({name} received)"

    def arm(self) -> None:
        if self.armed or threading.current_thread() is not threading.main_thread():
            return
        self._old = {s: signal.signal(s, self._on_signal) for s in self.SIGNALS}   # first: the shield is up
        self._teller = threading.Thread(target=self._tell, name="teardown-shield", daemon=True)
        self._teller.start()

    def disarm(self) -> list[str]:
        """Put the previous handlers back (unless someone replaced ours meanwhile); what was received."""
        if self._old is not None:
            for s, old in self._old.items():
                if signal.getsignal(s) == self._on_signal:
                    signal.signal(s, signal.SIG_DFL if old is None else old)
            self._old = None
            self._notes.put(None)
            if self._teller is not None:
                self._teller.join(timeout=2)
                self._teller = None
        return list(self.received)

    def around_exit(self, cm: Any, *, hold: bool = False) -> "_ShieldedExit":
        return _ShieldedExit(self, cm, hold)

    def _after(self, leaving: BaseException | None, hold: bool) -> None:
        """Teardown is done: bring the shield down (or keep it up for an outer teardown) and honour signals."""
        pending = bool(self.received) and not isinstance(leaving, (KeyboardInterrupt, SystemExit))
        if not hold or (leaving is None and not pending):
            self.disarm()   # else an exception goes on to the outer teardown, which brings the shield down
        if pending:
            what = ", ".join(dict.fromkeys(self.received))
            raise Interrupted(self.received[0], f"monsoon: received {what} during teardown; stopped once it "
                                                f"was done") from leaving


class _ShieldedExit:
    def __init__(self, shield: TeardownShield, cm: Any, hold: bool):
        self.shield, self.cm, self.hold = shield, cm, hold

    def __enter__(self) -> Any:
        return self.cm.__enter__()

    def __exit__(self, et, ev, tb) -> bool:
        self.shield.arm()
        try:
            suppress = bool(self.cm.__exit__(et, ev, tb))
        except BaseException as e:
            self.shield._after(e, self.hold)
            raise
        self.shield._after(None if suppress or et is None else ev, self.hold)
        return suppress


def sigterm_as_interrupt(who: str = "monsoon") -> None:
    """From now on SIGTERM raises KeyboardInterrupt (in the main thread), so a terminated session unwinds like
    Ctrl-C: every fault heals, every process stops, the run directory stays analysable. During that teardown
    (final heal, census, stack stop) :class:`TeardownShield` holds further SIGINT/SIGTERM back. Does nothing
    outside the main thread (signal handlers belong to it)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def on_term(signum: int, frame: Any) -> None:
        raise Interrupted(signal.Signals(signum).name, f"{who}: received {signal.Signals(signum).name}")
    signal.signal(signal.SIGTERM, on_term)


class FinishFirst(TeardownShield):
    """Work that should finish despite one signal (the checks of a run that is otherwise done): the first
    SIGINT/SIGTERM is recorded in ``received`` and answered with ``message``, and the work goes on; a second
    one (or the first, when ``already`` says the run was interrupted before) raises at once. Does nothing
    outside the main thread."""

    def __init__(self, say: Progress = print, message: str = "finishing the checks", already: bool = False):
        super().__init__(say)
        self.message, self.already = message, already

    def _note(self, name: str) -> str:
        return f"monsoon: {name} received: {self.message} (a second signal stops at once)"

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.already or self.received:
            name = signal.Signals(signum).name
            raise Interrupted(name, f"monsoon: received {name} again: stopped at once")
        super()._on_signal(signum, frame)

    def __enter__(self) -> "FinishFirst":
        self.arm()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.disarm()
