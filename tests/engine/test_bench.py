"""`batchscope bench` on CPU with the tiny model: every metric for every run, fixed output lengths, valid timelines.
No assertion here is about speed: wall times vary from machine to machine."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from batchscope.app.bench import floor
from batchscope.app.bench import summary_table as report
from batchscope.app.bench import command as bench
from batchscope.app.bench.floor import roofline_floor
from batchscope.app.bench.systems import METRICS
from batchscope.engine import EngineConfig
from batchscope.telemetry import validate_timeline

REQUESTS, PROMPT, NEW = 4, 16, 8
CPU_ARGS = ["--model", "tiny-random", "--device", "cpu", "--requests", str(REQUESTS), "--prompt-tokens", str(PROMPT),
            "--new-tokens", str(NEW), "--modes", "sync,async", "--bandwidth-mib", "32", "--no-progress"]


@pytest.fixture(scope="module")
def cpu_bench(tmp_path_factory):
    """The CI shape, with the transformers baseline, through the standalone parser (`python -m batchscope.app.bench`)."""
    out = tmp_path_factory.mktemp("bench") / "b.json"
    rc = bench.main(CPU_ARGS + ["--baseline", "transformers", "--out", str(out)])
    return rc, out, json.loads(out.read_text())


def test_every_run_reports_every_metric(cpu_bench, capsys):
    rc, _, result = cpu_bench
    assert rc == 0
    assert result["order"] == ["sync", "async", "transformers-sync"]
    assert [run["label"] for run in result["runs"]] == result["order"]      # every planned run ran
    # transformers' async batching needs CUDA: on CPU it is skipped, and says so
    assert "transformers-async" in result["skipped"]
    assert result["bandwidth"]["gbps"] > 0
    assert result["transformers_config"]["same_weights"] is True
    # the baseline runs transformers' own code, although the engine beside it runs its kernels (per model)
    assert result["transformers_config"]["batchscope_patches"] == []
    assert result["engine_info"]["kernels_skipped"] == []
    assert result["floor"]["ms_per_step"] > 0
    assert result["floor"]["gemm_peak"]["tflops"] > 0
    assert result["floor"]["roofline"]["ms_per_step"] >= result["floor"]["ms_per_step"] * 0.999
    # the held GEMM rate (sustained load, a power-limited GPU's clock) is a CUDA measurement
    assert result["floor"]["gemm_peak"]["held_tflops"] is None
    assert result["floor"]["roofline_held"]["ms_per_step"] is None
    for run in result["runs"]:
        for key in METRICS:
            assert key in run, (run["label"], key)
        # measurable on CPU; NVML utilization is not (the key is there, the value is None)
        for key in ("wall_s", "tokens_per_s", "decode_ms_per_step", "floor_ms_per_step", "floor_pct", "speedup",
                    "roofline_ms_per_step", "x_roofline"):
            assert run[key] is not None and run[key] > 0, (run["label"], key, run[key])
        assert run["output_tokens"] == REQUESTS * NEW
        assert run["lengths_ok"] is True
    for label, med in result["results"].items():
        assert all(key in med for key in METRICS), label
    # the slowest run is the speedup reference
    assert min(m["speedup"] for m in result["results"].values()) == pytest.approx(1.0)


def test_batchscope_runs_are_busy_measured_and_in_their_own_mode(cpu_bench):
    _, _, result = cpu_bench
    ours = [run for run in result["runs"] if run["system"] == "batchscope"]
    assert [(run["label"], run["mode"]) for run in ours] == [("sync", "sync"), ("async", "async")]
    for run in ours:
        # the engine stepped: every request needs NEW steps (one prefill, then a decode per further token)
        assert NEW <= run["steps"] <= REQUESTS * NEW and run["decode_steps"] >= NEW - 1
        assert run["finish_reasons"] == {"length": REQUESTS}
        assert 0 < run["gpu_busy_pct"] <= 100          # on CPU: host launch spans stand in for compute
        assert run["busy_basis"] == "host"
        assert run["step_modes"] == {run["mode"]: run["steps"]}


def test_sync_and_async_and_transformers_agree_on_tokens(cpu_bench):
    # float32 greedy on the same weights: the same tokens, whichever loop or library produced them
    _, _, result = cpu_bench
    assert [r["tokens_agree_with_first_run"] for r in result["runs"]] == [1.0, 1.0, 1.0]


def test_each_run_writes_a_valid_timeline(cpu_bench):
    _, out, result = cpu_bench
    assert [run["label"] for run in result["runs"]] == ["sync", "async", "transformers-sync"]
    for run in result["runs"]:
        path = Path(run["timeline"])
        assert path.parent == out.parent and path.name == f"b.{run['label']}.timeline.json"
        timeline = json.loads(path.read_text())
        validate_timeline(timeline)
        if run["system"] == "batchscope":
            assert sum(s["tokens_out"] for s in timeline["steps"]) == REQUESTS * NEW
            assert {s["mode"] for s in timeline["steps"]} == {run["mode"]}
            assert len(timeline["requests"]) == REQUESTS
        else:       # transformers: its steps from the profiled pass, the NVML samples taken meanwhile
            assert timeline["meta"]["source"]["engine"] == "transformers" and timeline["nvml"]


def test_transformers_steps_are_recorded_and_batchscope_timelines_are_untouched(cpu_bench):
    """--baseline transformers records transformers' steps (a profiled pass, imported), not only NVML samples."""
    _, out, result = cpu_bench
    run = next(r for r in result["runs"] if r["label"] == "transformers-sync")
    timeline = json.loads(Path(run["timeline"]).read_text())
    src = timeline["meta"]["source"]
    assert src["engine"] == "transformers" and src["window"]["pass"] == "profiled"
    assert src["steps_from"].startswith("transformers' continuous-batching loop")
    steps = timeline["steps"]
    # all 4 prompts prefill in one step, then a decode step per further token
    assert len(steps) == NEW == run["profiled"]["steps"] and src["window"]["new_tokens"] == NEW
    for s in steps:
        assert s["compute_us"][1] > s["compute_us"][0] and s["compute_basis"] == "host"
        assert s["cpu"]["launch"] == s["compute_us"] and {"schedule", "update"} <= set(s["cpu"])
    assert all(s["gpu_idle_before_us"] is not None for s in steps[1:])
    # what a trace cannot say is said, not guessed
    assert {"prefill_tokens", "decode_tokens"} <= set(src["unknown"])
    assert 0 < run["gpu_busy_pct"] <= 100 and run["busy_basis"] == "host"
    assert run["profiled"]["profiler_cost_pct"] is not None and run["profiled"]["trace_bytes"] > 0
    assert Path(run["profiled"]["trace"]).parent == out.parent
    for ours in (r for r in result["runs"] if r["system"] == "batchscope"):
        tl = json.loads(Path(ours["timeline"]).read_text())
        assert "source" not in tl["meta"] and "profiled" not in ours          # telemetry's own recording
        assert len(tl["steps"]) == ours["steps"] and tl["meta"]["recording"]["name"] == ours["label"]


