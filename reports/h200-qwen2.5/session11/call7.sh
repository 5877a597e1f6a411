#!/usr/bin/env bash
# session11 call7 (main + one token of every 4-bit shape on gemv_q4 + Tokenizer.encode through
# encode_batch_fast): the whole GPU suite, the server's TTFT at 16 / 256-token prompts (16 requests each), the
# single-stream decode bench of the 7B bf16 and AWQ.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s11}; mkdir -p "$OUT"; R=/tmp/res-s11c7; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
TEST_TIMEOUT=330 gpu_tests
step "server TTFT"
python3 -m llmrs serve --synthetic qwen2.5-7b --device cuda --max-num-seqs 256 --port 8123 >"$R/serve.log" 2>&1 &
SRV=$!
if wait_health 8123 150; then
  for n in 16 256; do
    timeout 60 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len $n --output-len 2 --ignore-eos \
      --workers 1 -o $R -c 1 -n 16 --label ttft --name ttft-in$n > "$R/bench-in$n.log" 2>&1
    python3 - "$R/ttft-in$n.json" $n <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["runs"][0]["summary"]
t = s["ttft_ms"]
print(f"prompt {int(sys.argv[2]):4d}: TTFT min {t['min']:.2f}  median {t.get('median', t.get('p50')):.2f}"
      f"  mean {t['mean']:.2f} ms ({s['completed']} requests)")
PY
  done
  curl -s http://127.0.0.1:8123/metrics | grep -E "^llmrs:time_to_first_token_seconds_(sum|count)" 
fi
kill -INT $SRV; wait $SRV
for q in "" "--quant awq"; do
  step "decode bench 7B $q"
  timeout 150 python3 -m llmrs synth --like qwen2.5-7b $q --decode-bench --bandwidth-gbs 4296 --prompt-len 256 \
    --steps 256 --json $R/decode-7b${q:+-awq}.json 2>&1 | grep -E "ms_per_token|rror"
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
