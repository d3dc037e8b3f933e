"""Sweeps through the live server on a tiny random model on the CPU: the routes, their refusals, the export, the
foreign-report upload, and `batchscope sweep` against the server (tiny durations throughout).

A user's story: start a sweep, find everything else refused and the mode locked while it runs, read its progress,
download it as JSON and CSV; give it bad input and get a reason while the engine keeps serving; stop one half way
and lose nothing; run the same from the command line, with a GuideLLM report carried beside it.
"""
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import jsonschema
import pytest

from batchscope.app.cli import main as cli_main
from batchscope.app.loadtest.specs import Limits
from helpers import tiny_served, until
from test_server_limits import raw_request, read_response

LIMITS = Limits(max_prompt_tokens=256, max_new_tokens=256, max_load_concurrency=8, max_load_duration_s=60,
                max_load_requests=400, max_sweep_points=4, max_sweep_rate=200)
SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "sweep.schema.json").read_text())
FIXTURES = Path(__file__).parents[1] / "fixtures"
TINY = {"points": 1, "duration_s": 0.4, "prompt_tokens": 8, "max_new_tokens": 8, "seed": 1}


@pytest.fixture(scope="module")
def served():
    with tiny_served(LIMITS, ui=False, num_blocks=256, max_batch_tokens=256) as pair:
        yield pair


@pytest.fixture(scope="module")
def client(served):
    with httpx.Client(base_url=served[0].url, timeout=60) as c:
        yield c



def ended(client, sweep_id: str) -> dict:
    return until(lambda: (d := client.get(f"/api/sweep/{sweep_id}").json())["state"] != "running" and d)


