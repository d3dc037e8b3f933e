#!/usr/bin/env bash
# Batch scaling of the decode step: llama3-8b-random, 256-token prompts, 512 new tokens, sync and async, at 1, 8,
# 32, 64, 128 and 256 requests; both floors (bandwidth and roofline) and busy % per mode. One process per size.
#   OUT=out bash benchmarks/batch_scaling.sh [sizes...]
OUT=${OUT:-out}
mkdir -p "$OUT"
for n in ${*:-1 8 32 64 128 256}; do
  python3 -m batchscope.app.bench --model llama3-8b-random --device cuda --requests "$n" --prompt-tokens 256 \
    --new-tokens 512 --modes sync,async --out "$OUT/scale_$n.json" --no-progress 2>&1 | tail -4
  rm -f "$OUT"/scale_"$n".*.timeline.json
done
python3 - "$OUT" ${*:-1 8 32 64 128 256} <<'PY'
import json, sys, pathlib
rows = []
for n in sys.argv[2:]:                  # the sizes this run measured, not whatever else lies in the folder
    d = json.loads((pathlib.Path(sys.argv[1]) / f"scale_{n}.json").read_text())
    r, fl = d["results"], d["floor"]
    rows.append((d["workload"]["requests"], fl["ms_per_step"], fl["roofline"]["ms_per_step"],
                 (fl.get("roofline_held") or {}).get("ms_per_step"), r["sync"]["decode_ms_per_step"],
                 r["async"]["decode_ms_per_step"], r["sync"]["gpu_busy_pct"], r["async"]["gpu_busy_pct"],
                 fl["gemm_peak"]["tflops"], fl["gemm_peak"].get("held_tflops"), r["async"].get("sm_clock_mhz")))
print("requests floor roofline held_roofline sync_ms async_ms sync_busy async_busy tflops held_tflops async_mhz")
for row in rows:
    print(*row)
PY
