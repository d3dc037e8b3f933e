"""A streamed token's delivery is measured: when its chunk was written to the client (`sent_us`) beside when the
engine made it (`token_us`), in the timeline, its summary and /metrics."""
from __future__ import annotations

import re
import time

import httpx
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from batchscope.app.loadtest.specs import Limits
from batchscope.app.loadtest.statuses import BurstResults
from batchscope.app.ui.page_html import results_html
from batchscope.telemetry.delivery import Deliveries
from helpers import tiny_app_server

MODEL = "tiny-random"


def us(ns: int) -> float:
    return ns / 1000.0


def test_write_times_join_the_token_times_whichever_comes_first():
    d = Deliveries(us)
    early = {"id": "a", "token_us": [10.0, 20.0, 30.0], "sent_us": None}
    d.sent("a", [15_000, 19_000, 45_000])            # the stream ended before the recorder saw the finish
    d.finished(early)
    assert early["sent_us"] == [15.0, 20.0, 45.0]     # one chunk written inside the update span: at its end
    late = {"id": "b", "token_us": [5.0, 6.0], "sent_us": None}
    d.finished(late)
    assert late["sent_us"] is None
    d.sent("b", [7_000])                              # the client left after one token
    assert late["sent_us"] == [7.0]
    counts, total = d.delay.snapshot()
    assert sum(counts) == 4 and total == pytest.approx((5 + 0 + 15 + 2) / 1e6)
    assert d.joined == 2


@pytest.fixture(scope="module")
def server():
    with tiny_app_server(Limits(max_prompt_tokens=256, max_new_tokens=64, max_burst_requests=8), ui=False) as srv:
        yield srv


def delivery_metric(url: str) -> tuple[float, float]:
    """(count, sum) of batchscope_delivery_delay_seconds."""
    text = httpx.get(url + "/metrics").text
    for fam in text_string_to_metric_families(text):
        if fam.name == "batchscope_delivery_delay_seconds":
            values = {s.name: s.value for s in fam.samples}
            return values["batchscope_delivery_delay_seconds_count"], values["batchscope_delivery_delay_seconds_sum"]
    raise AssertionError("no batchscope_delivery_delay_seconds in /metrics")


