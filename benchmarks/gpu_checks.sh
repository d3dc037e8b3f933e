#!/usr/bin/env bash
# One pass over everything that needs a CUDA device: the gpu-marked tests, the attention kernel check and
# timings, and the engine benchmark against transformers. Logs and JSON land in $OUT (default ./out).
# Usage: benchmarks/gpu_checks.sh [overlap|tests|kernels|tuning|fused|profile|demo|bench-a|bench-a-engine|
#                                  bench-b|bench-c|determinism|moe|soak|telemetry|telemetry-sync|
#                                  tp-tests|tp-bench|tp-transformers|tp-scale4|tp-scale8|served|
#                                  served-transformers|all]...
set -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
what=${*:-all}
has() { [[ " $what " == *" $1 "* || " $what " == *" all "* ]]; }
# A GPU image with torch, transformers and triton but without this project: install it (and any wheels carried
# in .whl/, e.g. the server's packages and setuptools) into /tmp/site, with no network.
if ! python3 -c "import batchscope.engine" 2>/dev/null; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  fi
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . || exit 1
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
if has overlap; then   # the quick engine checks: overlap from step traces, no hidden synchronisation
  python3 -m pytest -q -p no:cacheprovider tests/engine/test_engine_gpu.py -k "fills or hidden" 2>&1 | tee "$OUT/overlap.log"
fi
if has tests; then
  python3 -m pytest -q -p no:cacheprovider -m gpu tests/engine/test_engine_gpu.py tests/unit/test_attention_triton.py \
    tests/unit/test_fused.py tests/engine/test_projections.py tests/unit/test_residual_norm.py tests/unit/test_skinny_gemm.py \
    tests/unit/test_dependent_launch.py \
    tests/engine/test_model_matrix.py -rs 2>&1 | tee "$OUT/gpu_tests.log"
fi
if has kernels; then
  python3 benchmarks/attention_kernels.py --out "$OUT/attention.json" 2>&1 | tee "$OUT/attention.log"
fi
if has tuning; then     # the decode kernel's launch settings at the engine's shape
  python3 benchmarks/decode_tuning.py --out "$OUT/decode_tuning.json" 2>&1 | tee "$OUT/decode_tuning.log"
fi
if has fused; then
  python3 benchmarks/fused_kernels.py --out "$OUT/fused.json" 2>&1 | tee "$OUT/fused.log"
fi
if has profile; then    # where a decode step's GPU time goes, with and without merged projections
  python3 benchmarks/decode_profile.py --out "$OUT/profile.json" 2>&1 | tee "$OUT/profile.log"
  python3 benchmarks/decode_profile.py --merge-projections 0 --out "$OUT/profile_unmerged.json" 2>&1 \
    | tee "$OUT/profile_unmerged.log"
fi
if has demo; then      # a timeline with live switches, for `batchscope replay` and the README screenshot
  python3 benchmarks/demo_timeline.py --out "$OUT/demo.timeline.json" 2>&1 | tee "$OUT/demo.log"
fi
BENCH="python3 -m batchscope.app.bench --model llama3-8b-random --device cuda --requests 32 --prompt-tokens 256"
if has bench-a; then   # (a) the headline workload, side by side with transformers' continuous batching
  $BENCH --new-tokens 512 --modes sync,async --baseline transformers --out "$OUT/bench_a.json" --no-progress \
    2>&1 | tee "$OUT/bench_a.log"
fi
if has bench-a-engine; then   # (a) without the baseline: batchscope's two modes only
  $BENCH --new-tokens 512 --modes sync,async --out "$OUT/bench_a_engine.json" --no-progress \
    2>&1 | tee "$OUT/bench_a_engine.log"
fi
# The served workload: 240 requests, prompts 128-1024 and 64-512 new tokens (EOS ignored), Poisson
# arrivals, seed 11, 64 running at most; the same seeded requests in both modes.
SERVED="python3 -m batchscope.app.bench --workload served --model llama3-8b-random --device cuda --max-running 64
  --requests 240 --prompt-tokens 128:1024 --new-tokens 64:512 --arrival poisson --seed 11 --modes sync,async
  --no-progress"
if has served; then    # both operating points, sync and async, then where each run's idle sits by step kind
  for rate in 12 40; do
    $SERVED --rate $rate --out "$OUT/served_r$rate.json" 2>&1 | tee "$OUT/served_r$rate.log"
    python3 benchmarks/served_idle.py "$OUT/served_r$rate.sync.timeline.json" \
      "$OUT/served_r$rate.async.timeline.json" --json "$OUT/served_r${rate}_idle.json" 2>&1 \
      | tee -a "$OUT/served_r$rate.log"
  done
fi
if has served-transformers; then   # the same requests through transformers' continuous batching, all at once
  $SERVED --rate 12 --baseline transformers --out "$OUT/served_r12_tf.json" 2>&1 | tee "$OUT/served_r12_tf.log"
fi
if has telemetry; then  # event spans vs torch.profiler, idle gaps per mode, NVML beside event busy %
  python3 benchmarks/telemetry_gpu_check.py --pairs 12 --overhead-tokens 384 --window-tokens 384 --budget-s 520 \
    --out "$OUT" 2>&1 | tee "$OUT/telemetry_check.log"
