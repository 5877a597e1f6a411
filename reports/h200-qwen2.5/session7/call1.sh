#!/usr/bin/env bash
# session call 1: GPU tests of main + experiment trees (in parallel), decode A/B, prefill profile, kernel bench
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh; use_wheels || exit 1
T=/tmp/t; mkdir -p $T
step "tests in parallel"
(timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider tests > $T/main-tests.log 2>&1) &
for b in attn-merge-staged attn-table-smem norm-fold-smem prefill-attn-bf16-out attn-both; do
  (cd _$b && PYTHONPATH=$PWD:/tmp/site timeout 330 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_cuda_kernels.py \
    tests/test_attention_gqa_gpu.py tests/test_prefill_attention_gpu.py tests/test_cuda_graphs.py > $T/$b-tests.log 2>&1) &
done
wait
for f in $T/*-tests.log; do echo "$(basename $f): $(grep -E '^(FAILED|ERROR)' $f | head -5) $(tail -1 $f)"; done
step "decode A/B"
OUT=$T/ab1 TESTS=0 AWQ=0 RUNS=1 AB_VALUES="1 tree=$PWD/_attn-merge-staged tree=$PWD/_attn-table-smem tree=$PWD/_attn-both tree=$PWD/_norm-fold-smem" bash scripts/gpu_ab.sh 2>&1 | grep -v "^$"
step "fuse norm 1"
LLMRS_FUSE_NORM=1 OUT=$T/ab2 TESTS=0 AWQ=0 RUNS=1 AB_VAR=LLMRS_FUSE_NORM MODELS="qwen2.5-3b qwen2.5-7b" AB_VALUES="1 tree=$PWD/_norm-fold-smem" bash scripts/gpu_ab.sh 2>&1 | grep -v "^$"
[ $SECONDS -lt 450 ] && step "prefill 256 profile main vs prefill-attn-bf16-out"
[ $SECONDS -lt 450 ] && for d in . _prefill-attn-bf16-out; do
  (cd $d && PYTHONPATH=$PWD:/tmp/site timeout 100 python3 -m llmrs profile --synthetic qwen2.5-7b --batch 1 --context 512 --prefill-len 256 --steps 3 --top 6 > $T/prefill-$(basename $PWD).txt 2>&1; grep -E "step wall|busy|prefill" $T/prefill-$(basename $PWD).txt | head -6)
done
[ $SECONDS -lt 500 ] && step "kernels in graphs 7B main vs attn-both"
for d in . _attn-both; do
  [ $SECONDS -lt 510 ] || break
  (cd $d && PYTHONPATH=$PWD:/tmp/site timeout 120 python3 scripts/bench_kernels_graph.py --like qwen2.5-7b --context 512 > $T/kg-$(basename $PWD).txt 2>&1; tail -30 $T/kg-$(basename $PWD).txt)
done
