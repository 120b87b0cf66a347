"""The Locust column of `make bench-load`: CPU per message is the difference of two runs, so a fixed start-up
cost cancels out; a longer run that acked nothing more is refused, not divided by zero."""
import pytest

from monsoon.selftest import peer


def fake_runs(monkeypatch, runs):
    it = iter(runs)
    monkeypatch.setattr(peer, "ensure_locust", lambda cache, log: "locust")
    monkeypatch.setattr(peer, "run_locust", lambda *a, **k: next(it))


def test_start_up_cost_cancels_out(monkeypatch):
    # 2 s of start-up in both runs, then 300 us per message
    fake_runs(monkeypatch, [{"acked": 10_000, "failures": 50, "cpu_s": 2.0 + 3.0, "elapsed_s": 7},
                            {"acked": 40_000, "failures": 50, "cpu_s": 2.0 + 12.0, "elapsed_s": 22}])
    r = peer.measure_locust(1883, short_s=5, long_s=20)
    assert r["acked"] == 30_000 and r["cpu_s"] == 9.0 and r["seconds"] == 15
    assert r["cpu_s"] / r["acked"] * 1e6 == pytest.approx(300.0)
    assert r["msgs_per_s"] == 2000.0 and r["failures"] == 100


def test_a_longer_run_that_acked_nothing_more_is_refused(monkeypatch):
    fake_runs(monkeypatch, [{"acked": 500, "failures": 0, "cpu_s": 2.0, "elapsed_s": 7},
                            {"acked": 500, "failures": 9_000, "cpu_s": 9.0, "elapsed_s": 22}])
    with pytest.raises(peer.PeerUnavailable, match="acked nothing more"):
        peer.measure_locust(1883)


def test_the_locustfile_publishes_qos1_to_the_port_it_is_given():
    assert "qos=1" in peer.LOCUSTFILE and 'os.environ["PEER_PORT"]' in peer.LOCUSTFILE
    compile(peer.LOCUSTFILE, "locustfile.py", "exec")
