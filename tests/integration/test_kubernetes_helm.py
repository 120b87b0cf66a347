"""A stack that is a Helm release, on monsoon's cluster (the session's: started here unless it runs): the Kafka
burst on `stacks/kafka-helm.yaml` (monsoon's own chart installed for the run) loses nothing acked and leaves no
release behind; a run interrupted mid-load (SIGINT) still uninstalls, and after a kill -9 `monsoon heal --all`
uninstalls the dead run's release; a release monsoon did not install
(`install: false`) is found by its labels and left exactly as it was. Skips in one line without `make k8s`
(the cluster, or Helm)."""
import ipaddress
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from monsoon.spec.stack import load_stack
from monsoon.stack import cluster, helm
from monsoon.stack.pods import ClusterUnavailable, Kube, cluster_for_session, kubeconfig_path, run_namespaces
from monsoon.stack.supervisor import Stack
from monsoon.paths import REPO
from monsoon.timeline.store import read_events
from tests.integration.helpers import run_story, sigint_default, wait_for

pytestmark = pytest.mark.kubernetes    # the session keeps the cluster up through a run of modules marked so

NAMESPACE = "monsoon-kafka-helm"
USER_NS, USER_RELEASE = "helm-user-own", "user-own"

BURST = """
name: helm-burst
load: {devices: 20, qos: 1, base_rate: 150, shape: {kind: burst, multiplier: 10}}
profiles:
  quick: {warmup: 5, burst: 10, recovery: 15, drain_timeout: 120}
checks:
  - no_acked_loss
  - lag_recovers_within: {seconds: 120}
"""

INTERRUPTED = """
name: helm-interrupted
load: {devices: 10, qos: 1, base_rate: 100, shape: {kind: steady}}
profiles:
  quick: {warmup: 120, recovery: 5, drain_timeout: 20}
checks:
  - no_acked_loss
"""
SCENARIO = """
def test_interrupted(monsoon):
    monsoon.run("kafka-helm", "{exp}").assert_pass()
"""


@pytest.fixture(scope="module")
def kube_cluster(request):
    why = helm.not_built()
    if why:
        pytest.skip(why)
    try:
        return cluster_for_session(request.config, (NAMESPACE,))
    except ClusterUnavailable as e:
        pytest.skip(str(e))


