"""The CUDA backend's dispatch rules that need no GPU (a stand-in backend object): which decode attention kernel
a step takes (decode_attn_tc / attn_partial / attn_partial_gqa), its splits, and where the RMSNorm folds into the
paired matvecs. The kernels themselves: the GPU tests (test_attention_tc_gpu.py, test_kernels.py)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from llmrs.backends.cuda import ATTN_TC_MIN_TOKENS, MATVEC_LONG_K_MIN_WARPS, CUDABackend, CudaOptions
from llmrs.backends.cuda.attention import AttentionOps
from llmrs.backends.cuda.prefill import TC_MIN_SPLIT_KEYS
from llmrs.backends.cuda.quant_linear import QuantLinearOps
from llmrs.model.presets import preset_config


class StandIn(QuantLinearOps, AttentionOps):
    """A backend stand-in: the CUDA backend's rule methods over the attributes a test gives (no GPU)."""

    def __init__(self, **attrs):
        self.__dict__.update(attrs)


def fake_backend(preset: str, cc: int = 90, kernel: str = "auto") -> StandIn:
    be = StandIn(config=preset_config(preset), block_size=16, k=SimpleNamespace(cc=cc), attn_kernel=kernel,
                         attn_splits=None, num_sms=132, fuse_norm="auto", attn_heads_per_block=None, _tc_ok=None)
    be._use_gqa = lambda T: CUDABackend._use_gqa(be, T)
    be._cluster_form = lambda T, n: CUDABackend._cluster_form(be, T, n)
    be._attn_cluster_max = lambda cl, hg: be.num_sms // cl  # (the driver's answer on the GPU)
    return be


@pytest.mark.parametrize("preset,one,two", [("qwen2.5-7b", "partial", "tc"), ("qwen2.5-3b", "partial", "tc"),
                                            ("qwen2.5-0.5b", "tc", "tc")])
def test_auto_takes_decode_attn_tc_from_two_tokens_and_for_small_heads_from_one(preset, one, two):
    be = fake_backend(preset)
    assert ATTN_TC_MIN_TOKENS == 2
    assert CUDABackend._attn_choice(be, 1) == one
    assert [CUDABackend._attn_choice(be, T) for T in (2, 64, 256)] == [two] * 3


def test_one_token_of_small_heads_takes_the_cluster_where_it_covers_the_context():
    """64-dim heads (the 0.5B, SmolLM2): one token takes attn_cluster's d2 form (one launch, no attn_merge) up to the
    1,024 keys its clusters of 16 cover, decode_attn_tc + attn_merge beyond, and without a context (callers that
    only ask about tensor cores) or with dispatch.ATTN_TC_SMALL_HEADS_CLUSTER False decode_attn_tc."""
    import llmrs.backends.cuda.dispatch as cuda

    be = fake_backend("qwen2.5-0.5b")
    be.dpl, be.attn_cluster, be.k = 2, None, SimpleNamespace(cc=90)
    assert CUDABackend._attn_choice(be, 1, 100) == "partial" and CUDABackend._attn_choice(be, 1, 1024) == "partial"
    assert CUDABackend._cluster_form(be, 1, 1024) == (16, 4)
    assert CUDABackend._attn_choice(be, 1, 1025) == "tc" and CUDABackend._attn_choice(be, 1) == "tc"
    assert CUDABackend._attn_choice(be, 2, 100) == "tc"  # two tokens and more: decode_attn_tc
    be.attn_cluster = 0  # attn_cluster=0: no cluster, decode_attn_tc
    assert CUDABackend._attn_choice(be, 1, 100) == "tc"
    be.attn_cluster = None
    saved = cuda.ATTN_TC_SMALL_HEADS_CLUSTER
    try:
        cuda.ATTN_TC_SMALL_HEADS_CLUSTER = False
        assert CUDABackend._attn_choice(be, 1, 100) == "tc"
    finally:
        cuda.ATTN_TC_SMALL_HEADS_CLUSTER = saved
    be7 = fake_backend("qwen2.5-7b")  # 128-dim heads: attn_partial's place at one token, as before
    be7.dpl, be7.attn_cluster, be7.k = 4, None, SimpleNamespace(cc=90)
    assert CUDABackend._attn_choice(be7, 1, 100) == "partial"


def test_without_tensor_cores_auto_keeps_the_cuda_core_kernels():
    be = fake_backend("qwen2.5-7b", cc=75)
    assert CUDABackend._attn_choice(be, 1) == "partial"
    assert CUDABackend._attn_choice(be, 256) == "gqa"  # 1024 (token, kv head) blocks >= ATTN_GQA_MIN_BLOCKS
    for forced in ("partial", "gqa", "tc"):
        assert CUDABackend._attn_choice(fake_backend("qwen2.5-7b", kernel=forced), 64) == forced


@pytest.mark.parametrize("block_size,tc", [(8, False), (16, True), (32, True)])
def test_decode_attn_tc_wants_cache_blocks_of_whole_16_key_tiles(block_size, tc):
    """Each 16-key tile of decode_attn_tc reads one cache block (one block-table read a tile): blocks of 8 tokens
    keep the CUDA-core kernels."""
    be = fake_backend("qwen2.5-7b")
    be.block_size = block_size
    assert be.decode_tc_supported() is tc
    assert CUDABackend._attn_choice(be, 256) == ("tc" if tc else "gqa")