def still_serving(client) -> None:
    r = client.post("/api/generate", json={"prompt": [1500, 1501], "max_new_tokens": 3, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["output_tokens"] == 3


@pytest.fixture(autouse=True)
def nothing_left_running(client):
    yield
    for _ in range(200):
        st = client.get("/api/status").json()
        if not st["bursts"]["sweep_running"] and st["loads_running"] == 0:
            break
        time.sleep(0.1)


# ---------------------------------------------------------------------------------------------- the routes

def test_a_sweep_through_the_routes(client):
    r = client.post("/api/sweep", json=TINY)
    assert r.status_code == 200, r.text
    sid, total = r.json()["sweep_id"], r.json()["points_total"]
    # no SLO given: TTFT and ITL will be the model's own, from the first synchronous run
    assert total == 6 and r.json()["spec"]["slo_from_sync"] == ["itl_ms", "ttft_ms"]
    # it has the engine to itself: everything else is a conflict, with the reason
    for path, body in (("/api/sweep", TINY), ("/api/burst", {"num_requests": 1}), ("/api/ab", {"num_requests": 1}),
                       ("/api/load", {"concurrency": 1}), ("/api/mode", {"mode": "sync"})):
        r = client.post(path, json=body)
        assert r.status_code == 409 and sid in r.json()["error"], (path, r.text)
    lock = client.get("/api/mode").json()
    assert lock["locked"] and "sweep" in lock["reason"]
    d = until(lambda: (d := client.get(f"/api/sweep/{sid}").json())["current"] and d)
    assert d["schema"] == "batchscope.sweep/1" and d["state"] == "running" and d["points_total"] == total
    assert d["current"]["mode"] == "sync" and d["mode"] == "sync"
    still_serving(client)                           # other requests are still served meanwhile
    d = ended(client, sid)
    assert d["state"] == "done" and d["error"] is None and d["points_done"] == total and d["current"] is None
    for mode in ("sync", "async"):
        pts = d["modes"][mode]["points"]
        assert [p["kind"] for p in pts] == ["synchronous", "throughput", "constant"]
        assert all(p["completed"] > 0 and p["busy_pct"] is not None and p["ms_per_step"] for p in pts)
        assert all(p["sent"] == p["completed"] + p["failed"] + p["cancelled"] for p in pts)
        assert all(p["window_us"][0] < p["window_us"][1] for p in pts)
    assert client.get("/api/mode").json() == {"mode": "async", "locked": False, "reason": None}
    # the SLOs every point was judged by are 3x and 2x the synchronous run's p99s, rounded up, and say so
    sync = d["modes"]["sync"]["points"][0]
    derived = d["slo_derived"]
    assert derived["mode"] == "sync" and derived["index"] == 0
    assert derived["ttft_ms"]["from_p99_ms"] == pytest.approx(sync["ttft_ms"]["p99"], abs=1e-3)
    assert derived["itl_ms"]["from_p99_ms"] == pytest.approx(sync["tpot_ms"]["p99"], abs=1e-3)
    for key, factor in (("ttft_ms", 3), ("itl_ms", 2)):
        assert derived[key]["factor"] == factor and d["slo"][key] == derived[key]["slo_ms"]
        assert factor * derived[key]["from_p99_ms"] <= d["slo"][key] <= 1.1 * factor * derived[key]["from_p99_ms"]
    assert d["modes"]["sync"]["summary"]["slo_max"] is not None or d["modes"]["sync"]["summary"]["slo_none_why"]

    doc = client.get(f"/api/sweep/{sid}.json").json()
    jsonschema.validate(doc, SCHEMA)
    assert doc["slo_derived"] == derived and doc["slo"] == d["slo"]
    assert doc["meta"]["model"] == "tiny-random" and doc["spec"]["seed"] == 1
    assert len(doc["modes"]["async"]["distributions"]) == 3
    first = doc["modes"]["sync"]["distributions"][0]
    assert first["ttft_ms"] and len(first["request_id"]) == len(first["ttft_ms"])
    # each value leads to the request's own record in the timeline (and so to the steps it lived through)
    recorded = {r["id"] for r in client.get("/api/timeline.json").json()["requests"]}
    assert set(first["request_id"]) <= recorded
    assert first["itl_ms"] and len(first["itl_request_id"]) == len(first["itl_ms"])
    assert set(first["itl_request_id"]) <= set(first["request_id"])     # each gap is one of the point's requests'
    r = client.get(f"/api/sweep/{sid}.csv", params={"download": 1})
    assert r.headers["content-type"].startswith("text/csv") and "attachment" in r.headers["content-disposition"]
    assert len(r.text.splitlines()) == 1 + total and r.text.startswith("source,series,index,kind,offered_rate")
    assert sid in [s["id"] for s in client.get("/api/sweeps").json()["sweeps"]]


@pytest.mark.parametrize("body, reason", [
    ({"rates": [0]}, "rates.0"),
    ({"rates": [-2, 4]}, "rates.0"),
    ({"points": 0}, "points"),
    ({"slo": {"ttft_ms": 0}}, "slo.ttft_ms"),
    ({"slo": {"itl_ms": 0}}, "slo.itl_ms"),
    ({"rates": [201]}, "over the limit of 200"),
    ({"rates": [100], "duration_s": 5}, "500 requests, over the limit of 400"),
    ({"points": 5}, "over the limit of 4"),
    ({"duration_s": 61}, "over the limit of 60"),
    ({"max_concurrency": 9}, "over the limit of 8"),
    ({"modes": ["sync", "turbo"]}, "modes.1 must be"),
    ({"speed": "max"}, "speed"),
])
def test_bad_sweeps_are_a_400_with_a_reason_and_the_engine_keeps_serving(client, body, reason):
    r = client.post("/api/sweep", json=body)
    assert r.status_code == 400 and reason in r.json()["error"], r.text
    assert not client.get("/api/status").json()["bursts"]["sweep_running"]
    still_serving(client)


def test_unknown_sweeps_are_404(client):
    for r in (client.get("/api/sweep/sweep-nope"), client.post("/api/sweep/sweep-nope/stop"),
              client.get("/api/sweep/sweep-nope.json"), client.get("/api/sweep/sweep-nope.csv"),
              client.get("/api/sweep/imports/import-nope")):
        assert r.status_code == 404 and "nope" in r.json()["error"]


def test_a_stopped_sweep_keeps_its_points_and_loses_nothing(client):
    sid = client.post("/api/sweep", json={**TINY, "duration_s": 30, "max_new_tokens": 200}).json()["sweep_id"]
    until(lambda: (c := client.get(f"/api/sweep/{sid}").json()["current"]) and c["in_flight"])
    d = client.post(f"/api/sweep/{sid}/stop").json()        # waits for it to wind down
    assert d["state"] == "done" and d["stop_reason"] == "stopped"
    (p,) = d["modes"]["sync"]["points"]
    assert p["complete"] is False and p["sent"] == p["completed"] + p["failed"] + p["cancelled"]
    assert p["cancelled"] >= 1
    until(lambda: client.get("/api/status").json()["running"] == 0, timeout=10)
    assert client.get("/api/mode").json()["locked"] is False
    jsonschema.validate(client.get(f"/api/sweep/{sid}.json").json(), SCHEMA)
    still_serving(client)


def test_a_sweep_waits_for_nothing_else(client):
    lid = client.post("/api/load", json={"concurrency": 1, "prompt_tokens": 8, "max_new_tokens": 8}).json()["load_id"]
    r = client.post("/api/sweep", json=TINY)
    assert r.status_code == 409 and lid in r.json()["error"]
    client.post(f"/api/load/{lid}/stop")


# ------------------------------------------------------------------------------------------ foreign reports

def test_a_foreign_report_is_uploaded_and_kept(client):
    r = client.post("/api/sweep/import", content=(FIXTURES / "guidellm-0.8-sweep.json").read_bytes(),
                    params={"slo_ttft_ms": 100})
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["tool"] == "guidellm" and d["series"] == {"GuideLLM 0.8.1 · smollm2": 3}
    rep = client.get(f"/api/sweep/imports/{d['import_id']}").json()
    (curve,) = rep["modes"].values()
    assert [p["slo_attainment"] for p in curve["points"]] == [1.0, 0.0, 1.0]
    assert d["import_id"] in [i["id"] for i in client.get("/api/sweeps").json()["imports"]]
    r = client.post("/api/sweep/import", content=(FIXTURES / "vllm-serve-appended.jsonl").read_bytes())
    assert r.status_code == 200 and r.json()["tool"] == "vllm bench serve"


@pytest.mark.parametrize("content, params, reason", [
    (b"", {}, "send a GuideLLM"),
    (b'{"benchmarks": [{"config": {}}]}', {}, "no args.strategy"),
    (b'{"metadata": {"version": 2}, "benchmarks": []}', {}, "no 'config'"),
    (b'{"hello": "world"}', {}, "not a GuideLLM report"),
    (b"[" * 100 + b"]" * 100, {}, "nested 100 levels deep"),
    (b'{"request_throughput": 1}', {}, "missing duration, completed"),
    (b'{"schema": "batchscope.sweep/1"}', {"slo_ttft_ms": 0}, "ttft_ms"),
])
def test_a_bad_report_is_a_400_with_a_reason(client, content, params, reason):
    r = client.post("/api/sweep/import", content=content, params=params)
    assert r.status_code == 400 and reason in r.json()["error"], r.text
    still_serving(client)


def test_a_report_over_the_upload_limit_is_413_from_its_content_length(served, client):
    sock = raw_request(served[0].url, f"POST /api/sweep/import HTTP/1.1\r\nHost: x\r\nContent-Type: "
                                      f"application/json\r\nContent-Length: {80 << 20}\r\n\r\n")
    try:
        status, body = read_response(sock)
    finally:
        sock.close()
    assert status == 413 and "64 MiB" in body["error"]


# ------------------------------------------------------------------------------------------------ the CLI

def test_the_cli_runs_a_sweep_and_writes_the_contract_file(served, tmp_path):
    out, csv = tmp_path / "sweep.json", tmp_path / "sweep.csv"
    args = ["sweep", "--url", served[0].url, "--modes", "sync,async", "--points", "1", "--duration", "0.3",
            "--slo-ttft-ms", "2000", "--slo-itl-ms", "200", "--prompt-tokens", "8", "--output-tokens", "8",
            "--compare", str(FIXTURES / "vllm-serve-detailed.json"), "--csv", str(csv), "--out", str(out)]
    # in a process of its own, to see what it imports: an HTTP client needs no torch
    script = ("import sys; from batchscope.app.cli import main; rc = main(sys.argv[1:]); "
              "assert 'torch' not in sys.modules, 'torch was imported'; sys.exit(rc)")
    proc = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "meets the SLOs" in proc.stderr and f"wrote {out}" in proc.stderr
    doc = json.loads(out.read_text())
    jsonschema.validate(doc, SCHEMA)
    assert doc["schema"] == "batchscope.sweep/1" and list(doc["modes"]) == ["sync", "async"]
    assert doc["slo"] == {"ttft_ms": 2000.0, "itl_ms": 200.0, "e2e_ms": None, "target": 0.99}
    for curve in doc["modes"].values():
        pts = curve["points"]
        assert [p["kind"] for p in pts] == ["synchronous", "throughput", "constant"]
        assert [p["offered_rate"] is None for p in pts] == [True, True, False]
        for p in pts:
            assert set(p) >= {"offered_rate", "kind", "requests_per_s", "output_tokens_per_s", "ttft_ms", "itl_ms",
                              "e2e_ms", "slo_attainment", "goodput_rps"}
            assert set(p["ttft_ms"]) >= {"p50", "p90", "p99"} and 0 <= p["slo_attainment"] <= 1
    (foreign,) = doc["foreign"]
    assert foreign["tool"] == "vllm bench serve" and foreign["source"] == "vllm-serve-detailed.json"
    assert foreign["modes"]["bs"]["points"][0]["slo_attainment"] == 1.0
    rows = csv.read_text().splitlines()
    assert len(rows) == 1 + 6 + 1 and rows[-1].startswith("bs,bs,0,poisson")


@pytest.mark.parametrize("extra, reason", [
    (["--points", "0"], "400 points"),
    (["--slo-ttft-ms", "0"], "400 slo.ttft_ms"),
    (["--rates", "2,-1"], "400 rates.1"),
    (["--rates", "two"], "--rates takes numbers"),
    (["--prompt-tokens", "8,9,10"], "--prompt-tokens takes N or MIN,MAX"),
    (["--compare", str(FIXTURES / "guidellm-0.8-sweep.json") + ".missing"], "cannot read"),
])
def test_the_cli_says_why_it_cannot_sweep(served, tmp_path, capsys, extra, reason):
    out = tmp_path / "s.json"
    rc = cli_main(["sweep", "--url", served[0].url, "--out", str(out), "--duration", "0.2", *extra])
    assert rc == 2 and reason in capsys.readouterr().err
    assert not out.exists()


def test_the_cli_refuses_a_report_that_is_not_what_it_claims(served, tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"metadata": {"version": 2}, "benchmarks": [{}]}')
    rc = cli_main(["sweep", "--url", served[0].url, "--out", str(tmp_path / "s.json"), "--compare", str(bad)])
    assert rc == 2 and "no 'config'" in capsys.readouterr().err
    rc = cli_main(["sweep", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "s.json")])
    assert rc == 2 and "cannot reach" in capsys.readouterr().err


# ------------------------------------------------------------------------------------------ a quick sweep

QUICK_LIMITS = LIMITS.model_copy(update={"max_load_concurrency": 256, "max_new_tokens": 512,
                                         "max_load_requests": 4000, "max_sweep_rate": 2000})


def test_a_quick_sweep_is_quick_its_throughput_run_queues_no_more_than_the_point_can_finish():
    """1 s a point, long outputs, 256 allowed in flight on an engine that runs 32 at once: the throughput run used
    to queue all 256 and take 10-20 s to drain its second. Now it keeps in flight what the engine finishes within
    its latency budget (half a point, or twice an unloaded request's latency if longer), so every point lasts
    about its second plus that budget (the bounds below are generous guards for a busy machine)."""
    spec = {"modes": ["async"], "points": 2, "duration_s": 1.0, "prompt_tokens": 8, "max_new_tokens": 256,
            "ignore_eos": True, "seed": 3}
    with tiny_served(QUICK_LIMITS, ui=False, num_blocks=4096, max_batch_tokens=512) as (srv, _):
        with httpx.Client(base_url=srv.url, timeout=60) as c:
            r = c.post("/api/sweep", json=spec)
            assert r.status_code == 200, r.text
            d = ended(c, r.json()["sweep_id"])
    assert d["state"] == "done", d["error"]
    pts = d["modes"]["async"]["points"]
    assert [p["kind"] for p in pts] == ["synchronous", "throughput", "constant", "constant"]
    top = pts[1]
    assert top["completed"] > 0 and top["cancelled"] == 0
    assert 1 <= top["concurrency"] < 256          # the most it had in flight: what the engine could finish
    budget = max(0.5, 2 / pts[0]["requests_per_s"])
    assert top["duration_s"] < 2 + 2 * budget, (top["duration_s"], budget)
    assert d["elapsed_s"] < 60, d["elapsed_s"]
