"""`batchscope whatif` without running an engine: the prediction's contract, the engine's own scheduler deciding
(preemption under a small KV cache, a budget that chunks prompts), the sync->async forecast as one of its cases,
and bad input refused with one line and exit 2."""
from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from batchscope.app.cli import main
from batchscope.telemetry.whatif import SCHEMA_ID, WhatIfError, open_recording, parse, predict

FIXTURES = Path(__file__).parents[1] / "fixtures"
H200_SYNC = FIXTURES / "batchscope-h200-sync.timeline.json.gz"
CPU_ASYNC = FIXTURES / "batchscope-cpu-async.timeline.json.gz"
SOURCE = {"tool": "torch.profiler", "engine": "vllm", "files": [{"name": "t.json", "rank": 0}], "trace_start": None,
          "steps_from": "execute_model", "inferred": []}
FIGURES = ("output_tokens_per_s", "ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "busy_pct")


def _timeline(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def _run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(["whatif", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_json_holds_recorded_and_predicted_per_mode_with_every_figure(tmp_path, capsys):
    out = tmp_path / "w.json"
    rc, text, _ = _run(capsys, CPU_ASYNC, "--set", "max_batch_tokens=32", "--json", out)
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["schema"] == SCHEMA_ID
    entry = doc["modes"]["async"]
    for side in ("recorded", "predicted"):
        for name in FIGURES:
            assert name in entry[side]
        for name in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"):
            assert set(entry[side][name]) == {"p50", "p90", "p99"}
    assert entry["predicted"]["output_tokens_per_s"] > 0
    low, high = entry["predicted"]["interval"]["low"], entry["predicted"]["interval"]["high"]
    assert low["ttft_ms"]["p50"] <= entry["predicted"]["ttft_ms"]["p50"] <= high["ttft_ms"]["p50"]
    assert doc["model"]["device_compute"]["us"]["one"] > 0           # the coefficients export
    assert doc["settings"]["whatif"]["max_batch_tokens"] == 32
    assert "TTFT p50 ms" in text and "predicted" in text


def test_a_small_kv_cache_makes_the_real_scheduler_preempt():
    rec = open_recording(str(H200_SYNC))
    roomy = predict(rec, {}, runs=1)["modes"]["sync"]["predicted"]
    tight = predict(rec, {"num_blocks": 120}, runs=1)["modes"]["sync"]["predicted"]
    assert roomy["preemptions"] == 0
    assert tight["preemptions"] > 0
    assert tight["unfinished_requests"] == 0
    assert tight["e2e_ms"]["p50"] > roomy["e2e_ms"]["p50"]


def test_a_small_budget_chunks_prompts_and_delays_first_tokens():
    rec = open_recording(str(H200_SYNC))
    wide = predict(rec, {"max_batch_tokens": 4096}, runs=1)["modes"]["sync"]["predicted"]
    narrow = predict(rec, {"max_batch_tokens": 64}, runs=1)["modes"]["sync"]["predicted"]
    assert narrow["budgets"]["fixed"]["tokens_p50"] == 64
    assert narrow["ttft_ms"]["p50"] > 1.5 * wide["ttft_ms"]["p50"]


def test_a_slower_arrival_rate_spreads_the_load_out():
    rec = open_recording(str(H200_SYNC))
    base = predict(rec, {}, runs=1)["modes"]["sync"]
    slow = predict(rec, {"rate": 0.1}, runs=1)["modes"]["sync"]["predicted"]
    assert slow["output_tokens_per_s"] < 0.5 * base["predicted"]["output_tokens_per_s"]
    assert slow["duration_s"] > 2 * base["predicted"]["duration_s"]
    waited = slow["idle_ms_by_cause"].get("empty_queue", 0.0)           # the device waits for arrivals
    assert waited > 10 * base["predicted"]["idle_ms_by_cause"].get("empty_queue", 0.0) + 1.0


def test_mode_async_on_a_sync_recording_agrees_with_the_forecast():
    """forecast.py's sync->async forecast is the `mode=async` case: the same step period within 5%."""
    doc = predict(open_recording(str(H200_SYNC)), {"mode": "async"})
    entry = doc["modes"]["async"]
    assert entry["recorded"]["mode"] == "sync"
    check = entry["forecast"]
    assert check["applicable"]
    assert abs(check["difference_pct"]) < 5.0
    assert entry["predicted"]["busy_pct"] > entry["recorded"]["busy_pct"]


def test_the_prediction_is_repeatable():
    rec = open_recording(str(CPU_ASYNC))
    a = predict(rec, {"rate": 2.0}, runs=3)
    b = predict(rec, {"rate": 2.0}, runs=3)
    assert a["modes"] == b["modes"]


def test_shapes_beyond_the_recording_are_flagged():
    rec = open_recording(str(CPU_ASYNC))     # its steps prefill at most 21 tokens
    doc = predict(rec, {"rate": 50.0, "max_batch_tokens": 512}, runs=1)
    flagged = doc["modes"]["async"]["predicted"]["extrapolated"]
    assert flagged["steps"] > 0 and flagged["beyond_recorded"]


@pytest.mark.parametrize("pairs, words", [
    (["budget=5"], "unknown setting 'budget'"),
    (["max_running"], "expected KEY=VALUE"),
    (["max_running=0"], "max_running=0: must be an integer >= 1"),
    (["num_blocks=1"], "num_blocks=1: must be an integer >= 2"),
    (["rate=-2"], "rate=-2: must be a positive number"),
    (["rate=fast"], "rate=fast: must be a positive number"),
    (["mode=turbo"], "mode=turbo: must be one of sync, async"),
    (["mixed_graphs=maybe"], "must be on or off"),
    (["rate=2", "rate=3"], "rate given twice"),
])
def test_bad_settings_get_one_line(pairs, words):
    with pytest.raises(WhatIfError, match=words.replace("(", r"\(").replace(")", r"\)")):
        parse(pairs)


def _refused(capsys, argv) -> str:
    rc, text, err = _run(capsys, *argv)
    assert rc == 2 and not text
    assert err.count("\n") == 1 and err.startswith("batchscope: ") and "Traceback" not in err
    return err


def test_bad_input_exits_2_with_one_line(tmp_path, capsys):
    tl = _timeline(CPU_ASYNC)
    no_requests = tmp_path / "none.json"
    no_requests.write_text(json.dumps({**tl, "requests": []}))
    assert "holds no requests" in _refused(capsys, [no_requests])
    foreign = tmp_path / "vllm.json"
    foreign.write_text(json.dumps({**tl, "meta": {**tl["meta"], "source": SOURCE}}))
    assert "another engine (vllm, torch.profiler)" in _refused(capsys, [foreign])
    assert "unknown setting" in _refused(capsys, [CPU_ASYNC, "--set", "turbo=1"])
    assert "could never run" in _refused(capsys, [H200_SYNC, "--set", "num_blocks=2"])
    assert "impossible settings" in _refused(capsys, [CPU_ASYNC, "--set", "max_batch_tokens=64",
                                                      "itl_target_ms=20"])
    assert "cannot read" in _refused(capsys, [tmp_path / "missing.json"])
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json")
    assert "not a batchscope timeline" in _refused(capsys, [garbage])
    assert "folder does not exist" in _refused(capsys, [CPU_ASYNC, "--json", tmp_path / "no" / "w.json"])


def test_the_command_line_loads_nothing_heavy_until_whatif_runs():
    code = ("import sys; from batchscope.app.cli import build_parser; build_parser().parse_args(['whatif', 'x']); "
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_new_load_replaces_the_recorded_one():
    rec = open_recording(str(H200_SYNC))
    asked = {"requests": 48, "prompt_tokens": (64, 64), "new_tokens": (16, 16), "arrival": "poisson", "seed": 3}
    entry = predict(rec, asked, runs=1)["modes"]["sync"]
    assert entry["predicted"]["requests"] == 48
    assert entry["predicted"]["output_tokens"] == 48 * 16
    burst = predict(rec, {**asked, "arrival": "burst"}, runs=1)["modes"]["sync"]["predicted"]
    assert burst["ttft_ms"]["p90"] > entry["predicted"]["ttft_ms"]["p90"]     # all at once: the last ones queue
    assert predict(rec, asked, runs=1)["modes"] == predict(rec, asked, runs=1)["modes"]        # seeded


@pytest.mark.parametrize("pairs, words", [
    (["prompt_tokens=9:3"], "must be N or MIN:MAX"),
    (["new_tokens=0"], "must be N or MIN:MAX"),
    (["arrival=uniform"], "must be one of burst, poisson, gamma"),
    (["requests=0"], "must be an integer >= 1"),
    (["seed=x"], "must be an integer >= 0"),
    (["burstiness=0"], "must be a positive number"),
])
def test_bad_load_settings_get_one_line(pairs, words):
    with pytest.raises(WhatIfError, match=words):
        parse(pairs)


def test_the_models_graph_buckets_are_the_engines():
    """A decode step carries at most the step's token budget of rows, so the engine captures no decode graph wider
    than the budget; the model pads decode steps to the same buckets the engine replays."""
    from batchscope.engine import EngineConfig
    from batchscope.engine.graphs import graph_buckets
    from batchscope.telemetry.whatif.model import Graphs

    narrow = Graphs.of(EngineConfig(model="tiny-random", max_running=64, max_batch_tokens=16), enabled=True)
    assert narrow.decode == tuple(graph_buckets(16)) and max(narrow.decode) == 16
    wide = Graphs.of(EngineConfig(model="tiny-random", max_running=64), enabled=True)
    assert wide.decode == tuple(graph_buckets(64))
    assert Graphs.of(EngineConfig(model="tiny-random"), enabled=False).decode == ()


def test_an_interval_widened_by_a_large_replay_error_stops_at_zero():
    from batchscope.telemetry.whatif.predict import _band

    assert _band(93.61, 90.0, 604.0, min) == 0.0          # was -471.8 ms: a latency below zero
    assert _band(93.61, 99.0, 604.0, max) == round(93.61 * 7.04, 3)
    assert _band(10.0, 9.0, 5.0, min) == 9.0              # the runs' own low when it is lower than the widened edge


H200_RESULTS = Path(__file__).parents[2] / "benchmarks" / "results"
H200_SERVED = H200_RESULTS / "2026-12-05-h200-budget-knee" / "served_r12_adaptive.async.timeline.json.gz"
H200_SERVED_256 = H200_RESULTS / "2026-12-05-h200-budget" / "served_r12_256.async.timeline.json.gz"


def test_an_h200_recording_of_graphed_steps_only_predicts_and_scores_against_a_run_already_made(tmp_path, capsys):
    """Every step of a served H200 run replays a CUDA graph (none eager): the model lends the graphed steps' launch
    lead to the eager ones. --against scores the prediction with a run of the same seeded load at fixed 256 made
    on the same H200: throughput -0.3%, TTFT p50 -0.7% when measured (benchmarks/results/2026-12-05-h200-whatif)."""
    out = tmp_path / "against.json"
    rc, text, err = _run(capsys, H200_SERVED, "--set", "max_batch_tokens=256", "--runs", "1",
                         "--against", H200_SERVED_256, "--json", out)
    assert rc == 0, err
    doc = json.loads(out.read_text())
    entry = doc["modes"]["async"]
    assert entry["measured"]["requests"] == entry["predicted"]["requests"] == 240
    # the launch lead is read on a free device: in async nearly every step waited ~4 ms behind the one computing,
    # and taking that wait for the lead put ~0.6 s of idle (busy 97% for 99.9%) into the replay of the recording
    assert doc["model"]["lead_us"]["graphed"] < 1000
    assert abs(entry["replayed"]["busy_pct"] - entry["recorded"]["busy_pct"]) < 1
    assert abs(entry["error_pct"]["output_tokens_per_s"]) < 5
    assert abs(entry["error_pct"]["ttft_ms"]["p50"]) < 15 and abs(entry["error_pct"]["itl_ms"]["p50"]) < 15
    assert "measured" in text and "error" in text
    rc, _, err = _run(capsys, H200_SERVED, "--set", "rate=2", "--verify", "--against", H200_SERVED_256)
    assert rc == 2 and err.count("\n") == 1 and "--against" in err
    rc, _, err = _run(capsys, H200_SERVED, "--set", "mode=sync", "--against", H200_SERVED_256)
    assert rc == 2 and "no sync steps" in err


def test_mixed_steps_with_more_decode_rows_than_recorded_are_priced_by_their_own_fit():
    """At 40 req/s the H200's mixed steps (a prompt chunk beside 48-64 decode rows) ran beyond the 12 req/s
    recording's (at most 32 rows). With one price per decode row for every step they came out 9% cheaper than
    measured, and the saturated prediction's ITL p50 29% low; a mixed step's own fixed cost and per-row price
    (fitted where the recording ran both kinds often enough) bring them within a few percent."""
    from batchscope.telemetry.whatif import open_recording
    from batchscope.telemetry.whatif.model import Graphs, build, step_rows

    rec = open_recording(str(H200_SERVED))
    model = build(rec)
    assert {"mixed", "mixed_rows"} <= set(model.as_dict()["device_compute"]["us"])
    run = open_recording(str(H200_RESULTS / "2026-12-05-h200-budget" / "served_r40_256.async.timeline.json.gz"))
    graphs = Graphs.of(run.config, True, run.info.get("mixed_graph_tokens") or [])
    rows = [r for r in step_rows(run, [s for seg in run.segments.values() for s in seg.steps], graphs, "gpu")
            if r["compute"] and r["real_prefill_tokens"] and r["real_decode_rows"] > 32]
    assert len(rows) > 300
    measured, predicted = sum(r["compute"] for r in rows), sum(model.device.predict(r) for r in rows)
    assert abs(predicted / measured - 1) < 0.05
    # a recording with a single mixed step cannot tell its price from the eager one's: the features stay out
    assert "mixed" not in build(open_recording(str(H200_SYNC))).as_dict()["device_compute"]["us"]


def test_a_sync_loop_predicted_from_an_async_recording_takes_each_host_phase_at_its_cpu_time():
    """In async a step's fill waits for its slot to come free and any phase may wait for the GIL while the device
    computes; a sync loop does neither. From the H200's async recording, sync predicted with the async phases'
    wall times was 19% slow on ITL p50 against the sync run the H200 then made (`--verify`, committed); with the
    engine thread's CPU time in each phase it is within 10%."""
    verify = H200_RESULTS / "2026-12-05-h200-whatif-verify" / "whatif" / "whatif-mode-sync.json"
    measured = json.loads(verify.read_text())["modes"]["sync"]["measured"]
    doc = predict(open_recording(str(H200_SERVED)), parse(["mode=sync"]), runs=1)
    assert doc["model"]["host_from"]["sync"] == "async"
    predicted = doc["modes"]["sync"]["predicted"]
    assert abs(predicted["itl_ms"]["p50"] / measured["itl_ms"]["p50"] - 1) < 0.10
    assert abs(predicted["output_tokens_per_s"] / measured["output_tokens_per_s"] - 1) < 0.05


def test_a_prompt_chunk_deep_in_a_long_prompt_is_priced_by_its_context_too():
    """A chunk attends to every token before it. Fitted on the 12 req/s recording (chunks of at most 1,024 tokens,
    prompts of at most 1,024), the H200's long-prompt run (prompts 2,048-8,192) had its chunks of more than 1,024
    tokens priced at less than half their time by length alone (-57%); with each chunk's context they come out
    within 15%."""
    from batchscope.telemetry.whatif import open_recording
    from batchscope.telemetry.whatif.model import Graphs, build, step_rows

    model = build(open_recording(str(H200_SERVED)))
    assert model.device.as_dict()["us"]["prefill_ctx"] > 0
    run = open_recording(str(H200_RESULTS / "2026-12-05-h200-budget-knee" / "long_r3_adaptive.async.timeline.json.gz"))
    graphs = Graphs.of(run.config, True, run.info.get("mixed_graph_tokens") or [])
    rows = [r for r in step_rows(run, [s for seg in run.segments.values() for s in seg.steps], graphs, "gpu")
            if r["compute"] and r["real_prefill_tokens"] > 1024]
    assert len(rows) >= 10
    measured, predicted = sum(r["compute"] for r in rows), sum(model.device.predict(r) for r in rows)
    assert abs(predicted / measured - 1) < 0.15
