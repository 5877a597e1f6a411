#!/usr/bin/env bash
# For the next lease (written in session 31, not run): attn_o_cluster8_w8 (attention.cu: one token's attention + o
# with 8 warps a block, 16 chunks of o a lane, two blocks an SM), under LLMRS_ATTN_O_WARPS=8. The 16-warp form runs
# 15 clusters of 8 at once on the H200, so the 3B's 16 heads keep the two kernels; if the driver runs 16+ of this
# form, the 3B takes the fused kernel (`_attn_o_cluster`). CPU-checked: ptx-check clean (128 registers, no spills),
# 28 pre-wait loads (tests/test_early_loads.py), the 16-warp forms' PTX unchanged but for the template's mangled
# shared-variable names. ~4 min, no carry.
# If the 3B wins: make 8 warps auto's form where the 16-warp clusters do not all fit (and check the 1.5B both ways).
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/llmrs-next}; mkdir -p "$OUT"; R=/tmp/res-next-w8; rm -rf $R; mkdir -p $R
{
python3 - <<'PY'
from llmrs.engine.backends.cuda import CUDABackend
from llmrs.engine.backends.cuda_kernels import max_active_clusters
from llmrs.engine.loader import load
b = CUDABackend(load("synthetic:qwen2.5-3b").config, num_blocks=64, block_size=16)
for name, threads in (("attn_o_cluster8", 512), ("attn_o_cluster8_w8", 256), ("attn_o_cluster4", 512)):
    print(name, max_active_clusters(getattr(b.k, name).raw, (1, b.num_sms // 8, 8 if "8" in name else 4),
                                    (threads,)), "clusters at once")
PY
timeout 200 python3 -m pytest -q -m gpu tests/test_attention_o_gpu.py -p no:cacheprovider > $R/gpu_tests.log 2>&1
grep -E "passed|failed|^FAILED|^E " $R/gpu_tests.log | head -8
bench() {  # name, preset, env...
  local name=$1 p=$2; shift 2
  env "$@" timeout 100 python3 -m llmrs synth --like $p --decode-bench --bandwidth-gbs 4296 --prompt-len 256 \
    --steps 256 --json $R/decode-$name.json > $R/decode-$name.log 2>&1
  python3 -c "import json; d=json.load(open('$R/decode-$name.json')); print('$name:', d['ms_per_token'], 'ms/token')"
}
for i in 1 2; do
  bench 3b-w8-$i qwen2.5-3b LLMRS_ATTN_O_WARPS=8
  bench 3b-$i qwen2.5-3b LLMRS_X=1
done
bench 1.5b-w8 qwen2.5-1.5b LLMRS_ATTN_O_WARPS=8
bench 1.5b qwen2.5-1.5b LLMRS_X=1
} 2>&1 | tee $OUT/next-w8.log
tar czf $OUT/next-w8-results.tgz -C $R .