def test_tc_splits_fill_the_gpu_with_splits_of_at_least_32_keys():
    be = fake_backend("qwen2.5-7b")  # 4 KV heads
    assert be.decode_tc_splits(1, 512) == 512 // TC_MIN_SPLIT_KEYS == 16
    assert be.decode_tc_splits(1, 20) == 1
    assert be.decode_tc_splits(64, 512) == 2  # 256 blocks: two splits reach 2 an SM
    assert be.decode_tc_splits(256, 512) == 1  # 1024 blocks fill the GPU alone
    assert be.decode_tc_splits(1, 100_000) == 64  # at most 64
    be.attn_splits = 3
    assert be.decode_tc_splits(256, 512) == 3


@pytest.mark.parametrize("hidden,folds", [(896, True), (2048, True), (3584, False), (5120, False)])
def test_the_norms_fold_into_the_paired_matvecs_up_to_2048(hidden, folds):
    be = fake_backend("qwen2.5-7b")
    w = np.empty((8, hidden), dtype=np.uint16)
    assert CUDABackend._norm_folds(be, w) is folds
    be.fuse_norm = "0"
    assert not CUDABackend._norm_folds(be, np.empty((8, 896), dtype=np.uint16))
    be.fuse_norm = "1"
    assert CUDABackend._norm_folds(be, w)


def test_gemm_q4_stages_compile_in_what_the_host_sizes():
    """gemm_q4.cu's ring lives in dynamic shared memory: the host's stage table (compiled in with -D) must equal the
    .cu's own defaults (what `llmrs ptx-check` compiles), and each launch's bytes follow it."""
    import re

    from llmrs.backends.cuda import kernels as ck

    src = (ck.KERNELS_DIR / "gemm_q4.cu").read_text()
    defaults = {int(m): int(n) for m, n in re.findall(r"#define GQ_STAGES_M(\d+) (\d+)", src)}
    assert defaults == ck.GEMM_Q4_STAGES == {1: 4, 2: 4, 4: 3, 8: 2}
    assert ck.FILE_OPTIONS["gemm_q4.cu"] == tuple(f"-DGQ_STAGES_M{mt}={n}" for mt, n in sorted(defaults.items()))
    # a stage: x rows 16 MT x 8, weights 256, scale words 64, 16 bytes each (21 KB at MT 8: 2 stages fit in 48 KB)
    assert [ck.gemm_q4_smem_bytes(mt) for mt in (1, 2, 4, 8)] == [4 * 448 * 16, 4 * 576 * 16, 3 * 832 * 16,
                                                                  2 * 1344 * 16]


def test_attn_cluster_takes_the_smallest_cluster_that_holds_the_context():
    """attn_cluster (one launch, no attn_merge) where attn_partial would run: sm_90+, 128-dim heads, 64 keys a
    split at most (one load batch a warp), one block an SM; auto: 8 splits up to 512 keys, 16 up to 1024; 4 query
    heads a block (the _g4 forms) where those blocks fit, else 8."""
    be = fake_backend("qwen2.5-7b")  # 28 query heads, 4 kv heads: 2 blocks of 4 heads a kv head, or 1 of 8
    be.dpl, be.attn_cluster, be.k = 4, None, SimpleNamespace(cc=90)
    form = lambda T, n: CUDABackend._cluster_form(be, T, n)  # noqa: E731
    size = lambda T, n: CUDABackend._cluster_size(be, T, n)  # noqa: E731
    assert [form(1, n) for n in (1, 512, 513, 1024, 1025)] == [(8, 4), (8, 4), (16, 4), (16, 4), (0, 8)]
    assert form(2, 512) == (8, 4)  # 2 tokens x 4 kv heads x 2 head groups x 8 blocks = 128 <= 132 SMs
    assert form(3, 512) == (8, 8) and form(4, 512) == (8, 8)  # 4 heads a block would take 192: 8 heads, 96 / 128
    assert size(5, 512) == 0  # 5 tokens x 4 kv heads x 8 blocks > 132 SMs
    be.attn_heads_per_block = 8  # forced: 8 heads a block
    assert form(1, 512) == (8, 8) and form(1, 1024) == (16, 8)
    be.attn_heads_per_block = 4  # =4: that form or attn_partial
    assert form(2, 512) == (8, 4) and form(3, 512) == (0, 8) and form(2, 1024) == (0, 8)
    be.attn_heads_per_block = None
    be.attn_cluster = 16  # forced: at any context (its warps loop over batches of keys), while the blocks fit
    assert form(1, 100) == (16, 4) and form(1, 4096) == (16, 4) and form(2, 100) == (16, 8) and size(3, 100) == 0
    be.attn_cluster = 4  # (an A/B form of the d4 kernel only, 8 heads a block)
    assert form(1, 100) == (4, 8)
    be.attn_cluster = 0
    assert size(1, 100) == 0
    be.attn_cluster = None
    be.attn_splits = 8  # forced splits (tests, benches): attn_partial
    assert size(1, 100) == 0
    be.attn_splits, be.k = None, SimpleNamespace(cc=89)
    assert size(1, 100) == 0
    be.k, be.dpl = SimpleNamespace(cc=90), 2  # 64-dim heads: the d2 form
    assert form(1, 100) == (8, 4)
    be.attn_cluster = 4  # (an A/B form of the d4 kernel only)
    assert size(1, 100) == 0
    be.attn_cluster, be.dpl = None, 1  # 32-dim heads: none
    assert size(1, 100) == 0


