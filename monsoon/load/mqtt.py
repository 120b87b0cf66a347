"""The in-process MQTT engine: :class:`MqttFleet`, one paho-mqtt client per device, every socket driven by one
``selectors`` loop **in the thread that calls connect()/run()/close()** (no thread of its own). Messages come
off the shared schedule (:class:`~monsoon.load.base.PacedFleet`); a client the broker dropped is reconnected
with a fresh client (its in-flight messages counted ``lost_in_flight``). Accounting:
``scheduled == sent + failed + dropped`` and, for QoS 1, ``sent == acked + unacked``.
"""
from __future__ import annotations

import errno
import json
import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import paho.mqtt
import paho.mqtt.client as mqtt

from monsoon.load.base import FleetOptions, PacedFleet
from monsoon.load.stats import FleetConnectError, FleetTotals, SecondStats
from monsoon.stack.provision import Device


__all__ = ["MqttFleet"]

log = logging.getLogger("monsoon.load")


# --------------------------------------------------------------------------
# paho client with a lean hot path
# --------------------------------------------------------------------------

_PUBLISH = 0x30


class _NoInfo:
    """Stands in for paho's MQTTMessageInfo on QoS0 packets (paho marks it
    published after the write; nobody waits on it here)."""

    rc = 0

    def _set_as_published(self) -> None:
        pass


_NO_INFO: Any = _NoInfo()     # where paho types an MQTTMessageInfo


def _fleet_client_class() -> type:
    """A paho ``Client`` subclass whose per-message path skips paho's
    bookkeeping we do not use (the fleet keeps its own mid -> message map).

    Stock paho 2.2 allocates an ``MQTTMessage`` + ``threading.Condition`` per
    publish and ``Properties`` + ``ReasonCode`` objects per PUBACK even for
    MQTT 3.1.1, and reads only one packet per ``loop_read`` when it tracks no
    messages. That roughly doubles the CPU per message. This subclass relies
    on paho 2.2 internals (``_packet_queue``, ``_mid_generate``,
    ``_packet_read``, ``_loop_rc_handle``, ``_in_packet``), hence the version
    pin (requirements.txt pins paho-mqtt==2.2.0).
    """

    if not paho.mqtt.__version__.startswith("2.2."):
        raise RuntimeError(
            f"monsoon.load needs paho-mqtt 2.2.x (uses its internals), found {paho.mqtt.__version__}"
        )
    ok = mqtt.MQTTErrorCode.MQTT_ERR_SUCCESS
    again = mqtt.MQTTErrorCode.MQTT_ERR_AGAIN
    no_conn = mqtt.MQTTErrorCode.MQTT_ERR_NO_CONN

    class FleetClient(mqtt.Client):
        fleet_on_ack: Callable[[int], None]
        _rbuf: bytes = b""
        _rpos: int = 0
        _rdrained: bool = False

        def _sock_recv(self, bufsize: int) -> bytes:
            # paho reads a packet in 3+ tiny recv() calls (command byte,
            # length bytes, body); serve them from one 64 KiB recv instead.
            pos = self._rpos
            buf = self._rbuf
            if pos >= len(buf):
                if self._rdrained:
                    # the last recv did not fill the buffer: the socket is
                    # (almost certainly) empty; save the EAGAIN syscall. If
                    # more arrived, the level-triggered selector reports it.
                    self._rdrained = False
                    raise BlockingIOError
                sock = self._sock
                if sock is None:
                    raise ConnectionError("self._sock is None")
                buf = sock.recv(65536)
                if not buf:
                    return buf
                self._rdrained = len(buf) < 65536
                self._rbuf = buf
                pos = 0
            end = pos + bufsize
            self._rpos = end
            return buf[pos:end]

        def fleet_publish(self, topic16: bytes, payload: bytes, qos: int) -> tuple[int, int]:
            """Queue (and, with no loop thread, write right away) one PUBLISH.
            ``topic16`` is the length-prefixed topic. Returns (rc, mid)."""
            if self._sock is None:
                return no_conn, 0
            if qos:
                mid = self._mid_generate()
                body = topic16 + mid.to_bytes(2, "big") + payload
            else:
                mid = 0
                body = topic16 + payload
            n = len(body)
            if n < 128:
                head = bytes((_PUBLISH | (qos << 1), n))
            elif n < 16384:
                head = bytes((_PUBLISH | (qos << 1), (n & 0x7F) | 0x80, n >> 7))
            else:
                packet = bytearray((_PUBLISH | (qos << 1),))
                self._pack_remaining_length(packet, n)
                head = bytes(packet)
            return self._packet_queue(_PUBLISH, head + body, mid, qos, _NO_INFO), mid

        def _handle_pubackcomp(self, cmd):
            if cmd == "PUBACK" and self._protocol != mqtt.MQTTv5:
                pkt = self._in_packet["packet"]
                self.fleet_on_ack((pkt[0] << 8) | pkt[1])
                return ok
            return super()._handle_pubackcomp(cmd)

        def loop_read(self, max_packets: int = 1):
            # read everything available (bounded), not one packet per call
            for _ in range(4096):
                if self._sock is None:
                    return no_conn
                rc = self._packet_read()
                if rc > 0:
                    return self._loop_rc_handle(rc)
                if rc == again:
                    return ok
            return ok

    return FleetClient