def test_baseline_profile_steps_defaults_to_32_and_0_turns_it_off(tmp_path):
    args = bench.settle_workload(bench.complete(bench.build_parser().parse_args(
        CPU_ARGS + ["--baseline", "transformers", "--baseline-profile-steps", "0", "--out", str(tmp_path / "b.json")])))
    assert args.baseline_profile_steps == 0
    assert bench.build_parser().parse_args(CPU_ARGS).baseline_profile_steps == 32

def test_table_is_printed_last(cpu_bench):
    _, _, result = cpu_bench
    table = report.format_table(result)
    lines = table.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("run "))
    for col in ("wall s", "out tok/s", "ms/step", "floor ms", "% of floor", "GPU busy %", "NVML util %", "speedup"):
        assert col in lines[header]
    rows = lines[header + 2: header + 5]
    assert [r.split()[0] for r in rows] == ["sync", "async", "transformers-sync"]
    assert len({len(r) for r in lines[header:header + 5]}) == 1       # aligned
    assert "skipped transformers-async" in table


def test_cli_namespace_without_telemetry(tmp_path):
    """app/cli.py passes its own Namespace (fewer options); missing ones take bench's defaults."""
    out = tmp_path / "plain.json"
    args = argparse.Namespace(command="bench", model="tiny-random", device="cpu", dtype="auto", requests=REQUESTS,
                              prompt_tokens=PROMPT, new_tokens=NEW, modes=["async", "sync"], baseline=None,
                              out=str(out), no_telemetry=True, no_progress=True, bandwidth_mib=32)
    assert bench.main(args) == 0
    result = json.loads(out.read_text())
    assert result["telemetry"] is False and result["skipped"] == {}
    assert [r["label"] for r in result["runs"]] == ["async", "sync"]
    for run in result["runs"]:
        assert run["output_tokens"] == REQUESTS * NEW and run["lengths_ok"]
        assert run["wall_s"] > 0 and run["tokens_per_s"] > 0
        assert run["decode_ms_per_step"] is None and "timeline" not in run
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plain.json"]


