"""Tensor parallelism on CPU over gloo: the ranks are real processes the engine starts itself, and greedy tokens at
tensor_parallel_size 2 (and 4) equal transformers' own generate, in sync, in async and across live switches,
through a cache small enough to force chunked prefill and preemption. Models that cannot be split are refused
before any process starts; the other ranks' GPU spans reach telemetry; no rank outlives rank 0.

The CUDA path (NCCL, all-reduces inside the decode graphs) is checked by the `gpu` tests at the end, on a machine
with two GPUs (benchmarks/gpu_checks.sh tp)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from batchscope.engine import ConfigError, Engine, EngineConfig, EngineUnavailable, SamplingParams
from batchscope.engine.parallel.sharding import TP_FAMILIES
from test_model_matrix import FAMILIES, build_checkpoint, matrix_prompts, run_matrix_family

SPLIT_FAMILIES = [f for f in FAMILIES if f in TP_FAMILIES]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp")
    cache: dict[str, str] = {}

    def get(family: str, **changes) -> str:
        key = family + json.dumps(changes, sort_keys=True)
        if key not in cache:
            if changes:
                FAMILIES[f"{family}-x"] = (FAMILIES[family][0], {**FAMILIES[family][1], **changes})
                try:
                    cache[key] = build_checkpoint(f"{family}-x", root / f"{family}-{len(cache)}")
                finally:
                    del FAMILIES[f"{family}-x"]
            else:
                cache[key] = build_checkpoint(family, root / family)
        return cache[key]
    return get


def _assert_exact(res: dict, what: str) -> None:
    for mode, r in res["modes"].items():
        assert r["exact"], f"{what} {mode}: prompts {r['mismatches']} differ from transformers' generate"
        assert r["finish"] == ["length"]
    assert res["preempted"], "the small cache never preempted"
    assert res["chunked"]


def test_every_splittable_family_is_in_the_matrix():
    assert set(TP_FAMILIES) <= set(FAMILIES)


@pytest.mark.parametrize("family", SPLIT_FAMILIES)
def test_tp2_greedy_equals_transformers(checkpoints, family):
    res = run_matrix_family(checkpoints(family), "cpu", tensor_parallel_size=2)
    assert res["info"]["tensor_parallel_size"] == 2
    assert [r["rank"] for r in res["info"]["ranks"]] == [0, 1]
    _assert_exact(res, family)


def test_fewer_kv_heads_than_ranks_replicates_them(checkpoints):
    """One KV head, two ranks: each rank keeps the one KV head all its query heads read."""
    res = run_matrix_family(checkpoints("llama", num_key_value_heads=1), "cpu", tensor_parallel_size=2)
    assert res["info"]["num_kv_heads"] == 1
    _assert_exact(res, "llama with 1 KV head at TP=2")


def test_tp4_with_two_kv_heads(checkpoints):
    """Four ranks over two KV heads (each held by two ranks) and four query heads (one per rank)."""
    res = run_matrix_family(checkpoints("qwen3"), "cpu", modes=("async", "switch"), tensor_parallel_size=4)
    assert len(res["info"]["ranks"]) == 4 and res["info"]["num_kv_heads"] == 1
    _assert_exact(res, "qwen3 at TP=4")


def test_the_shares_are_cut_as_documented(checkpoints):
    """Rank 0's share: half the query heads, its KV heads, half of every MLP, half the vocabulary."""
    path = checkpoints("qwen2")     # q/k/v biases: they are cut with their rows, o_proj's stays on rank 0
    with Engine(EngineConfig(model=path, device="cpu", dtype="float32", tensor_parallel_size=2,
                             num_blocks=32)) as eng:
        attn = eng.model.model.layers[0].self_attn
        mlp = eng.model.model.layers[0].mlp
        assert attn.q_proj.weight.shape == (2 * 16, 64) and attn.k_proj.weight.shape == (16, 64)
        assert attn.o_proj.weight.shape == (64, 32)
        assert mlp.gate_proj.weight.shape == (48, 64) and mlp.down_proj.weight.shape == (64, 48)
        assert eng.model.get_output_embeddings().weight.shape[0] == 128
        assert eng.info["allreduces_per_step"] == 4 and set(eng.info["allreduce_us"]) >= {"1", "32"}