@pytest.mark.parametrize("preset,clusters", [("qwen2.5-7b", 8), ("qwen2.5-3b", 4)])
def test_attn_cluster_gives_way_to_a_size_that_runs_at_once(preset, clusters):
    """The H200 runs 7 clusters of 16 of the 16-warp 4-head form (and 15 of 8): the 7B's 8 clusters of 16 would run
    in two waves, so contexts of 513-1024 take clusters of 8 whose warps loop over two batches of keys; the 3B's 4
    clusters of 16 fit and keep that size."""
    be = fake_backend(preset)
    be.dpl, be.attn_cluster, be.k = 4, None, SimpleNamespace(cc=90)
    be._attn_cluster_max = lambda cl, hg: {8: 15, 16: 7}[cl]
    form = lambda T, n: CUDABackend._cluster_form(be, T, n)  # noqa: E731
    assert form(1, 512) == (8, 4)
    want16 = (16, 4) if clusters <= 7 else (8, 4)
    assert form(1, 513) == want16 and form(1, 1024) == want16
    assert form(1, 1025)[0] == 0  # attn_partial + attn_merge beyond, as before
    be._attn_cluster_max = lambda cl, hg: 3  # nothing fits at once: the size that covers the context, as before
    assert form(1, 768) == (16, 4)


def test_wgmma_gemm_ring_and_dispatch():
    """gemm_q4_wgmma.cu's wgmma form: its ring (GQW_STAGES stages of GemmQ4Smem<8>'s size, plus 1 KB to align them to 1024
    bytes) as the host sizes it, a kernel per mode and compiled cluster size, none in the modules CuPy compiles
    (sm_90a only: Kernels.wgmma_fns), and the token counts / K slices the host gives it."""
    import re

    import llmrs.backends.cuda.quant_linear as q4
    from llmrs.backends.cuda import kernels as ck

    src = (ck.KERNELS_DIR / "gemm_q4_wgmma.cu").read_text()
    stages = int(re.search(r"#define GQW_STAGES (\d+)", src).group(1))
    assert ck.GEMM_Q4WG_SMEM_BYTES == stages * 1344 * 16 + 1024 == ck.gemm_q4_smem_bytes(8, {8: stages}) + 1024
    assert ck.WG_BLOCKS_PER_SM * ck.GEMM_Q4WG_SMEM_BYTES <= 227 << 10
    made = {f"gemm_q4wg{k}_s{s}" for k, _, s in re.findall(r"^GEMM_Q4WG\((\w), (\d), (\d)\)", src, re.M)}
    assert made == set(ck.GEMM_Q4WG_KERNELS) and len(made) == 2 * len(ck.WG_SPLITS)
    for n in ck.GEMM_Q4WG_KERNELS:
        assert n in ck.PDL_KERNELS and n in ck.ARCH_ENTRY_POINTS["gemm_q4_wgmma.cu"]
        assert all(n not in names for names in ck.ENTRY_POINTS.values())
    assert ck.WGMMA_ARCH == {90: "sm_90a"}
    # without the wgmma form, 256 tokens are dequantize + cuBLAS's; with it, the GEMM's from WG_FROM up to
    # WG_MAX_TOKENS (both measured)
    assert (q4.WG_FROM, q4.WG_MAX_TOKENS) == (65, 256)
    assert not q4.gemm_takes(256, 4608, 3584) and q4.gemm_takes(256, 4608, 3584, wgmma=True)
    assert q4.gemm_takes(256, 37888, 3584, wgmma=True) and q4.gemm_takes(q4.WG_MAX_TOKENS, 3584, 18944, wgmma=True)
    assert not q4.gemm_takes(q4.WG_MAX_TOKENS + 1, 3584, 18944, wgmma=True)  # prefills: dequantize + cuBLAS
    be = StandIn(num_sms=132, k=SimpleNamespace(wgmma=True, wgmma_t256=False))
    assert be.wgmma_takes(256) and be.wgmma_takes(65) and not be.wgmma_takes(64)
    assert not be.wgmma_takes(q4.WG_MAX_TOKENS + 1)
    assert not StandIn(num_sms=132, k=SimpleNamespace(wgmma=False)).wgmma_takes(256)
    # K slices: 2 blocks an SM over the 128 x 128 tiles (7B qkv at 256 tokens: 36 x 2 tiles -> 3 slices; gate_up's
    # 296 x 2 tiles pass the GPU's 264 slots: wave_fill_splits, 4 slices; down: 28 x 2 tiles -> 4 slices of its 296
    # k64 tiles) (the slices are a cluster's blocks: at most the largest compiled cluster, 4)
    assert be.choose_splits(256, 4608, 3584, wgmma=True) == 3
    assert be.choose_splits(256, 37888, 3584, wgmma=True) == 4
    assert be.choose_splits(256, 3584, 18944, wgmma=True) == 4
    assert be.choose_splits(128, 4608, 3584, wgmma=True) == 4 and max(ck.WG_SPLITS) == 4
    # the 256-token form (gemm_q4w2{z,m}_s{S}, on by default): Q2_STAGES stages of 32 KB x + 4 KB codes + 1 KB
    # scales, one block an SM, 256 threads; a kernel per mode and cluster size; above one 128-token tile up to
    # WG_MAX_TOKENS and from W2_UPPER_FROM (exclusive) to two of its tiles; one block an SM over its 128 x 256 tiles
    # (qkv 36 tiles -> 3 slices, gate_up 296 -> 2 (wave_fill_splits, at most W2_FILL_MAX_SPLITS), down 28 -> 4)
    q2 = int(re.search(r"#define Q2_STAGES (\d+)", src).group(1))
    assert int(re.search(r"#define Q2_THREADS (\d+)", src).group(1)) == 2 * q4.THREADS
    assert ck.GEMM_Q4W2_SMEM_BYTES == q2 * (2048 + 256 + 64) * 16 + 1024 <= 227 << 10
    red_ld = int(re.search(r"#define WG_RED_LD (\d+)", (ck.KERNELS_DIR / "q4_marlin.cuh").read_text()).group(1))
    assert 256 * red_ld * 4 <= q2 * (2048 + 256 + 64) * 16  # the partial fits the ring (a static_assert too)
    made2 = {f"gemm_q4w2{k}_s{s}" for k, _, s in re.findall(r"^GEMM_Q4W2\((\w), (\d), (\d)\)", src, re.M)}
    assert made2 == set(ck.GEMM_Q4W2_KERNELS) and len(made2) == 2 * len(ck.WG_SPLITS)
    for n in ck.GEMM_Q4W2_KERNELS:
        assert n in ck.PDL_KERNELS and n in ck.ARCH_ENTRY_POINTS["gemm_q4_wgmma.cu"]
        assert ck.WGMMA_SMEM_BYTES[n] == ck.GEMM_Q4W2_SMEM_BYTES
    w2 = StandIn(num_sms=132, k=SimpleNamespace(wgmma=True, wgmma_t256=True))
    assert w2.w2_takes(129) and w2.w2_takes(q4.WG_MAX_TOKENS) and not w2.w2_takes(128)
    assert not w2.w2_takes(q4.WG_MAX_TOKENS + 1) and not be.w2_takes(256)  # be: the switch off
    assert (q4.W2_UPPER_FROM, q4.W2_MAX_TOKENS) == (424, 512)  # measured: its second tile pays from ~425
    assert not w2.w2_takes(424) and w2.w2_takes(425) and w2.w2_takes(512) and not w2.w2_takes(513)
    assert w2.wgmma_takes(480) and not be.wgmma_takes(480) and not w2.wgmma_takes(300)
    assert q4.gemm_takes(480, 37888, 3584, wgmma=True, t256=True) and not q4.gemm_takes(480, 37888, 3584, wgmma=True)
    assert be.choose_splits(256, 4608, 3584, wgmma=True, t256=True) == 3
    assert be.choose_splits(256, 37888, 3584, wgmma=True, t256=True) == 2
    assert be.choose_splits(512, 37888, 3584, wgmma=True, t256=True) == 2
    assert be.choose_splits(200, 3584, 18944, wgmma=True, t256=True) == 4


