"""The request mix's pure parts: the spec, the open-model schedule, the per-operation windows, the judge, the
decision and the report (monsoon/load/mix.py, monsoon/spec/mix.py, monsoon/run/mix.py, monsoon/report/mix.py)."""
from __future__ import annotations

import asyncio
import threading

import pytest

from monsoon.load.mix import (DEFAULT_FORMS, MixClient, MixCriteria, MixDevice, OpStats, check_answer, judge_ops,
                              ops_failures, per_second_counts, render_request, schedule_second)
from monsoon.load.shapes import Stage, Stages
from monsoon.report import mix as report
from monsoon.run.calibrate import Criteria, Step, step_failures, verdict
from monsoon.report.result import StackUnavailable
from monsoon.run.mix import RampMix, describe_mix, mix_decision, plan_mix
from monsoon.session import MonsoonSession
from monsoon.spec.experiment import load_experiment
from monsoon.spec.mix import MixSpec
from monsoon.spec.stack import load_stack
from monsoon.spec.yamlio import SpecError


def test_shares_normalise_the_weights_and_writes_must_carry_the_ramp():
    m = MixSpec(weights={"read": 4, "search": 2, "write": 3, "modify": 1})
    assert m.shares() == {"read": 0.4, "search": 0.2, "write": 0.3, "modify": 0.1}
    assert MixSpec(weights={"write": 1, "read": 0}).shares() == {"write": 1.0}
    with pytest.raises(ValueError, match="write must be > 0"):
        MixSpec(weights={"read": 1})
    with pytest.raises(ValueError):
        MixSpec(weights={"write": 1, "delete": 1})


def test_fractions_carry_over_so_a_rare_op_still_runs():
    carry: dict[str, float] = {}
    sent = [per_second_counts(10, {"read": 0.5, "modify": 0.03}, carry) for _ in range(10)]
    assert all(s["read"] == 5 for s in sent)
    assert sum(s["modify"] for s in sent) == 3           # 0.3/s over 10 s


def test_a_second_is_spread_evenly_and_interleaved():
    sched = schedule_second({"read": 2, "search": 1, "modify": 0})
    assert sched == [(0.25, "read"), (0.5, "search"), (0.75, "read")]


def test_op_windows_count_and_take_percentiles():
    st = OpStats("read")
    for s in range(4):
        st.at(s).scheduled += 10
        st.at(s).sent += 10
        for k in range(10):
            st.answered(s, 0.001 * (k + 1) * (s + 1), None)
    st.error(3, "HTTP 500: boom")
    w = st.window(1, 3)
    assert (w["scheduled"], w["ok"], w["errors"], w["seconds"], w["ok_rate"]) == (20, 20, 0, 2, 10.0)
    assert w["p50_ms"] <= w["p99_ms"] <= w["p999_ms"] <= w["max_ms"] == pytest.approx(30, rel=0.01)
    t = st.totals(4.0)
    assert t["errors"] == 1 and t["first_error"] == "HTTP 500: boom" and t["error_kinds"] == {"HTTP 500": 1}


def win(scheduled=100, errors=0, refused=0, late=0, p99=10.0):
    return {"scheduled": scheduled, "errors": errors, "refused": refused, "late": late, "p99_ms": p99}


def test_the_judge_names_generator_then_errors_then_latency():
    base = {"read": win(), "search": win()}
    assert judge_ops({"read": win(), "search": win(p99=40)}, base) == (None, "")
    crit, why = judge_ops({"read": win(errors=5, refused=5), "search": win()}, base)
    assert crit == "errors" and "read: 5 of 100 failed" in why and "too many in-flight" in why
    assert judge_ops({"read": win(errors=1)}, base)[0] is None             # 1 % is allowed
    crit, why = judge_ops({"read": win(), "search": win(p99=400)}, base)
    assert crit == "latency-knee" and why.startswith("search: p99 400 ms")
    assert judge_ops({"read": win(p99=200)}, {"read": win(p99=10)})[0] is None   # under the 250 ms floor
    assert judge_ops({"read": win(late=60, errors=50)}, base)[0] == "generator"
    assert judge_ops({"read": win(errors=3)}, base, MixCriteria(error_fraction=0.05))[0] is None


def test_the_ramp_side_sends_the_total_rate_and_judges_against_the_first_step():
    class Client:
        started: list[float] = []

        def start(self, rates):
            self.started = rates

        def window(self, a, b):
            return {"read": win(p99=10 if a < 10 else 100)}
    c = Client()
    rm = RampMix(c, 0.25, MixCriteria())   # type: ignore[arg-type]
    rm.start(Stages((Stage("warmup", 2.0, 25.0), Stage("step00", 3.0, 50.0))))
    assert c.started == [100.0, 100.0, 200.0, 200.0, 200.0]
    first, later = rm.window(200, 0, 5), rm.window(400, 10, 15)
    assert first["ops_target"] == 200 and rm.judge(first, None) == (None, "")
    assert rm.judge(later, first)[0] is None                    # 100 ms: 10 x, but under the floor


