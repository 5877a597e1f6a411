#!/usr/bin/env bash
# Session 35, call 1 (carry .whl): attn_cluster's merge through st.async + each receiver's mbarrier, and
# block_counts_last with one fence.acq_rel.gpu by thread 0 (next/cluster-fences.patch). _base/ = the tree before
# (`mkdir _base && git archive 5a7bca9 llmrs | tar -x -C _base`, untracked). The GPU tests of every kernel whose PTX
# the change touches (checked on the CPU: attn_cluster*, attn_o_cluster*, every gemv_q4 form, sample_tokens; the
# other 64 entries of sm_90 are byte-identical; TEST_PATHS to widen), then the decode bench (prompt 256, 256 steps,
# one run a process) new / base alternated: 7B and 3B bf16 (RUNS, default 1), the 7B AWQ.
export OUT
TESTS=1 TEST_PATHS="${TEST_PATHS:-tests/test_attention_cluster_gpu.py tests/test_attention_o_gpu.py \
tests/test_gemv_q4_gpu.py tests/test_sampling.py}" TEST_TIMEOUT=240 AB_VAR=LLMRS_UNUSED_SWITCH AB_VALUES="x base" \
  BASE_TREE=$PWD/_base MODELS="${MODELS-qwen2.5-7b qwen2.5-3b}" RUNS="${RUNS:-1}" AWQ=1 bash scripts/gpu_ab.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
