"""/api/profile: a torch.profiler window over the engine's next N steps, asked for over HTTP (and by `batchscope serve
--profile-steps N`), one at a time, its Kineto trace for download, and what the window costs each step it covers."""
from __future__ import annotations

import gzip
import json
import os
import re
import statistics
import sys
import time
import types

import httpx
import pytest
from starlette.testclient import TestClient

from batchscope.app.cli import main as cli_main
from batchscope.app.loadtest.specs import Limits
from batchscope.app.server import create_app
from batchscope.app.server.state import AppState
from batchscope.engine.profiling import MAX_WINDOW_STEPS
from helpers import serve_subprocess, tiny_served

LIMITS = Limits(max_prompt_tokens=256, max_new_tokens=128, max_burst_requests=8, max_waiting_requests=64)
LAUNCH = re.compile(r"^batchscope\.launch step=(\d+) ")


@pytest.fixture(scope="module")
def served():
    with tiny_served(LIMITS, ui=False, num_blocks=256, max_batch_tokens=256) as pair:
        yield pair


@pytest.fixture(scope="module")
def client(served):
    with httpx.Client(base_url=served[0].url, timeout=120) as c:
        yield c


def generate(client, prompts: int = 1, tokens: int = 8) -> None:
    r = client.post("/v1/completions", json={"prompt": [[1500 + i, 1501, 1502] for i in range(prompts)],
                                             "max_tokens": tokens, "ignore_eos": True, "temperature": 0})
    assert r.status_code == 200, r.text