def helm_cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    kc = kubeconfig_path()
    res = subprocess.run([str(helm.helm_binary()), *args, "--kubeconfig", str(kc)], env=helm.helm_env(kc),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 or not check, f"helm {' '.join(args)}: {res.stdout}{res.stderr}"
    return res


def monsoon_releases() -> list[dict]:
    """`helm list -A` (every status), those whose Secrets carry monsoon's run label."""
    listed = json.loads(helm_cli("list", "-A", "-a", "-o", "json").stdout or "[]")
    ours = {(r.namespace, r.name) for r in helm.list_releases()}
    return [r for r in listed if (r["namespace"], r["name"]) in ours or r["namespace"] == NAMESPACE]


def test_a_release_monsoon_did_not_install_is_found_and_left_as_it_was(kube_cluster, tmp_path):
    """install: false: the user's release (a busybox Deployment, installed here with helm as a user would) is the
    stack; monsoon finds its pod by label, follows its log, and at the stop neither uninstalls, upgrades nor
    deletes anything: the same revision, status, pod UID and namespace after as before."""
    helm_cli("install", USER_RELEASE, str(REPO / "tests/data/charts/sleeper"), "--namespace", USER_NS,
             "--create-namespace", "--wait", "--timeout", "120s")
    try:
        spec_file = tmp_path / "user-own.yaml"
        spec_file.write_text(f"""
name: user-own
provider: helm
helm: {{release: {USER_RELEASE}, namespace: {USER_NS}, install: false, pods: {{app: {{labelSelector:
  {{app.kubernetes.io/instance: {USER_RELEASE}, app.kubernetes.io/component: app}}, container: worker}}}}}}
services: {{app: {{}}}}
devices: {{port: "1883"}}
provisioning: none
storage: {{dsn: "postgresql://127.0.0.1:1/x", loss_query: "SELECT 1"}}
observe: {{service: app}}
""")
        spec = load_stack(spec_file)
        assert spec.observe.kubernetes.namespace == USER_NS
        kube = Kube()
        before_status = json.loads(helm_cli("status", USER_RELEASE, "-n", USER_NS, "-o", "json").stdout)
        before_pods = {p["metadata"]["uid"] for p in kube.pods(USER_NS, "app.kubernetes.io/instance=" + USER_RELEASE)}
        events: list = []
        with Stack(spec, tmp_path / "stack", run_id="helm-user-own", on_event=lambda t, **f: events.append(f)) as st:
            svc = st.services["app"]
            assert svc.proc.uid in before_pods, (svc.proc.uid, before_pods)
        after_status = json.loads(helm_cli("status", USER_RELEASE, "-n", USER_NS, "-o", "json").stdout)
        after_pods = {p["metadata"]["uid"] for p in kube.pods(USER_NS, "app.kubernetes.io/instance=" + USER_RELEASE)}
        assert (after_status["version"], after_status["info"]["status"]) == (before_status["version"], "deployed")
        assert after_status["info"]["last_deployed"] == before_status["info"]["last_deployed"]
        assert after_pods == before_pods and kube.namespace(USER_NS) is not None
        assert [e["event"] for e in events if e.get("op") == "helm-release"] == ["found"], events
        assert not [e for e in events if e.get("op") == "namespace"], events
    finally:
        helm_cli("uninstall", USER_RELEASE, "-n", USER_NS, "--wait", check=False)
        Kube().delete_namespace(USER_NS, 60)


def test_kafka_burst_on_a_helm_release_loses_nothing_and_leaves_no_release(kube_cluster, tmp_path):
    """The x1 -> x10 burst on kafka-helm: held as consumer lag and drained, nothing acked lost; the release was
    installed labelled with the run and is uninstalled at the end (helm list -A shows none of monsoon's)."""
    result, events = run_story(tmp_path, "kafka-helm", BURST, "helm-burst")
    rel = [e for e in events if e["type"] == "op" and e.get("op") == "helm-release"]
    print("helm:", json.dumps(rel))
    f = result.check("no_acked_loss").figures
    print(f"no_acked_loss: {f.get('acked_lost')} of {f.get('acked')} acked lost; {result.failure_message()}")
    result.assert_pass()
    assert f.get("acked_lost") == 0 and f.get("acked", 0) > 0, f
    assert [e["event"] for e in rel] == ["installed", "uninstalled"], rel
    # hostNetwork: false in kafka-helm's values: every pod had an address of the pod network, not the node's
    starts = [e for e in events if e["type"] == "service" and e.get("event") == "start"]
    pod_net = ipaddress.ip_network(cluster.POD_CIDR)
    assert starts and all(e.get("ip") and ipaddress.ip_address(e["ip"]) in pod_net for e in starts), starts
    assert monsoon_releases() == [] and run_namespaces("helm-burst") == []


@pytest.mark.parametrize("how", ["sigint", "kill-9"])
def test_an_interrupted_run_still_uninstalls_its_release(kube_cluster, tmp_path, how):
    """SIGINT to the pytest process running a scenario on kafka-helm, mid-load: the stack's stop uninstalls the
    release (helm uninstall --wait) and deletes its namespace before the process exits. kill -9 instead: the
    release stays, labelled with a dead owner, until `monsoon heal --all` uninstalls it."""
    exp = tmp_path / "helm-interrupted.yaml"
    exp.write_text(INTERRUPTED)
    (tmp_path / "test_it.py").write_text(SCENARIO.replace("{exp}", str(exp)))
    runs, run_id = tmp_path / "runs", f"helm-int-{how}"
    timeline = runs / run_id / "kafka-helm--helm-interrupted" / "timeline.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "pytest", str(tmp_path / "test_it.py"), "-p", "no:cacheprovider",
                             f"--monsoon-runs-dir={runs}", f"--monsoon-run-id={run_id}"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=sigint_default,
                            env={k: v for k, v in os.environ.items() if k != "MONSOON_RUN_ID"})
    try:
        def loading() -> bool:
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            return timeline.exists() and any(e["type"] == "op" and e.get("op") == "connected"
                                             for e in read_events(timeline))
        wait_for(loading, 300, "the run's fleet connected")
        assert helm.list_releases(run_id), "the release should be installed, labelled with the run"
        time.sleep(3)
        t0 = time.monotonic()
        if how == "sigint":
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=240)
            print(f"SIGINT to the end of the run: {time.monotonic() - t0:.1f} s")
            rel = [e["event"] for e in read_events(timeline) if e["type"] == "op" and e.get("op") == "helm-release"]
            assert rel == ["installed", "uninstalled"], (rel, out[-3000:])
        else:
            proc.kill()
            out, _ = proc.communicate(timeout=30)
            (left,) = helm.list_releases(run_id)
            assert left.owner_pid == proc.pid and left.status == "deployed", left
            healed = subprocess.run([sys.executable, "-m", "monsoon.cli", "heal", "--all"], cwd=REPO,
                                    env={k: v for k, v in os.environ.items() if k != "MONSOON_RUN_ID"},
                                    capture_output=True, text=True, timeout=300)
            out += f"\n--- heal --all (exit {healed.returncode}):\n{healed.stdout[-3000:]}{healed.stderr[-2000:]}"
            print(f"kill -9, then heal --all: {time.monotonic() - t0:.1f} s")
            assert healed.returncode == 0, out
            assert f"{run_id}: uninstalled 1 leftover Helm release(s): {NAMESPACE}/kafka-helm" in healed.stdout, out
        assert helm.list_releases(run_id) == [] and monsoon_releases() == [], out[-3000:]
        assert run_namespaces(run_id) == [], out[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        helm.reap_releases(run_id)
