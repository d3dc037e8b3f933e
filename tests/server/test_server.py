"""The live server's JSON routes, static files, replay, auth and limits, against a tiny random model on the CPU."""
import json
import socket
import time

import httpx
import jsonschema
import pytest

from batchscope.app.cli import main as cli_main
from batchscope.app.loadtest.specs import Limits
from batchscope.app.server import ServerThread, check_bind, create_app
from batchscope.app.server.state import AppState
from batchscope.engine.config import EngineConfig
from batchscope.telemetry import SCHEMA, SCHEMA_ID, validate_timeline

LIMITS = Limits(max_prompt_tokens=256, max_new_tokens=64, max_burst_requests=32, max_concurrent_bursts=2,
                max_waiting_requests=64)
TOKEN = "s3cret-token-for-tests"


def tiny_config(**kw) -> EngineConfig:
    return EngineConfig(model="tiny-random", device="cpu", dtype="float32", mode="async", num_blocks=256,
                        max_batch_tokens=256, max_running=32, **kw)


@pytest.fixture(scope="module")
def served():
    state = AppState.load(tiny_config(), LIMITS)
    srv = ServerThread(create_app(state, ui=False)).start()
    yield srv, state
    srv.stop()
    state.close()


@pytest.fixture(scope="module")
def client(served):
    with httpx.Client(base_url=served[0].url, timeout=60) as c:
        yield c


def wait_done(client, path, timeout=120):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        d = client.get(path).json()
        if d["state"] != "running":
            return d
        time.sleep(0.05)
    raise AssertionError(f"{path} still running: {d}")


def sse_events(text: str) -> list:
    lines = [ln[len("data: "):] for ln in text.splitlines() if ln.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(x) for x in lines[:-1]]


@pytest.fixture(scope="module")
def recorded(client):
    """A timeline with work in it: a few requests in async, a switch, a few in sync."""
    for mode in ("async", "sync"):
        assert client.post("/api/mode", json={"mode": mode}).status_code == 200
        r = client.post("/api/generate", json={"prompt": [1500, 1501, 1502], "max_new_tokens": 6,
                                               "ignore_eos": True})
        assert r.status_code == 200
    client.post("/api/mode", json={"mode": "async"})
    return client.get("/api/timeline.json").json()


# ------------------------------------------------------------------------------------------- health and mode

def test_health_names_model_device_mode(client):
    assert client.get("/api/health").json() == {"status": "ok", "model": "tiny-random", "device": "cpu",
                                                "mode": "async", "replay_only": False}
    assert client.get("/health").json()["status"] == "ok"


def test_status_reports_queue_kv_and_why_nvml_is_absent(client):
    s = client.get("/api/status").json()
    assert s["mode"] in ("sync", "async") and s["replay_only"] is False
    assert s["queue"] >= 0 and s["running"] >= 0 and s["kv_blocks_total"] == 256
    assert 0.0 <= s["kv_usage"] <= 1.0
    assert s["nvml_available"] is False and "CPU" in s["nvml_reason"]
    assert "NVML" in s["busy_note"]
    assert s["limits"]["max_new_tokens"] == 64


def test_mode_switch_round_trip(client):
    r = client.post("/api/mode", json={"mode": "sync"})
    assert r.status_code == 200 and r.json()["mode"] == "sync"
    assert client.get("/api/health").json()["mode"] == "sync"
    assert client.post("/api/mode", json={"mode": "async"}).json() == {"mode": "async", "previous": "sync"}


def test_responses_are_typed_models_in_the_api_docs(client):
    """Status, bursts, A/B runs and recordings are documented field by field, not as free-form objects."""
    paths = client.get("/api/openapi.json").json()["paths"]

    def model(path, method="get"):
        return paths[path][method]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].split("/")[-1]
    assert model("/api/status") == "Status" and model("/api/health") == "Health"
    assert model("/api/mode", "post") == "ModeChanged"
    assert model("/api/bursts/{burst_id}") == "BurstStatus" and model("/api/ab/{ab_id}") == "ABStatus"
    assert model("/api/bursts") == "BurstList" and model("/api/recordings") == "Recordings"
    assert model("/api/recording/start", "post") == "RecordingStarted"
    assert model("/api/recording/stop", "post") == "RecordingStopped"


# ------------------------------------------------------------------------------------------------- generate

