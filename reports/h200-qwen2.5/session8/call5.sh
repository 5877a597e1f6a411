#!/usr/bin/env bash
# Session 8, call 5 (carry .whl and .whl-http): the final state. All GPU tests; decode attention inside graphs and
# single-stream decode (0.5B / 3B / 7B, 7B AWQ) with attn_partial's warp_sum8 off / on (LLMRS_ATTN_WARP_SUM8); then
# the HTTP stack A/B through `llmrs serve --synthetic qwen2.5-7b`: asyncio + h11 (LLMRS_HTTP_STACK=h11)
# against uvicorn's auto choice with uvloop + httptools installed (.whl-http): TTFT one request at a time (prompts 1
# and 256, 2 new tokens, 16 requests each) and, with uvloop + httptools, 256 concurrent
# (prompt 256, 256 new tokens, 256 requests; h11's figures: earlier calls).
cd "$(dirname "$0")/../../.."
export OUT=${OUT:-/tmp/llmrs-s8c5}; mkdir -p $OUT; R=/tmp/res-s8c5; mkdir -p $R
. scripts/gpu_lib.sh; use_wheels
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site-http .whl-http/*.whl
{
gpu_tests
for p in qwen2.5-7b qwen2.5-3b qwen2.5-0.5b; do
  for v in 0 1; do
    step "attention inside graphs, $p, context 512, LLMRS_ATTN_WARP_SUM8=$v"
    LLMRS_ATTN_WARP_SUM8=$v timeout 100 python3 scripts/bench_kernels_graph.py --like $p --only attention \
      > $R/kg-$p-sum8$v.txt 2>&1
    grep -E "attention partial|choice" $R/kg-$p-sum8$v.txt
  done
done
OUT=$R/ab TESTS=0 RUNS="1" AB_VAR=LLMRS_ATTN_WARP_SUM8 AB_VALUES="0 1" bash scripts/gpu_ab.sh 2>&1 | grep -v '^$'
for stack in h11 auto; do
  step "serve 7B, LLMRS_HTTP_STACK=$stack"
  LLMRS_HTTP_STACK=$stack PYTHONPATH=$PYTHONPATH:/tmp/site-http python3 -m llmrs serve --synthetic qwen2.5-7b \
    --device cuda --max-num-seqs 256 --port 8123 > $R/serve-$stack.log 2>&1 &
  srv=$!
  wait_health 8123 150 || { tail -20 $R/serve-$stack.log; kill $srv; continue; }
  grep -iE "uvloop|httptools|h11|http stack" $R/serve-$stack.log | head -3
  for n in 1 256; do
    timeout 60 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len $n --output-len 2 --ignore-eos \
      --workers 1 -o $R -c 1 -n 16 --label ttft-$n --name ttft-$stack-in$n > $R/ttft-$stack-in$n.log 2>&1
    python3 - "$R/ttft-$stack-in$n.json" "$stack prompt $n" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["runs"][0]["summary"]
t = s["ttft_ms"]
print(f"{sys.argv[2]:20s} TTFT min {t['min']:.2f}  median {t.get('median', t.get('p50', float('nan'))):.2f}"
      f"  mean {t['mean']:.2f} ms ({s['completed']} requests)")
PY
  done
  [ $stack = auto ] && timeout 120 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 --output-len 256 --ignore-eos \
    --workers 8 -o $R --sweep concurrency=256 -n 256 --label $stack --name c256-$stack 2>&1 | tail -4
  kill -INT $srv; wait $srv
done
} 2>&1 | tee $OUT/summary.txt
cp $R/gpu_tests.log $OUT/ 2>/dev/null
tar czf $OUT/results.tgz -C $R .
