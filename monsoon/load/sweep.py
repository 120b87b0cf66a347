"""A size sweep's load parts: payloads padded to a size, and the bare transport's throughput at a size.

:func:`sized_payload` is the ``template`` profile with a padding string ``p`` long enough that a message of
device ``<prefix>-00000`` with a 6-digit ``seq`` is exactly ``size`` bytes (others differ by a byte or two);
no ``sent_ms``, so that 100 bytes hold the rest.

:func:`kafka_throughput` is what Spring XD's write-up set beside its framework: the Kafka client alone.  One
producer (librdkafka, ``linger.ms`` 5, ``acks=1``) sends ``size``-byte records as fast as it can for ``seconds``
into a fresh one-partition topic of the stack's broker while one consumer (assigned, no group) reads them; the
result is what the *consumer* received per second between the first record produced and the last consumed,
end to end through the broker, as a platform's messages go.  ``produced`` counts the records the broker
acknowledged (a delivery report without error); the consumer reads until it has them all, or until it has
received nothing for ``IDLE_S`` after the producer finished, or ``drain_s`` past that at the latest.  On a fast
machine the producer outruns the consumer by millions of records, so the drain is bounded by progress, not by a
fixed time from the start.  Both run
in this process: on this 2-core machine the client, the broker and the generator share the CPUs, as the
platform's load does.
"""
from __future__ import annotations

import threading
import time
import uuid
from dataclasses import asdict, dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from monsoon.load.payloads import Payload

SEQ_DIGITS = 6
IDLE_S = 2.0                # the consumer gives up after this long without a record, once the producer is done
_TEMPLATE = '{{"ts":{{ts}},"values":{{"device":"{{device}}","seq":{{seq}},"p":"{pad}"}}}}'


def sized_payload(size: int, device_prefix: str = "monsoon") -> Payload:
    """A :class:`Payload` whose messages are ``size`` bytes (for the first device, a 6-digit seq and a 13-digit
    ts); ValueError when ``size`` cannot hold the fields themselves."""
    probe = Payload("template", template=_TEMPLATE.format(pad=""))
    base = len(probe.renderer(0, f"{device_prefix}-00000")(10 ** (SEQ_DIGITS - 1), 1_700_000_000_000,
                                                                1_700_000_000_000))
    if size < base:
        raise ValueError(f"a {size}-byte message cannot hold the device, seq and times ({base} bytes)")
    return Payload("template", template=_TEMPLATE.format(pad="x" * (size - base)))


@dataclass
class TransportResult:
    size: int
    produced: int = 0               # acknowledged by the broker
    consumed: int = 0
    failed: int = 0                 # refused by the broker (a delivery report with an error)
    seconds: float = 0.0            # first produce -> last consume
    error: str | None = None

    @property
    def msg_s(self) -> float:
        return self.consumed / self.seconds if self.seconds > 0 else 0.0

    @property
    def mb_s(self) -> float:
        return self.msg_s * self.size / 1e6

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(msg_s=round(self.msg_s, 1), mb_s=round(self.mb_s, 3), seconds=round(self.seconds, 3))
        return d


def kafka_throughput(bootstrap: str, size: int, seconds: float, *, drain_s: float = 120.0,
                     stop: threading.Event | None = None) -> TransportResult:
    """Produce ``size``-byte records for ``seconds`` and consume them, through ``bootstrap`` (see the module
    docstring); the topic is deleted afterwards.  Errors end up in ``result.error``, never raised."""
    stop = stop or threading.Event()
    res = TransportResult(size)
    topic = f"monsoon-sweep-{size}-{uuid.uuid4().hex[:8]}"
    quiet = {"log_level": 0}
    admin = AdminClient({"bootstrap.servers": bootstrap, **quiet})
    try:
        admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1,
                                      config={"max.message.bytes": str(max(1_048_588, size + 1024))})])[topic].result(15)
    except KafkaException as e:
        res.error = f"cannot create topic {topic}: {e}"
        return res
    value = b"x" * size
    done_producing = threading.Event()
    t_first: list[float] = []
    t_last = [0.0]
    t_done = [0.0]
    failed: list[str] = []
    cons = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "auto.offset.reset": "earliest",
                     "enable.auto.commit": False, "fetch.max.bytes": 52_428_800, **quiet})
    cons.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])     # assigned, not subscribed: no group join

    def consume() -> None:
        idle_since = None
        while not stop.is_set():
            msgs = cons.consume(num_messages=1000, timeout=0.2)
            now = time.monotonic()
            n = sum(1 for m in msgs if m.error() is None)
            if n:
                res.consumed += n
                t_last[0] = now
                idle_since = None
            elif done_producing.is_set():
                idle_since = idle_since or now
                if res.consumed >= res.produced or now - idle_since > IDLE_S or now - t_done[0] > drain_s:
                    return

    def delivered(err, _msg) -> None:     # runs in this thread, inside poll() and flush()
        if err is None:
            res.produced += 1
        else:
            res.failed += 1
            if not failed:
                failed.append(str(err))

    prod = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 5, "compression.type": "none",
                     "queue.buffering.max.kbytes": 65536, "message.max.bytes": max(1_000_000, size + 1024), **quiet})
    reader = threading.Thread(target=consume, name="monsoon-sweep-consumer", daemon=True)
    try:
        reader.start()
        sent = 0
        t_first.append(time.monotonic())
        end = t_first[0] + seconds
        while time.monotonic() < end and not stop.is_set():
            try:
                prod.produce(topic, value, on_delivery=delivered)
                sent += 1
            except BufferError:
                prod.poll(0.005)
                continue
            if sent % 256 == 0:
                prod.poll(0)
        unacked = prod.flush(30)
        t_done[0] = time.monotonic()
        done_producing.set()
        reader.join(drain_s + 30)
        res.seconds = max(0.0, t_last[0] - t_first[0]) if res.consumed else 0.0
        problems = []
        if res.consumed < res.produced:
            problems.append(f"consumed {res.consumed:,} of {res.produced:,} produced")
        if res.failed:
            problems.append(f"{res.failed:,} records refused by the broker (first: {failed[0]})")
        if unacked:
            problems.append(f"{unacked:,} records still unacknowledged 30 s after the last was sent")
        res.error = "; ".join(problems) or None
    except KafkaException as e:
        res.error = f"{type(e).__name__}: {e}"
    finally:
        done_producing.set()
        stop_reader = reader.is_alive()
        if stop_reader:
            reader.join(5)
        cons.close()
        try:
            admin.delete_topics([topic])[topic].result(10)
        except Exception:   # a leftover topic of a stack that is about to stop
            pass
    return res