def test_generate_fixed_length_and_deterministic(client):
    body = {"prompt": "The quick brown fox", "max_new_tokens": 8, "ignore_eos": True, "seed": 3,
            "temperature": 0.8}
    a, b = client.post("/api/generate", json=body).json(), client.post("/api/generate", json=body).json()
    assert a["finish_reason"] == "length" and a["output_tokens"] == 8 == len(a["token_ids"])
    assert a["token_ids"] == b["token_ids"] and a["text"] == b["text"]
    assert a["ttft_ms"] > 0 and a["e2e_ms"] >= a["ttft_ms"]


def test_generate_stream_matches_the_whole_answer(client):
    body = {"prompt": [2000, 2001, 2002, 2003], "max_new_tokens": 10, "ignore_eos": True}
    whole = client.post("/api/generate", json=body).json()
    r = client.post("/api/generate", json={**body, "stream": True})
    assert r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert "".join(e["delta"] for e in events) == whole["text"]
    assert [t for e in events for t in e["token_ids"]] == whole["token_ids"]
    assert events[-1]["finished"] and events[-1]["finish_reason"] == "length" and events[-1]["output_tokens"] == 10


def test_generate_chat_uses_the_template(client, served):
    """Text goes through the chat template unless the caller asks for raw text; token ids are never wrapped."""
    _, state = served
    body = {"prompt": "hi", "max_new_tokens": 2, "ignore_eos": True}
    chat = client.post("/api/generate", json={**body, "chat": True}).json()
    raw = client.post("/api/generate", json={**body, "chat": False}).json()
    default = client.post("/api/generate", json=body).json()
    assert chat["prompt_tokens"] > raw["prompt_tokens"]
    assert default["prompt_tokens"] == chat["prompt_tokens"]
    ids = state.encode("hi", chat=False)
    as_ids = client.post("/api/generate", json={**body, "prompt": ids}).json()
    assert as_ids["prompt_tokens"] == len(ids) == raw["prompt_tokens"]


def test_the_pages_generate_streams_one_update_per_token_and_ends_with_the_whole_answer(client, served):
    """The Generate tab's handler: a cleared box first, then one update per token, each text extending the one
    before, the last one the API's whole answer; bad input is said on the page before anything is submitted."""
    from batchscope.app.ui.generate_tab import Streams, generate_handler

    _, state = served
    generate = generate_handler(state, Streams())
    # (prompt, max new tokens, temperature, top-p, top-k, seed, ignore EOS, chat template, gradio request)
    updates = list(generate("Hello", 5, 0.0, 1.0, 0, -1, True, False, None))
    assert updates[0][0] == "" and "waiting for the first token" in updates[0][1]
    texts = [text for text, _ in updates[1:]]
    assert len(texts) == 5                            # EOS ignored: five tokens, one delta each
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:]))
    assert all("running" in info for _, info in updates[1:-1]) and "done in" in updates[-1][1]
    whole = client.post("/api/generate", json={"prompt": "Hello", "max_new_tokens": 5, "ignore_eos": True,
                                               "chat": False}).json()
    assert whole["output_tokens"] == 5 and texts[-1] == whole["text"]
    assert [u[1] for u in generate("  ", 5, 0.0, 1.0, 0, -1, True, False, None)][1:] == [
        '<div class="bs-err" role="alert">Type a prompt first.</div>']
    over = list(generate("Hello", LIMITS.max_new_tokens + 1, 0.0, 1.0, 0, -1, True, False, None))
    assert len(over) == 2 and f"over the limit of {LIMITS.max_new_tokens}" in over[-1][1]


# ------------------------------------------------------------------------------------------------ load tests

def test_burst_reports_latency_percentiles_and_throughput(client):
    r = client.post("/api/burst", json={"num_requests": 6, "prompt_tokens": [4, 12], "max_new_tokens": [4, 8],
                                        "arrival": "poisson", "rate": 200, "seed": 5, "ignore_eos": True})
    assert r.status_code == 200
    d = wait_done(client, f"/api/bursts/{r.json()['burst_id']}")
    assert d["state"] == "done" and d["done"] == d["total"] == 6
    res = d["results"]
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert res[key]["p50"] > 0 and res[key]["p50"] <= res[key]["p90"] <= res[key]["p99"]
    assert res["completed"] == 6 and res["output_tokens_per_s"] > 0 and res["requests_per_s"] > 0
    assert 0 < res["busy_pct"] <= 100
    listed = client.get("/api/bursts").json()["bursts"]
    assert any(b["id"] == d["id"] for b in listed)


