"""`batchscope bench --workload served` on CPU with the tiny model: the same planned requests in every mode, every
figure present and consistent, the step split, bad options refused, and the timeline analysis script. No
assertion here is about speed."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from batchscope.app.bench import steps
from batchscope.app.bench import summary_table as report
from batchscope.app.bench import command as bench
from batchscope.app.bench.flags import settle_workload
from batchscope.app.bench.served.workload import plan_requests, requests_digest
from batchscope.app.bench.served.client_figures import medians
from batchscope.telemetry import validate_timeline

ROOT = Path(__file__).resolve().parents[2]
N, PROMPTS, NEW = 8, (8, 40), (3, 10)
ARGS = ["--workload", "served", "--model", "tiny-random", "--device", "cpu", "--requests", str(N),
        "--prompt-tokens", "%d:%d" % PROMPTS, "--new-tokens", "%d:%d" % NEW, "--rate", "60", "--seed", "11",
        "--max-running", "4", "--warmup-tokens", "2", "--bandwidth-mib", "8", "--no-progress"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    out = tmp_path_factory.mktemp("served") / "s.json"
    rc = bench.main(ARGS + ["--baseline", "transformers", "--out", str(out)])
    return rc, out, json.loads(out.read_text())


def _ours(result):
    return [r for r in result["runs"] if r["system"] == "batchscope"]


def test_every_planned_run_ran_and_agrees_on_tokens(served):
    rc, _, result = served
    assert rc == 0
    assert result["schema"] == "batchscope.bench.served/1"
    assert result["order"] == ["sync", "async", "transformers-sync"]
    assert [r["label"] for r in result["runs"]] == result["order"]
    assert "transformers-async" in result["skipped"]                # it needs CUDA
    assert [r["tokens_agree_with_first_run"] for r in result["runs"]] == [1.0, 1.0, 1.0]
    assert set(result["results"]) == set(result["order"])


def test_the_same_requests_go_to_every_mode(served):
    _, _, result = served
    w, plan = result["workload"], result["plan"]
    assert [p["index"] for p in plan] == list(range(N))
    assert plan[0]["offset_s"] == 0 and all(a["offset_s"] <= b["offset_s"] for a, b in zip(plan, plan[1:]))
    assert all(PROMPTS[0] <= p["prompt_tokens"] <= PROMPTS[1] and NEW[0] <= p["new_tokens"] <= NEW[1] for p in plan)
    # the plan is a function of the options and the seed alone: drawn again here, it is the same
    ns = settle_workload(bench.complete(bench.build_parser().parse_args(ARGS)))
    again = plan_requests(ns, result["engine_info"]["vocab_size"])
    assert requests_digest(again) == w["plan"]["digest"]
    for run in _ours(result):
        sub = run["submitted"]
        assert sub["digest"] == w["plan"]["digest"], run["label"]       # offsets, prompt ids and lengths as sent
        assert sub["prompt_tokens"] == [p["prompt_tokens"] for p in plan]
        assert sub["new_tokens"] == [p["new_tokens"] for p in plan]
        assert run["output_lengths"] == sub["new_tokens"]                # every request ran to its planned length
        assert run["sender_lag_ms"]["p50"] >= 0                          # never sent before its time


def test_each_mode_reports_consistent_figures(served):
    _, _, result = served
    planned = sum(p["new_tokens"] for p in result["plan"])
    for run in _ours(result):
        label = run["label"]
        assert run["completed"] == N and run["failed"] == 0 and run["lengths_ok"], label
        assert run["finish_reasons"] == {"length": N} and run["output_tokens"] == planned
        assert run["output_tokens_per_s"] > 0 and run["requests_per_s"] > 0 and run["wall_s"] > 0
        lat = run["latency_ms"]
        for k in ("ttft", "tpot", "itl", "e2e"):
            assert lat[k]["p50"] is not None and lat[k]["p50"] <= lat[k]["p90"] <= lat[k]["p99"], (label, k)
        assert lat["ttft"]["n"] == N and lat["itl"]["n"] == planned - N
        assert run["itl_p99_over_p50"] == pytest.approx(lat["itl"]["p99"] / lat["itl"]["p50"], rel=1e-2)
        assert run["itl_p99_over_p50"] >= 1
        busy = run["busy"]
        assert 0 < busy["busy_pct"] <= busy["busy_pct_excl_empty_queue"] <= 100
        causes = busy["idle_ms_by_cause"]
        assert list(causes.values()) == sorted(causes.values(), reverse=True)        # largest first
        assert sum(causes.values()) == pytest.approx(busy["idle_ms_total"], abs=0.01)
        assert busy["idle_ms_host"] == pytest.approx(busy["idle_ms_total"] - causes.get("empty_queue", 0), abs=0.01)
        assert busy["busy_basis"] == "host"                                       # CPU: launch spans
        st = run["steps"]
        assert st["modes"] == {run["mode"]: st["total"]}
        kinds = st["by_kind"]
        assert kinds["decode"]["steps"] + kinds["prefill"]["steps"] == st["total"] == st["kinds_sum"]
        assert kinds["prefill"]["steps"] >= 1 and kinds["decode"]["steps"] >= 1
        assert kinds["decode"]["prefill_tokens"] == 0
        assert kinds["prefill"]["prefill_tokens"] == result["workload"]["plan"]["prompt_tokens_total"]
        # the first token comes from the prefill step, every later one from a decode row
        assert kinds["decode"]["decode_tokens"] + kinds["prefill"]["decode_tokens"] == planned - N
        assert run["recording"]["full"] is False
        # the engine's own token times give the same counts as the client's stamps
        assert run["latency_basis"] == "client"
        assert run["engine_latency_ms"]["itl"]["n"] == lat["itl"]["n"] and run["engine_latency_ms"]["ttft"]["n"] == N


def test_without_streaming_the_latencies_are_the_engines(served):
    from batchscope.app.bench.served.client_figures import latency_from_engine

    run = json.loads(json.dumps(_ours(served[2])[1]))
    m = latency_from_engine(run)
    assert m["latency_basis"] == "engine" and m["latency_ms"] == run["engine_latency_ms"]
    itl = m["latency_ms"]["itl"]
    assert m["itl_p99_over_p50"] == pytest.approx(itl["p99"] / itl["p50"], rel=1e-2)


def test_each_batchscope_run_saves_its_timeline(served):
    _, out, result = served
    for run in result["runs"]:
        path = Path(run["timeline"])
        assert path.parent == out.parent and path.name == f"s.{run['label']}.timeline.json"
        timeline = json.loads(path.read_text())
        validate_timeline(timeline)
        if run["system"] == "batchscope":
            assert len(timeline["requests"]) == N
            assert sum(s["tokens_out"] for s in timeline["steps"]) == run["output_tokens"]


def test_transformers_takes_the_same_requests_all_at_once(served):
    _, _, result = served
    tf = result["runs"][2]
    assert tf["system"] == "transformers" and tf["arrivals"] == "all at once"
    assert "latency_ms" not in tf and "busy" not in tf                   # none invented
    assert tf["lengths_ok"] and tf["output_tokens"] == sum(p["new_tokens"] for p in result["plan"])
    assert tf["wall_s"] > 0 and tf["output_tokens_per_s"] > 0 and tf["requests_per_s"] > 0
    assert "at once" in result["workload"]["baseline_arrivals"]


def test_table_lists_every_run_and_the_idle(served):
    _, _, result = served
    lines = report.format_served_table(result).splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("run "))
    for col in ("busy %", "busy % w/o empty", "TTFT p50/p99 ms", "ITL p50/p99 ms", "p99/p50", "out tok/s",
                "req/s", "decode steps", "prefill ms p50/p99"):
        assert col in lines[header]
    rows = lines[header + 2: header + 5]
    assert [r.split()[0] for r in rows] == ["sync", "async", "transformers-sync"]
    assert "(all at once)" in rows[2]
    assert len({len(r) for r in lines[header:header + 5]}) == 1                # aligned
    text = "\n".join(lines)
    assert "idle by cause, ms (largest first):" in text and "  async: " in text and "note: " in text
    assert "requests whose tokens equal the first run's: sync 1.00, async 1.00, transformers-sync 1.00" in text


def test_served_idle_script_reads_the_timelines(served, tmp_path):
    _, out, result = served
    dest = tmp_path / "idle.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "served_idle.py"), str(out.parent),
                           "--json", str(dest)], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    figures = json.loads(dest.read_text())
    assert sorted(figures) == ["s.async", "s.sync"]                     # transformers' timeline has no steps
    for name, a in figures.items():
        run = next(r for r in result["runs"] if r["label"] == name.split(".")[1])
        assert a["busy"] == run["busy"]
        assert sum(a["by_kind"][k]["steps"] for k in steps.KINDS) == a["steps"] == run["steps"]["total"]
        for kind in steps.KINDS:
            assert set(a["by_kind"][kind]["host_ms"]) == set(steps.HOST_PHASES)
        assert sum(t["gaps"] for t in a["transitions"].values()) == a["steps"] - 1
        assert "idle before prefill steps" in proc.stdout


@pytest.mark.parametrize("extra, says", [
    (["--workload", "served"], "needs --rate"),
    (["--rate", "5"], "need --workload served"),
    (["--prompt-tokens", "8:16"], "need --workload served"),
    (["--max-running", "4"], "need --workload served"),
    (["--workload", "served", "--rate", "5", "--burstiness", "0.5"], "needs --arrival gamma"),
    (["--no-stream"], "need --workload served"),
    (["--workload", "served", "--rate", "5", "--no-stream", "--no-telemetry"], "it needs telemetry"),
])
def test_bad_combinations_are_refused_plainly(extra, says, tmp_path, capsys):
    out = tmp_path / "x.json"
    rc = bench.main(["--model", "tiny-random", "--device", "cpu", "--no-progress", "--out", str(out)] + extra)
    assert rc == 2 and not out.exists()
    assert says in capsys.readouterr().err


@pytest.mark.parametrize("value, says", [("9:3", "greater than MAX"), ("0:4", ">= 1"), ("4:x", "not an integer")])
def test_bad_ranges_are_refused_by_the_parser(value, says, capsys):
    with pytest.raises(SystemExit) as e:
        bench.build_parser().parse_args(["--workload", "served", "--rate", "1", "--new-tokens", value])
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_cli_parser_takes_the_served_options():
    from batchscope.app.cli import build_parser

    args = build_parser().parse_args(["bench"] + ARGS[:-1] + ["--arrival", "gamma", "--burstiness", "0.5"])
    ns = settle_workload(bench.complete(args))
    assert (ns.workload, ns.rate, ns.arrival, ns.burstiness, ns.max_running) == ("served", 60.0, "gamma", 0.5, 4)
    assert ns.prompt_tokens == PROMPTS and ns.new_tokens == NEW
    uniform = settle_workload(bench.complete(build_parser().parse_args(["bench"])))
    assert (uniform.prompt_tokens, uniform.new_tokens, uniform.max_running) == (256, 512, None)


def _step(n, kind, compute, idle=None, causes=None, cpu=None):
    return {"step": n, "mode": "async", "prefill_tokens": 5 if kind == "prefill" else 0, "decode_tokens": 2,
            "compute_us": list(compute), "compute_basis": "cuda", "gpu_idle_before_us": idle,
            "idle_by_cause_us": causes or {}, "cpu": cpu or {}}


def test_busy_and_kind_arithmetic_on_known_steps():
    ms = 1000.0                                                             # records are in µs
    s = [_step(0, "decode", (0, 10 * ms), 500 * ms, {"empty_queue": 500 * ms}),   # reaches back before the run
         _step(1, "prefill", (12 * ms, 20 * ms), 2 * ms, {"fill": 1.5 * ms, "empty_queue": 0.5 * ms},
               {"fill": [10 * ms, 11.5 * ms], "launch": [11.5 * ms, 12 * ms]}),
         _step(2, "decode", (20 * ms, 30 * ms), 0, {}, {"launch": [15 * ms, 16 * ms]})]
    b = steps.busy_figures(s)
    assert b["busy_pct"] == pytest.approx(100 * 28 / 30, abs=0.01)
    assert b["busy_pct_excl_empty_queue"] == pytest.approx(100 * 28 / 29.5, abs=0.01)
    assert b["idle_ms_by_cause"] == {"fill": 1.5, "empty_queue": 0.5} and b["idle_ms_host"] == 1.5
    k = steps.kind_figures(s, host_phases=True)
    assert (k["decode"]["steps"], k["prefill"]["steps"]) == (2, 1)
    assert k["prefill"]["idle_before_ms_host"] == 1.5 and k["prefill"]["idle_before_ms_total"] == 2.0
    assert k["decode"]["idle_before_ms_total"] == 0                         # step 0's gap is not the run's
    assert k["prefill"]["ms_per_step"]["p50"] == pytest.approx(8.0)         # compute start 12 -> 20
    assert k["decode"]["ms_per_step"]["n"] == 1                             # the last step has no period
    assert k["prefill"]["host_ms"]["fill"]["total_ms"] == pytest.approx(1.5)
    lead = steps.launch_lead(s)
    assert lead["decode"]["late"] == 0 and lead["decode"]["lead_ms"]["p50"] == pytest.approx(4.0)
    assert lead["prefill"]["lead_ms"]["n"] == 0                             # after an empty-queue gap: left out
    assert steps.transitions(s)["decode->prefill"] == {"gaps": 1, "idle_ms_host": 1.5,
                                                       "idle_ms_by_cause": {"fill": 1.5, "empty_queue": 0.5}}


def test_medians_merge_idle_causes_and_keep_missing_figures_missing():
    a = {"busy": {"busy_pct": 90.0, "idle_ms_by_cause": {"fill": 4.0, "launch": 1.0}}, "x": None, "label": "sync"}
    b = {"busy": {"busy_pct": 94.0, "idle_ms_by_cause": {"launch": 3.0}}, "x": None, "label": "sync"}
    c = {"busy": {"busy_pct": 92.0, "idle_ms_by_cause": {"launch": 2.0, "gc": 9.0}}, "x": None, "label": "sync"}
    m = medians([a, b, c])
    assert m["busy"]["busy_pct"] == 92.0 and m["x"] is None and m["label"] == "sync"
    assert m["busy"]["idle_ms_by_cause"] == {"launch": 2.0, "fill": 0.0, "gc": 0.0}     # missing counts as 0


def test_namespace_ranges_from_elsewhere_are_read():
    ns = bench.complete(argparse.Namespace(workload="served", rate=3.0, prompt_tokens="4:9", new_tokens=[2, 5]))
    assert settle_workload(ns).prompt_tokens == (4, 9) and ns.new_tokens == (2, 5)


def test_served_bench_imports_no_server_packages():
    # the GPU box has no web server packages; the served plan and metrics need no pydantic either
    code = ("import sys, batchscope.app.bench.served.procedure; "
            "bad = [m for m in ('gradio', 'fastapi', 'uvicorn', 'plotly', 'websockets', 'pydantic') "
            "if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


class _FakeEngine:
    """Answers each request on its own thread, a token per millisecond, streaming or not, like Engine does."""

    def __init__(self):
        self.submitted = []

    def submit(self, prompt, params, stream=True):
        import threading
        import time

        from batchscope.engine.request import RequestHandle, RequestOutput, TokenDelta

        handle = RequestHandle(f"r{len(self.submitted)}", self, streaming=stream)
        self.submitted.append((list(prompt), params.max_new_tokens, stream))
        arrival = time.perf_counter_ns()

        def answer():
            toks = []
            for i in range(params.max_new_tokens):
                time.sleep(0.001)
                toks.append(i)
                if i + 1 < params.max_new_tokens and stream:
                    handle.deliver(TokenDelta([i], ""))
            now = time.perf_counter_ns()
            out = RequestOutput(handle.id, list(prompt), toks, "length", None, arrival, arrival, now)
            handle.deliver(TokenDelta([toks[-1]] if stream else [], "", True, "length"), out)
        threading.Thread(target=answer, daemon=True).start()
        return handle


@pytest.mark.parametrize("stream", [True, False])
def test_drive_sends_the_plan_on_time_and_collects_every_token(stream):
    from batchscope.app.bench.served.workload import drive

    ns = settle_workload(bench.complete(bench.build_parser().parse_args(ARGS[:12] + ["--rate", "400"])))
    plan = plan_requests(ns, 1000)
    eng = _FakeEngine()
    sent, start_ns, end_ns = drive(eng, plan, stream)
    assert [(p, n) for p, n, _ in eng.submitted] == [(p.prompt, p.max_new_tokens) for p in plan]
    assert {s for *_, s in eng.submitted} == {stream}
    assert all(s.timing.sent_ns >= s.due_ns and s.due_ns == start_ns + int(s.plan.offset_s * 1e9) for s in sent)
    assert [len(s.output.token_ids) for s in sent] == [p.max_new_tokens for p in plan]
    assert [s.timing.output_tokens for s in sent] == [p.max_new_tokens for p in plan]
    assert all(s.timing.finish_reason == "length" and s.timing.finish_ns <= end_ns for s in sent)
    # streamed: a chunk per token as it came; not streamed: the whole output at its finish
    assert all(len(s.timing.chunks) == (s.plan.max_new_tokens if stream else 1) for s in sent)
