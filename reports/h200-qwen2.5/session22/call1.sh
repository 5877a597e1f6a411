#!/usr/bin/env bash
# Session 22, call 1 (carry .whl, ~6 min), after session21/call1.sh ran on this lease (its results in
# session22/README.md): the one test that failed there for a test bug (its resident_blocks stand-in took 2 arguments,
# the backend passes 4) again; then the decode A/Bs, best of 3 a process, of the two switches whose kernels did not
# lose in call1's graphed timings: matvec_streamk (in the engine only the 7B's / 3B's down and the lm_head take it: o
# goes to matvec_rows first) and attn_cluster_warps=16. pair_streamk and q4_streamk lost per kernel (left out).
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s22c1; mkdir -p $R
{
step "the stream-K matvec test"
timeout 120 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_kernels.py -k streamk > $R/tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $R/tests.log | tail -8
step "decode best of 3 a process: off / on"
for p in qwen2.5-7b qwen2.5-3b; do
  timeout 200 python3 scripts/ablate_decode.py --like $p --rounds 3 \
    --variants "full/set:matvec_streamk=True/set:attn_cluster_warps=16/set:matvec_streamk=True,attn_cluster_warps=16" \
    --json $R/ab-$p.json > $R/ab-$p.log 2>&1
  tail -6 $R/ab-$p.log; grep -B1 "kernels:" $R/ab-$p.log | grep -v "^--" | sed 's/^qwen.*round 1 *//'
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
