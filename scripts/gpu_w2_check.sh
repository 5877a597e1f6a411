#!/usr/bin/env bash
# One call on a lent H200 (carry .whl; ~7 min): the 256-token form of the 4-bit wgmma GEMM (gemm_q4w2{z,m}: two
# warpgroups over 128 columns x 256 tokens, each weight decoded once per 256 tokens; written in the fifteenth
# session without device time, opt-in LLMRS_Q4_WGMMA_T256=1):
#   1. scripts/wgmma_probe.py (one tile, structured inputs: where a layout error would show);
#   2. tests/test_gemm_q4_gpu.py (every form against float64, the backend path with the switch);
#   3. scripts/bench_gemm_q4_forms.py --splits at 192-1024 tokens (mma / wgmma / wgmma256 / dequantize + cuBLAS /
#      bf16; the wgmma forms at every cluster size too: does filling the last wave of blocks pay?);
#   4. `llmrs profile --synthetic qwen2.5-7b-awq --batch 128,256` with LLMRS_Q4_WGMMA_T256=0 / 1 and
#      LLMRS_Q4_WG_FILL=0 / 1 (K slices that fill a large weight's last round of blocks: cuda_q4gemm.wave_fill_splits);
#   5. the one-stream decode bench of the 3B and the 7B (attention.cu's kernels now share their pieces: same
#      instruction counts by ptx-check, times to confirm);
#   6. W2_SERVE=1: the 7B AWQ server at 64 / 256 concurrent with it off / on (~3 min more).
# If it is right and faster: on by default (cuda_kernels.WGMMA_T256), and if it beats dequantize + cuBLAS above 256
# tokens, WG_MAX_TOKENS up for it (cuda_q4gemm.w2_takes / in_wgmma_range).
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-w2}; mkdir -p "$OUT"; R=/tmp/res-w2; rm -rf $R; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
{
step "probe"
timeout 120 python3 scripts/wgmma_probe.py > $R/probe.txt 2>&1; grep -A6 "gemm_q4w2z" $R/probe.txt | head -12
TEST_TIMEOUT=300 TEST_PATHS="tests/test_gemm_q4_gpu.py" gpu_tests
step "bench: the forms at 192-1024 tokens"
timeout 240 python3 scripts/bench_gemm_q4_forms.py --tokens ${W2_TOKENS:-192,256,384,512,1024} --splits \
  --json $R/forms.json > $R/forms.txt 2>&1; tail -7 $R/forms.txt
for v in "0 0" "1 0" "0 1" "1 1"; do
  set -- $v
  step "profile 7B AWQ, batch 128,256, LLMRS_Q4_WGMMA_T256=$1 LLMRS_Q4_WG_FILL=$2"
  LLMRS_Q4_WGMMA_T256=$1 LLMRS_Q4_WG_FILL=$2 timeout 100 python3 -m llmrs profile --synthetic qwen2.5-7b-awq \
    --batch 128,256 --context 512 --out $R/profile-t256-$1-fill$2.json > $R/profile-t256-$1-fill$2.txt 2>&1
  grep -E "step wall|gemm_q4|dequant" $R/profile-t256-$1-fill$2.txt | head -10
done
step "decode bench, one stream (attention.cu's shared pieces: expected 7B 4.14, 3B 2.31 ms/token)"
for m in qwen2.5-3b qwen2.5-7b; do
  timeout 100 python3 -m llmrs synth --like $m --decode-bench --bandwidth-gbs 4296 --prompt-len 256 --steps 256 \
    --json $R/decode-$m.json > $R/decode-$m.log 2>&1
  python3 -c "import json,sys; print(sys.argv[2], round(json.load(open(sys.argv[1]))['ms_per_token'], 3), 'ms')" \
    $R/decode-$m.json $m 2>/dev/null || tail -3 $R/decode-$m.log
done
if [ -n "${W2_SERVE:-}" ]; then
  for v in 0 1; do
    step "server qwen2.5-7b-awq, LLMRS_Q4_WGMMA_T256=$v: 64 and 256 concurrent"
    SERVE_MODEL=qwen2.5-7b-awq serve_up awq-t256-$v LLMRS_Q4_WGMMA_T256=$v || continue
    for c in 64 256; do load_bench bench-7b-awq-t256-$v-c$c $c $((5400 + 10 * v + c)); done
    serve_down
  done
  bench_table $R
fi
} 2>&1 | tee $OUT/summary.txt
cp $R/forms.txt $R/probe.txt $OUT/ 2>/dev/null
tar czf $OUT/results.tgz -C $R .
