#!/usr/bin/env bash
# session 18 call5 (branch pg-rebased = main + exp/prefill-graphs): the first-burst probe (engine in process, 7B,
# three bursts of 256 prompts, each step under cProfile), then scripts/gpu_prefill_graphs.sh.
set -uo pipefail
. scripts/gpu_lib.sh && use_wheels || exit 1
timeout 200 python3 scripts/first_burst_probe.py --runs 3 --json $OUT/first_burst.json 2>&1 | tee $OUT/first_burst.txt \
  | grep -v "^\s*$" | tail -70
bash scripts/gpu_prefill_graphs.sh
