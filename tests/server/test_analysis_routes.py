"""The page's analysis routes on the tiny model: the sources it can pick from, two of them compared step by step
(`batchscope compare --json`'s document), a what-if predicted on one (`batchscope whatif --json`'s), and that
what-if run for real on the server's own engine while nothing else may use it — each error in the API's one shape
with its status."""
from __future__ import annotations

import httpx
import pytest
from starlette.testclient import TestClient

from batchscope.app.loadtest.specs import Limits
from batchscope.app.server import create_app
from batchscope.app.server.state import AppState
from helpers import tiny_served, until

LIMITS = Limits(max_prompt_tokens=64, max_new_tokens=32, max_burst_requests=8, max_waiting_requests=64)
BURST = {"num_requests": 4, "prompt_tokens": [8, 8], "max_new_tokens": [24, 24], "seed": 1, "ignore_eos": True}


def burst(c: httpx.Client, spec: dict = BURST) -> dict:
    burst_id = c.post("/api/burst", json=spec).json()["burst_id"]
    return until(lambda: (s := c.get(f"/api/bursts/{burst_id}").json())["state"] != "running" and s)


def record(c: httpx.Client, name: str, spec: dict = BURST) -> None:
    assert c.post("/api/recording/start", json={"name": name}).status_code == 200
    assert burst(c, spec)["state"] == "done"
    assert c.post("/api/recording/stop").status_code == 200


@pytest.fixture(scope="module")
def live():
    with tiny_served(LIMITS, ui=False, num_blocks=128, max_batch_tokens=64) as (srv, state):
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            record(c, "base")
            record(c, "new")
            yield c, state


@pytest.fixture(scope="module")
def replay_only(live):
    c, _ = live
    recorded = c.get("/api/timeline.json", params={"recording": "base"}).json()
    with TestClient(create_app(AppState(replay=recorded), ui=False)) as client:
        yield client


def error(r, status: int, words: str) -> str:
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"} and words in r.json()["error"], r.text
    return r.json()["error"]


# ------------------------------------------------------------------------------------------------- sources
def test_the_sources_are_the_live_history_and_each_named_recording(live):
    c, _ = live
    sources = c.get("/api/recordings/sources").json()["sources"]
    assert [s["source"] for s in sources][:3] == ["live", "base", "new"]
    assert [s["kind"] for s in sources][:3] == ["live", "recording", "recording"]


def test_a_replay_only_server_offers_its_replay_and_no_live_history(replay_only):
    assert replay_only.get("/api/recordings/sources").json()["sources"] == [
        {"source": "replay", "kind": "replay", "label": "replay: tiny-random"}]


# ------------------------------------------------------------------------------------------------- compare
def test_the_live_history_compared_with_a_recording_gives_compare_json_with_a_verdict(live):
    c, _ = live
    out = c.post("/api/compare", json={"base": "base", "new": "live"}).json()
    assert out["schema"] == "batchscope.compare/1"
    assert out["verdict"] in ("same", "slower", "faster", "inconclusive")
    assert out["exit_code"] == 0 and out["fail_above_pct"] is None
    assert out["base"]["recordings"] == ["base"] and out["new"]["recordings"] == ["live"]
    bucket = out["buckets"][0]
    assert {"label", "base_steps", "new_steps", "base_step_ms", "new_step_ms", "ratio", "verdict"} <= set(bucket)
    # the typical step of each side: the one a viewer opens for the bucket, a step that recording holds
    typical = bucket["typical"]
    assert typical["base"]["recording"] == "base" and typical["new"]["recording"] == "live"
    steps = {s["step"] for s in c.get("/api/timeline.json", params={"recording": "base"}).json()["steps"]}
    assert typical["base"]["step"] in steps


def test_several_recordings_a_side_and_the_cli_options(live):
    c, _ = live
    out = c.post("/api/compare", json={"base": ["base"], "new": ["new", "base"], "min_effect_pct": 50,
                                       "fail_above_pct": 0}).json()
    assert out["noise"]["min_effect"] == 0.5 and out["noise"]["min_effect_source"] == "given"
    assert out["fail_above_pct"] == 0 and out["new"]["recordings"] == ["new", "base"]


@pytest.mark.parametrize("body, status, words", [
    ({"base": "no-such-recording", "new": "live"}, 404, "no recording named 'no-such-recording'"),
    ({"base": "bad name!", "new": "live"}, 400, "unknown source 'bad name!'"),
    ({"base": "", "new": "live"}, 400, "source must be"),
    ({"base": [], "new": "live"}, 400, "base: 1 to 8 sources"),
    ({"base": "base", "new": "replay"}, 404, "no replay loaded"),
    ({"base": "base"}, 400, "new"),
    ({"base": "base", "new": "new", "min_effect_pct": -1}, 400, "min_effect_pct"),
    ({"base": "base", "new": "new", "colour": "red"}, 400, "colour"),
])
def test_compare_says_what_is_wrong_with_its_body(live, body, status, words):
    error(live[0].post("/api/compare", json=body), status, words)


def test_on_a_replay_only_server_live_is_a_conflict_and_the_replay_a_source(replay_only):
    error(replay_only.post("/api/compare", json={"base": "replay", "new": "live"}), 409, "no model is loaded")
    out = replay_only.post("/api/compare", json={"base": "replay", "new": "replay"}).json()
    assert out["schema"] == "batchscope.compare/1" and out["verdict"] in ("same", "inconclusive")


