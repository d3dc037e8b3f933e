"""The OpenAI-compatible routes, driven by the official `openai` client (streaming included)."""
import json

import httpx
import openai
import pytest

from batchscope.app.loadtest.specs import Limits
from batchscope.app.server import ServerThread, create_app
from batchscope.app.server.state import AppState
from batchscope.engine.config import EngineConfig

MODEL = "tiny-random"


@pytest.fixture(scope="module")
def server():
    state = AppState.load(EngineConfig(model=MODEL, device="cpu", dtype="float32", num_blocks=256,
                                       max_batch_tokens=256, max_running=32),
                          Limits(max_prompt_tokens=256, max_new_tokens=64, max_burst_requests=8))
    srv = ServerThread(create_app(state, ui=False)).start()
    yield srv
    srv.stop()
    state.close()


@pytest.fixture(scope="module")
def client(server):
    # no retries: a test must see the first answer, and a 4xx is never worth retrying
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_models_lists_the_loaded_model(client, server):
    assert [m.id for m in client.models.list()] == [MODEL]
    # `vllm bench serve` reads data[0].root as the model id and its default tokenizer
    card = httpx.get(server.url + "/v1/models").json()["data"][0]
    assert card["root"] and card["max_model_len"] == 4096
    from transformers import AutoTokenizer
    assert AutoTokenizer.from_pretrained(card["root"]).encode("Hello")


def test_completion_fixed_length_with_usage(client):
    r = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and r.model == MODEL
    assert r.choices[0].finish_reason == "length" and r.choices[0].text
    assert r.usage.completion_tokens == 8 and r.usage.total_tokens == r.usage.prompt_tokens + 8