def test_sampled_tokens_match_tp1_for_the_same_seeds(checkpoints):
    """Every rank samples from the same gathered logits with the request's seed: TP=2 draws what TP=1 draws."""
    path = checkpoints("llama")
    prompts = matrix_prompts()
    params = SamplingParams(max_new_tokens=8, temperature=0.9, top_k=20, seed=11, ignore_eos=True)
    outs = {}
    for tp in (1, 2):
        with Engine(EngineConfig(model=path, device="cpu", dtype="float32", tensor_parallel_size=tp,
                                 num_blocks=64)) as eng:
            outs[tp] = [o.token_ids for o in eng.generate(prompts, params)]
    assert outs[1] == outs[2]


def test_penalties_and_logprobs_match_tp1(checkpoints):
    """Every rank keeps its own token counts, updated on its device from the packs rank 0 sends, and samples from the
    same gathered logits: TP=2 penalizes, draws and scores what TP=1 does."""
    path = checkpoints("llama")
    prompts = matrix_prompts()
    kinds = [dict(temperature=0.9, seed=11, presence_penalty=-1.5, frequency_penalty=0.5, logprobs=3),
             dict(repetition_penalty=1.5, logprobs=0), dict(frequency_penalty=-2.0), dict(logprobs=5), dict()]
    params = [SamplingParams(max_new_tokens=8, ignore_eos=True, **kw) for kw in kinds]
    outs = {}
    for tp in (1, 2):
        with Engine(EngineConfig(model=path, device="cpu", dtype="float32", tensor_parallel_size=tp,
                                 num_blocks=64)) as eng:
            outs[tp] = eng.generate(prompts, params)
    for one, two in zip(outs[1], outs[2]):
        assert one.token_ids == two.token_ids
        assert (one.logprobs is None) == (two.logprobs is None)
        if one.logprobs is not None:
            torch.testing.assert_close(torch.tensor(two.logprobs), torch.tensor(one.logprobs), atol=1e-4, rtol=0)
            ids = [[[t for t, _ in top] for top in out.top_logprobs] for out in (one, two)]
            assert ids[0] == ids[1]


def test_the_tiny_preset_splits_whole_and_matches_tp1():
    """A small random preset is built whole on every rank and cut: the same weights as at TP=1."""
    prompts = [[5, 9, 200, 31, 7], [44, 45, 46]]
    params = SamplingParams(max_new_tokens=10, ignore_eos=True)
    outs = {}
    for tp in (1, 2):
        with Engine(EngineConfig(model="tiny-random", device="cpu", dtype="float32", tensor_parallel_size=tp,
                                 num_blocks=64, mode="sync")) as eng:
            outs[tp] = [o.token_ids for o in eng.generate(prompts, params)]
    assert outs[1] == outs[2]


# ------------------------------------------------------------------------------------------------ refusals

@pytest.mark.parametrize("size, family, message", [
    (3, "llama", "does not divide the 4 attention heads"),
    (2, "gpt2", "tensor parallel does not support model type 'gpt2'"),
    (2, "phi3", "tensor parallel does not support model type 'phi3'"),
])
def test_a_model_that_cannot_be_split_is_refused_before_any_rank_starts(checkpoints, size, family, message):
    before = _children()
    with pytest.raises(ConfigError, match=message):
        Engine(EngineConfig(model=checkpoints(family), device="cpu", dtype="float32", tensor_parallel_size=size))
    assert _children() == before


def test_bad_sizes_are_config_errors():
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ConfigError, match="tensor_parallel_size"):
            EngineConfig(model="tiny-random", tensor_parallel_size=bad).validate()


def test_more_ranks_than_gpus_is_refused():
    if torch.cuda.is_available():
        n = torch.cuda.device_count() + 1
        with pytest.raises(ConfigError, match=f"tensor_parallel_size {n} needs GPUs"):
            Engine(EngineConfig(model="tiny-random", device="cuda", tensor_parallel_size=n))
    else:
        with pytest.raises(ConfigError, match="CUDA is not available"):
            Engine(EngineConfig(model="tiny-random", device="cuda", tensor_parallel_size=2))


