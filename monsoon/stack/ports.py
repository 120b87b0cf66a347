"""Free 127.0.0.1 ports for a stack's ``{port:NAME}`` placeholders, and the stack's start-up error."""
from __future__ import annotations

import socket

from monsoon.spec.stack import StackSpec


def allocate_ports(spec: StackSpec) -> dict[str, int]:
    """A free 127.0.0.1 port per name; a fixed port that is taken is an error naming it."""
    ports: dict[str, int] = {}
    held: list[socket.socket] = []
    try:
        for name in spec.port_names():
            want = spec.ports.get(name, "auto")
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", 0 if want == "auto" else int(want)))
            except OSError:
                s.close()
                raise StackError(f"stack {spec.name!r}: port {want} ({name}) on 127.0.0.1 is already in use; "
                                 f"free it or set ports.{name}: auto in {spec.source}") from None
            held.append(s)  # hold until all are chosen, so no two names get the same port
            ports[name] = s.getsockname()[1]
    finally:
        for s in held:
            s.close()
    return ports


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


class StackError(RuntimeError):
    """The stack could not be started; the message says which service and why."""

    port_taken = False    # a service died at start-up because its port was taken meanwhile (start() retries)
