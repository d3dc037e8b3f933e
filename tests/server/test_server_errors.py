"""Uploads as `curl -F file=@...` sends them, and errors in one documented shape per API: {"error": "reason"}
outside /v1, OpenAI's {"error": {"message", "type", "param", "code"}} on /v1 with the request's own field names,
and a `model` the server does not serve refused as vLLM refuses it (404 model_not_found)."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from batchscope.app.loadtest.specs import Limits
from batchscope.app.server import ServerThread, create_app
from batchscope.app.server.state import AppState
from batchscope.engine import EngineConfig
from batchscope.telemetry import load_timeline
from test_server_limits import raw_request, read_response

FIXTURES = Path(__file__).parents[1] / "fixtures"
OWN_TIMELINE = FIXTURES / "batchscope-cpu-async.timeline.json.gz"
SYNC_TRACE = FIXTURES / "batchscope-cpu-sync.pt.trace.json.gz"
REPORT = FIXTURES / "guidellm-0.8-sweep.json"
LIMITS = Limits(max_prompt_tokens=256, max_new_tokens=64, max_burst_requests=8, max_concurrent_bursts=2,
                max_waiting_requests=64)
OPENAI_KEYS = {"message", "type", "param", "code"}


@pytest.fixture(scope="module")
def client():
    state = AppState.load(EngineConfig(model="tiny-random", device="cpu", dtype="float32", num_blocks=64,
                                       max_batch_tokens=256, max_running=8), LIMITS)
    try:
        with TestClient(create_app(state, ui=False)) as c:
            yield c
    finally:
        state.close()


# ------------------------------------------------------------------------------------------------ uploads

def test_a_timeline_uploads_as_a_form_file(client):
    steps = len(json.loads(gzip.decompress(OWN_TIMELINE.read_bytes()))["steps"])
    r = client.post("/api/replay", files={"file": ("mine.timeline.json.gz", OWN_TIMELINE.read_bytes())})
    assert r.status_code == 200, r.text
    assert r.json()["steps"] == steps
    # the raw body still works, and gives the same replay
    raw = client.post("/api/replay", content=OWN_TIMELINE.read_bytes())
    assert raw.status_code == 200 and raw.json()["steps"] == steps


def test_a_form_uploaded_trace_is_named_by_its_file_name(client):
    r = client.post("/api/replay", files={"trace": ("rank0.pt.trace.json.gz", SYNC_TRACE.read_bytes())})
    assert r.status_code == 200, r.text
    files = client.get("/api/replay.json").json()["meta"]["source"]["files"]
    assert [f["name"] for f in files] == ["rank0.pt.trace.json.gz"]


def test_a_report_uploads_as_a_form_file(client):
    r = client.post("/api/sweep/import", files={"file": ("report.json", REPORT.read_bytes())},
                    params={"slo_ttft_ms": 100})
    assert r.status_code == 200, r.text
    assert r.json()["tool"] == "guidellm"


@pytest.mark.parametrize("path", ["/api/replay", "/api/sweep/import"])
@pytest.mark.parametrize("send, status, reason", [
    (dict(files=[("a", ("a.json", b"{}")), ("b", ("b.json", b"{}"))]), 415, "2 file fields, not one"),
    (dict(data={"name": "x"}, files=[]), 415, "urlencoded"),
    (dict(data={"note": "no file"}, files={"f": ("", b"")}), 415, "0 file fields"),
    (dict(files={"file": ("empty.json", b"")}), 400, "'file' is empty"),
])
def test_a_form_without_exactly_one_file_says_how_to_send_one(client, path, send, status, reason):
    if not send.get("files"):
        send = {"content": b"name=x", "headers": {"content-type": "application/x-www-form-urlencoded"}}
    r = client.post(path, **send)
    assert r.status_code == status, r.text
    assert reason in r.json()["error"]
    assert client.get("/api/health").json()["status"] == "ok"


@pytest.mark.parametrize("path", ["/api/replay", "/api/sweep/import"])
def test_a_form_over_the_upload_limit_is_413_before_it_is_read(path):
    """The limit counts the whole form: an 80 MiB one, declared and never sent, is refused at once."""
    timeline = load_timeline(gzip.decompress(OWN_TIMELINE.read_bytes()))
    with ServerThread(create_app(AppState(replay=timeline), ui=False)) as srv:
        sock = raw_request(srv.url, f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; "
                                    f"boundary=b\r\nContent-Length: {80 << 20}\r\n\r\n")
        try:
            status, body = read_response(sock)
        finally:
            sock.close()
    assert status == 413 and "64 MiB" in body["error"]


def test_a_form_is_not_read_as_json(client):
    """The issue's case: a form's boundary lines and headers were parsed as JSON ("nested 107 levels")."""
    trace = json.dumps({"traceEvents": [{"ph": "X", "args": {"a": [[[1]]]}}]}).encode()
    r = client.post("/api/replay", files={"file": ("t.json", trace)})
    assert "nested" not in r.text and "not valid JSON" not in r.text, r.text


# ------------------------------------------------------------------------------------------- error shapes

API_ERRORS = [
    ("get", "/api/nope", None, 404, "no route GET /api/nope"),
    ("delete", "/api/burst", None, 405, "does not take DELETE"),
    ("post", "/api/burst", {"num_requests": "many"}, 400, "num_requests"),
    ("post", "/api/mode", {"mode": "turbo"}, 400, "mode must be"),
    ("get", "/api/bursts/b-nope", None, 404, "b-nope"),
    ("get", "/api/requests/slowest?n=x", None, 400, "n"),
]


@pytest.mark.parametrize("method, path, body, status, reason", API_ERRORS)
def test_api_errors_are_one_shape(client, method, path, body, status, reason):
    r = client.request(method, path, json=body) if body is not None else client.request(method, path)
    assert r.status_code == status, r.text
    assert list(r.json()) == ["error"] and isinstance(r.json()["error"], str)
    assert reason in r.json()["error"]


OPENAI_ERRORS = [
    ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens", "max_tokens must be"),
    ({"prompt": "x", "max_tokens": 65}, 400, "max_tokens", "max_tokens 65 is over the limit of 64"),
    ({"prompt": "x", "temperature": -1}, 400, "temperature", "temperature"),
    ({"prompt": "x", "mirostat": 2}, 400, "mirostat", "unsupported field: mirostat"),
    ({"prompt": "x", "model": "gpt-4o"}, 404, "model", "`gpt-4o` does not exist"),
]


@pytest.mark.parametrize("body, status, param, reason", OPENAI_ERRORS)
def test_openai_errors_name_the_requests_fields(client, body, status, param, reason):
    r = client.post("/v1/completions", json=body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == OPENAI_KEYS and list(r.json()) == ["error"]
    assert err["param"] == param and reason in err["message"]
    assert not err["message"].startswith("max_new_tokens") and "max_new_tokens must" not in err["message"]


def test_an_unknown_model_is_vllms_404_and_the_served_one_is_served(client):
    r = client.post("/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "x"}]})
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "model_not_found" and r.json()["error"]["type"] == "not_found_error"
    served = client.get("/v1/models").json()["data"][0]
    for model in (served["id"], served["root"], None):
        body = {"prompt": "x", "max_tokens": 1, **({"model": model} if model else {})}
        assert client.post("/v1/completions", json=body).status_code == 200, model


def test_openapi_documents_the_error_bodies_actually_sent(client):
    schema = client.get("/api/openapi.json").json()
    text = json.dumps(schema)
    assert '"422"' not in text and "HTTPValidationError" not in text
    burst = schema["paths"]["/api/burst"]["post"]["responses"]["4XX"]
    completions = schema["paths"]["/v1/completions"]["post"]["responses"]["4XX"]
    assert burst["content"]["application/json"]["schema"]["$ref"].endswith("/Error")
    assert completions["content"]["application/json"]["schema"]["$ref"].endswith("/OpenAIError")
    assert set(schema["components"]["schemas"]["OpenAIError"]["properties"]["error"]["properties"]) == OPENAI_KEYS
