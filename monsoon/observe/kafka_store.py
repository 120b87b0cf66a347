"""``storage.kind: kafka``: a platform whose storage is a topic (Hono's ``hono.telemetry.<tenant>`` and
``hono.event.<tenant>``): what reached the topics is what was stored.

* :class:`KafkaSource` reads every record of ``storage.topics`` from the start of each partition to its end
  (the high watermark when the read-back starts) into the run's ``stored`` dataset: ``device`` and ``seq`` from
  the JSON payload monsoon's devices send (``{"ts": .., "values": {"device": .., "seq": .., ..}}``; the record's
  ``device_id`` header when the payload has no device), ``stored_ms`` = the record's timestamp. It is the
  consumer-group-free twin of the backend below: it receives what the business application received.
* ``python -m monsoon.observe.kafka_store backend`` is the northbound "backend simulator" of a stack: the business
  application consuming those topics as a consumer group, committing as it goes, so a flood becomes its lag
  (``observe.kafka``) and the drain waits for it. It prints ``consuming`` once it is subscribed.
  With ``--commands`` it also answers command queries, as Hono's example application does: a telemetry or event
  record with a ``ttd`` header > 0 (a device waiting that many seconds for a command) gets a request/response
  command on ``hono.command.<tenant>`` (key and ``device_id`` = the record's ``device_id``, ``subject``
  ``monsoon``, ``response-required: true``, a ``correlation-id``); it consumes ``hono.command_response.<tenant>``
  and counts the responses by their ``status`` header.
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from monsoon.timeline.columnar import write_rows

COLUMNS = ("device", "seq", "stored_ms")


def parse_record(value: bytes | None, headers: Iterable[tuple[str, bytes]] | None,
                 device_header: str = "device_id") -> tuple[str, int] | None:
    """(device, seq) of one record, or None when it carries no monsoon sequence number (another
    application's message, an empty event such as Hono's ``ttd`` notifications)."""
    if not value:
        return None
    try:
        doc = json.loads(value)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(doc, dict):
        return None
    values = doc.get("values")
    values = values if isinstance(values, dict) else doc
    seq = values.get("seq")
    if isinstance(seq, bool) or not isinstance(seq, (int, float, str)):
        return None
    try:
        seq = int(seq)
    except ValueError:
        return None
    device = values.get("device")
    if not isinstance(device, str):
        device = next((v.decode(errors="replace") for k, v in (headers or ()) if k == device_header and v), None)
    return None if device is None else (device, seq)


class KafkaSource:
    """Exports every record of ``topics`` (names; partitions found from the brokers) to the stored dataset."""

    def __init__(self, bootstrap: str, topics: Iterable[str], *, device_header: str = "device_id",
                 timeout: float = 30.0):
        self.bootstrap, self.topics = bootstrap, tuple(topics)
        self.device_header, self.timeout = device_header, timeout

    def _consumer(self):
        return Consumer({"bootstrap.servers": self.bootstrap, "group.id": "monsoon-readback",
                         "enable.auto.commit": False, "enable.partition.eof": True,
                         "auto.offset.reset": "earliest", "socket.timeout.ms": 10000})

    def _partitions(self, consumer) -> list:
        md = consumer.list_topics(timeout=self.timeout)
        out: list = []
        for t in self.topics:
            if t in md.topics and md.topics[t].error is None:    # a topic nothing reached yet: no records
                out.extend(TopicPartition(t, p) for p in md.topics[t].partitions)
        return out

    def rows(self) -> Iterator[tuple[str, int, int | None]]:
        """(device, seq, stored_ms) of every record up to each partition's end when the read starts."""
        consumer = self._consumer()
        try:
            parts = self._partitions(consumer)
            ends = {}
            for tp in parts:
                lo, hi = consumer.get_watermark_offsets(tp, timeout=self.timeout)
                if hi > lo:
                    ends[(tp.topic, tp.partition)] = hi
            if not ends:
                return
            consumer.assign([TopicPartition(t, p, OFFSET_BEGINNING) for t, p in ends])
            left, idle_since = dict(ends), time.monotonic()
            while left:
                msgs = consumer.consume(10000, timeout=1.0)
                if not msgs and time.monotonic() - idle_since > self.timeout:
                    raise RuntimeError(f"Kafka read-back from {self.bootstrap} stalled: {sorted(left)} unread "
                                       f"after {self.timeout:.0f} s")
                for m in msgs:
                    idle_since = time.monotonic()
                    key = (m.topic(), m.partition())
                    if m.error():
                        if m.error().code() == KafkaError._PARTITION_EOF:
                            left.pop(key, None)
                            continue
                        raise RuntimeError(f"Kafka read-back from {self.bootstrap}: {m.error()}")
                    if key not in left or m.offset() >= left[key]:
                        continue
                    rec = parse_record(m.value(), m.headers(), self.device_header)
                    if rec is not None:
                        ts_type, ts = m.timestamp()
                        yield rec[0], rec[1], ts if ts_type and ts > 0 else None
                    if m.offset() + 1 >= left[key]:
                        left.pop(key)
        finally:
            consumer.close()

    def export(self, path: Path) -> int:
        return write_rows(path, COLUMNS, self.rows())

    def check(self) -> None:
        """The brokers answer (topics that do not exist yet are fine: Hono creates them on the first message)."""
        try:
            AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=min(self.timeout, 10))
        except Exception as e:   # KafkaException: one line, not a traceback
            raise ValueError(f"Kafka at {self.bootstrap} does not answer: {e}") from None


