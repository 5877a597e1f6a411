#!/usr/bin/env bash
# Session 16, call 8 (carry .whl): is the server-to-server TTFT spread where the engine core runs? Call 7's traced
# servers (scripts/gpu_next_check.sh, NEXT_SKIP_NCU=1) spent 5.5-5.7 ms of host time enqueueing the 256-token
# prefill's 28 layers on two servers (GPU-bound: the first token at ~10.2 ms) and 7.3-7.6 ms on the other two (the
# first token waits on the host: ~11.7-12.0 ms). Eight fresh traced servers, alternating: the engine core process
# pinned to CPU 8 (all its threads), the API server to 4-7, the client to 0-3; and unpinned.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s16}; mkdir -p "$OUT"; R=/tmp/res-s16c8; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
nproc; lscpu | grep -E "Model name|Thread|Core|Socket|NUMA node" | head -8
for i in 1 2 3 4 5 6 7 8; do
  pin=$((i % 2))
  step "traced server $i (pinned: $pin)"
  rm -f $R/trace-$i.txt
  serve_up traced-$i LLMRS_TRACE_FILE=$R/trace-$i.txt || continue
  core=$(grep -oE "engine core: process [0-9]+" $R/serve-traced-$i.log | head -1 | grep -oE "[0-9]+$")
  pre=""
  if [ $pin = 1 ] && [ -n "$core" ]; then
    taskset -a -pc 8 $core > /dev/null && taskset -a -pc 4-7 $SRV > /dev/null && pre="taskset -c 0-3"
  fi
  LLMRS_TRACE_FILE=$R/trace-$i.txt $pre timeout 120 python3 -m llmrs bench --url http://127.0.0.1:8123 \
    --input-len 256 --output-len 2 --ignore-eos --workers 1 -o $R -c 1 -n 24 --seed $((4000 + i)) \
    --label traced-$i --name traced-$i > "$R/traced-$i.log" 2>&1
  ttft_line "$R/traced-$i.json" 256 "server $i pin $pin"
  python3 scripts/ttft_trace.py $R/trace-$i.txt --skip 2 --json $R/trace-$i.json \
    | grep -E "fwd_begin|fwd_layer28|core_tokens 1|client_first"
  serve_down
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