def test_gemm_silu_forms_kernels_and_where_they_take():
    """The 4-bit GEMMs' SiLU forms (gate_up + SiLU x up in the epilogue: gemm_q4.cu's gemm_q4{wg,w2}{z,m}_silu_s{S}
    and gemm_q4{z,m}_silu_m{MT}): one per form, mode and compiled cluster size (the wgmma ones sm_90a only, with
    their form's ring) or MT, each made by the source, PDL-launched; gemm_silu_takes: the GEMMs' token ranges (not
    the GEMV's, not dequantize + cuBLAS's), the switch, a 4-bit weight in the layout, N % 128 (64 gate + 64 up
    columns a block); the wgmma launch plan is gemm_q4's."""
    import re

    import llmrs.backends.cuda.quant_linear as q4
    from llmrs.backends.cuda import kernels as ck

    src = (ck.KERNELS_DIR / "gemm_q4_wgmma.cu").read_text()
    made = {f"gemm_q4{f}{k}_silu_s{s}" for f, k in re.findall(r"^GEMM_Q4_PAIRS\((\w+), \w+, \d, (\w), \d\)", src, re.M)
            for s in ck.WG_SPLITS}
    assert made == set(ck.GEMM_Q4WG_PAIR_KERNELS) | set(ck.GEMM_Q4W2_PAIR_KERNELS) and len(made) == 16
    # the mma.sync forms (CuPy's module, every architecture) and their split-K epilogue
    src = (ck.KERNELS_DIR / "gemm_q4.cu").read_text()
    made = {f"gemm_{k}_silu_m{mt}" for mt in re.findall(r"^GEMM_Q4_SILU\((\d)\)", src, re.M) for k in ("q4z", "q4m")}
    assert made == set(ck.GEMM_Q4_SILU_KERNELS)
    for n in (*ck.GEMM_Q4_SILU_KERNELS, "gemm_q4_reduce_silu"):
        assert n in ck.PDL_KERNELS and n in ck.ENTRY_POINTS["gemm_q4.cu"]
    for mt in ck.GEMM_Q4_SILU_MT:  # the ring, or the accumulators' 16 MT rows of 132 floats where they are more
        assert ck.gemm_q4_smem_bytes(mt, silu=True) == max(ck.gemm_q4_smem_bytes(mt), 16 * mt * 132 * 4)
    assert ck.gemm_q4_smem_bytes(4, {4: 2}, silu=True) == 64 * 132 * 4 > ck.gemm_q4_smem_bytes(4, {4: 2})
    for names, smem in ((ck.GEMM_Q4WG_PAIR_KERNELS, ck.GEMM_Q4WG_SMEM_BYTES),
                        (ck.GEMM_Q4W2_PAIR_KERNELS, ck.GEMM_Q4W2_SMEM_BYTES)):
        for n in names:
            assert n in ck.PDL_KERNELS and n in ck.ARCH_ENTRY_POINTS["gemm_q4_wgmma.cu"] and ck.WGMMA_SMEM_BYTES[n] == smem
            assert all(n not in ns for ns in ck.ENTRY_POINTS.values())
    assert CUDABackend.q4_gemm_epilogue  # on by default

    def be(wgmma=True, t256=True, on=True):
        return StandIn(num_sms=132, quant_matvec_max_tokens=8, q4_gemm_epilogue=on,
                       k=SimpleNamespace(wgmma=wgmma, wgmma_t256=t256))

    def w(N, K=3584):
        return SimpleNamespace(marlin=q4.MarlinWeight(N, K, 128, 0, None, None))

    gate_up = w(37888)  # the 7B's
    for T in (33, 64, 65, 128, 129, 256, 425, 512):  # mma.sync (MT 4), then the wgmma forms
        assert be().gemm_silu_takes(gate_up, T)
    for T in (1, 8, 16, 17, 32, 257, 424, 513, 1024):  # the GEMV; mma.sync's MT 2 (lost); dequantize + cuBLAS
        assert not be().gemm_silu_takes(gate_up, T)
    assert not be(t256=False).gemm_silu_takes(gate_up, 480)  # 425-512 is the 256-token form's only
    assert be(t256=False).gemm_silu_takes(gate_up, 256)
    # without sm_90a: mma.sync's 33-192 tokens (MT 4), dequantize + cuBLAS above
    assert be(wgmma=False).gemm_silu_takes(gate_up, 100) and be(wgmma=False).gemm_silu_takes(gate_up, 192)
    assert not be(wgmma=False).gemm_silu_takes(gate_up, 256)
    assert {q4.tile_rows(T) for T in (33, 64, 192)} == set(ck.GEMM_Q4_SILU_MT) and q4.tile_rows(32) == 2
    assert not be(on=False).gemm_silu_takes(gate_up, 256)  # q4_gemm_epilogue off
    assert not be().gemm_silu_takes(SimpleNamespace(marlin=None), 256)  # no GEMM layout
    assert not be().gemm_silu_takes(w(37888 + 64), 256)  # a pair would straddle two blocks
    assert be().gemm_silu_takes(w(9728, 896), 256)  # the 0.5B's gate_up
    # the plan: gemm_q4's (the same form and cluster size as the plain kernel at that T)
    form, S, per = be()._wg_plan(256, 37888, 3584, None, None)
    assert (form.kernel, S, per) == ("w2", 2, 28)
    form, S, per = be()._wg_plan(100, 37888, 3584, None, None)
    assert (form.kernel, S) == ("wg", be().choose_splits(100, 37888, 3584, True, False))


