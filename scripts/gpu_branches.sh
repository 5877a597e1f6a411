#!/usr/bin/env bash
# One call on a lent H200 for experiment branches: each branch's tree, extracted here beforehand (the device copy
# has no .git):
#   for b in BRANCH...; do mkdir -p _$b && git archive exp/$b llmrs tests scripts | tar -x -C _$b; done
# then, in one call: `TREES="_a _b" bash scripts/gpu_branches.sh` (carry .whl), which runs
#   1. main's `pytest -m gpu tests` and each tree's $TREE_TESTS (default: the kernel, attention, prefill, graph and
#      4-bit GEMV tests), all at once (correctness only: nothing is timed while they share the GPU);
#   2. the single-stream decode bench of $MODELS (default 0.5B / 3B / 7B) for main and each tree, RUNS times
#      (scripts/gpu_ab.sh with the values `1 tree=DIR...`), and the 7B AWQ one (AWQ=0 skips);
#   3. scripts/bench_kernels_graph.py --like $KBENCH_MODEL (default qwen2.5-7b) for main and each tree (KBENCH=0
#      skips), each kernel inside a graph.
# Extra A/Bs of main go in EXTRA (run after, as `bash -c "$EXTRA"`), e.g.
#   EXTRA='TESTS=0 AWQ=0 MODELS=qwen2.5-0.5b AB_VAR=LLMRS_ATTN_KERNEL AB_VALUES="auto partial" bash scripts/gpu_ab.sh'
# Output: $OUT/summary.txt (the short table last) + $OUT/results.tgz. Delete the _* trees before committing.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-branches}; mkdir -p "$OUT"; R=/tmp/res-branches; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
TREE_TESTS=${TREE_TESTS:-tests/test_cuda_kernels.py tests/test_attention_gqa_gpu.py tests/test_prefill_attention_gpu.py tests/test_cuda_graphs.py tests/test_gemv_q4_gpu.py}
{
step "GPU tests: main and ${TREES:-no trees}, at once"
(timeout ${TEST_TIMEOUT:-330} python3 -m pytest -q -m gpu -p no:cacheprovider tests > $R/tests-main.log 2>&1) &
for d in ${TREES:-}; do
  (cd $d && PYTHONPATH=$PWD:/tmp/site timeout ${TEST_TIMEOUT:-330} python3 -m pytest -q -m gpu -p no:cacheprovider \
    $TREE_TESTS > $R/tests-$(basename $d).log 2>&1) &
done
wait
for f in $R/tests-*.log; do echo "$(basename $f .log): $(grep -E '^(FAILED|ERROR)' $f | head -5) $(tail -1 $f)"; done
step "single-stream decode: main and each tree"
values="1"
for d in ${TREES:-}; do values="$values tree=$(realpath $d)"; done
OUT=$R/ab TESTS=0 RUNS=${RUNS:-1} AB_VALUES="$values" bash scripts/gpu_ab.sh 2>&1 | grep -v '^$'
if [ "${KBENCH:-1}" = 1 ]; then
  for d in . ${TREES:-}; do
    step "kernels inside graphs, ${KBENCH_MODEL:-qwen2.5-7b}, $(basename $(realpath $d))"
    (cd $d && PYTHONPATH=$PWD:/tmp/site timeout 120 python3 scripts/bench_kernels_graph.py \
      --like ${KBENCH_MODEL:-qwen2.5-7b} --context 512 > $R/kg-$(basename $(realpath $d)).txt 2>&1)
    grep -E "matvec|attention .*(auto)|choice|rms_norm" $R/kg-$(basename $(realpath $d)).txt
  done
fi
if [ -n "${EXTRA:-}" ]; then
  step "extra: $EXTRA"
  OUT=$R/extra bash -c "$EXTRA" 2>&1 | grep -v '^$'
fi
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
