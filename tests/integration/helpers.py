"""Shared helpers of the integration tests."""
import signal
import time


def wait_for(pred, timeout: float, what: str, interval: float = 0.25):
    """Poll ``pred`` until it returns something truthy (returned), or fail naming ``what``."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def sigint_default() -> None:
    """``preexec_fn`` for a child that a test interrupts with SIGINT. A session started in the background by a
    script (``cmd &``, nohup) inherits SIGINT as ignored, and Python then installs no Ctrl-C handler: the
    child would never see the test's SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_story(tmp_path, stack: str, text: str, run_id: str):
    """``text`` (an experiment's YAML) run on ``stack`` through a session of its own under ``tmp_path``:
    (its result, its timeline's events)."""
    from monsoon.session import MonsoonSession
    from monsoon.timeline.store import read_events
    exp = tmp_path / f"{run_id}.yaml"
    exp.write_text(text)
    session = MonsoonSession(runs_dir=tmp_path / "runs", run_id=run_id, progress=print)
    t0 = time.monotonic()
    result = session.run(stack, str(exp))
    print(f"story {stack}/{run_id}: {time.monotonic() - t0:.1f} s")
    return result, read_events(result.dir / "timeline.jsonl")