def wait_done(client, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        s = client.get("/api/profile").json()
        if s["state"] in ("done", "error"):
            return s
        time.sleep(0.05)
    raise AssertionError(f"the window did not finish: {s}")


def launches(path: str) -> list[int]:
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return sorted(int(m.group(1)) for e in events if e.get("ph") == "X" and (m := LAUNCH.match(e.get("name", ""))))


def test_nothing_is_profiled_until_asked(client):
    s = client.get("/api/profile").json()
    assert s["state"] == "idle" and s["trace_url"] is None and s["max_steps"] == MAX_WINDOW_STEPS
    r = client.get("/api/profile/trace.json.gz")
    assert r.status_code == 404 and "POST /api/profile" in r.json()["error"]


@pytest.mark.parametrize("body, reason", [
    ({"steps": 0}, "from 1 to 1000"), ({"steps": -3}, "from 1 to 1000"), ({"steps": MAX_WINDOW_STEPS + 1}, "1000"),
    ({"steps": 10**12}, "1000"), ({"steps": "3"}, "integer"), ({"steps": 2.5}, "integer"), ({"steps": True}, "integer"),
    ({}, "steps"), ({"steps": 3, "kernels": True}, "kernels"),
])
def test_bad_windows_are_400_with_a_reason(client, body, reason):
    r = client.post("/api/profile", json=body)
    assert r.status_code == 400 and reason in r.json()["error"], r.text
    assert client.get("/api/profile").json()["state"] in ("idle", "done")      # nothing was started


def test_one_window_at_a_time_then_its_trace(client, served):
    _, state = served
    s = client.post("/api/profile", json={"steps": 6}).json()
    assert s["state"] == "pending" and s["steps"] == 6 and s["trace_url"] is None
    r = client.post("/api/profile", json={"steps": 2})
    assert r.status_code == 409 and "one at a time" in r.json()["error"]
    assert client.get("/api/profile/trace.json.gz").status_code == 404
    generate(client, prompts=2, tokens=12)
    s = wait_done(client)
    assert s["state"] == "done", s["error"]
    assert s["last_step"] - s["first_step"] + 1 == 6
    assert s["start_ms"] >= 0 and s["stop_ms"] >= 0 and s["trace_url"] == "/api/profile/trace.json.gz"
    r = client.get(s["trace_url"])
    assert r.status_code == 200 and r.headers["content-type"] == "application/gzip"
    assert f"steps-{s['first_step']}-{s['last_step']}" in r.headers["content-disposition"]
    assert int(r.headers["content-length"]) == s["trace_bytes"]
    events = json.loads(gzip.decompress(r.content))["traceEvents"]
    steps = sorted(int(m.group(1)) for e in events if e.get("ph") == "X" and (m := LAUNCH.match(e.get("name", ""))))
    # every step of the window; in async also the launch of the next one, built while the last one computed
    assert steps[:6] == list(range(s["first_step"], s["last_step"] + 1)) and len(steps) <= 7
    # the same steps are in the CUDA-event (here host) recording, to be lined up with the trace
    recorded = {r["step"] for r in client.get("/api/timeline.json").json()["steps"]}
    assert set(steps) <= recorded
    # the next window replaces the last one's trace: the folder keeps one
    first_path = state.profiler.windows.trace_path()
    assert client.post("/api/profile", json={"steps": 1}).status_code == 200
    assert not os.path.exists(first_path)
    generate(client, tokens=3)
    assert wait_done(client)["state"] == "done"
    assert len(os.listdir(state.profiler.windows.folder)) == 1


def test_opening_the_trace_needs_the_importer(client, served, switched_timeline, monkeypatch):
    if client.get("/api/profile").json()["state"] != "done":
        client.post("/api/profile", json={"steps": 1})
        generate(client, tokens=2)
        wait_done(client)
    if "batchscope.telemetry.importers" not in sys.modules:
        try:
            import batchscope.telemetry.importers  # noqa: F401
        except ImportError:
            r = client.post("/api/profile/open")
            assert r.status_code == 501 and "ui.perfetto.dev" in r.json()["error"]
            assert client.get("/api/profile").json()["open_url"] is None
    # with one (here a stand-in returning a known timeline), the trace opens as the replay
    timeline = switched_timeline(gpu=True)
    seen = []
    fake = types.ModuleType("batchscope.telemetry.importers")
    fake.import_trace = lambda path, **kw: seen.append(path) or timeline
    monkeypatch.setitem(sys.modules, "batchscope.telemetry.importers", fake)
    s = client.get("/api/profile").json()
    assert s["importer"] and s["open_url"] == "/api/profile/open"
    r = client.post(s["open_url"])
    assert r.status_code == 200 and r.json()["steps"] == len(timeline["steps"])
    assert seen == [served[1].profiler.windows.trace_path()]
    assert client.get("/api/replay.json").json()["steps"] == timeline["steps"]


def test_the_window_opens_as_the_replay_through_the_real_importer(client, served):
    """No stand-in: the trace torch.profiler wrote over a window of this CPU engine, imported by the trace importer
    and loaded as the replay, with the steps of the window and the live recording of them beside it."""
    import batchscope.telemetry.importers as importers

    assert sys.modules["batchscope.telemetry.importers"] is importers and not hasattr(importers, "seen")
    assert client.post("/api/profile", json={"steps": 4}).status_code == 200
    generate(client, prompts=2, tokens=10)
    s = wait_done(client)
    assert s["state"] == "done" and s["open_url"] == "/api/profile/open", s
    r = client.post(s["open_url"])
    assert r.status_code == 200, r.text
    assert r.json()["meta"]["source"]["engine"] == "batchscope"
    replay = client.get("/api/replay.json").json()
    window = list(range(s["first_step"], s["last_step"] + 1))
    numbers = [step["step"] for step in replay["steps"]]
    # every step of the window; in async also the next one, whose launch the window's last step made
    assert numbers[:4] == window and len(numbers) <= 5, numbers
    assert replay["meta"]["source"]["files"][0]["name"] == os.path.basename(served[1].profiler.windows.trace_path())
    assert replay["meta"]["source"]["steps_from"].startswith("batchscope's own ranges")
    assert {step["mode"] for step in replay["steps"]} == {"async"} and replay["summary"]["board"]
    # the same steps in the live recording: on a CPU each one's compute is its launch span, which the trace holds
    # as its launch range (the engine stamps just outside the range, so the two differ by the range's own cost)
    live = {rec["step"]: rec for rec in client.get("/api/timeline.json").json()["steps"]}
    for step in replay["steps"][:4]:
        imported_us = step["compute_us"][1] - step["compute_us"][0]
        recorded_us = live[step["step"]]["compute_us"][1] - live[step["step"]]["compute_us"][0]
        assert imported_us == pytest.approx(recorded_us, abs=max(1000.0, 0.2 * recorded_us)), step["step"]
    assert client.get("/api/status").status_code == 200           # the engine serves on


def test_a_replay_only_server_has_no_engine_to_profile(switched_timeline):
    state = AppState(replay=switched_timeline(gpu=True))
    with TestClient(create_app(state, ui=False)) as c:
        for r in (c.post("/api/profile", json={"steps": 3}), c.get("/api/profile"),
                  c.get("/api/profile/trace.json.gz")):
            assert r.status_code == 409 and "replaying" in r.json()["error"]


def test_a_server_shutting_down_takes_no_window():
    from batchscope.telemetry import Telemetry
    from synthetic import SyntheticEngine

    eng = SyntheticEngine(gpu=False)
    tel = Telemetry(eng, nvml_hz=0)
    state = AppState(eng, tel, LIMITS)
    try:
        state.begin_shutdown()
        with TestClient(create_app(state, ui=False)) as c:
            r = c.post("/api/profile", json={"steps": 3})
            assert r.status_code == 503 and "shutting down" in r.json()["error"]
    finally:
        tel.close()
        state.profiler.windows.close()


def _decode_periods(steps: list, lo: int, hi: int) -> list[float]:
    """ms from each decode step's compute start to the next one's, for steps lo..hi (consecutive only)."""
    by = {s["step"]: s for s in steps}
    return [(by[n + 1]["compute_us"][0] - by[n]["compute_us"][0]) / 1e3 for n in range(lo, hi)
            if n in by and n + 1 in by and by[n]["prefill_tokens"] == 0 and by[n + 1]["prefill_tokens"] == 0]


def test_what_the_window_costs_each_step(client, capsys):
    """The same load, in async mode, alternately plain and inside a window, four times over (a shared box drifts:
    each pair is compared within itself); each step's period from the telemetry timeline. Reported, and bounded
    loosely (CPU, tiny-random, a shared CI box)."""
    client.post("/api/mode", json={"mode": "async"})
    ratios, plain_ms, profiled_ms, start_stop = [], [], [], []
    for _ in range(4):
        periods = {}
        for label in ("plain", "profiled"):
            first = client.get("/api/status").json()["steps"]
            if label == "profiled":
                assert client.post("/api/profile", json={"steps": 40}).status_code == 200
            generate(client, prompts=4, tokens=44)
            last = client.get("/api/status").json()["steps"] - 1
            if label == "profiled":
                s = wait_done(client)
                assert s["state"] == "done" and s["first_step"] >= first
                first, last = s["first_step"], s["last_step"]
                start_stop.append((s["start_ms"], s["stop_ms"]))
            periods[label] = statistics.median(_decode_periods(client.get("/api/timeline.json").json()["steps"],
                                                               first, last))
        plain_ms.append(periods["plain"])
        profiled_ms.append(periods["profiled"])
        ratios.append(periods["profiled"] / periods["plain"])
    ratio = statistics.median(ratios)
    with capsys.disabled():
        print(f"\n  decode step period, CPU tiny-random, 4 requests, median of 4 pairs: plain "
              f"{statistics.median(plain_ms):.2f} ms, inside a torch.profiler window "
              f"{statistics.median(profiled_ms):.2f} ms (x{ratio:.2f}; pairs x{min(ratios):.2f}-x{max(ratios):.2f});"
              f" starting the profiler held the engine {min(a for a, _ in start_stop)}-"
              f"{max(a for a, _ in start_stop)} ms, stopping it {min(b for _, b in start_stop)}-"
              f"{max(b for _, b in start_stop)} ms")
    assert 0.5 < ratio < 20


def test_serve_profiles_the_first_steps_after_start_up():
    assert cli_main(["serve", "--model", "tiny-random", "--device", "cpu", "--profile-steps", "0"]) == 2
    assert cli_main(["serve", "--model", "tiny-random", "--device", "cpu", "--profile-steps", "1001"]) == 2
    with serve_subprocess("--profile-steps", "3") as url:
        with httpx.Client(base_url=url, timeout=120) as c:
            # started before the first step (running while the engine waits for it), or about to be
            assert c.get("/api/profile").json()["state"] in ("pending", "running")
            generate(c, tokens=6)
            s = wait_done(c)
            assert s["state"] == "done" and (s["first_step"], s["last_step"]) == (0, 2)
            assert c.get(s["trace_url"]).status_code == 200
