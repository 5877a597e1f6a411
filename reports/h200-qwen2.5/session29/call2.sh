#!/usr/bin/env bash
# Session 29, calls 2 and 3 (carry .gguf with one part of the GGUF, moved to /tmp/models; wheels from call 1 in
# /tmp/site): the idle spin (LLMRS_IDLE_SPIN_MS, new) A/B on fresh synthetic Qwen2.5-7B servers, 0 / auto (20 ms)
# alternated: TTFT at a 256-token prompt (24 requests one at a time), one stream (4 requests), 256 concurrent once.
# CALL=2 (default): part p01, off first, seeds from 5000; CALL=3 (call3.sh): part p02, on first, seeds from 6000.
set -uo pipefail
export PYTHONUNBUFFERED=1
CALL=${CALL:-2}
if [ "$CALL" = 2 ]; then PART=p01 ORDER="0 auto 0 auto 0 auto" SEED=5000
else PART=p02 ORDER="auto 0 auto 0 auto 0" SEED=6000; fi
OUT=${OUT:-/tmp/llmrs-s29}; mkdir -p "$OUT"; R=/tmp/res-s29c$CALL; rm -rf $R; mkdir -p $R
mkdir -p /tmp/models && mv .gguf/$PART /tmp/models/$PART
. scripts/gpu_lib.sh
export PYTHONPATH=$PWD:/tmp/site
{
i=0
for v in $ORDER; do
  i=$((i + 1))
  serve_up spin$v-$i LLMRS_IDLE_SPIN_MS=$v && {
    ttft_bench ttft-spin$v-s$i 256 $((SEED + i)) "spin=$v s$i"
    timeout 60 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 --output-len 256 --ignore-eos \
      --workers 1 -o $R -c 1 -n 4 --seed $((SEED + 100 + i)) --name c1-spin$v-s$i 2>&1 | grep -E "TPOT" | head -1
    load_bench bench-7b-spin$v-s$i-c256 256 $((SEED + 200 + i))
    bench_table $R | grep "spin$v-s$i-"
    serve_down
  }
done
} 2>&1 | tee $OUT/call$CALL.log
tar -C $R -cJf $OUT/bench.tar.xz $(cd $R && ls *.json serve-*.log 2>/dev/null)
