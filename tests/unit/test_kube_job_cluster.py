"""The load as an Indexed Job in monsoon's cluster, the parts that need no cluster: the Job's pod spec, the
``load.kubernetes`` key, the relay between a local fleet worker slot and a pod's stdin FIFO / stdout file (real
FIFOs and files, a thread standing in for the pod), the image archive and the run id read from the timeline."""
import json
import os
import subprocess
import sys
import tarfile
import threading
from pathlib import Path

import pytest

from monsoon.load.kube_job import job_in_cluster, run_id_of, run_meta, shard_paths
from monsoon.spec.experiment import load_experiment
from monsoon.spec.yamlio import SpecError
from monsoon.stack.imagetar import write_image_archive

CONFIG = {"devices": [{"name": f"d{i}", "token": f"t{i}"} for i in range(4)]}


def test_the_job_runs_each_shard_on_the_nodes_network_with_the_run_directory_at_its_own_path(tmp_path):
    work = tmp_path / "run dir"                        # a space: the pod's shell must get it quoted
    job = job_in_cluster(CONFIG, config_path=work / ".acked.loadgen.json", workdir=work, prefix=work / ".acked.pod",
                         experiment="exp", run_id="r-1", shards=2, image="monsoon.local/loadgen:abc",
                         namespace="monsoon-load-r-1")
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"]) == ("Indexed", 2, 2, 0)
    pod = spec["template"]["spec"]
    assert pod["hostNetwork"] is True and pod["restartPolicy"] == "Never"
    assert pod["volumes"] == [{"name": "run", "hostPath": {"path": str(work), "type": "Directory"}}]
    (c,) = pod["containers"]
    assert c["volumeMounts"] == [{"name": "run", "mountPath": str(work)}] and c["imagePullPolicy"] == "Never"
    assert job["metadata"]["labels"]["monsoon.io/run-id"] == "r-1"
    assert spec["template"]["metadata"]["labels"]["monsoon.io/run-id"] == "r-1"
    # the pod's shell, run here with a stand-in for the binary: each shard reads its own stdin file and writes its
    # own stdout, stderr and exit code files, the index from JOB_COMPLETION_INDEX
    script = c["command"][2]
    assert "--shard auto/2" in script
    work.mkdir()
    fake = tmp_path / "fake-loadgen"
    fake.write_text('#!/bin/sh\necho "$@"; cat; echo oops >&2; exit 7\n')
    fake.chmod(0o755)
    for i in (0, 1):
        p = shard_paths(work / ".acked.pod", i)
        Path(p["ctl"]).write_text(f"start {i}\n")
        r = subprocess.run(["sh", "-c", script.replace("/usr/local/bin/monsoon-loadgen", str(fake))],
                           env={"JOB_COMPLETION_INDEX": str(i), "PATH": os.environ["PATH"]}, capture_output=True,
                           text=True)
        assert r.returncode == 0, r.stderr
        assert Path(p["out"]).read_text() == (f"run --config {work}/.acked.loadgen.json --shard auto/2 --wait-start\n"
                                              f"start {i}\n")
        assert (Path(p["err"]).read_text(), Path(p["rc"]).read_text()) == ("oops\n", "7\n")


def exp_file(tmp_path: Path, load: str) -> Path:
    p = tmp_path / "e.yaml"
    p.write_text(f"name: e\nload: {load}\nprofiles:\n  quick: {{warmup: 5, recovery: 5}}\nchecks: [no_acked_loss]\n")
    return p


def test_load_kubernetes_is_the_kubernetes_engine_with_one_worker_per_shard(tmp_path):
    e = load_experiment(exp_file(tmp_path, "{devices: 4, base_rate: 10, shape: {kind: steady}, kubernetes: {shards: 2}}"))
    assert (e.load.engine, e.load.workers, e.load.kubernetes.shards) == ("kubernetes", 2, 2)


@pytest.mark.parametrize("load, words", [
    ("{devices: 4, base_rate: 10, shape: {kind: steady}, engine: native, kubernetes: {shards: 2}}", "drop engine: native"),
    ("{devices: 4, base_rate: 10, shape: {kind: steady}, workers: 3, kubernetes: {shards: 2}}", "drop workers"),
    ("{devices: 4, base_rate: 10, shape: {kind: steady}, engine: kubernetes}", "set by load.kubernetes"),
    ("{devices: 1, base_rate: 10, shape: {kind: steady}, kubernetes: {shards: 2}}", "2 workers for 1 devices"),
])
def test_a_load_kubernetes_that_cannot_run_is_one_line_naming_the_key(tmp_path, load, words):
    with pytest.raises(SpecError) as e:
        load_experiment(exp_file(tmp_path, load))
    msg = str(e.value)
    assert words in msg and "e.yaml:2" in msg and "\n" not in msg, msg