def test_order_alternates_between_repeats():
    assert bench.plan_order(["sync", "async", "transformers-sync"], 3) == [
        (0, "sync"), (0, "async"), (0, "transformers-sync"),
        (1, "transformers-sync"), (1, "async"), (1, "sync"),
        (2, "sync"), (2, "async"), (2, "transformers-sync")]


def test_floor_uses_the_exact_mean_context_of_the_decode():
    info = {"weight_bytes": 1_000_000, "kv_bytes_per_token": 100}
    requests, prompt, new = 3, 10, 7
    # brute force: the decode step producing token j (2..new) attends over prompt + j - 1 positions per request
    contexts = [requests * (prompt + j - 1) for j in range(2, new + 1)]
    mean_bytes = info["weight_bytes"] + info["kv_bytes_per_token"] * sum(contexts) / len(contexts)
    decode = floor.decode_floor(info, requests, prompt, new, gbps=2.0)
    assert decode["bytes_per_step"] == int(mean_bytes)
    assert decode["ms_per_step"] == pytest.approx(mean_bytes / 2e9 * 1e3, abs=1e-4)
    assert floor.decode_floor(info, requests, prompt, 1, gbps=2.0)["ms_per_step"] is None   # no decode step


def test_roofline_takes_the_larger_of_memory_and_compute_per_class():
    """8 GB of dense weights at 256 rows on a 4 TB/s, 800 TFLOP/s device: compute-bound (5.24 ms > 2 ms); the lm_head
    and the KV stay memory-bound; at 32 rows everything is memory-bound and the roofline equals the bandwidth floor."""
    classes = {"linear": {"bytes": 8e9, "macs_per_row": 4e9},      # 4e9 bf16 weights, one MAC each per row
               "experts": {"bytes": 0, "macs_per_row": 0},
               "lm_head": {"bytes": 1e9, "macs_per_row": 0.25e9}}   # float32: 4 bytes a weight
    info = {"kv_bytes_per_token": 1000}
    r = roofline_floor(classes, info, 256, 100, 2, gbps=4000.0, tflops=800.0)
    lin = r["classes"]["linear"]
    assert lin["memory_ms"] == pytest.approx(2.0) and lin["compute_ms"] == pytest.approx(2 * 4e9 * 256 / 800e12 * 1e3)
    assert lin["bound"] == "compute" and r["classes"]["lm_head"]["bound"] == "memory"
    kv = 1000 * 256 * 101 / 4000e9 * 1e3
    assert r["ms_per_step"] == pytest.approx(lin["compute_ms"] + 0.25 + kv, abs=1e-3)
    small = roofline_floor(classes, info, 32, 100, 2, gbps=4000.0, tflops=800.0)
    assert all(p["bound"] == "memory" for p in small["classes"].values())
    bandwidth = floor.decode_floor({"weight_bytes": 9e9, "kv_bytes_per_token": 1000}, 32, 100, 2, gbps=4000.0)
    assert small["ms_per_step"] == pytest.approx(bandwidth["ms_per_step"], abs=1e-3)


