"""Logprobs and penalties through the OpenAI routes: each chosen token's logprob and its alternatives equal the
log-softmax of transformers' own logits for the same model and prefix (float32, CPU), in completions' legacy
columns and chat's entries, streamed (chunk by chunk, with the tokens each chunk carries) or not; penalized greedy
answers equal vLLM's formulas applied over transformers' logits; bad values are a 400 naming the field."""
from __future__ import annotations

import json
from itertools import accumulate

import httpx
import pytest
import torch

from helpers import reference_generate, reference_logprobs, reference_penalized_generate
from batchscope.app.loadtest.specs import Limits
from batchscope.app.server import ServerThread, create_app
from batchscope.app.server.openai_logprobs import TokenStrings
from batchscope.app.server.state import AppState
from batchscope.engine import SamplingParams
from batchscope.engine.config import EngineConfig

MODEL = "tiny-random"
ATOL = 1e-4      # our forward against transformers' one, both float32 (as in test_engine_logprobs.py)
# greedy answers made of whole characters and no special tokens: their token strings join up into the text
PROMPT = [30118, 29817, 11455, 46239, 25760, 47972, 22923]
# a greedy answer whose 10th token is half a character: the detokenizer holds that token's text back a step
HELD_BACK_PROMPT = [6006, 40492, 43612, 48945, 41580, 33755, 2325, 41358, 24200, 28690, 34607, 7071]
MESSAGES = [{"role": "user", "content": "Tell me a story about a dragon."}]
# its greedy answer's 6th token is half a character
HELD_BACK_MESSAGES = [{"role": "user", "content": "Tell me about the dragon and the story."}]


@pytest.fixture(scope="module")
def served():
    state = AppState.load(EngineConfig(model=MODEL, device="cpu", dtype="float32", num_blocks=256,
                                       max_batch_tokens=256, max_running=32),
                          Limits(max_prompt_tokens=256, max_new_tokens=64, max_burst_requests=8))
    srv = ServerThread(create_app(state, ui=False)).start()
    yield srv, state
    srv.stop()
    state.close()


@pytest.fixture(scope="module")
def http(served):
    with httpx.Client(base_url=served[0].url, timeout=60) as client:
        yield client


@pytest.fixture(scope="module")
def tokenizer(served):
    return served[1].engine.tokenizer


def strings(tokenizer, ids) -> list[str]:
    """Each token decoded alone, special tokens kept: what the routes name tokens by."""
    return [tokenizer.decode([int(i)], skip_special_tokens=False, clean_up_tokenization_spaces=False) for i in ids]


