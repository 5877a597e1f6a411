#!/usr/bin/env bash
# session11 call4 (main with both branches merged and cuda_q4gemm.MAX_TOKENS 64 -> 192): the whole GPU suite, the
# bf16 GEMM forms of a prefill / large-batch step (scripts/bench_gemm_bf16.py), the 7B AWQ through the server.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s11}; mkdir -p "$OUT"; R=/tmp/res-s11c4; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
TEST_TIMEOUT=330 gpu_tests
step "bf16 GEMM forms (7B shapes)"
timeout 120 python3 scripts/bench_gemm_bf16.py --tokens 64,128,256,512 --splits 2,4 --json $R/gemm-bf16.json
SERVE_MODEL=qwen2.5-7b-awq serve_bench awq-mt192 > $R/serve-awq.txt 2>&1
python3 - $R <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/bench-7b-*.json")):
    for r in json.load(open(f))["runs"]:
        s = r["summary"]
        print(f"{f.split('/')[-1]:40s} {s['output_throughput']:8.0f} tok/s  TPOT {s['tpot_ms']['mean']:.2f}")
PY
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