def test_held_roofline_uses_the_sustained_gemm_rate_and_runs_are_scored_against_it():
    classes = {"linear": {"bytes": 8e9, "macs_per_row": 4e9}, "experts": {"bytes": 0, "macs_per_row": 0},
               "lm_head": {"bytes": 1e9, "macs_per_row": 0.25e9}}
    info = {"kv_bytes_per_token": 1000}
    burst = roofline_floor(classes, info, 256, 100, 2, gbps=4000.0, tflops=800.0)
    held = roofline_floor(classes, info, 256, 100, 2, gbps=4000.0, tflops=600.0)
    # only the compute-bound class slows down with the clock
    assert held["ms_per_step"] - burst["ms_per_step"] == pytest.approx(2 * 4e9 * 256 * (1 / 600e12 - 1 / 800e12) * 1e3,
                                                                       abs=1e-3)
    assert roofline_floor(classes, info, 256, 100, 2, gbps=4000.0, tflops=None)["ms_per_step"] is None
    run = {"label": "async", "system": "batchscope", "mode": "async", "lengths_ok": True, "wall_s": 1.0,
           "token_ids": [[1]], "decode_ms_per_step": 2 * held["ms_per_step"], "floor_ms_per_step": 1.0,
           "roofline_ms_per_step": burst["ms_per_step"], "roofline_held_ms_per_step": held["ms_per_step"]}
    out = bench._assemble(argparse.Namespace(model="m", requests=256, prompt_tokens=100, new_tokens=2, seed=0,
                                             warmup_tokens=1, repeats=1, no_telemetry=False), {"gbps": 4000.0},
                          {"ms_per_step": 1.0},
                          {"device": "cuda:0"}, EngineConfig(), [run], {}, [(0, "async")], None)
    assert out["results"]["async"]["x_roofline_held"] == pytest.approx(2.0)
    assert out["results"]["async"]["x_roofline"] > 2.0


def test_weight_classes_count_linears_experts_and_head(tmp_path):
    from batchscope.app.bench.floor import weight_classes
    from test_model_matrix import build_checkpoint
    from transformers import AutoModelForCausalLM

    moe = AutoModelForCausalLM.from_pretrained(build_checkpoint("qwen3_moe", tmp_path / "m"))
    c = weight_classes(moe, experts_per_token=2)
    experts = [m for m in moe.modules() if hasattr(m, "gate_up_proj") and m.gate_up_proj.dim() == 3]
    per_expert = sum((m.gate_up_proj.numel() + m.down_proj.numel()) // m.gate_up_proj.shape[0] for m in experts)
    assert c["experts"]["macs_per_row"] == 2 * per_expert                     # top-2 of 8: a row meets two experts
    assert c["experts"]["bytes"] == 4 * 8 * per_expert                        # float32, all experts stored
    assert c["lm_head"]["macs_per_row"] == moe.lm_head.weight.numel()
    linears = [m for m in moe.modules() if isinstance(m, torch.nn.Linear) and m is not moe.lm_head]
    assert c["linear"]["macs_per_row"] == sum(m.weight.numel() for m in linears)


def test_bad_workload_is_refused_plainly(tmp_path, capsys):
    out = tmp_path / "x.json"
    rc = bench.main(["--model", "tiny-random", "--device", "cpu", "--requests", "1", "--prompt-tokens", "4000",
                     "--new-tokens", "200", "--modes", "sync", "--bandwidth-mib", "8", "--no-progress",
                     "--out", str(out)])
    assert rc == 2 and not out.exists()
    assert "exceed" in capsys.readouterr().err


def test_bench_imports_no_server_packages():
    # the GPU box has no gradio, fastapi, uvicorn, plotly or websockets
    code = ("import sys, batchscope.app.bench.command, batchscope.telemetry; "
            "bad = [m for m in ('gradio', 'fastapi', 'uvicorn', 'plotly', 'websockets') if m in sys.modules]; "
            "print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 0, proc.stdout + proc.stderr