def test_ab_runs_both_modes_with_busy_and_speedup(client):
    r = client.post("/api/ab", json={"num_requests": 4, "prompt_tokens": [4, 8], "max_new_tokens": 6, "seed": 2})
    d = wait_done(client, f"/api/ab/{r.json()['ab_id']}")
    assert d["state"] == "done", d
    for mode in ("sync", "async"):
        assert d[mode]["completed"] == 4 and d[mode]["output_tokens"] == 24
        assert d[mode]["mode"] == mode and 0 < d[mode]["busy_pct"] <= 100
    assert d["speedup"] == pytest.approx(d["async"]["output_tokens_per_s"] / d["sync"]["output_tokens_per_s"])
    assert client.get("/api/health").json()["mode"] == "async"      # the mode it found is restored


# --------------------------------------------------------------------------------------- timelines & exports

def test_timeline_download_validates_against_the_schema(client, recorded):
    tl = recorded
    jsonschema.validate(tl, SCHEMA)
    assert validate_timeline(tl) is tl or validate_timeline(tl) == tl
    assert tl["schema"] == SCHEMA_ID and tl["meta"]["model"] == "tiny-random"
    assert {s["mode"] for s in tl["steps"]} == {"sync", "async"}
    assert any(c["to"] == "sync" for c in tl["mode_changes"])
    r = client.get("/api/timeline.json", params={"download": 1})
    assert "attachment" in r.headers["content-disposition"]


def test_perfetto_trace_has_nested_lanes(client, recorded):
    tr = client.get("/api/trace.json").json()
    events = tr["traceEvents"] if isinstance(tr, dict) else tr
    phases = {e["ph"] for e in events}
    assert {"X", "M"} <= phases
    assert all(e["dur"] >= 0 for e in events if e["ph"] == "X")


def test_recording_start_stop_and_fetch(client):
    assert client.post("/api/recording/start", json={"name": "rec-a"}).json()["state"] == "recording"
    r = client.post("/api/recording/start", json={"name": "rec-b"})
    assert r.status_code == 400 and "already" in r.json()["error"]
    client.post("/api/generate", json={"prompt": [1200, 1201], "max_new_tokens": 4, "ignore_eos": True})
    stop = client.post("/api/recording/stop").json()
    assert stop["recording"] == "rec-a" and stop["state"] == "stopped"
    assert "rec-a" in client.get("/api/recordings").json()["recordings"]
    r = client.post("/api/recording/start", json={"name": "rec-a"})
    assert r.status_code == 400 and "exists" in r.json()["error"]
    # unnamed recordings get names of their own, even two in the same second
    names = []
    for _ in range(2):
        names.append(client.post("/api/recording/start").json()["recording"])
        client.post("/api/recording/stop")
    assert names[0] != names[1] and set(names) <= set(client.get("/api/recordings").json()["recordings"])
    tl = client.get("/api/timeline.json", params={"recording": "rec-a"}).json()
    validate_timeline(tl)
    assert tl["steps"] and tl["meta"]["recording"]["name"] == "rec-a"
    assert client.get("/api/trace.json", params={"recording": "rec-a"}).status_code == 200


def test_replay_upload_and_download(client, recorded):
    r = client.post("/api/replay", content=json.dumps(recorded), headers={"content-type": "application/json"})
    assert r.status_code == 200 and r.json()["steps"] == len(recorded["steps"])
    assert client.get("/api/replay.json").json() == recorded


