#!/usr/bin/env bash
# The what-if's accuracy on a GPU: record the served workload once (async, 12 req/s, prompts 128-1024, outputs
# 64-512, seed 11), then for each setting predict it from that recording and run it for real (--verify).
# Usage: benchmarks/whatif_h200.sh [record] [SETTING ...]     e.g. record max_batch_tokens=512 mode=sync
#   record: make $OUT/served.async.timeline.json.gz (else it is read from $RECORDING)
# Writes $OUT/whatif-<setting>.json per setting and prints one line each: predicted vs measured.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
REQUESTS=${REQUESTS:-200}
MODEL=${MODEL:-llama3-8b-random}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if ! python3 -c "import batchscope.engine" 2>/dev/null; then   # a bare GPU image: install from carried wheels
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  fi
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . || exit 1
fi
BS="python3 -m batchscope"
RECORDING=${RECORDING:-$OUT/served.async.timeline.json.gz}
if [[ "${1:-}" == record ]]; then
  shift
  start=$(date +%s)
  $BS bench --model "$MODEL" --device "$DEVICE" --workload served --requests "$REQUESTS" --rate 12 \
      --prompt-tokens 128:1024 --new-tokens 64:512 --seed 11 --modes async --no-progress \
      --out "$OUT/served.json" > "$OUT/record.log" 2>&1 || { echo "FAILED record"; tail -20 "$OUT/record.log"; }
  timeline=$(ls "$OUT"/served*.async*.timeline.json* 2>/dev/null | head -1)
  [[ -n "$timeline" && "$timeline" != *.gz ]] && gzip -f "$timeline" && timeline="$timeline.gz"
  [[ -n "$timeline" && "$timeline" != "$RECORDING" ]] && mv "$timeline" "$RECORDING"
  echo "recorded $RECORDING in $(( $(date +%s) - start )) s"
fi
for s in "$@"; do
  start=$(date +%s)
  name=whatif-${s//=/-}
  $BS whatif "$RECORDING" --set "$s" --verify --json "$OUT/$name.json" > "$OUT/$name.log" 2>&1 \
      || { echo "FAILED $s"; tail -5 "$OUT/$name.log"; continue; }
  python3 - "$OUT/$name.json" "$s" "$(( $(date +%s) - start ))" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
for mode, m in r["modes"].items():
    p, e = m["predicted"], m.get("error_pct") or {}
    def pct(key, q=None):
        v = e.get(key, {}).get(q) if q else e.get(key)
        return "unknown" if v is None else f"{v:+.1f}%"
    print(f"{sys.argv[2]:<22} {mode:<5} tok/s {pct('output_tokens_per_s')}  TTFT p50 {pct('ttft_ms', 'p50')}  "
          f"ITL p50 {pct('itl_ms', 'p50')}  TPOT p50 {pct('tpot_ms', 'p50')}  E2E p50 {pct('e2e_ms', 'p50')}  "
          f"busy {pct('busy_pct')}  preemptions {p.get('preemptions')}  ({sys.argv[3]} s)")
EOF
done
