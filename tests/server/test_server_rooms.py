"""The server's rooms (load lab, sweeps, timelines, profiler), each a FastAPI dependency of the routes that need
it: each says itself, through HTTP, when what was asked for is not there (404), when the server has no engine
(409, replay-only) and when it is going down (503) — and a malformed request is still told so first."""
from __future__ import annotations

import httpx
import pytest
from starlette.testclient import TestClient

from batchscope.app.loadtest.specs import Limits
from batchscope.app.server import create_app
from batchscope.app.server.load_lab import LoadLab, load_lab
from batchscope.app.server.profiler import Profiler, profiler
from batchscope.app.server.state import AppState
from batchscope.app.server.sweep_lab import SweepLab, sweep_lab
from batchscope.app.server.timelines import Timelines, timelines
from batchscope.telemetry import Telemetry
from helpers import tiny_served

LIMITS = Limits(max_prompt_tokens=64, max_new_tokens=16, max_burst_requests=4, max_waiting_requests=16)
NO_ENGINE = "no model is loaded"
BURST = {"num_requests": 1, "prompt_tokens": [4, 4], "max_new_tokens": [2, 2]}


@pytest.fixture(scope="module")
def live():
    with tiny_served(LIMITS, ui=False, num_blocks=64, max_batch_tokens=64) as (srv, state):
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            yield c, state


@pytest.fixture(scope="module")
def replay_only():
    state = AppState(replay={"steps": [], "requests": [], "meta": {"model": "recorded"}})
    with TestClient(create_app(state, ui=False)) as c:
        yield c


def error(r: httpx.Response, status: int, reason: str) -> None:
    assert r.status_code == status, r.text
    assert reason in r.json()["error"], r.text


def test_each_room_is_an_attribute_of_the_state_and_its_dependency_gives_it(live):
    _, state = live
    rooms = {load_lab: (LoadLab, state.load_lab), sweep_lab: (SweepLab, state.sweep_lab),
             timelines: (Timelines, state.timelines), profiler: (Profiler, state.profiler)}
    for dependency, (kind, room) in rooms.items():
        assert isinstance(room, kind) and dependency(state) is room


# ------------------------------------------------------------------------------------------------- 404s
@pytest.mark.parametrize("method, path, reason", [
    ("get", "/api/bursts/b-nope", "no burst with id 'b-nope'"),
    ("get", "/api/ab/ab-nope", "no A/B run with id 'ab-nope'"),
    ("get", "/api/load/l-nope", "no load with id 'l-nope'"),
    ("post", "/api/load/l-nope/stop", "no load with id 'l-nope'"),
])
def test_the_load_lab_says_which_run_it_does_not_know(live, method, path, reason):
    error(live[0].request(method, path), 404, reason)


@pytest.mark.parametrize("method, path, reason", [
    ("get", "/api/sweep/s-nope", "no sweep with id 's-nope'"),
    ("get", "/api/sweep/s-nope.json", "no sweep with id 's-nope'"),
    ("get", "/api/sweep/s-nope.csv", "no sweep with id 's-nope'"),
    ("post", "/api/sweep/s-nope/stop", "no sweep with id 's-nope'"),
    ("get", "/api/sweep/imports/i-nope", "no imported report with id 'i-nope'"),
])
def test_the_sweep_lab_says_which_sweep_or_report_it_does_not_know(live, method, path, reason):
    error(live[0].request(method, path), 404, reason)


@pytest.mark.parametrize("path, reason", [
    ("/api/timeline.json?recording=nope", "no recording named 'nope'"),
    ("/api/trace.json?recording=nope", "no recording named 'nope'"),
    ("/api/requests/r-nope/waits", "no request 'r-nope' in the live timeline"),
    ("/api/replay.json", "no replay loaded"),
    ("/api/replay/trace.json", "no replay loaded"),
    ("/api/requests/slowest?replay=true", "no replay loaded"),
])
def test_timelines_say_what_is_not_there(live, path, reason):
    error(live[0].get(path), 404, reason)


def test_the_profiler_has_no_trace_before_a_window(live):
    error(live[0].get("/api/profile/trace.json.gz"), 404, "no profiler trace yet")


# ------------------------------------------------------------------------------------ replay-only: 409
WITHOUT_ENGINE = [
    ("post", "/api/burst", BURST), ("post", "/api/ab", BURST), ("get", "/api/bursts/b-1", None),
    ("get", "/api/ab/a-1", None), ("get", "/api/load/l-1", None), ("post", "/api/load/l-1/stop", None),
    ("post", "/api/mode", {"mode": "sync"}),
    ("post", "/api/sweep", {"modes": ["sync"], "points": 1}), ("get", "/api/sweep/s-1", None),
    ("get", "/api/sweep/s-1.csv", None), ("post", "/api/sweep/s-1/stop", None),
    ("get", "/api/sweep/imports/i-1", None),
    ("post", "/api/recording/start", None), ("post", "/api/recording/stop", None), ("get", "/api/history", None),
    ("post", "/api/profile", {"steps": 2}), ("get", "/api/profile", None), ("get", "/api/profile/trace.json.gz", None),
    ("post", "/api/profile/open", None),
]


@pytest.mark.parametrize("method, path, body", WITHOUT_ENGINE)
def test_every_room_refuses_work_without_an_engine(replay_only, method, path, body):
    r = replay_only.request(method, path, json=body) if body is not None else replay_only.request(method, path)
    error(r, 409, NO_ENGINE)


def test_without_an_engine_the_lists_read_empty_and_the_replay_is_the_timeline(replay_only):
    assert replay_only.get("/api/bursts").json() == {"bursts": [], "ab": [], "kept": 0, "dropped": {}}
    assert replay_only.get("/api/sweeps").json() == {"sweeps": [], "imports": []}
    assert replay_only.get("/api/recordings").json()["recordings"] == []
    assert replay_only.get("/api/mode").json()["reason"] == "replay-only: no engine to switch"
    assert replay_only.get("/api/timeline.json").json()["meta"] == {"model": "recorded"}
    error(replay_only.get("/api/timeline.json?recording=x"), 404, "no recording 'x': this server is replay-only")


def test_a_malformed_request_is_told_so_before_the_room_refuses_it(replay_only):
    """The rooms raise when the route calls them, not while FastAPI resolves the dependency: the body's own
    error comes first, as it did before."""
    error(replay_only.post("/api/burst", json={"num_requests": "many"}), 400, "num_requests")
    error(replay_only.post("/api/profile", json={}), 400, "steps")


# -------------------------------------------------------------------------------------- shutting down: 503
def test_while_going_down_no_room_starts_anything():
    from synthetic import SyntheticEngine

    eng = SyntheticEngine(gpu=False)
    tel = Telemetry(eng, nvml_hz=0)
    state = AppState(eng, tel, LIMITS)
    try:
        state.begin_shutdown()
        with TestClient(create_app(state, ui=False)) as c:
            for path, body in [("/api/burst", BURST), ("/api/ab", BURST), ("/api/profile", {"steps": 2}),
                               ("/api/load", {"concurrency": 1, "prompt_tokens": 4, "max_new_tokens": 2}),
                               ("/api/sweep", {"modes": ["sync"], "points": 1})]:
                error(c.post(path, json=body), 503, "shutting down")
            assert c.get("/api/bursts").status_code == 200          # reading is still fine
    finally:
        state.load_lab.runs.close()
        tel.close()
        state.profiler.windows.close()