def ok(response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def sse(response) -> list[dict]:
    assert response.status_code == 200, response.text
    lines = [ln[6:] for ln in response.text.splitlines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


def assert_close(got, want) -> None:
    torch.testing.assert_close(torch.tensor(got, dtype=torch.float32), torch.as_tensor(want, dtype=torch.float32),
                               atol=ATOL, rtol=0)


def greedy(n: int, **extra) -> dict:
    return {"model": MODEL, "max_tokens": n, "temperature": 0, "ignore_eos": True, **extra}


# ------------------------------------------------------------------------------------------------- completions

def test_completion_logprobs_are_transformers_log_softmax(http, tokenizer, tiny_reference):
    n, k = 12, 5
    choice = ok(http.post("/v1/completions", json=greedy(n, prompt=PROMPT, logprobs=k)))["choices"][0]
    ids = reference_generate(tiny_reference, PROMPT, n, None)
    ref = reference_logprobs(tiny_reference, PROMPT, ids)
    lp = choice["logprobs"]
    assert lp["tokens"] == strings(tokenizer, ids)
    assert "".join(lp["tokens"]) == choice["text"]
    assert_close(lp["token_logprobs"], ref[torch.arange(n), torch.tensor(ids)])
    assert lp["text_offset"] == list(accumulate([0] + [len(t) for t in lp["tokens"][:-1]]))
    top = ref.topk(k, dim=-1)
    for i, alternatives in enumerate(lp["top_logprobs"]):
        # greedy: the chosen token is the likeliest, so it is one of the k, and first
        assert list(alternatives) == strings(tokenizer, top.indices[i])
        assert next(iter(alternatives)) == lp["tokens"][i]
        values = list(alternatives.values())
        assert values == sorted(values, reverse=True)
        assert_close(values, top.values[i])


def test_sampled_penalized_completion_gets_the_raw_logprobs_and_its_chosen_token_beside_the_top_k(
        http, served, tokenizer, tiny_reference):
    """Temperature, top-k and penalties choose the token; its logprob is still the model's own (vLLM's default),
    and the legacy columns list it even where it is not among the k likeliest (k + 1 entries)."""
    n, k = 12, 1
    sampling = dict(temperature=1.5, top_k=8, seed=5, presence_penalty=-2.0, repetition_penalty=0.5)
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": n, "ignore_eos": True, "logprobs": k, **sampling}
    lp = ok(http.post("/v1/completions", json=body))["choices"][0]["logprobs"]
    # the same seeded request straight to the engine: the tokens depend only on the seed, logits and position
    out = served[1].engine.generate([PROMPT], SamplingParams(max_new_tokens=n, ignore_eos=True, logprobs=k,
                                                             **sampling))[0]
    assert lp["tokens"] == strings(tokenizer, out.token_ids)
    ref = reference_logprobs(tiny_reference, PROMPT, out.token_ids)
    assert_close(lp["token_logprobs"], ref[torch.arange(n), torch.tensor(out.token_ids)])
    beside = 0
    for i, alternatives in enumerate(lp["top_logprobs"]):
        likeliest = strings(tokenizer, [ref[i].argmax()])[0]
        values = list(alternatives.values())
        assert values == sorted(values, reverse=True) and next(iter(alternatives)) == likeliest
        assert alternatives[lp["tokens"][i]] == lp["token_logprobs"][i]
        beside += len(alternatives) == 2
    assert beside, "every sampled token was the likeliest: the test would not see the chosen one left out"


def test_logprobs_zero_is_the_chosen_tokens_alone(http):
    choice = ok(http.post("/v1/completions", json=greedy(6, prompt=PROMPT, logprobs=0)))["choices"][0]
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == 6
    assert lp["top_logprobs"] == [{t: v} for t, v in zip(lp["tokens"], lp["token_logprobs"])]
    chat = ok(http.post("/v1/chat/completions", json=greedy(4, messages=MESSAGES, logprobs=True)))["choices"][0]
    assert [e["top_logprobs"] for e in chat["logprobs"]["content"]] == [[]] * 4


def test_streamed_completion_logprobs_come_with_their_tokens_and_join_up_to_the_whole(http, tokenizer):
    """Two prompts streamed at once: each chunk carries its delta's tokens (the usage so far counts them), a
    delta whose text is held back (half a character) is still a chunk, and each prompt's chunks joined are its
    answer's columns."""
    body = greedy(16, prompt=[HELD_BACK_PROMPT, PROMPT], logprobs=3)
    whole = sorted(ok(http.post("/v1/completions", json=body))["choices"], key=lambda c: c["index"])
    # a reader that falls behind gets its waiting deltas joined (the half character's with the next): on a busy
    # machine try again until one went out held back
    for _attempt in range(5):
        chunks = sse(http.post("/v1/completions", json={**body, "stream": True, "stream_options": {
            "include_usage": True, "continuous_usage_stats": True}}))[:-1]
        counted = {0: 0, 1: 0}
        held_back = 0
        for c in chunks:
            (choice,) = c["choices"]
            i, lp = choice["index"], choice["logprobs"]
            assert len(lp["tokens"]) == c["usage"]["completion_tokens"] - counted[i]
            counted[i] = c["usage"]["completion_tokens"]
            held_back += bool(lp["tokens"]) and choice["text"] == ""
        for i, answer in enumerate(whole):
            mine = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == i]
            assert "".join(m["text"] for m in mine) == answer["text"]
            for column in ("tokens", "token_logprobs", "top_logprobs", "text_offset"):
                assert [x for m in mine for x in m["logprobs"][column]] == answer["logprobs"][column], column
        if held_back:
            break
    assert held_back, "no delta had its text held back in 5 streams: the half-character path went untested"
    assert "\ufffd" in whole[0]["logprobs"]["tokens"][9]        # the half character HELD_BACK_PROMPT is there for


# -------------------------------------------------------------------------------------------------------- chat

def test_chat_logprobs_are_transformers_log_softmax(http, served, tokenizer, tiny_reference):
    n, k = 10, 4
    choice = ok(http.post("/v1/chat/completions",
                          json=greedy(n, messages=MESSAGES, logprobs=True, top_logprobs=k)))["choices"][0]
    prompt = served[1].encode_messages(MESSAGES)
    ids = reference_generate(tiny_reference, prompt, n, None)
    ref = reference_logprobs(tiny_reference, prompt, ids)
    content = choice["logprobs"]["content"]
    assert [e["token"] for e in content] == strings(tokenizer, ids)
    assert_close([e["logprob"] for e in content], ref[torch.arange(n), torch.tensor(ids)])
    top = ref.topk(k, dim=-1)
    for i, entry in enumerate(content):
        alternatives = entry["top_logprobs"]
        assert [a["token"] for a in alternatives] == strings(tokenizer, top.indices[i])
        assert alternatives[0]["token"] == entry["token"] and alternatives[0]["logprob"] == entry["logprob"]
        values = [a["logprob"] for a in alternatives]
        assert values == sorted(values, reverse=True)
        assert_close(values, top.values[i])
        for e in (entry, *alternatives):
            if "\ufffd" not in e["token"]:
                assert e["bytes"] == list(e["token"].encode("utf-8"))
    assert bytes(b for e in content for b in e["bytes"]).decode("utf-8", errors="replace") == \
        choice["message"]["content"]


def test_bytes_of_a_character_split_over_tokens_join_up_into_it(tokenizer):
    """The point of `bytes`: each piece of a split character decodes to U+FFFD alone, its bytes are exact."""
    text = "dragons 日本語 ✓ 🙂 héllo"
    ids = tokenizer.encode(text, add_special_tokens=False)
    names = TokenStrings(tokenizer)
    assert any("\ufffd" in names.text(i) for i in ids), "no character was split: pick another text"
    assert bytes(b for i in ids for b in names.bytes(i)).decode("utf-8") == text
    assert [names.text(i) for i in ids] == strings(tokenizer, ids)


def test_streamed_chat_logprobs_come_with_their_tokens_and_join_up_to_the_whole(http):
    body = greedy(12, messages=HELD_BACK_MESSAGES, logprobs=True, top_logprobs=2)
    whole = ok(http.post("/v1/chat/completions", json=body))["choices"][0]
    assert "\ufffd" in whole["logprobs"]["content"][5]["token"]
    # a stream whose reader falls behind gets its waiting deltas joined, and the half character's delta can be
    # joined with the one that completes it: on a busy machine try again until one went out held back
    for _attempt in range(5):
        chunks = sse(http.post("/v1/chat/completions", json={**body, "stream": True, "stream_options": {
            "include_usage": True, "continuous_usage_stats": True}}))[:-1]
        assert chunks[0]["choices"][0]["logprobs"] is None                 # the role's chunk carries no token
        before = held_back = 0
        for c in chunks[1:]:
            content = c["choices"][0]["logprobs"]["content"]
            assert len(content) == c["usage"]["completion_tokens"] - before
            before = c["usage"]["completion_tokens"]
            held_back += bool(content) and "content" not in c["choices"][0]["delta"]
        assert [e for c in chunks[1:] for e in c["choices"][0]["logprobs"]["content"]] == \
            whole["logprobs"]["content"]
        assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == whole["message"]["content"]
        if held_back:
            break
    assert held_back, "no delta had its text held back in 5 streams: the half-character path went untested"


# --------------------------------------------------------------------------------------------------- penalties

PENALTIES = [dict(presence_penalty=-2.0), dict(frequency_penalty=-2.0), dict(repetition_penalty=0.5),
             dict(presence_penalty=-1.5, frequency_penalty=0.8, repetition_penalty=0.8)]


@pytest.mark.parametrize("penalties", PENALTIES)
def test_penalized_completion_equals_vllms_formulas_over_transformers(http, tokenizer, tiny_reference, penalties):
    n = 16
    choice = ok(http.post("/v1/completions", json=greedy(n, prompt=PROMPT, logprobs=0, **penalties)))["choices"][0]
    want = reference_penalized_generate(tiny_reference, PROMPT, n, penalties.get("presence_penalty", 0.0),
                                        penalties.get("frequency_penalty", 0.0),
                                        penalties.get("repetition_penalty", 1.0))
    assert want != reference_generate(tiny_reference, PROMPT, n, None), "these penalties change nothing here"
    assert choice["logprobs"]["tokens"] == strings(tokenizer, want)
    assert choice["text"] == tokenizer.decode(want, skip_special_tokens=True)
    plain = ok(http.post("/v1/completions", json=greedy(n, prompt=PROMPT)))["choices"][0]["text"]
    assert plain != choice["text"]


def test_penalized_chat_equals_vllms_formulas_over_transformers(http, served, tokenizer, tiny_reference):
    n, penalties = 16, dict(presence_penalty=0.5, frequency_penalty=-1.0, repetition_penalty=0.7)
    choice = ok(http.post("/v1/chat/completions", json=greedy(n, messages=MESSAGES, logprobs=True,
                                                               **penalties)))["choices"][0]
    prompt = served[1].encode_messages(MESSAGES)
    want = reference_penalized_generate(tiny_reference, prompt, n, 0.5, -1.0, 0.7)
    assert want != reference_generate(tiny_reference, prompt, n, None)
    assert [e["token"] for e in choice["logprobs"]["content"]] == strings(tokenizer, want)
    assert choice["message"]["content"] == tokenizer.decode(want, skip_special_tokens=True)


# ----------------------------------------------------------------------------------------- the openai client

def test_the_openai_client_reads_logprobs_and_sends_penalties(http, served, tokenizer, tiny_reference):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=served[0].url + "/v1", api_key="unused", max_retries=0, timeout=60)
    penalties = dict(frequency_penalty=-2.0, presence_penalty=0.3)
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, temperature=0, logprobs=3,
                                  extra_body={"ignore_eos": True, "repetition_penalty": 0.9}, **penalties)
    raw = ok(http.post("/v1/completions", json=greedy(8, prompt=PROMPT, logprobs=3, repetition_penalty=0.9,
                                                      **penalties)))["choices"][0]["logprobs"]
    lp = r.choices[0].logprobs
    assert (lp.tokens, lp.token_logprobs, lp.top_logprobs, lp.text_offset) == \
        (raw["tokens"], raw["token_logprobs"], raw["top_logprobs"], raw["text_offset"])
    want = reference_penalized_generate(tiny_reference, PROMPT, 8, 0.3, -2.0, 0.9)
    assert lp.tokens == strings(tokenizer, want)

    kw = dict(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2,
              extra_body={"ignore_eos": True})
    chat = client.chat.completions.create(**kw)
    content = chat.choices[0].logprobs.content
    prompt = served[1].encode_messages(MESSAGES)
    ids = reference_generate(tiny_reference, prompt, 6, None)
    assert [e.token for e in content] == strings(tokenizer, ids)
    assert_close([e.logprob for e in content], reference_logprobs(tiny_reference, prompt, ids)[
        torch.arange(6), torch.tensor(ids)])
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].token == e.token and e.bytes for e in content)
    streamed = [e for c in client.chat.completions.create(stream=True, **kw) if c.choices and c.choices[0].logprobs
                for e in c.choices[0].logprobs.content]
    assert [e.model_dump() for e in streamed] == [e.model_dump() for e in content]


