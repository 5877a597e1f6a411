#!/usr/bin/env bash
# Session 36, call 1 (no carry). The tree is branch exp/cf2 (session 35's next/cluster-fences.patch on main);
# _base/ = main's llmrs (`mkdir _base && git archive main llmrs | tar -x -C _base`, untracked).
#  1. GPU tests of every kernel whose PTX the patch changes (scripts/ptx_diff.py: attn_cluster*, attn_partial_d1,
#     attn_o_cluster*, every gemv_q4 form, sample_tokens), then attn_o's with the LLMRS_ATTN_O_RED probe compiled in.
#  2. Decode bench (prompt 256, 256 steps, one run a process), alternated: 3B bf16 new / base / new + ATTN_O_RED,
#     7B AWQ new / base, 7B bf16 new / base; then a second round.
#  3. scripts/attn_clocks.py on the 3B: where attn_o_cluster8_w8's time goes after its PDL wait (default, RED).
#  4. session35/call3.sh's GEMV ablations (7B, 3B) if time is left.
# Stops starting steps past LIMIT seconds (default 540). Everything under $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
R=/tmp/res36; rm -rf $R; mkdir -p $R
T0=$(date +%s); LIMIT=${LIMIT:-540}
left() { [ $(( $(date +%s) - T0 )) -lt $LIMIT ]; }
bench() {  # name, tree, preset, VAR=VALUE (or X=), synth args...
  local name=$1 tree=$2 p=$3 e=$4; shift 4
  left || { echo "$name: skipped (time)"; return; }
  (cd $tree && env PYTHONPATH=$tree $e timeout 150 python3 -m llmrs synth --like $p "$@" --decode-bench \
    --bandwidth-gbs 4296 --prompt-len 256 --steps 256 --json $R/decode-$name.json > $R/decode-$name.log 2>&1)
  python3 -c "import json; d=json.load(open('$R/decode-$name.json')); print('$name:', d['ms_per_token'], 'ms/token,', round(100*d['fraction_of_floor_measured'],1), '% of floor')" \
    || tail -5 $R/decode-$name.log
}
{
echo "=== tests $(date +%T)"
PYTHONPATH=$PWD timeout 240 python3 -m pytest -q -m gpu tests/test_attention_cluster_gpu.py \
  tests/test_attention_o_gpu.py tests/test_gemv_q4_gpu.py tests/test_sampling.py -p no:cacheprovider \
  > $R/gpu_tests.log 2>&1
grep -E "passed|failed|^FAILED|^E " $R/gpu_tests.log | head -12
LLMRS_CUDA_DEFINES=LLMRS_ATTN_O_RED PYTHONPATH=$PWD timeout 120 python3 -m pytest -q -m gpu \
  tests/test_attention_o_gpu.py -p no:cacheprovider > $R/gpu_tests_red.log 2>&1
echo "ATTN_O_RED:"; grep -E "passed|failed|^FAILED|^E " $R/gpu_tests_red.log | head -8
for i in 1 2; do
  echo "=== decode round $i $(date +%T)"
  bench 3b-new$i $PWD qwen2.5-3b X=
  bench 3b-base$i $PWD/_base qwen2.5-3b X=
  bench 3b-red$i $PWD qwen2.5-3b LLMRS_CUDA_DEFINES=LLMRS_ATTN_O_RED
  bench 7bawq-new$i $PWD qwen2.5-7b X= --quant awq
  bench 7bawq-base$i $PWD/_base qwen2.5-7b X= --quant awq
  bench 7b-new$i $PWD qwen2.5-7b X=
  bench 7b-base$i $PWD/_base qwen2.5-7b X=
  if [ $i = 1 ]; then
    echo "=== attn_o clocks, 3B $(date +%T)"
    for d in "" "--define LLMRS_ATTN_O_RED"; do
      left && PYTHONPATH=$PWD timeout 120 python3 scripts/attn_clocks.py --like qwen2.5-3b $d \
        --json $R/clocks-3b$(echo $d | tr -d ' -').json 2>&1 | tail -14
    done
  fi
done
if left; then
  echo "=== GEMV ablations $(date +%T)"
  OUT=$R timeout $(( LIMIT + 50 - ($(date +%s) - T0) )) bash reports/h200-qwen2.5/session35/call3.sh 2>&1 | tail -60
fi
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
echo "done $(( $(date +%s) - T0 )) s"
} 2>&1 | tee $OUT/call1.log
gzip -f $R/*.log 2>/dev/null
tar czf $OUT/results.tgz -C $R .