def test_the_norm_chain_forms_and_where_a_step_takes_them():
    """The RMSNorms between the 4-bit GEMVs carried by them (gemm_q4.cu GV_NORM_OUT / GV_NORM_IN): a _nout form of
    each one-tile plain GEMV with G fixed, a _nin form beside each paired form, all made by the source and
    PDL-launched; q4_norm_chain takes a step of 1-8 tokens where every layer's qkv and gate_up take the paired forms
    with a plan of one K slice or one cluster (gemv_norm_takes) and o and down are on the GEMV at G 32 / 128, under
    the switch (q4_gemv_norm: "auto" by default, up to a hidden size of 2048 where it measured faster; 1 at
    every size, 0 never). The 7B / 3B / 0.5B shapes all qualify on an H200 when forced; auto takes the 3B and 0.5B."""
    import re

    import llmrs.backends.cuda.quant_linear as q4
    from llmrs.backends.cuda import kernels as ck

    src = (ck.KERNELS_DIR / "gemv_q4.cu").read_text()
    made = {f"{n}{tail}" for e in ("SILU", "ROPE") for n in re.findall(rf"^GEMV_Q4_{e}\((\w+), \d, \d\)", src, re.M)
            for tail in ("", "_nin")}
    assert made == set(ck.GEMV_PAIR_KERNELS) and len(made) == 16 and "NAME##_nin(" in src
    assert set(re.findall(r"^GEMV_Q4_NOUT\((\w+), \d, \d\)", src, re.M)) == set(ck.GEMV_NOUT_KERNELS)
    for n in ck.GEMV_PAIR_KERNELS + ck.GEMV_NOUT_KERNELS:
        assert n in ck.PDL_KERNELS and n in ck.ENTRY_POINTS["gemv_q4.cu"]
    assert CUDABackend.q4_gemv_norm == "auto" and q4.Q4_NORM_CHAIN_MAX_K == 2048
    modes = {True: "on", False: "off", "auto": "auto", "1": "on", "0": "off", "off": "off", " Auto": "auto"}
    for v, m in modes.items():
        assert StandIn(q4_gemv_norm=v).norm_chain_mode() == m

    def be(on=True, cc=90, cluster=True):
        return StandIn(num_sms=132, q4_gemv_norm=on, q4_gemv_cluster=cluster, q4_gemv_epilogue=True,
                       q4_gemv=True, k=SimpleNamespace(cc=cc))

    def w(N, K, G=128):
        return SimpleNamespace(kind="q4", N=N, K=K, qweight=None, marlin=q4.MarlinWeight(N, K, G, 0, None, None))

    def layers(H, I, D, Hq, Hkv, n=2, G=128):
        return [SimpleNamespace(qkv=w((Hq + 2 * Hkv) * D, H, G), o=w(H, Hq * D, G), gate_up=w(2 * I, H, G),
                                down=w(H, I, G)) for _ in range(n)]

    for name, (H, I, D, Hq, Hkv) in {"7B": (3584, 18944, 128, 28, 4), "3B": (2048, 11008, 128, 16, 2),
                                     "0.5B": (896, 4864, 64, 14, 2)}.items():
        ls = layers(H, I, D, Hq, Hkv)
        for T in (1, 4, 8):
            assert be().q4_norm_chain(ls, T, D), (name, T)
        assert not be().q4_norm_chain(ls, 9, D) and not be(on=False).q4_norm_chain(ls, 1, D)
        assert not be(on="0").q4_norm_chain(ls, 1, D)
        assert be(on="auto").q4_norm_chain(ls, 1, D) == (H <= 2048), name
        for T in (1, 8):
            assert be().gemv_norm_takes(ls[0].qkv, T) and be().gemv_norm_takes(ls[0].gate_up, T)
    ls = layers(3584, 18944, 128, 28, 4)
    # without clusters only one-slice plans take it: the 7B's qkv splits K in 3
    assert be().gemv_splits(4608, 3584)[0] == 3
    assert not be(cc=80).q4_norm_chain(ls, 1, 128) and not be(cluster=False).q4_norm_chain(ls, 1, 128)
    assert be(cc=80).gemv_norm_takes(ls[0].gate_up, 1)  # gate_up: one slice
    assert not be().q4_norm_chain(layers(3584, 18944, 128, 28, 4, G=64), 1, 128)  # no fixed-G form
    bad = layers(3584, 18944, 128, 28, 4)
    bad[1].o = SimpleNamespace(kind="q8", N=3584, K=3584, qweight=object(), marlin=None)
    assert not be().q4_norm_chain(bad, 1, 128)  # every layer's o / down on the 4-bit GEMV
    assert not be().gemv_norm_takes(w(2048, 4096), 1)  # 8 slices: the L2 hand-off
    assert not be().q4_norm_chain([], 1, 128)