# ------------------------------------------------------------------------------------------------------ limits

@pytest.mark.parametrize("path, fields, name", [
    ("/v1/completions", {"logprobs": 21}, "logprobs"),
    ("/v1/completions", {"logprobs": -1}, "logprobs"),
    ("/v1/completions", {"logprobs": True}, "logprobs"),
    ("/v1/completions", {"logprobs": "many"}, "logprobs"),
    ("/v1/completions", {"top_logprobs": 2}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ("/v1/chat/completions", {"top_logprobs": 3}, "top_logprobs"),
    ("/v1/chat/completions", {"logprobs": False, "top_logprobs": 3}, "top_logprobs"),
    ("/v1/completions", {"presence_penalty": 2.5}, "presence_penalty"),
    ("/v1/chat/completions", {"presence_penalty": -2.01}, "presence_penalty"),
    ("/v1/completions", {"presence_penalty": "high"}, "presence_penalty"),
    ("/v1/chat/completions", {"frequency_penalty": 3}, "frequency_penalty"),
    ("/v1/completions", {"frequency_penalty": float("nan")}, "frequency_penalty"),
    ("/v1/completions", {"repetition_penalty": 0}, "repetition_penalty"),
    ("/v1/chat/completions", {"repetition_penalty": -1.2}, "repetition_penalty"),
    ("/v1/completions", {"repetition_penalty": float("inf")}, "repetition_penalty"),
    ("/v1/completions", {"logprobs": 2, "echo": True}, "echo"),        # prompt logprobs are not computed
    ("/v1/chat/completions", {"logprobs": True, "n": 2}, "n must be 1"),
])
def test_bad_values_are_400_naming_the_field_and_the_server_keeps_serving(http, path, fields, name):
    ask = {"prompt": PROMPT} if path == "/v1/completions" else {"messages": MESSAGES}
    # json.dumps writes NaN and Infinity as Python's json module reads them (so does the server's)
    r = http.post(path, content=json.dumps({**greedy(2), **ask, **fields}),
                  headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert name in r.json()["error"]["message"]
    after = ok(http.post(path, json=greedy(2, logprobs=1 if path == "/v1/completions" else True, **ask)))
    assert after["choices"][0]["logprobs"] is not None


@pytest.mark.parametrize("path, fields", [
    ("/v1/completions", {"logprobs": None, "presence_penalty": 0, "frequency_penalty": 0.0,
                         "repetition_penalty": 1.0}),
    ("/v1/completions", {"logprobs": False, "top_logprobs": 0}),
    ("/v1/chat/completions", {"logprobs": False, "top_logprobs": 0}),
    ("/v1/chat/completions", {"logprobs": None, "top_logprobs": None, "presence_penalty": None}),
])
def test_values_that_ask_for_nothing_are_accepted_and_change_nothing(http, path, fields):
    ask = {"prompt": PROMPT} if path == "/v1/completions" else {"messages": MESSAGES}
    choice = ok(http.post(path, json=greedy(6, **ask, **fields)))["choices"][0]
    plain = ok(http.post(path, json=greedy(6, **ask)))["choices"][0]
    assert choice["logprobs"] is None
    assert choice == plain
