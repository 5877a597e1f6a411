#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~2 min): where a lone 256-token request's first step goes, traced
# (LLMRS_TRACE_FILE: step_planned, fwd_begin / fwd_batch / fwd_layerN / fwd_queued, sample_begin / sample_queued,
# step_launched) in scripts/ttft_engine_probe.py's engine (LLMEngine.from_model), the same built as the server's core
# (--serving), and the server (its core process).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-where}; mkdir -p "$OUT"; R=/tmp/res-where; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
N=${N:-20}
{
for v in plain serving; do
  step "engine probe ($v), traced"
  LLMRS_TRACE_FILE=$R/trace-probe-$v.txt timeout 200 python3 scripts/ttft_engine_probe.py --lens 256 --n $N \
    $([ $v = serving ] && echo --serving) --json $R/probe-$v.json 2>&1 | tail -9
  python3 scripts/ttft_trace.py $R/trace-probe-$v.txt --json $R/trace-probe-$v.json
done
step "server, traced"
if serve_up traced LLMRS_TRACE_FILE=$R/trace-server.txt; then
  TTFT_N=$N LLMRS_TRACE_FILE=$R/trace-server.txt ttft_bench traced 256 11
  python3 scripts/ttft_trace.py $R/trace-server.txt --json $R/trace-server.json
  serve_down
fi
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
