#!/usr/bin/env bash
# Session 29, call 5 (carry .whl, ~5 min): where the host time goes on the H200's host, for the next session.
# 1. A traced fresh 7B server with the idle spin (LLMRS_TRACE_FILE): 24 new 256-token prompts one at a time, then
#    scripts/ttft_trace.py: the median time after the client's send of every hop (HTTP, route, core, prefill, back).
# 2. The serving path with a fake runner on this host (scripts/bench_host_overhead.py server, 0.5B's tokenizer, a
#    1.9 ms fake step: the 0.5B's measured 256-decode step), 256 streams, 4 client workers, with the server's
#    cProfile: the host-bound regime of the 0.5B at 256 concurrent without the GPU in it.
# 3. The engine core alone on this host (bench_host_overhead.py engine, 256 sequences, cProfile).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s29}; mkdir -p "$OUT"; R=/tmp/res-s29c5; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
step "traced 7B server, TTFT at 256 tokens"
serve_up traced LLMRS_TRACE_FILE=$R/trace.txt && {
  LLMRS_TRACE_FILE=$R/trace.txt ttft_bench ttft-traced 256 7001 "traced"
  serve_down
  python3 scripts/ttft_trace.py $R/trace.txt --skip 2 --json $R/ttft_trace.json
}
step "fake-runner server, 0.5B tokenizer, 256 streams, 1.9 ms steps"
timeout 200 python3 scripts/bench_host_overhead.py server --model synthetic:qwen2.5-0.5b --seqs 256 --rounds 2 \
  --max-tokens 256 --gpu-ms 1.9 --async-scheduling --engine-process --workers 4 --profile \
  --out $R/host-server-0.5b.json 2>&1 | tail -45
step "engine core alone, 256 sequences"
timeout 120 python3 scripts/bench_host_overhead.py engine --model synthetic:qwen2.5-0.5b --seqs 256 --profile \
  --out $R/host-engine-0.5b.json 2>&1 | tail -30
} 2>&1 | tee $OUT/call5.log
cp $R/*.json $R/*.log $OUT/ 2>/dev/null
gzip -c $R/trace.txt > $OUT/trace.txt.gz
