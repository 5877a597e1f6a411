"""Roofline toolkit: GPU ceilings with sources, the model cost model, plots, and the PTX local-memory check.

gpus.json + gpus.py   the GPU database (datasheet numbers, each sourced) and NVML matching
measured.py           `--measure`: real copy bandwidth and bf16 GEMM throughput, cached per GPU
presets.py            exact shapes of the benchmark models (`preset_config`, reused by `llmrs synth`)
formats.py            bits per weight of each storage format
model_source.py       MODEL argument -> ModelCost (preset, HF directory, .gguf with its real tensor types)
cost.py               bytes and FLOPs of a decode step and of a prefill load
analysis.py           the roofline: which roof binds, floors, crossover batch
overlay.py, plot.py   measured points and the log-log chart
ptx/                  `llmrs ptx-check`
cli.py, render.py     the commands and their tables
"""
