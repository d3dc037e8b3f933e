"""Continuous load and the A/B's mode lock, through the live server on a tiny random model on the CPU.

A presenter's story: start a load that runs until stopped, switch sync/async under it as often as they like
(nothing lost), stop it; a load nobody stops ends at its bounds; an A/B holds the mode toggle until it ends and
says in its result whether the mode moved under it.
"""
import time

import httpx
import pytest

from batchscope.app.loadtest.arrivals import request_stream
from batchscope.app.loadtest.specs import Limits, LoadSpec
from batchscope.app.server import ServerThread, create_app
from batchscope.app.server.state import AppState
from batchscope.engine.config import EngineConfig
from helpers import until

LIMITS = Limits(max_prompt_tokens=256, max_new_tokens=256, max_burst_requests=32, max_concurrent_bursts=2,
                max_waiting_requests=64, max_load_duration_s=60, max_load_requests=500, max_load_concurrency=16)
SHORT = {"prompt_tokens": [8, 16], "max_new_tokens": [8, 16]}


def tiny_state() -> AppState:
    return AppState.load(EngineConfig(model="tiny-random", device="cpu", dtype="float32", mode="async",
                                      num_blocks=256, max_batch_tokens=256, max_running=32), LIMITS)


@pytest.fixture(scope="module")
def served():
    state = tiny_state()
    srv = ServerThread(create_app(state, ui=False)).start()
    yield srv, state
    srv.stop()
    state.close()


@pytest.fixture(scope="module")
def client(served):
    with httpx.Client(base_url=served[0].url, timeout=60) as c:
        yield c


@pytest.fixture(autouse=True)
def nothing_left_running(client):
    yield
    # a failed test must not leave a load holding the engine for the next one
    for _ in range(100):
        if client.get("/api/status").json()["loads_running"] == 0:
            break
        time.sleep(0.1)



def load(client, load_id: str) -> dict:
    r = client.get(f"/api/load/{load_id}")
    assert r.status_code == 200, r.text
    return r.json()


def ended(client, load_id: str, timeout=60.0) -> dict:
    return until(lambda: (d := load(client, load_id))["state"] != "running" and d, timeout)


def start(client, **body) -> str:
    r = client.post("/api/load", json=body)
    assert r.status_code == 200, r.text
    return r.json()["load_id"]


# ------------------------------------------------------------------------------------------- continuous load

def test_a_load_runs_until_stopped_on_request(client):
    lid = start(client, kind="concurrency", concurrency=4, **SHORT)
    d = until(lambda: (d := load(client, lid))["completed"] >= 10 and d)
    assert d["state"] == "running" and d["stop_reason"] is None
    assert 0 < d["in_flight"] <= 4 and d["sent"] >= d["completed"] + d["in_flight"]
    assert d["recent"]["output_tokens_per_s"] > 0 and d["recent"]["ttft_ms_p50"] > 0
    # its bounds are stated: the server's limits, since the caller named none
    assert d["spec"]["duration_s"] == LIMITS.max_load_duration_s and d["spec"]["max_requests"] == 500
    assert 0 < d["remaining_s"] <= LIMITS.max_load_duration_s
    assert client.get("/api/status").json()["loads_running"] == 1

    r = client.post(f"/api/load/{lid}/stop")
    assert r.status_code == 200
    d = r.json()                                    # the stop waits for it to wind down
    assert d["state"] == "done" and d["stop_reason"] == "stopped" and d["in_flight"] == 0
    assert d["completed"] + d["cancelled"] + d["failed"] == d["sent"] and d["failed"] == 0
    assert d["results"]["completed"] == d["completed"] and d["results"]["ttft_ms"]["p50"] > 0
    # stopped means stopped: nothing more is sent, and the engine empties
    time.sleep(0.3)
    assert load(client, lid)["sent"] == d["sent"]
    until(lambda: client.get("/api/status").json()["running"] == 0, timeout=10)
    assert client.get("/api/status").json()["loads_running"] == 0
    # stopping it again is harmless
    assert client.post(f"/api/load/{lid}/stop").json()["stop_reason"] == "stopped"


def test_a_rate_load_sends_steadily(client):
    lid = start(client, kind="rate", rate=20, arrival="constant", prompt_tokens=8, max_new_tokens=4)
    until(lambda: load(client, lid)["elapsed_s"] >= 1.0)
    d = client.post(f"/api/load/{lid}/stop").json()
    due = 1 + int(d["elapsed_s"] * 20)
    assert due - 5 <= d["sent"] <= due and d["skipped"] == 0
    assert d["spec"]["kind"] == "rate" and d["completed"] > 0


def test_a_load_nobody_stops_ends_at_its_time_bound(client):
    lid = start(client, concurrency=2, duration_s=1.0, **SHORT)
    d = ended(client, lid, timeout=15)
    assert d["state"] == "done" and d["stop_reason"] == "duration"
    assert 1.0 <= d["elapsed_s"] < 5 and d["remaining_s"] == 0 and d["in_flight"] == 0


def test_a_load_ends_at_its_request_bound_with_every_request_finished(client):
    lid = start(client, concurrency=3, max_requests=6, **SHORT)
    d = ended(client, lid)
    assert d["stop_reason"] == "max_requests"
    assert d["sent"] == d["completed"] == 6 and d["cancelled"] == d["failed"] == 0