def test_wave_fill_splits_fill_the_last_round_of_blocks(monkeypatch):
    """Where a wgmma form's tiles pass half its resident blocks, K slices chosen so that the tiles finish in the
    fewest rounds of blocks over S (each block 1/S of a tile), the smaller S on a tie; at most 2 for the 256-token
    form (measured); without the fill rule S stays 1 there. A 7B on 132 SMs (264 slots of gemm_q4wg, 132 of
    gemm_q4w2)."""

    import llmrs.backends.cuda.quant_linear as q4

    assert q4.wave_fill_splits(592, 264, 7) == 4  # 3 rounds -> 9 of a quarter tile: 2.25
    assert q4.wave_fill_splits(296, 264, 7) == 4  # gate_up at 128 tokens: 2 rounds -> 1.25
    assert q4.wave_fill_splits(296, 132, 2) == 2  # the 256-token form's gate_up: 3 -> 2.5
    assert q4.wave_fill_splits(72, 264, 7) == 3 and q4.wave_fill_splits(56, 264, 37) == 4
    assert q4.wave_fill_splits(36, 132, 7) == 3
    assert q4.wave_fill_splits(264, 264, 7) == 1  # one full round: no split
    assert q4.wave_fill_splits(592, 264, 1) == 1 and q4.wave_fill_splits(592, 264, 0) == 1  # a short K: none
    be = StandIn(num_sms=132)
    assert be.choose_splits(128, 37888, 3584, wgmma=True) == 4
    assert be.choose_splits(256, 37888, 3584, wgmma=True, t256=True) == 2
    assert be.choose_splits(128, 4608, 3584, wgmma=True) == 4  # 36 tiles: the default rule
    monkeypatch.setattr(q4, "WG_FILL", False)
    assert be.choose_splits(128, 37888, 3584, wgmma=True) == 1
    assert be.choose_splits(256, 37888, 3584, wgmma=True, t256=True) == 1
    assert be.choose_splits(256, 4608, 3584, wgmma=True) == 3


@pytest.mark.parametrize("long_k", [1, 2, 4])
def test_matvec_splits_only_the_long_k_rule_takes_its_setting(long_k):
    """`_matvec_splits`: a 7B's down (K >= 4 N) gets `long_k_splits` warps a row where that option sets it, every
    other shape one (and so keeps its paired epilogue); `matvec_splits` forces all."""
    be = SimpleNamespace(matvec_splits=0, long_k_splits=long_k, square_k_splits=False)
    split = lambda N, K: CUDABackend._matvec_splits(be, N, K)  # noqa: E731
    assert split(3584, 18944) == long_k  # 7B down
    assert split(2048, 11008) == long_k  # 3B down
    assert [split(3584, 3584), split(37888, 3584), split(4608, 3584), split(152064, 3584)] == [1, 1, 1, 1]
    assert split(3584, 18945) == 1  # K % 8: the scalar path
    be.matvec_splits = 2
    assert split(3584, 3584) == 2 and split(3584, 18944) == 2


