#!/usr/bin/env bash
# One lent H200: where a single stream's time to first token goes. `llmrs serve --synthetic qwen2.5-7b`, then one
# request at a time (C1_REQUESTS each, 2 new tokens) at prompt lengths $LENS (default 1 16 64 256): TTFT at one
# token is the fixed cost (HTTP, tokenizer, scheduler, the step's launches, sampling, the first SSE event), the
# rise with the prompt is the prefill; then `llmrs profile` of the same model's prefill at those lengths (GPU time
# of the step). Results: $OUT/summary.txt + $OUT/results.tgz. Expects wheels in .whl/.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-ttft}; mkdir -p "$OUT"; R=/tmp/res-ttft; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
LENS=${LENS:-1 16 64 256}
{
step "serve synthetic qwen2.5-7b"
python3 -m llmrs serve --synthetic qwen2.5-7b --device cuda --max-num-seqs 256 --port 8123 >"$R/serve.log" 2>&1 &
SRV=$!
wait_health 8123 150 || { tail -20 "$R/serve.log"; kill $SRV; exit 1; }
for n in $LENS; do
  timeout 60 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len $n --output-len 2 --ignore-eos --workers 1 \
    -o $R -c 1 -n ${C1_REQUESTS:-12} --label ttft-$n --name ttft-in$n > "$R/bench-in$n.log" 2>&1
  ttft_line "$R/ttft-in$n.json" $n
done
kill -INT $SRV; wait $SRV
step "profile: prefill step GPU time"
for n in $LENS; do
  [ "$n" -lt 2 ] && continue
  timeout 100 python3 -m llmrs profile --synthetic qwen2.5-7b --batch 1 --context 512 --prefill-len $n --steps 3 \
    --top 4 --out "$R/profile-prefill$n.json" > "$R/profile-prefill$n.txt" 2>&1
  grep -E "step wall|prefill" "$R/profile-prefill$n.txt" | head -3
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
