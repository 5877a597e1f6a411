#!/usr/bin/env bash
# Session 35 (written, not run; no carry): what bounds the 4-bit GEMV. scripts/bench_gemv_q4.py times, for the 7B's
# and the 3B's four linears at one token, inside CUDA graphs over copies spanning 320 MB: the kernel, its code stream
# alone (-DGV_ABLATE_MATH, held at 4 blocks an SM by -DGV_ABLATE_PAD=39000; also without the pad: more warps), and its
# math alone (-DGV_ABLATE_LOADS). Stream ~ kernel: the bytes are the limit (access pattern, grid); math ~ kernel: the
# instructions; both well under the kernel: their overlap (latency with 16 warps an SM). ~2-3 min.
set -uo pipefail
export PYTHONUNBUFFERED=1
R=/tmp/res-s35c3; rm -rf $R; mkdir -p $R
V='-DGV_ABLATE_MATH -DGV_ABLATE_PAD=39000;-DGV_ABLATE_MATH;-DGV_ABLATE_LOADS'
{
for p in qwen2.5-7b qwen2.5-3b; do
  echo "=== $p"
  PYTHONPATH=$PWD timeout 240 python3 scripts/bench_gemv_q4.py --preset $p --splits 1,2,4 --variants "$V" \
    --json $R/gemv-$p.json 2>&1 | grep -v "^\s*$" | grep -E "variant|gemv_q4|matvec_q4|layers" | grep -v " l2 "
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