# --------------------------------------------------------------------------
# The fleet
# --------------------------------------------------------------------------


class _Conn:
    """One device: its current paho client (a fresh one per connection, so
    paho never re-sends an in-flight message of a dead connection) and its
    sequence state, which survives reconnects."""

    __slots__ = (
        "idx", "device", "name_json", "client", "sock", "connected", "want_w",
        "next_seq", "last_ts", "pending", "retry_at", "backoff", "refused",
        "connect_error", "render",
    )

    def __init__(self, idx: int, device: Device) -> None:

        self.idx = idx
        self.device = device
        self.name_json = json.dumps(device.name)
        self.client: Any = None
        self.sock: socket.socket | None = None
        self.connected = False
        self.want_w = False
        self.next_seq = 0
        self.last_ts = -1
        self.pending: dict[int, tuple[int, float, int]] = {}  # mid -> (seq, intended, ts)
        self.retry_at: float | None = None
        self.backoff = MqttFleet.BACKOFF_MIN
        self.refused: str | None = None
        self.connect_error: str | None = None
        # render(seq, ts_ms, sent_ms) -> payload bytes (monsoon.load.payloads), set by the fleet
        self.render: Callable[[int, int, int], bytes] | None = None


class MqttFleet(PacedFleet):
    """A fleet of MQTT devices publishing an open-model load.

    Threading: the fleet starts **no threads**. ``connect()``, ``run()`` and
    ``close()`` drive every client socket from the calling thread with one
    ``selectors`` loop; ``on_second`` is called from the thread running
    ``run()``. ``close()`` may be called from another thread while ``run()``
    is active: it asks the loop to stop and waits for it before tearing down.

    Between ``connect()`` and ``run()`` nobody services the sockets; that is
    fine for gaps well below the keepalive (a client the broker dropped is
    reconnected by ``run()``).
    """

    BACKOFF_MIN = 0.2
    BACKOFF_MAX = 2.0
    MISC_INTERVAL = 0.2

    def __init__(self, devices: list[Device], host: str, port: int, options: FleetOptions | None = None,
                 **fields: Any) -> None:
        super().__init__(devices, host, port, options, **fields)
        self._conns = [_Conn(i, d) for i, d in enumerate(self.devices)]
        # what each device publishes (default: the minimal payload); every payload carries the
        # device, its per-device ``seq`` and the intended send time ``ts``
        for conn in self._conns:
            conn.render = self.payload.renderer(conn.idx, conn.device.name)
        self._client_cls = _fleet_client_class()
        topic = self.topic
        tb = topic.encode()
        if not tb or "+" in topic or "#" in topic or len(tb) > 65535:
            raise ValueError(f"invalid publish topic {topic!r}")
        self._topic16 = len(tb).to_bytes(2, "big") + tb
        self._sel: selectors.BaseSelector | None = None
        self._inflight = 0
        self._reconnects = 0
        self._lost_in_flight = 0
        self._connected_once = False

    def _ready(self) -> bool:
        return self._connected_once

    # ------------------------------------------------------------ callbacks
    def _on_socket_open(self, client: Any, conn: _Conn, sock: socket.socket) -> None:
        conn.sock = sock
        conn.want_w = False
        assert self._sel is not None
        self._sel.register(sock, selectors.EVENT_READ, conn)

    def _on_socket_close(self, client: Any, conn: _Conn, sock: socket.socket) -> None:
        if self._sel is not None:
            try:
                self._sel.unregister(sock)
            except (KeyError, ValueError):
                pass
        if conn.sock is sock:
            conn.sock = None
            conn.want_w = False

    def _on_connect(self, client: Any, conn: _Conn, flags: Any, rc: Any, props: Any) -> None:
        if client is not conn.client:
            return
        if rc.is_failure:
            conn.refused = str(rc)
            log.debug("device %s: CONNACK refused: %s", conn.device.name, rc)
            return
        conn.refused = None
        conn.connect_error = None
        if not conn.connected:
            conn.connected = True
            self._n_connected += 1
        conn.backoff = self.BACKOFF_MIN
        conn.retry_at = None

    def _on_disconnect(self, client: Any, conn: _Conn, flags: Any, rc: Any, props: Any) -> None:
        if client is not conn.client:
            return
        if conn.connected:
            conn.connected = False
            self._n_connected -= 1
        lost = len(conn.pending)
        if lost:
            # in flight on a dead connection: never acked (a fresh client is
            # used for the next connection, so paho will not re-send them)
            self._inflight -= lost
            self._lost_in_flight += lost
            conn.pending.clear()
        conn.client = None
        if not self._closing:
            now = self._clock()
            conn.retry_at = now + conn.backoff
            conn.backoff = min(conn.backoff * 2, self.BACKOFF_MAX)
        log.debug("device %s disconnected (%s), %d in flight lost", conn.device.name, rc, lost)

    def _on_ack(self, conn: _Conn, mid: int) -> None:
        rec = conn.pending.pop(mid, None)
        if rec is None:
            return
        seq, intended, ts = rec
        self._inflight -= 1
        self._record_ack(conn.device.name, seq, intended, ts, self._clock())

    # ------------------------------------------------------------- sockets
    def _open(self, conn: _Conn) -> None:
        """Start one connection attempt (blocking TCP connect, then CONNECT is
        sent; the CONNACK arrives through the event loop). Never raises:
        failures are recorded in ``conn.connect_error`` and retried later."""

        client = self._client_cls(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=conn.device.name,
            clean_session=True,
            userdata=conn,
            protocol=mqtt.MQTTv311,
        )
        client.username_pw_set(conn.device.token, getattr(conn.device, "password", None))
        client.max_inflight_messages_set(0)  # 0 = unlimited: no hidden queueing in paho
        client.max_queued_messages_set(0)
        client.connect_timeout = 5.0
        client.on_socket_open = self._on_socket_open
        client.on_socket_close = self._on_socket_close
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.fleet_on_ack = lambda mid, conn=conn: self._on_ack(conn, mid)
        conn.client = client
        conn.refused = None
        try:
            client.connect(self.host, self.port, keepalive=self.keepalive)
        except OSError as e:
            conn.client = None
            if isinstance(e, ConnectionRefusedError) or e.errno == errno.ECONNREFUSED:
                conn.connect_error = "nothing listening (connection refused)"
            elif isinstance(e, (socket.timeout, TimeoutError)):
                conn.connect_error = "connect timed out"
            else:
                conn.connect_error = f"{type(e).__name__}: {e}"
            if client.socket() is not None:  # pragma: no cover - defensive
                client._sock_close()
            now = self._clock()
            conn.retry_at = now + conn.backoff
            conn.backoff = min(conn.backoff * 2, self.BACKOFF_MAX)

    def _poll(self, timeout: float) -> None:
        assert self._sel is not None
        if not self._sel.get_map():
            if timeout > 0:
                time.sleep(timeout)
            return
        for key, mask in self._sel.select(timeout):
            conn: _Conn = key.data
            client = conn.client
            if client is None or conn.sock is not key.fileobj:
                continue
            if mask & selectors.EVENT_READ:
                client.loop_read()
            if mask & selectors.EVENT_WRITE and conn.client is client and conn.sock is not None:
                client.loop_write()
                if conn.sock is not None and not client.want_write():
                    conn.want_w = False
                    self._sel.modify(conn.sock, selectors.EVENT_READ, conn)

    def _misc(self, now: float, reconnect: bool = True) -> None:
        for conn in self._conns:
            client = conn.client
            if client is not None:
                client.loop_misc()
            elif reconnect and conn.retry_at is not None and now >= conn.retry_at:
                self._reconnects += 1
                self._open(conn)

    def _want_write(self, conn: _Conn) -> None:
        if not conn.want_w and conn.sock is not None and conn.client.want_write():
            conn.want_w = True
            assert self._sel is not None
            self._sel.modify(conn.sock, selectors.EVENT_READ | selectors.EVENT_WRITE, conn)

    # -------------------------------------------------------------- connect
    def connect(self, timeout: float = 30) -> None:
        """Connect every device; returns when all have a successful CONNACK.

        Raises :class:`FleetConnectError` (and leaves nothing open) when a
        device cannot connect: nothing listening, CONNACK refused, or not all
        connected within ``timeout`` seconds.
        """
        self._check_open()
        if self._sel is None:
            self._sel = selectors.DefaultSelector()
        deadline = self._clock() + timeout
        try:
            for conn in self._conns:
                if conn.client is None:
                    self._open(conn)
                    if conn.connect_error is not None:
                        raise FleetConnectError(
                            f"MQTT broker {self.endpoint}: device {conn.device.name} "
                            f"cannot connect: {conn.connect_error}"
                        )
                # keep CONNACKs flowing while we open the rest
                self._poll(0)
                self._check_refused()
            while self._n_connected < len(self._conns):
                now = self._clock()
                if now >= deadline:
                    missing = [c.device.name for c in self._conns if not c.connected]
                    raise FleetConnectError(
                        f"MQTT broker {self.endpoint}: {len(missing)} of {len(self._conns)} "
                        f"devices not connected after {timeout:g}s (first: {missing[0]})"
                    )
                self._poll(min(0.05, deadline - now))
                self._check_refused()
                for conn in self._conns:
                    if conn.client is None and not conn.connected:
                        raise FleetConnectError(
                            f"MQTT broker {self.endpoint}: device {conn.device.name} "
                            f"lost its connection before CONNACK"
                            + (f": {conn.connect_error}" if conn.connect_error else "")
                        )
        except BaseException:
            self._disconnect_all()
            raise
        self._connected_once = True

    def _check_refused(self) -> None:
        for conn in self._conns:
            if conn.refused is not None:
                raise FleetConnectError(
                    f"MQTT broker {self.endpoint} refused device {conn.device.name}: "
                    f"CONNACK {conn.refused}"
                )

    # ------------------------------------------------------------------ run
    def _send(self, k: int, intended: float) -> bool:
        conn = self._conns[k % len(self._conns)]
        if not conn.connected:
            return False
        client = conn.client
        seq = conn.next_seq
        conn.next_seq = seq + 1
        ts = self._stamp(conn, intended)
        sent_ms = int(self._wall() * 1000)
        assert conn.render is not None     # MqttFleet.__init__ sets every conn's
        payload = conn.render(seq, ts, sent_ms)
        rc, mid = client.fleet_publish(self._topic16, payload, self.qos)
        if rc != 0:
            return False
        if self.qos:
            pending = conn.pending
            if mid in pending:
                # 65535 mids later the old message is still un-acked: it can
                # no longer be told apart, so it is lost for the accounting
                self._inflight -= 1
                self._lost_in_flight += 1
            pending[mid] = (seq, intended, ts)
            self._inflight += 1
        else:
            self._acked += 1
            self._acked_rows.append((conn.device.name, seq, ts, sent_ms))
        if not conn.want_w and conn.sock is not None and client.want_write():
            self._want_write(conn)
        return True

    def _run(
        self, stop: threading.Event, on_second: Callable[[SecondStats], None] | None
    ) -> FleetTotals:
        clock = self._clock
        pacer, targets = self._start_pacing()
        t0 = self._t0
        next_misc = t0 + self.MISC_INTERVAL
        tick = self._ticker(targets, lambda: (pacer.scheduled, pacer.sent, self._acked, pacer.failed, pacer.late),
                            on_second)

        send = self._send
        try:
            # --- load phase
            while True:
                now = clock()
                if stop.is_set() or self._closing:
                    pacer.stop(now)
                    break
                tick.catch_up(now)
                if now >= next_misc:
                    self._misc(now)
                    next_misc = now + self.MISC_INTERVAL
                pacer.pump(now, send, self.MAX_BATCH)
                if pacer.exhausted:
                    break
                nd = pacer.next_due
                assert nd is not None
                wake = min(nd, tick.next_at, next_misc)
                self._poll(max(0.0, wake - clock()))
            # --- drain: wait for PUBACKs of what is in flight
            deadline = clock() + self.drain_timeout_s
            while self._inflight > 0 and not self._closing:
                now = clock()
                if now >= deadline:
                    break
                tick.catch_up(now)
                if now >= next_misc:
                    self._misc(now, reconnect=False)
                    next_misc = now + self.MISC_INTERVAL
                self._poll(max(0.0, min(deadline, tick.next_at, next_misc) - clock()))
            # --- final (partial) second, so per-second sums equal the totals
            now = clock()
            tick.finish(now)
            elapsed = clock() - t0
        finally:
            self._close_writers()

        p50, p99, mx = self._latency_ms()
        sent = pacer.sent
        return FleetTotals(
            scheduled=pacer.scheduled,
            sent=sent,
            acked=self._acked,
            failed=pacer.failed,
            late=pacer.late,
            dropped=pacer.dropped,
            unacked=sent - self._acked,
            last_seq={c.device.name: c.next_seq - 1 for c in self._conns},
            p50_ms=p50,
            p99_ms=p99,
            max_ms=mx,
            reconnects=self._reconnects,
            elapsed_s=elapsed,
            lost_in_flight=self._lost_in_flight,
        )

    # ---------------------------------------------------------------- close
    def _disconnect_all(self, grace: float = 1.0) -> None:
        """Send DISCONNECT on every live connection, then make sure every
        socket is closed and the selector is gone."""
        prev_closing = self._closing
        self._closing = True  # no reconnect scheduling from callbacks
        try:
            for conn in self._conns:
                client = conn.client
                if client is None:
                    continue
                try:
                    client.disconnect()  # writes DISCONNECT and closes when it can
                except Exception:  # best effort
                    log.debug("disconnect of %s failed", conn.device.name, exc_info=True)
            deadline = time.monotonic() + grace
            while any(c.sock is not None for c in self._conns) and time.monotonic() < deadline:
                if self._sel is None:
                    break
                self._poll(0.02)
            for conn in self._conns:
                client = conn.client
                if client is not None and client.socket() is not None:
                    client._sock_close()  # force: paho has no public close
                conn.client = None
                conn.sock = None
                if conn.connected:
                    conn.connected = False
                    self._n_connected -= 1
                conn.pending.clear()
        finally:
            self._closing = prev_closing
            if self._sel is not None:
                self._sel.close()
                self._sel = None
            self._connected_once = False

    def _teardown(self) -> None:
        """Disconnect every device, close every socket."""
        if self._sel is not None:
            self._closing = False
            self._disconnect_all()
