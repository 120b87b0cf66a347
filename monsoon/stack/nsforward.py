"""A TCP and UDP forwarder from the host's loopback into a network namespace.

Run as ``python -m monsoon.stack.nsforward NETNS_PATH FD=HOST:PORT FD=udp:HOST:PORT ...``: each FD is a socket its
parent bound on the host's 127.0.0.1 and passed down (so the port is known, and connections or datagrams queue,
before this process runs). The process then enters the namespace with ``setns`` while it is still single-threaded,
and relays to HOST:PORT as the namespace sees it: ``FD=HOST:PORT``, a listening TCP socket, every accepted
connection; ``FD=udp:HOST:PORT``, a bound UDP socket, every datagram, through one connected upstream UDP socket per
client address (each client keeps its own 5-tuple upstream, e.g. a device's DTLS session, and the replies on that
socket go back to that client); a client's socket is closed after :data:`UDP_IDLE` seconds with no datagram either
way. It ends on SIGTERM/SIGINT.
"""
from __future__ import annotations

import asyncio
import ctypes
import functools
import os
import signal
import socket
import sys
import time

CLONE_NEWNET = 0x40000000
UDP = "udp"
UDP_IDLE = 300.0            # seconds without a datagram either way before a UDP client's upstream socket is closed


def enter_netns(path: str) -> None:
    """Move this (single-threaded) process into the network namespace bound at ``path``."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns({path}): {os.strerror(err)}")
    finally:
        os.close(fd)


def format_target(fd: int, host: str, port: int, proto: str = "tcp") -> str:
    """(fd, host, port, protocol) -> the argument :func:`parse_target` reads: ``FD=HOST:PORT`` (TCP) or
    ``FD=udp:HOST:PORT``."""
    if proto not in ("tcp", UDP):
        raise ValueError(f"protocol {proto!r}: tcp or udp")
    return f"{fd}={'udp:' if proto == UDP else ''}{host}:{port}"


def parse_target(arg: str) -> tuple[int, str, int, str]:
    """``FD=HOST:PORT`` -> (fd, host, port, "tcp"); ``FD=udp:HOST:PORT`` -> (fd, host, port, "udp")."""
    fd, _, target = arg.partition("=")
    proto = UDP if target.startswith("udp:") else "tcp"
    host, _, port = target.removeprefix("udp:").rpartition(":")
    if not fd.isdigit() or not host or not port.isdigit():
        raise ValueError(f"not FD=HOST:PORT or FD=udp:HOST:PORT: {arg!r}")
    return int(fd), host, int(port), proto


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass


class UdpRelay(asyncio.DatagramProtocol):
    """One bound UDP socket's datagrams to ``host:port``: per client address a connected upstream socket (made on
    its first datagram), whose replies go back to that client from the bound socket; idle ones closed by
    :meth:`sweep`."""

    def __init__(self, host: str, port: int, idle: float = UDP_IDLE):
        self.host, self.port, self.idle = host, port, idle
        self.front: asyncio.DatagramTransport | None = None
        self.clients: dict[tuple, tuple[socket.socket, list[float]]] = {}    # address -> (upstream, [last seen])

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.front = transport  # type: ignore[assignment]

    def datagram_received(self, data: bytes, addr: tuple) -> None:
        entry = self.clients.get(addr)
        if entry is None:
            try:
                up = socket.socket(socket.AF_INET6 if ":" in self.host else socket.AF_INET, socket.SOCK_DGRAM)
                up.setblocking(False)
                up.connect((self.host, self.port))
            except OSError:
                return          # no route now: the datagram is lost, as UDP may lose it; the next one tries again
            entry = self.clients[addr] = (up, [time.monotonic()])
            asyncio.get_running_loop().add_reader(up.fileno(), self._replies, addr, up, entry[1])
        up, seen = entry
        seen[0] = time.monotonic()
        try:
            up.send(data)
        except OSError:         # full buffer, or the ICMP error of an earlier datagram: UDP's loss
            pass

    def _replies(self, addr: tuple, up: socket.socket, seen: list[float]) -> None:
        while True:
            try:
                data = up.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:     # ECONNREFUSED (nobody on the target port): read, and the socket stays
                return
            seen[0] = time.monotonic()
            if self.front is not None:
                self.front.sendto(data, addr)

    def drop(self, addr: tuple) -> None:
        up, _ = self.clients.pop(addr)
        asyncio.get_running_loop().remove_reader(up.fileno())
        up.close()

    def sweep(self, now: float) -> int:
        """Close the upstream sockets of clients idle for ``idle`` seconds; how many."""
        old = [a for a, (_, seen) in self.clients.items() if now - seen[0] >= self.idle]
        for a in old:
            self.drop(a)
        return len(old)

    def close(self) -> None:
        for a in list(self.clients):
            self.drop(a)
        if self.front is not None:
            self.front.close()


async def _sweep(relays: list[UdpRelay]) -> None:
    while True:
        await asyncio.sleep(min([r.idle for r in relays] + [UDP_IDLE]) / 10)
        for r in relays:
            r.sweep(time.monotonic())


async def _serve(targets: list[tuple[int, str, int, str]]) -> None:
    def handler(host: str, port: int):
        async def relay(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                ur, uw = await asyncio.open_connection(host, port)
            except OSError:
                w.close()
                return
            await asyncio.gather(_pipe(r, uw), _pipe(ur, w))
        return relay

    loop = asyncio.get_running_loop()
    servers = []
    relays: list[UdpRelay] = []
    for fd, host, port, proto in targets:
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        if proto == UDP:
            _, relay = await loop.create_datagram_endpoint(functools.partial(UdpRelay, host, port), sock=sock)
            relays.append(relay)
        else:
            servers.append(await asyncio.start_server(handler(host, port), sock=sock))
    sweeper = loop.create_task(_sweep(relays)) if relays else None
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    if sweeper is not None:
        sweeper.cancel()
    for s in servers:
        s.close()
    for r in relays:
        r.close()


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m monsoon.stack.nsforward NETNS_PATH FD=HOST:PORT|FD=udp:HOST:PORT ...", file=sys.stderr)
        return 2
    try:
        targets = [parse_target(a) for a in argv[1:]]
        enter_netns(argv[0])        # before any thread exists: asyncio starts none until a lookup needs one
    except (OSError, ValueError) as e:
        print(f"monsoon nsforward: {e}", file=sys.stderr)
        return 1
    asyncio.run(_serve(targets))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