def step(i, ok, target, criterion=None, reason=""):
    return Step(i, target * 0.3, 4.0, ok=ok, criterion=criterion, reason=reason,
                mix={"ops_target": target, "ops": {"read": {"ok_rate": target * 0.4}}})


def test_the_decision_is_the_last_step_kept_up_and_what_stopped_the_next():
    d = mix_decision([step(0, True, 100), step(1, True, 200), step(2, False, 400, "gc", "saturated by GC: 40%")],
                     True)
    assert d["capacity_ops_s"] == 200 and d["criterion"] == "gc"
    assert d["result"] == "capacity 200 ops/s (stopped by gc: at 400 ops/s: saturated by GC: 40%)"
    assert mix_decision([step(0, False, 100, "errors", "x")], True)["capacity_ops_s"] is None
    top = mix_decision([step(0, True, 100)], True)
    assert top["criterion"] == "max-rate" and report.capacity_verdict(top).verdict == "fail"
    gen = mix_decision([step(0, True, 100), step(1, False, 200, "generator", "late")], True)
    assert gen["generator_bound"] and report.capacity_verdict(gen).verdict == "fail"


def record():
    ops = {"read": {"ok_rate": 80.0, "p50_ms": 2.0, "p99_ms": 9.0, "p999_ms": 20.0, "errors": 0, "refused": 0},
           "modify": {"ok_rate": 20.0, "p50_ms": 1.0, "p99_ms": 3.0, "p999_ms": 4.0, "errors": 2, "refused": 0}}
    return {"stack": "kafka-registry", "experiment": "mix-story", "profile": "quick", "shares": {"read": 0.4,
            "write": 0.5, "modify": 0.1}, "capacity_ops_s": 200.0, "criterion": "gc", "generator_bound": False,
            "result": "capacity 200 ops/s (stopped by gc: ...)", "capacity_step_ops": ops, "ops": ops,
            "warmup": {"entities": 3, "found": 3, "seconds": 0.5, "lookup": {"ok": 3, "errors": 0, "p99_ms": 5.0},
                       "read": {"ok": 3, "errors": 0, "p99_ms": 7.0, "p50_ms": 3.0, "p999_ms": 7.0}},
            "steps": [step(0, True, 200).to_dict(), step(1, False, 400, "gc", "saturated").to_dict()]}


def test_the_report_has_the_operations_the_warm_up_apart_and_the_verdicts():
    rec = record()
    cap = report.capacity_verdict(rec)
    assert cap.verdict == "pass" and cap.figures["capacity_ops_s"] == 200 and cap.figures["p999_ms[read]"] == 20
    warm = report.warmup_verdict(rec)
    assert warm.verdict == "pass" and warm.figures["warmup_p99_ms[read]"] == 7.0
    rec["warmup"]["found"] = 2
    assert report.warmup_verdict(rec).verdict == "fail"
    md = report.markdown(rec, [cap.to_dict()])
    assert "| read | 40% | 80.0 | 2.0 | 9.0 | 20.0 | 0 | 0 |" in md and "| modify | 10% |" in md
    assert "## Warm-up (judged apart): 2 of 3 entities" in md and "| 1 | 400 |" in md and "gc: saturated" in md
    r = report.MixResult.from_record(rec, "/tmp/x", "quick")   # type: ignore[arg-type]
    d = r.to_dict()
    assert d["kind"] == "request-mix" and d["figures"]["capacity_ops_s"] == 200
    assert "| read | 40% |" not in r.failure_message() and "read | 40% | 80.0" in r.failure_message()


def test_a_mix_is_planned_before_anything_starts():
    exp = load_experiment("mix-story")
    assert plan_mix(load_stack("kafka-registry"), exp, "quick") is exp
    with pytest.raises(SpecError, match="load.mix"):
        plan_mix(load_stack("kafka-registry"), load_experiment("size-sweep-story"), "quick")
    with pytest.raises(SpecError, match="provisioning kind none"):
        s = load_stack("kafka-registry")
        plan_mix(s.model_copy(update={"provisioning": s.provisioning.model_copy(update={"kind": "none"})}), exp,
                 "quick")


def test_modify_needs_one_topic_not_thingsboards_pattern():
    with pytest.raises(SpecError, match="is a pattern"):
        plan_mix(load_stack("thingsboard-kafka"), load_experiment("mix-story"), "quick")


def test_modify_needs_a_kafka_topic_and_the_client_says_so():
    with pytest.raises(ValueError, match="Kafka topic"):
        MixClient("http://127.0.0.1:1", "u", "p", [MixDevice("d")], shares={"modify": 1.0})


