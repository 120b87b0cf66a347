"""The port mirror's UDP relay (monsoon.stack.nsforward.UdpRelay) on this host's loopback, without a namespace: real
sockets, a tiny UDP echo that answers with the address it saw. Each client gets its own upstream socket (its own
5-tuple, kept across datagrams) and only its own replies; an idle client's socket is closed by the sweep."""
import asyncio
import socket
import time

from monsoon.stack.nsforward import UDP_IDLE, UdpRelay


class Echo(asyncio.DatagramProtocol):
    def connection_made(self, transport):
        self.transport = transport

    def datagram_received(self, data, addr):
        self.transport.sendto(data + f"|{addr[0]}:{addr[1]}".encode(), addr)


async def _ask(sock: socket.socket, data: bytes) -> bytes:
    loop = asyncio.get_running_loop()
    await loop.sock_sendall(sock, data)
    return await asyncio.wait_for(loop.sock_recv(sock, 65536), 5)


def _client(port: int) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.setblocking(False)
    s.connect(("127.0.0.1", port))
    return s


def test_udp_relay_keeps_one_upstream_per_client_and_sweeps_idle_ones():
    async def main():
        loop = asyncio.get_running_loop()
        echo, _ = await loop.create_datagram_endpoint(Echo, local_addr=("127.0.0.1", 0))
        eport = echo.get_extra_info("sockname")[1]
        front, relay = await loop.create_datagram_endpoint(lambda: UdpRelay("127.0.0.1", eport),
                                                           local_addr=("127.0.0.1", 0))
        fport = front.get_extra_info("sockname")[1]
        a, b = _client(fport), _client(fport)
        try:
            ra1, rb1, ra2 = [await _ask(s, m) for s, m in ((a, b"a1"), (b, b"b1"), (a, b"a2"))]
            assert ra1.startswith(b"a1|") and rb1.startswith(b"b1|") and ra2.startswith(b"a2|")
            seen_a, seen_b = ra1.split(b"|")[1], rb1.split(b"|")[1]
            assert seen_a == ra2.split(b"|")[1] != seen_b         # a's upstream kept; b has its own
            assert set(relay.clients) == {a.getsockname(), b.getsockname()}
            assert relay.idle == UDP_IDLE
            # the sweep: nobody idle yet; then, as if UDP_IDLE had passed, both closed
            now = time.monotonic()
            assert relay.sweep(max(s[1][0] for s in relay.clients.values())) == 0
            assert relay.sweep(now + UDP_IDLE + 1) == 2 and relay.clients == {}
            ra3 = await _ask(a, b"a3")                           # a new upstream for a returning client
            assert ra3.startswith(b"a3|") and set(relay.clients) == {a.getsockname()}
        finally:
            a.close()
            b.close()
            relay.close()
            echo.close()
    asyncio.run(main())
