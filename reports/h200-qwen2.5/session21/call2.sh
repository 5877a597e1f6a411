#!/usr/bin/env bash
# For the next lease (written in session 21, not run), after call1.sh (its GPU tests green). One call, carry .whl,
# ~8 min: the session's switches off / on in one process each (best of 3, `scripts/ablate_decode.py` set:), 7B and 3B
# bf16 (matvec_streamk: o / down; pair_streamk: qkv; attn_cluster_warps=16; all three), 7B and 3B AWQ (q4_streamk);
# then `llmrs synth --decode-bench`, 7B bf16 (LLMRS_MATVEC_STREAMK=1) and 7B AWQ (LLMRS_Q4_GEMV_STREAMK=1), on / off,
# and 7B AWQ with every shape on the stream-K GEMV (LLMRS_Q4_GEMV_K_PER_N=0: o leaves matvec_q4).
set -uo pipefail
export PYTHONUNBUFFERED=1
. scripts/gpu_lib.sh
use_wheels || exit 1
R=/tmp/res-s21c2; mkdir -p $R
{
step "decode best of 3 a process: off / on"
for p in qwen2.5-7b qwen2.5-3b; do
  timeout 200 python3 scripts/ablate_decode.py --like $p --rounds 3 \
    --variants "full/set:matvec_streamk=True/set:pair_streamk=True/set:attn_cluster_warps=16/set:matvec_streamk=True,pair_streamk=True,attn_cluster_warps=16" \
    --json $R/ab-$p.json > $R/ab-$p.log 2>&1
  tail -6 $R/ab-$p.log; grep -B1 "kernels:" $R/ab-$p.log | grep -v "^--" | sed 's/^qwen.*round 1 *//' 
  timeout 150 python3 scripts/ablate_decode.py --like $p --quant awq --rounds 3 \
    --variants "full/set:q4_streamk=True" --json $R/ab-$p-awq.json > $R/ab-$p-awq.log 2>&1
  tail -3 $R/ab-$p-awq.log; grep "kernels:" $R/ab-$p-awq.log
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
# every 4-bit shape on the GEMV at one token (o too, which takes matvec_q4's row form by default), in stream-K form
LLMRS_Q4_GEMV_K_PER_N=0 LLMRS_Q4_GEMV_STREAMK=1 timeout 100 python3 -m llmrs synth --like qwen2.5-7b --quant awq \
  --decode-bench --bandwidth-gbs 4296 --prompt-len 256 --steps 256 --json $R/decode-awq-all-gemv-sk.json \
  > $R/decode-awq-all-gemv-sk.log 2>&1
python3 -c "import json; d=json.load(open('$R/decode-awq-all-gemv-sk.json')); print('7B awq, every shape on the stream-K GEMV', d['ms_per_token'], 'ms/token')"
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