@pytest.mark.parametrize("body, reason", [
    (b"", "send a batchscope.timeline/1"),
    (b"{not json", "JSON"),
    (b"[1, 2]", "object"),
    (json.dumps({"schema": "other/1"}).encode(), "schema"),
    (json.dumps({"schema": SCHEMA_ID, "meta": {}}).encode(), "steps"),
])
def test_malformed_replay_is_400_with_reason(client, body, reason):
    r = client.post("/api/replay", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400 and reason in r.json()["error"]


# ---------------------------------------------------------------------------------------------- bad inputs

BAD = [
    ("post", "/api/mode", {"mode": "turbo"}, 400, "mode must be"),
    ("post", "/api/mode", {}, 400, "mode"),
    ("post", "/api/mode", {"mode": "sync", "extra": 1}, 400, "extra"),
    ("post", "/api/generate", {"prompt": ""}, 400, "empty"),
    ("post", "/api/generate", {"prompt": "hi", "max_new_tokens": 0}, 400, "max_new_tokens"),
    ("post", "/api/generate", {"prompt": "hi", "max_new_tokens": 65}, 400, "over the limit"),
    ("post", "/api/generate", {"prompt": "hi", "temperature": -1}, 400, "temperature"),
    ("post", "/api/generate", {"prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("post", "/api/generate", {"prompt": "hi", "top_k": -2}, 400, "top_k"),
    ("post", "/api/generate", {"prompt": "hi", "seed": -1}, 400, "seed"),
    ("post", "/api/generate", {"prompt": [10**9]}, 400, "token ids"),
    ("post", "/api/generate", {"prompt": [1500] * 257}, 400, "over the limit"),
    ("post", "/api/generate", {"prompt": "x" * 20000}, 400, "characters"),
    ("post", "/api/generate", {"prompt": {"a": 1}}, 400, "prompt"),
    ("post", "/api/generate", {"max_new_tokens": 4}, 400, "prompt"),
    ("post", "/api/burst", {"num_requests": 33}, 400, "over the limit"),
    ("post", "/api/burst", {"num_requests": 0}, 400, "num_requests"),
    ("post", "/api/burst", {"arrival": "uniform"}, 400, "arrival"),
    ("post", "/api/burst", {"prompt_tokens": [9, 3]}, 400, "greater than max"),
    ("post", "/api/burst", {"prompt_tokens": [1, 2, 3]}, 400, "[min, max]"),
    ("post", "/api/burst", {"arrival": "poisson", "rate": -1}, 400, "rate"),
    ("post", "/api/ab", {"max_new_tokens": [1, 65]}, 400, "over the limit"),
    ("get", "/api/bursts/b-nope", None, 404, "b-nope"),
    ("get", "/api/ab/ab-nope", None, 404, "ab-nope"),
    ("get", "/api/timeline.json?recording=nope", None, 404, "nope"),
    ("post", "/api/recording/stop", None, 400, "no recording"),
    ("post", "/api/recording/start", {"name": "../etc"}, 400, "recording name"),
]


@pytest.mark.parametrize("method, path, body, status, reason", BAD)
def test_bad_input_is_4xx_with_a_reason(client, method, path, body, status, reason):
    r = client.request(method, path, json=body) if body is not None else client.request(method, path)
    assert r.status_code == status, r.text
    assert reason in r.json()["error"]


def test_unparseable_bodies_say_why(client):
    r = client.post("/api/generate", content=b"{oops", headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]
    r = client.post("/api/mode", content=b'"sync"', headers={"content-type": "application/json"})
    assert r.status_code == 400 and "JSON object" in r.json()["error"]


def test_oversized_body_is_413(client):
    r = client.post("/api/generate", content=b'{"prompt": "' + b"x" * (9 << 20) + b'"}',
                    headers={"content-type": "application/json"})
    assert r.status_code == 413 and "limit" in r.json()["error"]

    def chunked():                      # no Content-Length: the server has to count
        yield b'{"prompt": "'
        for _ in range(9):
            yield b"x" * (1 << 20)
        yield b'"}'
    r = client.post("/v1/completions", content=chunked(), headers={"content-type": "application/json"})
    assert r.status_code == 413 and "limit" in r.json()["error"]["message"]


def test_engine_keeps_serving_after_bad_inputs(client):
    for method, path, body, _, _ in BAD:
        client.request(method, path, json=body) if body is not None else client.request(method, path)
    r = client.post("/api/generate", json={"prompt": "still here", "max_new_tokens": 3, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["output_tokens"] == 3
    assert client.get("/api/health").json()["status"] == "ok"


def test_capacity_refusals_are_429(served):
    _, state = served
    busy = AppState(state.engine, state.telemetry, Limits(max_waiting_requests=0))
    try:
        with ServerThread(create_app(busy, ui=False)) as other, httpx.Client(base_url=other.url) as c:
            r = c.post("/api/generate", json={"prompt": "hi", "max_new_tokens": 2})
            assert r.status_code == 429 and "waiting" in r.json()["error"]
    finally:
        busy.load_lab.runs.close()


@pytest.fixture
def long_limits(served):
    """A second server on the same engine whose limits allow requests long enough to hang up on."""
    _, state = served
    roomy = AppState(state.engine, state.telemetry, Limits(max_new_tokens=3000))
    with ServerThread(create_app(roomy, ui=False)) as srv:
        yield srv, state
    roomy.load_lab.runs.close()


def wait_idle(state, timeout=10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = state.engine.stats()
        if s["running"] == 0 and s["queue"] == 0:
            return True
        time.sleep(0.02)
    return False


def finish_of(state, request_id, timeout=10.0):
    """How telemetry saw the request end (it learns a moment after the engine lets go of the request)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for r in state.telemetry.timeline()["requests"]:
            if r["id"] == request_id and r.get("finish_reason"):
                return r["finish_reason"], r["output_tokens"]
        time.sleep(0.05)
    return None, None


@pytest.mark.parametrize("path, body", [
    ("/api/generate", {"prompt": "hang up", "max_new_tokens": 3000, "ignore_eos": True}),
    ("/v1/completions", {"prompt": "hang up", "max_tokens": 3000, "ignore_eos": True}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hang up"}], "max_tokens": 3000,
                              "ignore_eos": True}),
])
def test_a_client_that_hangs_up_cancels_its_request(long_limits, path, body):
    srv, state = long_limits
    assert wait_idle(state)
    with httpx.Client(base_url=srv.url, timeout=30) as c, c.stream("POST", path, json={**body, "stream": True}) as r:
        first = json.loads(next(line for line in r.iter_lines() if line.startswith("data: "))[6:])
    assert wait_idle(state), "the engine kept generating for a client that left"
    if path == "/api/generate":
        reason, produced = finish_of(state, first["id"])
        assert reason == "cancelled" and produced < 3000
    # without streaming too: the server notices the hang-up while it waits
    with pytest.raises(httpx.TimeoutException):
        httpx.post(srv.url + path, json=body, timeout=0.5)
    assert wait_idle(state), "the engine kept generating for a client that left"


# ---------------------------------------------------------------------------------------------- static files

def test_plotly_is_served_locally(client):
    r = client.get("/batchscope-static/plotly.min.js")
    assert r.status_code == 200 and "javascript" in r.headers["content-type"]
    assert b"plotly" in r.content[:2000].lower() and len(r.content) > 1_000_000


# ---------------------------------------------------------------------------------------- replay-only server

@pytest.fixture(scope="module")
def replay_server(recorded):
    state = AppState(replay=validate_timeline(recorded))
    with ServerThread(create_app(state, ui=False)) as srv, httpx.Client(base_url=srv.url) as c:
        yield c


def test_replay_only_serves_the_timeline_and_refuses_generation(replay_server, recorded):
    c = replay_server
    h = c.get("/api/health").json()
    assert h["status"] == "ok" and h["replay_only"] is True and h["model"] == "tiny-random"
    assert c.get("/api/status").json()["replay_only"] is True
    assert c.get("/api/timeline.json").json() == recorded
    for method, path, body in [("post", "/api/generate", {"prompt": "hi"}), ("post", "/api/mode", {"mode": "sync"}),
                               ("post", "/api/burst", {}), ("post", "/v1/completions", {"prompt": "hi"})]:
        r = c.request(method, path, json=body)
        assert r.status_code == 409, (path, r.text)
        assert "replay" in json.dumps(r.json())


def test_replay_command_refuses_a_malformed_file(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "batchscope.timeline/1"}')
    assert cli_main(["replay", str(bad), "--no-ui"]) == 2
    assert "cannot replay" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------------------ auth

@pytest.mark.parametrize("host, token, ok", [
    ("127.0.0.1", None, True), ("localhost", None, True), ("::1", None, True),
    ("0.0.0.0", None, False), ("192.168.1.5", None, False), ("example.org", None, False),
    ("0.0.0.0", TOKEN, True), ("0.0.0.0", "short", False),
])
def test_binding_beyond_loopback_needs_a_token(host, token, ok):
    if ok:
        check_bind(host, token)
    else:
        with pytest.raises(ValueError, match="token"):
            check_bind(host, token)


def test_serve_refuses_to_start_open_to_the_network(capsys):
    assert cli_main(["serve", "--model", "tiny-random", "--host", "0.0.0.0", "--no-ui"]) == 2
    assert "--token" in capsys.readouterr().err


@pytest.fixture(scope="module")
def guarded(recorded):
    state = AppState(replay=validate_timeline(recorded))
    with ServerThread(create_app(state, token=TOKEN, ui=False)) as srv:
        yield srv


def test_token_guards_every_route(guarded):
    with httpx.Client(base_url=guarded.url) as c:
        for path in ("/api/health", "/api/timeline.json", "/batchscope-static/plotly.min.js", "/", "/v1/models"):
            r = c.get(path)
            assert r.status_code == 401, path
        assert "token" in r.json()["error"]["message"]           # /v1 answers in OpenAI's shape
        assert "token" in c.get("/api/health").json()["error"]
        assert c.get("/api/health", headers={"Authorization": "Bearer wrong-token-123"}).status_code == 401
        assert c.get("/api/health", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200


def test_token_in_the_url_sets_a_cookie_for_the_page(guarded):
    with httpx.Client(base_url=guarded.url) as c:
        r = c.get("/api/health", params={"token": TOKEN})
        assert r.status_code == 200 and "batchscope_token" in r.headers["set-cookie"]
        assert "HttpOnly" in r.headers["set-cookie"]
        assert c.get("/api/status").status_code == 200          # the cookie now travels with every call


def test_websocket_needs_the_token(guarded):
    import asyncio

    import websockets

    async def go():
        url = guarded.url.replace("http", "ws") + "/ws/telemetry"
        with pytest.raises(websockets.exceptions.InvalidStatus) as e:
            async with websockets.connect(url):
                pass
        assert e.value.response.status_code == 403
        async with websockets.connect(url + f"?token={TOKEN}") as ws:
            hello = json.loads(await asyncio.wait_for(ws.recv(), 10))
            assert hello["type"] == "hello" and hello["replay_only"] is True

    asyncio.run(go())


def test_port_in_use_is_reported():
    # a second server on the same port fails to start instead of hanging
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(RuntimeError, match="did not start"):
            ServerThread(create_app(AppState(replay={}), ui=False), port=port).start(timeout=10)


# ------------------------------------------------------------------------------------------- UI and commands

def test_ui_is_mounted_at_root_without_shadowing_the_api(recorded):
    state = AppState(replay=validate_timeline(recorded))
    with ServerThread(create_app(state, ui=True)) as srv, httpx.Client(base_url=srv.url, timeout=30) as c:
        page = c.get("/")
        assert page.status_code == 200 and "text/html" in page.headers["content-type"]
        assert "/batchscope-static/plotly.min.js" in page.text                  # the page loads plotly from us, not a CDN
        assert c.get("/api/health").json()["replay_only"] is True
        assert c.get("/batchscope-static/plotly.min.js").status_code == 200


def test_bench_dispatches_with_its_own_finer_options(monkeypatch):
    import batchscope.app.bench.command

    seen = {}

    def fake_main(args):
        seen["args"] = args
        return 0
    monkeypatch.setattr(batchscope.app.bench.command, "main", fake_main)
    assert cli_main(["bench", "--model", "tiny-random", "--modes", "async", "--requests", "4", "--out", "b.json",
                     "--repeats", "3"]) == 0
    args = seen["args"]
    assert (args.model, args.modes, args.requests, args.out, args.repeats) == ("tiny-random", ["async"], 4,
                                                                               "b.json", 3)
    assert args.baseline in (None, "none") and args.prompt_tokens == 256


def test_the_status_line_says_when_decode_runs_without_graphs_and_when_ranks_split_the_model():
    """engine.info's cuda_graphs_note and tensor parallel size reach the page's status line (escaped)."""
    from types import SimpleNamespace

    from batchscope.app.ui.page_html import engine_notes

    plain = SimpleNamespace(engine=SimpleNamespace(info={"cuda_graphs": True, "cuda_graphs_note": None,
                                                         "tensor_parallel_size": 1}))
    assert engine_notes(plain) == ""
    note = "CUDA graphs are off: the decode step synchronises with the host (<sync>)"
    eager = SimpleNamespace(engine=SimpleNamespace(info={"cuda_graphs_note": note, "tensor_parallel_size": 2,
                                                         "ranks": [{"device": "cuda:0"}, {"device": "cuda:1"}]}))
    html = engine_notes(eager)
    assert "the decode step synchronises with the host (&lt;sync&gt;)" in html and 'id="bs-graphs-note"' in html
    assert "tensor parallel x2 (cuda:0, cuda:1)" in html
    replay = SimpleNamespace(engine=None, replay={"meta": {"info": {"cuda_graphs_note": "random sampling runs "
                                                                                         "eagerly: x"}}})
    assert "random sampling runs eagerly" in engine_notes(replay)
