"""A real Prometheus (Debian's `prometheus` package, which `.ci/run` installs through `make test`) scrapes a live
batchscope every second; what it stored is read back through its HTTP API and held against batchscope's own figures.

Tolerances, and why:
- counters (GPU busy and idle seconds by cause, tokens, finished requests) after the load has stopped: equal to
  /api/status (1e-6 s: both read the same running totals; the status rounds to the µs) and to the timeline's
  summary (2e-6 s per cause: the summary adds the same per-step parts, each rounded to 0.1 µs);
- the 1-second busy ratio, each stored sample: within 0.005 of what the timeline says the collector could have
  counted. It ran at some moment of the scrape (Prometheus stores the scrape's start and duration) and counted
  the steps already handed to telemetry, which happens once a step is consumed: the test bounds that moment from
  the timeline's own host spans, so a loaded box that holds a thread (tens to hundreds of ms here) moves the
  bounds, not the verdict.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from batchscope.app.loadtest.specs import Limits
from batchscope.app.server import ServerThread, create_app
from batchscope.app.server.state import AppState
from batchscope.engine.config import EngineConfig
from batchscope.telemetry import IDLE_CAUSES
from batchscope.telemetry.summary import union_length
from helpers import free_port

pytestmark = pytest.mark.prometheus

PROMETHEUS = shutil.which("prometheus")
if PROMETHEUS is None:
    pytest.skip("Debian's prometheus package is not installed (make test installs it as root)",
                allow_module_level=True)

DOCS = Path(__file__).resolve().parents[2] / "docs"
TOKEN = "prometheus-scrapes-with-this"
MODEL = "tiny-random"
LIMITS = Limits(max_prompt_tokens=256, max_new_tokens=128, max_burst_requests=8, max_waiting_requests=64)


@pytest.fixture(scope="module")
def batchscope():
    state = AppState.load(EngineConfig(model=MODEL, device="cpu", dtype="float32", mode="async", num_blocks=256,
                                       max_batch_tokens=256, max_running=32), LIMITS)
    srv = ServerThread(create_app(state, token=TOKEN, ui=False)).start()
    yield srv
    srv.stop()
    state.close()


@pytest.fixture(scope="module")
def prometheus(batchscope, tmp_path_factory):
    """Prometheus scraping the server every second with its token; yields its API client."""
    tmp = tmp_path_factory.mktemp("prometheus")
    config = tmp / "prometheus.yml"
    config.write_text(f"""
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
scrape_configs:
  - job_name: batchscope
    metrics_path: /metrics
    authorization: {{credentials: {TOKEN}}}
    static_configs: [{{targets: ['127.0.0.1:{batchscope.port}']}}]
""")
    port = free_port()
    log = open(tmp / "prometheus.log", "w")
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"], stdout=log, stderr=subprocess.STDOUT)
    api = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
    try:
        wait_for(lambda: _get(api, "/-/ready") == 200, 60, "prometheus to be ready", tmp / "prometheus.log")
        wait_for(lambda: _target_up(api), 60, "the first good scrape", tmp / "prometheus.log")
        yield api
    finally:
        api.close()
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _get(api, path) -> int | None:
    try:
        return api.get(path).status_code
    except httpx.HTTPError:
        return None


def _target_up(api) -> bool:
    targets = api.get("/api/v1/targets").json()["data"]["activeTargets"]
    return bool(targets) and targets[0]["health"] == "up"


def wait_for(cond, timeout: float, what: str, log: Path | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}" + (f":\n{log.read_text()[-3000:]}" if log else ""))


def query(api, promql: str, at: float | None = None) -> list:
    params = {"query": promql} | ({"time": at} if at is not None else {})
    body = api.get("/api/v1/query", params=params).json()
    assert body["status"] == "success", (promql, body)
    return body["data"]["result"]


@pytest.fixture(scope="module")
def loaded(batchscope, prometheus):
    """Three seconds of work or more in each loop (async, sync, async), then quiet until Prometheus has scraped
    the final totals."""
    requests = 0
    with httpx.Client(base_url=batchscope.url, timeout=120, headers={"authorization": f"Bearer {TOKEN}"}) as c:
        for mode in ("async", "sync", "async"):
            assert c.post("/api/mode", json={"mode": mode}).status_code == 200
            t0 = time.monotonic()
            while time.monotonic() - t0 < 3.0:
                r = c.post("/v1/completions", json={"prompt": [[1500 + i, 1501, 1502] for i in range(4)],
                                                    "max_tokens": 50, "ignore_eos": True, "temperature": 0})
                assert r.status_code == 200, r.text
                requests += 4
        done = time.time()
        # two scrapes after the last step: the stored counters are final
        wait_for(lambda: _last_scrape(prometheus) > done + 1.5, 30, "two scrapes after the load")
        return {"status": c.get("/api/status").json(), "timeline": c.get("/api/timeline.json").json(),
                "requests": requests}


def _last_scrape(api) -> float:
    """The unix time of the latest scrape Prometheus stored."""
    result = query(api, 'timestamp(up{job="batchscope"})')
    return float(result[0]["value"][1]) if result else 0.0


def test_counters_prometheus_stored_agree_with_the_status_and_the_timeline(prometheus, loaded):
    totals = loaded["status"]["telemetry"]["totals"]
    summary, steps = loaded["timeline"]["summary"], loaded["timeline"]["steps"]
    idle = {r["metric"]["cause"]: float(r["value"][1])
            for r in query(prometheus, f'batchscope_gpu_idle_seconds_total{{model_name="{MODEL}"}}')}
    assert set(idle) == set(IDLE_CAUSES)
    for cause in IDLE_CAUSES:
        assert idle[cause] == pytest.approx(totals["idle_s_by_cause"][cause], abs=1e-6), cause
        assert idle[cause] == pytest.approx(summary["idle_us_by_cause"].get(cause, 0.0) / 1e6, abs=2e-6), cause
    assert sum(idle.values()) > 0
    (busy,) = query(prometheus, f'batchscope_gpu_busy_seconds_total{{model_name="{MODEL}",rank="0"}}')
    compute = sum(s["compute_us"][1] - s["compute_us"][0] for s in steps) / 1e6
    assert float(busy["value"][1]) == pytest.approx(totals["busy_s"]["0"], abs=1e-6)
    assert float(busy["value"][1]) == pytest.approx(compute, rel=1e-6)
    (gen,) = query(prometheus, f'vllm:generation_tokens_total{{model_name="{MODEL}"}}')
    requests = loaded["requests"]
    assert float(gen["value"][1]) == totals["generation_tokens"] == summary["tokens_out"] == requests * 50
    (ok,) = query(prometheus, f'vllm:request_success_total{{model_name="{MODEL}",finished_reason="length"}}')
    assert float(ok["value"][1]) == requests == summary["requests_finished"]
    (switches,) = query(prometheus, "batchscope_mode_switches_total")
    assert float(switches["value"][1]) == totals["mode_switches"] == 2


def _delivery_bounds(steps: list) -> list[tuple[list, float, float]]:
    """(compute span, earliest, latest delivery) per step. A step reaches telemetry once consumed: not before its
    update span ends, and, the host being one thread that hands a step over before it consumes the next, not after
    the next step's wait begins (loop.py: sync flushes N after launching N+1, async after consuming N)."""
    steps = sorted((s for s in steps if s.get("compute_us") and "update" in s["cpu"]), key=lambda s: s["step"])
    out = []
    for a, b in zip(steps, steps[1:] + [None]):
        latest = b["cpu"]["wait"][0] if b is not None and b["step"] == a["step"] + 1 and "wait" in b["cpu"] else 1e18
        out.append((a["compute_us"], a["cpu"]["update"][1], latest))
    return out


