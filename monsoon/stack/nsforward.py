"""A TCP forwarder from the host's loopback into a network namespace.

Run as ``python -m monsoon.stack.nsforward NETNS_PATH FD=HOST:PORT ...``: each FD is a listening socket its parent
bound on the host's 127.0.0.1 and passed down (so the port is known, and connections queue, before this process
runs). The process then enters the namespace with ``setns`` while it is still single-threaded, and relays every
accepted connection to HOST:PORT as the namespace sees it. It ends on SIGTERM/SIGINT.
"""
from __future__ import annotations

import asyncio
import ctypes
import os
import signal
import socket
import sys

CLONE_NEWNET = 0x40000000


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


def parse_target(arg: str) -> tuple[int, str, int]:
    """``FD=HOST:PORT`` -> (fd, host, port)."""
    fd, _, target = arg.partition("=")
    host, _, port = target.rpartition(":")
    if not fd.isdigit() or not host or not port.isdigit():
        raise ValueError(f"not FD=HOST:PORT: {arg!r}")
    return int(fd), host, int(port)


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


async def _serve(targets: list[tuple[int, str, int]]) -> None:
    def handler(host: str, port: int):
        async def relay(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                ur, uw = await asyncio.open_connection(host, port)
            except OSError:
                w.close()
                return
            await asyncio.gather(_pipe(r, uw), _pipe(ur, w))
        return relay

    servers = []
    for fd, host, port in targets:
        sock = socket.socket(fileno=fd)
        sock.setblocking(False)
        servers.append(await asyncio.start_server(handler(host, port), sock=sock))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    for s in servers:
        s.close()


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: python -m monsoon.stack.nsforward NETNS_PATH FD=HOST:PORT ...", file=sys.stderr)
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
