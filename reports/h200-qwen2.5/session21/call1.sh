#!/usr/bin/env bash
# For the next lease (written in session 21, which had no device time left: not run). One call, carry .whl, ~8 min.
# Two stream-K forms, each behind its switch (off by default), and the coalesced sampler (branch exp/sample-coalesced,
# its sampling.cu saved here as sampling_coalesced.cu: bench_sample.py compiles both and compares their tokens):
#   matvec_bf16_sk (LLMRS_MATVEC_STREAMK=1, backend.matvec_streamk): one token's o / down with the row-major units of
#     256 weights split evenly over the 4,224 resident warps (the 7B's o / down are 3,584 warps, one a row);
#   gemv_q4*_sk_c4 (LLMRS_Q4_GEMV_STREAMK=1, backend.q4_streamk): AWQ G128 at T <= 8, (tile, 4 k32 blocks) units
#     split evenly over the 2,112 resident warps (the 7B's gate_up is 2.24 rounds of blocks, qkv / down 0.82 / 0.85).
#   attn_cluster*_g4_w16 (LLMRS_ATTN_CLUSTER_WARPS=16, backend.attn_cluster_warps): the decode attention's 4-head
#     cluster blocks with 16 warps, 4 keys each (8 warps x 8 keys before: the keys phase was 2.29 of its 4.59 us).
# Steps:
#   1. GPU tests of both forms (they force the form), the matvec / sampling / 4-bit kernel tests; the 4-bit end to end
#      and graph tests with both forms on;
#   2. per-kernel graphed timings: bench_kernels_graph.py (7B, 3B: o / down at 1, 2, 4 warps a row and stream-K),
#      bench_gemv_q4.py (7B T 1 and 4, 3B T 1: K slices against stream-K plans);
#   3. best of 3 a process, each form off / on in one process (ablate_decode set:), 7B and 3B bf16, 7B and 3B AWQ;
#   4. `llmrs synth --decode-bench` 7B bf16 and 7B AWQ, off / on, one run each.
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
  echo "--- $p"; grep -E "^matvec (o|down)|backend's choice for (o|down)" $R/kg-$p.log
done
step "graphed kernels: 4-bit GEMV"
for p in qwen2.5-7b:1 qwen2.5-3b:1 qwen2.5-7b:4; do
  timeout 150 python3 scripts/bench_gemv_q4.py --preset ${p%%:*} --tokens ${p#*:} --splits 1 \
    --json $R/gemv-${p%%:*}-t${p#*:}.json > $R/gemv-${p%%:*}-t${p#*:}.log 2>&1
  echo "--- ${p}"; grep -vE "^variant" $R/gemv-${p%%:*}-t${p#*:}.log | tail -30
done
step "decode best of 3 a process: off / on"
for p in qwen2.5-7b qwen2.5-3b; do
  timeout 200 python3 scripts/ablate_decode.py --like $p --rounds 3 \
    --variants "full/set:matvec_streamk=True/set:attn_cluster_warps=16/set:matvec_streamk=True,attn_cluster_warps=16" \
    --json $R/ab-$p.json > $R/ab-$p.log 2>&1
  tail -5 $R/ab-$p.log
  timeout 150 python3 scripts/ablate_decode.py --like $p --quant awq --rounds 3 \
    --variants "full/set:q4_streamk=True" --json $R/ab-$p-awq.json > $R/ab-$p-awq.log 2>&1
  tail -3 $R/ab-$p-awq.log
done
step "decode bench, one run each"
for p in qwen2.5-7b:LLMRS_MATVEC_STREAMK qwen2.5-7b:awq:LLMRS_Q4_GEMV_STREAMK; do
  v=${p##*:}; q=$(echo $p | cut -d: -f2); [ "$q" = "$v" ] && q=""; m=${p%%:*}
  for on in 1 0; do
    env $v=$on timeout 100 python3 -m llmrs synth --like $m ${q:+--quant $q} --decode-bench --bandwidth-gbs 4296 \
      --prompt-len 256 --steps 256 --json $R/decode-$m$q-$on.json > $R/decode-$m$q-$on.log 2>&1
    python3 -c "import json; d=json.load(open('$R/decode-$m$q-$on.json')); print('$m $q $v=$on', d['ms_per_token'], 'ms/token')"
  done
done
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
