#!/usr/bin/env bash
# One call on a lent H200 for exp/gemm-q4-addr (carry .whl and _base = `git archive main llmrs` made beforehand):
# the 4-bit GEMM (17-64 tokens) with its stage loads' addresses computed once a thread (StageLoader) and stage
# indices by counters. Written without a GPU: `llmrs ptx-check --sass` counts 871 -> 437 instructions in
# gemm_q4z_m4's main loop (static; the old one also ran inner copy loops MT times).
#   1. the 4-bit GPU tests, with the GEMM's timing figures beside dequantize + cuBLAS at T 16..1024 (-s): if the
#      GEMM now wins above 64 tokens, raise cuda_q4gemm.MAX_TOKENS (session 10: it lost from 65 on; 256 tokens is
#      the 256-concurrent decode step, issue 6's under-load target);
#   2. `llmrs profile --synthetic qwen2.5-7b-awq --batch 16,32,64` main (_base) vs this tree (session 9 call3:
#      B=16 6.68, B=64 7.94 ms a step; bf16 B=64 5.79);
#   3. the 7B AWQ through the server, 64 / 256 concurrent (session 10 call9: 6.9-7.0k / 13.0-13.3k tok/s).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-gq4}; mkdir -p "$OUT"; R=/tmp/res-gq4; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
step "4-bit GPU tests (GEMM timing printed)"
timeout 300 python3 -m pytest -q -s -m gpu -p no:cacheprovider tests/test_gemm_q4_gpu.py tests/test_quant_gpu.py \
  tests/test_gemv_q4_gpu.py > $R/tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed|^N[0-9]+ K[0-9]+ T" $R/tests.log | tail -30
for tree in _base .; do
  step "profile 7B AWQ B=16,32,64 from $tree"
  (cd $tree && PYTHONPATH=$PWD:/tmp/site timeout 150 python3 -m llmrs profile --synthetic qwen2.5-7b-awq \
    --batch 16,32,64 --context 512 --steps 3) > $R/profile-awq-$(basename $(cd $tree && pwd)).txt 2>&1
  grep -E "step wall|gemm_q4|gemm gate_up|gemm down" $R/profile-awq-$(basename $(cd $tree && pwd)).txt | head -8
done
SERVE_MODEL=qwen2.5-7b-awq serve_bench awq-gq4
python3 - $R <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/bench-7b-*.json")):
    for r in json.load(open(f))["runs"]:
        s = r["summary"]
        print(f"{f.split('/')[-1]:40s} {s['output_throughput']:8.0f} tok/s  TPOT {s['tpot_ms']['mean']:.2f}")
PY
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
