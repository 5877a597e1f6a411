"""End to end: the CUDA backend against the CPU reference fed the same bf16-rounded weights.

Tiny random Llama (GQA, tied, llama3 rope scaling) and Qwen2 (q/k/v bias, untied) checkpoints written by the
test, and the real SmolLM2 GGUF when installed: last-token logits close (max abs / rel error reported),
greedy continuations of 32 tokens identical; batched steps (mixed prefill chunks, decodes, a prefix-cache
hit) give the same tokens as one sequence at a time.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.cuda_helpers import rel_err, report, require_gpu

cp = require_gpu()
pytestmark = pytest.mark.gpu

from llmrs.model.weights import round_bf16  # noqa: E402
from llmrs.engine.batch import build_step_batch  # noqa: E402
from llmrs.model.loader import load  # noqa: E402
from llmrs.engine.runner import ModelRunner, stream_generate  # noqa: E402
from llmrs.engine.sampling import SamplingParams  # noqa: E402
from llmrs.errors import UserError  # noqa: E402
from tests.conftest import write_tiny_model  # noqa: E402

N_NEW = 32
BS = 16


def rounded(loaded):
    """The same checkpoint with every tensor rounded to bf16 (what the GPU holds), for the CPU reference."""
    return dataclasses.replace(loaded, tensors={k: round_bf16(v) for k, v in loaded.tensors.items()})


def reference(loaded, num_blocks, bf16_kv):
    """The CPU reference on bf16-rounded weights; with bf16_kv its K/V are also rounded to bf16 when written
    (what the GPU cache stores), so only summation order and GEMM activations remain as differences."""
    r = ModelRunner(rounded(loaded), num_blocks=num_blocks, device="cpu")
    if bf16_kv:
        write = r.backend.write_kv
        r.backend.write_kv = lambda layer, k, v, slots: write(layer, round_bf16(k), round_bf16(v), slots)
    return r


def last_logits(runner, ids):
    batch = build_step_batch([(ids, 0, list(range(-(-len(ids) // BS))), True)], BS)
    return runner.execute(batch)[0]


def greedy(runner, ids, n=N_NEW):
    params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
    return [o.token_ids[0] for o in stream_generate(runner, ids, params)]


def compare(name, gpu, cpu, prompts, strict=False, rel_tol=2e-2):
    """Logit errors of every prompt (relative error under rel_tol), and greedy tokens equal. A divergence is
    accepted only at a genuine near tie of the reference (top-2 margin below 4x the worst logit error seen):
    reported, never silent."""
    worst_abs, worst_rel = 0.0, 0.0
    for ids in prompts:
        g, c = last_logits(gpu, ids), last_logits(cpu, ids)
        worst_abs = max(worst_abs, float(np.abs(g - c).max()))
        worst_rel = max(worst_rel, rel_err(g, c))
        top2 = np.sort(c)[-2:]
        assert int(np.argmax(g)) == int(np.argmax(c)) or top2[1] - top2[0] < 4 * np.abs(g - c).max()
    report(f"{name} logits", {"max_abs": worst_abs, "rel": worst_rel})
    assert worst_rel < rel_tol, worst_rel
    identical, near_ties = 0, []
    for ids in prompts:
        tg, tc = greedy(gpu, ids), greedy(cpu, ids)
        if tg == tc:
            identical += 1
            continue
        assert not strict, f"{name}: greedy tokens differ: {tg} vs {tc}"
        i = next(k for k in range(len(tc)) if tg[k] != tc[k])
        ref = last_logits(cpu, ids + tc[:i])
        top2 = np.sort(ref)[-2:]
        margin = float(top2[1] - top2[0])
        near_ties.append({"prompt_len": len(ids), "step": i, "margin": margin})
        assert margin < 4 * max(worst_abs, 1e-3), f"greedy tokens diverge at step {i} with margin {margin}"
    report(f"{name} greedy32", {"identical": identical, "of": len(prompts), "near_tie_divergences": near_ties})
    return worst_abs, worst_rel


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny_cuda")
    return {"llama": write_tiny_model(d / "llama", "llama"), "qwen2": write_tiny_model(d / "qwen2", "qwen2")}


def prompts_for(tok):
    ps = [tok.encode(t) for t in ("Hello world!", "The quick brown fox jumps over the lazy dog. " * 3, "🙂")]
    ps.append(tok.encode_chat([{"role": "user", "content": "Paged attention?"}]))
    ps.append(tok.encode("Unicode: café, naïve, Zürich. " * 8))  # > 64 tokens: llama3 scaling matters
    return ps


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("mode", ["default/f32-kv-ref", "default/bf16-kv-ref", "matvec/bf16-kv-ref"])
def test_tiny_model_matches_cpu_reference(arch, mode, tiny_models):
    """default: prefill GEMMs on bf16 activations; matvec: every linear on f32 activations. Against the
    reference with bf16 K/V and f32 activations everywhere, the matvec mode must give identical tokens."""
    loaded = load(str(tiny_models[arch]))
    gpu = ModelRunner(loaded, num_blocks=32, device="cuda")
    assert gpu.device == "cuda" and type(gpu.backend).__name__ == "CUDABackend"
    path, ref = mode.split("/")
    if path == "matvec":  # f32 activations everywhere: matvecs, and the f32 attention kernel for prefill too
        gpu.backend.matvec_max_tokens, gpu.backend.prefill_min_tokens = 1 << 30, None
    cpu = reference(loaded, 32, bf16_kv=ref == "bf16-kv-ref")
    # default: the GEMM path's bf16 gate/up output (CudaOptions.gate_up_bf16) took the tiny Qwen2's worst logit error from
    # 0.012 to 0.021 on the H200 (llama 0.015 -> 0.016), hence 3e-2 there; the greedy tokens still must agree but at
    # a genuine near tie
    compare(f"tiny {arch} {mode}", gpu, cpu, prompts_for(loaded.tokenizer), strict=mode == "matvec/bf16-kv-ref",
            rel_tol=2e-2 if path == "matvec" else 3e-2)


def test_model_forward_over_protocol_equals_fused_step(tiny_models):
    """Model.forward op by op over the Backend protocol gives the fused forward's logits."""
    from llmrs.model.decoder import Model

    loaded = load(str(tiny_models["qwen2"]))
    fused = ModelRunner(loaded, num_blocks=32, device="cuda")
    fused.backend.gate_up_bf16 = False  # a bf16 gate/up is a rounding the protocol's f32 ops do not make
    plain = ModelRunner(loaded, num_blocks=32, device="cuda")
    plain.model = Model(plain.config, plain.model.w, plain.backend)
    ids = loaded.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 2)
    a, b = last_logits(fused, ids), last_logits(plain, ids)
    assert rel_err(a, b) < 1e-5


