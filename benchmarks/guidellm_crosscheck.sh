#!/usr/bin/env bash
# GuideLLM against batchscope's own sweep, on the same server, at the same rate and request shape, alternating
# so that a machine's drift hits both: per pair, GuideLLM synchronous, GuideLLM constant@RATE, then one
# `batchscope sweep` (its synchronous and constant@RATE points; its throughput point is not compared). The sweep's
# in-flight cap (MAX_CONCURRENCY, default 32) must stay above what the rate keeps in flight: GuideLLM sends every
# arrival, a capped sweep would skip some. GuideLLM's client runs GUIDELLM__MAX_WORKER_PROCESSES processes (10
# by default), which on a small machine compete with the server for its cores.
# Needs guidellm on PATH (pip install guidellm; it is not a batchscope dependency) and a local tokenizer
# folder (GuideLLM builds its synthetic prompts with it; nothing is downloaded).
#   usage: benchmarks/guidellm_crosscheck.sh URL OUTDIR [RATE] [SECONDS] [PAIRS]
#   then:  python benchmarks/guidellm_compare.py OUTDIR
set -euo pipefail
URL=$1; OUT=$2; RATE=${3:-0.6}; SECS=${4:-40}; PAIRS=${5:-3}; MAX_CONCURRENCY=${MAX_CONCURRENCY:-32}
TOKENIZER=${TOKENIZER:-$HOME/.cache/batchscope/smollm2-tokenizer}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1
mkdir -p "$OUT"
MODEL=$(curl -s "$URL/v1/models" | python3 -c 'import json, sys; print(json.load(sys.stdin)["data"][0]["id"])')

guidellm_run() {       # PROFILE OUTFILE
  guidellm run --backend "kind=openai_http,target=$URL,model=$MODEL,request_format=/v1/completions" \
    --profile "$1" --constraint "kind=max_duration,seconds=$SECS" \
    --data kind=synthetic_text,prompt_tokens=64,output_tokens=32 \
    --tokenizer "kind=huggingface_auto,model=$TOKENIZER" --metrics kind=generative,sample_size=0 \
    --output "kind=json,path=$2" --disable-console-interactive > "$2.log" 2>&1
}

for i in $(seq 1 "$PAIRS"); do
  guidellm_run kind=synchronous "$OUT/guidellm-sync-$i.json"
  guidellm_run "kind=constant,rate=$RATE" "$OUT/guidellm-constant-$i.json"
  batchscope sweep --url "$URL" --modes async --rates "$RATE" --duration "$SECS" --prompt-tokens 64 \
    --output-tokens 32 --max-concurrency "$MAX_CONCURRENCY" --seed "$i" --quiet --out "$OUT/batchscope-$i.json"
  echo "pair $i done"
done
rm -f "$OUT"/*.json.log
