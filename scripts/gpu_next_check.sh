#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~7 min), what session 11 left unmeasured: `pytest -m gpu tests`, then
#   1. the 7B's TTFT with `llmrs bench`'s own HTTP/1.1 client (llmrs/bench/http1.py; session 11's H200 figures,
#      min 10.34 / median 10.67 ms at a 256-token prompt, went through httpx, ~0.7-1 ms of client time on a VM):
#      scripts/ttft_probe.sh's server part at prompts 1 and 256, then the same with LLMRS_BENCH_HTTPX=1 beside it,
#      then a traced run (LLMRS_TRACE_FILE, llmrs/trace.py): the median time of each hop of a 256-token request
#      (client, app, route, core, steps, SSE), to see where the server's ~2 ms (session 11) go on the GPU host;
#   2. the 256-sequence AWQ step with qkv and o through the 4-bit GEMM (128-token tiles) instead of dequantize +
#      cuBLAS: `llmrs profile --synthetic qwen2.5-7b-awq --batch 256` with LLMRS_Q4_GEMM_MAX_TOKENS_SMALL 192
#      (default) and 256 (kernel figures at T 256: qkv 61.0 vs 76.5 us, o not measured);
#   3. if 256 wins: the AWQ server at 64 / 256 concurrent with it (session 11: 8.1-8.4k / 12.8-13.6k tok/s; bf16
#      15.5-16.0k at 256); then make 256 the default (cuda_q4gemm.MAX_TOKENS_SMALL) and run `pytest -m gpu tests`.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-next}; mkdir -p "$OUT"; R=/tmp/res-next; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
TEST_TIMEOUT=300 gpu_tests  # the whole GPU suite first: session 11's last code changes ran on the CPU only
step "TTFT, synthetic qwen2.5-7b: llmrs bench's http1 client, then httpx"
python3 -m llmrs serve --synthetic qwen2.5-7b --device cuda --max-num-seqs 256 --port 8123 >"$R/serve.log" 2>&1 &
SRV=$!
if wait_health 8123 150; then
  for client in http1 httpx; do
    for n in 1 256; do
      LLMRS_BENCH_HTTPX=$([ $client = httpx ] && echo 1 || echo 0) timeout 60 python3 -m llmrs bench \
        --url http://127.0.0.1:8123 --input-len $n --output-len 2 --ignore-eos --workers 1 -o $R -c 1 -n 16 \
        --seed $(( $([ $client = http1 ] && echo 100 || echo 200) + n )) --label ttft-$client --name ttft-$client-in$n > "$R/bench-$client-in$n.log" 2>&1
      ttft_line "$R/ttft-$client-in$n.json" $n $client
    done
  done
fi
kill -INT $SRV; wait $SRV
step "TTFT traced (LLMRS_TRACE_FILE: every hop of each request, scripts/ttft_trace.py)"
LLMRS_TRACE_FILE=$R/trace.txt python3 -m llmrs serve --synthetic qwen2.5-7b --device cuda --max-num-seqs 256 \
  --port 8123 >"$R/serve-traced.log" 2>&1 &
SRV=$!
if wait_health 8123 150; then
  LLMRS_TRACE_FILE=$R/trace.txt timeout 60 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 \
    --output-len 2 --ignore-eos --workers 1 -o $R -c 1 -n 20 --label traced --name ttft-traced > "$R/bench-traced.log" 2>&1
  python3 scripts/ttft_trace.py $R/trace.txt --json $R/trace-summary.json
fi
kill -INT $SRV; wait $SRV
for v in 192 256; do
  step "profile 7B AWQ B=256, LLMRS_Q4_GEMM_MAX_TOKENS_SMALL=$v"
  LLMRS_Q4_GEMM_MAX_TOKENS_SMALL=$v timeout 150 python3 -m llmrs profile --synthetic qwen2.5-7b-awq --batch 256 \
    --context 512 --steps 3 > $R/profile-awq-small$v.txt 2>&1
  grep -E "step wall|gemm_q4|dequant|gemm " $R/profile-awq-small$v.txt | head -12
done
LLMRS_Q4_GEMM_MAX_TOKENS_SMALL=256 SERVE_MODEL=qwen2.5-7b-awq serve_bench awq-small256 > $R/serve-awq.txt 2>&1
bench_table $R
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
