#!/usr/bin/env bash
# Issue #42 on one H200: the adaptive per-step token budget against fixed ones, llama3-8b-random bf16.
#   prefill  32 x 4000-token prompts x 64 new, sync and async: adaptive vs fixed 8192 vs fixed 256
#            (goal: adaptive within 5% of 8192's wall)
#   served   240 requests, Poisson at 12 and 40 req/s, prompts 128-1024, new 64-512, seed 11, async:
#            adaptive vs fixed 256 (goals: ITL p99/p50 <= 2, TTFT no worse than 256)
#   long     40 requests, Poisson at 3 req/s, prompts 2048-8192, new 64-256, seed 11, async: adaptive vs 256
# Usage: benchmarks/budget_h200.sh [prefill] [served] [long]   (none: all three; ~6-7 min with model loads)
# Writes $OUT/<run>.json (bench's results), $OUT/<run>.log, gzipped timelines next to them, $OUT/summary.txt;
# prints one table at the end, the adaptive runs' fitted step-time models, and the model's one-step-ahead error
# over the recorded steps. Each run is independent: a failed one prints "FAILED <run>" and the rest go on.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
MODEL=${MODEL:-llama3-8b-random}
DEVICE=${DEVICE:-cuda}
LIMIT_S=${LIMIT_S:-520}             # no run starts after this many seconds (the GPU machine allows 9 minutes)
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if ! python3 -c "import batchscope.engine" 2>/dev/null; then   # a bare GPU image: install from carried wheels
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || echo "FAILED wheels"
  fi
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . || echo "FAILED install"
fi
[[ -d .bscache ]] && export BATCHSCOPE_CACHE=$PWD/.bscache
what=" ${*:-prefill served long} "
begin=$(date +%s)
git rev-parse --short HEAD 2>/dev/null | sed 's/^/commit /' | tee "$OUT/gpu.txt"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$OUT/gpu.txt"

BENCH="python3 -m batchscope.app.bench --model $MODEL --device $DEVICE --no-progress"
run() {   # run NAME ARGS...: one bench process (one model load), its JSON, log and timelines under $OUT
  local name=$1; shift
  local t=$(date +%s)
  if (( t - begin > LIMIT_S )); then echo "SKIPPED $name (past ${LIMIT_S} s)"; return; fi
  timeout 240 $BENCH "$@" --out "$OUT/$name.json" > "$OUT/$name.log" 2>&1 \
    || { echo "FAILED $name (rc $?)"; tail -5 "$OUT/$name.log"; }
  gzip -f "$OUT/$name".*timeline.json 2>/dev/null
  echo "$name $(( $(date +%s) - t )) s"
}
if [[ $what == *" prefill "* ]]; then
  for b in adaptive 8192 256; do
    run "prefill_$b" --requests 32 --prompt-tokens 4000 --new-tokens 64 --modes sync,async --max-batch-tokens $b
  done
fi
SERVED="--workload served --max-running 64 --requests 240 --prompt-tokens 128:1024 --new-tokens 64:512
  --arrival poisson --seed 11 --modes async"
if [[ $what == *" served "* ]]; then
  for rate in 12 40; do
    for b in adaptive 256; do run "served_r${rate}_$b" $SERVED --rate $rate --max-batch-tokens $b; done
  done
fi
LONG="--workload served --max-running 64 --requests 40 --prompt-tokens 2048:8192 --new-tokens 64:256
  --arrival poisson --seed 11 --modes async --rate 3"
if [[ $what == *" long "* ]]; then
  for b in adaptive 256; do run "long_r3_$b" $LONG --max-batch-tokens $b; done
fi

python3 - "$OUT" <<'EOF' 2>&1 | tee "$OUT/summary.txt" || echo "FAILED summary"
import json, os, sys
out = sys.argv[1]

def load(name):
    try:
        with open(os.path.join(out, name + ".json")) as f:
            return {r.get("mode"): r for r in json.load(f)["runs"] if r.get("system", "batchscope") == "batchscope"}
    except Exception as exc:            # a failed or skipped run: say so, keep going
        print(f"{name}: no result ({type(exc).__name__})")
        return {}

def steps(run):
    """Prefill-carrying steps and their p50 ms, by budget reason."""
    parts = []
    for reason, b in sorted((run.get("budget") or {}).items()):
        ms = (b.get("prefill_step_ms") or {}).get("p50")
        parts.append(f"{reason} {b.get('with_prefill', 0)}/{b.get('steps', 0)}" + (f" @{ms:.1f}ms" if ms else ""))
    return ", ".join(parts)

print("prefill-heavy: 32 x 4000 prompt x 64 new (goal: adaptive wall within 5% of fixed 8192)")
ref = load("prefill_8192")
for b in ("adaptive", "8192", "256"):
    runs = load(f"prefill_{b}")
    for mode in ("async", "sync"):
        r = runs.get(mode)
        if not r:
            continue
        base = ref.get(mode, {}).get("wall_s")
        vs = f"{100 * (r['wall_s'] / base - 1):+6.1f}%" if base else "   n/a"
        print(f"  {b:>8} {mode:<5} wall {r['wall_s']:6.2f} s  vs 8192 {vs}  steps {r.get('steps')}  "
              f"[{steps(r)}]")

def served(title, names):
    print(title)
    base = {}
    for name in names:
        r = load(name).get("async")
        if not r:
            continue
        lat = r.get("latency_ms", {})
        itl, ttft = lat.get("itl", {}), lat.get("ttft", {})
        if name.endswith("_256"):
            base = ttft
        print(f"  {name:<20} ITL p50/p99 {itl.get('p50', 0):6.2f}/{itl.get('p99', 0):6.2f} ms  "
              f"p99/p50 {r.get('itl_p99_over_p50') or 0:4.2f}  TTFT p50/p99 {ttft.get('p50', 0):7.1f}/"
              f"{ttft.get('p99', 0):7.1f} ms  out tok/s {r.get('output_tokens_per_s', 0):7.0f}  "
              f"ok {r.get('lengths_ok')}  [{steps(r)}]")
    return base

for rate in (12, 40):
    served(f"served at {rate}/s: prompts 128-1024, new 64-512 (goals: p99/p50 <= 2, TTFT no worse than 256)",
           [f"served_r{rate}_256", f"served_r{rate}_adaptive"])
served("long prompts at 3/s: prompts 2048-8192, new 64-256", ["long_r3_256", "long_r3_adaptive"])

print("the adaptive runs' step-time model at their end (engine_info.budget)")
for name in ("prefill_adaptive", "served_r12_adaptive", "served_r40_adaptive", "long_r3_adaptive"):
    try:
        with open(os.path.join(out, name + ".json")) as f:
            budget = json.load(f)["engine_info"]["budget"]
        model = budget["step_time_model"]
        print(f"  {name:<20} {model.get('coefficients')} error {model.get('error_pct')}% knee "
              f"{model.get('knee_tokens')} steps {model.get('steps_seen')} backlog {budget.get('backlog')}")
    except Exception as exc:
        print(f"  {name:<20} none ({type(exc).__name__})")
EOF
echo "the model's one-step-ahead error over these runs' steps (benchmarks/budget_h200.py replay):"
python3 benchmarks/budget_h200.py replay "$OUT"/*.async.timeline.json.gz 2>&1 | tee -a "$OUT/summary.txt" \
  || echo "FAILED replay"
ls "$OUT" > /dev/null
echo "done in $(( $(date +%s) - begin )) s"