def test_a_load_survives_mode_toggles_and_loses_nothing(client, served):
    client.post("/api/mode", json={"mode": "async"})
    lid = start(client, concurrency=6, max_requests=60, prompt_tokens=[8, 24], max_new_tokens=[6, 14],
                ignore_eos=True, seed=7)
    switched = []
    for mode in ("sync", "async", "sync", "async", "sync", "async"):
        until(lambda: load(client, lid)["completed"] >= 4 * (len(switched) + 1) or
              load(client, lid)["state"] != "running")
        r = client.post("/api/mode", json={"mode": mode})
        assert r.status_code == 200, r.text          # a load does not lock the toggle
        if load(client, lid)["state"] == "running":
            switched.append(mode)
    d = ended(client, lid)
    assert len(switched) >= 3, "the load ended before the switches: make it longer"
    # every request it sent came back whole: exactly the tokens its seeded plan asked for
    assert d["stop_reason"] == "max_requests" and d["failed"] == d["cancelled"] == 0
    assert d["sent"] == d["completed"] == 60
    plan = [p for p, _ in zip(request_stream(LoadSpec(**d["spec"]), served[1].vocab_size), range(60))]
    assert d["output_tokens"] == sum(p.max_new_tokens for p in plan)
    # and it says which switches it went through
    assert [c["mode"] for c in d["mode_changes"]][:len(switched)] == switched
    assert d["results"]["mode"] is None


@pytest.mark.parametrize("body, reason", [
    ({"kind": "forever"}, "kind must be"),
    ({"kind": "rate", "rate": -3}, "rate"),
    ({"concurrency": 0}, "concurrency"),
    ({"concurrency": 17}, "over the limit of 16"),
    ({"duration_s": 61}, "over the limit of 60"),
    ({"duration_s": -1}, "duration_s"),
    ({"max_requests": 501}, "over the limit of 500"),
    ({"max_new_tokens": [9, 3]}, "greater than max"),
    ({"max_new_tokens": 300}, "over the limit"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"forever": True}, "forever"),
])
def test_bad_load_input_is_a_400_with_a_reason(client, body, reason):
    r = client.post("/api/load", json=body)
    assert r.status_code == 400 and reason in r.json()["error"], r.text
    assert client.get("/api/status").json()["loads_running"] == 0


def test_loads_refused_when_busy_and_unknown_ids_are_404(client):
    for r in (client.get("/api/load/load-nope"), client.post("/api/load/load-nope/stop")):
        assert r.status_code == 404 and "load-nope" in r.json()["error"]
    lid = start(client, concurrency=2, **SHORT)
    r = client.post("/api/load", json={"concurrency": 1})
    assert r.status_code == 429 and "already running" in r.json()["error"]
    r = client.post("/api/ab", json={"num_requests": 2})
    assert r.status_code == 429 and "stop it first" in r.json()["error"]
    client.post(f"/api/load/{lid}/stop")
    lid = start(client, concurrency=1, **SHORT)     # one after another is fine
    client.post(f"/api/load/{lid}/stop")


# --------------------------------------------------------------------------------------------- the A/B lock

AB_BODY = {"num_requests": 12, "prompt_tokens": 16, "max_new_tokens": 160, "seed": 3}


def test_the_mode_is_locked_during_an_ab_and_free_after(client):
    assert client.post("/api/mode", json={"mode": "async"}).status_code == 200
    ab = client.post("/api/ab", json=AB_BODY).json()["ab_id"]
    # locked from the moment it is accepted
    r = client.post("/api/mode", json={"mode": "sync"})
    assert r.status_code == 409 and "A/B" in r.json()["error"] and ab in r.json()["error"]
    lock = client.get("/api/mode").json()
    assert lock["locked"] is True and ab in lock["reason"]
    assert client.get("/api/status").json()["mode_lock"] == lock["reason"]
    # a load cannot start under it either
    assert client.post("/api/load", json={"concurrency": 1}).status_code == 429
    d = until(lambda: (d := client.get(f"/api/ab/{ab}").json())["state"] != "running" and d, timeout=120)
    assert d["state"] == "done", d["error"]
    assert d["valid"] is True and d["mode_changes"] == []
    assert d["requests_per_half"] == 12 and d["half_done"] == 12 and d["total"] == 24
    # the lock goes with it, and the mode it found is back
    assert client.get("/api/mode").json() == {"mode": "async", "locked": False, "reason": None}
    r = client.post("/api/mode", json={"mode": "sync"})
    assert r.status_code == 200 and r.json() == {"mode": "sync", "previous": "async"}
    client.post("/api/mode", json={"mode": "async"})


def test_an_ab_says_it_is_spoiled_when_the_mode_moved_under_it(client, served):
    engine = served[1].engine
    ab = client.post("/api/ab", json=AB_BODY).json()["ab_id"]
    until(lambda: client.get(f"/api/ab/{ab}").json()["phase"] == "sync", timeout=60, every=0.01)
    time.sleep(0.2)                     # its requests are streaming (they all finish together, at its end)
    engine.set_mode("async")            # behind the server's back (a script holding the engine): nothing refuses it
    assert client.get(f"/api/ab/{ab}").json()["phase"] == "sync", "the sync half ended first: make it longer"
    d = until(lambda: (d := client.get(f"/api/ab/{ab}").json())["state"] != "running" and d, timeout=120)
    assert d["valid"] is False
    assert [(c["phase"], c["mode"]) for c in d["mode_changes"]] == [("sync", "async")]


def test_shutdown_stops_a_load_at_once():
    state = tiny_state()
    try:
        lid = state.load_lab.start_load(LoadSpec(concurrency=4, prompt_tokens=8, max_new_tokens=200))
        until(lambda: state.load_lab.load(lid).in_flight == 4)
        t0 = time.monotonic()
        state.begin_shutdown()          # what SIGTERM runs (server.chain_shutdown_signals)
        d = until(lambda: (d := state.load_lab.load(lid)).state != "running" and d, timeout=10)
        assert time.monotonic() - t0 < 5
        assert d.stop_reason == "shutdown" and d.in_flight == 0 and d.cancelled == 4
    finally:
        state.close()