def fake_pod(prefix: Path, i: int, got: list, lines: list[str], rc: int) -> threading.Thread:
    """What the pod's shell does: read the stdin FIFO, write stdout lines, then the exit code."""
    p = shard_paths(prefix, i)

    def body():
        with open(p["ctl"]) as ctl, open(p["out"], "w") as out:
            out.write(lines[0] + "\n")
            out.flush()
            for line in ctl:                 # until the relay closes its end (its stdin's EOF)
                got.append(line.strip())
            for ln in lines[1:]:
                out.write(ln + "\n")
        Path(p["rc"]).write_text(f"{rc}\n")
    t = threading.Thread(target=body, daemon=True)
    t.start()
    return t


def test_the_relay_carries_stdin_to_the_pods_fifo_and_its_stdout_and_exit_code_back(tmp_path):
    prefix = tmp_path / ".acked.pod"
    os.mkfifo(shard_paths(prefix, 1)["ctl"])
    got: list[str] = []
    lines = ['{"event": "connected", "connected": 2}', '{"t": 0, "sent": 5}', '{"totals": {"sent": 5}}']
    pod = fake_pod(prefix, 1, got, lines, rc=0)
    r = subprocess.run([sys.executable, "-m", "monsoon.load.kube_job", "relay", str(prefix), "10", "run", "--config",
                        "x.json", "--shard", "1/2", "--wait-start"], input="start 1234\nstop\n", capture_output=True,
                       text=True, timeout=30)
    pod.join(5)
    assert r.returncode == 0, r.stderr
    assert [json.loads(x) for x in r.stdout.splitlines()] == [json.loads(x) for x in lines]
    assert got == ["start 1234", "stop"]


def test_the_relay_says_so_in_one_line_when_the_pod_never_opens_its_stdin(tmp_path):
    prefix = tmp_path / ".acked.pod"
    os.mkfifo(shard_paths(prefix, 0)["ctl"])
    r = subprocess.run([sys.executable, "-m", "monsoon.load.kube_job", "relay", str(prefix), "0.5", "run",
                        "--shard", "0/1"], input="", capture_output=True, text=True, timeout=30)
    assert r.returncode == 3
    assert json.loads(r.stdout) == {"error": "load shard 0: the load pod did not start within 0.5s"}


def test_the_image_archive_holds_the_files_links_and_entrypoint(tmp_path):
    exe = tmp_path / "tool"
    exe.write_bytes(b"\x7fELF-ish")
    exe.chmod(0o755)
    out = tmp_path / "img.tar"
    files = [("usr/local/bin/tool", str(exe), None), ("bin/sh", None, "busybox")]
    assert write_image_archive(str(out), "monsoon.local/t:1", files, ["/usr/local/bin/tool"]) is True
    assert write_image_archive(str(out), "monsoon.local/t:1", files, ["/usr/local/bin/tool"]) is False  # stamped
    with tarfile.open(out) as t:
        manifest = json.load(t.extractfile("manifest.json"))
        assert manifest[0]["RepoTags"] == ["monsoon.local/t:1"]
        config = json.load(t.extractfile(manifest[0]["Config"]))
        assert config["config"]["Entrypoint"] == ["/usr/local/bin/tool"]
        layer = tarfile.open(fileobj=t.extractfile("layer.tar"))
        names = {m.name: m for m in layer.getmembers()}
    assert {"usr", "usr/local", "usr/local/bin", "usr/local/bin/tool", "bin", "bin/sh"} <= set(names)
    assert names["usr/local/bin/tool"].mode & 0o111 and names["bin/sh"].linkname == "busybox"


def test_the_run_id_comes_from_the_timelines_meta(tmp_path):
    (tmp_path / "timeline.jsonl").write_text('{"type": "meta", "t": 0, "run_id": "20260101-x1", "experiment": "e"}\n')
    assert run_id_of(tmp_path) == "20260101-x1" and run_meta(tmp_path) == ("20260101-x1", "e")
    assert run_id_of(tmp_path / "nowhere") == f"load-{os.getpid()}"


def test_a_job_that_does_not_connect_names_what_its_pods_were_doing(tmp_path):
    from monsoon.load.kube_job import KubeJobFleet
    from monsoon.stack.provision import Device

    class FakeKube:
        def pods(self, namespace, selector):
            assert (namespace, selector) == ("ns", "job-name=j")
            return [{"metadata": {"name": "j-0-x"}, "status": {"phase": "Pending", "containerStatuses": [
                {"state": {"waiting": {"reason": "ErrImageNeverPull"}}}]}},
                    {"metadata": {"name": "j-1-y"}, "status": {"phase": "Running"}}]
    f = KubeJobFleet([Device("d0", "t0"), Device("d1", "t1")], "127.0.0.1", 1883, shape=None,
                     acked_path=tmp_path / "acked.parquet", workers=2)
    f._kube, f.namespace, f.job_name = FakeKube(), "ns", "j"
    assert f._pod_states() == "j-0-x Pending (ErrImageNeverPull), j-1-y Running"