# ------------------------------------------------------------------------------------------------- what-if
def test_a_what_if_on_the_live_history_predicts_the_recorded_mode(live):
    c, _ = live
    out = c.post("/api/whatif", json={"recording": "live", "set": {"max_batch_tokens": 32}, "runs": 1}).json()
    assert out["schema"] == "batchscope.whatif/1"
    assert list(out["modes"]) == ["async"] and out["settings"]["whatif"]["max_batch_tokens"] == 32
    entry = out["modes"]["async"]
    assert entry["recorded"]["requests"] >= 8
    assert entry["predicted"]["output_tokens_per_s"] > 0 and entry["predicted"]["interval"]["low"]
    keys = c.get("/api/whatif/keys").json()
    assert "max_batch_tokens" in keys["keys"] and "mode" in keys["verify_on_server"]


@pytest.mark.parametrize("body, status, words", [
    ({"recording": "base", "set": {"max_batch_tokens": 0}}, 400, "--set max_batch_tokens=0: must be an integer"),
    ({"recording": "base", "set": {"colour": 1}}, 400, "unknown setting 'colour'"),
    ({"recording": "base", "set": {"mode": "fast"}}, 400, "must be one of"),
    ({"recording": "base", "set": {"prompt_tokens": {"a": 1}}}, 400, "set.prompt_tokens"),
    ({"recording": "base", "runs": 9}, 400, "runs"),
    ({"recording": "nope"}, 404, "no recording named 'nope'"),
    ({"recording": "bad name!"}, 400, "unknown source"),
])
def test_a_what_if_says_what_is_wrong_in_whatifs_own_words(live, body, status, words):
    error(live[0].post("/api/whatif", json=body), status, words)


def test_a_what_if_of_live_on_a_replay_only_server_is_a_conflict(replay_only):
    error(replay_only.post("/api/whatif", json={"recording": "live"}), 409, "no model is loaded")
    error(replay_only.post("/api/whatif/verify", json={"recording": "replay"}), 409, "no model is loaded")


# ------------------------------------------------------------------------------------------------- verify
def test_a_setting_that_needs_a_restart_is_refused_with_the_cli_command(live):
    reason = error(live[0].post("/api/whatif/verify", json={"recording": "base", "set": {"max_running": 4}}),
                   409, "max_running=4 (this engine: 32)")
    assert "`batchscope whatif RECORDING.json --set max_running=4 --verify`" in reason
    assert "/api/timeline.json?recording=base&download=true" in reason


def test_an_unknown_verify_is_not_found(live):
    error(live[0].get("/api/whatif/verify/wv-nope"), 404, "no what-if verify with id 'wv-nope'")


def test_verify_runs_the_load_on_the_engine_holds_it_meanwhile_and_leaves_it_serving(live):
    c, state = live
    body = {"recording": "base", "set": {"mode": "sync", "rate": 2}, "runs": 1}
    started = c.post("/api/whatif/verify", json=body).json()
    job = started["verify_id"]
    assert started["state"] == "running"
    # while it runs the engine is its own: a second verify, an A/B and a mode switch are refused
    error(c.post("/api/whatif/verify", json=body), 409, "what-if verify")
    error(c.post("/api/ab", json=BURST), 409, "what-if verify")
    error(c.post("/api/mode", json={"mode": "async"}), 409, "what-if verify")
    status = until(lambda: (s := c.get(f"/api/whatif/verify/{job}").json())["state"] != "running" and s,
                   timeout=300)
    assert status["state"] == "done", status
    assert status["progress"] == {"done": 4, "total": 4}
    entry = status["result"]["modes"]["sync"]
    assert entry["measured"]["requests"] == 4 and entry["measured"]["output_tokens_per_s"] > 0
    assert entry["measured"]["mode"] == "sync" and entry["error_pct"]["output_tokens_per_s"] is not None
    assert set(entry["within_interval"]) >= {"output_tokens_per_s", "ttft_ms"}
    # the mode is back and the engine serves as before
    assert state.engine.mode == "async"
    assert burst(c)["state"] == "done"
    assert c.get("/api/mode").json()["locked"] is False


def test_a_verify_waits_for_a_running_burst(live):
    c, _ = live
    burst_id = c.post("/api/burst", json={**BURST, "max_new_tokens": [32, 32]}).json()["burst_id"]
    r = c.post("/api/whatif/verify", json={"recording": "base", "set": {"mode": "sync"}})
    until(lambda: c.get(f"/api/bursts/{burst_id}").json()["state"] != "running")
    if r.status_code == 200:            # the burst ended before the verify asked: then it ran; let it end
        job = r.json()["verify_id"]
        until(lambda: c.get(f"/api/whatif/verify/{job}").json()["state"] != "running", timeout=300)
        pytest.skip("the burst ended before the verify was asked for")
    error(r, 409, "burst(s) running")


def test_a_stopped_verify_gives_the_engine_back(live):
    c, state = live
    record(c, "spread", {**BURST, "arrival": "poisson", "rate": 20})
    # a hundredth of the recorded rate: the requests come seconds apart, and the stop comes between two
    body = {"recording": "spread", "set": {"mode": "sync", "rate": 0.01}, "runs": 1}
    job = c.post("/api/whatif/verify", json=body).json()["verify_id"]
    until(lambda: c.get(f"/api/whatif/verify/{job}").json()["phase"] == "running sync", timeout=300)
    stopped = c.post(f"/api/whatif/verify/{job}/stop").json()
    assert stopped["state"] == "stopped" and "cancelled: stopped" in stopped["error"]
    assert state.engine.mode == "async" and burst(c)["state"] == "done"
    error(c.post("/api/whatif/verify/wv-nope/stop"), 404, "no what-if verify")
