#!/usr/bin/env bash
# Session 26, call 9 (carry .whl, ~3 min): the adds of a long server-loop pass written as they come (FLUSH_EVERY_S,
# 1 ms): one fresh traced 7B bf16 server, 256 concurrent three times (prompt 256, 256 new tokens, new prompts), then
# scripts/burst_trace.py (arrival at the core, the burst steps).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s26}; mkdir -p "$OUT"; R=/tmp/res-s26c9; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
export LLMRS_TRACE_FILE=$R/trace.txt
{
step "traced server: 7B bf16, 256 concurrent x3"
serve_up s1 && {
  for run in 1 2 3; do load_bench bench-7b-s1-run$run-c256 256 $((9100 + run)); done
  serve_down
}
unset LLMRS_TRACE_FILE
python3 - $R <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/bench-7b-*.json")):
    s = json.load(open(f))["runs"][0]["summary"]
    print(f"{f.split('/')[-1]:30s} {s['output_throughput']:8.0f} tok/s  duration {s['duration_s']:.3f} s  "
          f"TTFT min {s['ttft_ms']['min']:.0f} max {s['ttft_ms']['max']:.0f} ms  ITL median {s['itl_ms']['median']:.2f} ms")
PY
step "burst"
python3 scripts/burst_trace.py $R/trace.txt --steps 14
python3 scripts/step_trace_runs.py $R/trace.txt --gap 0.5
wc -l $R/trace.txt; xz -T4 -c $R/trace.txt > $OUT/trace.txt.xz
} 2>&1 | tee $OUT/call9.log
