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
LLMRS_TRACE_FILE=$R/trace-server.txt python3 -m llmrs serve --synthetic qwen2.5-7b --device cuda \
  --max-num-seqs 256 --port 8123 >"$R/serve-traced.log" 2>&1 &
SRV=$!
if wait_health 8123 150; then
  LLMRS_TRACE_FILE=$R/trace-server.txt timeout 60 python3 -m llmrs bench --url http://127.0.0.1:8123 \
    --input-len 256 --output-len 2 --ignore-eos --workers 1 -o $R -c 1 -n $N --label traced --name traced \
    > "$R/bench-traced.log" 2>&1
  python3 scripts/ttft_trace.py $R/trace-server.txt --json $R/trace-server.json
fi
kill -INT $SRV; wait $SRV
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