def test_matvec_long_k_splits_by_default_the_fewest_reaching_the_warp_count():
    """The default (long_k_splits 0): the fewest of 1, 2, 4 warps a row giving the matrix MATVEC_LONG_K_MIN_WARPS
    warps, the count that won for each preset's down inside the graphed one-stream step on the H200: 7B 1, 3B 2,
    0.5B 4; the other shapes keep one."""
    be = SimpleNamespace(matvec_splits=0, long_k_splits=0, square_k_splits=False)
    split = lambda N, K: CUDABackend._matvec_splits(be, N, K)  # noqa: E731
    assert MATVEC_LONG_K_MIN_WARPS == 3584
    assert [split(3584, 18944), split(2048, 11008), split(896, 4864)] == [1, 2, 4]  # 7B, 3B, 0.5B down
    assert split(1536, 8960) == 4 and split(1792, 8960) == 2  # 1.5B down (1536 x 2 < 3584); a made-up N at 2
    assert [split(3584, 3584), split(2048, 2048), split(896, 896), split(37888, 3584)] == [1, 1, 1, 1]


def test_kernel_compile_options_take_llmrs_cuda_defines(monkeypatch):
    """Every kernel file compiles with -std=c++17 and the macros of LLMRS_CUDA_DEFINES (probes such as
    probes/attn_clocks.py), read when the kernels are compiled; by default none."""
    from llmrs.backends.cuda import kernels as ck

    monkeypatch.delenv("LLMRS_CUDA_DEFINES", raising=False)
    assert ck.options() == ("-std=c++17",)
    monkeypatch.setenv("LLMRS_CUDA_DEFINES", " LLMRS_ATTN_CLOCKS, ATTN_X=2 ,")
    assert ck.options() == ("-std=c++17", "-DLLMRS_ATTN_CLOCKS", "-DATTN_X=2")


def test_cuda_options_default_to_what_ships_and_reject_unknown_forms():
    """CudaOptions's defaults are the backend's class defaults (what ships), and a form no kernel has is refused."""
    o = CudaOptions()
    for name in ("fuse_bf16", "fuse_epilogues", "q4_gemv", "q4_gemv_cluster", "q4_gemv_epilogue", "q4_gemm_epilogue",
                 "q4_bf16_input", "gate_up_bf16", "fold_qkv_bias", "attn_o_fused"):
        assert getattr(o, name) is True and getattr(CUDABackend, name) is True, name
    assert (o.fuse_norm, o.q4_gemv_norm, o.attn_kernel, o.prefill_min_tokens, o.attn_cluster, o.attn_cluster_warps,
            o.attn_o_warps, o.matvec_splits, o.long_k_splits, o.gemm_pad_rows, o.matvec_rows) == (
        "auto", "auto", "auto", 16, None, 16, 0, 0, 0, False, False)
    for bad in (dict(fuse_norm="x"), dict(attn_kernel="flash"), dict(attn_cluster=32), dict(matvec_splits=3)):
        with pytest.raises(ValueError, match="CudaOptions"):
            CudaOptions(**bad)


