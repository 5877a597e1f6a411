#!/usr/bin/env bash
# Session 30, call 3 (no carry, ~4 min): attn_o_cluster with the cluster size chosen by the driver's max active
# clusters (`_attn_o_max_clusters`; 4 splits of 512 rows where 16 clusters of 8 do not run at once): what the driver
# says, the kernel's GPU tests, then the one-stream decode bench alternated, one run a process: 3B auto / 4 / 8 / off
# twice, 1.5B auto / off.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/llmrs-s30}; mkdir -p "$OUT"; R=/tmp/res-s30c3; rm -rf $R; mkdir -p $R
{
python3 - <<'PY'
from llmrs.engine.backends.cuda_kernels import get_kernels, max_active_clusters
k = get_kernels()
for cl in (4, 8):
    print(f"attn_o_cluster{cl}: max active clusters", max_active_clusters(k.fns[f"attn_o_cluster{cl}"].raw, (1, 132 // cl, cl), (512,)))
for name in ("attn_cluster8_d4_g4_w16",):
    print(name, "max active clusters", max_active_clusters(k.fns[name].raw, (1, 16, 8), (512,)))
PY
timeout 300 python3 -m pytest -q -m gpu tests/test_attention_o_gpu.py -p no:cacheprovider 2>&1 | tail -4
for i in 1 2; do
  for f in 1 4 8 0; do
    LLMRS_ATTN_O_FUSED=$f timeout 100 python3 -m llmrs synth --like qwen2.5-3b --decode-bench --bandwidth-gbs 4296 \
      --prompt-len 256 --steps 256 --json $R/decode-3b-f$f-$i.json > $R/decode-3b-f$f-$i.log 2>&1
    python3 -c "import json; d=json.load(open('$R/decode-3b-f$f-$i.json')); print('3b fused=$f run $i:', d['ms_per_token'], 'ms/token')"
  done
done
for f in 1 0; do
  LLMRS_ATTN_O_FUSED=$f timeout 100 python3 -m llmrs synth --like qwen2.5-1.5b --decode-bench --bandwidth-gbs 4296 \
    --prompt-len 256 --steps 256 --json $R/decode-1.5b-f$f.json > $R/decode-1.5b-f$f.log 2>&1
  python3 -c "import json; d=json.load(open('$R/decode-1.5b-f$f.json')); print('1.5b fused=$f:', d['ms_per_token'], 'ms/token')"
done
} 2>&1 | tee $OUT/call3.log
mkdir -p $OUT/json; cp $R/decode-3b-f1-1.json $R/decode-3b-f0-1.json $R/decode-1.5b-f*.json $OUT/json/ 2>/dev/null