# --- request forms (load.mix.requests): the platform's own read and search, ThingsBoard's among them

def test_request_forms_default_to_read_and_search_and_an_experiment_adds_its_own():
    m = MixSpec(weights={"read": 1, "history": 1, "write": 1},
                requests={"history": {"path": "/api/x/{id}", "params": {"startTs": "{since_ms}"}}})
    assert set(m.forms()) == {"read", "search", "history"} and list(m.shares()) == ["read", "write", "history"]
    assert m.resolved("quick")["requests"]["history"] == {"method": "GET", "path": "/api/x/{id}",
                                                          "params": {"startTs": "{since_ms}"}}
    with pytest.raises(ValueError, match="weights.history: no such operation .*add one under load.mix.requests"):
        MixSpec(weights={"history": 1, "write": 1})
    with pytest.raises(ValueError, match=r"unknown placeholder \{device\}"):
        MixSpec(weights={"write": 1}, requests={"read": {"path": "/api/{device}"}})
    with pytest.raises(ValueError, match="a body goes with method: POST"):
        MixSpec(weights={"write": 1}, requests={"q": {"path": "/q", "body": {"a": 1}}})
    with pytest.raises(ValueError, match="not write or modify"):
        MixSpec(weights={"write": 1}, requests={"write": {"path": "/w"}})


def test_a_form_is_rendered_for_a_device_and_its_answer_checked():
    form = {"method": "POST", "path": "/api/entitiesQuery/find/{id}", "params": {"k": "{keys}", "from": "{since_ms}"},
            "body": {"entityFilter": {"deviceTypes": ["{type}"], "deviceNameFilter": "{name_prefix}"},
                     "pageLink": {"pageSize": 10}, "raw": "{unknown} {now_ms}"}, "expect": "data"}
    method, path, params, body = render_request(form, MixDevice("monsoon-00017", "uuid-1", "default"),
                                                keys="seq,t", now_ms=100_000, range_s=60)
    assert (method, path, params) == ("POST", "/api/entitiesQuery/find/uuid-1", {"k": "seq,t", "from": "40000"})
    assert body == {"entityFilter": {"deviceTypes": ["default"], "deviceNameFilter": "monsoon-0001"},
                    "pageLink": {"pageSize": 10}, "raw": "{unknown} 100000"}
    assert form["body"]["entityFilter"]["deviceTypes"] == ["{type}"]      # the form itself is untouched
    check_answer("search", form, {"data": [{"entityId": {}}]})
    with pytest.raises(RuntimeError, match="search: nothing in 'data'"):
        check_answer("search", form, {"data": [], "totalElements": 0})
    with pytest.raises(RuntimeError, match="read: not a JSON object"):
        check_answer("read", {}, [1, 2])
    check_answer("read", {}, {})                                         # no telemetry yet: still an answer


def test_the_client_needs_a_form_for_every_http_operation_and_a_read_for_the_warm_up():
    with pytest.raises(ValueError, match="no request form for history"):
        MixClient("http://127.0.0.1:1", "u", "p", [MixDevice("d")], shares={"history": 1.0})
    with pytest.raises(ValueError, match="warm-up reads every device"):
        MixClient("http://127.0.0.1:1", "u", "p", [MixDevice("d")], shares={"q": 1.0},
                  forms={"q": {"path": "/q"}})


def test_thingsboards_mix_is_planned_without_modify_and_says_its_requests():
    stack, exp = load_stack("thingsboard-kafka"), load_experiment("mix-thingsboard")
    assert plan_mix(stack, exp, "quick") is exp
    assert exp.load.mix is not None and "modify" not in exp.load.mix.weights
    text = describe_mix(stack, exp, "quick", "r")
    assert "search POST /api/entitiesQuery/find" in text and "history GET /api/plugins/telemetry" in text
    with pytest.raises(SpecError, match="ThingsBoard's protobuf"):
        plan_mix(stack, load_experiment("mix-story"), "quick")


def test_a_mix_on_a_stack_whose_jar_is_missing_skips_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr("monsoon.stack.supervisor.CACHE", tmp_path / "cache")   # no jar there
    s = MonsoonSession(runs_dir=tmp_path / "runs", progress=lambda m: None, dry_run=True)   # never starts a stack
    with pytest.raises(StackUnavailable, match="thingsboard-4.2.1-boot.jar") as e:
        s.mix("thingsboard-kafka", "mix-thingsboard", skip_unavailable=True)
    assert "\n" not in str(e.value) and not s.results