def test_completion_stream_matches_non_stream(client):
    kw = dict(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(**kw).choices[0].text
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and all(f is None for f in finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_completion_with_token_ids_and_several_prompts(client):
    r = client.completions.create(model=MODEL, prompt=["first prompt", "second"], max_tokens=4, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert sorted(c.index for c in r.choices) == [0, 1] and r.usage.completion_tokens == 8
    r = client.completions.create(model=MODEL, prompt=[1500, 1501, 1502], max_tokens=3, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.usage.prompt_tokens == 3 and r.usage.completion_tokens == 3


def test_several_prompts_stream_interleaved(client):
    """Two prompts in one streamed request run in one batch: their deltas arrive mixed, as the engine produces
    them, not one whole answer after the other; each delta is credited to its own prompt."""
    kw = dict(model=MODEL, prompt=["a b c", "d e f"], max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    chunks = [c for c in client.completions.create(stream=True, **kw) if c.choices]
    order = [c.choices[0].index for c in chunks]
    done = [c.choices[0].index for c in chunks if c.choices[0].finish_reason]
    assert sorted(done) == [0, 1]
    switches = sum(a != b for a, b in zip(order, order[1:]))
    assert switches >= 3, f"one answer after the other would switch once: {order}"
    streamed = ["".join(c.choices[0].text for c in chunks if c.choices[0].index == i) for i in (0, 1)]
    whole = sorted(client.completions.create(**kw).choices, key=lambda c: c.index)
    assert streamed == [c.text for c in whole]


def test_seeded_sampling_is_reproducible(client):
    kw = dict(model=MODEL, prompt="seeded", max_tokens=8, top_p=0.9, extra_body={"ignore_eos": True, "top_k": 50})

    def text(**sampling) -> str:
        return client.completions.create(**kw, **sampling).choices[0].text

    greedy = text(temperature=0)
    seeded = text(temperature=1.0, seed=1234)
    assert seeded != greedy                                # it really sampled
    assert text(temperature=1.0, seed=1234) == seeded      # and the seed alone decides what
    assert text(temperature=1.0, seed=99) != seeded


def test_stop_string_ends_the_text(client):
    kw = dict(model=MODEL, prompt="Stop me", max_tokens=24, temperature=0, extra_body={"ignore_eos": True})
    full = client.completions.create(**kw).choices[0].text
    stop = full[len(full) // 2:len(full) // 2 + 3]
    assert stop.strip(), f"need visible text to cut at: {full!r}"
    r = client.completions.create(stop=[stop], **kw)
    assert r.choices[0].finish_reason == "stop"
    assert stop not in r.choices[0].text and full.startswith(r.choices[0].text)


def test_chat_completion_and_stream(client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello!"}]
    r = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 6
    stream = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=6, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"ignore_eos": True}))
    assert stream[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text == r.choices[0].message.content
    assert stream[-1].usage.completion_tokens == 6 and stream[-1].usage.prompt_tokens == r.usage.prompt_tokens


def test_chat_accepts_text_parts_and_max_completion_tokens(client):
    r = client.chat.completions.create(model=MODEL, max_completion_tokens=3, temperature=0,
                                       messages=[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                                       extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3


@pytest.mark.parametrize("call, reason", [
    (lambda c: c.completions.create(model=MODEL, prompt="x", n=2), "n must be 1"),
    (lambda c: c.completions.create(model=MODEL, prompt="x", max_tokens=65), "over the limit"),
    (lambda c: c.completions.create(model=MODEL, prompt="x", max_tokens=0), "max_tokens must"),
    (lambda c: c.completions.create(model=MODEL, prompt="x", temperature=-0.5), "temperature"),
    (lambda c: c.completions.create(model=MODEL, prompt="", max_tokens=2), "empty"),
    (lambda c: c.completions.create(model=MODEL, prompt=["x"] * 9, max_tokens=2), "over the limit"),
    (lambda c: c.completions.create(model=MODEL, prompt="x", logprobs=21), "logprobs must be an integer in [0, 20]"),
    (lambda c: c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], logprobs=True,
                                         top_logprobs=21), "top_logprobs must be an integer in [0, 20]"),
    (lambda c: c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                         top_logprobs=2), "top_logprobs needs logprobs: true"),
    (lambda c: c.completions.create(model=MODEL, prompt="x", presence_penalty=2.5), "presence_penalty"),
    (lambda c: c.completions.create(model=MODEL, prompt="x", frequency_penalty=-3), "frequency_penalty"),
    (lambda c: c.completions.create(model=MODEL, prompt="x", extra_body={"repetition_penalty": 0}),
     "repetition_penalty"),
    (lambda c: c.completions.create(model=MODEL, prompt="x", echo=True), "echo"),
    (lambda c: c.completions.create(model=MODEL, prompt="x", best_of=2), "best_of"),
    (lambda c: c.completions.create(model=MODEL, prompt="x", suffix="!"), "suffix"),
    (lambda c: c.completions.create(model=MODEL, prompt="x", logit_bias={"50": 10}), "logit_bias"),
    (lambda c: c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                         response_format={"type": "json_object"}), "response_format"),
    (lambda c: c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                         response_format={"type": "json_schema", "json_schema": {
                                             "name": "x", "schema": {"type": "object"}}}), "response_format"),
    (lambda c: c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], tools=[
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]), "tools"),
    (lambda c: c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                         tool_choice="required"), "tool_choice"),
    (lambda c: c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                         extra_body={"min_p": 0.1}), "min_p"),
    (lambda c: c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                         extra_body={"guided_json": {"type": "object"}}), "guided"),
    (lambda c: c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                         extra_body={"mirostat": 2}), "unsupported field: mirostat"),
    (lambda c: c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x", "name": "bob"}]),
     "'name'"),
    (lambda c: c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                         stream_options={"include_usage": True}), "stream: true"),
    (lambda c: c.completions.create(model=MODEL, prompt="x", extra_body={"max_completion_tokens": 3}),
     "max_completion_tokens"),
    (lambda c: c.chat.completions.create(model=MODEL, messages=[]), "messages"),
    (lambda c: c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]), "text only"),
])
def test_bad_requests_are_400_in_openai_shape(client, call, reason):
    with pytest.raises(openai.BadRequestError) as e:
        call(client)
    assert e.value.status_code == 400
    assert reason in e.value.body["message"]       # the client hands over the "error" object