COMMAND_SUBJECT = "monsoon"
RESPONSE_TOPICS = r"^hono\.command_response\..*"


def header(headers: Any, name: str) -> str | None:
    """The first value of Kafka header ``name`` as text (Hono writes strings as they are, the rest as JSON)."""
    for k, v in headers or ():
        if k == name and v is not None:
            return v.decode(errors="replace") if isinstance(v, bytes) else str(v)
    return None


def command_for(topic: str, headers: Any,
                n: int) -> tuple[str, str, list[tuple[str, str | bytes | None]], bytes] | None:
    """The request/response command answering a command query, or None when the record is not one: a record of
    ``hono.telemetry.<tenant>`` / ``hono.event.<tenant>`` whose ``ttd`` header is a number > 0 and which names
    its ``device_id``. Returns (command topic, key, headers, value); ``n`` makes the correlation id unique."""
    parts = topic.split(".", 2)
    if len(parts) != 3 or parts[0] != "hono" or parts[1] not in ("telemetry", "event"):
        return None
    ttd, device = header(headers, "ttd"), header(headers, "device_id")
    try:
        if device is None or ttd is None or int(ttd) <= 0:
            return None
    except ValueError:
        return None
    corr = f"{device}-{n}"
    hdrs: list[tuple[str, str | bytes | None]] = [("device_id", device.encode()), ("subject", COMMAND_SUBJECT.encode()),
            ("correlation-id", corr.encode()), ("response-required", b"true"),
            ("content-type", b"application/json")]
    return f"hono.command.{parts[2]}", device, hdrs, json.dumps({"corr": corr}).encode()


def backend(bootstrap: str, group: str, topics: list[str], stop_after: float | None = None,
            commands: bool = False) -> int:
    """The business application: consume ``topics`` (names, or ``^regex``) as ``group`` until SIGTERM/SIGINT,
    committing offsets automatically; prints ``consuming`` once subscribed and, every 10 s, what it received.
    ``commands``: answer every command query with a command (:func:`command_for`) and consume the command
    responses."""
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(1))
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": True, "auto.commit.interval.ms": 1000,
                         "fetch.wait.max.ms": 10,
                         "topic.metadata.refresh.interval.ms": 1000})   # a tenant's topic appears on its first message
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0}) if commands else None
    consumer.subscribe(topics + ([RESPONSE_TOPICS] if commands else []))
    print("consuming", flush=True)
    received, sent, responses, last, t0 = 0, 0, 0, time.monotonic(), time.monotonic()
    statuses: dict[str, int] = {}
    try:
        while not stop and (stop_after is None or time.monotonic() - t0 < stop_after):
            first = consumer.poll(0.1)     # as soon as a record is there (a command query waits on us)
            msgs = [] if first is None else [first] + consumer.consume(5000, timeout=0)
            for m in msgs:
                if m.error() is not None:
                    continue
                topic = m.topic() or ""
                if topic.startswith("hono.command_response."):
                    responses += 1
                    st = header(m.headers(), "status") or "?"
                    statuses[st] = statuses.get(st, 0) + 1
                    continue
                received += 1
                if producer is not None:
                    cmd = command_for(topic, m.headers(), sent)
                    if cmd is not None:
                        producer.produce(cmd[0], key=cmd[1], value=cmd[3], headers=cmd[2])
                        sent += 1
            if producer is not None:
                producer.poll(0)
            if time.monotonic() - last >= 10:
                last = time.monotonic()
                print(f"received {received}" + (f", commands {sent}, responses {responses} {statuses}"
                                                 if commands else ""), flush=True)
    finally:
        consumer.close()   # commits the last offsets
        if producer is not None:
            producer.flush(5)
    print(f"received {received}" + (f", commands {sent}, responses {responses} {statuses}" if commands else "")
          + ", stopped", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m monsoon.observe.kafka_store")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("backend", help="consume topics as a consumer group (a platform's northbound application)")
    b.add_argument("--bootstrap", required=True)
    b.add_argument("--group", required=True)
    b.add_argument("--topic", action="append", required=True, help="a topic name or ^regex; repeatable")
    b.add_argument("--commands", action="store_true",
                   help="answer command queries (records with a ttd header) with a command; consume the responses")
    a = ap.parse_args(argv)
    return backend(a.bootstrap, a.group, a.topic, commands=a.commands)


if __name__ == "__main__":
    sys.exit(main())
