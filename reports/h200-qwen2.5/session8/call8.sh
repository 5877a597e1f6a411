#!/usr/bin/env bash
# Session 8, call 8 (carry .whl): LLMRS_HTTP_STACK=h11 (asyncio + h11) after the IPPROTO_TCP / TCP_NODELAY fix of the
# serve socket: TTFT and end-to-end latency one request at a time (prompts 1 and 256, 2 new tokens, 12 requests).
cd "$(dirname "$0")/../../.."
export OUT=${OUT:-/tmp/llmrs-s8c8}; mkdir -p $OUT; R=/tmp/res-s8c8; mkdir -p $R
. scripts/gpu_lib.sh; use_wheels
{
step "serve 7B, LLMRS_HTTP_STACK=h11, fixed socket"
LLMRS_HTTP_STACK=h11 python3 -m llmrs serve --synthetic qwen2.5-7b --device cuda --max-num-seqs 16 --port 8123 \
  > $R/serve.log 2>&1 &
srv=$!
wait_health 8123 150 || { tail -20 $R/serve.log; kill $srv; exit 1; }
for n in 1 256; do
  timeout 60 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len $n --output-len 2 --ignore-eos \
    --workers 1 -o $R -c 1 -n 12 --label h11-in$n --name h11-in$n > $R/h11-in$n.log 2>&1
  echo "prompt $n:"; grep -E "TTFT|E2E" $R/h11-in$n.log | head -4
done
kill -INT $srv; wait $srv
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
