"""The load's Kubernetes Indexed Job: shard count, allow-list and labels (its contract test runs the
rendered objects through the upstream Go types: tests/integration/test_manifest_contract.py)."""
import json

import pytest

from monsoon.stack.reaper import RUN_LABEL
from monsoon.load.kube_job import LoadJobError, render_load_job

CONFIG = {"devices": [{"name": f"d{i}", "token": f"t{i}"} for i in range(6)], "segments": [[0, 10, 50.0]]}


def render(**kw):
    args = dict(experiment="burst-x10", run_id="20261122-010203-ab12", shards=3, image="reg/loadgen:1",
                namespace="load", allowed_namespaces=["load"])
    args.update(kw)
    return render_load_job(CONFIG, **args)


def test_one_pod_per_shard_reading_its_index_and_the_config_from_the_configmap():
    cm, job = render()
    assert json.loads(cm["data"]["load.json"]) == CONFIG
    spec = job["spec"]
    assert (spec["completions"], spec["parallelism"], spec["completionMode"]) == (3, 3, "Indexed")
    c = spec["template"]["spec"]["containers"][0]
    assert c["command"] == ["monsoon-loadgen", "run", "--config", "/etc/monsoon/load.json", "--shard", "auto/3"]
    assert spec["template"]["spec"]["volumes"][0]["configMap"]["name"] == cm["metadata"]["name"]
    for labels in (cm["metadata"]["labels"], job["metadata"]["labels"], spec["template"]["metadata"]["labels"]):
        assert labels[RUN_LABEL] == "20261122-010203-ab12"


@pytest.mark.parametrize("kw,words", [
    ({"shards": 0}, "shards must be an integer"),
    ({"shards": 2.5}, "shards must be an integer"),
    ({"shards": 7}, "7 shards for 6 devices"),
    ({"namespace": "prod"}, "'prod' is not on the allow-list"),
    ({"allowed_namespaces": []}, "empty: no namespace allowed"),
    ({"image": ""}, "image must be"),
])
def test_bad_requests_are_refused_with_the_reason(kw, words):
    with pytest.raises(LoadJobError, match=words):
        render(**kw)
