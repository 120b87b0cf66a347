"""``monsoon init [DIR]``: a starting project in the user's own repository.

It writes the layout monsoon is built around (``stacks/``, ``experiments/``, ``fault-profiles/``, ``pytest/``,
``conftest.py``, ``requirements.txt``, ``README.md``; a ``pytest.ini`` when the folder has no pytest
configuration yet), with one example stack, one burst experiment and one scenario. The example stack runs
monsoon's reference platform, so ``pytest -m burst`` works with no edit once ``monsoon setup`` has built it;
its comments say what to change to point it at the user's own services. An existing file is never
overwritten: the command refuses in one line before writing anything."""
from __future__ import annotations

from pathlib import Path

from monsoon.settings import PROJECT_MARKERS

STACK = """\
# An example stack: monsoon's reference platform (ThingsBoard-style: MQTT -> in-memory queue -> Postgres),
# so that `pytest -m burst` works with no edit. To test YOUR deployment, change each service's `command` to
# what starts your own service in the foreground (a script in this repository: {stack_file_dir}/bin/run-...),
# its `env` to your settings, and `devices`/`storage` to your MQTT endpoint and database.
# `monsoon validate stacks/my-platform.yaml` checks it in one line per problem; `monsoon schema --markdown`
# lists every key.
name: my-platform
description: the reference platform, standing in for my ingestion platform (edit me)
services:
  postgres:
    # {repo}: the files monsoon ships (its service scripts); {dir}: this service's folder in the run directory
    command: ["{repo}/stacks/bin/run-postgres", "{dir}", "{port:postgres}"]
    ready: {tcp: "127.0.0.1:{port:postgres}", timeout: 30}
    stop_signal: SIGINT
    ephemeral: true
  platform:
    # your platform instead: e.g. command: ["{stack_file_dir}/bin/run-my-platform"]
    command: ["{repo}/stacks/reference-platform/bin/reference-platform"]
    requires:
      - {binary: java, hint: "install OpenJDK 17: apt-get install -y openjdk-17-jdk-headless"}
      - {path: "{repo}/stacks/reference-platform/target/reference-platform.jar", hint: "build it with: monsoon setup platform"}
    depends_on: [postgres]
    env:
      TB_QUEUE_TYPE: in-memory
      MQTT_BIND_PORT: "{port:mqtt}"
      HTTP_BIND_PORT: "{port:http}"
      DATABASE_URL: "jdbc:postgresql://127.0.0.1:{port:postgres}/postgres"
      TB_HEAP: {quick: 256m, nightly: 512m, full: 1g}
      TB_GC_LOG: "{dir}/gc.log"
    ready: {http: "http://127.0.0.1:{port:http}/health", timeout: 90}
    restart: always
devices:             # where the simulated devices publish
  protocol: mqtt
  host: 127.0.0.1
  port: "{port:mqtt}"
  topic: v1/devices/me/telemetry
provisioning:        # how devices are registered (thingsboard-rest: ThingsBoard's REST API)
  kind: thingsboard-rest
  url: "http://127.0.0.1:{port:http}"
  username: tenant@thingsboard.org
  password: tenant
storage:             # where monsoon reads back what was stored, to count every acked message
  kind: postgres
  dsn: "postgresql://postgres@127.0.0.1:{port:postgres}/postgres"
  loss_query: >-
    SELECT d.name AS device, kv.long_v AS seq,
    CASE WHEN current_setting('track_commit_timestamp') = 'on'
    THEN (extract(epoch FROM pg_xact_commit_timestamp(kv.xmin)) * 1000)::bigint END AS stored_ms
    FROM ts_kv kv JOIN key_dictionary k ON k.key_id = kv.key JOIN device d ON d.id = kv.entity_id
    WHERE k.key = 'seq'
  count_query: >-
    SELECT count(*) FROM ts_kv WHERE key = (SELECT key_id FROM key_dictionary WHERE key = 'seq')
observe:             # the platform's Prometheus metrics (heap, queue depth, counters)
  service: platform
  metrics_url: "http://127.0.0.1:{port:http}/metrics"
  metrics:
    heap_used: 'jvm_memory_used_bytes{area="heap"}'
    heap_max: 'jvm_memory_max_bytes{area="heap"}'
    queue_depth: tb_queue_size
    received: tb_messages_received_total
    acked: tb_messages_acked_total
    stored: tb_messages_stored_total
    gc_seconds: jvm_gc_collection_seconds_sum
"""

