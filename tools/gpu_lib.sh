# Shared by the GPU-machine scripts (gpu_check.sh, gpu_ab.sh, perf_check.sh, tp_check.sh, ttft_probe.sh): source it.
# use_wheels: install the wheels carried in .whl/ (what the lent machine lacks) into /tmp/site, set PYTHONPATH.
# use_gguf: the embedded SmolLM2 GGUF (98 MB, over one call's carry) from /tmp/models/part1 (moved there by an
#   earlier call of the same lease) + .gguf/part2 (carried now), joined; LLMRS_EMBEDDED_DIR set when it is there.
# step TITLE: a section header with the time.  wait_health PORT [SECONDS]: until GET /health answers 200.
# gpu_tests: `pytest -m gpu tests` (or $TEST_PATHS; $TEST_ARGS split on spaces, $TEST_K one -k expression) into
#   $R/gpu_tests.log (figures in $R/gpu_figures.jsonl), its summary printed.
# serve_bench LABEL [SERVE ARGS]: `llmrs serve` of synthetic Qwen2.5-7B ($SERVE_MODEL: another preset, e.g.
#   qwen2.5-7b-awq), `llmrs bench` at 1 stream, then 64 / 256 concurrent twice (prompt 256, 256 new tokens; each
#   point its own prompts: a cold prefix cache);
#   results bench-7b-LABEL-*.json in $R.
# bench_table DIR: one line per bench-7b-*.json run in DIR (output tok/s, TPOT mean).
# ttft_line JSON PROMPT_LEN [LABEL]: TTFT min / median / mean of one `llmrs bench` results file.
# run_line JSON: one line for a load run's results file (output tok/s, TPOT mean, TTFT median, ITL median).
# decode_line JSON LABEL [SYNTH ARGS...]: `llmrs synth ARGS --decode-bench`, one stream (prompt 256, 256 steps, floor
#   at 4296 GB/s) within $DECODE_TIMEOUT (120) s, into JSON (log beside it); prints LABEL: ms/token, % of floor
#   (or the log's last lines).
# serve_up NAME [VAR=VALUE ...]: `llmrs serve --synthetic ${SERVE_MODEL:-qwen2.5-7b}` ($SERVE_SOURCE: other model
#   arguments) on port 8123 with those variables set ($SERVE_DEVICE, default cuda), log $R/serve-NAME.log, pid in
#   $SRV; fails without /health.
# serve_down: stop it (SIGINT) and wait.  ttft_bench NAME LEN SEED [LABEL]: ${TTFT_N:-24} requests one at a
#   time (LEN-token prompts, 2 new tokens) against it, the TTFT line printed.  load_bench NAME C SEED: 256 requests
#   at C concurrent (prompt 256, 256 new tokens) into $R/NAME.json.  load_runs NAME N SEED: N such runs at 256
#   concurrent (NAME-r1 .. NAME-rN, seeds SEED + 10 i).
# server_figures LABEL SEED: the default server's figures: TTFT at a 256-token prompt, then 64 and 256 concurrent
#   twice (bench-7b-LABEL-runN-cC.json), every point its own prompts (seeds from SEED), the table printed.
use_wheels() {
  if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      .whl/*.whl || return 1
    export PYTHONPATH=$PWD:/tmp/site
    # a wheel set that misses a dependency (fastapi 0.165 imports opentelemetry-api, openai 3.57 httpx2) fails
    # here, not at serve time
    python3 -c "import fastapi, uvicorn, pydantic, openai, gguf" \
      || { echo "use_wheels: .whl/ misses a dependency (make wheels)"; return 1; }
  else
    export PYTHONPATH=$PWD
  fi
}
use_gguf() {
  [ -f /tmp/models/part1 ] && [ -f .gguf/part2 ] && cat /tmp/models/part1 .gguf/part2 > /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf
  [ -f /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf ] && export LLMRS_EMBEDDED_DIR=/tmp/models
  return 0
}
# use_gguf_thirds: the same from parts (the tree is too big for a half beside .whl; split -b SIZE -d ... .gguf/p):
#   all but the last moved to /tmp/models by the calls before (/tmp/models/p00, p01, ...), the last carried now in
#   .gguf/; wheels from /tmp/site.
use_gguf_thirds() {
  export PYTHONPATH=$PWD:/tmp/site
  cat /tmp/models/p[0-9][0-9] .gguf/p[0-9][0-9] > /tmp/models/SmolLM2-135M-Instruct.Q4_1.gguf || return 1
  export LLMRS_EMBEDDED_DIR=/tmp/models
}
step() { echo; echo "=== $1 ($(date +%T))"; }
wait_health() {
  python3 - "$1" "${2:-120}" <<'PY'
import sys, time, httpx
port, limit = sys.argv[1], float(sys.argv[2])
deadline = time.monotonic() + limit
while time.monotonic() < deadline:
    try:
        if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
            sys.exit(0)
    except httpx.HTTPError:
        pass
    time.sleep(0.5)
sys.exit(f"no /health on port {port} within {limit:g}s")
PY
}
gpu_tests() {
  step "GPU tests"; LLMRS_GPU_REPORT=$R/gpu_figures.jsonl timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -m gpu \
    -p no:cacheprovider -rs ${TEST_PATHS:-tests} ${TEST_ARGS:-} ${TEST_K:+-k "$TEST_K"} > $R/gpu_tests.log 2>&1
  grep -E "^(FAILED|ERROR)|passed|failed|SKIPPED|capture" $R/gpu_tests.log | tail -15
}
serve_bench() {
  local label=$1; shift
  step "serve synthetic ${SERVE_MODEL:-qwen2.5-7b} $label: 1 stream, then 64/256 concurrent twice"
  python3 -m llmrs serve --synthetic ${SERVE_MODEL:-qwen2.5-7b} --device cuda --max-num-seqs 256 --port 8123 "$@" \
    >$R/serve-7b-$label.log 2>&1 &
  local srv=$!
  wait_health 8123 150 || { tail -20 $R/serve-7b-$label.log; kill $srv; return; }
  timeout 60 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 --output-len 256 --ignore-eos \
    --workers 8 -o $R -c 1 -n ${C1_REQUESTS:-4} --label $label --name bench-7b-$label-c1 2>&1 | grep -E "TTFT|TPOT" \
    | head -4
  # NOTE: a fresh --seed for every point: with one seed every run sends the same prompts, so all but the first
  # find them in the prefix cache (a warm cache inflates the 256-concurrent figure by a third)
  for run in 1 2; do
    for c in 64 256; do
      timeout 120 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 --output-len 256 --ignore-eos \
        --workers 8 -o $R -c $c -n 256 --seed $((run * 1000 + c)) --label $label \
        --name bench-7b-$label-run$run-c$c 2>&1 | tail -5
    done
  done
  kill -INT $srv; wait $srv
}
bench_table() {
  python3 - "$1" <<'PY'
import glob, json, sys
for f in sorted(glob.glob(sys.argv[1] + "/bench-7b-*.json")):
    for r in json.load(open(f))["runs"]:
        s = r["summary"]
        print(f"{f.split('/')[-1]:40s} {s['output_throughput']:8.0f} tok/s  TPOT {s['tpot_ms']['mean']:.2f}")
PY
}
ttft_line() {
  python3 - "$1" "$2" "${3:-}" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["runs"][0]["summary"]
t = s["ttft_ms"]
print(f"{sys.argv[3] + ' ' if sys.argv[3] else ''}prompt {int(sys.argv[2]):4d}: TTFT min {t['min']:.2f}  median "
      f"{t.get('median', t.get('p50', float('nan'))):.2f}  mean {t['mean']:.2f} ms ({s['completed']} requests)")
PY
}
decode_line() {
  local f=$1 label=$2; shift 2
  timeout "${DECODE_TIMEOUT:-120}" python3 -m llmrs synth "$@" --decode-bench --bandwidth-gbs 4296 --prompt-len 256 \
    --steps 256 --json "$f" > "${f%.json}.log" 2>&1
  python3 - "$f" "$label" <<'PY' || tail -3 "${f%.json}.log"
import json, sys
d = json.load(open(sys.argv[1]))
print(f"{sys.argv[2]}: {d['ms_per_token']} ms/token, {round(100 * d['fraction_of_floor_measured'], 1)} % of floor")
PY
}
run_line() {
  python3 - "$1" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["runs"][0]["summary"]
print(f"{sys.argv[1].split('/')[-1]:36s} {s['output_throughput']:8.0f} tok/s  TPOT mean {s['tpot_ms']['mean']:.3f} ms  "
      f"TTFT median {s['ttft_ms']['median']:.1f} ms  ITL p50 {s['itl_ms']['median']:.3f} ms")
PY
}
serve_up() {
  local name=$1; shift
  env "$@" python3 -m llmrs serve ${SERVE_SOURCE:---synthetic ${SERVE_MODEL:-qwen2.5-7b}} --device ${SERVE_DEVICE:-cuda} \
    --max-num-seqs 256 --port 8123 >"$R/serve-$name.log" 2>&1 &
  SRV=$!
  wait_health 8123 ${SERVE_WAIT:-150} || { tail -20 "$R/serve-$name.log"; serve_down; return 1; }
}
serve_down() { kill -INT $SRV 2>/dev/null; wait $SRV; }
ttft_bench() {
  timeout 120 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len $2 --output-len 2 --ignore-eos \
    --workers 1 -o $R -c 1 -n ${TTFT_N:-24} --seed $3 --label $1 --name $1 > "$R/$1.log" 2>&1
  ttft_line "$R/$1.json" $2 "${4:-}"
}
load_runs() {  # NAME RUNS SEED: RUNS 256-concurrent load_bench runs against the server up, NAME-rI.json
  local run; for run in $(seq 1 $2); do load_bench $1-r$run 256 $(($3 + 10 * run)); done
}
load_bench() {
  timeout 120 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 --output-len 256 --ignore-eos \
    --workers 8 -o $R -c $2 -n 256 --seed $3 --label $1 --name $1 > "$R/$1.log" 2>&1
}
server_figures() {
  step "server (defaults): $1"
  serve_up $1 || return 1
  ttft_bench ttft-$1-in256 256 $2 "default"
  for run in 1 2; do
    for c in 64 256; do load_bench bench-7b-$1-run$run-c$c $c $(($2 + run * 1000 + c)); done
  done
  serve_down
  bench_table $R
}