def test_the_busy_ratio_it_stored_is_the_timelines(prometheus, loaded, capsys):
    """Every stored sample of the 1-second busy ratio against the timeline's compute spans, within 0.005. The
    collector ran at some moment `t` inside the scrape (Prometheus stores the scrape's start and its duration) and
    counted the steps delivered by then over [t - 1 s, t]: at least those surely delivered (the next step's wait had
    begun), at most those that could have been (their update had ended). This holds however loaded the box: a
    thread held by the OS delays the record and the scrape alike, and the bounds allow for both."""
    origin = loaded["timeline"]["meta"]["origin"]["unix_s"]
    bounds = _delivery_bounds(loaded["timeline"]["steps"])
    (series,) = query(prometheus, 'batchscope_gpu_busy_ratio{window="1s",rank="0"}[10m]')
    (durations,) = query(prometheus, 'scrape_duration_seconds{job="batchscope"}[10m]')
    took = {ts: float(v) for ts, v in durations["values"]}

    def ratio(t: float, by: int) -> float:       # by 1: steps that could have been delivered by t; 2: surely were
        return union_length([c for c, *when in bounds if when[by - 1] <= t], t - 1e6, t) / 1e6

    errors, busy_seen = [], 0
    for ts, v in series["values"]:
        start = (float(ts) - origin) * 1e6
        moments = [start + took[ts] * 1e6 * k / 20 for k in range(21)]
        lo, hi = min(ratio(t, 2) for t in moments), max(ratio(t, 1) for t in moments)
        v = float(v)
        errors.append(max(0.0, lo - v, v - hi))
        busy_seen += v > 0.2
    assert busy_seen >= 3, "too few samples were taken while the engine worked"
    with capsys.disabled():
        print(f"\n  {len(errors)} stored busy-ratio samples ({busy_seen} while busy), scrapes took "
              f"{max(took.values()) * 1e3:.0f} ms at most: outside the timeline's bounds by {max(errors):.5f} "
              f"at most")
    assert max(errors) < 0.005, errors


def test_a_vllm_dashboard_query_finds_batchscope(prometheus, loaded):
    names = prometheus.get("/api/v1/label/__name__/values").json()["data"]
    assert "vllm:num_requests_running" in names and "vllm:e2e_request_latency_seconds_bucket" in names
    assert not any(n.startswith("vllm_") for n in names)         # the colons survived the scrape
    assert query(prometheus, f'vllm:num_requests_running{{model_name="{MODEL}"}}')
    p99 = query(prometheus, f'histogram_quantile(0.99, sum by(le) (rate(vllm:e2e_request_latency_seconds_bucket'
                            f'{{model_name="{MODEL}"}}[1m])))')
    assert p99 and float(p99[0]["value"][1]) > 0


def test_every_query_of_the_shipped_dashboard_runs(prometheus, loaded):
    """docs/grafana-batchscope.json: each panel's PromQL, with Grafana's variables filled in, is valid against
    this Prometheus and finds data (the floor and NVML panels excepted: not measured on a CPU)."""
    dashboard = json.loads((DOCS / "grafana-batchscope.json").read_text())
    exprs = [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 20
    empty = []
    for title, expr in exprs:
        promql = expr.replace("$model_name", MODEL).replace("$__rate_interval", "1m").replace("$__range", "5m")
        if not query(prometheus, promql):
            empty.append(title)
    assert set(empty) <= {"Decode step against its floor", "NVML utilization beside event busy",
                          "Preemptions"}, empty