def run_batched(runner, prompts, chunks, shared_prefix_blocks, n_decode=8):
    """Each step: every sequence still prefilling gets its next chunk (`chunks[s]` tokens), every finished
    one decodes a token; sequence s>0 listed in `shared_prefix_blocks` starts with seq 0's first block cached
    (a prefix-cache hit: same tokens, same block id). Returns the greedy tokens of each sequence."""
    B = len(prompts)
    blocks_per_seq = 12
    tables = [list(range(s * blocks_per_seq, (s + 1) * blocks_per_seq)) for s in range(B)]
    cached = [0] * B
    for s in shared_prefix_blocks:
        tables[s][0] = tables[0][0]
        cached[s] = BS
    out = [[] for _ in range(B)]
    step = 0
    while any(len(o) < n_decode for o in out):
        seqs, owners = [], []
        for s in range(B):
            if len(out[s]) >= n_decode:
                continue
            if s in shared_prefix_blocks and step == 0:
                pass  # seq 0 must have written the shared block first
            elif cached[s] < len(prompts[s]):
                n = min(chunks[s], len(prompts[s]) - cached[s])
                done = cached[s] + n == len(prompts[s])
                seqs.append((prompts[s][cached[s]: cached[s] + n], cached[s], tables[s], done))
                owners.append((s, n, done))
                continue
            else:
                seqs.append(([out[s][-1]], cached[s], tables[s], True))
                owners.append((s, 1, True))
        step += 1
        if not seqs:
            continue
        batch = build_step_batch(seqs, BS)
        batch.validate(BS)
        logits = runner.execute(batch)
        row = 0
        for s, n, sampled in owners:
            cached[s] += n
            if sampled:
                out[s].append(int(np.argmax(logits[row])))
                row += 1
    return out


