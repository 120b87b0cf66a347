"""What every check shares: ``Verdict``, the pass/fail/unknown rule (``combine``) and ``RunData``, the saved
run directory a check reads (lazily, never a live system)."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from monsoon.rundir import LATENCY_FILE, TIMELINE_FILE
from monsoon.checks.accounting import account
from monsoon.timeline.store import Events
from monsoon.timeline.tail import Tear
from monsoon.timeline.torn import run_tears
from monsoon.timeline.events import OP, OP_LOAD_END, SAMPLE

if TYPE_CHECKING:   # it imports numpy: in the property that reads the log, not when a check is named
    from monsoon.timeline.hdrlog import LatencyLog


PASS, FAIL, UNKNOWN = "pass", "fail", "unknown"
INFO = "info"       # a check that reports a figure and cannot fail (no limit set): never shown as a PASS


_RANK = {INFO: -1, PASS: 0, UNKNOWN: 1, FAIL: 2}


@dataclass(frozen=True)
class Verdict:
    name: str
    verdict: str
    figures: dict[str, float] = field(default_factory=dict)
    message: str = ""

    def to_dict(self) -> dict:
        return {"name": self.name, "verdict": self.verdict, "figures": self.figures, "message": self.message}


def combine(verdicts: list[str]) -> str:
    """fail beats unknown beats pass beats info; nothing to judge is unknown. Only info (every check reported a
    figure, none could fail) stays info: nothing was judged, so it is not a pass."""
    if not verdicts:
        return UNKNOWN
    return max(verdicts, key=_RANK.__getitem__)


class RunData:
    """Everything a check may read, loaded lazily from a run directory."""

    def __init__(self, dir: Path, events: Events | None = None):
        self.dir = Path(dir)
        self._events = events

    @property
    def events(self) -> Events:
        if self._events is None:
            self._events = Events.load(self.dir / TIMELINE_FILE)
        return self._events

    @cached_property
    def tears(self) -> list[Tear]:
        """The run's torn files (:func:`monsoon.timeline.torn.run_tears`): a timeline or CSV cut off mid-line,
        a timeline line that is not JSON; empty for an intact run."""
        events = self._events
        if events is None and (self.dir / TIMELINE_FILE).exists():
            events = self.events
        return run_tears(self.dir, events)

    @property
    def torn(self) -> list[str]:
        """What :attr:`tears` says, one sentence per torn spot (``monsoon analyze`` prints them)."""
        return [t.note for t in self.tears]

    @property
    def meta(self) -> dict:
        return self.events.meta()

    @cached_property
    def accounting(self):
        """Every (device, seq) accounted for across the sent, acked and stored datasets
        (:func:`monsoon.checks.accounting.account`; computed once, shared by the checks that need it)."""
        return account(self.dir)

    @cached_property
    def latency_log(self) -> LatencyLog | None:
        """The fleet's per-second ack-latency interval log, decoded once (:class:`LatencyLog`) and shared by
        ``error_budget``, ``latency_objective`` and the report; None when the run has no such log."""
        from monsoon.timeline.hdrlog import LatencyLog
        p = self.dir / LATENCY_FILE
        return LatencyLog.read(p) if p.exists() else None

    @cached_property
    def latency_histograms(self):
        """Ack-latency HdrHistograms summed per phase (and ``all``) from the fleet's per-second interval log
        (:meth:`LatencyLog.phase_histograms`); None when the run has no such log."""
        log = self.latency_log
        return log.phase_histograms(self.events.phases()) if log is not None else None

    def load_end(self) -> float | None:
        e = self.events.first(OP, op=OP_LOAD_END)
        return e["t"] if e else None

    def phase_end(self, name: str) -> float | None:
        p = self.events.phase(name)
        return p["end"] if p else None

    def backlog_series(self) -> tuple[str, list[tuple[float, float]]]:
        """Kafka consumer lag when the stack has Kafka, else the platform's queue depth. A stack whose Kafka
        was sampled but never gave a lag (its topic or group missing, every poll failing) has no backlog
        series at all: missing data is never read as a zero, nor replaced by another signal."""
        lag = self.events.series("kafka", "lag")
        if lag or self.events.first(SAMPLE, collector="kafka") is not None:
            return "kafka consumer lag", lag
        return "queue depth", self.events.series("metrics", "queue_depth")

    def backlog_missing(self) -> str:
        """Why there is no backlog series, in a few words ('' when nothing is known)."""
        polls = list(self.events.of(SAMPLE, collector="kafka"))
        for flag, what in (("topic_missing", "the Kafka topic was missing"),
                           ("group_missing", "the consumer group had committed no offset"),
                           ("error", "the lag poll failed")):
            n = sum(1 for e in polls if e.get(flag))
            if n:
                first = next(e for e in polls if e.get(flag))
                detail = f" (e.g. {str(first['error'])[:120]})" if flag == "error" else ""
                return f"; {what} in {n} poll(s){detail}: no lag was measured (missing data, not a zero)"
        return ""


def when(run: RunData, t: float) -> str:
    """A timeline time as the checks' messages say it: ``t=233s (51s into the burst)``, naming the load phase
    it falls in (none after the load: ``t=320s``)."""
    s = f"t={t:.0f}s"
    for p in run.events.phases():
        if p["start"] <= t < p["end"]:
            return s + f" ({t - p['start']:.0f}s into the {p['name']})"
    return s


def check_base(name: str) -> str:
    """The registered check behind a verdict's name: ``latency_objective[steady]`` -> ``latency_objective``."""
    return name.split("[", 1)[0]
