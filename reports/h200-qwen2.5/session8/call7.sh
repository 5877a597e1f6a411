#!/usr/bin/env bash
# Session 8, call 7 (carry .whl and .whl-http): which import turns LLMRS_HTTP_STACK=h11 (asyncio + h11 pinned) into a
# steady ~43 ms per 2-token request (calls 5, 6) while uvicorn's auto choice of the same pair (nothing installed)
# answers in ~10 ms: h11 pinned with nothing, with only httptools, with only uvloop importable.
cd "$(dirname "$0")/../../.."
export OUT=${OUT:-/tmp/llmrs-s8c7}; mkdir -p $OUT; R=/tmp/res-s8c7; mkdir -p $R
. scripts/gpu_lib.sh; use_wheels
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-httptools .whl-http/httptools*.whl
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-uvloop .whl-http/uvloop*.whl
{
for v in none httptools uvloop; do
  pp=$PYTHONPATH; [ $v != none ] && pp=$PYTHONPATH:/tmp/site-$v
  step "serve 7B, LLMRS_HTTP_STACK=h11, importable: $v"
  LLMRS_HTTP_STACK=h11 PYTHONPATH=$pp python3 -m llmrs serve --synthetic qwen2.5-7b --device cuda --max-num-seqs 16 \
    --port 8123 > $R/serve-$v.log 2>&1 &
  srv=$!
  wait_health 8123 150 || { tail -20 $R/serve-$v.log; kill $srv; continue; }
  timeout 60 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 1 --output-len 2 --ignore-eos \
    --workers 1 -o $R -c 1 -n 12 --label h11-$v --name h11-$v > $R/h11-$v.log 2>&1
  grep -E "TTFT|E2E" $R/h11-$v.log | head -4
  kill -INT $srv; wait $srv
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