def test_sample_row_blocks_spreads_small_batches_within_the_sms():
    """kernels.sample_row_blocks: one stream's row over several blocks, a big batch one block a row, never
    more blocks than SMs in all (the hand-off buffers hold num_sms partials) nor slices under SAMPLE_MIN_SLICE."""
    from llmrs.backends.cuda.kernels import SAMPLE_MAX_BLOCKS, SAMPLE_MIN_SLICE, sample_row_blocks

    assert sample_row_blocks(1, 152064, 132) == 152064 // SAMPLE_MIN_SLICE == 18
    assert sample_row_blocks(1, 10**7, 132) == SAMPLE_MAX_BLOCKS
    assert sample_row_blocks(256, 152064, 132) == sample_row_blocks(67, 152064, 132) == 1
    assert sample_row_blocks(4, 1000, 132) == sample_row_blocks(0, 7, 132) == 1
    for S in range(1, 300):
        for V in (7, 5000, 32000, 152064, 256000):
            nb = sample_row_blocks(S, V, 132)
            assert 1 <= nb <= SAMPLE_MAX_BLOCKS and (nb == 1 or (S * nb <= 132 and V // nb >= SAMPLE_MIN_SLICE))


def test_attention_and_o_fuse_at_one_token_where_the_head_splits_fit():
    """attn_o_cluster (one token's attention + o in one kernel) where attn_cluster would run at one token with a bf16
    o on the matvec path: Hq clusters of CL running at once (the driver's count), o's rows / CL within a block's 256
    (CL 8) or 512 (CL 4); auto takes CL 8 only, attn_o_fused=4 / 8 forces a size."""
    from llmrs.backends.cuda import ATTN_O_MAX_ROWS
    from llmrs.model.quant import DeviceQuantWeight

    def case(preset: str, **kw):
        be = fake_backend(preset)
        be.attn_cluster, be.k, be.tp, be.attn_o_fused = None, SimpleNamespace(cc=90), None, True
        be.matvec_max_tokens = 1
        c = be.config
        be.dpl = c.head_dim // 32
        be._attn_choice = lambda T: CUDABackend._attn_choice(be, T)
        be._attn_o_max_clusters = lambda cl: be.num_sms // cl  # (the driver's answer on the GPU)
        for k, v in kw.items():
            setattr(be, k, v)
        return be, np.empty((c.hidden_size, c.num_attention_heads * c.head_dim), dtype=np.uint16)

    db = SimpleNamespace(T=1, n_prefill_tiles=0, max_len=512)
    be, o = case("qwen2.5-3b")  # 16 heads x 8 splits = 128 blocks; 2048 / 8 = 256 rows a split
    assert CUDABackend._attn_o_cluster(be, o, db) == 8
    assert ATTN_O_MAX_ROWS == {8: 256, 4: 512}
    be._attn_o_max_clusters = lambda cl: {8: 15, 4: 30}[cl]  # the H200's: 16 clusters of 8 would run in two waves
    assert CUDABackend._attn_o_cluster(be, o, db) == 0  # auto takes 8 only (4 measured no faster on the 3B)
    be.attn_o_fused = 4  # that size (512 rows a split) where it fits
    assert CUDABackend._attn_o_cluster(be, o, db) == 4
    be.attn_o_fused = 8  # =8: that size or none
    assert CUDABackend._attn_o_cluster(be, o, db) == 0
    be._attn_o_max_clusters = lambda cl: be.num_sms // cl
    assert CUDABackend._attn_o_cluster(be, o, db) == 8
    be, o = case("qwen2.5-1.5b")  # 12 x 8 = 96 blocks, 1536 / 8 = 192 rows
    assert CUDABackend._attn_o_cluster(be, o, db) == 8
    be, o = case("qwen2.5-7b")  # 28 x 8 = 224 blocks > 132; 28 x 4 fit but 3584 / 4 = 896 rows > 512
    assert CUDABackend._attn_o_cluster(be, o, db) == 0
    be, o = case("qwen2.5-0.5b")  # 64-dim heads (decode_attn_tc's at one token)
    assert CUDABackend._attn_o_cluster(be, o, db) == 0
    be, o = case("qwen2.5-3b")
    for other in (SimpleNamespace(T=2, n_prefill_tiles=0, max_len=512),  # two tokens: attn_cluster + the matvec
                  SimpleNamespace(T=1, n_prefill_tiles=1, max_len=512),  # a prefill chunk of one token
                  SimpleNamespace(T=1, n_prefill_tiles=0, max_len=1025)):  # past attn_cluster's contexts
        assert CUDABackend._attn_o_cluster(be, o, other) == 0
    assert CUDABackend._attn_o_cluster(be, o, SimpleNamespace(T=1, n_prefill_tiles=0, max_len=1024)) == 8
    q4 = DeviceQuantWeight.__new__(DeviceQuantWeight)  # a 4-bit o (the GEMV's norm chain, not this kernel)
    assert CUDABackend._attn_o_cluster(be, q4, db) == 0
    for off in ({"attn_o_fused": False}, {"k": SimpleNamespace(cc=89)}, {"tp": object()}, {"attn_cluster": 0},
                {"attn_splits": 8}, {"attn_kernel": "tc"}, {"attn_kernel": "gqa"}, {"matvec_max_tokens": 0}):
        be, o = case("qwen2.5-3b", **off)
        assert CUDABackend._attn_o_cluster(be, o, db) == 0, off
    be, o = case("qwen2.5-3b", num_sms=100)  # 16 x 8 > 100: auto none, forced 4 splits of 512 rows
    assert CUDABackend._attn_o_cluster(be, o, db) == 0
    be.attn_o_fused = 4
    assert CUDABackend._attn_o_cluster(be, o, db) == 4
    be, o = case("qwen2.5-3b", num_sms=60, attn_o_fused=4)  # 16 x 4 > 60
    assert CUDABackend._attn_o_cluster(be, o, db) == 0


def test_attn_o_eight_warp_form_under_its_switch_and_where_sixteen_do_not_fit():
    """attn_o_warps=8: clusters of 8 take attn_o_cluster8_w8 (256 threads, two blocks an SM), and the count
    of clusters that run at once is asked of that kernel; clusters of 4 and =16 keep the 16-warp forms. Auto takes
    the 8-warp form only where the model's Hq clusters of the 16-warp form do not all run at once."""
    stand_in = SimpleNamespace(raw=None)  # (no compiled function: the rule's one-block-an-SM stand-in)
    be = SimpleNamespace(attn_o_warps=8, num_sms=132, _cluster_counts={},
                         config=SimpleNamespace(num_attention_heads=16),
                         k=SimpleNamespace(attn_o_cluster8_w8=stand_in, attn_o_cluster8=stand_in,
                                           attn_o_cluster4=stand_in))
    be._attn_o_form = lambda cl: CUDABackend._attn_o_form(be, cl)
    be._max_clusters = lambda name, threads, cl: CUDABackend._max_clusters(be, name, threads, cl)
    assert CUDABackend._attn_o_form(be, 8) == ("attn_o_cluster8_w8", 256)
    assert CUDABackend._attn_o_form(be, 4) == ("attn_o_cluster4", 512)
    assert CUDABackend._attn_o_max_clusters(be, 8) == 16 and "attn_o_cluster8_w8" in be._cluster_counts
    be.attn_o_warps = 16
    assert CUDABackend._attn_o_form(be, 8) == ("attn_o_cluster8", 512)
    assert CUDABackend.attn_o_warps == 0  # the default: auto
    be.attn_o_warps = 0
    assert CUDABackend._attn_o_form(be, 8) == ("attn_o_cluster8", 512)  # 16 heads, 16 clusters of 8 at once
    be._cluster_counts["attn_o_cluster8"] = 15  # the H200's count
    assert CUDABackend._attn_o_form(be, 8) == ("attn_o_cluster8_w8", 256)
    be.config.num_attention_heads = 12  # the 1.5B: all 12 run at once
    assert CUDABackend._attn_o_form(be, 8) == ("attn_o_cluster8", 512)
    assert CUDABackend._attn_o_form(be, 4) == ("attn_o_cluster4", 512)
