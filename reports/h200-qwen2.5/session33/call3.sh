#!/usr/bin/env bash
# Session 33, call 3 (no carry): what the cluster barrier's release costs, an upper bound, timing only.
# cluster_sync (common.cuh) arrives with .release, which ptxas emits as MEMBAR.ALL.GPU before UCGABAR_ARV.
# Checked with nvdisasm on the CPU machine: an st.async push completing on an mbarrier needs no MEMBAR.
# Here a copy of the tree whose cluster_sync arrives .relaxed (no MEMBAR; NOT a correct ordering of the DSMEM
# pushes: timing only) runs against the tree as it is. Decode bench, one run a process, alternated:
# 7B AWQ (4 cluster syncs a layer: attn_cluster, qkv / o / down K slices) and 3B bf16 (attn_o, 1 a layer).
set -uo pipefail
export PYTHONUNBUFFERED=1
R=/tmp/res3; rm -rf $R; mkdir -p $R
rm -rf /tmp/relaxed && mkdir /tmp/relaxed && cp -r llmrs /tmp/relaxed/
sed -i 's/barrier.cluster.arrive.release.aligned;\\nbarrier.cluster.wait.acquire.aligned;/barrier.cluster.arrive.relaxed.aligned;\\nbarrier.cluster.wait.aligned;/' \
  /tmp/relaxed/llmrs/kernels_cu/common.cuh
grep -c "arrive.relaxed.aligned;\\\\nbarrier.cluster.wait.aligned" /tmp/relaxed/llmrs/kernels_cu/common.cuh
bench() {  # name, tree, preset, quant args...
  local name=$1 tree=$2 p=$3; shift 3
  (cd $tree && PYTHONPATH=$tree timeout 200 python3 -m llmrs synth --like $p "$@" --decode-bench --bandwidth-gbs 4296 \
    --prompt-len 256 --steps 256 --json $R/decode-$name.json > $R/decode-$name.log 2>&1)
  python3 -c "import json; d=json.load(open('$R/decode-$name.json')); print('$name:', d['ms_per_token'], 'ms/token')" \
    || tail -5 $R/decode-$name.log
}
{
for i in 1 2; do
  bench 7bawq-base$i $PWD qwen2.5-7b --quant awq
  bench 7bawq-relaxed$i /tmp/relaxed qwen2.5-7b --quant awq
  bench 3b-base$i $PWD qwen2.5-3b
  bench 3b-relaxed$i /tmp/relaxed qwen2.5-3b
done
} 2>&1 | tee $OUT/call3.log
tar czf $OUT/results.tgz -C $R .
