"""CUDABackend._buf, the workspace views of the fused step, on the CPU: a fake `cp` stands in for CuPy (the views'
logic does not need a GPU). A view is handed out again while the same buffer backs it; a grown buffer and the
decode graphs' own workspace (swapped in while capturing) get views of their own."""

from __future__ import annotations

import numpy as np

from llmrs.backends.cuda import backend as C


class FakeCp:
    allocations = 0

    @classmethod
    def empty(cls, n, dtype=np.float32):
        cls.allocations += 1
        return np.empty(n, dtype=dtype)


def backend():
    be = object.__new__(C.CUDABackend)
    be.cp, be._ws, be._views = FakeCp, {}, {}
    return be


def test_a_view_is_reused_while_its_buffer_backs_it():
    be = backend()
    a = be._buf("x", (4, 8))
    assert a.shape == (4, 8) and a.dtype == np.float32
    assert be._buf("x", (4, 8)) is a
    b = be._buf("x", (2, 8))  # smaller: the same buffer, another view
    assert b is not a and np.shares_memory(a, b) and b.shape == (2, 8)
    assert be._buf("h", (4, 8), np.uint16).dtype == np.uint16


def test_a_grown_buffer_drops_the_old_views():
    be = backend()
    a = be._buf("x", (2, 8))
    n0 = FakeCp.allocations
    big = be._buf("x", (64, 8))
    assert FakeCp.allocations == n0 + 1 and big.shape == (64, 8)
    again = be._buf("x", (2, 8))
    assert again is not a and np.shares_memory(again, big)  # a view of the new buffer, not of the freed one
    assert all(v[0] is be._ws["x"] for k, v in be._views.items() if k[0] == "x")


def test_a_swapped_workspace_gets_its_own_views():
    be = backend()
    eager = be._buf("x", (4, 8))
    saved, be._ws = be._ws, {}  # what DecodeGraphs._capture does
    captured = be._buf("x", (4, 8))
    assert captured is not eager and not np.shares_memory(captured, eager)
    be._ws = saved
    back = be._buf("x", (4, 8))
    assert np.shares_memory(back, eager) and not np.shares_memory(back, captured)


def test_the_view_cache_stays_bounded():
    be = backend()
    for t in range(C.VIEW_CACHE_MAX + 10):
        be._buf("batch", (t + 1,), np.int32)
    assert len(be._views) <= C.VIEW_CACHE_MAX
