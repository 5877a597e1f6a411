#!/usr/bin/env bash
# Session 29, call 2 (carry .gguf with the GGUF's p01, moved to /tmp/models; wheels from call 1 in /tmp/site): the
# idle spin (LLMRS_IDLE_SPIN_MS, new) A/B on fresh synthetic Qwen2.5-7B servers, 0 / auto (20 ms) alternated:
# TTFT at a 256-token prompt (24 requests one at a time), one stream (4 requests), 256 concurrent once.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s29}; mkdir -p "$OUT"; R=/tmp/res-s29c2; rm -rf $R; mkdir -p $R
mkdir -p /tmp/models && mv .gguf/p01 /tmp/models/p01
. scripts/gpu_lib.sh
export PYTHONPATH=$PWD:/tmp/site
{
i=0
for v in 0 auto 0 auto 0 auto; do
  i=$((i + 1))
  serve_up spin$v-$i LLMRS_IDLE_SPIN_MS=$v && {
    ttft_bench ttft-spin$v-s$i 256 $((5000 + i)) "spin=$v s$i"
    timeout 60 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 --output-len 256 --ignore-eos \
      --workers 1 -o $R -c 1 -n 4 --seed $((5100 + i)) --name c1-spin$v-s$i 2>&1 | grep -E "TPOT" | head -1
    load_bench bench-7b-spin$v-s$i-c256 256 $((5200 + i))
    bench_table $R | grep "spin$v-s$i-"
    serve_down
  }
done
} 2>&1 | tee $OUT/call2.log
tar -C $R -cJf $OUT/bench.tar.xz $(cd $R && ls *.json serve-*.log 2>/dev/null)
