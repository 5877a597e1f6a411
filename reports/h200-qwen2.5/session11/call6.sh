#!/usr/bin/env bash
# session11 call6: the 7B AWQ single-stream decode with one token of every 4-bit shape on gemv_q4
# (LLMRS_Q4_GEMV_K_PER_N=0; default 4: qkv / o on matvec_q4; call2's bench: qkv gemv S=3 7.55 us vs matvec_q4
# 9.65, o 6.66 vs 6.44), then the bf16 7B through the server at 1 / 64 / 256 (issue 8's 16k at 256, last measured
# in session 9).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-s11}; mkdir -p "$OUT"; R=/tmp/res-s11c6; rm -rf $R; mkdir -p $R
. scripts/gpu_lib.sh
use_wheels || exit 1
OUT=$OUT/ab TESTS=0 MODELS="" AWQ=1 AB_VAR=LLMRS_Q4_GEMV_K_PER_N AB_VALUES="4 0 4 0" \
  bash scripts/gpu_ab.sh 2>&1 | grep -E "AWQ|ms_per|rror" | tee $OUT/summary.txt
{
serve_bench bf16 > $R/serve-bf16.txt 2>&1
python3 - $R <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/bench-7b-*.json")):
    for r in json.load(open(f))["runs"]:
        s = r["summary"]
        print(f"{f.split('/')[-1]:40s} {s['output_throughput']:8.0f} tok/s  TPOT {s['tpot_ms']['mean']:.2f}  "
              f"TTFT median {s['ttft_ms'].get('median', s['ttft_ms'].get('p50')):.1f}")
PY
} 2>&1 | tee -a $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