def test_what_benchmark_clients_send_is_served(server):
    """The bodies GuideLLM and `vllm bench serve` send (notes from their source), sent as they send them: every
    field is either served or at the value that asks for nothing, and the usage they read is there."""
    guidellm = {"model": MODEL, "stream": True, "max_completion_tokens": 5, "ignore_eos": True, "stop": None,
                "stream_options": {"include_usage": True, "continuous_usage_stats": True},
                "messages": [{"role": "user", "content": [{"type": "text", "text": "Hello there"}]}]}
    vllm_bench = {"model": MODEL, "prompt": "Once upon a time", "repetition_penalty": 1.0, "max_tokens": 6,
                  "logprobs": None, "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    with httpx.Client(base_url=server.url, timeout=60) as h:
        chunks = sse(h.post("/v1/chat/completions", json=guidellm))
        # continuous usage: every chunk says how far it is; the last one has the totals
        assert all("usage" in c for c in chunks)
        counts = [c["usage"]["completion_tokens"] for c in chunks]
        assert counts == sorted(counts) and counts[0] == 0 and counts[-1] == 5 and chunks[-1]["choices"] == []
        assert len({c["usage"]["prompt_tokens"] for c in chunks}) == 1
        chunks = sse(h.post("/v1/completions", json=vllm_bench))
        assert chunks[-1]["usage"]["completion_tokens"] == 6 and chunks[-1]["choices"] == []
        assert all("usage" not in c for c in chunks[:-1])
        # what the openai client itself may pass along that changes nothing
        r = h.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "Hi"},
                                         {"role": "assistant", "content": "Hello", "refusal": None, "tool_calls": None},
                                         {"role": "user", "content": "Again"}],
            "max_tokens": 3, "ignore_eos": True, "user": "someone", "metadata": {"run": "1"}, "n": 1,
            "presence_penalty": 0, "frequency_penalty": 0.0, "response_format": {"type": "text"}, "tools": [],
            "tool_choice": "none", "logprobs": False, "store": False, "parallel_tool_calls": True, "seed": 1})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 3


def sse(response) -> list:
    assert response.status_code == 200, response.text
    lines = [ln[6:] for ln in response.text.splitlines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def test_several_prompts_keep_their_own_continuous_usage(server):
    body = {"model": MODEL, "prompt": [[1500, 1501], [1600, 1601, 1602]], "max_tokens": 4, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True, "continuous_usage_stats": True}}
    with httpx.Client(base_url=server.url, timeout=60) as h:
        chunks = sse(h.post("/v1/completions", json=body))
    per = {0: [], 1: []}
    for c in chunks[:-1]:
        per[c["choices"][0]["index"]].append((c["usage"]["prompt_tokens"], c["usage"]["completion_tokens"]))
    assert {p for p, _ in per[0]} == {2} and {p for p, _ in per[1]} == {3}
    assert per[0][-1][1] == 4 and per[1][-1][1] == 4
    assert chunks[-1]["usage"] == {"prompt_tokens": 5, "completion_tokens": 8, "total_tokens": 13}


def test_bad_stream_request_fails_before_streaming(client):
    with pytest.raises(openai.BadRequestError):
        list(client.completions.create(model=MODEL, prompt="x", max_tokens=1000, stream=True))


def test_raw_errors_and_recovery(server, client):
    with httpx.Client(base_url=server.url) as h:
        r = h.post("/v1/completions", content=b"{nope", headers={"content-type": "application/json"})
        assert r.status_code == 400
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and "JSON" in err["message"]
        r = h.post("/v1/chat/completions", json={"model": MODEL})
        assert r.status_code == 400 and "messages" in r.json()["error"]["message"]
        # an SSE stream ends with [DONE]
        r = h.post("/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2, "stream": True})
        lines = [ln for ln in r.text.splitlines() if ln.startswith("data: ")]
        assert lines[-1] == "data: [DONE]" and json.loads(lines[0][6:])["object"] == "text_completion"
    r = client.completions.create(model=MODEL, prompt="after the errors", max_tokens=2,
                                  extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 2
