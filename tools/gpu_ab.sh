#!/usr/bin/env bash
# One call on a lent H200: an A/B of one environment switch (AB_VAR, default LLMRS_PDL; e.g. LLMRS_CUDA_GRAPHS;
# AB_VALUES, default "0 1"; "X=0,Y=1" sets several; LLMRS_CUDA_DEFINES passes kernel macros)
# on single-stream decode, after the GPU tests.
#   GPU tests (TESTS=0 skips them), then the single-stream decode bench (prompt 256, 256 tokens) of synthetic
#   Qwen2.5 0.5B / 3B / 7B (MODELS) with $AB_VAR=0 and 1 side by side, twice each, the 7B AWQ (AWQ=0 skips);
#   KBENCH=1: tools/bench_kernels_graph.py (each kernel's time inside a graph) for the 7B and 0.5B;
#   PROFILE=1: `llmrs profile --batch 1` of the 0.5B and 7B; SERVE=1: the 7B through `llmrs serve` at 1 stream and
#   64 / 256 concurrent (two sweeps); SERVE_AB=1: that for each value of $AB_VAR (e.g. LLMRS_HTTP_STACK);
#   SERVE_MODELS="qwen2.5-7b qwen2.5-7b-awq": that for each synthetic model. MODELS="" skips the decode bench.
#   The decode bench reports the run-ahead ms/token and, in brackets, the one with the host waiting for each token.
#   The value "base" runs the decode bench from the llmrs tree in $BASE_TREE (e.g. `git archive HEAD llmrs | tar
#   -x -C _base`, carried along) with the switch unset: the code before a change, on the same machine; "tree=DIR"
#   from the tree in DIR (e.g. an experiment branch: `mkdir _exp1 && git archive BRANCH llmrs | tar -x -C _exp1`,
#   AB_VALUES="1 tree=$PWD/_exp1"). RUNS="1 2" by default.
# Results: $OUT/summary.txt + $OUT/results.tgz. Expects wheels in .whl/.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/llmrs-ab}; mkdir -p "$OUT"; R=/tmp/res-ab; mkdir -p $R
. "$(dirname "$0")/gpu_lib.sh"
use_wheels || exit 1
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
{
[ "${TESTS:-1}" = 1 ] && gpu_tests
if [ "${KBENCH:-0}" = 1 ]; then
  for p in qwen2.5-7b qwen2.5-0.5b; do
    step "kernels inside graphs, $p, one token, context 512"
    timeout 120 python3 -m tools.bench_kernels_graph --like $p --context 512 --json $R/kernels-graph-$p.json 2>&1 | tail -40
  done
fi
AB_VAR=${AB_VAR:-LLMRS_PDL}
# a value with "=" sets those variables itself (comma-separated), e.g. AB_VALUES="base LLMRS_A=0,LLMRS_B=1"
ab_env() { case "$1" in *=*) echo "${1//,/ }" ;; *) echo "$AB_VAR=$1" ;; esac; }
# "base" runs from $BASE_TREE, "tree=DIR" from DIR (another llmrs tree carried along), anything else from here
ab_tree() { case "$1" in base) echo "$BASE_TREE" ;; tree=*) echo "${1#tree=}" ;; esac; }
# decode_bench SECONDS VALUE JSON [SYNTH ARGS...]: the single-stream decode bench (prompt 256, 256 steps) for one
# A/B value within SECONDS, results in JSON (log beside it)
decode_bench() {
  local t=$1 v=$2 f=$3 tree; shift 3
  tree=$(ab_tree "$v")
  if [ -n "$tree" ]; then
    (cd "$tree" && PYTHONPATH=$PWD:/tmp/site timeout $t python3 -m llmrs synth "$@" --decode-bench \
      --bandwidth-gbs 4296 --prompt-len 256 --steps 256 --json $f)
  else
    env $(ab_env $v) timeout $t python3 -m llmrs synth "$@" --decode-bench --bandwidth-gbs 4296 --prompt-len 256 \
      --steps 256 --json $f
  fi > ${f%.json}.log 2>&1
}
for p in ${MODELS-qwen2.5-0.5b qwen2.5-3b qwen2.5-7b}; do
  for run in ${RUNS:-1 2}; do
    for v in ${AB_VALUES:-0 1}; do
      f=$R/decode-$p-ab$(echo "$v" | tr '/=,' '___')-run$run
      decode_bench 120 "$v" $f.json --like $p
      python3 - $f.json "$p $v run $run" <<'PY'
import json, sys
try:
    r = json.load(open(sys.argv[1]))
    print(f"{sys.argv[2]:44s} {r['ms_per_token']:.3f} ms/token  {100 * r['fraction_of_floor_measured']:.1f}% of floor"
          f"  (host waiting for each token: {r.get('ms_per_token_sync', float('nan')):.3f})")
except Exception as e:
    print(sys.argv[2], "FAILED", e)
PY
    done
  done
done
if [ "${AWQ:-1}" = 1 ]; then
  for v in ${AB_VALUES:-0 1}; do
    f=$R/decode-7b-awq-ab$(echo "$v" | tr '/=,' '___')
    echo "7B AWQ $v"; decode_bench 150 "$v" $f.json --like qwen2.5-7b --quant awq; grep -E "ms_per_token|rror" $f.log
  done
fi
if [ "${PROFILE:-0}" = 1 ]; then
  for p in qwen2.5-0.5b qwen2.5-7b; do
    step "profile $p, one stream"
    timeout 100 python3 -m llmrs profile --synthetic $p --batch 1 --context 512 --prefill-len 256 --steps 5 --top 14 \
      --out $R/profile-$p-b1.json > $R/profile-$p-b1.txt 2>&1
    sed -n 1,30p $R/profile-$p-b1.txt
  done
fi
[ "${SERVE:-0}" = 1 ] && serve_bench llmrs-h200-7b
for m in ${SERVE_MODELS:-}; do SERVE_MODEL=$m serve_bench $m; done
if [ "${SERVE_AB:-0}" = 1 ]; then
  for v in ${AB_VALUES:-0 1}; do (export $AB_VAR=$v; serve_bench ab$v); done
fi
} 2>&1 | tee $OUT/summary.txt
grep -h "capture\|Traceback" $R/*.log | sort | uniq -c | head >> $OUT/summary.txt
tar czf $OUT/results.tgz -C $R .
