#!/usr/bin/env bash
# Session 8, call 1 (carry .whl; the four exp/* trees extracted to _<branch> beforehand): main's GPU tests and each
# branch's kernel tests at once, single-stream decode for main and each branch (0.5B/3B/7B + 7B AWQ), kernels inside
# graphs per tree, then the 0.5B attention A/B (auto = gqa for head_dim 64 vs partial), single stream and batches.
cd "$(dirname "$0")/../../.."
export OUT=${OUT:-/tmp/llmrs-s8c1}
EXTRA='TESTS=0 AWQ=0 MODELS=qwen2.5-0.5b AB_VAR=LLMRS_ATTN_KERNEL AB_VALUES="auto partial" bash scripts/gpu_ab.sh;
for v in auto partial; do echo "== profile 0.5B LLMRS_ATTN_KERNEL=$v"; LLMRS_ATTN_KERNEL=$v PYTHONPATH=$PWD:/tmp/site timeout 100 python3 -m llmrs profile --synthetic qwen2.5-0.5b --batch 1,4,16,64 --context 512 > /tmp/res-branches/profile-05b-$v.txt 2>&1; grep -iE "batch|step|wall|attention" /tmp/res-branches/profile-05b-$v.txt | head -30; done' \
TREES="_q4-bulk-prefetch _norm-fold-persistent _pair-linear _gemm-q4-splits" bash scripts/gpu_branches.sh
