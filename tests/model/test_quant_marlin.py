"""The Marlin layout of the 4-bit kernels (llmrs/kernels_cu/q4_marlin.cuh), pinned on the CPU:

- marlin_reorder / marlin_unreorder round-trip bit-exactly (random codes, several shapes);
- each lane's 16-byte load holds exactly its mma.m16n8k16 B fragments (PTX: b_i holds B[row][col] with
  row = 2 t + (i & 1) + 8 (i >= 2), col = g, for lane = 4 g + t), B[k][n] = W[n, k];
- a numpy emulation of the kernel's decode (shift, lop3 into a magic float, fma, cvt.rn.bf16x2) gives, value
  for value, the bf16 that dequant_q4_bf16 gives (the f32 dequantization rounded once), in all three formats;
- the scale words: fp16 s low, fp16 z / m high (8.0 for Q4_0), group-major.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from llmrs.model import quant as Q
from llmrs.model.weights import round_bf16

SHAPES = [(32, 32), (64, 64), (96, 224), (160, 64), (64, 1056)]


def random_words(rng, N, K):
    return rng.integers(0, 1 << 32, size=(N, K // 8), dtype=np.uint64).astype(np.uint32)


@pytest.mark.parametrize("N,K", SHAPES)
def test_marlin_reorder_round_trips_bit_exactly(N, K):
    qw = random_words(np.random.default_rng(N * K), N, K)
    packed = Q.marlin_reorder(qw)
    assert packed.shape == (N // 32, K // 32, 32, 4) and packed.dtype == np.uint32
    np.testing.assert_array_equal(Q.marlin_unreorder(packed), qw)
    assert sorted(Q.unpack_rows(qw).ravel().tolist()) == sorted(Q.unpack_rows(packed.reshape(N, K // 8)).ravel()
                                                                 .tolist())  # a permutation of the codes


def test_marlin_reorder_rejects_shapes_off_the_32_grid():
    with pytest.raises(AssertionError):
        Q.marlin_reorder(np.zeros((48, 4), dtype=np.uint32))


def thread_fragments(packed: np.ndarray, sz: np.ndarray, G: int, mode: int) -> np.ndarray:
    """What each lane's registers hold after the kernel's decode, as bf16 values: [NB, KB, lane, ntile i, k16 step,
    b0/b1, low/high half]. Mirrors frag_b (q4_marlin.cuh) / compute_stage (gemm_q4.cu) operation for operation."""
    NB, KB = packed.shape[:2]
    w = packed.astype(np.uint32)[..., None]  # [NB, KB, 32, 4, 1]

    def p12(v):
        return ((v & np.uint32(0xF000)) | np.uint32(0x45000000)).view(np.float32)  # 2048 + q

    def p16(v):
        return ((v & np.uint32(0xF0000)) | np.uint32(0x43000000)).view(np.float32)  # 128 + q

    u32 = np.uint32
    x = np.concatenate([p12(w << u32(12)), p12(w << u32(8)), p16(w << u32(8)), p12(w),
                        p16(w), p12(w >> u32(8)), p16(w >> u32(8)), p16(w >> u32(12))], axis=-1)  # nibbles 0..7
    off = np.array([2048, 2048, 128, 2048, 128, 2048, 128, 128], dtype=np.float32)
    # the scale word of column n = 32 nb + 8 i + g and sub-block kb: lane-dependent through g = lane // 4
    lane = np.arange(32)
    n = 32 * np.arange(NB)[:, None, None, None] + 8 * np.arange(4)[None, None, None, :] + (lane // 4)[None, None, :, None]
    grp = (32 * np.arange(KB) // G)[None, :, None, None]
    word = sz[grp, n]  # [NB, KB, 32, 4]
    s = (word & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32)[..., None]
    z = (word >> 16).astype(np.uint16).view(np.float16).astype(np.float32)[..., None]
    if mode == 0:  # fma(x, s, -(off + z) s): the product and the constant exact, so float64 then float32 is the fma
        c = (-(off + z) * s).astype(np.float32)
        v = (x.astype(np.float64) * s.astype(np.float64) + c.astype(np.float64)).astype(np.float32)
    else:  # fma(x - off, s, m)
        q = (x - off).astype(np.float32)
        v = (q.astype(np.float64) * s.astype(np.float64) + z.astype(np.float64)).astype(np.float32)
    return round_bf16(v).reshape(NB, KB, 32, 4, 2, 2, 2)


def make_weight(kind: str, N: int, K: int, G: int, rng) -> Q.QuantWeight:
    codes = rng.integers(0, 16, size=(N, K), dtype=np.uint8)
    s = (rng.standard_normal((N, K // G)) * 0.01).astype(np.float16)
    if kind == "awq":
        z = rng.integers(0, 16, size=(N, K // G)).astype(np.float16)
    elif kind == "q4_1":
        z = (rng.standard_normal((N, K // G)) * 0.01).astype(np.float16)
    else:
        z = None
    return Q.QuantWeight(kind, N, K, G, Q.pack_rows(codes), s, z)


@pytest.mark.parametrize("kind,G", [("awq", 32), ("awq", 64), ("awq", 128), ("q4_0", 32), ("q4_1", 32), ("q4_1", 64)])
def test_each_lane_load_decodes_to_its_mma_b_fragments_equal_to_dequant_bf16(kind, G):
    N, K = 64, 256
    w = make_weight(kind, N, K, G, np.random.default_rng(G))
    packed = Q.marlin_reorder(w.qweight)
    sz = Q.marlin_scales(w.scales, w.zeros)
    frag = thread_fragments(packed, sz, G, 1 if kind == "q4_1" else 0)
    ref = round_bf16(w.dequantize())  # dequant_q4_bf16: the exact f32 value rounded once
    # PTX m16n8k16 .bf16 B fragment: element e (b0 low, b0 high, b1 low, b1 high) of lane 4g + t sits at
    # row (k) 2t + (e & 1) + 8 (e >= 2), column (n) g; B = W^T of the 32 x 32 tile (nb, kb), n8 tile i, k16 step ks
    for nb in range(N // 32):
        for kb in range(K // 32):
            for lane in range(32):
                g, t = divmod(lane, 4)
                for i in range(4):
                    for ks in range(2):
                        for e in range(4):
                            row, col = 2 * t + (e & 1) + 8 * (e >= 2), g
                            got = frag[nb, kb, lane, i, ks, e >> 1, e & 1]
                            want = ref[32 * nb + 8 * i + col, 32 * kb + 16 * ks + row]
                            assert got == want, (nb, kb, lane, i, ks, e, got, want)  # == : +0 and -0 are one value


def test_marlin_scales_are_group_major_words_of_scale_and_zero():
    rng = np.random.default_rng(3)
    s = (rng.standard_normal((64, 3)) * 0.01).astype(np.float16)
    z = rng.integers(0, 16, size=(64, 3)).astype(np.float16)
    sz = Q.marlin_scales(s, z)
    assert sz.shape == (3, 64) and sz.dtype == np.uint32
    np.testing.assert_array_equal((sz & 0xFFFF).astype(np.uint16), s.view(np.uint16).T)
    np.testing.assert_array_equal((sz >> 16).astype(np.uint16), z.view(np.uint16).T)
    q4_0 = Q.marlin_scales(s.view(np.uint16), None)  # raw fp16 words, as DeviceQuantWeight holds them
    np.testing.assert_array_equal((q4_0 >> 16).astype(np.uint16).view(np.float16), np.full((3, 64), 8.0, np.float16))


# ---------------------------------------------------------------------- gemv_q4 (decode) over the same layout
def gemv_slots(packed: np.ndarray, nb: int, kb: int, regs):
    """(column, k, hi, code) for every A slot of tile nb's k32 block kb: each lane's four words turned by `regs`
    into its four A registers (nibble p = 0..3, as the kernel's decode gives them, 16-bit halves low / high), each
    slot paired with the k of x that gemv_xb packs against it; hi: the slot is its k16 step's upper 8 (B's b1)."""
    u32 = np.uint32
    for lane in range(32):
        g, t = divmod(lane, 4)
        k0 = 32 * kb + 2 * t
        # x: (slot 2t, 2t+1) and (slot 2t+8, 2t+9) of step 0 / 1, from the float2 loads at k0, +8, +16, +24
        a = {0: ((k0, k0 + 16), (k0 + 1, k0 + 17)), 1: ((k0 + 8, k0 + 24), (k0 + 9, k0 + 25))}
        for i in range(4):
            r = regs(u32(packed[nb, kb, lane, i]))
            for step in range(2):
                for hi, (pair, v) in enumerate(zip(a[step], (r[2 * step], r[2 * step + 1]))):
                    for k, code in zip(pair, (int(v) & 0xFFFF, int(v) >> 16)):
                        yield 8 * i + g, k, hi, code  # column n = 8 i + g of the tile, every token


def gemv_emulated(packed: np.ndarray, sz: np.ndarray, x: np.ndarray, G: int, mode: int) -> np.ndarray:
    """out[T, N] as gemv_q4.cu's gemv_q4 computes it, in float64: per k32 block each lane's four words become bf16x2
    registers (128 + nibble p, 128 + nibble p + 4) = lop3(w >> 4p) (the codes' mma operand), the lane's x values
    are paired to match in the other operand (x rounded to bf16), mma sums slot by slot, a ones-mma sums x, and
    each group ends with acc += s (C - (128 + z) X) (zero) or s (C - 128 X) + m X (min)."""
    NB, KB = packed.shape[:2]
    T, K = x.shape
    xb = round_bf16(x).astype(np.float64)
    out = np.zeros((T, 32 * NB))
    u32 = np.uint32

    def regs(w):
        return [(w >> u32(4 * p)) & u32(0x000F000F) | u32(0x43004300) for p in range(4)]

    for nb in range(NB):
        acc = np.zeros((T, 32))
        C = np.zeros((T, 32))
        X = np.zeros(T)
        for kb in range(KB):
            for n, k, _, code in gemv_slots(packed, nb, kb, regs):
                assert code >> 8 == 0x43  # 128 + q: the magic exponent untouched
                C[:, n] += xb[:, k] * (128 + (code & 0xF))
            X += xb[:, 32 * kb: 32 * kb + 32].sum(axis=1)
            if (kb + 1) % (G // 32) == 0 or kb + 1 == KB:
                word = sz[32 * kb // G, 32 * nb: 32 * nb + 32]
                s = (word & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float64)
                z = (word >> 16).astype(np.uint16).view(np.float16).astype(np.float64)
                if mode == 0:
                    acc += s * (C - (128 + z) * X[:, None])
                else:
                    acc += s * (C - 128 * X[:, None]) + z * X[:, None]
                C[:] = 0
                X[:] = 0
        out[:, 32 * nb: 32 * nb + 32] = acc
    return out


@pytest.mark.parametrize("kind,G", [("awq", 32), ("awq", 128), ("q4_0", 32), ("q4_1", 64)])
def test_gemv_slot_pairing_and_group_algebra_give_x_at_the_exact_weights(kind, G):
    """The GEMV's A/B slot pairing (codes as lop3 gives them, x packed to match) and its scale/zero algebra
    reproduce round_bf16(x) @ W^T of the exact weights (W not rounded)."""
    N, K, T = 64, 256, 3
    rng = np.random.default_rng(G + len(kind))
    w = make_weight(kind, N, K, G, rng)
    x = rng.standard_normal((T, K)).astype(np.float32)
    got = gemv_emulated(Q.marlin_reorder(w.qweight), Q.marlin_scales(w.scales, w.zeros), x, G,
                        1 if kind == "q4_1" else 0)
    want = round_bf16(x).astype(np.float64) @ w.dequantize().astype(np.float64).T
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def gemv_emulated_fp16(packed: np.ndarray, sz: np.ndarray, x: np.ndarray, G: int, mode: int) -> np.ndarray:
    """probes/gemv_q4_ablate.cu's -DGV_FP16 form of gemv_q4, in float64: fp16 operands, a word's nibbles p = 0, 2 as
    1024 + q ((w >> 4p) & 0x000F000F | 0x64006400) and p = 1, 3 as 1024 + 16 q ((w >> 4(p - 1)) & 0x00F000F0 |
    0x64006400), their k slots fed x / 16 (each step's b1), so C = sum q x + 1024 cx' with cx' = sum_lo x +
    sum_hi x / 16 (the ones mma's rows g) and X = sum x (its rows g + 8: 16 in the hi slots); each group ends with
    acc += s (C - 1024 cx' - z X) (zero) or s (C - 1024 cx') + m X (min)."""
    NB, KB = packed.shape[:2]
    T, K = x.shape
    x16 = x.astype(np.float16).astype(np.float64)
    x16_hi = (x / 16).astype(np.float16).astype(np.float64)  # b1: rounded after the division
    out = np.zeros((T, 32 * NB))
    u32 = np.uint32
    def regs(w):
        return [(w >> u32(4 * p)) & u32(0x000F000F) | u32(0x64006400) if p % 2 == 0 else
                (w >> u32(4 * (p - 1))) & u32(0x00F000F0) | u32(0x64006400) for p in range(4)]

    for nb in range(NB):
        acc = np.zeros((T, 32))
        C = np.zeros((T, 32))
        cxp = np.zeros(T)
        X = np.zeros(T)
        for kb in range(KB):
            for n, k, hi, code in gemv_slots(packed, nb, kb, regs):
                C[:, n] += (x16_hi if hi else x16)[:, k] * float(np.array(code, np.uint16).view(np.float16))
            for k in range(32 * kb, 32 * kb + 32):
                hi_slots = (k - 32 * kb) % 2 == 1  # the float2 loads' .y: each step's b1
                cxp += x16_hi[:, k] if hi_slots else x16[:, k]
                X += 16 * x16_hi[:, k] if hi_slots else x16[:, k]
            if (kb + 1) % (G // 32) == 0 or kb + 1 == KB:
                word = sz[32 * kb // G, 32 * nb: 32 * nb + 32]
                s = (word & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float64)
                z = (word >> 16).astype(np.uint16).view(np.float16).astype(np.float64)
                cq = C - 1024 * cxp[:, None]
                acc += s * (cq - z * X[:, None]) if mode == 0 else s * cq + z * X[:, None]
                C[:] = 0
                cxp[:] = 0
                X[:] = 0
        out[:, 32 * nb: 32 * nb + 32] = acc
    return out


@pytest.mark.parametrize("kind,G", [("awq", 128), ("q4_1", 64)])
def test_gemv_fp16_form_algebra_gives_x_at_the_exact_weights(kind, G):
    """-DGV_FP16's codes (5 instructions a word), x / 16 in the upper-nibble slots and the ones mma's two rows
    reproduce fp16(x) @ W^T of the exact weights (up to x / 16's fp16 rounding where it is subnormal)."""
    N, K, T = 64, 256, 2
    rng = np.random.default_rng(G + 7 * len(kind))
    w = make_weight(kind, N, K, G, rng)
    x = rng.standard_normal((T, K)).astype(np.float32)
    got = gemv_emulated_fp16(Q.marlin_reorder(w.qweight), Q.marlin_scales(w.scales, w.zeros), x, G,
                             1 if kind == "q4_1" else 0)
    want = x.astype(np.float16).astype(np.float64) @ w.dequantize().astype(np.float64).T
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-5)


def test_the_reordered_layout_takes_power_of_two_groups_only():
    """quant_linear.supported: the GEMM finds a k's scale row as k >> log2 G, so G 96 (K % 96 == 0) keeps the row
    form and dequantize + cuBLAS; 32 / 64 / 128 / 256 take the layout."""
    from llmrs.backends.cuda.quant_linear import has_gemm_layout, supported

    assert all(supported(256, 3072, G) for G in (32, 64, 128, 256))
    assert not supported(256, 3072, 96) and not supported(256, 3072, 16) and not supported(256, 3072, 0)
    assert not has_gemm_layout("q4", 256, 3072, 96) and has_gemm_layout("q4", 256, 3072, 128)
    assert not has_gemm_layout("q8", 256, 3072, 32)


# ---------------------------------------------------------------------- gemv_q4's launch plan (host side)
@pytest.mark.parametrize("sms", [1, 16, 108, 132])
def test_gemv_splits_cover_k_exactly_with_no_empty_slice(sms):
    """gemv_q4.cu's gemv_q4 trusts its plan: warp w of slice z takes k32 blocks [(z W + w) kpw, + kpw) clipped to
    K / 32; every block must be covered once, no slice empty (its last block would wait on a count never reached:
    each slice's block adds one), kpw a multiple of GEMV_DEPTH (the kernel's batches)."""
    from tests.backends.test_cuda_rules import StandIn

    from llmrs.backends.cuda.quant_linear import GEMV_BLOCKS_PER_SM, GEMV_DEPTH, GEMV_WARPS

    backend = StandIn(num_sms=sms)
    for N, K, splits in itertools.product((64, 896, 1152, 3584, 4608, 9728, 37888),
                                          (64, 896, 1536, 3584, 4864, 8192, 18944), (None, 1, 3, 64)):
        S, per = backend.gemv_splits(N, K, splits)
        KB = K // 32
        assert S >= 1 and per >= 1 and per % GEMV_DEPTH == 0, (N, K, splits, S, per)
        starts = [min(KB, (z * GEMV_WARPS + w) * per) for z in range(S) for w in range(GEMV_WARPS)]
        covered = sorted(k for s0 in starts for k in range(s0, min(KB, s0 + per)))
        assert covered == list(range(KB)), (N, K, splits)
        assert all(z * GEMV_WARPS * per < KB for z in range(S)), (N, K, splits, S, per)  # none empty
        if splits is None and S > 1:  # one round of resident blocks: a second for a few costs a whole one
            assert N // 32 * S <= GEMV_BLOCKS_PER_SM * sms, (N, K, S)


@pytest.mark.parametrize("k_per_n", [0.0, 4.0])
@pytest.mark.parametrize("sms", [1, 8, 132])
def test_a_weight_without_its_row_form_is_never_sent_to_the_matvec(sms, k_per_n, monkeypatch):
    """row_form_needed False (the row copy released) must mean the decode dispatch takes the GEMV at every token
    count, so matvec_q4 (the only reader of the row form) is never asked; under the K >= 4 N rule and with
    GEMV_ONE_TOKEN_K_PER_N 0 (every shape on the GEMV)."""
    from tests.backends.test_cuda_rules import StandIn

    import llmrs.backends.cuda.quant_linear as q4gemm
    from llmrs.backends.cuda.quant_linear import GEMV_MAX_TOKENS, row_form_needed

    monkeypatch.setattr(q4gemm, "GEMV_ONE_TOKEN_K_PER_N", k_per_n)
    monkeypatch.setattr(q4gemm, "GEMV_ONE_TOKEN_MIN_WEIGHTS", 1 << 62)  # (the size rule: its own test below)
    backend = StandIn(num_sms=sms)
    for N in range(64, 40000, 64):
        for K in (512, 3584, 4 * N - 64, 4 * N, 18944):
            if not row_form_needed(N, K, sms):
                assert all(backend.gemv_takes(T, N, K) for T in range(1, GEMV_MAX_TOKENS + 1)), (N, K)
            else:
                assert not backend.gemv_takes(1, N, K), (N, K)
    K = 128  # < 4 N for every N below
    assert row_form_needed(128 * sms, K, sms, gemv=False)  # without q4_gemv: matvec_q4 reads every one
    if k_per_n == 0:
        assert not any(row_form_needed(N, K, sms) for N in (64, 128 * sms - 64, 128 * sms))
        return
    assert row_form_needed(128 * sms - 64, K, sms) and not row_form_needed(128 * sms, K, sms)
    assert not row_form_needed(64, 4 * 64, sms) and row_form_needed(64, 4 * 64 - 32, sms)  # down: K >= 4 N


def test_the_default_one_token_rule_on_qwen2_5_shapes():
    """The measured rule (H200): with the K slices as a cluster and qkv's RoPE in the GEMV, one token of every shape
    on the GEMV (3B AWQ 1.458 -> 1.330 ms/token, 0.5B 0.670 -> 0.621)."""
    from llmrs.backends.cuda.quant_linear import gemv_one_token

    gemv = [(37888, 3584), (3584, 18944), (4608, 3584), (3584, 3584), (22016, 2048), (2048, 11008), (2560, 2048),
            (2048, 2048), (1152, 896), (896, 896), (64, 64)]
    assert all(gemv_one_token(N, K, 132) for N, K in gemv)


def test_gemv_kernel_picks_the_fixed_group_form_for_g32_and_g128_and_exists():
    """quant_linear.gemv_kernel: the compile-time-group forms (gemv_q4.cu's CPG) for G 32 / 128, the run-time one
    otherwise, one or two n8 tiles of tokens; every name it returns is a compiled entry point with PDL."""
    from llmrs.backends.cuda.kernels import ENTRY_POINTS, PDL_KERNELS
    from llmrs.backends.cuda.quant_linear import GEMV_DEPTH, GEMV_MAX_TOKENS, gemv_kernel

    assert gemv_kernel(0, 1, 128) == "gemv_q4z_c4" and gemv_kernel(1, 1, 32) == "gemv_q4m_c1"
    assert gemv_kernel(0, 9, 128) == "gemv_q4z_t16_c4" and gemv_kernel(0, 8, 64) == "gemv_q4z"
    assert gemv_kernel(1, 16, 256) == "gemv_q4m_t16"
    source = (Path(__file__).resolve().parents[2] / "llmrs" / "kernels_cu" / "gemv_q4.cu").read_text()
    for mode in (0, 1):
        for T in range(1, GEMV_MAX_TOKENS + 1):
            for G in (32, 64, 128, 256):
                name = gemv_kernel(mode, T, G)
                assert name in ENTRY_POINTS["gemv_q4.cu"] and name in PDL_KERNELS, name
                assert f"GEMV_Q4({name}," in source, name
                cpg = G // 32
                if name.endswith(f"_c{cpg}"):
                    assert GEMV_DEPTH % cpg == 0  # every batch of a warp holds whole groups (the kernel's CPG rule)


@pytest.mark.parametrize("small", [None, 256])
def test_gemm_takes_up_to_max_tokens_and_small_matrices_further(small, monkeypatch):
    """Up to MAX_TOKENS (192) every shape takes the 4-bit GEMM; with MAX_TOKENS_SMALL = 256 (off by
    default) matrices of at most 64M weights (the 7B's qkv, o; measured: its gate_up loses to dequantize + cuBLAS
    at 256) up to 256; above, none. The backend's bf16-input rule follows it (CUDABackend._gemm_takes_bf16)."""
    from types import SimpleNamespace

    from tests.backends.test_cuda_rules import StandIn

    import llmrs.backends.cuda.quant_linear as q4gemm
    from llmrs.backends.cuda import CUDABackend
    from llmrs.backends.cuda.quant_linear import gemm_takes
    from llmrs.model.quant import DeviceQuantWeight

    if small is not None:
        monkeypatch.setattr(q4gemm, "MAX_TOKENS_SMALL", small)
    qkv, o, gate_up, down = (4608, 3584), (3584, 3584), (37888, 3584), (3584, 18944)
    assert all(gemm_takes(T, *s) for T in (17, 64, 192) for s in (qkv, o, gate_up, down))
    assert gemm_takes(256, *qkv) == gemm_takes(256, *o) == gemm_takes(193, *o) == (small == 256)
    assert not gemm_takes(193, *gate_up) and not gemm_takes(256, *gate_up) and not gemm_takes(256, *down)
    assert not any(gemm_takes(257, *s) for s in (qkv, o, gate_up, down))
    # with the wgmma form (Kernels.wgmma, sm_90a) the GEMM keeps the T of its range (with its 256-token form,
    # Kernels.wgmma_t256, 425-512 too) and reads bf16 x there (where the weight has the GEMM layout); a bf16 output
    # (gate/up for silu_mul_bf16_bf16) only from cuBLAS (q4_bf16_input, on by default: the mma.sync GEMM reads
    # bf16 x too)
    for wgmma, t256, bf16_input in ((False, False, False), (True, False, False), (True, True, False),
                                    (False, False, True), (True, True, True)):
        fake = StandIn(fuse_bf16=True, quant_matvec_max_tokens=8, matvec_max_tokens=1, num_sms=132,
                       k=SimpleNamespace(wgmma=wgmma, wgmma_t256=t256), q4_bf16_input=bf16_input)
        fake._gemm_takes_bf16 = lambda w, T, fake=fake: CUDABackend._gemm_takes_bf16(fake, w, T)
        for N, K in (qkv, gate_up):
            for marlin in (None, object()):
                w = DeviceQuantWeight("awq", N, K, 128, None, None, None, marlin)
                for T in (8, 17, 64, 65, 192, 193, 256, 257, 424, 425, 512, 513, 4096):
                    bf16_in = CUDABackend._gemm_takes_bf16(fake, w, T)
                    takes = gemm_takes(T, N, K, wgmma, t256)
                    assert takes == (gemm_takes(T, N, K) or (wgmma and (65 <= T <= 256 or (t256 and 424 < T <= 512))))
                    wg = (bf16_input or wgmma and q4gemm.in_wgmma_range(T, t256)) and marlin is not None
                    assert bf16_in == (T > 16 and (not takes or wg)), (N, K, T, wgmma, t256)
                    assert CUDABackend._gemm_out_bf16(fake, w, T) == (bf16_in and not takes)