# ------------------------------------------------------------------------------------------------ telemetry

def test_every_rank_reports_its_spans_to_telemetry(checkpoints):
    from batchscope.telemetry import Telemetry, to_perfetto, validate_timeline

    with Engine(EngineConfig(model=checkpoints("llama"), device="cpu", dtype="float32", tensor_parallel_size=2,
                             num_blocks=64)) as eng:
        with Telemetry(eng, nvml_hz=0) as tel:
            eng.generate(matrix_prompts(), SamplingParams(max_new_tokens=6, ignore_eos=True))
            deadline = time.monotonic() + 20      # rank 1 reports its last steps once rank 0 goes idle
            while time.monotonic() < deadline:
                tl = tel.timeline()
                if {r["step"] for r in tl.get("rank_steps", [])} >= {s["step"] for s in tl["steps"]}:
                    break
                time.sleep(0.05)
    validate_timeline(json.loads(json.dumps(tl)))
    steps = {s["step"]: s for s in tl["steps"]}
    ranks = tl["rank_steps"]
    assert {r["step"] for r in ranks} == set(steps) and {r["rank"] for r in ranks} == {1}
    assert all(s["rank"] == 0 for s in steps.values())
    for r in ranks:
        assert r["mode"] == steps[r["step"]]["mode"]
        c0, c1 = r["compute_us"]
        launch = steps[r["step"]]["cpu"]["launch"]
        # rank 1 runs the step rank 0 relayed before its own launch: on the same clock, they overlap
        assert c0 <= c1 and c0 < launch[1] + 5e5 and c1 > launch[0]
    by_rank = {r["rank"]: r for r in tl["summary"]["ranks"]}
    assert set(by_rank) == {0, 1} and by_rank[1]["steps"] == len(steps)
    assert all(0 < r["busy_pct"] <= 100 for r in by_rank.values())
    names = {e["args"]["name"] for e in to_perfetto(tl)["traceEvents"] if e.get("name") == "process_name"}
    assert "rank 1 cpu" in names


# ------------------------------------------------------------------------------------------------ processes

def _children() -> set[int]:
    import psutil
    return {p.pid for p in psutil.Process().children(recursive=True)}


def test_close_stops_every_rank(checkpoints):
    import psutil

    eng = Engine(EngineConfig(model=checkpoints("llama"), device="cpu", dtype="float32", tensor_parallel_size=2,
                              num_blocks=32))
    peers = [psutil.Process(p.pid) for p in eng._ranks.procs]
    assert all(p.is_running() for p in peers)
    eng.close()
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in peers)


def test_a_rank_that_dies_fails_what_runs_and_refuses_new_requests(checkpoints):
    """A peer killed mid-run: the request in flight ends with an error naming the rank, the engine thread keeps
    going, and a new request is refused at once with the reason (no step ever waits for the missing rank)."""
    eng = Engine(EngineConfig(model=checkpoints("llama"), device="cpu", dtype="float32", tensor_parallel_size=2,
                              num_blocks=64))
    try:
        handle = eng.submit([5, 6, 7], SamplingParams(max_new_tokens=100000, ignore_eos=True), stream=False)
        deadline = time.monotonic() + 30
        while eng.stats()["steps"] < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
        eng._ranks.procs[0].kill()
        out = handle.result(timeout=60)
        assert out.finish_reason == "error" and out.error
        deadline = time.monotonic() + 10
        while not eng._ranks.lost and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(EngineUnavailable, match="tensor-parallel rank 1"):
            eng.submit([1, 2, 3], SamplingParams(max_new_tokens=2))
        assert eng._thread.is_alive()
    finally:
        eng.close()


_RANK0 = """
import sys, time
from batchscope.engine import Engine, EngineConfig, SamplingParams
eng = Engine(EngineConfig(model=sys.argv[1], device="cpu", dtype="float32", tensor_parallel_size=2, num_blocks=32))
print(" ".join(str(p.pid) for p in eng._ranks.procs), flush=True)
eng.submit([5, 6, 7], SamplingParams(max_new_tokens=100000, ignore_eos=True))   # keep every rank busy
time.sleep(600)
"""


