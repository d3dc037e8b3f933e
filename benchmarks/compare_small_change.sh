#!/usr/bin/env bash
# The smallest real change `batchscope compare` is asked to find on a GPU: programmatic dependent launch off
# (BATCHSCOPE_DEPENDENT_LAUNCH=0, about 3% on a decode step in docs/BENCHMARKS.md's A/B), against the same build
# with it on. Each side is one bench process of three repeats (32 x 256 prompt x 128 new, async); then compare
# one repeat a side and all three a side, and the A/A pair of two repeats of the base.
# Usage: OUT=dir benchmarks/compare_small_change.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if ! python3 -c "import batchscope.engine" 2>/dev/null; then   # a bare GPU image: install from carried wheels
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  fi
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . || exit 1
fi
BENCH="python3 -m batchscope.app.bench --model ${MODEL:-llama3-8b-random} --device ${DEVICE:-cuda} --no-progress
       --requests 32 --prompt-tokens 256 --new-tokens ${NEW_TOKENS:-128} --modes async --repeats 3"
$BENCH --out "$OUT/pdl_on.json" > "$OUT/pdl_on.log" 2>&1 || echo "FAILED pdl_on"
BATCHSCOPE_DEPENDENT_LAUNCH=0 $BENCH --out "$OUT/pdl_off.json" > "$OUT/pdl_off.log" 2>&1 || echo "FAILED pdl_off"
tail -n 4 "$OUT/pdl_on.log" "$OUT/pdl_off.log"
compare() {   # name, then compare's arguments
  local name=$1; shift
  python3 -m batchscope compare "$@" --json "$OUT/compare_$name.json" > "$OUT/compare_$name.txt" 2>&1
  echo "== $name: exit $?"; head -12 "$OUT/compare_$name.txt"
}
ls "$OUT"
compare one_a_side "$(ls "$OUT"/pdl_on.*timeline.json* | head -1)" "$(ls "$OUT"/pdl_off.*timeline.json* | head -1)"
compare three_a_side "$OUT/pdl_on.json#async" -- "$OUT/pdl_off.json#async"
