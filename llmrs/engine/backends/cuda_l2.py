"""L2 prefetch of the next decode weights (elementwise.cu's l2_prefetch, sm_90+).

A decode step at a few tokens streams its weights at near the DRAM bandwidth inside each projection, but between
them the latency-bound kernels (attention, the RMSNorms before qkv and gate_up) leave DRAM idle for microseconds a
layer. `LLMRS_L2_PREFETCH` names the points where a one-node l2_prefetch is launched just before such a kernel, to
pull the head of the weight(s) read next into L2 (at most `LLMRS_L2_PREFETCH_MB` MiB a point; H200's L2 is 50 MB):

  attn   before the decode attention: o, then gate_up's head
  norm2  before the RMSNorm after o (where it is its own kernel): gate_up's head
  norm1  before the RMSNorm before qkv (where it is its own kernel): qkv

`all` is the three; `0` / empty: none. Only steps of at most `LLMRS_L2_PREFETCH_MAX_TOKENS` (MAX_TOKENS) tokens
without a prefill, on one GPU of compute capability 9.0 or more.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from llmrs.errors import UserError

POINTS = ("attn", "norm2", "norm1")
PREFETCH_BLOCKS = 64  # 64 blocks of 32 threads, each thread issuing 16 KiB prefetches grid-stride (L2P_CHUNK)
MAX_TOKENS = 8  # steps up to this many tokens stream their weights (the matvec, the GEMV, cuBLAS at small T)
MAX_RANGES = 4  # l2_prefetch's byte ranges a launch
ALIGN = 16  # cp.async.bulk.prefetch: 16-byte aligned address, size a multiple of 16


def parse_points(value: str | None) -> frozenset[str]:
    """LLMRS_L2_PREFETCH's value: a comma list of POINTS, `all`, or 0 / empty / off."""
    v = (value or "").strip().lower()
    if v in ("", "0", "off", "false", "no", "none"):
        return frozenset()
    if v == "all":
        return frozenset(POINTS)
    pts = [p.strip() for p in v.split(",") if p.strip()]
    bad = [p for p in pts if p not in POINTS]
    if bad:
        raise UserError(f"LLMRS_L2_PREFETCH={value!r}: unknown point(s) {', '.join(bad)}; expected a comma list of "
                        f"{', '.join(POINTS)}, all, or 0")
    return frozenset(pts)


def budget_bytes() -> int:
    """LLMRS_L2_PREFETCH_MB (default 24) in bytes."""
    raw = os.environ.get("LLMRS_L2_PREFETCH_MB", "24").strip()
    try:
        mb = float(raw)
    except ValueError:
        raise UserError(f"LLMRS_L2_PREFETCH_MB={raw!r}: expected a number of MiB") from None
    if mb < 0:
        raise UserError(f"LLMRS_L2_PREFETCH_MB={raw!r}: expected a number of MiB >= 0")
    return int(mb * (1 << 20))


def _arrays(w: Any, marlin_path: bool) -> list[Any]:
    """The device arrays a decode projection over `w` reads, the large one first: a bf16 matrix; a 4-bit weight's
    reordered codes + scale words (the GEMV) or its row-form codes, scales and zeros (matvec_q4)."""
    if hasattr(w, "data") and hasattr(w, "nbytes") and not hasattr(w, "group_size"):
        return [w]
    if marlin_path and w.marlin is not None:
        return [w.marlin.qweight, w.marlin.sz]
    return [a for a in (w.qweight, w.scales, w.zeros) if a is not None]


def ranges_for(weights: list[tuple[Any, bool, bool]], budget: int) -> list[tuple[int, int]]:
    """(pointer, bytes) ranges covering the head of each weight in order until `budget` bytes: each entry is (w,
    paired, marlin_path); a paired bf16 matrix (gate_up read as row pairs (i, I + i)) gets its two halves' heads in
    equal parts. Lengths are rounded down to 16 bytes; at most MAX_RANGES ranges."""
    out: list[tuple[int, int]] = []
    left = budget
    for w, paired, marlin_path in weights:
        for a in _arrays(w, marlin_path):
            if left < ALIGN or len(out) >= MAX_RANGES:
                return out
            n = int(a.nbytes)
            if paired and a is w and n >= 2 * ALIGN:
                half = n // 2
                take = min(half, left // 2) // ALIGN * ALIGN
                if take:
                    out.append((int(a.data.ptr), take))
                    if len(out) < MAX_RANGES:
                        out.append((int(a.data.ptr) + half, take))
                    left -= 2 * take
                continue
            take = min(n, left) // ALIGN * ALIGN
            if take:
                out.append((int(a.data.ptr), take))
                left -= take
    return out


def launch(backend: Any, ranges: list[tuple[int, int]]) -> None:
    """One l2_prefetch over `ranges` (nothing when there are none)."""
    if not ranges:
        return
    args: list[Any] = []
    for i in range(MAX_RANGES):
        p, n = ranges[i] if i < len(ranges) else (0, 0)
        assert p % ALIGN == 0 and n % ALIGN == 0, (p, n)
        args += [np.uint64(p), np.int64(n)]
    with backend._span("l2_prefetch", "l2_prefetch", sum(n for _, n in ranges)):
        backend.k.l2_prefetch((PREFETCH_BLOCKS,), (32,), tuple(args))
