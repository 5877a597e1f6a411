#!/usr/bin/env bash
# One call on a lent H200: programmatic dependent launch (PDL) in the decode graphs, checked and measured.
#   GPU tests (graphs vs eager with PDL, every kernel), then the single-stream decode bench (prompt 256, 256
#   tokens) of synthetic Qwen2.5 0.5B / 3B / 7B (+ 7B AWQ) with LLMRS_PDL=0 and 1 side by side, twice each.
# Results: $OUT/summary.txt + $OUT/results.tgz. Expects wheels in .whl/. TESTS=0 skips the tests.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-pdl}; mkdir -p "$OUT"; R=/tmp/res-pdl; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
{
if [ "${TESTS:-1}" = 1 ]; then
  step "GPU tests"; LLMRS_GPU_REPORT=$R/gpu_figures.jsonl timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -m gpu \
    -p no:cacheprovider -rs tests ${TEST_ARGS:-} > $R/gpu_tests.log 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed|SKIPPED|capture" $R/gpu_tests.log | tail -15
fi
for p in ${MODELS:-qwen2.5-0.5b qwen2.5-3b qwen2.5-7b}; do
  for run in 1 2; do
    for pdl in 0 1; do
      LLMRS_PDL=$pdl timeout 120 python3 -m llmrs synth --like $p --decode-bench --bandwidth-gbs 4296 --prompt-len 256 \
        --steps 256 --json $R/decode-$p-pdl$pdl-run$run.json > $R/decode-$p-pdl$pdl-run$run.log 2>&1
      python3 - $R/decode-$p-pdl$pdl-run$run.json "$p pdl=$pdl run $run" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
    print(f"{sys.argv[2]:28s} {r['ms_per_token']:.3f} ms/token  {100 * r['fraction_of_floor_measured']:.1f}% of floor")
except Exception as e:
    print(sys.argv[2], "FAILED", e)
PY
    done
  done
done
if [ "${AWQ:-1}" = 1 ]; then
  for pdl in 0 1; do
    LLMRS_PDL=$pdl timeout 150 python3 -m llmrs synth --like qwen2.5-7b --quant awq --decode-bench --bandwidth-gbs 4296 \
      --prompt-len 256 --steps 256 --json $R/decode-7b-awq-pdl$pdl.json 2>&1 | grep -E "ms_per_token|rror"
  done
fi
} 2>&1 | tee $OUT/summary.txt
grep -h "capture\|Traceback" $R/*.log | sort | uniq -c | head >> $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