def test_the_client_logs_in_and_sends_each_form_as_rendered(tmp_path):
    """Against a small HTTP server on 127.0.0.1 shaped as ThingsBoard's REST API (login, device by name, the
    forms): the warm-up finds and reads every device, then two seconds of the mix send the POST form with its
    body filled and the JWT, and count a 500 as that operation's error."""
    from aiohttp import web
    seen: list[tuple[str, str, str, object]] = []

    async def login(req):
        return web.json_response({"token": "T"})

    async def by_name(req):
        return web.json_response({"id": {"id": "id-" + req.query["deviceName"]}, "type": "meter"})

    async def read(req):
        seen.append(("read", req.match_info["id"], req.headers.get("X-Authorization", ""), None))
        return web.json_response({"seq": [{"ts": 1, "value": "1"}]})

    async def query(req):
        seen.append(("search", "", req.headers.get("X-Authorization", ""), await req.json()))
        return web.json_response({"data": [{"x": 1}]})

    async def broken(req):
        return web.Response(status=500, text="boom")

    app = web.Application()
    app.add_routes([web.post("/api/auth/login", login), web.get("/api/tenant/devices", by_name),
                    web.get("/api/plugins/telemetry/DEVICE/{id}/values/timeseries", read),
                    web.post("/api/entitiesQuery/find", query), web.get("/api/broken", broken)])
    runner = web.AppRunner(app)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(runner.setup())
    site = web.TCPSite(runner, "127.0.0.1", 0)
    loop.run_until_complete(site.start())
    port = runner.addresses[0][1]
    server = threading.Thread(target=loop.run_forever, daemon=True)
    server.start()
    try:
        forms = {"read": DEFAULT_FORMS["read"],
                 "search": {"method": "POST", "path": "/api/entitiesQuery/find", "expect": "data",
                            "body": {"entityFilter": {"type": "deviceType", "deviceTypes": ["{type}"],
                                                      "deviceNameFilter": "{name_prefix}"}}},
                 "broken": {"path": "/api/broken"}}
        c = MixClient(f"http://127.0.0.1:{port}", "u", "p", [MixDevice("dev-11"), MixDevice("dev-12")],
                      shares={"read": 0.4, "search": 0.4, "broken": 0.2}, forms=forms)
        w = c.warm_up()
        assert (w["found"], w["read"]["ok"], w["read"]["errors"]) == (2, 2, 0)
        c.start([10.0, 10.0])
        c.join(30)
        c.stop()
        t = c.totals()
        assert (t["read"]["ok"], t["search"]["ok"], t["broken"]["ok"]) == (8, 8, 0)
        assert t["broken"]["errors"] == 4 and t["broken"]["first_error"].startswith("RuntimeError: HTTP 500: boom")
        bodies = [b for op, _, _, b in seen if op == "search"]
        assert bodies and all(b == {"entityFilter": {"type": "deviceType", "deviceTypes": ["meter"],
                                                     "deviceNameFilter": "dev-1"}} for b in bodies)
        assert {i for op, i, _, _ in seen if op == "read"} == {"id-dev-11", "id-dev-12"}
        assert {a for _, _, a, _ in seen} == {"Bearer T"}
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        server.join(5)


def test_every_failed_criterion_of_a_mix_step_is_named_not_only_the_first():
    """ThingsBoard's first mix run: the writes' stored-rate hid the reads' timeouts; both must be named."""
    base = {"read": win(), "history": win(), "search": win()}
    ops = {"read": win(errors=60, refused=20) | {"timeouts": 40}, "history": win(errors=30) | {"timeouts": 30},
           "search": win(p99=6500)}
    fails = ops_failures(ops, base)
    assert [c for c, _ in fails] == ["errors", "latency-knee"]
    errors = fails[0][1]
    assert "read: 60 of 100 failed (60%, 40 timed out (10 s), 20 refused" in errors and "history: 30 of 100" in errors
    assert fails[1][1].startswith("search: p99 6,500 ms")
    writes = Step(3, 16.0, 6.0, scheduled=96, sent=96, acked=96, stored_rate=13.0, gc_fraction=0.4)
    crit, reason, names = verdict(step_failures(writes, None, Criteria(gc_fraction=0.25)) + fails)
    assert crit == "stored-rate" and names == ["stored-rate", "gc", "errors", "latency-knee"]
    assert reason.startswith("stored 13/s < 90% of sent 16/s; gc: saturated by GC: 40%")
    assert "; errors: read: 60 of 100" in reason and "; latency-knee: search: p99" in reason
    assert verdict([]) == (None, "", [])
    assert ops_failures(base, base) == []


def test_timeouts_are_counted_apart_in_a_window():
    st = OpStats("read")
    st.answered(0, 10.0, "TimeoutError", timeout=True)
    st.answered(0, 0.5, "HTTP 500: x")
    st.error(1, "refused: too many in-flight requests")
    w = st.window(0, 2)
    assert (w["errors"], w["timeouts"]) == (3, 1)
