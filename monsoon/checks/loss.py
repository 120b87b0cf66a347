"""Jepsen-style accounting of every written element: each (device, seq) across sent, acked and stored.

The reasoning, sources and measurements behind it: docs/design.md, "monsoon/checks/loss.py"."""
from __future__ import annotations

from monsoon.checks.base import FAIL, PASS, RunData, UNKNOWN, Verdict
from monsoon.rundir import ACKED_DATA, SENT_DATA, STORED_DATA
from monsoon.timeline.columnar import run_file_exists
from monsoon.timeline.events import DRAIN


# ------------------------------------------------------------------ where stored messages come from


# ------------------------------------------------------------------ fast CSV columns


# ------------------------------------------------------------------ the accounting


# ------------------------------------------------------------------ the checks

def _missing(run: RunData) -> str | None:
    for f in (ACKED_DATA, STORED_DATA):
        if not run_file_exists(run.dir / f):
            return f
    return None


def no_acked_loss(run: RunData) -> Verdict:
    """Every acknowledged (device, seq) is in storage; duplicates, recovered, unexpected and reordered
    messages and the end-to-end latency are reported alongside (they never fail this check). Storage is read
    at the drain's end and again after the platform stopped: a message found only then is ``stored_late``,
    never lost, and one found once stays stored."""
    name = "no_acked_loss"
    missing = _missing(run)
    if missing:
        return Verdict(name, UNKNOWN, {}, f"{missing} is missing from {run.dir}: cannot account for messages")
    acc = run.accounting
    figures = acc.figures()
    n_acked, n_lost, dup, unacked = acc.acked, acc.acked_lost, acc.duplicates, acc.stored_unacked
    drain = run.events.first(DRAIN)
    if not n_acked:
        return Verdict(name, UNKNOWN, figures, "no message was acknowledged: nothing to account for")
    late = _late(acc)
    if not n_lost:
        extra = ""
        if acc.e2e_ms is not None:
            extra = f"; send->stored p50 {acc.e2e_ms['p50']:,.0f} ms, p99 {acc.e2e_ms['p99']:,.0f} ms"
        return Verdict(name, PASS, figures,
                       f"all {n_acked:,} acked messages stored ({dup:,} duplicates, {unacked:,} stored unacked"
                       + late + ")" + extra)
    pct = 100.0 * n_lost / n_acked
    figures["acked_lost_pct"] = round(pct, 4)
    sample = ", ".join(f"{d}#{s}" for d, s in acc.lost_sample)
    if drain is not None and not drain.get("drained"):
        if "signal" in drain and drain["signal"] is None:   # (runs before the drain recorded its signal: below)
            return Verdict(name, UNKNOWN, figures,
                           f"{n_lost:,} acked messages not in storage, and the stack gives no sign of having settled "
                           f"(no Kafka lag, no queue-depth metric, no stored count: observe.kafka, "
                           f"observe.metrics.queue_depth or storage.count_query) after {drain.get('waited_s')}s: "
                           "cannot tell lost from not yet stored" + late)
        return Verdict(name, UNKNOWN, figures,
                       f"{n_lost:,} acked messages not in storage, but the stack had not drained its backlog "
                       f"({drain.get('backlog')}) after {drain.get('waited_s')}s: cannot tell lost from late"
                       + late)
    return Verdict(name, FAIL, figures,
                   f"{n_lost:,} of {n_acked:,} acked messages lost ({pct:.2f}%), e.g. {sample}"
                   + late)


def _late(acc) -> str:
    """``; 30,000 stored late (...)``: keys the drain's read-back lacked and the read-back after the platform
    stopped found (counted stored, never lost); and keys that were read back once and then no longer."""
    out = ""
    if acc.stored_late:
        out += (f"; {acc.stored_late:,} stored late: missing from the read-back at the drain's end, found when "
                "storage was read again after the platform stopped (counted stored, not lost)")
    if acc.stored_vanished:
        out += (f"; {acc.stored_vanished:,} read back at the drain's end were gone after the platform stopped "
                "(counted stored)")
    return out


def no_duplicates(run: RunData) -> Verdict:
    """No (device, seq) is stored more than once."""
    name = "no_duplicates"
    if not run_file_exists(run.dir / STORED_DATA) or not run_file_exists(run.dir / ACKED_DATA):
        missing = STORED_DATA if not run_file_exists(run.dir / STORED_DATA) else ACKED_DATA
        return Verdict(name, UNKNOWN, {}, f"{missing} is missing from {run.dir}: cannot look for duplicates")
    acc = run.accounting
    figures = {"duplicates": acc.duplicates, "duplicate_keys": acc.duplicate_keys, "stored": acc.stored}
    if not acc.stored:
        return Verdict(name, UNKNOWN, figures, "nothing was stored: no duplicate to find")
    if not acc.duplicates:
        return Verdict(name, PASS, figures, f"each of the {acc.stored:,} stored rows is a distinct (device, seq)")
    sample = ", ".join(f"{d}#{s} x{n}" for d, s, n in acc.dup_sample)
    return Verdict(name, FAIL, figures,
                   f"{acc.duplicate_keys:,} message(s) stored more than once ({acc.duplicates:,} extra copies of "
                   f"{acc.stored:,} rows), e.g. {sample}")


def no_unexpected(run: RunData) -> Verdict:
    """Storage holds nothing that was never sent: no unknown device, no seq beyond a device's last sent seq."""
    name = "no_unexpected"
    for f in (STORED_DATA, SENT_DATA, ACKED_DATA):
        if not run_file_exists(run.dir / f):
            return Verdict(name, UNKNOWN, {}, f"{f} is missing from {run.dir}: cannot tell what was never sent")
    acc = run.accounting
    figures = {"unexpected": acc.unexpected or 0, "unexpected_devices": acc.unexpected_devices or 0,
               "sent": acc.sent or 0, "stored": acc.stored}
    if not acc.sent:
        return Verdict(name, UNKNOWN, figures, f"{SENT_DATA} says nothing was sent")
    if not acc.unexpected:
        return Verdict(name, PASS, figures,
                       f"every stored message was sent ({acc.stored:,} rows, {acc.sent:,} sent)")
    sample = ", ".join(f"{d}#{s}" for d, s in acc.unexpected_sample)
    return Verdict(name, FAIL, figures,
                   f"{acc.unexpected:,} stored message(s) were never sent ({acc.unexpected_devices} device(s)), "
                   f"e.g. {sample}")


# Imported last: checks.py imports this module's checks at its own end.