def test_killing_rank_0_leaves_no_rank_behind(checkpoints):
    """SIGKILL on rank 0 mid-run (its peers inside collectives): the peers notice and exit within seconds."""
    import psutil

    proc = subprocess.Popen([sys.executable, "-c", _RANK0, checkpoints("llama")], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert pids, "rank 0 did not start its peers"
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        deadline = time.monotonic() + 15
        alive = pids
        while alive and time.monotonic() < deadline:
            alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
            time.sleep(0.1)
        assert not alive, f"ranks {alive} outlived rank 0"
    finally:
        proc.kill()


def test_serve_takes_tensor_parallel_size():
    import httpx

    from helpers import serve_subprocess

    with serve_subprocess("-tp", "2") as url:
        info = httpx.get(url + "/api/status", timeout=10).json()
        assert '"tensor_parallel_size": 2' in json.dumps(info)
        out = httpx.post(url + "/api/generate", json={"prompt": "hello there", "max_new_tokens": 4},
                         timeout=60).json()
        assert out["output_tokens"] == 4 or len(out.get("token_ids", [])) == 4, out


# ------------------------------------------------------------------------------------------------ CUDA (2 GPUs)

_CUDA_MATRIX = """
import json, sys
sys.path[:0] = [sys.argv[2], sys.argv[2] + '/engine']
from test_model_matrix import build_checkpoint, run_matrix_family
from test_model_matrix import FAMILIES
family, changes = sys.argv[1], json.loads(sys.argv[3])
FAMILIES["x"] = (FAMILIES[family][0], {**FAMILIES[family][1], **changes})
path = build_checkpoint("x", sys.argv[4])
res = run_matrix_family(path, "cuda", tensor_parallel_size=2)
print("RESULT " + json.dumps({"modes": res["modes"], "preempted": res["preempted"], "chunked": res["chunked"],
                              "ranks": res["info"]["ranks"], "note": res["graphs_note"]}), flush=True)
from batchscope.engine.parallel.ranks import leave
leave(0)
"""


def _two_gpus():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two CUDA devices")


@pytest.mark.gpu
@pytest.mark.parametrize("family, changes", [("llama", {}), ("llama", {"num_key_value_heads": 1}), ("qwen3", {}),
                                             ("gemma2", {}), ("qwen3_moe", {}), ("mixtral", {})])
def test_tp2_on_cuda_with_graphs_equals_transformers(tmp_path, family, changes):
    """NCCL, decode graphs with the all-reduces inside, fused kernels: float32 tokens equal transformers'.
    Each engine in its own process (one NCCL group per process)."""
    _two_gpus()
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))     # tests/, for helpers and engine/
    out = subprocess.run([sys.executable, "-c", _CUDA_MATRIX, family, here, json.dumps(changes),
                          str(tmp_path / "ckpt")], capture_output=True, text=True, timeout=600)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line, out.stdout[-3000:] + out.stderr[-5000:]
    res = json.loads(line[len("RESULT "):])
    assert all(r["cuda_graphs"] for r in res["ranks"]), res
    assert res["note"] is None, res["note"]
    _assert_exact(res, f"{family} {changes} on CUDA at TP=2")


_FAILING_PEER = """
import sys
if "batchscope.engine.peer" in sys.orig_argv:      # only in the ranks the engine starts
    import torch

    def refuse(n):
        raise RuntimeError("this rank may not set its threads")
    torch.set_num_threads = refuse
"""


def test_a_rank_that_fails_before_the_rendezvous_is_reported_not_waited_for(checkpoints, tmp_path, monkeypatch):
    """A rank whose start fails early (here: setting its CPU threads raises, through a sitecustomize only the
    ranks load) makes Engine() raise with its reason within seconds, instead of leaving rank 0 waiting in the
    process-group rendezvous."""
    (tmp_path / "sitecustomize.py").write_text(_FAILING_PEER)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])))
    before = _children()        # (processes earlier tests started and that are still going are not this one's)
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="rank 1.*may not set its threads"):
        Engine(EngineConfig(model=checkpoints("llama"), device="cpu", dtype="float32", tensor_parallel_size=2,
                            num_blocks=32))
    assert time.monotonic() - t0 < 60
    assert not _children() - before
