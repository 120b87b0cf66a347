"""The one Fleet type: FleetOptions, the lifecycle FleetBase owns for every engine, build_fleet's choice, and
monsoon setup not importing the engine. No network: nothing here connects."""
import subprocess
import sys
import threading

import pytest

from monsoon.load.aio import AsyncFleet
from monsoon.load.base import FleetBase, FleetOptions, PacedFleet
from monsoon.load.coap import CoapFleet
from monsoon.load.fleet import build_fleet
from monsoon.load.http import HttpFleet
from monsoon.load.kube_job import KubeJobFleet
from monsoon.load.mqtt import MqttFleet
from monsoon.load.native import NativeFleet, NativeHonoCoapFleet
from monsoon.load.shapes import Steady
from monsoon.stack.provision import Device

DEVS = [Device("d0", "t0"), Device("d1", "t1")]


def opts(tmp_path, **kw) -> FleetOptions:
    return FleetOptions(shape=Steady(rate=10, duration=1), acked_path=tmp_path / "acked.csv", **kw)


@pytest.mark.parametrize("cls", [MqttFleet, HttpFleet, CoapFleet, NativeFleet, KubeJobFleet])
def test_every_engine_takes_the_options_object_or_its_fields_alike(tmp_path, cls) -> None:
    a = cls(DEVS, "127.0.0.1", 1, opts(tmp_path, late_tolerance_s=0.2))
    b = cls(DEVS, "127.0.0.1", 1, shape=a.shape, acked_path=tmp_path / "acked.csv", late_tolerance_s=0.2)
    assert isinstance(a, FleetBase) and a.options == b.options
    assert (a.late_tolerance_s, a.acked_path, a.endpoint, a.connected) == (0.2, tmp_path / "acked.csv",
                                                                          "127.0.0.1:1", b.connected)
    c = cls(DEVS, "127.0.0.1", 1, a.options, drain_timeout_s=9.0)   # fields given too: they replace the options'
    assert c.drain_timeout_s == 9.0 and c.late_tolerance_s == 0.2
    with pytest.raises(TypeError):
        cls(DEVS, "127.0.0.1", 1, shape=a.shape, acked_path=tmp_path / "a", no_such_option=1)


@pytest.mark.parametrize("cls", [MqttFleet, HttpFleet, NativeFleet])
def test_the_shared_validation_says_what_is_wrong(tmp_path, cls) -> None:
    with pytest.raises(ValueError, match="empty"):
        cls([], "127.0.0.1", 1, opts(tmp_path))
    with pytest.raises(ValueError, match="unique"):
        cls([DEVS[0], DEVS[0]], "127.0.0.1", 1, opts(tmp_path))
    with pytest.raises(ValueError, match="qos"):
        cls(DEVS, "127.0.0.1", 1, opts(tmp_path, qos=2))
    with pytest.raises(ValueError, match="acked_path"):
        cls(DEVS, "127.0.0.1", 1, shape=Steady(rate=1, duration=1))


def test_build_fleet_picks_the_engine_and_refuses_what_it_cannot_drive(tmp_path) -> None:
    o = opts(tmp_path)
    assert type(build_fleet("mqtt", DEVS, "h", 1, o)) is MqttFleet
    assert type(build_fleet("mqtt", DEVS, "h", 1, o, engine="native", workers=2)) is NativeFleet
    assert type(build_fleet("mqtt", DEVS, "h", 1, o, engine="kubernetes")) is KubeJobFleet
    assert type(build_fleet("hono-coap", DEVS, "h", 1, o, engine="native")) is NativeHonoCoapFleet
    assert type(build_fleet("http", DEVS, "h", 1, o)) is HttpFleet
    assert type(build_fleet("coap", DEVS, "h", 1, shape=o.shape, acked_path=o.acked_path)) is CoapFleet
    assert isinstance(build_fleet("http", DEVS, "h", 1, o), (AsyncFleet, PacedFleet))
    with pytest.raises(ValueError, match="drives MQTT only"):
        build_fleet("http", DEVS, "h", 1, o, engine="native")
    with pytest.raises(ValueError, match="workers > 1 needs engine: native"):
        build_fleet("mqtt", DEVS, "h", 1, o, workers=2)
    with pytest.raises(ValueError, match="unknown device transport 'amqp'"):
        build_fleet("amqp", DEVS, "h", 1, o)


class _Recorded(FleetBase):
    """A FleetBase whose engine part records what the lifecycle asked of it."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.calls: list[str] = []
        self.up = False

    def _ready(self) -> bool:
        return self.up

    def connect(self, timeout: float = 30) -> None:
        self._check_open()
        self.calls.append("connect")
        self.up = True

    def _run(self, stop, on_second):
        self.calls.append("run")
        self._open_acked()
        self._acked_rows.append(("d0", 0, 1, 2))
        return "totals"

    def _teardown(self) -> None:
        self.calls.append("teardown")


def test_run_connects_first_runs_once_and_close_is_idempotent_and_writes_the_last_acks(tmp_path) -> None:
    from monsoon.timeline.columnar import iter_dicts
    f = _Recorded(DEVS, "127.0.0.1", 1, opts(tmp_path))
    assert f.run(threading.Event()) == "totals"
    assert f.calls == ["connect", "run"]
    with pytest.raises(RuntimeError, match=r"_Recorded.run\(\) can only be called once"):
        f.run(threading.Event())
    f.close()
    f.close()
    assert f.calls == ["connect", "run", "teardown"]
    # the acks still buffered at close() are the dataset's last part
    assert [(r["device"], r["seq"]) for r in iter_dicts(tmp_path / "acked.csv")] == [("d0", 0)]
    with pytest.raises(RuntimeError, match="fleet is closed"):
        f.connect()


def test_monsoon_setup_does_not_import_the_load_engines() -> None:
    code = ("import sys, monsoon.hostsetup; "
            "print(sorted(m for m in ('monsoon.load.native', 'monsoon.load.mqtt', 'paho') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
