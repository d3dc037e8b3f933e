"""From a tail request to its steps (telemetry/request_waits.py): a request's lifetime split into queue, prefill,
decode and preempted spans, and what it waited for, read exactly off the step records."""
import json

import pytest

from batchscope.telemetry import Telemetry
from batchscope.telemetry.request_waits import request_waits, slowest_requests
from synthetic import SyntheticEngine


@pytest.fixture(scope="module")
def crowded():
    """Two seats (max_running=2): r0 (32-token prompt) starts alone, r1 (64) and r2 (16) arrive after its first
    step; r1 joins r0 at once (its prefill shares r0's second step), r2 waits in the queue until r0 is done."""
    eng = SyntheticEngine(gpu=True, mode="sync", max_running=2)
    tel = Telemetry(eng, nvml_hz=0)
    try:
        eng.submit(1, prompt_tokens=32, max_new_tokens=4)
        eng.run(max_steps=1)
        eng.submit(1, prompt_tokens=64, max_new_tokens=4)
        eng.submit(1, prompt_tokens=16, max_new_tokens=2)
        eng.run()
        return json.loads(json.dumps(tel.timeline()))       # as a file carries it
    finally:
        tel.close()


def by_step(tl):
    return {s["step"]: s for s in tl["steps"]}


def test_a_request_sharing_a_step_with_a_prefill_waited_its_token_share_of_that_compute(crowded):
    w = request_waits(crowded["steps"], crowded["requests"], "r0")
    assert [d["step"] for d in w["steps"]] == [0, 1, 2, 3]
    assert [d["phase"] for d in w["steps"]] == ["prefill", "decode", "decode", "decode"]
    s1 = by_step(crowded)[1]
    assert s1["prefill_tokens_by_request"] == {"r1": 64}
    c0, c1 = s1["compute_us"]
    # 64 of the step's 65 tokens were r1's prompt: that share of the step's compute was spent on someone else
    assert w["waits"]["others_prefill_us"] == pytest.approx((c1 - c0) * 64 / 65, abs=0.1)
    assert w["waits"]["others_prefill_us"] == pytest.approx(2033.2, abs=5)     # 2 ms + 1 µs/token, synthetic
    assert (w["waits"]["others_prefill_tokens"], w["waits"]["others_prefill_steps"]) == (64, 1)
    assert w["steps"][1]["others_prefill_tokens"] == 64 and w["steps"][2]["others_prefill_tokens"] == 0
    assert w["unknown"] == []


def test_its_spans_cover_its_lifetime_queue_then_prefill_then_decode(crowded):
    req = next(r for r in crowded["requests"] if r["id"] == "r0")
    w = request_waits(crowded["steps"], crowded["requests"], "r0")
    assert w["lifetime_us"] == [req["arrival_us"], req["finish_us"]]
    phases = [(sp["phase"], sp["first_step"], sp["last_step"]) for sp in w["spans"]]
    assert phases == [("queue", None, None), ("prefill", 0, 0), ("decode", 1, 3)]
    queue, prefill, decode = w["spans"]
    assert (queue["t0_us"], queue["t1_us"]) == (req["arrival_us"], req["scheduled_us"])
    assert prefill["t1_us"] == req["first_token_us"]                 # its prefill ends with its first token
    assert decode["t1_us"] == req["finish_us"]
    assert w["ttft_us"] == pytest.approx(req["first_token_us"] - req["arrival_us"], abs=0.1)
    assert w["itl_max_us"] == pytest.approx(max(b - a for a, b in zip(req["token_us"], req["token_us"][1:])), abs=0.1)


def test_a_request_kept_out_by_a_full_batch_waited_in_the_queue_for_the_others_to_finish(crowded):
    reqs = {r["id"]: r for r in crowded["requests"]}
    w = request_waits(crowded["steps"], crowded["requests"], "r2")
    assert [d["step"] for d in w["steps"]] == [4, 5]
    # it arrived with r1 but got a seat only when r0 finished (after step 3)
    assert w["waits"]["queue_us"] == pytest.approx(reqs["r2"]["scheduled_us"] - reqs["r2"]["arrival_us"], abs=0.1)
    assert w["waits"]["queue_us"] > 6000 and reqs["r2"]["scheduled_us"] > reqs["r0"]["finish_us"]
    assert w["waits"]["others_prefill_us"] == 0.0            # its own prefill in step 4, r1 only decoded there
    # the host gap before its second step (its first one's is its own admission), by cause, to the µs
    s5 = by_step(crowded)[5]
    assert w["waits"]["gap_us"] == pytest.approx(s5["gpu_idle_before_us"], abs=0.1)
    assert w["waits"]["gap_by_cause_us"] == pytest.approx(s5["idle_by_cause_us"], abs=0.1)
    assert w["waits"]["gap_steps"] == 1
    # start: scheduled to its first step's compute
    first_compute = by_step(crowded)[4]["compute_us"][0]
    assert w["waits"]["start_us"] == pytest.approx(first_compute - reqs["r2"]["scheduled_us"], abs=0.1)


def test_the_slowest_requests_come_longest_first_and_an_unknown_id_is_none(crowded):
    rows = slowest_requests(crowded["steps"], crowded["requests"])
    assert rows[0]["id"] == "r2"                                    # the one that queued
    e2e = [r["e2e_ms"] for r in rows]
    assert e2e == sorted(e2e, reverse=True) and len(rows) == 3
    assert rows[0]["modes"] == ["sync"] and rows[0]["output_tokens"] == 2
    assert request_waits(crowded["steps"], crowded["requests"], "r99") is None
    assert len(slowest_requests(crowded["steps"], crowded["requests"], n=1)) == 1