def test_batched_mixed_steps_equal_one_at_a_time(tiny_models):
    loaded = load(str(tiny_models["llama"]))
    tok = loaded.tokenizer
    base = tok.encode("The quick brown fox jumps over the lazy dog. Hello world! ")
    assert len(base) >= BS
    prompts = [base + tok.encode("Paged attention"), tok.encode("Unicode: café, naïve, Zürich. " * 3),
               tok.encode("🙂"), base[:BS] + tok.encode(" continuous batching keeps the GPU busy.")]
    runner = ModelRunner(loaded, num_blocks=64, device="cuda")

    def both():
        alone = [run_batched(runner, [p], [1 << 20], [], n_decode=8)[0] for p in prompts]
        # seq 1 prefills in chunks of 7 (chunks over a cached prefix), seq 3 hits seq 0's first block
        together = run_batched(runner, prompts, [1 << 20, 7, 1 << 20, 5], [3], n_decode=8)
        return alone, together

    alone, together = both()  # default settings: GEMM for big steps, splits chosen per step
    report("batched vs alone (default paths)", {"equal": together == alone, "alone": alone, "together": together})
    # same per-token arithmetic whatever the batch: matvec for every step, one attention split
    runner.backend.matvec_max_tokens, runner.backend.attn_splits = 1 << 30, 1
    runner.backend.prefill_min_tokens = None  # the tensor-core prefill kernel tiles by sequence and rounds q to bf16
    alone, together = both()
    assert together == alone


@pytest.mark.parametrize("mode", ["default/f32-kv-ref", "default/bf16-kv-ref", "matvec/bf16-kv-ref"])
def test_smollm2_gguf_matches_cpu_reference(mode):
    """The real SmolLM2 (Q4_1 GGUF, dequantized then bf16): the embedded package, or $LLMRS_SMOLLM2_GGUF."""
    import os

    try:
        loaded = load(os.environ.get("LLMRS_SMOLLM2_GGUF") or "smollm2-135m")
    except UserError as e:
        pytest.skip(str(e))
    gpu = ModelRunner(loaded, num_blocks=64, device="cuda")
    path, ref = mode.split("/")
    if path == "matvec":
        gpu.backend.matvec_max_tokens, gpu.backend.prefill_min_tokens = 1 << 30, None
    cpu = reference(loaded, 64, bf16_kv=ref == "bf16-kv-ref")
    tok = loaded.tokenizer
    prompts = [tok.encode("The capital of France is"),
               tok.encode_chat([{"role": "user", "content": "What is paged attention? Answer briefly."}]),
               tok.encode("def fibonacci(n):")]
    # the default path runs every prompt of 2+ tokens through cuBLAS on bf16 activations (MATVEC_MAX_TOKENS = 1):
    # measured on the H200, "The capital of France is" (5 tokens) 0.0234 relative logits error there against 0.0019
    # with the f32 matvec (matvec_max_tokens=8), the other prompts <= 0.006, argmax equal each time
    # (reports/h200-qwen2.5/one-stream/call9-parity-probe); the matvec path keeps the f32 bound
    compare(f"smollm2-135m {mode}", gpu, cpu, prompts, rel_tol=2e-2 if path == "matvec" else 4e-2)
