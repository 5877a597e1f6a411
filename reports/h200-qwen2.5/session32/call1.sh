#!/usr/bin/env bash
# Session 32, call 1 (no carry): session 31's call6 (0.5B one token on attn_cluster under auto: GPU test + figure),
# then session 31's next/call-attn-o-w8.sh (attn_o_cluster8_w8 tests, clusters at once, 3B/1.5B A/B).
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
S=reports/h200-qwen2.5/session31
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee $OUT/gpu.txt
bash $S/call6.sh
bash $S/next/call-attn-o-w8.sh
