#!/usr/bin/env bash
# NOT RUN: session 27 had no device time left (59 s of budget at its start). Prepared for the next session (carry
# .whl, ~6 min): the flush of a long server-loop pass (LLMRS_FLUSH_EVERY_MS, session 26) over three fresh 7B bf16
# servers. (1) GPU tests of the attention, graphs, parity, the engine process and the profile; (2) three fresh
# synthetic Qwen2.5-7B bf16 servers: each a 256-token-prompt TTFT line (24 requests one at a time), 256 concurrent
# three times, 64 concurrent once (prompt 256, 256 new tokens, every run its own prompts); the table last.
# Then a fourth, traced server's first burst (scripts/burst_trace.py: the server intake's largest gap).
# Apply decode_attn_tc_pin_first_table_read.patch first (and test_early_loads' decode_attn_tc rule -> 3) to A/B it.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s27}; mkdir -p "$OUT"; R=/tmp/res-s27c1; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
TEST_TIMEOUT=300 TEST_PATHS="tests/test_attention_tc_gpu.py tests/test_cuda_graphs.py tests/test_cuda_parity.py \
tests/test_engine_process.py tests/test_profile.py" gpu_tests
cp $R/gpu_tests.log $OUT/
for s in 1 2 3; do
  step "server s$s: 7B bf16, TTFT at 256, 256 concurrent x3, 64 x1"
  serve_up s$s && {
    ttft_bench ttft-7b-s$s 256 $((2700 + s)) "s$s"
    for run in 1 2 3; do load_bench bench-7b-s$s-run$run-c256 256 $((2710 + 10 * s + run)); done
    load_bench bench-7b-s$s-run4-c64 64 $((2750 + s))
    serve_down
  }
done
step "traced server: the first burst of a fresh server (the lifespan's anyio warm-up: no stall after request 1)"
export LLMRS_TRACE_FILE=$R/trace.txt
serve_up traced && { load_bench bench-7b-traced-run1-c256 256 2791; serve_down; }
unset LLMRS_TRACE_FILE
python3 scripts/burst_trace.py $R/trace.txt --steps 12; xz -T4 -c $R/trace.txt > $OUT/trace.txt.xz
step "table"
python3 - $R <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/bench-7b-*.json")):
    s = json.load(open(f))["runs"][0]["summary"]
    print(f"{f.split('/')[-1]:30s} {s['output_throughput']:8.0f} tok/s  duration {s['duration_s']:.3f} s  "
          f"TTFT min {s['ttft_ms']['min']:.0f} max {s['ttft_ms']['max']:.0f} ms  ITL median {s['itl_ms']['median']:.2f} ms")
PY
tar -C $R -cJf $OUT/bench.tar.xz $(cd $R && ls bench-7b-*.json ttft-7b-*.json serve-*.log 2>/dev/null)
} 2>&1 | tee $OUT/call1.log