EXPERIMENT = """\
# An example burst experiment: x1, then x3 for the burst, then x1 while the backlog drains.
# Change `devices` and `base_rate` to your fleet (base_rate: auto calibrates x1 from your stack's capacity).
name: my-burst
description: x3 burst flood, small enough for a quick run
marks: [burst]
load:
  devices: 20
  qos: 1
  base_rate: 100          # x1 in msg/s, all devices together
  shape: {kind: burst, multiplier: 3}
profiles:                 # seconds per phase; pytest --monsoon-profile=quick|nightly|full
  quick:   {warmup: 5, burst: 10, recovery: 10, drain_timeout: 60}   # a smoke run: under a minute
  nightly: {warmup: 120, burst: 600, recovery: 900, drain_timeout: 600}
  full:    {warmup: 300, burst: 900, recovery: 1800, drain_timeout: 1200}
checks:                   # what judges the run (monsoon schema --markdown lists every check)
  - no_oom
  - no_acked_loss
  - lag_recovers_within: {seconds: {quick: 60, nightly: 300, full: 600}}
"""

SCENARIO = '''\
"""Burst floods against my platform (and, for comparison, monsoon's own in-memory stack).

Run:  pytest -m burst                       (quick profile)
      pytest -m burst --monsoon-dry-run     (validate and print what would run; starts nothing)
"""
import pytest


@pytest.mark.burst
@pytest.mark.parametrize("stack", ["my-platform"])   # stacks/my-platform.yaml; add monsoon's own, e.g. "kafka"
def test_burst(monsoon, stack):
    monsoon.run(stack, "my-burst").assert_pass()        # experiments/my-burst.yaml
'''

CONFTEST = """\
# monsoon's pytest plugin is loaded from its entry point: nothing to add here.
# Your own checks: def pytest_monsoon_add_checks(register): register("my_check", fn)
"""

REQUIREMENTS = """\
# monsoon and its extras: monsoon[containers] (provider: docker stacks), monsoon[cassandra], monsoon[kube]
monsoon
"""

PYTEST_INI = """\
[pytest]
testpaths = pytest
monsoon_profile = quick
# monsoon_specs = specs/      more folders of stacks/, experiments/, fault-profiles/ (searched first)
"""

FAULTS_README = """\
# Fault profiles

A fault profile here (`<kind>.yaml`, e.g. `network-latency.yaml`) is found by name before monsoon's own.
An experiment names one under `faults:` and may override its `params` and `schedule`.
"""

README = """\
# Chaos and soak tests with monsoon

    pip install -r requirements.txt
    monsoon setup platform postgres       # the reference platform and PostgreSQL (once; + kafka for monsoon's kafka stack)
    pytest -m burst                       # pytest/test_burst.py on the quick profile
    pytest -m burst --monsoon-dry-run     # what would run, nothing started

- `stacks/`: deployments under test (`stacks/my-platform.yaml` runs the reference platform: edit it)
- `experiments/`: load shapes, durations per profile, checks, faults (`experiments/my-burst.yaml`)
- `fault-profiles/`: faults of your own (monsoon's are found too: `network-latency`, `pod-kill`, ...)
- `pytest/`: the scenarios; `runs/`: one folder per run (checklist.md, report.html, timelines)

Specs are found by name here first, then in monsoon's own (`inmemory`, `kafka`, `burst-x3`, ...).
`monsoon validate` checks every spec of this project; `-p no:monsoon` switches the plugin off.
"""


def files(has_pytest_config: bool) -> dict[str, str]:
    out = {
        "stacks/my-platform.yaml": STACK,
        "experiments/my-burst.yaml": EXPERIMENT,
        "fault-profiles/README.md": FAULTS_README,
        "pytest/test_burst.py": SCENARIO,
        "conftest.py": CONFTEST,
        "requirements.txt": REQUIREMENTS,
        "README.md": README,
    }
    if not has_pytest_config:
        out["pytest.ini"] = PYTEST_INI
    return out


class InitError(RuntimeError):
    pass


def init(folder: Path) -> list[Path]:
    """Write the starting project into ``folder``; refuses (one line, nothing written) if a file exists."""
    folder = Path(folder)
    planned = files(any((folder / m).is_file() for m in PROJECT_MARKERS))
    there = [rel for rel in planned if (folder / rel).exists()]
    if there:
        raise InitError(f"monsoon init: {folder / there[0]} exists"
                        + (f" (and {len(there) - 1} more)" if len(there) > 1 else "")
                        + ": nothing written; run it in a folder without them")
    written = []
    for rel, text in planned.items():
        p = folder / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
        written.append(p)
    return written
