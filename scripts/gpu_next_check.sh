#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~5 min), what the fifteenth session left unmeasured:
#   1. what bounds the 4-bit wgmma GEMM (gemm_q4wgz, on by default on Hopper at 128-256 tokens) at 256 tokens: the
#      7B's gate_up / down run at 39-42% of the FLOP roof in the 256-sequence AWQ step (session 15 call11) where
#      bf16 cuBLAS reaches ~80%: Nsight Compute on it for the 7B's four linears at T 256 (tensor pipe, shared
#      memory, issue slots, stall reasons): is it the in-warpgroup decode, the stage barriers or the B operand?
#   2. the server TTFT's server-to-server spread (session 13: medians 9.67-11.25 ms over 10 fresh servers of the same
#      code, the engine alone 7.31-7.52): four fresh servers, each traced (LLMRS_TRACE_FILE), 24 new 256-token prompts:
#      which segment (app, route / tokenize, core, step, GPU, SSE) carries the difference between a slow and a fast
#      server.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-next}; mkdir -p "$OUT"; R=/tmp/res-next; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
ROOT=$PWD
{
if [ -z "${NEXT_SKIP_NCU:-}" ]; then  # NEXT_SKIP_NCU=1: the traced servers only
step "ncu: gemm_q4 (the wgmma form) at 256 tokens"
timeout 300 /usr/local/cuda/bin/ncu --clock-control none --section SpeedOfLight --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section SchedulerStats --section WarpStateStats --section Occupancy \
  --metrics "regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio" -k "regex:gemm_q4(wg|w2)?[zm]" \
  python3 scripts/ncu_linears.py --tokens 256 --kinds gemm --labels $R/gemm-labels.json > $R/ncu-gemm.txt 2>&1
python3 scripts/ncu_summary.py $R/ncu-gemm.txt --labels $R/gemm-labels.json 2>&1 | tail -8
grep -E "Compute \(SM\) Throughput|Memory Throughput|L1/TEX Cache Throughput|Issue Slots Busy|Executed Ipc A" \
  $R/ncu-gemm.txt | head -24
fi
for i in 1 2 3 4; do
  step "traced server $i"
  rm -f $R/trace-$i.txt
  serve_up traced-$i LLMRS_TRACE_FILE=$R/trace-$i.txt || continue
  LLMRS_TRACE_FILE=$R/trace-$i.txt ttft_bench traced-$i 256 $((3000 + i)) "server $i"
  python3 scripts/ttft_trace.py $R/trace-$i.txt --skip 2 --json $R/trace-$i.json | tail -14
  serve_down
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
