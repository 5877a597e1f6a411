#!/usr/bin/env bash
# For the next lease (written in session 21, which had no device time left: not run). One call, carry .whl, ~7 min.
# Two stream-K forms, each behind its switch (off by default), and the coalesced sampler (branch exp/sample-coalesced,
# its sampling.cu saved here as sampling_coalesced.cu: bench_sample.py compiles both and compares their tokens):
#   matvec_bf16_sk (LLMRS_MATVEC_STREAMK=plain or 1, backend.matvec_streamk): one token's o / down with the row-major
#     units of 256 weights split evenly over the 4,224 resident warps (the 7B's o / down are 3,584 warps, one a row);
#   matvec_{rope,silu}{,_norm}_bf16_sk (LLMRS_MATVEC_STREAMK=pair or 1, backend.pair_streamk): one token's qkv and
#     gate_up pairs the same way (the 7B's qkv is 2,304 warps where 2,640 fit, the 3B's 1,280 where 2,112 do);
#   gemv_q4*_sk_c4 (LLMRS_Q4_GEMV_STREAMK=1, backend.q4_streamk): AWQ G128 at T <= 8, (tile, 4 k32 blocks) units
#     split evenly over the 2,112 resident warps (the 7B's gate_up is 2.24 rounds of blocks, qkv / down 0.82 / 0.85).
#   attn_cluster*_g4_w16 (LLMRS_ATTN_CLUSTER_WARPS=16, backend.attn_cluster_warps): the decode attention's 4-head
#     cluster blocks with 16 warps, 4 keys each (8 warps x 8 keys before: the keys phase was 2.29 of its 4.59 us).
# Steps:
#   1. GPU tests of both forms (they force the form), the matvec / sampling / 4-bit kernel tests; the 4-bit end to end
#      and graph tests with both forms on;
#   2. per-kernel graphed timings: bench_kernels_graph.py (7B, 3B: o / down at 1, 2, 4 warps a row and stream-K),
#      bench_gemv_q4.py (7B T 1 and 4, 3B T 1: K slices against stream-K plans);
# then call2.sh (the decode A/Bs: best of 3 a process, each switch off / on; `llmrs synth --decode-bench`).
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s21c1; mkdir -p $R
{
step "tests"
timeout 240 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_gemv_q4_gpu.py tests/test_cuda_kernels.py \
  -k "not bandwidth" > $R/tests.log 2>&1
grep -E "^(FAILED|ERROR)|passed|failed" $R/tests.log | tail -8
timeout 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_attention_cluster_gpu.py > $R/tests-attn.log 2>&1
echo "attention cluster:"; grep -E "^(FAILED|ERROR)|passed|failed" $R/tests-attn.log | tail -8
LLMRS_MATVEC_STREAMK=1 LLMRS_Q4_GEMV_STREAMK=1 LLMRS_ATTN_CLUSTER_WARPS=16 timeout 240 python3 -m pytest -q -m gpu \
  -p no:cacheprovider tests/test_quant_gpu.py tests/test_cuda_graphs.py tests/test_cuda_parity.py \
  tests/test_attention_cluster_gpu.py::test_backend_takes_the_cluster_where_attn_partial_ran_and_tokens_agree \
  > $R/tests-sk.log 2>&1
echo "with the three switches on:"; grep -E "^(FAILED|ERROR)|passed|failed" $R/tests-sk.log | tail -8
step "sampler (exp/sample-coalesced's first pass against the tree's)"
timeout 120 python3 reports/h200-qwen2.5/session21/bench_sample.py 2>&1 | tee $R/sample.log
step "graphed kernels: bf16 o / down"
for p in qwen2.5-7b qwen2.5-3b; do
  timeout 150 python3 scripts/bench_kernels_graph.py --like $p --context 512 --json $R/kg-$p.json > $R/kg-$p.log 2>&1
  echo "--- $p"; grep -E "^matvec (o|down|qkv\+rope|norm\+qkv\+rope|gate_up\+silu|norm\+gate_up\+silu)|backend's choice for (o|down)" \
    $R/kg-$p.log
done
step "graphed kernels: 4-bit GEMV"
for p in qwen2.5-7b:1 qwen2.5-3b:1 qwen2.5-7b:4; do
  timeout 150 python3 scripts/bench_gemv_q4.py --preset ${p%%:*} --tokens ${p#*:} --splits 1 \
    --json $R/gemv-${p%%:*}-t${p#*:}.json > $R/gemv-${p%%:*}-t${p#*:}.log 2>&1
  echo "--- ${p}"; grep -vE "^variant" $R/gemv-${p%%:*}-t${p#*:}.log | tail -30
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
