"""Host (Python) time of an eager step of the fused forward pass, without a GPU: CUDABackend._forward_device with
CuPy replaced by fake arrays (shape, dtype, views, data.ptr) and every kernel launch and cuBLAS call by a no-op
that counts its calls (`fake_backend(c).k.fns[name].calls`, `.gemm_calls`: tests/tools/test_bench_host_prefill.py reads
them to check the step's dispatch without a GPU).

What it measures is our own code per step (workspace views, argument tuples, numpy scalars, shape checks,
device_batch's packing); CuPy's own cost per launch (~8.5 us on the H200's host, issue 8's anchor) comes on top
on a GPU. An eager step whose host time approaches its GPU time leaves the GPU idle between launches: on the
H200 an eager 256-token prefill of the 7B ran 9.29 ms of wall for 7.61 ms of kernels. The fake views cost about what CuPy's do (a Python object each), so a change in the
number of views made shows here.

    python -m tools.bench_host_prefill --like qwen2.5-7b --tokens 1,16,256 --steps 50
"""

from __future__ import annotations

import argparse
import sys
import time
import types
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


class _Ptr:
    __slots__ = ("ptr",)

    def __init__(self) -> None:
        self.ptr = 1 << 20


class _Flags:
    c_contiguous = True


class FakeArray:
    """A device array's metadata and nothing else."""

    __slots__ = ("shape", "dtype", "data", "flags")

    def __init__(self, shape, dtype=np.float32) -> None:
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.data = _Ptr()
        self.flags = _Flags

    @property
    def size(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def __getitem__(self, k):
        if isinstance(k, slice):
            return FakeArray((len(range(*k.indices(self.shape[0]))),) + self.shape[1:], self.dtype)
        return self

    def reshape(self, *shape):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], tuple) else shape
        return FakeArray(shape, self.dtype)

    def set(self, *a, **k) -> None:
        pass


class _FakeCp:
    class cuda:  # noqa: N801 (CuPy's name)
        class Event:
            def __init__(self, **k) -> None:
                pass

            def record(self, *a) -> None:
                pass

            def synchronize(self) -> None:
                pass

        @staticmethod
        def get_current_stream():
            return types.SimpleNamespace(ptr=0)

    @staticmethod
    def empty(n, dtype=np.float32) -> FakeArray:
        return FakeArray((n,) if isinstance(n, int) else n, dtype)

    zeros = empty  # (the backend's split counters: `_counters`)
    int32 = np.int32


class _Launch:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, grid, block, args, shared_mem=0) -> None:
        self.calls += 1
        for a in args:  # a launcher looks at every argument
            getattr(a, "data", None)


class _Fns(dict):
    def __missing__(self, name):
        f = self[name] = _Launch()
        return f


class _Kernels:
    def __init__(self) -> None:
        self.fns = _Fns()
        # an H200's: compute capability, and the wgmma forms compiled
        self.cc, self.wgmma, self.wgmma_t256, self.bf16_wgmma, self.pdl = 90, True, True, False, False

    def __getattr__(self, name):
        return self.fns[name]


def fake_backend(config):
    from llmrs.backends import cuda as C

    be = object.__new__(C.CUDABackend)
    be.cp, be.k, be.config, be.tp, be.profiler, be.graphs = _FakeCp, _Kernels(), config, None, None, None
    be._ws, be._pin, be._staged, be._raw_gemm, be._views, be._cluster_counts = {}, {}, {}, None, {}, {}
    be.block_size, be.num_blocks, be.pad_block = 16, 1 << 16, 1 << 16
    be.matvec_max_tokens, be.quant_matvec_max_tokens, be.matvec_splits = C.MATVEC_MAX_TOKENS, 8, 0
    be.prefill_min_tokens, be.attn_kernel, be.attn_splits, be.num_sms = 16, "auto", None, 132
    be.dpl, be.scale = max(1, config.head_dim // 32), np.float32(0.1)
    # what __init__ sets from the environment, at its defaults
    be.attn_cluster, be._lt, be.long_k_splits, be.gate_up_bf16 = None, None, 0, True
    be.attn_heads_per_block = None
    be.square_k_splits = False
    L, Hkv, D = config.num_hidden_layers, config.num_key_value_heads, config.head_dim
    be.k_cache = [FakeArray((64, Hkv, 16, D), np.uint16) for _ in range(L)]
    be.v_cache = list(be.k_cache)
    be.inv_freq = FakeArray((D // 2,))
    be._one, be._zero = np.array(1.0, np.float32), np.array(0.0, np.float32)
    be._one_ptr, be._zero_ptr, be._handle = be._one.ctypes.data, be._zero.ctypes.data, 0
    be.gemm_calls = [0]

    def gemm(*a) -> None:
        be.gemm_calls[0] += 1

    be.cublas = types.SimpleNamespace(gemmEx=gemm)
    be._pinned = lambda name, n, dtype: np.empty(n, dtype)
    return be


def fake_weights(c):
    H, I, Hq, Hkv, D = c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    n_qkv = (Hq + 2 * Hkv) * D
    layer = types.SimpleNamespace(input_norm=FakeArray((H,)), post_norm=FakeArray((H,)),
                                  qkv=FakeArray((n_qkv, H), np.uint16), qkv_bias=FakeArray((n_qkv,)),
                                  o=FakeArray((H, Hq * D), np.uint16), gate_up=FakeArray((2 * I, H), np.uint16),
                                  down=FakeArray((H, I), np.uint16))
    return types.SimpleNamespace(embed=FakeArray((c.vocab_size, H), np.uint16), layers=[layer] * c.num_hidden_layers,
                                 norm=FakeArray((H,)), lm_head=FakeArray((c.vocab_size, H), np.uint16))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--like", default="qwen2.5-7b")
    ap.add_argument("--tokens", default="1,16,256", help="new tokens of the one sequence the step computes")
    ap.add_argument("--steps", type=int, default=50)
    a = ap.parse_args()

    from llmrs.engine.batch import build_step_batch
    from llmrs.model.presets import preset_config

    c = preset_config(a.like)
    be, w = fake_backend(c), fake_weights(c)
    for T in (int(t) for t in a.tokens.split(",")):
        batch = build_step_batch([(list(range(3, 3 + T)), 0, list(range(-(-T // 16))), True)], 16)
        for _ in range(3):
            be._forward_device(w, be.device_batch(batch))
        t0 = time.perf_counter()
        for _ in range(a.steps):
            db = be.device_batch(batch)
        t1 = time.perf_counter()
        for _ in range(a.steps):
            be._forward_device(w, db)
        t2 = time.perf_counter()
        print(f"{a.like} T={T:4d}: device_batch {1e3 * (t1 - t0) / a.steps:.3f} ms, _forward_device "
              f"{1e3 * (t2 - t1) / a.steps:.3f} ms of Python a step (fake launches, {c.num_hidden_layers} layers)")


if __name__ == "__main__":
    main()
