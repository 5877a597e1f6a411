#!/usr/bin/env bash
# Two llmrs trees on one GPU, alternated in one lease (bash tools/gpu_tree_ab.sh, carry .whl and the base tree):
# this checkout and the tree in $BASE (e.g.
# `mkdir _base && git archive REV llmrs | tar -x -C _base`, carried along). PHASES (space separated, in order):
#   tests   `pytest -m gpu tests` of this checkout (summary printed, log in $OUT/gpu_tests.log)
#   decode  `llmrs synth --like P --decode-bench` (one stream, prompt 256, 256 steps) for each of $MODELS
#           (P or P:awq), base then this tree, $RUNS times
#   serve   `llmrs serve --synthetic qwen2.5-7b` from each tree, then $RUNS `llmrs bench` runs at 256 concurrent
#           (prompt 256, 256 new tokens, --ignore-eos) against it
# Prints one table at the end; every result JSON and log under $R, a tarball of them in $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1
HERE=$PWD; BASE=${BASE:-$PWD/_base}; R=/tmp/tree_ab; mkdir -p $R "${OUT:=/tmp/tree_ab_out}"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
SITE=/tmp/site
tree_of() { [ "$1" = base ] && echo "$BASE" || echo "$HERE"; }
step() { echo; echo "=== $1 ($(date +%T))"; }
wait_health() {
  for _ in $(seq 1 ${2:-200}); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 1
  done; return 1
}
for phase in ${PHASES:-tests decode serve}; do
case $phase in
tests)
  step "pytest -m gpu (this tree)"
  PYTHONPATH=$HERE:$SITE timeout ${TEST_TIMEOUT:-330} python3 -m pytest -q -m gpu -p no:cacheprovider -rs tests \
    ${TEST_ARGS:-} > $OUT/gpu_tests.log 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed" $OUT/gpu_tests.log | tail -25 ;;
decode)
  for run in $(seq 1 ${RUNS:-2}); do
    for m in ${MODELS:-qwen2.5-0.5b qwen2.5-3b qwen2.5-7b qwen2.5-7b:awq}; do
      for t in base tree; do
        p=${m%%:awq}; q=(); [ "$m" != "$p" ] && q=(--quant awq)
        f=$R/decode-${m/:/-}-$t-r$run.json
        (cd "$(tree_of $t)" && PYTHONPATH=$PWD:$SITE timeout 150 python3 -m llmrs synth --like $p "${q[@]}" \
          --decode-bench --bandwidth-gbs 4296 --prompt-len 256 --steps 256 --json $f) > ${f%.json}.log 2>&1
        echo "decode $m $t run $run: $(python3 -c "import json,sys; r=json.load(open(sys.argv[1])); print(f\"{r['ms_per_token']:.4f} ms/token\")" $f 2>/dev/null || tail -3 ${f%.json}.log)"
      done
    done
  done ;;
serve)
  for t in base tree; do
    step "serve synthetic qwen2.5-7b from $t"
    (cd "$(tree_of $t)" && PYTHONPATH=$PWD:$SITE exec python3 -m llmrs serve --synthetic qwen2.5-7b --device cuda \
      --max-num-seqs 256 --port 8123) > $R/serve-$t.log 2>&1 &
    srv=$!
    if ! wait_health 8123 240; then tail -20 $R/serve-$t.log; kill $srv; continue; fi
    grep -m1 -i "loaded" $R/serve-$t.log
    for run in $(seq 1 ${RUNS:-2}); do
      PYTHONPATH=$HERE:$SITE timeout 150 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 \
        --output-len 256 --ignore-eos --workers 8 -o $R -c 256 -n 256 --seed $((100 + run)) --label $t-r$run \
        --name bench-$t-r$run > $R/bench-$t-r$run.log 2>&1
      python3 - $R/bench-$t-r$run.json "$t run $run" <<'PY'
import json, sys
try:
    s = json.load(open(sys.argv[1]))["runs"][0]["summary"]
    print(f"bench 256 {sys.argv[2]}: output {s['output_throughput']:.0f} tok/s, TPOT mean {s['tpot_ms']['mean']:.2f} ms, "
          f"TTFT median {s['ttft_ms']['median']:.1f} ms, completed {s['completed']}, failed {s['failed']}")
except Exception as e:
    print(f"bench 256 {sys.argv[2]}: no result ({e})")
PY
    done
    kill -INT $srv; wait $srv
  done ;;
esac
done
tar -czf $OUT/results.tgz -C $R . 2>/dev/null
