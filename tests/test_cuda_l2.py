"""cuda_l2: the LLMRS_L2_PREFETCH points and the byte ranges an l2_prefetch launch covers (no GPU needed)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from llmrs.engine.backends import cuda_l2
from llmrs.errors import UserError


class Arr:
    """A device array's face as cuda_l2 reads it: .data.ptr and .nbytes."""

    def __init__(self, ptr: int, nbytes: int):
        self.data = SimpleNamespace(ptr=ptr)
        self.nbytes = nbytes


def quant(qweight, scales, zeros=None, marlin=None):
    return SimpleNamespace(group_size=128, qweight=qweight, scales=scales, zeros=zeros, marlin=marlin)


def test_points_parse_and_reject_unknown_names():
    assert cuda_l2.parse_points("0") == frozenset() and cuda_l2.parse_points("") == frozenset()
    assert cuda_l2.parse_points(None) == frozenset() and cuda_l2.parse_points("off") == frozenset()
    assert cuda_l2.parse_points("all") == frozenset(cuda_l2.POINTS)
    assert cuda_l2.parse_points(" Attn , norm2") == {"attn", "norm2"}
    with pytest.raises(UserError, match="unknown point.*qkv"):
        cuda_l2.parse_points("attn,qkv")


def test_budget_reads_mib(monkeypatch):
    monkeypatch.setenv("LLMRS_L2_PREFETCH_MB", "1.5")
    assert cuda_l2.budget_bytes() == 3 << 19
    monkeypatch.delenv("LLMRS_L2_PREFETCH_MB")
    assert cuda_l2.budget_bytes() == 24 << 20
    for bad in ("lots", "-1"):
        monkeypatch.setenv("LLMRS_L2_PREFETCH_MB", bad)
        with pytest.raises(UserError, match="LLMRS_L2_PREFETCH_MB"):
            cuda_l2.budget_bytes()


def test_ranges_take_weights_in_order_until_the_budget():
    o, gu = Arr(0x10000, 1000 * 16), Arr(0x900000, 8000 * 16)
    # o whole (16,000 bytes), then gate_up's two halves' heads, equal parts of what is left, 16-byte multiples
    r = cuda_l2.ranges_for([(o, False, False), (gu, True, False)], 16000 + 1000)
    assert r[0] == (0x10000, 16000)
    assert r[1] == (0x900000, 496) and r[2] == (0x900000 + 64000, 496)
    assert sum(n for _, n in r) <= 17000 and all(n % 16 == 0 and p % 16 == 0 for p, n in r)
    # a budget smaller than the first weight: its head only
    assert cuda_l2.ranges_for([(o, False, False), (gu, True, False)], 1000) == [(0x10000, 992)]
    # an unpaired large weight: one range from its start
    assert cuda_l2.ranges_for([(gu, False, False)], 10 ** 9) == [(0x900000, 128000)]
    assert cuda_l2.ranges_for([(o, False, False)], 0) == []


def test_quantized_weights_give_the_arrays_their_path_reads():
    q, s, z = Arr(0x1000, 4096), Arr(0x3000, 512), Arr(0x5000, 512)
    mq, msz = Arr(0x8000, 4096), Arr(0xA000, 1024)
    w = quant(q, s, z, marlin=SimpleNamespace(qweight=mq, sz=msz))
    assert cuda_l2.ranges_for([(w, False, False)], 10 ** 6) == [(0x1000, 4096), (0x3000, 512), (0x5000, 512)]
    assert cuda_l2.ranges_for([(w, False, True)], 10 ** 6) == [(0x8000, 4096), (0xA000, 1024)]
    # a weight held only in the GEMM layout (row form dropped) reads it on either path
    w2 = quant(None, s, None, marlin=SimpleNamespace(qweight=mq, sz=msz))
    assert cuda_l2.ranges_for([(w2, False, True)], 10 ** 6)[0] == (0x8000, 4096)
    # never more than l2_prefetch's four ranges
    many = [(w, False, False), (w, False, True)]
    assert len(cuda_l2.ranges_for(many, 10 ** 6)) == cuda_l2.MAX_RANGES


def test_launch_passes_four_ranges_padded_with_empty_ones():
    calls = []

    class Span:
        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    backend = SimpleNamespace(k=SimpleNamespace(l2_prefetch=lambda grid, block, args: calls.append((grid, block, args))),
                              _span=lambda *a: Span())
    cuda_l2.launch(backend, [])
    assert calls == []
    cuda_l2.launch(backend, [(0x1000, 4096), (0x3000, 512)])
    (grid, block, args), = calls
    assert grid == (cuda_l2.PREFETCH_BLOCKS,) and block == (32,)
    assert [int(a) for a in args] == [0x1000, 4096, 0x3000, 512, 0, 0, 0, 0]
    assert [type(a) for a in args[:2]] == [np.uint64, np.int64]
