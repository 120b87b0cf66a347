"""Shared helpers of the integration tests."""
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
