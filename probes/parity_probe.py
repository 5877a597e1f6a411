"""Probe: the embedded SmolLM2's per-prompt logits error on the GPU against the CPU reference.
Last result (H200): 0.0234 max on a 5-token prompt on the default path (bound 4e-2), argmax equal.

Per-prompt logits error of the embedded SmolLM2 on the GPU (default path) against the CPU reference with bf16
K/V, for attributing a parity change to a backend option (set it on CUDABackend / CudaOptions before running):

    python -m probes.parity_probe LABEL

(run from the repository root; the embedded model installed or LLMRS_EMBEDDED_DIR set)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    from llmrs.model.loader import load
    from llmrs.engine.runner import ModelRunner
    from tests.cuda_helpers import rel_err
    from tests.gpu.test_cuda_parity_gpu import last_logits, reference

    label = sys.argv[1] if len(sys.argv) > 1 else "run"
    loaded = load("smollm2-135m")
    gpu = ModelRunner(loaded, num_blocks=64, device="cuda")
    cpu = reference(loaded, 64, bf16_kv=True)
    tok = loaded.tokenizer
    for name, ids in [("france", tok.encode("The capital of France is")),
                      ("chat", tok.encode_chat([{"role": "user",
                                                "content": "What is paged attention? Answer briefly."}])),
                      ("fib", tok.encode("def fibonacci(n):"))]:
        g, c = last_logits(gpu, ids), last_logits(cpu, ids)
        print(f"{label:28s} {name:7s} T={len(ids):3d} rel {rel_err(g, c):.4f} max_abs {np.abs(g - c).max():.4f} "
              f"argmax {int(np.argmax(g)) == int(np.argmax(c))}")


if __name__ == "__main__":
    main()
