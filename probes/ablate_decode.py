#!/usr/bin/env python3
"""Probe: what each class of launch costs inside the graphed one-stream decode step, by leaving it out.
Last result (H200, us a layer saved, 7B bf16 / 3B): decode attention 6.1 / 8.3, o 7.6 / 5.6, qkv 9.5 / 7.1,
gate_up + down 99.6 / 38.7; the 4-bit RMSNorms ~5 us a layer.

Where a single-stream decode step's time goes inside its CUDA graph, by ablation (GPU; timing only).

Eager per-kernel timings (`llmrs profile`) add a launch and two events around every kernel; inside a decode graph
each kernel overlaps its neighbours' tails (programmatic dependent launch), so its real cost is what the step
loses when it is gone. This builds a synthetic preset once and times the engine's run-ahead single-stream decode
(`run_ahead_intervals`, the `--decode-bench` loop) with classes of launches left out of the step (the
graphs recaptured each time); the outputs are then wrong, the times are the point:

  norm   the RMSNorms before qkv and gate_up (their input passed through)   attn   the decode attention
  o      the o projection                  qkv   the qkv projection (+ RoPE / KV write)
  mlp    gate_up (+ SiLU) and down         head  the final norm and lm_head (the sampler reads stale logits)

Leaving out a part that keeps the states normalized changes what the head and the sampler see, and the sampler's
time depends on the logits (ties, non-finite values): "-norm" alone made the 7B AWQ step 0.13 ms *slower*, while
"-norm-head" against "-head" (the same stale logits sampled in both) showed the norms' real ~5 us a layer. Compare such parts with the head left out on both sides: "-head/-norm-head".

A variant "set:NAME=VALUE[,NAME=VALUE]" instead runs the whole step with backend attributes set (a Python literal
or a string; restored afterwards): an A/B of a backend switch in one process, e.g. "full/set:matvec_smem=False".

  python -m probes.ablate_decode --like qwen2.5-7b [--quant awq] --variants "full/-norm/-attn/-norm-attn"
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time

import numpy as np

PARTS = ("norm", "attn", "o", "qkv", "mlp", "head")
PATCHED = ("_norm_for", "_attention", "_linear", "_matvec_pair", "_rms_norm")  # the backend methods `ablate` shadows


def restore(backend) -> None:
    """Undo `ablate`: drop the instance attributes that shadow the class's methods."""
    for name in PATCHED:
        backend.__dict__.pop(name, None)


def ablate(backend, parts: set[str]) -> None:
    """Patch the backend instance so that the named parts launch nothing (`restore` undoes it)."""
    cls = type(backend)
    if "norm" in parts:
        backend._norm_for = lambda lin, x, w, eps, y=None: x
    if "attn" in parts:
        backend._attention = lambda layer, q, q_stride, db, out, out_bf16=None: out
    skip = {n for p, ns in (("o", ("o",)), ("qkv", ("qkv",)), ("mlp", ("gate_up", "down")), ("head", ("lm_head",)))
            if p in parts for n in ns}
    if skip:
        def linear(x, w, bias, out, accumulate=False, name="linear", out_bf16=False, preload=False):
            if name not in skip:
                cls._linear(backend, x, w, bias, out, accumulate, name, out_bf16, preload)
        backend._linear = linear
    pair_skip = ({"rope"} if "qkv" in parts else set()) | ({"silu"} if "mlp" in parts else set())
    if pair_skip:
        def pair(epi, *a, **kw):
            if epi not in pair_skip:
                cls._matvec_pair(backend, epi, *a, **kw)
        backend._matvec_pair = pair
    if "head" in parts:  # the final norm is the one over the sampled rows
        def rms_norm(x, w, eps, out, rows=None, n_rows=None):
            if rows is None:
                cls._rms_norm(backend, x, w, eps, out, rows, n_rows)
        backend._rms_norm = rms_norm


class recording:
    """A kernel that adds its name to `names` at each launch (the graphs are captured through it); its other
    attributes (num_regs, ...) are the kernel's."""

    def __init__(self, fn, name: str, names: set[str]):
        self.fn, self.name, self.names = fn, name, names

    def __call__(self, *args, **kwargs):
        self.names.add(self.name)
        return self.fn(*args, **kwargs)

    def __getattr__(self, attr: str):
        return getattr(self.fn, attr)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--like", required=True)
    ap.add_argument("--quant", default=None)
    ap.add_argument("--variants", default="full/-norm/-attn/-norm-attn/-o/-head/-norm-attn-o-head",
                    help="/-separated; each 'full' or '-PART-PART...' (PARTS)")
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()

    from llmrs.profiling.decode_bench import run_ahead_intervals, single_stream

    warmup = 8
    ss = single_stream(a.like, a.prompt_len, warmup + a.steps + 1, a.quant)
    c, backend = ss.config, ss.backend
    variants = []  # (label, parts left out, attributes set)
    for v in a.variants.split("/"):
        attrs: dict = {}
        if v.startswith("set:"):
            for kv in v[4:].split(","):
                k, _, val = kv.partition("=")
                if not hasattr(backend, k):
                    ap.error(f"{v!r}: the backend has no attribute {k!r}")
                try:
                    attrs[k] = ast.literal_eval(val)
                except (ValueError, SyntaxError):
                    attrs[k] = val
            variants.append((v, set(), attrs))
            continue
        parts = set() if v == "full" else {p for p in v.split("-") if p}
        bad = parts - set(PARTS)
        if bad:
            ap.error(f"unknown part(s) {sorted(bad)} in {v!r}; parts: {', '.join(PARTS)}")
        variants.append((v, parts, attrs))
    res: dict[str, list[float]] = {v[0]: [] for v in variants}
    launched: dict[str, set[str]] = {}  # the kernels each variant's step launched (round 1): a set: switch took effect
    tag = a.like + (" " + a.quant if a.quant else "")
    for r in range(a.rounds):
        for label, parts, attrs in variants:
            restore(backend)
            ablate(backend, parts)
            saved = {k: getattr(backend, k) for k in attrs}
            for k, val in attrs.items():
                setattr(backend, k, val)
            backend.graphs.graphs.clear()
            fns = dict(backend.k.fns)
            if r == 0:
                names = launched.setdefault(label, set())
                backend.k.fns.update({n: recording(fn, n, names) for n, fn in fns.items()})
            try:
                t = run_ahead_intervals(ss.model, backend, ss.state, a.prompt_len, ss.table, ss.bs, warmup, a.steps)
            finally:
                backend.k.fns.update(fns)
            for k, val in saved.items():
                setattr(backend, k, val)
            res[label].append(round(1000 * float(np.median(t)), 4))
            print(f"{tag} round {r + 1} {label:>28}: {res[label][-1]:.4f} ms/token", flush=True)
            if r == 0 and label != variants[0][0]:
                base = launched[variants[0][0]]
                print(f"{'':>28}  kernels: +{sorted(launched[label] - base)} -{sorted(base - launched[label])}")
    full = min(res[variants[0][0]])
    L = c.num_hidden_layers
    print(f"--- {tag}: best of {a.rounds}, and what leaving the parts out saves ({L} layers)")
    for label, ms in res.items():
        d = full - min(ms)
        print(f"{label:>28}: {min(ms):.4f} ms/token  saves {d:+.4f} ms = {1000 * d / L:+.2f} us a layer")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"preset": a.like, "quant": a.quant, "prompt_len": a.prompt_len, "steps": a.steps,
                       "time": time.strftime("%Y-%m-%d %H:%M:%S"), "ms_per_token": res,
                       "kernels": {k: sorted(v) for k, v in launched.items()}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
