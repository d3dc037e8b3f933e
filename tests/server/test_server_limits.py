"""Serving stays bounded and robust: deeply nested JSON is a 4xx on every JSON route, oversize bodies are refused
before they are read, recordings, bursts, viewers and requests in flight are capped (and say when they dropped
something), the status reports the process's memory, and SIGTERM during a burst shuts down at once."""
import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time

import httpx
import psutil
import pytest
import websockets

from batchscope.app.loadtest.manager import BurstManager
from batchscope.app.loadtest.specs import BurstSpec, Limits
from batchscope.app.server import MAX_BODY_BYTES, MAX_REPLAY_BYTES, ServerThread, create_app
from batchscope.app.server.errors import BusyError, ShuttingDownError
from batchscope.app.server.replay import MAX_JSON_DEPTH, json_depth_over
from batchscope.app.server.state import AppState
from batchscope.engine import Engine, EngineConfig
from batchscope.engine.request import TokenDelta
from batchscope.telemetry import Telemetry, validate_timeline
from batchscope.telemetry.hub import Hub, TooManySubscribers
from synthetic import SyntheticEngine

LIMITS = Limits(max_prompt_tokens=256, max_new_tokens=256, max_burst_requests=32, max_concurrent_bursts=2,
                max_waiting_requests=64)
REC_BYTES = 40_000                  # small recording caps, so a few generated tokens reach them
REC_TOTAL = 100_000                 # two full recordings and a half
DEEP = 100_000                      # the payload: 100,000 levels of '['


@pytest.fixture(scope="module")
def served():
    engine = Engine(EngineConfig(model="tiny-random", device="cpu", dtype="float32", mode="async", num_blocks=256,
                                 max_batch_tokens=256, max_running=32))
    tel = Telemetry(engine, nvml_hz=5, max_recordings=3, max_recording_bytes=REC_BYTES,
                    max_recordings_bytes=REC_TOTAL, max_subscribers=2)
    state = AppState(engine, tel, LIMITS)
    app = create_app(state, ui=False)
    srv = ServerThread(app).start()
    yield srv, state, app
    srv.stop()
    state.close()


@pytest.fixture(scope="module")
def client(served):
    with httpx.Client(base_url=served[0].url, timeout=60) as c:
        yield c


def post_raw(client, path: str, body: bytes) -> httpx.Response:
    return client.post(path, content=body, headers={"content-type": "application/json"})


def error_text(r: httpx.Response) -> str:
    err = r.json()["error"]
    return err["message"] if isinstance(err, dict) else err


# ----------------------------------------------------------------------------------------------- deep JSON

def json_post_routes(app) -> list[str]:
    """Every POST route the app serves (from its OpenAPI schema, which lists included routers' routes)."""
    return sorted(path for path, ops in app.openapi()["paths"].items() if "post" in ops)


def test_every_json_route_is_covered(served):
    routes = json_post_routes(served[2])
    # the routes the issue names, so that a renamed route cannot silently drop out of the next test
    assert {"/api/replay", "/api/generate", "/api/burst", "/api/ab", "/api/mode", "/v1/completions",
            "/v1/chat/completions", "/api/recording/start"} <= set(routes)


