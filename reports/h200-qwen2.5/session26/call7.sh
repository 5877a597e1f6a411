#!/usr/bin/env bash
# Session 26, call 7 (carry .whl, ~5 min): the final tree (the RoPE fusion reverted, the tile loads kept).
# `llmrs profile` runs, 7B bf16, 64 / 256 decodes at context 384, LLMRS_ROPE_IN_ATTENTION 1 / 0 (step walls, the
# attention's and rope_write_kv's eager times); (3) one fresh 7B bf16 server, 256 concurrent three times and 64
# once (prompt 256, 256 new tokens, every run its own prompts).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s26}; mkdir -p "$OUT"; R=/tmp/res-s26c7; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
TEST_TIMEOUT=400 TEST_PATHS="tests/test_attention_tc_gpu.py tests/test_cuda_graphs.py tests/test_cuda_parity.py tests/test_prefill_graphs.py tests/test_profile.py" gpu_tests
cp $R/gpu_tests.log $OUT/; grep -E "7B attention B=" $R/gpu_tests.log | head -4
step "server: 7B bf16, 256 concurrent x3, 64 x1"
serve_up s1 && {
  for run in 1 2 3; do load_bench bench-7b-s1-run$run-c256 256 $((7100 + run)); done
  load_bench bench-7b-s1-run4-c64 64 7104
  serve_down
}
python3 - $R <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/bench-7b-*.json")):
    s = json.load(open(f))["runs"][0]["summary"]
    print(f"{f.split('/')[-1]:30s} {s['output_throughput']:8.0f} tok/s  duration {s['duration_s']:.3f} s  "
          f"TTFT max {s['ttft_ms']['max']:.0f} ms  ITL median {s['itl_ms']['median']:.2f} ms")
PY
} 2>&1 | tee $OUT/call7.log
