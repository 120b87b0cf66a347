"""``monsoon heal`` tells the truth about Toxiproxy: a run's proxy it could not delete (the server refused, or the
proxy came back) is in the census and makes the exit code 1; a run's own server, reaped, holds nothing.

The servers here are fakes of the client (``proxies``, ``delete_proxy``, ``version``); everything machine-wide
(processes, /proc, cgroups, clusters) is faked as in test_heal_live_runs.py. The same against a real Toxiproxy:
tests/integration/test_heal_all.py."""
from __future__ import annotations

import pytest

import monsoon.faults.heal as chaos
import monsoon.stack.reaper as stack_mod
from monsoon.cli import main as cli_main
from monsoon.faults.base import FaultError
from monsoon.faults.heal import heal_everything
from monsoon.faults.toxiproxy import Proxy, ToxiproxyBackend, ToxiproxyError, proxy_name

RUN = "run-tox"
PROXY = proxy_name(RUN, ("platform", "postgres"))


class FakeServer:
    """A Toxiproxy server's proxies; ``refuse``: DELETE answers 403; ``recreate``: a deleted proxy comes back;
    ``down``: not reachable (what a reaped server is)."""

    def __init__(self, api: str, names=(PROXY,), *, refuse=False, recreate=False):
        self.api = api
        self.names = set(names)
        self.refuse, self.recreate, self.down = refuse, recreate, False
        self.deleted: list[str] = []

    def _up(self):
        if self.down:
            raise FaultError(f"toxiproxy at {self.api} is not reachable (ConnectionError)")

    def version(self) -> str:
        self._up()
        return "2.12.0"

    def proxies(self) -> dict[str, Proxy]:
        self._up()
        return {n: Proxy(n, "127.0.0.1:1", "127.0.0.1:2", True) for n in sorted(self.names)}

    def delete_proxy(self, name: str) -> bool:
        self._up()
        if self.refuse:
            raise ToxiproxyError(403, f"DELETE /proxies/{name}: deleting proxies is not allowed here")
        self.deleted.append(name)
        if not self.recreate:
            self.names.discard(name)
        return True


@pytest.fixture
def machine(monkeypatch, tmp_path):
    """No process, no cgroup record, no cluster; the Toxiproxy servers are ``servers`` (api -> FakeServer),
    ``own`` the ones a run started (reaped with its processes: down after ``reap``)."""
    servers: dict[str, FakeServer] = {}
    own: list[str] = []

    def backend(api: str) -> ToxiproxyBackend:
        b = ToxiproxyBackend.__new__(ToxiproxyBackend)
        b.client, b._handles = servers[api], {}
        return b

    def reap(rid=None):
        for api in own:
            servers[api].down = True
        return []
    monkeypatch.setattr(chaos, "ToxiproxyBackend", backend)
    monkeypatch.setattr(chaos, "_toxiproxy_apis_of_runs", lambda: list(own))
    for mod in (stack_mod, chaos):
        monkeypatch.setattr(mod, "process_owners", lambda: {})
        monkeypatch.setattr(mod, "reap", reap)
    monkeypatch.setattr(chaos, "reap_containers", lambda rid=None: [])
    monkeypatch.setattr(chaos, "reap_namespaces", lambda rid=None: [])
    monkeypatch.setattr(chaos, "container_census", lambda rid: [])
    monkeypatch.setattr(chaos, "namespace_census", lambda rid: [])
    monkeypatch.setattr(chaos, "cluster_configured", lambda: False)
    monkeypatch.setattr(chaos, "release_owners", lambda: {})        # Helm releases: none (never a real one)
    monkeypatch.setattr(chaos, "reap_releases", lambda rid=None: [])
    monkeypatch.setattr(chaos, "release_census", lambda rid: [])
    return servers, own, tmp_path


def test_a_proxy_the_server_refuses_to_delete_is_reported_and_the_exit_code_is_1(machine, capsys):
    servers, own, state = machine
    servers["http://shared:8474"] = FakeServer("http://shared:8474", refuse=True)
    rep = heal_everything(RUN, toxiproxy_apis=["http://shared:8474"], state_root=state)
    assert [str(f) for f in rep.failed] == [
        f"heal {RUN} toxiproxy: deleting the run's proxies on http://shared:8474 FAILED: ToxiproxyError: "
        f"{ToxiproxyError(403, f'DELETE /proxies/{PROXY}: deleting proxies is not allowed here')}"]
    assert not any("FAILED" in d for d in rep.done), rep.done
    assert rep.census == {RUN: [f"toxiproxy: proxy {PROXY} on http://shared:8474 not deleted"]}
    assert cli_main(["heal", "--run-id", RUN, "--toxiproxy-api", "http://shared:8474"]) == 1
    out = capsys.readouterr().out
    assert f"STILL IN PLACE {RUN} toxiproxy: proxy {PROXY} on http://shared:8474 not deleted" in out
    assert f"heal {RUN} toxiproxy: deleting the run's proxies on http://shared:8474 FAILED: ToxiproxyError" in out
    assert "healed" not in out.split("FAILED")[0].splitlines()[-1]      # a failure is never printed as healed


def test_a_proxy_that_comes_back_after_its_deletion_is_reported(machine):
    servers, own, state = machine
    servers["http://shared:8474"] = FakeServer("http://shared:8474", recreate=True)
    rep = heal_everything(RUN, toxiproxy_apis=["http://shared:8474"], state_root=state)
    assert f"{RUN} toxiproxy: proxy {PROXY} deleted" in rep.done
    assert rep.census == {RUN: [f"toxiproxy: proxy {PROXY} on http://shared:8474 not deleted"]}


def test_heal_all_reports_a_leftover_proxy_on_a_shared_server(machine):
    servers, own, state = machine
    servers["http://shared:8474"] = FakeServer("http://shared:8474", refuse=True)
    rep = heal_everything(None, toxiproxy_apis=["http://shared:8474"], state_root=state)
    assert list(rep.census) == [RUN]


def test_a_deleted_proxy_and_a_reaped_own_server_leave_a_clean_census(machine):
    servers, own, state = machine
    servers["http://shared:8474"] = FakeServer("http://shared:8474")
    servers["http://127.0.0.1:9"] = FakeServer("http://127.0.0.1:9")
    own.append("http://127.0.0.1:9")
    rep = heal_everything(RUN, toxiproxy_apis=["http://shared:8474"], state_root=state)
    assert servers["http://shared:8474"].deleted == [PROXY] and servers["http://127.0.0.1:9"].deleted == [PROXY]
    assert servers["http://127.0.0.1:9"].down                 # reaped with the run's processes
    assert rep.census == {}


def test_a_shared_server_that_cannot_be_looked_at_is_not_called_clean(machine):
    servers, own, state = machine
    servers["http://shared:8474"] = FakeServer("http://shared:8474")
    servers["http://shared:8474"].down = True
    rep = heal_everything(RUN, toxiproxy_apis=["http://shared:8474"], state_root=state)
    assert rep.census[RUN][0].startswith("toxiproxy: census failed: toxiproxy at http://shared:8474 is not reachable")


def test_keep_processes_leaves_the_proxies_and_does_not_count_them(machine):
    servers, own, state = machine
    servers["http://shared:8474"] = FakeServer("http://shared:8474")
    rep = heal_everything(RUN, toxiproxy_apis=["http://shared:8474"], reap_processes=False, state_root=state)
    assert servers["http://shared:8474"].names == {PROXY} and rep.census == {}
