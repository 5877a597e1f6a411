#!/usr/bin/env bash
# Session 28, call 4 (carry .whl, ~5 min): the issue's evidence for every model size through the server: synthetic
# Qwen2.5-0.5B, -3B and -7B bf16, each on a fresh `llmrs serve`: one stream (8 requests one at a time) and, for
# the 0.5B and 3B, 256 concurrent twice (prompt 256, 256 new tokens, every run its own prompts; the 7B's 256 are
# calls 1 and 3). First the engine-process and CUDA parity GPU tests on the final tree.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s28}; mkdir -p "$OUT"; R=/tmp/res-s28c4; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TEST_TIMEOUT=200 TEST_PATHS="tests/test_engine_process.py tests/test_cuda_parity.py" gpu_tests; cp $R/gpu_tests.log $OUT/
for m in 0.5b 3b 7b; do
  step "server: synthetic qwen2.5-$m bf16"
  SERVE_MODEL=qwen2.5-$m serve_up $m && {
    timeout 120 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 --output-len 256 --ignore-eos \
      --workers 1 -o $R -c 1 -n 8 --seed 2900 --label qwen2.5-$m --name bench-$m-c1 > $R/bench-$m-c1.log 2>&1
    if [ $m != 7b ]; then
      for run in 1 2; do
        timeout 120 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 --output-len 256 --ignore-eos \
          --workers 8 -o $R -c 256 -n 256 --seed $((2900 + run)) --label qwen2.5-$m --name bench-$m-run$run-c256 \
          > $R/bench-$m-run$run-c256.log 2>&1
      done
    fi
    serve_down
  }
done
step "table"
python3 - $R <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/bench-*.json")):
    s = json.load(open(f))["runs"][0]["summary"]
    print(f"{f.split('/')[-1]:28s} {s['output_throughput']:8.0f} tok/s  TPOT mean {s['tpot_ms']['mean']:.3f} ms  "
          f"TTFT median {s['ttft_ms']['median']:.2f} ms  ITL median {s['itl_ms']['median']:.3f} ms")
PY
} 2>&1 | tee $OUT/call4.log
tar -C $R -cJf $OUT/bench.tar.xz $(cd $R && ls bench-*.json serve-*.log 2>/dev/null)
