"""Stack-format pieces real platforms need (ThingsBoard first): a one-shot install step, a signal derived
from several Prometheus series, Kafka lag over groups and topics given by pattern."""
import sys
import time

import pytest

from monsoon.observe.collectors import select_metrics
from monsoon.spec.stack import is_pattern, load_stack, metric_terms
from monsoon.spec.yamlio import SpecError
from monsoon.stack.ports import StackError
from monsoon.stack.supervisor import Stack

PY = sys.executable
STACK = """\
name: s
services:
  install:
    command: ["{py}", "-c", "{install}", "{{dir}}/../marker"]
    oneshot: true
{extra}  app:
    command: ["{py}", "-c", "import os,sys,time; os.path.exists(sys.argv[1]) or sys.exit(7); time.sleep(30)", "{{dir}}/../marker"]
    depends_on: [install]
devices: {{port: "1"}}
provisioning: {{kind: none}}
storage: {{dsn: "postgresql://x", loss_query: "select 1"}}
"""
INSTALL_OK = "import sys,time; time.sleep(0.3); open(sys.argv[1], 'w').write('x')"


def stack(tmp_path, install=INSTALL_OK, extra=""):
    p = tmp_path / "s.yaml"
    p.write_text(STACK.format(py=PY, install=install, extra=extra))
    return load_stack(p)


def test_a_oneshot_step_runs_to_completion_before_its_dependents(tmp_path):
    events = []
    with Stack(stack(tmp_path), tmp_path / "run", run_id="oneshot-1",
               on_event=lambda t, **f: events.append(f)) as st:
        app = st.services["app"]
        assert app.proc.poll() is None   # the marker was there when it started (else it exits 7)
    done = [e for e in events if e.get("event") == "done"]
    assert [e["service"] for e in done] == ["install"] and done[0]["code"] == 0 and done[0]["after_s"] >= 0.3
    assert not [e for e in events if e.get("event") == "exit" and e["service"] == "install"]


def test_a_failing_oneshot_step_fails_the_start_with_its_log(tmp_path):
    spec = stack(tmp_path, install="import sys; print('schema broken'); sys.exit(4)")
    with pytest.raises(StackError, match=r"oneshot service 'install' exited with code 4(.|\n)*schema broken"):
        Stack(spec, tmp_path / "run", run_id="oneshot-2").start()


def test_a_oneshot_step_that_never_ends_times_out(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(STACK.format(py=PY, install="import time; time.sleep(30)", extra="").replace(
        "    oneshot: true\n", "    oneshot: true\n    oneshot_timeout: 0.5\n"))
    with pytest.raises(StackError, match=r"oneshot service 'install' still running after [01]s \(oneshot_timeout\)"):
        Stack(load_stack(p), tmp_path / "run", run_id="oneshot-3").start()


@pytest.mark.parametrize("extra, msg", [("    ready: {log: x}\n", "give no ready"),
                                        ("    restart: always\n", "give no restart")])
def test_a_oneshot_step_has_no_readiness_and_no_restart(tmp_path, extra, msg):
    p = tmp_path / "s.yaml"
    p.write_text(STACK.format(py=PY, install=INSTALL_OK, extra="").replace("    oneshot: true\n",
                                                                             "    oneshot: true\n" + extra))
    with pytest.raises(SpecError, match=msg) as ei:
        load_stack(p)
    assert ei.value.key.startswith("services.install")


EXPOSITION = """\
# TYPE ruleEngine_producer_total counter
ruleEngine_producer_total{statsName="totalMsgs",} 1500.0
ruleEngine_producer_total{statsName="successfulMsgs",} 1490.0
# TYPE ruleEngine_Main_total counter
ruleEngine_Main_total{statsName="successfulMsgs",tenantId="system",} 1200.0
ruleEngine_Main_total{statsName="failedMsgs",tenantId="system",} 5.0
ruleEngine_Main_total{statsName="timeoutMsgs",tenantId="system",} 0.0
# TYPE jvm_gc_pause_seconds summary
jvm_gc_pause_seconds_sum{action="end of minor GC",cause="G1 Evacuation Pause",gc="G1 Young Generation",} 0.25
jvm_gc_pause_seconds_sum{action="end of major GC",cause="G1 Compaction Pause",gc="G1 Old Generation",} 1.5
"""


def test_a_derived_signal_is_the_signed_sum_of_its_series():
    got = select_metrics(EXPOSITION, {
        "queue_depth": 'ruleEngine_producer_total{statsName="totalMsgs"} - ruleEngine_Main_total{statsName="successfulMsgs"}'
                       ' - ruleEngine_Main_total{statsName="failedMsgs"} - ruleEngine_Main_total{statsName="timeoutMsgs"}',
        "gc_seconds": "jvm_gc_pause_seconds_sum",
        "half": "ruleEngine_producer_total{statsName=\"totalMsgs\"} - no_such_series"})
    assert got == {"queue_depth": 1500 - 1200 - 5 - 0, "gc_seconds": 1.75}   # a series missing: no signal, no 0


def test_a_derived_signal_that_cannot_be_read_names_the_signal(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_text(STACK.format(py=PY, install=INSTALL_OK, extra="")
                 + "observe: {metrics_url: 'http://x', metrics: {queue_depth: 'a - * b'}}\n")
    with pytest.raises(SpecError, match=r"metrics.queue_depth: cannot read '- \* b'"):
        load_stack(p)
    assert metric_terms('a{x="re-Main-1"} - b') == ((1, 'a{x="re-Main-1"}'), (-1, "b"))


def test_kafka_groups_and_topics_may_be_patterns(tmp_path):
    assert is_pattern("re-Main-consumer-*") and is_pattern("tb_rule_engine.main.[0-9]")
    assert not is_pattern("tb_rule_engine.main") and not is_pattern(None)


SLOW_RESTART = """\
name: s
services:
  app:
    command: ["{py}", "-c", "import os,sys,time; n=os.path.join(sys.argv[1], 'n'); again=os.path.exists(n); open(n, 'w').close(); time.sleep(1.5 if again else 0.1); print('listening', flush=True); time.sleep(60)", "{{dir}}"]
    ready: {{log: "listening", timeout: 10}}
    restart: always
    restart_delay: 0.1
devices: {{port: "1"}}
provisioning: {{kind: none}}
storage: {{dsn: "postgresql://x", loss_query: "select 1"}}
"""


def test_a_restarted_service_is_ready_on_what_it_says_this_time_not_on_its_earlier_log(tmp_path):
    # TB's restart after a pod kill took ~40 s to say "Started ...", but its log already held the first start's
    # line, and the log readiness fired at once: the kill's downtime read 1.2 s
    p = tmp_path / "s.yaml"
    p.write_text(SLOW_RESTART.format(py=PY))
    events = []
    with Stack(load_stack(p), tmp_path / "run", run_id="restart-1",
               on_event=lambda t, **f: events.append(dict(f, t=time.monotonic()))) as st:
        st.kill("app")
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and len([e for e in events if e.get("event") == "ready"]) < 2:
            time.sleep(0.05)
    ready = [e for e in events if e.get("event") == "ready"]
    assert len(ready) == 2, events
    assert ready[1]["after_s"] >= 1.4, ready       # it waited for the restarted process's own "listening"
