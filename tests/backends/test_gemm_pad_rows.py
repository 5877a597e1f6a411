"""CudaOptions.gemm_pad_rows: the bf16 GEMMs of an eager step run on gemm_rows(T) rows, so cuBLAS sees far fewer distinct
token counts (its first call of a (count, shape) costs ~2.6 ms of host time on the H200). On the CPU: the row
counts, the workspace's room for the padding rows, and the row count `_linear` hands cuBLAS (a recording stand-in)
with and without room."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from llmrs.backends import cuda as C
from llmrs.backends.cuda.graphs import BUCKETS
from llmrs.backends.cuda.graphs import PREFILL_BUCKETS


def test_gemm_rows_buckets():
    assert [C.gemm_rows(t) for t in (1, 2, 63, 64)] == [1, 2, 63, 64]  # small batches exact
    assert [C.gemm_rows(t) for t in (65, 96, 97, 500, 512)] == [96, 96, 128, 512, 512]
    assert [C.gemm_rows(t) for t in (513, 2000, 2048, 2049, 8191, 8192)] == [576, 2048, 2048, 2176, 8192, 8192]
    assert all(C.gemm_rows(t) >= t and C.gemm_rows(C.gemm_rows(t)) == C.gemm_rows(t) for t in range(1, 9000))
    # no padding for the graphs' own row counts (decode batch buckets, lone-prefill buckets)
    assert all(C.gemm_rows(b) == b for b in BUCKETS + PREFILL_BUCKETS)
    assert len({C.gemm_rows(t) for t in range(1, 8193)}) == 64 + 14 + 24 + 48


class FakeCp:
    @staticmethod
    def empty(n, dtype=np.float32):
        return np.empty(n, dtype=dtype)


def test_buf_leaves_room_for_the_padding_rows_only_when_on():
    be = object.__new__(C.CUDABackend)
    be.cp, be._ws, be._views = FakeCp, {}, {}
    assert be._buf("x", (65, 8)).shape == (65, 8) and be._ws["x"].size == 65 * 8  # off: exact
    be.gemm_pad_rows = True
    be._ws, be._views = {}, {}
    a = be._buf("x", (65, 8))
    assert a.shape == (65, 8) and be._ws["x"].size == 96 * 8
    buf = be._ws["x"]
    assert np.shares_memory(be._buf("x", (90, 8)), a) and be._ws["x"] is buf  # 90 rows pad to 96: no growth
    be._buf("x", (97, 8))
    assert be._ws["x"].size == 128 * 8
    assert be._buf("y", (100,)).size == 100 and be._ws["y"].size == 100  # 1-D: no rows


class Mem:
    """A cupy-like array: shape, dtype and a device pointer into an allocation of `alloc` bytes."""

    def __init__(self, shape, dtype, alloc, ptr=1 << 20, offset=0):
        self.shape, self.dtype = shape, np.dtype(dtype)
        self.itemsize = self.dtype.itemsize
        self.data = SimpleNamespace(ptr=ptr + offset, mem=SimpleNamespace(ptr=ptr, size=alloc))


def test_room_bytes():
    assert C.room_bytes(Mem((4, 8), np.float32, 512)) == 512
    assert C.room_bytes(Mem((4, 8), np.float32, 512, offset=128)) == 384


def linear_backend(pad: bool):
    be = object.__new__(C.CUDABackend)
    calls = []
    be.gemm_pad_rows, be.matvec_max_tokens, be.profiler = pad, 0, None
    be.k = SimpleNamespace()
    be._gemm_takes_bf16 = lambda w, T: True
    be._handle, be._one_ptr, be._zero_ptr = 0, 0, 0
    be._raw_gemm = lambda *a: calls.append(a)
    return be, calls


@pytest.mark.parametrize("pad", [False, True])
def test_linear_hands_cublas_the_padded_rows_where_both_buffers_have_room(pad):
    T, N, K = 70, 16, 32  # gemm_rows(70) = 96
    be, calls = linear_backend(pad)
    w = SimpleNamespace(shape=(N, K), data=SimpleNamespace(ptr=7))
    x = Mem((T, K), np.uint16, 96 * K * 2)
    out = Mem((T, N), np.float32, 96 * N * 4)
    be._linear(x, w, None, out, name="o")
    assert calls[-1][4] == (96 if pad else T)  # cuBLAS's n: the tokens (column-major out^T [N, T])
    be._linear(x, w, None, Mem((T, N), np.float32, 80 * N * 4), name="o")  # an output without room: exact
    assert calls[-1][4] == T
    be._linear(Mem((T, K), np.uint16, T * K * 2), w, None, out, name="o")  # an input without room: exact
    assert calls[-1][4] == T
