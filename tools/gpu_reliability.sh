#!/usr/bin/env bash
# The server's reliability on a GPU, in one run (bash tools/gpu_reliability.sh from the repository root, .whl carried):
#   1. the GPU tests named in $TEST_PATHS (default: the sampler's), summary printed
#   2. `llmrs serve --synthetic qwen2.5-7b`: a 256-concurrent load run, then a disconnect storm (256 streams, 30% of
#      the clients leaving at a random delta; tools/disconnect_storm.py checks that every KV block comes back), then
#      the same load run again (throughput before / after); a prompt over the context and a request over the KV
#      cache must be 400s and the server must stay healthy
#      and the engine core SIGKILLed under load: the server restarts it and answers again, no zombie
#   3. the same model with a KV cache of $SMALL_KV tokens under 32 requests of 2,048-token prompts that need ~5x
#      that: the scheduler preempts (llmrs:num_preemptions > 0), every request completes, no crash
# Results under $R (JSON and logs), a tarball in $OUT, a table last.
set -uo pipefail
export PYTHONUNBUFFERED=1
source tools/gpu_lib.sh
R=/tmp/reliability; mkdir -p $R "${OUT:=/tmp/reliability_out}"
use_wheels || exit 1
SMALL_KV=${SMALL_KV:-16384}
declare -a TABLE

step "GPU tests: ${TEST_PATHS:-tests/gpu/test_sampler_gpu.py}"
timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -m gpu -p no:cacheprovider -rs ${TEST_PATHS:-tests/gpu/test_sampler_gpu.py} \
  > $R/gpu_tests.log 2>&1
TABLE+=("gpu tests: $(grep -E "passed|failed|error" $R/gpu_tests.log | tail -1)")

step "serve synthetic qwen2.5-7b: load, storm, load"
serve_up storm || exit 1
load_bench load-before 256 101
TABLE+=("before storm: $(run_line $R/load-before.json 2>/dev/null | cut -c38-)")
timeout 300 python3 -m tools.disconnect_storm --url http://127.0.0.1:8123 -n 256 --drop 0.3 --max-tokens 256 \
  --settle 20 --json $R/storm.json > $R/storm.log 2>&1
TABLE+=("storm (rc $?): $(head -1 $R/storm.log)")
load_bench load-after 256 102
TABLE+=("after storm: $(run_line $R/load-after.json 2>/dev/null | cut -c38-)")
too_long=$(python3 - <<'PY'
import json, httpx
u = "http://127.0.0.1:8123"
m = httpx.get(f"{u}/v1/models").json()["data"][0]
ctx = m["max_model_len"]
r1 = httpx.post(f"{u}/v1/completions", json={"model": m["id"], "prompt": [1] * (ctx + 10), "max_tokens": 1}, timeout=60)
r2 = httpx.post(f"{u}/v1/completions", json={"model": m["id"], "prompt": [1] * 100, "max_tokens": ctx}, timeout=60)
h = httpx.get(f"{u}/health", timeout=10)
print(f"prompt over the context: {r1.status_code}; prompt + max_tokens over it: {r2.status_code}; health {h.status_code}"
      f" ({r1.json()['error']['message'][:80]})")
PY
)
TABLE+=("$too_long")
# the engine core killed under load: the server restarts it (--on-engine-death restart) and serves again
core=$(for c in $(pgrep -P $SRV); do grep -qa spawn_main /proc/$c/cmdline 2>/dev/null && echo $c; done | head -1)
timeout 200 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 256 --output-len 1024 --ignore-eos \
  --workers 4 -o $R -c 128 -n 128 --seed 9 --label killed --name killed > $R/killed.log 2>&1 &
load=$!
for _ in $(seq 1 120); do  # until the streams are well under way
  sleep 0.5; g=$(curl -s http://127.0.0.1:8123/metrics | awk '/^llmrs:generation_tokens/ {print int($2)}')
  [ "${g:-0}" -gt 20000 ] && break
done
kill -9 $core; t0=$(date +%s)
for _ in $(seq 1 60); do sleep 1; h=$(curl -s http://127.0.0.1:8123/health); [ "$(curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8123/health)" = 200 ] && break; done
back=$(( $(date +%s) - t0 )); wait $load
after=$(curl -s -o /dev/null -w "%{http_code}" http://127.0.0.1:8123/v1/completions -H 'content-type: application/json' \
  -d '{"prompt": "Hello", "max_tokens": 8}')
zombies=$(ps -eo stat,ppid | awk -v p=$SRV '$2 == p && $1 ~ /^Z/' | wc -l)
TABLE+=("core SIGKILL after ${g} tokens: health 200 again after ${back} s, next request $after, zombies $zombies; load run: $(python3 -c "import json; s=json.load(open('$R/killed.json'))['runs'][0]['summary']; print(f\"{s['completed']} completed, {s['failed']} failed (open streams end in an error)\")" 2>&1 | tail -1)")
serve_down

step "serve with a $SMALL_KV-token KV cache: 32 prompts of 2048 tokens"
SERVE_SOURCE="--synthetic qwen2.5-7b --kv-cache-tokens $SMALL_KV" serve_up small-kv || exit 1
timeout 300 python3 -m llmrs bench --url http://127.0.0.1:8123 --input-len 2048 --output-len 256 --ignore-eos \
  --workers 8 -o $R -c 32 -n 32 --seed 7 --label small-kv --name small-kv > $R/small-kv.log 2>&1
pre=$(curl -s http://127.0.0.1:8123/metrics | grep -E "^llmrs:num_preemptions" | awk '{print $2}')
health=$(curl -s -o /dev/null -w "%{http_code}" http://127.0.0.1:8123/health)
TABLE+=("small KV: $(python3 -c "import json; s=json.load(open('$R/small-kv.json'))['runs'][0]['summary']; print(f\"{s['completed']} of 32 completed, {s['failed']} failed, {s['output_throughput']:.0f} tok/s\")" 2>&1 | tail -1), preemptions $pre, health $health")
serve_down

tar -czf $OUT/reliability.tgz -C $R . 2>/dev/null
echo; echo "=== reliability ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1))"
printf '%s\n' "${TABLE[@]}"
