#!/usr/bin/env bash
# session10 call9 (carry .whl; _base = `git archive e3cb5fd llmrs`): gemv_q4 with a group's scales once, a group
# ahead, and a counter for the group; down at one token on gemv_q4 (K >= 4 N), splits rounded down to one round.
#   1. the 4-bit GPU tests; 2. scripts/bench_gemv_q4.py (7B shapes, T = 1); 3. the 7B AWQ single-stream decode
#   bench, e3cb5fd (base) vs this tree; 4. the 7B AWQ through `llmrs serve` (1 stream, 64 / 256 concurrent x2).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s10c9}; mkdir -p "$OUT"; R=/tmp/res-s10c9; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
{
step "4-bit GPU tests"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemv_q4_gpu.py tests/test_quant_gpu.py \
  tests/test_gemm_q4_gpu.py > $R/tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $R/tests.log | tail -8
step "bench_gemv_q4 7B T=1"
timeout 120 python3 scripts/bench_gemv_q4.py --splits 1,4,8 --json $R/gemv-7b.json 2>&1 | grep -E "choice|layers"
} 2>&1 | tee $OUT/summary.txt
OUT=$OUT/ab TESTS=0 MODELS="" AWQ=1 BASE_TREE=$PWD/_base AB_VALUES="base 1 base 1" SERVE_MODELS="qwen2.5-7b-awq" \
  bash scripts/gpu_ab.sh 2>&1 | grep -v '^$' | grep -E "AWQ|ms_per|TPOT|TTFT|tok/s|throughput|===|rror" | head -60
python3 - /tmp/res-ab <<'PY' | tee -a $OUT/summary.txt
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/bench-7b-*.json")):
    for r in json.load(open(f))["runs"]:
        s = r["summary"]; t = s["ttft_ms"]
        print(f"{f.split('/')[-1]:40s} {s['output_throughput']:8.0f} tok/s  TPOT {s['tpot_ms']['mean']:.2f}  "
              f"TTFT mean {t['mean']:.0f} ms")
PY
tar czf $OUT/results.tgz -C $R .