fi
if has telemetry-sync; then  # telemetry's cost in sync mode: many short ABBA pairs, then part by part
  python3 benchmarks/telemetry_gpu_check.py --sections overhead --overhead-modes sync --pairs 30 \
    --overhead-tokens 128 --budget-s 280 --out "$OUT/sync_pairs" 2>&1 | tee "$OUT/telemetry_sync_pairs.log"
  python3 benchmarks/telemetry_overhead_probe.py --rounds 6 --variants off,on --out "$OUT/telemetry_probe.json" \
    2>&1 | tee "$OUT/telemetry_probe.log"
fi
if has determinism; then   # the same greedy prompts, run after run and mode after mode: one token digest
  $BENCH --new-tokens 2048 --modes sync,async --repeats 2 --no-telemetry --out "$OUT/determinism.json" \
    --no-progress 2>&1 | tee "$OUT/determinism.log"
  echo "bench exit code: $?" | tee -a "$OUT/determinism.log"
fi
if has tp-tests; then   # tensor parallel on two GPUs: NCCL, all-reduces inside the decode graphs, exact tokens
  python3 -m pytest -q -p no:cacheprovider -m gpu tests/server/test_tensor_parallel.py -rs 2>&1 | tee "$OUT/tp_tests.log"
fi
if has tp-bench; then   # Llama-3-70B shapes over two GPUs, sync against async; Llama-3-8B at TP=2 and TP=1
  for spec in "llama3-70b-random 2" "llama3-8b-random 2" "llama3-8b-random 1"; do
    set -- $spec
    python3 -m batchscope.app.bench --model "$1" -tp "$2" --device cuda --requests 32 --prompt-tokens 256 \
      --new-tokens 512 --modes sync,async --out "$OUT/bench_tp_${1%%-random}_tp$2.json" --no-progress \
      2>&1 | tee "$OUT/bench_tp_${1%%-random}_tp$2.log"
  done
fi
if has tp-scale4 || has tp-scale8; then   # 4 and 8 GPUs: Llama-3-70B shapes at 32 and 128 requests, then 405B
  for tp in 4 8; do
    has tp-scale$tp || continue
    [ "$(nvidia-smi -L | wc -l)" -ge $tp ] || { echo "tp-scale$tp: fewer than $tp GPUs here" | tee -a "$OUT/tp_scale.log"; continue; }
    for n in 32 128; do
      python3 -m batchscope.app.bench --model llama3-70b-random -tp $tp --device cuda --requests $n \
        --prompt-tokens 256 --new-tokens 512 --modes sync,async --out "$OUT/bench_tp_llama3-70b_tp${tp}_r$n.json" \
        --no-progress 2>&1 | tail -6 | tee -a "$OUT/tp_scale.log"
    done
  done
  if has tp-scale8 && [ "$(nvidia-smi -L | wc -l)" -ge 8 ]; then   # 405B shapes over 8 GPUs, async -> sync -> async switched live
    python3 benchmarks/demo_timeline.py --model llama3-405b-random -tp 8 --phase-s 20 \
      --out "$OUT/demo_405b_tp8.timeline.json" 2>&1 | tail -3 | tee -a "$OUT/tp_scale.log"
  fi
fi
if has tp-transformers; then   # transformers' own tensor parallel (tp_plan="auto") with continuous batching
  torchrun --nproc-per-node 2 benchmarks/transformers_tp.py --model llama3-8b-random --out "$OUT/tf_tp_8b.json" \
    2>&1 | tail -40 | tee "$OUT/tf_tp.log"
fi
if has moe; then   # the MoE benchmark model side by side with transformers, and its routed-experts floor
  python3 -m batchscope.app.bench --model qwen3-30b-a3b-random --device cuda --requests 32 --prompt-tokens 256 \
    --new-tokens 512 --modes sync,async --baseline transformers --out "$OUT/bench_moe.json" --no-progress \
    2>&1 | tee "$OUT/bench_moe.log"
  python3 benchmarks/moe_floor.py --requests 32 --prompt-tokens 256 --context 512 --out "$OUT/moe_floor.json" \
    2>&1 | tee "$OUT/moe_floor.log"
fi
if has soak; then  # a served llama3-8b-random driven by batchscope soak: lost, duplicated, RSS, KV leaks
  python3 -m batchscope.app.cli serve --model llama3-8b-random --device cuda --no-ui --port 7861 \
    > "$OUT/soak_serve.log" 2>&1 &
  server=$!
  python3 -c "import time, urllib.request as u
for _ in range(300):
    try: u.urlopen('http://127.0.0.1:7861/api/health', timeout=2); break
    except Exception: time.sleep(1)"
  python3 -m batchscope.app.soak --url http://127.0.0.1:7861 --requests "${SOAK_REQUESTS:-4000}" \
    --concurrency 32 --flip-every 0.5 --viewers 10 --max-new-tokens 64 --json "$OUT/soak_h200.json" \
    2>&1 | tee "$OUT/soak_h200.log"
  kill $server; wait $server
fi
if has bench-b; then   # (b) the seed workload: 8192 new tokens per request
  $BENCH --new-tokens 8192 --modes sync,async --out "$OUT/bench_b.json" --no-progress 2>&1 | tee "$OUT/bench_b.log"
fi
if has bench-c; then   # (c) telemetry on vs off, alternating
  $BENCH --new-tokens 512 --modes async --repeats 3 --out "$OUT/bench_c_on.json" --no-progress 2>&1 | tee "$OUT/bench_c.log"
  $BENCH --new-tokens 512 --modes async --repeats 3 --no-telemetry --out "$OUT/bench_c_off.json" --no-progress \
    2>&1 | tee -a "$OUT/bench_c.log"
fi
