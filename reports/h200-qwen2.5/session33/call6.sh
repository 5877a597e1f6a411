#!/usr/bin/env bash
# Session 33, call 6 (no carry): attn_o_cluster's split pushes through st.async + mbarrier too (no cluster
# barrier with release after them). _base/ = the tree before (untracked copy of llmrs/). attn_o GPU tests, then
# the 3B bf16 decode bench (attn_o_cluster8_w8 every layer), new / base alternated x 2.
set -uo pipefail
export PYTHONUNBUFFERED=1
R=/tmp/res6; rm -rf $R; mkdir -p $R
bench() {  # name, tree, preset, args...
  local name=$1 tree=$2 p=$3; shift 3
  (cd $tree && PYTHONPATH=$tree timeout 200 python3 -m llmrs synth --like $p "$@" --decode-bench --bandwidth-gbs 4296 \
    --prompt-len 256 --steps 256 --json $R/decode-$name.json > $R/decode-$name.log 2>&1)
  python3 -c "import json; d=json.load(open('$R/decode-$name.json')); print('$name:', d['ms_per_token'], 'ms/token')" \
    || tail -5 $R/decode-$name.log
}
{
PYTHONPATH=$PWD timeout 200 python3 -m pytest -q -m gpu tests/test_attention_o_gpu.py -p no:cacheprovider \
  > $R/gpu_tests.log 2>&1
grep -E "passed|failed|^FAILED|^E " $R/gpu_tests.log | head -12
for i in 1 2; do
  bench 3b-new$i $PWD qwen2.5-3b
  bench 3b-base$i $PWD/_base qwen2.5-3b
done
} 2>&1 | tee $OUT/call6.log
tar czf $OUT/results.tgz -C $R .