def test_an_older_recording_without_whose_prefill_says_what_it_cannot_split(crowded):
    steps = [{k: v for k, v in s.items() if k != "prefill_tokens_by_request"} for s in crowded["steps"]]
    # r0 had its first token before step 1: it decoded there, so step 1's 64 prompt tokens were all someone else's
    w = request_waits(steps, crowded["requests"], "r0")
    assert w["steps"][1]["phase"] == "decode"
    assert w["waits"]["others_prefill_us"] == request_waits(crowded["steps"], crowded["requests"], "r0")["waits"][
        "others_prefill_us"] == pytest.approx(2033.2, abs=5)
    assert w["unknown"] == []
    # r2 prefilled in step 4 beside r1: how its 16 prompt tokens split, the old record cannot say
    w2 = request_waits(steps, crowded["requests"], "r2")
    assert w2["steps"][0]["others_prefill_us"] is None and w2["steps"][0]["own_prefill_tokens"] is None
    assert w2["waits"]["others_prefill_us"] == 0.0            # step 5, alone: known; step 4: left out, and said
    assert any("others' prefill in 1 of its steps" in u for u in w2["unknown"])


def _step(n, t, ids, prefill=None, preempted=None, tokens=None):
    """A hand-made sync step of 1 ms at t ms: schedule, launch, compute, update; `prefill` {id: tokens}."""
    t *= 1000.0
    prefill = prefill or {}
    rec = {"step": n, "mode": "sync", "num_requests": len(ids), "request_ids": ids,
           "prefill_tokens": sum(prefill.values()), "decode_tokens": len(ids) - len(prefill),
           "cpu": {"schedule": [t, t + 10], "launch": [t + 10, t + 50], "update": [t + 960, t + 1000]},
           "compute_us": [t + 50, t + 950], "gpu_idle_before_us": 50.0 if n else None,
           "idle_by_cause_us": {"launch": 50.0} if n else {}}
    if prefill:
        rec["prefill_tokens_by_request"] = prefill
    if preempted:
        rec["preempted"] = preempted
    return rec


def test_a_preempted_request_waits_from_its_eviction_to_its_return_and_prefills_again():
    steps = [_step(0, 0, ["a"], {"a": 100}),
             _step(1, 1, ["a"]),
             _step(2, 2, ["b"], {"b": 300}, preempted=["a"]),      # b takes its KV blocks
             _step(3, 3, ["b"]),
             _step(4, 4, ["a", "b"], {"a": 101}),                   # a comes back: recomputes prompt + token
             _step(5, 5, ["a"])]
    reqs = [{"id": "a", "arrival_us": 0.0, "scheduled_us": 10.0, "first_token_us": 1000.0, "finish_us": 6000.0,
             "prompt_tokens": 100, "output_tokens": 4, "finish_reason": "length", "preemptions": 1,
             "token_us": [1000.0, 2000.0, 5000.0, 6000.0]}]
    w = request_waits(steps, reqs, "a")
    assert [(sp["phase"], sp["t0_us"], sp["t1_us"]) for sp in w["spans"]] == [
        ("queue", 0.0, 10.0), ("prefill", 10.0, 1000.0), ("decode", 1010.0, 2000.0),
        ("preempted", 2010.0, 4010.0), ("prefill", 4010.0, 5000.0), ("decode", 5010.0, 6000.0)]
    assert w["waits"]["preempted_us"] == 2000.0 and w["waits"]["preemptions"] == 1
    assert [d["resumed"] for d in w["steps"]] == [False, False, True, False]
    # step 4: 101 of its own tokens and b's one decode token: no one else's prefill
    assert w["steps"][2]["others_prefill_us"] == 0.0 and w["waits"]["others_prefill_us"] == 0.0
    assert w["waits"]["gap_us"] == 150.0 and w["waits"]["gap_by_cause_us"] == {"launch": 150.0}
    assert w["unknown"] == []


# ---------------------------------------------------------------------------------------------------- the routes

@pytest.fixture(scope="module")
def routes(crowded):
    """A server holding the live synthetic timeline and, loaded beside it, a replay of the crowded story."""
    from fastapi.testclient import TestClient

    from batchscope.app.server import create_app
    from batchscope.app.server.state import AppState

    eng = SyntheticEngine(gpu=True, mode="async", seed=5)
    tel = Telemetry(eng, nvml_hz=0)
    eng.submit(3, prompt_tokens=8, max_new_tokens=3)
    eng.run()
    state = AppState(telemetry=tel, replay=crowded)
    with TestClient(create_app(state, ui=False)) as c:
        yield c
    tel.close()


def test_the_waits_route_reads_the_replay_or_the_live_timeline(routes, crowded):
    r = routes.get("/api/requests/r2/waits", params={"replay": "true"})
    assert r.status_code == 200, r.text
    assert r.json() == json.loads(json.dumps(request_waits(crowded["steps"], crowded["requests"], "r2")))
    assert r.json()["waits"]["queue_us"] > 6000
    live = routes.get("/api/requests/r2/waits").json()             # the live ring's r2: three 8-token prompts
    assert live["prompt_tokens"] == 8 and live["waits"]["queue_us"] < 1000
    slow = routes.get("/api/requests/slowest", params={"replay": "true", "n": 2}).json()
    assert [row["id"] for row in slow["requests"]] == ["r2", "r0"] and slow["finished"] == 3


def test_an_unknown_request_or_selector_is_a_404_that_says_what_is_missing(routes):
    r = routes.get("/api/requests/nope/waits", params={"replay": "true"})
    assert r.status_code == 404 and "no request 'nope' in the replay" in r.text
    r = routes.get("/api/requests/r0/waits", params={"recording": "gone"})
    assert r.status_code == 404 and "gone" in r.text
    assert routes.get("/api/requests/slowest", params={"n": 0}).status_code == 400