def test_streamed_tokens_say_when_they_were_written_and_metrics_show_the_delay(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    count0, _ = delivery_metric(server.url)
    kw = dict(model=MODEL, temperature=0, extra_body={"ignore_eos": True})
    list(client.completions.create(prompt=["Once upon a time", "The sea"], max_tokens=11, stream=True, **kw))
    list(client.chat.completions.create(messages=[{"role": "user", "content": "Hi"}], max_tokens=7, stream=True,
                                        **kw))
    client.completions.create(prompt="Not streamed", max_tokens=5, **kw)
    streamed = 2 * 11 + 7

    deadline = time.monotonic() + 10
    while True:          # a stream can end a moment before the recorder sees its request finish
        tl = httpx.get(server.url + "/api/timeline.json").json()
        reqs = {r["output_tokens"]: [] for r in tl["requests"]}
        for r in tl["requests"]:
            reqs[r["output_tokens"]].append(r)
        joined = [r for n in (11, 7) for r in reqs.get(n, []) if r.get("sent_us")]
        if len(joined) == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(joined) == 3, [(r["id"], r["output_tokens"], r.get("sent_us")) for r in tl["requests"]]
    for r in joined:
        made, sent = r["token_us"], r["sent_us"]
        assert len(sent) == len(made) == r["output_tokens"]
        assert all(s >= t for t, s in zip(made, sent)), (made, sent)
        assert sent == sorted(sent)
    assert sum(s - t for r in joined for t, s in zip(r["token_us"], r["sent_us"])) > 0
    assert [r["sent_us"] for r in reqs[5]] == [None]                  # not streamed: nothing written per token

    summary = tl["summary"]
    assert summary["requests_streamed"] == 3
    assert summary["delivery_delay_ms"]["n"] == streamed
    assert 0 <= summary["delivery_delay_ms"]["p50"] <= summary["delivery_delay_ms"]["p99"]

    count, total = delivery_metric(server.url)
    assert count - count0 == streamed and total > 0


def test_a_client_that_leaves_mid_stream_has_only_the_tokens_it_was_sent(server):
    body = {"model": MODEL, "prompt": "Far away", "max_tokens": 60, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        got = [line for line, _ in zip(lines, range(6)) if line.startswith("data:")]
    assert got, "no chunk came"
    deadline = time.monotonic() + 10
    while True:
        tl = httpx.get(server.url + "/api/timeline.json").json()
        left = [r for r in tl["requests"] if r["finish_reason"] == "cancelled" and r.get("sent_us")]
        if left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(left) == 1, [(r["id"], r["finish_reason"], r.get("sent_us")) for r in tl["requests"]]
    (req,) = left
    assert 1 <= len(req["sent_us"]) < 60 and len(req["sent_us"]) <= len(req["token_us"])
    assert all(s >= t for t, s in zip(req["token_us"], req["sent_us"]))


def test_a_named_recording_shifts_write_times_with_token_times():
    """A recording cut from the ring starts its clock at its own start: the chunk write times move with the token
    times, so the delivery delay (written minus made) is the same in it as live."""
    from batchscope.telemetry.export import shift_request

    rec = {"id": "r", "arrival_us": 1000.0, "first_token_us": 1500.0, "finish_us": 1700.0,
           "token_us": [1500.0, 1600.0, 1700.0], "sent_us": [1520.0, 1630.0, 1750.0]}
    out = shift_request(rec, -1000.0)
    assert out["token_us"] == [500.0, 600.0, 700.0] and out["sent_us"] == [520.0, 630.0, 750.0]
    assert [s - t for s, t in zip(out["sent_us"], out["token_us"])] == [20.0, 30.0, 50.0]
    assert shift_request({**rec, "sent_us": None}, -1000.0)["sent_us"] is None


def test_an_in_process_burst_records_when_each_token_reached_its_sender(server):
    """The A/B/burst sender is the in-process run's client: each token's arrival at it is its delivery, so burst
    requests have `sent_us` and feed the delay histogram as streamed ones do."""
    count0, _ = delivery_metric(server.url)
    spec = {"num_requests": 4, "prompt_tokens": [4, 12], "max_new_tokens": [9, 9], "arrival": "burst",
            "ignore_eos": True, "seed": 3}
    burst_id = httpx.post(server.url + "/api/burst", json=spec, timeout=30).json()["burst_id"]
    deadline = time.monotonic() + 60
    while httpx.get(f"{server.url}/api/bursts/{burst_id}").json()["state"] == "running":
        assert time.monotonic() < deadline
        time.sleep(0.05)
    while True:
        tl = httpx.get(server.url + "/api/timeline.json").json()
        joined = [r for r in tl["requests"] if r["output_tokens"] == 9 and r.get("sent_us")]
        if len(joined) >= 4 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(joined) == 4, [(r["id"], r["output_tokens"], r.get("sent_us")) for r in tl["requests"]]
    for r in joined:
        assert len(r["sent_us"]) == len(r["token_us"]) == 9
        assert all(s >= t for t, s in zip(r["token_us"], r["sent_us"])) and r["sent_us"] == sorted(r["sent_us"])
    count, _ = delivery_metric(server.url)
    assert count - count0 == 4 * 9
    # the burst's own results carry the delay its window measured, and the page's results table shows it
    results = BurstResults(**httpx.get(f"{server.url}/api/bursts/{burst_id}").json()["results"])
    delay = results.telemetry["delivery_delay_ms"]
    assert delay["n"] == 4 * 9 and 0 <= delay["p50"] <= delay["p99"]
    row = re.search(r'<tr class="bs-delivery".*?</tr>', results_html(results)).group(0)
    assert "delivery delay" in row and "unknown" not in row
    assert results_html(results.model_copy(update={"telemetry": {}})).count("unknown") == 3    # nothing streamed


def test_streams_go_out_through_httptools_on_asyncio_s_loop():
    """h11's Python state machine was 18% of the event loop's samples streaming to 240 clients on the H200; the C
    parser is a dependency and uvicorn picks it. uvloop, where installed, is not: it doubled the engine's token gap
    on the CPU demo."""
    from fastapi import FastAPI

    from batchscope.app.server.app import uvicorn_config

    config = uvicorn_config(FastAPI())
    config.load()
    assert config.http_protocol_class.__name__ == "HttpToolsProtocol"
    assert config.loop == "asyncio"
