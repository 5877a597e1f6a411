#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~7 min): gemv_q4's bulk-copy form (gemm_q4.cu GV_TMA: each warp's codes
# through a ring of shared-memory stages filled by cp.async.bulk + mbarrier) against today's register loads, per
# 7B AWQ shape and K split at 1 and 4 tokens (scripts/bench_gemv_q4.py --variants, outputs checked); then
# (GT_SERVE=1) the 7B AWQ server at 64 / 256 concurrent with LLMRS_Q4_WGMMA=0 / 1 (wgmma up to
# LLMRS_Q4_WGMMA_MAX_TOKENS=256, the forms bench's crossover).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-gt}; mkdir -p "$OUT"; R=/tmp/res-gt; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
V=${GT_VARIANTS:-"-DGV_TMA=1;-DGV_TMA=1 -DGV_STAGES=3;-DGV_TMA=1 -DGV_STAGES=5;-DGV_TMA=1 -DGV_DEPTH=8 -DGV_STAGES=2"}
{
for T in ${GT_TOKENS:-1 4}; do
  step "gemv_q4 forms, T=$T"
  timeout 240 python3 scripts/bench_gemv_q4.py --tokens $T --splits ${GT_SPLITS:-1,2,3,4,6,8} --variants "$V" \
    --json $R/gemv-t$T.json > $R/gemv-t$T.txt 2>&1
  grep -E "variant|choice|layers|WRONG|Error|error" $R/gemv-t$T.txt | head -30
  python3 - "$R/gemv-t$T.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); best = {}
for r in d["rows"]:
    k = (r["shape"], r["kernel"]); best[k] = min(best.get(k, 1e9), r["us"])
shapes = sorted({s for s, _ in best}, key=lambda s: ["qkv", "o", "gate_up", "down"].index(s))
kernels = sorted({k for _, k in best})
for k in kernels:
    us = [best.get((s, k), float("nan")) for s in shapes]
    print(f"{k:50s} " + " ".join(f"{s} {u:7.2f}" for s, u in zip(shapes, us)) + f"  28L {28 * sum(us) / 1e3:.3f} ms")
PY
done
if [ -n "${GT_SERVE:-}" ]; then
  export LLMRS_Q4_WGMMA_MAX_TOKENS=256
  for v in 0 1; do
    step "server qwen2.5-7b-awq, LLMRS_Q4_WGMMA=$v LLMRS_Q4_BF16_INPUT=$v: 64 and 256 concurrent"
    SERVE_MODEL=qwen2.5-7b-awq serve_up awq-wg$v LLMRS_Q4_WGMMA=$v LLMRS_Q4_BF16_INPUT=$v || continue
    for c in 64 256; do load_bench bench-7b-awq-wg$v-c$c $c $((5000 + 10 * v + c)); done
    serve_down
  done
  bench_table $R
fi
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
