"""Per-second stats and run totals of a fleet, the acked-log header and the latency histograms' helpers."""
from __future__ import annotations

from dataclasses import dataclass
from hdrh.histogram import HdrHistogram




ACKED_CSV_HEADER = ("device", "seq", "intended_ms", "acked_ms")


@dataclass
class SecondStats:
    """What happened during one second of the run (events are attributed to
    the second in which they happened: a message is ``scheduled`` when the
    pacer takes it off the schedule, ``acked`` when its PUBACK arrives).
    ``target_rate`` is what the schedule asks for in this second
    (:meth:`Schedule.expected_per_second`), 0 after its end.
    Latency is PUBACK time minus *intended* send time, in ms."""

    t: int
    target_rate: float
    scheduled: int
    sent: int
    acked: int
    failed: int
    late: int
    connected: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None


@dataclass
class FleetTotals:
    scheduled: int
    sent: int
    acked: int
    failed: int
    late: int
    dropped: int
    unacked: int
    last_seq: dict[str, int]
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    # extras, not in the original brief
    reconnects: int = 0
    elapsed_s: float = 0.0
    lost_in_flight: int = 0  # sent on a connection that then dropped, before its PUBACK


_HIST_MAX_US = 3_600_000_000  # 1 h


def _new_hist() -> HdrHistogram:
    return HdrHistogram(1, _HIST_MAX_US, 2)


def _pct_ms(h: HdrHistogram) -> tuple[float | None, float | None, float | None]:
    if h.get_total_count() == 0:
        return None, None, None
    return (
        h.get_value_at_percentile(50) / 1000.0,
        h.get_value_at_percentile(99) / 1000.0,
        h.get_max_value() / 1000.0,
    )


class FleetConnectError(RuntimeError):
    """The fleet could not connect (names host:port, the device and the cause)."""