@pytest.mark.parametrize("body", [
    b"[" * DEEP,                                            # unterminated, as in the issue
    b"[" * DEEP + b"]" * DEEP,                              # valid JSON, just deep
    b'{"prompt": ' + b"[" * DEEP + b"]" * DEEP + b"}",       # deep inside an object
    b'{"a": ' * 900 + b"1" + b"}" * 900,                    # under Python's recursion limit, still refused
], ids=["open", "closed", "in-object", "900-objects"])
def test_deep_json_is_4xx_with_a_reason_on_every_json_route(served, client, body):
    for path in json_post_routes(served[2]):
        r = post_raw(client, path, body)
        assert 400 <= r.status_code < 500, (path, r.status_code, r.text[:200])
        assert "nested" in error_text(r), (path, r.text[:200])
    assert client.get("/api/health").json()["status"] == "ok"
    r = client.post("/api/generate", json={"prompt": [1500, 1501], "max_new_tokens": 2, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["output_tokens"] == 2


def test_nesting_at_the_limit_is_parsed_and_one_more_level_is_refused(client):
    nested: object = 1
    for _ in range(MAX_JSON_DEPTH - 1):             # plus the body object itself: exactly the limit
        nested = [nested]
    body = {"prompt": "hi", "max_tokens": 2, "ignore_eos": True, "stream_options": None}
    r = client.post("/v1/completions", json={**body, "metadata": nested})
    assert r.status_code == 200, r.text
    r = client.post("/v1/completions", json={**body, "metadata": [nested]})
    assert r.status_code == 400 and f"{MAX_JSON_DEPTH + 1} levels" in error_text(r)


def test_depth_scan_ignores_brackets_inside_strings():
    assert json_depth_over(json.dumps({"prompt": "[" * 10_000 + '\\"{' * 100})) is None
    assert json_depth_over(b"[" * 65 + b"]" * 65) == 65
    assert json_depth_over(b'["\\\\"' + b"[" * 70) == 71      # an escaped backslash does not hide the quote


def test_a_timeline_with_deep_meta_is_refused_and_the_replay_kept(client):
    tl = client.get("/api/timeline.json").json()
    assert post_raw(client, "/api/replay", json.dumps(tl).encode()).status_code == 200
    deep = json.dumps(tl)[:-1] + ', "extra": ' + "[" * 2000 + "]" * 2000 + "}"
    r = post_raw(client, "/api/replay", deep.encode())
    assert r.status_code == 400 and "nested 2001 levels" in r.json()["error"]
    assert client.get("/api/replay.json").json() == tl


# ------------------------------------------------------------------------------------------- oversize bodies

def raw_request(url: str, head: str) -> socket.socket:
    host, port = url[len("http://"):].split(":")
    sock = socket.create_connection((host, int(port)), timeout=20)
    sock.sendall(head.encode("latin-1"))
    return sock


def read_response(sock: socket.socket) -> tuple[int, dict]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    length = int(next(ln.split(b":")[1] for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length")))
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return status, json.loads(rest[:length])


def test_replay_over_the_limit_is_413_from_its_content_length_alone(served, client):
    assert MAX_REPLAY_BYTES == 64 << 20
    # the 80 MiB, declared but never sent: an answer proves nothing was waited for or read
    sock = raw_request(served[0].url, f"POST /api/replay HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                      f"Content-Length: {80 << 20}\r\n\r\n")
    try:
        status, body = read_response(sock)
    finally:
        sock.close()
    assert status == 413 and "64 MiB" in body["error"]
    assert client.get("/api/health").json()["status"] == "ok"


def test_chunked_replay_over_the_limit_is_413_and_reading_stops(served, client):
    sock = raw_request(served[0].url, "POST /api/replay HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                      "Transfer-Encoding: chunked\r\n\r\n")
    sent = [0]
    chunk = b"x" * (1 << 20)
    frame = b"%x\r\n" % len(chunk) + chunk + b"\r\n"

    def pump():                         # offers twice the limit and never ends the body
        try:
            for _ in range(2 * (MAX_REPLAY_BYTES >> 20)):
                sock.sendall(frame)
                sent[0] += len(chunk)
        except OSError:
            pass                        # the server hung up after its answer
    sender = threading.Thread(target=pump, daemon=True)
    sender.start()
    try:
        status, body = read_response(sock)
        assert status == 413 and "limit" in body["error"]
        sender.join(20)
    finally:
        sock.close()
    # what the server did not read stays in socket buffers (a few MiB on loopback), never the other 64 MiB
    assert sent[0] < MAX_REPLAY_BYTES + (24 << 20), sent[0] >> 20
    assert client.get("/api/health").json()["status"] == "ok"


def test_json_routes_keep_the_smaller_body_limit(client):
    r = post_raw(client, "/api/burst", b'{"seed": 1, "pad": "' + b"x" * MAX_BODY_BYTES + b'"}')
    assert r.status_code == 413 and "8 MiB" in r.json()["error"]


def test_one_replay_is_loaded_at_a_time(served):
    timelines = served[1].timelines
    assert timelines._replay_lock.acquire()         # as if another upload were being parsed
    try:
        with pytest.raises(BusyError, match="another timeline"):
            timelines.load_replay(b"{}")
    finally:
        timelines._replay_lock.release()


# ------------------------------------------------------------------------------------------------ recordings

def generate(client, tokens: int) -> None:
    r = client.post("/api/generate", json={"prompt": [1500, 1501, 1502], "max_new_tokens": tokens,
                                           "ignore_eos": True})
    assert r.status_code == 200


def test_a_recording_stops_storing_at_its_byte_cap_and_says_so(client):
    r = client.post("/api/recording/start", json={"name": "big"}).json()
    assert r["max_bytes"] == REC_BYTES
    for _ in range(4):
        generate(client, 200)
    stop = client.post("/api/recording/stop").json()
    stored = stop["stored"]
    assert stored["truncated"] is True and stored["full"] is True
    assert stored["bytes"] <= REC_BYTES and sum(stored["dropped"].values()) > 0
    tl = client.get("/api/timeline.json", params={"recording": "big"}).json()
    validate_timeline(tl)
    assert tl["meta"]["recording"]["truncated"] is True
    # the estimate bounds what the export really holds
    records = sum(len(json.dumps(tl[k], separators=(",", ":"))) for k in ("steps", "requests", "nvml"))
    assert records <= stored["bytes"]
    details = {d["name"]: d for d in client.get("/api/recordings").json()["details"]}
    assert details["big"]["truncated"] is True
    assert "big" in client.get("/api/status").json()["recordings"]["truncated"]


def test_the_oldest_recordings_go_past_the_count_or_byte_budget_and_are_named(client):
    # fill the byte budget: two full recordings
    names = []
    for i in range(2):
        name = f"full-{i}"
        client.post("/api/recording/start", json={"name": name})
        for _ in range(4):
            generate(client, 200)
        assert client.post("/api/recording/stop").json()["stored"]["truncated"] is True
        names.append(name)
    before = client.get("/api/status").json()["recordings"]
    assert before["max_count"] == 3 and before["max_bytes"] == REC_TOTAL and before["policy"] == "drop-oldest"
    assert before["bytes"] <= REC_TOTAL
    # three kept at most, and the new one's cap must fit beside the others: the oldest go first
    start = client.post("/api/recording/start", json={"name": "next"}).json()
    client.post("/api/recording/stop")
    assert start["dropped_recordings"], start
    assert start["dropped_recordings"][-1] in ["big"] + names
    kept = client.get("/api/recordings").json()["recordings"]
    assert kept[-1] == "next" and len(kept) <= 3
    assert not set(start["dropped_recordings"]) & set(kept)
    status = client.get("/api/status").json()["recordings"]
    assert status["count"] == len(kept) and status["bytes"] <= REC_TOTAL
    assert status["dropped"] >= before["dropped"] + len(start["dropped_recordings"])
    assert set(start["dropped_recordings"]) <= set(status["dropped_names"])
    r = client.get("/api/timeline.json", params={"recording": start["dropped_recordings"][0]})
    assert r.status_code == 404


def test_past_the_count_cap_starting_a_recording_drops_the_oldest(client):
    starts = []
    for i in range(4):
        starts.append(client.post("/api/recording/start", json={"name": f"c{i}"}).json())
        client.post("/api/recording/stop")
    assert client.get("/api/recordings").json()["recordings"] == ["c1", "c2", "c3"]
    assert starts[3]["dropped_recordings"] == ["c0"]
    assert "c0" in client.get("/api/status").json()["recordings"]["dropped_names"]


def test_recorder_cuts_every_kind_at_once_and_keeps_the_budget():
    eng = SyntheticEngine(gpu=True)
    tel = Telemetry(eng, nvml_hz=0, max_recordings=8, max_recording_bytes=50_000, max_recordings_bytes=120_000)
    for i in range(4):
        rec = tel.start_recording(f"r{i}")
        eng.submit(8, prompt_tokens=16, max_new_tokens=100)
        eng.run()
        tel.stop_recording()
        info = tel.recording_info(f"r{i}")
        assert info["truncated"] and info["bytes"] <= 50_000
        assert tel.recorder.stored_bytes() <= 120_000
        if i >= 2:                       # two full ones leave no room for a third's cap
            assert rec["dropped_recordings"] == [f"r{i - 2}"]
    # nothing of any kind is stored after the cut
    full = tel.recorder.recordings["r3"]
    assert max(max(b for _, b in s["cpu"].values()) for s in full.steps) <= full.full_at_us
    assert all(r["finish_us"] is not None and r["finish_us"] <= full.full_at_us for r in full.requests)
    assert full.dropped["steps"] > 0 and full.dropped["requests"] > 0
    assert tel.recordings() == ["r2", "r3"] and tel.status()["recordings"]["dropped"] == 2
    tel.close()


# --------------------------------------------------------------------------------------------- status, caps

def test_status_reports_rss_and_recordings(client):
    s = client.get("/api/status").json()
    rss = psutil.Process().memory_info().rss / (1 << 20)         # the server runs in this process
    assert isinstance(s["rss_mb"], float) and 0.8 * rss < s["rss_mb"] < 1.25 * rss
    assert {"count", "bytes", "max_count", "max_bytes", "dropped", "dropped_names"} <= set(s["recordings"])
    assert s["max_replay_bytes"] == MAX_REPLAY_BYTES and s["max_json_depth"] == MAX_JSON_DEPTH
    assert {"kept_bursts", "max_kept", "dropped"} <= set(s["bursts"])
    assert s["telemetry"]["hub"]["max_subscribers"] == 2


def test_a_viewer_past_the_cap_is_told_and_closed(served, client):
    url = served[0].url.replace("http://", "ws://") + "/ws/telemetry"

    async def go():
        async with websockets.connect(url, max_size=None) as a, websockets.connect(url, max_size=None) as b:
            assert json.loads(await a.recv())["type"] == "hello"
            assert json.loads(await b.recv())["type"] == "hello"
            async with websockets.connect(url, max_size=None) as c:
                msg = json.loads(await c.recv())
                assert msg["type"] == "error" and "limit 2" in msg["error"]
                with pytest.raises(websockets.ConnectionClosed) as closed:
                    await asyncio.wait_for(c.recv(), 10)
                assert closed.value.rcvd.code == 1013
        hub = client.get("/api/status").json()["telemetry"]["hub"]
        assert hub["refused_subscribers"] >= 1

    asyncio.run(go())


def test_a_stalled_viewer_holds_at_most_its_byte_cap():
    hub = Hub(start=False, max_queue_bytes=10_000, max_subscribers=1)
    sub = hub.subscribe(max_queue=1000)
    with pytest.raises(TooManySubscribers):
        hub.subscribe()
    for i in range(200):
        hub.publish("step", {"step": i, "pad": "x" * 500})
        hub.flush()
        assert sub.queued_bytes() <= 10_000
    msgs = sub.get_nowait()
    assert msgs[0]["type"] == "dropped" and msgs[0]["frames"] > 150
    assert hub.status()["dropped_frames"] == sub.dropped_frames
    hub.close()


class FakeHandle:
    def __init__(self):
        self.finished = False
        self.cancelled = False

    @property
    def done(self):
        return self.finished

    def cancel(self):
        self.cancelled = True


class FakeEngine:
    """An engine that never picks its submissions up: its own queue count stays at zero."""
    info = {"max_running": 2, "vocab_size": 100, "model": "fake", "device": "cpu"}
    mode = "async"

    def __init__(self):
        self.handles = []

    def stats(self):
        return {"queue": 0, "running": 0}

    def submit(self, ids, params):
        self.handles.append(FakeHandle())
        return self.handles[-1]


def test_requests_in_flight_are_capped_even_before_the_engine_counts_them():
    eng = FakeEngine()
    state = AppState(eng, limits=Limits(max_waiting_requests=3))
    for _ in range(5):                              # the queue limit plus what the engine runs at once
        state.submit([1], None)
    with pytest.raises(BusyError, match="in flight"):
        state.submit([1], None)
    eng.handles[0].finished = True
    state.submit([1], None)
    assert state.status().inflight == 5
    state.begin_shutdown()
    assert all(h.cancelled for h in eng.handles if not h.finished)
    with pytest.raises(ShuttingDownError):
        state.submit([1], None)
    with ServerThread(create_app(state, ui=False)) as srv:
        r = httpx.post(srv.url + "/api/burst", json={"num_requests": 1})
        assert r.status_code == 503 and "shutting down" in r.json()["error"]
    state.load_lab.runs.close()


class SlowHandle:
    def __init__(self):
        self.cancelled = False

    async def astream(self):
        while not self.cancelled:
            await asyncio.sleep(0.01)
        yield TokenDelta([], "", finished=True, finish_reason="cancelled")

    def cancel(self):
        self.cancelled = True


class SlowEngine:
    mode = "async"

    def __init__(self):
        self.submitted = 0

    def submit(self, prompt, params):
        self.submitted += 1
        return SlowHandle()                         # never streams a token until cancelled


def wait_for(cond, timeout=5.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_bursts_are_kept_up_to_a_cap_and_close_does_not_wait_out_arrivals():
    eng = SlowEngine()
    mgr = BurstManager(eng, Limits(), vocab_size=100, keep=2)
    # poisson arrivals 10 s apart on average (seed 1: at 0, 1.4 and 20 s), and requests that never stream: a
    # cancel must reach both the one in flight and those still waiting for their time
    spec = BurstSpec(num_requests=3, arrival="poisson", rate=0.1, seed=1)
    ids = []
    for i in range(4):
        ids.append(mgr.start_burst(spec))
        wait_for(lambda: eng.submitted > i)         # the first is in flight, the others asleep
        mgr._bursts[ids[-1]].stop()
        deadline = time.monotonic() + 5
        while mgr.running() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not mgr.running(), "a cancelled burst kept waiting"
    listing = mgr.list()
    assert [b.id for b in listing.bursts] == ids[-2:] and listing.dropped["bursts"] == 2
    mgr.start_burst(spec)
    wait_for(lambda: eng.submitted > 4)
    t0 = time.monotonic()
    mgr.close(timeout=10)
    assert time.monotonic() - t0 < 2.0
    assert mgr.status()["running"] == 0


# ---------------------------------------------------------------------------------------------------- SIGTERM

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_sigterm_during_a_burst_exits_at_once_and_cleanly():
    port = free_port()
    cmd = [sys.executable, "-m", "batchscope.app.cli", "serve", "--model", "tiny-random", "--device", "cpu",
           "--dtype", "float32", "--num-blocks", "512", "--max-batch-tokens", "256", "--max-running", "32",
           "--no-ui", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 180
        while True:
            try:
                if httpx.get(url + "/api/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "batchscope serve did not come up"
            time.sleep(0.2)
        server = psutil.Process(proc.pid)
        rss = server.memory_info().rss / (1 << 20)       # this server process's, not the test's
        assert 0.7 * rss < httpx.get(url + "/api/status").json()["rss_mb"] < 1.4 * rss

        events, ended = [], threading.Event()

        def stream():                   # a long stream open across the shutdown
            try:
                with httpx.stream("POST", url + "/api/generate", timeout=60,
                                  json={"prompt": [1500] * 8, "max_new_tokens": 4000, "ignore_eos": True,
                                        "stream": True}) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: "):
                            events.append(line[6:])
            except httpx.HTTPError as e:
                events.append(f"error: {type(e).__name__}: {e}")
            ended.set()
        reader = threading.Thread(target=stream, daemon=True)
        reader.start()
        deadline = time.monotonic() + 30
        while len(events) < 3 and time.monotonic() < deadline:     # streaming before the burst queues up
            time.sleep(0.05)
        assert len(events) >= 3, events
        burst = httpx.post(url + "/api/burst", json={"num_requests": 256, "prompt_tokens": [16, 64],
                                                     "max_new_tokens": [500, 1000], "ignore_eos": True})
        assert burst.status_code == 200
        while httpx.get(url + "/api/status").json()["running"] < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        children = server.children(recursive=True)

        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(20)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = proc.stdout.read()
    # 0, or killed by SIGTERM itself: uvicorn re-raises the signal once it has shut down, as is conventional
    assert rc in (0, -signal.SIGTERM, 128 + signal.SIGTERM), (rc, out[-3000:])
    assert took < 10, f"shutdown took {took:.1f} s"
    assert "Traceback" not in out and "ERROR" not in out, out[-3000:]
    assert not [c for c in children if c.is_running()], "child processes outlived the server"
    # the open stream was ended by the server, cancelled, not cut off by a timeout
    assert ended.wait(10)
    assert events[-1] == "[DONE]", events[-3:]
    last = json.loads(events[-2])
    assert last["finished"] is True and last["finish_reason"] == "cancelled" and last["output_tokens"] < 4000
    with pytest.raises(httpx.HTTPError):
        httpx.get(url + "/api/health", timeout=2)
