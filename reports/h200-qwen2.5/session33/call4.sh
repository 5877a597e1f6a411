#!/usr/bin/env bash
# Session 33, call 4 (no carry): gemv_q4's cluster merge through st.async + mbarrier (no MEMBAR.ALL.GPU).
# _base/ holds the tree before (git archive of the previous commit's llmrs/, untracked). GPU tests of the 4-bit
# GEMV (the cluster path's bits against the L2 hand-off, pairs, norms, graph + PDL chains), then the decode bench,
# one run a process, alternated: 7B AWQ new / base x 2, 3B AWQ new / base.
set -uo pipefail
export PYTHONUNBUFFERED=1
R=/tmp/res4; rm -rf $R; mkdir -p $R
bench() {  # name, tree, preset, args...
  local name=$1 tree=$2 p=$3; shift 3
  (cd $tree && PYTHONPATH=$tree timeout 200 python3 -m llmrs synth --like $p "$@" --decode-bench --bandwidth-gbs 4296 \
    --prompt-len 256 --steps 256 --json $R/decode-$name.json > $R/decode-$name.log 2>&1)
  python3 -c "import json; d=json.load(open('$R/decode-$name.json')); print('$name:', d['ms_per_token'], 'ms/token')" \
    || tail -5 $R/decode-$name.log
}
{
PYTHONPATH=$PWD timeout 280 python3 -m pytest -q -m gpu tests/test_gemv_q4_gpu.py -p no:cacheprovider \
  > $R/gpu_tests.log 2>&1
grep -E "passed|failed|^FAILED|^E " $R/gpu_tests.log | head -12
for i in 1 2; do
  bench 7bawq-new$i $PWD qwen2.5-7b --quant awq
  bench 7bawq-base$i $PWD/_base qwen2.5-7b --quant awq
done
bench 3bawq-new $PWD qwen2.5-3b --quant awq
bench 3bawq-base $PWD/_base qwen2.5-3b --quant awq
} 2>&1 | tee $OUT/call4.log
tar czf $OUT/results.tgz -C $R .
