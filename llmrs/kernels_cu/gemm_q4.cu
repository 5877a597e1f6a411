// gemm_q4.cu: the Marlin-style 4-bit GEMM of the prefill / batched path:
//   out[T, N] (= or +=) x[T, K] @ W[N, K]^T (+ bias[N]),  x bf16 (the backend's `gemm_x` cast), out f32,
//   W 4-bit with group size G along K: mode "zero" (AWQ, Q4_0 with z = 8) w = (q - z) * s, mode "min" (Q4_1)
//   w = q * s + m. N % 32 == 0, K % 64 == 0, G % 32 == 0 (the host asks N % 64, K % 64 and falls back else).
//
// Layout (made once at load by llmrs.model.quant.marlin_reorder, pinned by tests/test_quant_marlin.py):
//   qweight uint32 [N/32][K/32][32 lanes][4 words]: the 16 bytes of lane L (g = L / 4, t = L % 4) for the
//   32 x 32 tile (nb, kb) are exactly that lane's mma.m16n8k16 B fragments for two k16 steps and four n8 tiles:
//   word i (n8 tile i), nibble j (bits 4j..4j+3) holds W[n, k] with
//     n = 32 nb + 8 i + g,   k = 32 kb + 16 (j >> 2) + 8 ((j >> 1) & 1) + 2 t + (j & 1)
//   so nibbles (0, 1) are b0 of k16 step 0 (low half, high half), (2, 3) its b1, (4..7) the same for step 1.
//   sz uint32 [K/G][N]: fp16 s in the low half, fp16 z (or m; 8.0 for Q4_0) in the high half.
//
// Dequantization, bit-exact with dequant_q4_bf16 (f32 (q - z) * s or s * q + m, rounded once to bf16):
//   a code at bits 12..15 of a word, OR-ed into the f32 0x45000000, is the float 2048 + q; at bits 16..19 into
//   0x43000000, 128 + q (one lop3 each; four shifts per word place all eight codes there). Then
//     zero: fma(2048 + q, s, -(2048 + z) s): both products are exact in f32 (<= 12-bit integer times an fp16),
//           so the fma returns the exact (q - z) s, which dequant_q4_bf16 also gets exactly;
//     min:  fma((2048 + q) - 2048, s, m): the subtraction and q * s are exact, one rounding, as fadd(fmul).
//   cvt.rn.bf16x2.f32 rounds to nearest even as f32_to_bf16 does (finite values). NOTE: a zero weight of a
//   negative scale is +0 here and -0 there: equal values, invisible in every product and sum.
//   Per weight: ~0.5 shift + 1 lop3 + 1 fma (2 in min) + 0.5 cvt, amortized over MT m16 tiles of tokens.
//
// Work: 4 warps per block, 128 columns (32 per warp) x 16 MT token rows; each warp holds all MT m16 tiles of
// its 32 columns (acc 16 MT floats), so each dequantized B fragment feeds MT mma. K is walked in 64-wide
// stages (two 32-k sub-blocks, each inside one group) through a STAGES-deep cp.async ring in shared memory:
// x rows (16-byte chunks XOR-swizzled by row, ldmatrix.x4 conflict-free; rows >= T zero-filled), the warps'
// packed weights (lane L reads its 16 bytes at L: conflict-free), the scale rows of both sub-blocks.
// Split-K (gridDim.z > 1): each slice writes f32 partials [z][T][N], gemm_q4_reduce sums them in a fixed
// order and applies bias / accumulate (deterministic).
//
// Registers / spills: see `llmrs ptx-check llmrs/kernels_cu/gemm_q4.cu` (must be clean: no local memory).
#include "common.cuh"

#define GQ_THREADS 128
#define GQ_BN 128  // output columns per block

__device__ __forceinline__ void ldmatrix_x4(unsigned* a, unsigned addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                 : "r"(addr)
                 : "memory");
}

// NAME: c += a b, NAME##_zc: c = a b (C = 0: the first mma of a sum, no zeroing of c before it); m16n8k16 with
// operands of type T ("bf16", or "f16" for gemv_q4's GV_FP16 form), f32 accumulators
#define MMA_16816(NAME, T)                                                                                      \
    __device__ __forceinline__ void NAME##_zc(float* c, const unsigned* a, unsigned b0, unsigned b1) {          \
        asm("mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "       \
            "{%8, %9}, {%10, %10, %10, %10};\n"                                                                 \
            : "=f"(c[0]), "=f"(c[1]), "=f"(c[2]), "=f"(c[3])                                                    \
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "f"(0.0f));                         \
    }                                                                                                           \
    __device__ __forceinline__ void NAME(float* c, const unsigned* a, unsigned b0, unsigned b1) {               \
        asm("mma.sync.aligned.m16n8k16.row.col.f32." T "." T ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "       \
            "{%8, %9}, {%0, %1, %2, %3};\n"                                                                     \
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                                    \
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));                                    \
    }
MMA_16816(mma_bf16, "bf16")

__device__ __forceinline__ float gq_f16_to_f32(unsigned short h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// (v & MASK) | EXPO in one lop3: a 4-bit code under a float's exponent (code_at, bf16x2_code, f16x2_code)
template <unsigned MASK, unsigned EXPO>
__device__ __forceinline__ unsigned lop3_code(unsigned v) {
    unsigned r;
    asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(v), "n"(MASK), "n"(EXPO));
    return r;
}

// (v & MASK) | EXPO as a float: the code at bits 12..15 (EXPO 0x45000000) is 2048 + q, at 16..19 (0x43000000) 128 + q
template <unsigned MASK, unsigned EXPO>
__device__ __forceinline__ float code_at(unsigned v) {
    return __uint_as_float(lop3_code<MASK, EXPO>(v));
}

__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

#define P12(v) code_at<0x0000F000u, 0x45000000u>(v)
#define P16(v) code_at<0x000F0000u, 0x43000000u>(v)

// The weight from its magic float x = OFF + q. MODE 0: c = -(OFF + z) s, fma exact. MODE 1: c = m.
template <int MODE, int OFF>
__device__ __forceinline__ float deq(float x, float s, float c) {
    return MODE == 0 ? __fmaf_rn(x, s, c) : __fmaf_rn(x - (float)OFF, s, c);
}

// A column's scale word (fp16 s low, fp16 z or m high) as frag_b's s and MODE-0 constants c12, c16 (MODE 1: m)
template <int MODE>
__device__ __forceinline__ void frag_consts(unsigned sz, float& s, float& c12, float& c16) {
    s = gq_f16_to_f32((unsigned short)(sz & 0xffffu));
    const float z = gq_f16_to_f32((unsigned short)(sz >> 16));
    c12 = MODE == 0 ? __fmul_rn(-(2048.0f + z), s) : z;
    c16 = MODE == 0 ? __fmul_rn(-(128.0f + z), s) : z;
}

// b0, b1 of k16 step KS of one packed word (see the layout at the top). c12 / c16: the MODE-0 constants of the
// codes found at bits 12 / 16 (MODE 1: both m).
template <int MODE, int KS>
__device__ __forceinline__ void frag_b(unsigned w, float s, float c12, float c16, unsigned& b0, unsigned& b1) {
    if (KS == 0) {
        const unsigned w8 = w << 8, w12 = w << 12;
        b0 = pack_bf16x2(deq<MODE, 2048>(P12(w12), s, c12), deq<MODE, 2048>(P12(w8), s, c12));  // nibbles 0, 1
        b1 = pack_bf16x2(deq<MODE, 128>(P16(w8), s, c16), deq<MODE, 2048>(P12(w), s, c12));    // nibbles 2, 3
    } else {
        const unsigned w8 = w >> 8, w12 = w >> 12;
        b0 = pack_bf16x2(deq<MODE, 128>(P16(w), s, c16), deq<MODE, 2048>(P12(w8), s, c12));    // nibbles 4, 5
        b1 = pack_bf16x2(deq<MODE, 128>(P16(w8), s, c16), deq<MODE, 128>(P16(w12), s, c16));   // nibbles 6, 7
    }
}

// Pipeline stages per MT. The ring is dynamic shared memory (the host passes its size and raises the kernel's
// limit above 48 KB: cuda_kernels.GEMM_Q4_STAGES, which compiles these values in with -D; the defaults here are
// the same, for `llmrs ptx-check`). A stage is (16 MT 8 + 256 + 64) x 16 bytes: 21 KB at MT 8, 13 KB at 4.
// Deeper rings bought nothing on the H200 (scripts/bench_gemm_q4.py, the 7B's four AWQ linears, 28-layer sums in ms
// at T 128 / 256 / 512, MT8:MT4 stages 2:3 (these defaults) / 3:4 / 4:4 / 4:6: 7.36 / 7.39 / 7.46 / 7.61, 11.98 /
// 12.06 / 12.05 / 12.07, 21.96 / 22.09 / 22.25 / 22.27; reports/h200-qwen2.5/session13 call1): the loads are hidden
// already; at 256+ tokens the kernel is bound inside the SM (~300-350 TFLOP/s of mma.sync at 2 blocks an SM for
// MT 8, 252 registers), where dequantize + cuBLAS (wgmma) reaches 350-490.
#ifndef GQ_STAGES_M1
#define GQ_STAGES_M1 4
#endif
#ifndef GQ_STAGES_M2
#define GQ_STAGES_M2 4
#endif
#ifndef GQ_STAGES_M4
#define GQ_STAGES_M4 3
#endif
#ifndef GQ_STAGES_M8
#define GQ_STAGES_M8 2
#endif

template <int MT>
struct GemmQ4Smem {
    static constexpr int STAGES =
        MT == 8 ? GQ_STAGES_M8 : MT == 4 ? GQ_STAGES_M4 : MT == 2 ? GQ_STAGES_M2 : GQ_STAGES_M1;
    static_assert(STAGES >= 2, "the ring needs a stage in flight while one is used");
    uint4 a[STAGES][16 * MT * 8];                   // x rows: 8 chunks of 16 bytes (64 bf16), swizzled
    uint4 b[STAGES][256];                           // [warp][kb][lane] packed weights
    uint4 s[STAGES][64];                            // [kb][128 columns] scale words
};

// The paired forms' followers, in the epilogue of a block whose columns pair up: SiLU x up of gate_up (gate n / up n:
// the GEMV's up to 8 tokens, the GEMMs' 33-512), RoPE + the paged-cache write of qkv (a head's dims i / i + D/2: the
// GEMV's; GvRope below)
#define GV_EPI_SILU 1
#define GV_EPI_ROPE 2
// The GEMMs' SiLU forms: block b holds gate_up's gate columns 64 b .. 64 b + 63 as its columns 0..63 and the matching
// up columns (N / 2 on) as 64..127: the loader's n-blocks 2 b, 2 b + 1, then `hi` further.
template <int EPI>
__device__ __forceinline__ int wg_pair_nb0(int nblk) { return EPI == GV_EPI_SILU ? 2 * nblk : 4 * nblk; }
template <int EPI>
__device__ __forceinline__ int wg_pair_hi(int N) { return EPI == GV_EPI_SILU ? (N >> 6) - 2 : 0; }
// f32 rows of a block's 128 columns in shared memory (the epilogues' partials / accumulators: + 4, so that a warp's
// stores of one accumulator hit 32 banks; the mma.sync SiLU forms' 16 MT rows: the host sizes their dynamic shared
// memory to hold them, cuda_kernels.gemm_q4_smem_bytes)
#define WG_RED_LD 132

// One thread's share of filling a pipeline stage, its addresses computed once: each load() copies k tile kt0,
// kt0 + 1, ... (in order) into a stage and advances the global pointers by one tile (x: 8 chunks, codes: 2 k32
// blocks; shared-memory addresses as 32-bit offsets from stage 0); the scale row is k >> log2 G; the stages rotate
// by counters. Before, each
// stage recomputed every address (64-bit products, a division by G, `% STAGES`) in loops the compiler could not
// unroll (their trip count hung on the thread): `llmrs ptx-check --sass` on sm_90 counted 871 instructions in the
// main loop of gemm_q4z_m4 statically (its inner copy loops running MT times each), now 437, fully unrolled
// (m1: 793 -> 341, m2: 809 -> 371; registers m4 159 -> 167, still 3 blocks an SM).
// THREADS: the block's threads (gemm_q4w2's 256: one code load a thread, 8 x chunks). The block's 128 columns are the
// 32-column n-blocks nb0 .. nb0 + 3, the last two moved by `hi` n-blocks (the SiLU pairing: gate's 64 columns, then
// up's 64 at gate_up's N / 2 on; 0 elsewhere).
template <int MT, int THREADS = GQ_THREADS>
struct StageLoader {
    static constexpr int NA = 16 * MT * 8 / THREADS;  // x chunks a thread
    static constexpr int NW = 256 / THREADS;           // 16-byte code loads a thread (a stage: 256)
    const uint4* xa[NA];
    unsigned a_off[NA];  // byte offset in a stage's a[]
    int a_bytes[NA];
    const uint4* wb[NW];
    bool b_live[NW];
    const uint4* sz;  // this thread's scale column (tid < 64), row 0
    int k, gshift, N4;
    bool s_live;
    unsigned a_sm, b_sm, s_sm;  // shared-memory addresses in stage 0 (a: the stage's base; b, s: this thread's)

    template <typename Smem>
    __device__ __forceinline__ void init(const Smem& sm, const uint4* __restrict__ Bq, const uint4* __restrict__ SZ,
                                         const uint4* __restrict__ X, int T, int N, int K, int G, int m0, int nb0,
                                         int kt0, int hi = 0) {
        const int tid = threadIdx.x, K8 = K >> 3, KB = K >> 5, NB = N >> 5;
        a_sm = smem_u32(sm.a[0]);
        b_sm = smem_u32(&sm.b[0][tid]);
        s_sm = smem_u32(&sm.s[0][tid]);
#pragma unroll
        for (int i = 0; i < NA; ++i) {
            const int c = tid + i * THREADS, r = c >> 3, cc = c & 7, m = m0 + r;
            xa[i] = X + (size_t)(m < T ? m : 0) * K8 + kt0 * 8 + cc;
            a_off[i] = (unsigned)(r * 8 + (cc ^ (r & 7))) * 16u;
            a_bytes[i] = m < T ? 16 : 0;
        }
#pragma unroll
        for (int i = 0; i < NW; ++i) {
            const int c = tid + i * THREADS, l = c >> 6, nb = nb0 + l + (l >= 2 ? hi : 0), kb = (c >> 5) & 1;
            b_live[i] = nb < NB;
            wb[i] = Bq + ((size_t)(b_live[i] ? nb : 0) * KB + 2 * kt0 + kb) * 32 + (c & 31);
        }
        const int lc = 4 * (tid & 31), col = nb0 * 32 + lc + (lc >= 64 ? 32 * hi : 0);
        s_live = tid < 64 && col < N;
        sz = SZ + (s_live ? col / 4 : 0);
        k = 64 * kt0 + 32 * (tid >> 5 & 1);
        gshift = __ffs(G) - 1;  // G a power of two (cuda_q4gemm.supported)
        N4 = N / 4;
    }

    template <typename Smem>
    __device__ __forceinline__ void load(int st) {
        constexpr unsigned A_STAGE = sizeof(Smem::a[0]), B_STAGE = sizeof(Smem::b[0]), S_STAGE = sizeof(Smem::s[0]);
        const unsigned a0 = a_sm + st * A_STAGE;
#pragma unroll
        for (int i = 0; i < NA; ++i) {
            cp_async16(a0 + a_off[i], xa[i], a_bytes[i]);
            xa[i] += 8;
        }
#pragma unroll
        for (int i = 0; i < NW; ++i) {
            if (b_live[i]) cp_async16(b_sm + st * B_STAGE + i * THREADS * 16, wb[i], 16);
            wb[i] += 64;
        }
        if (s_live) cp_async16(s_sm + st * S_STAGE, sz + (size_t)(k >> gshift) * N4, 16);
        k += 64;
    }
};

template <int MT, int MODE>
__device__ __forceinline__ void compute_stage(const GemmQ4Smem<MT>& sm, int st, int warp, int lane,
                                              float (&acc)[MT][4][4]) {
    const unsigned* S = reinterpret_cast<const unsigned*>(sm.s[st]);
    const unsigned a_base = smem_u32(sm.a[st]);
#pragma unroll
    for (int kb = 0; kb < 2; ++kb) {
        const uint4 q = sm.b[st][(warp * 2 + kb) * 32 + lane];
        const unsigned wq[4] = {q.x, q.y, q.z, q.w};
        float sc[4], c12[4], c16[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            frag_consts<MODE>(S[kb * GQ_BN + warp * 32 + 8 * i + (lane >> 2)], sc[i], c12[i], c16[i]);
        }
#pragma unroll
        for (int ks = 0; ks < 2; ++ks) {
            unsigned a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                const int r = mt * 16 + (lane & 15), cc = (kb * 2 + ks) * 2 + (lane >> 4);
                ldmatrix_x4(a[mt], a_base + (unsigned)(r * 8 + (cc ^ (r & 7))) * 16u);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                unsigned b0, b1;
                if (ks == 0)
                    frag_b<MODE, 0>(wq[i], sc[i], c12[i], c16[i], b0, b1);
                else
                    frag_b<MODE, 1>(wq[i], sc[i], c12[i], c16[i], b0, b1);
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) mma_bf16(acc[mt][i], a[mt], b0, b1);
            }
        }
    }
}

// EPI GV_EPI_SILU (gemm_q4{z,m}_silu_m{MT}): gate_up with SiLU x up fused, the block's 128 columns 64 of gate and
// the matching 64 of up (the loader's n-blocks 2 b, 2 b + 1, then N / 64 further: warps 0, 1 gate, 2, 3 up). With
// one K slice the accumulators go through shared memory (the ring's space) and each thread writes silu(gate) x up of
// its column pairs as bf16 words to out16 [T, N / 2]; with several, each slice's partials go to part in that pair
// order ([z][T][N], block b's columns 128 b .. 128 b + 127) and gemm_q4_reduce_silu sums and finishes them. Either
// way the bits of the plain form's f32 output + silu_mul_bf16.
template <int MT, int MODE, int EPI = 0>
__device__ __forceinline__ void gemm_q4_impl(const uint4* __restrict__ Bq, const uint4* __restrict__ SZ,
                                             const uint4* __restrict__ X, const float* __restrict__ bias,
                                             float* __restrict__ out, float* __restrict__ part, int T, int N, int K,
                                             int G, int accumulate, int kt_per_split,
                                             bf16_t* __restrict__ out16 = nullptr) {
    pdl_enter();
    constexpr int STAGES = GemmQ4Smem<MT>::STAGES;
    extern __shared__ uint4 gq_smem[];  // GemmQ4Smem<MT>: its size is the launch's dynamic shared memory
    GemmQ4Smem<MT>& sm = *reinterpret_cast<GemmQ4Smem<MT>*>(gq_smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nblk = blockIdx.x, m0 = blockIdx.y * 16 * MT;
    const int kt0 = blockIdx.z * kt_per_split, nk = min((K >> 6) - kt0, kt_per_split);
    // warp-uniform: the last block may reach past N (a SiLU pair's block never does: N % 128, the host's rule)
    const bool active = EPI || (nblk * 4 + warp) * 32 < N;

    float acc[MT][4][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][i][e] = 0.0f;

    StageLoader<MT> ld;
    ld.init(sm, Bq, SZ, X, T, N, K, G, m0, wg_pair_nb0<EPI>(nblk), kt0, wg_pair_hi<EPI>(N));
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < nk) ld.template load<GemmQ4Smem<MT>>(s);
        cp_async_commit();  // always: the group count stays uniform
    }
    int st_use = 0, st_load = STAGES - 1;  // stage indices by counters, not `% STAGES` each tile
    for (int it = 0; it < nk; ++it) {
        cp_async_wait<STAGES - 2>();  // stage `it` has landed (for this thread) ...
        __syncthreads();              // ... for every thread; and every warp is done with stage it - 1
        if (it + STAGES - 1 < nk) ld.template load<GemmQ4Smem<MT>>(st_load);
        cp_async_commit();
        if (active) compute_stage<MT, MODE>(sm, st_use, warp, lane, acc);
        st_use = st_use + 1 == STAGES ? 0 : st_use + 1;
        st_load = st_load + 1 == STAGES ? 0 : st_load + 1;
    }
    cp_async_wait<0>();
    if (!active) return;

    const int g = lane >> 2, t = lane & 3;
    if (EPI == GV_EPI_SILU && part == nullptr) {  // one slice: through shared memory to the pairs' threads
        __syncthreads();  // every warp is done with the ring: its space takes the accumulators
        float* red = reinterpret_cast<float*>(gq_smem);  // [16 MT rows][WG_RED_LD]
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int h = 0; h < 2; ++h)
                    *reinterpret_cast<float2*>(red + (mt * 16 + g + 8 * h) * WG_RED_LD + warp * 32 + 8 * i + 2 * t) =
                        make_float2(acc[mt][i][2 * h], acc[mt][i][2 * h + 1]);
        __syncthreads();
        const int p = 2 * lane;  // a lane: gate columns p, p + 1 of its rows and their up columns p + 64, p + 65
        for (int r = warp; r < 16 * MT; r += 4) {
            const int m = m0 + r;
            if (m >= T) break;
            const float2 gv = *reinterpret_cast<const float2*>(red + r * WG_RED_LD + p);
            const float2 uv = *reinterpret_cast<const float2*>(red + r * WG_RED_LD + 64 + p);
            *reinterpret_cast<unsigned*>(out16 + (size_t)m * (N >> 1) + nblk * 64 + p) =
                bf16x2(silu_mul_f(gv.x, uv.x), silu_mul_f(gv.y, uv.y));
        }
        return;
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int n = (nblk * 4 + warp) * 32 + 8 * i + 2 * t;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int m = m0 + mt * 16 + g + 8 * h;
                if (m >= T) continue;
                float v0 = acc[mt][i][2 * h], v1 = acc[mt][i][2 * h + 1];
                if (part) {
                    *reinterpret_cast<float2*>(part + ((size_t)blockIdx.z * T + m) * N + n) = make_float2(v0, v1);
                    continue;
                }
                if (bias) {
                    v0 += bias[n];
                    v1 += bias[n + 1];
                }
                float2* dst = reinterpret_cast<float2*>(out + (size_t)m * N + n);
                if (accumulate) {
                    const float2 o = *dst;
                    v0 = o.x + v0;
                    v1 = o.y + v1;
                }
                *dst = make_float2(v0, v1);
            }
        }
}

#define GEMM_Q4(MT)                                                                                               \
    extern "C" __global__ void __launch_bounds__(GQ_THREADS)                                                      \
        gemm_q4z_m##MT(const uint4* __restrict__ Bq, const uint4* __restrict__ SZ, const uint4* __restrict__ X,    \
                       const float* __restrict__ bias, float* __restrict__ out, float* __restrict__ part, int T,   \
                       int N, int K, int G, int accumulate, int kt_per_split) {                                   \
        gemm_q4_impl<MT, 0>(Bq, SZ, X, bias, out, part, T, N, K, G, accumulate, kt_per_split);                    \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(GQ_THREADS)                                                      \
        gemm_q4m_m##MT(const uint4* __restrict__ Bq, const uint4* __restrict__ SZ, const uint4* __restrict__ X,    \
                       const float* __restrict__ bias, float* __restrict__ out, float* __restrict__ part, int T,   \
                       int N, int K, int G, int accumulate, int kt_per_split) {                                   \
        gemm_q4_impl<MT, 1>(Bq, SZ, X, bias, out, part, T, N, K, G, accumulate, kt_per_split);                    \
    }
GEMM_Q4(1)
GEMM_Q4(2)
GEMM_Q4(4)
GEMM_Q4(8)

// the SiLU forms of the mma.sync GEMM (gemm_q4_impl's EPI): MT 4, 33-192 tokens (on Hopper 33-64: the wgmma forms
// take 65 on), where cuda_q4gemm.gemm_silu_takes. (MT 2, 17-32 tokens, gave the same bits and lost inside the graphed
// step on the H200: 32 sequences 5.46-5.65 against 5.05-5.13 ms, session24 call5.)
#define GEMM_Q4_SILU(MT)                                                                                          \
    extern "C" __global__ void __launch_bounds__(GQ_THREADS)                                                      \
        gemm_q4z_silu_m##MT(const uint4* __restrict__ Bq, const uint4* __restrict__ SZ,                           \
                            const uint4* __restrict__ X, bf16_t* __restrict__ out16, float* __restrict__ part,    \
                            int T, int N, int K, int G, int kt_per_split) {                                       \
        gemm_q4_impl<MT, 0, GV_EPI_SILU>(Bq, SZ, X, nullptr, nullptr, part, T, N, K, G, 0, kt_per_split, out16);  \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(GQ_THREADS)                                                      \
        gemm_q4m_silu_m##MT(const uint4* __restrict__ Bq, const uint4* __restrict__ SZ,                           \
                            const uint4* __restrict__ X, bf16_t* __restrict__ out16, float* __restrict__ part,    \
                            int T, int N, int K, int G, int kt_per_split) {                                       \
        gemm_q4_impl<MT, 1, GV_EPI_SILU>(Bq, SZ, X, nullptr, nullptr, part, T, N, K, G, 0, kt_per_split, out16);  \
    }
GEMM_Q4_SILU(4)

// Split-K epilogue: out[t, n] (= or +=) sum over z of part[z, t, n] (z = 0, 1, ... in order) + bias[n].
extern "C" __global__ void gemm_q4_reduce(const float* __restrict__ part, const float* __restrict__ bias,
                                          float* __restrict__ out, int T, int N, int S, int accumulate) {
    pdl_enter();
    const long long total = (long long)T * N;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < total;
         idx += (long long)gridDim.x * blockDim.x) {
        float v = 0.0f;
        for (int z = 0; z < S; ++z) v += part[z * total + idx];
        if (bias) v += bias[idx % N];
        out[idx] = accumulate ? out[idx] + v : v;
    }
}

// The SiLU forms' split-K epilogue: out16[t, i] = bf16(silu(gate) x up), gate and up each the sum over z of part in
// order from 0.0f (gemm_q4_reduce's sums without a bias), part in the pair order: output column i = 64 b + j reads
// part's columns 128 b + j (gate) and 128 b + 64 + j (up).
extern "C" __global__ void gemm_q4_reduce_silu(const float* __restrict__ part, bf16_t* __restrict__ out16, int T,
                                               int N, int S) {
    pdl_enter();
    const long long total = (long long)T * N, half = total >> 1;
    const int I = N >> 1;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < half;
         idx += (long long)gridDim.x * blockDim.x) {
        const long long t = idx / I;
        const int i = (int)(idx - t * I);
        const long long c = t * N + 128 * (i >> 6) + (i & 63);
        float gv = 0.0f, uv = 0.0f;
        for (int z = 0; z < S; ++z) {
            gv += part[z * total + c];
            uv += part[z * total + c + 64];
        }
        out16[idx] = f32_to_bf16(silu_mul_f(gv, uv));
    }
}

// ---------------------------------------------------------------------- the Hopper form: wgmma (sm_90a)
// gemm_q4wg{z,m}_s{S}: the same product, layout and ring as gemm_q4{z,m}_m8 (128 tokens x 128 columns a block,
// K in 64-wide stages filled by StageLoader<8>), multiplied by the warpgroup's asynchronous
// wgmma.mma_async.m64n128k16 instead of mma.sync (on the H200 the m8 kernel stalls at ~300-350 TFLOP/s of
// mma.sync, 2 blocks an SM; cuBLAS's wgmma reaches 350-490 on the dequantized weights). The roles swap:
// out^T = W x^T, the weights are wgmma's A from registers (the dequantized fragments: per warp exactly mma.sync's
// m16n8k16 A layout) and x is B from shared memory, K-major: the ring's 128-byte x rows with their 16-byte chunks
// XOR-swizzled by row % 8 are wgmma's 128-byte swizzle as they stand (the stages are 1024-byte aligned; a k16 step
// is +32 bytes on the descriptor's start address; 8-row groups 1024 bytes apart).
// Rows of A: warp w's rows of m64 tile j are the block's columns 32 w + 16 j + (0..15), so a lane's 16 bytes of
// n-block w (words 2j, 2j + 1: the n8 tiles of rows g and g + 8) are its whole A fragment of both tiles.
// Per stage two halves (k32 sub-blocks kb), each: dequantize 4 fragments, fence, 4 wgmma, commit; the next half's
// fragments are decoded while the previous half multiplies (wait_group 1 before a half's registers are
// rewritten). The ring's loads run STAGES - 2 ahead, so the stage they overwrite has no wgmma in flight.
// gemm_q4wg{z,m}_s{S}: K split over a cluster of S blocks (wg_cluster_store below: no partials in global memory,
// no gemm_q4_reduce). sm_90a only (wgmma): other targets compile empty bodies, never launched (cuda_q4gemm).
#define GQW_STAGES 4

struct GemmQ4WgSmem {  // GemmQ4Smem<8>'s stages: x first (16 KB a stage, so 1024-byte aligned from an aligned base)
    uint4 a[GQW_STAGES][16 * 8 * 8];
    uint4 b[GQW_STAGES][256];
    uint4 s[GQW_STAGES][64];
};

// The wgmma GEMMs' split-K epilogue over a thread-block cluster. K is split over the S blocks of a cluster
// (__cluster_dims__(1, 1, S): the slices of one 128 x 128 output tile); each block leaves its f32 partial in its own
// shared memory (the ring's space, no longer needed), [token][column] with rows of WG_RED_LD floats; after a
// cluster barrier block `rank` sums the token rows rank, rank + S, ... of all S partials in rank order (distributed
// shared memory, 16 bytes a load: deterministic) and writes them with bias / accumulate. No partials in global
// memory, no reduce launch.
static_assert(sizeof(GemmQ4WgSmem) >= 128 * WG_RED_LD * 4, "the partial reuses the ring's space");

#ifdef LLMRS_WGMMA
// the wgmma kernels' ring in dynamic shared memory, from the first 1024-byte boundary (the 128-byte swizzle's atoms;
// the host asks 1 KB more than the struct)
template <typename Smem>
__device__ __forceinline__ Smem& wg_smem(uint4* dyn) {
    const unsigned pad = (1024u - (smem_u32(dyn) & 1023u)) & 1023u;
    return *reinterpret_cast<Smem*>(reinterpret_cast<char*>(dyn) + pad);
}

// the block's J m64nN accumulator tiles (NA = N / 2 floats a thread each: gemm_q4wg's two m64n128, gemm_q4w2's one
// m64n256) into red: D row 16 warp + g + 8 h of tile j is block column col(j, h, g), D column 8 i + 2 t + e is token
// 8 i + 2 t + e
template <int J, int NA, typename Col>
__device__ __forceinline__ void wg_partial_to_smem(const float (&acc)[J][NA], float* red, Col col) {
    const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < J; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            const int c = col(j, h, g);
#pragma unroll
            for (int i = 0; i < NA / 4; ++i)
#pragma unroll
                for (int e = 0; e < 2; ++e) red[(8 * i + 2 * t + e) * WG_RED_LD + c] = acc[j][4 * i + 2 * h + e];
        }
}

// the cluster's sum of the partials for this block's ROWS token rows (WARPS warps), written to
// out[m0 + row, n0 + column]
template <int S, int ROWS = 128, int WARPS = 4>
__device__ __forceinline__ void wg_cluster_store(const float* red, const float* __restrict__ bias,
                                                 float* __restrict__ out, int m0, int n0, int T, int N,
                                                 int accumulate) {
    cluster_sync();  // every block's partial is written and visible across the cluster
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, q = lane * 4, n = n0 + q;
    const int rank = (int)cluster_rank();
    const float4 b4 = bias != nullptr && n < N ? *reinterpret_cast<const float4*>(bias + n)
                                                : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int c = rank + S * warp; c < ROWS; c += S * WARPS) {  // a warp a row at a time, a lane 4 columns
        const int m = m0 + c;
        float4 v = ld_cluster4(red + c * WG_RED_LD + q, 0);
#pragma unroll
        for (int s = 1; s < S; ++s) {
            const float4 p = ld_cluster4(red + c * WG_RED_LD + q, s);
            v.x += p.x;
            v.y += p.y;
            v.z += p.z;
            v.w += p.w;
        }
        if (m < T && n < N) {
            v.x += b4.x;
            v.y += b4.y;
            v.z += b4.z;
            v.w += b4.w;
            float4* dst = reinterpret_cast<float4*>(out + (size_t)m * N + n);
            if (accumulate) {
                const float4 o = *dst;
                v.x = o.x + v.x;
                v.y = o.y + v.y;
                v.z = o.z + v.z;
                v.w = o.w + v.w;
            }
            *dst = v;
        }
    }
    cluster_sync();  // no block leaves (its shared memory) while another may still read it
}

// wg_cluster_store's sums for the SiLU form: the same partials in rank order + 0 (no bias: the same bits as the plain
// form's f32 output), but a lane takes the gate columns 2 lane, 2 lane + 1 of its token row and their up columns
// (+ 64), and writes SiLU x up as bf16 words to out16 [T, N / 2] (silu_mul_bf16's values)
template <int S, int ROWS, int WARPS>
__device__ __forceinline__ void wg_cluster_store_silu(const float* red, bf16_t* __restrict__ out16, int m0, int nblk,
                                                      int T, int N) {
    cluster_sync();  // every block's partial is written and visible across the cluster
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, rank = (int)cluster_rank(), p = 2 * lane;
    for (int c = rank + S * warp; c < ROWS; c += S * WARPS) {
        const int m = m0 + c;
        float2 g = ld_cluster2(red + c * WG_RED_LD + p, 0), u = ld_cluster2(red + c * WG_RED_LD + 64 + p, 0);
#pragma unroll
        for (int s = 1; s < S; ++s) {
            const float2 pg = ld_cluster2(red + c * WG_RED_LD + p, s);
            const float2 pu = ld_cluster2(red + c * WG_RED_LD + 64 + p, s);
            g.x += pg.x;
            g.y += pg.y;
            u.x += pu.x;
            u.y += pu.y;
        }
        if (m < T) {  // + 0.0f: the plain form's bias-less output (-0 sums become +0 the same way)
            *reinterpret_cast<unsigned*>(out16 + (size_t)m * (N >> 1) + nblk * 64 + p) =
                bf16x2(silu_mul_f(g.x + 0.0f, u.x + 0.0f), silu_mul_f(g.y + 0.0f, u.y + 0.0f));
        }
    }
    cluster_sync();  // no block leaves (its shared memory) while another may still read it
}
#endif

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define WG_CLUSTER(S) __cluster_dims__(1, 1, S)
#else
#define WG_CLUSTER(S)
#endif

#ifdef LLMRS_WGMMA
// The 4-bit wgmma kernels' main loop over their nk k64 stages (gemm_q4wg, gemm_q4w2): the ring's loads run
// STAGES - 2 ahead (the slot they overwrite has no wgmma in flight), each stage is two half stages whose fragments
// are decoded while the previous half multiplies (`half(st, kb)`: decode, fence, wgmma, commit; `fence_acc()`
// pins the accumulators). The loop and its final wait sit inside one branch: where a slice is empty (nk 0) the
// zeros reach the epilogue without joining a path whose wgmma are still in flight (ptxas serializes every wgmma
// of a kernel where a non-wgmma instruction may define their accumulators mid-pipeline: C7515, flagged by
// `llmrs ptx-check --arch sm_90a`). On return the ring is free for the partial.
template <typename Smem, int STAGES, typename Loader, typename Half, typename FenceAcc>
__device__ __forceinline__ void wg_q4_mainloop(Loader& ld, int nk, Half half, FenceAcc fence_acc) {
    constexpr int AHEAD = STAGES - 2;
    static_assert(AHEAD >= 1, "a stage in flight while one is used, and one whose wgmma may still run");
#pragma unroll
    for (int s = 0; s < AHEAD; ++s) {
        if (s < nk) ld.template load<Smem>(s);
        cp_async_commit();
    }
    int st_use = 0, st_load = AHEAD;
    if (nk > 0) {
        for (int it = 0; it < nk; ++it) {
            cp_async_wait<AHEAD - 1>();                                   // stage `it` has landed (this thread) ...
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // ... visible to wgmma's async proxy ...
            __syncthreads();  // ... for every thread; and no wgmma of stage it - AHEAD (the slot loaded next) runs
            if (it + AHEAD < nk) ld.template load<Smem>(st_load);
            cp_async_commit();
            fence_acc();
            wg_wait<1>();  // the previous stage's first half is done: its fragment registers are free
            half(st_use, 0);
            wg_wait<1>();  // the previous stage's second half is done
            half(st_use, 1);
            st_use = st_use + 1 == STAGES ? 0 : st_use + 1;
            st_load = st_load + 1 == STAGES ? 0 : st_load + 1;
        }
        wg_wait<0>();
    }
    fence_acc();
    cp_async_wait<0>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // wgmma's reads of the ring before its reuse
    __syncthreads();  // every warp is done with the ring: its space takes the partial
}

// One half stage (k32 sub-block kb of stage st): warp `warp`'s A fragments of both m64 tiles for its two k16 steps
// (A[ks * 2 + j]), then their four wgmma against the stage's x.
template <int MODE>
__device__ __forceinline__ void wg_half(const GemmQ4WgSmem& sm, int st, int kb, int warp, int lane,
                                        float (&acc)[2][64], unsigned (&A)[4][4]) {
    const unsigned* S = reinterpret_cast<const unsigned*>(sm.s[st]);
    const uint4 q = sm.b[st][(warp * 2 + kb) * 32 + lane];
    const unsigned wq[4] = {q.x, q.y, q.z, q.w};
    float sc[4], c12[4], c16[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
        frag_consts<MODE>(S[kb * GQ_BN + warp * 32 + 8 * i + (lane >> 2)], sc[i], c12[i], c16[i]);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        frag_b<MODE, 0>(wq[2 * j], sc[2 * j], c12[2 * j], c16[2 * j], A[j][0], A[j][2]);
        frag_b<MODE, 0>(wq[2 * j + 1], sc[2 * j + 1], c12[2 * j + 1], c16[2 * j + 1], A[j][1], A[j][3]);
        frag_b<MODE, 1>(wq[2 * j], sc[2 * j], c12[2 * j], c16[2 * j], A[2 + j][0], A[2 + j][2]);
        frag_b<MODE, 1>(wq[2 * j + 1], sc[2 * j + 1], c12[2 * j + 1], c16[2 * j + 1], A[2 + j][1], A[2 + j][3]);
    }
    const unsigned x0 = smem_u32(sm.a[st]) + 64u * kb;  // k16 step ks of this half: + 32 ks bytes
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < 2; ++ks)
#pragma unroll
        for (int j = 0; j < 2; ++j) wgmma_m64n128(acc[j], A[ks * 2 + j], wg_desc(x0 + 32u * ks));
    wg_commit();
}
#endif

template <int MODE, int S, int EPI = 0>
__device__ __forceinline__ void gemm_q4wg_impl(const uint4* __restrict__ Bq, const uint4* __restrict__ SZ,
                                               const uint4* __restrict__ X, const float* __restrict__ bias,
                                               float* __restrict__ out, int T, int N, int K, int G, int accumulate,
                                               int kt_per_split, bf16_t* __restrict__ out16 = nullptr) {
#ifdef LLMRS_WGMMA
    pdl_enter();
    extern __shared__ uint4 gq_smem[];  // GemmQ4WgSmem + 1 KB
    GemmQ4WgSmem& sm = wg_smem<GemmQ4WgSmem>(gq_smem);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int nblk = blockIdx.x, m0 = blockIdx.y * 128;
    const int kt0 = (int)cluster_rank() * kt_per_split, nk = max(0, min((K >> 6) - kt0, kt_per_split));

    float acc[2][64];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 64; ++e) acc[j][e] = 0.0f;
    unsigned A0[4][4], A1[4][4];

    StageLoader<8> ld;
    ld.init(sm, Bq, SZ, X, T, N, K, G, m0, wg_pair_nb0<EPI>(nblk), kt0, wg_pair_hi<EPI>(N));
    wg_q4_mainloop<GemmQ4WgSmem, GQW_STAGES>(
        ld, nk, [&](int st, int kb) { wg_half<MODE>(sm, st, kb, warp, lane, acc, kb ? A1 : A0); },
        [&] {
            wg_fence_acc(acc[0]);
            wg_fence_acc(acc[1]);
        });
    float* red = reinterpret_cast<float*>(&sm);
    wg_partial_to_smem(acc, red, [warp](int j, int h, int g) { return 32 * warp + 16 * j + 8 * h + g; });
    if (EPI)
        wg_cluster_store_silu<S, 128, 4>(red, out16, m0, nblk, T, N);
    else
        wg_cluster_store<S>(red, bias, out, m0, nblk * GQ_BN, T, N, accumulate);
#endif
}

// the 4-bit wgmma forms' entry points gemm_q4<FORM><KIND>_s<S> (FORM wg / w2: gemm_q4<FORM>_impl, THREADS threads,
// MINB blocks an SM; KIND z / m: the zero-point or min MODE; S: the cluster's K slices)
#define GEMM_Q4_WGMMA(FORM, THREADS, MINB, KIND, MODE, S)                                                         \
    extern "C" __global__ void __launch_bounds__(THREADS, MINB) WG_CLUSTER(S) gemm_q4##FORM##KIND##_s##S(          \
        const uint4* __restrict__ Bq, const uint4* __restrict__ SZ, const uint4* __restrict__ X,                  \
        const float* __restrict__ bias, float* __restrict__ out, int T, int N, int K, int G, int accumulate,       \
        int kt_per_split) {                                                                                       \
        gemm_q4##FORM##_impl<MODE, S>(Bq, SZ, X, bias, out, T, N, K, G, accumulate, kt_per_split);                \
    }
#define GEMM_Q4WG(KIND, MODE, S) GEMM_Q4_WGMMA(wg, GQ_THREADS, 2, KIND, MODE, S)
GEMM_Q4WG(z, 0, 1)
GEMM_Q4WG(z, 0, 2)
GEMM_Q4WG(z, 0, 3)
GEMM_Q4WG(z, 0, 4)
GEMM_Q4WG(m, 1, 1)
GEMM_Q4WG(m, 1, 2)
GEMM_Q4WG(m, 1, 3)
GEMM_Q4WG(m, 1, 4)

// gemm_q4w2{z,m}_s{S}: the wgmma form with 256 tokens a block, for steps of more than one 128-token tile. gemm_q4wg
// decodes each weight once per 128 tokens in the warpgroup that multiplies it, and ptx-check --sass counts ~408
// instructions a thread a k64 stage for its 8 m64n128k16 wgmma (64 weights decoded a thread: ~2 / 3 of them); at
// 256 tokens its two token tiles decode every weight twice (the H200: 39-42% of the FLOP roof for a 7B's gate_up /
// down in the 256-sequence step). Here a block is two warpgroups over 128 columns x 256 tokens: warpgroup wg owns
// columns 64 wg .. 64 wg + 63 as one m64 tile and multiplies it by all 256 tokens (m64n256k16, 128 accumulators a
// thread as before), so a thread decodes 32 weights a stage for the same 4 x 262k multiply-adds, and both
// warpgroups read one x tile (a stage: 32 KB of x, 4 KB of codes, 1 KB of scales; Q2_STAGES of them, one block an
// SM). The loader, layout, decode, main loop and cluster split-K epilogue are gemm_q4wg's. Where the host takes
// it: cuda_q4gemm.w2_takes (129-256 and 425-512 tokens; LLMRS_Q4_WGMMA_T256=0 turns it off), its figures there.
#define Q2_THREADS 256
#define Q2_STAGES 5

struct GemmQ4W2Smem {  // GemmQ4Smem<16>'s stages: x first (32 KB a stage, 1024-byte aligned from an aligned base)
    uint4 a[Q2_STAGES][16 * 16 * 8];
    uint4 b[Q2_STAGES][256];
    uint4 s[Q2_STAGES][64];
};
static_assert(sizeof(GemmQ4W2Smem) >= 256 * WG_RED_LD * 4, "the partial reuses the ring's space");

#ifdef LLMRS_WGMMA
// One half stage (k32 sub-block kb of stage st) for warp w of warpgroup wg: its A fragments of the warpgroup's m64
// tile (block columns 64 wg + 16 w + (0..15): n-block 2 wg + w / 2, words 2 j and 2 j + 1 with j = w % 2, as
// gemm_q4wg's warp w / 2 holds them for its tile j; one 8-byte load) for the half's two k16 steps, then their two
// wgmma. (Measured by ptx-check, not kept: the scale constants made once a stage where G >= 64 put a branch in the
// pipeline and ptxas serialized the wgmma.)
template <int MODE>
__device__ __forceinline__ void w2_half(const GemmQ4W2Smem& sm, int st, int kb, int wg, int w, int lane,
                                        float (&acc)[128], unsigned (&A)[2][4]) {
    const unsigned* S = reinterpret_cast<const unsigned*>(sm.s[st]);
    const int nbl = 2 * wg + (w >> 1), j = w & 1, g = lane >> 2;
    const uint2 q = reinterpret_cast<const uint2*>(&sm.b[st][(nbl * 2 + kb) * 32 + lane])[j];
    const unsigned w0 = q.x, w1 = q.y;  // rows g, g + 8 of the warp's m16 slice
    float s0, c12_0, c16_0, s1, c12_1, c16_1;
    frag_consts<MODE>(S[kb * GQ_BN + 32 * nbl + 16 * j + g], s0, c12_0, c16_0);
    frag_consts<MODE>(S[kb * GQ_BN + 32 * nbl + 16 * j + 8 + g], s1, c12_1, c16_1);
    frag_b<MODE, 0>(w0, s0, c12_0, c16_0, A[0][0], A[0][2]);
    frag_b<MODE, 0>(w1, s1, c12_1, c16_1, A[0][1], A[0][3]);
    frag_b<MODE, 1>(w0, s0, c12_0, c16_0, A[1][0], A[1][2]);
    frag_b<MODE, 1>(w1, s1, c12_1, c16_1, A[1][1], A[1][3]);
    const unsigned x0 = smem_u32(sm.a[st]) + 64u * kb;  // k16 step ks of this half: + 32 ks bytes
    wg_fence();
#pragma unroll
    for (int ks = 0; ks < 2; ++ks) wgmma_m64n256(acc, A[ks], wg_desc(x0 + 32u * ks));
    wg_commit();
}
#endif

template <int MODE, int S, int EPI = 0>
__device__ __forceinline__ void gemm_q4w2_impl(const uint4* __restrict__ Bq, const uint4* __restrict__ SZ,
                                               const uint4* __restrict__ X, const float* __restrict__ bias,
                                               float* __restrict__ out, int T, int N, int K, int G, int accumulate,
                                               int kt_per_split, bf16_t* __restrict__ out16 = nullptr) {
#ifdef LLMRS_WGMMA
    pdl_enter();
    extern __shared__ uint4 gq_smem[];  // GemmQ4W2Smem + 1 KB
    GemmQ4W2Smem& sm = wg_smem<GemmQ4W2Smem>(gq_smem);
    const int tid = threadIdx.x, lane = tid & 31, wg = tid >> 7, w = (tid >> 5) & 3;
    const int nblk = blockIdx.x, m0 = blockIdx.y * 256;
    const int kt0 = (int)cluster_rank() * kt_per_split, nk = max(0, min((K >> 6) - kt0, kt_per_split));

    float acc[1][128];  // one m64n256 tile
#pragma unroll
    for (int e = 0; e < 128; ++e) acc[0][e] = 0.0f;
    unsigned A0[2][4], A1[2][4];

    StageLoader<16, Q2_THREADS> ld;
    ld.init(sm, Bq, SZ, X, T, N, K, G, m0, wg_pair_nb0<EPI>(nblk), kt0, wg_pair_hi<EPI>(N));
    wg_q4_mainloop<GemmQ4W2Smem, Q2_STAGES>(
        ld, nk, [&](int st, int kb) { w2_half<MODE>(sm, st, kb, wg, w, lane, acc[0], kb ? A1 : A0); },
        [&] { wg_fence_acc(acc[0]); });
    float* red = reinterpret_cast<float*>(&sm);
    wg_partial_to_smem(acc, red, [wg, w](int, int h, int g) { return 64 * wg + 16 * w + 8 * h + g; });
    if (EPI)
        wg_cluster_store_silu<S, 256, Q2_THREADS / 32>(red, out16, m0, nblk, T, N);
    else
        wg_cluster_store<S, 256, Q2_THREADS / 32>(red, bias, out, m0, nblk * GQ_BN, T, N, accumulate);
#endif
}

#define GEMM_Q4W2(KIND, MODE, S) GEMM_Q4_WGMMA(w2, Q2_THREADS, 1, KIND, MODE, S)
GEMM_Q4W2(z, 0, 1)
GEMM_Q4W2(z, 0, 2)
GEMM_Q4W2(z, 0, 3)
GEMM_Q4W2(z, 0, 4)
GEMM_Q4W2(m, 1, 1)
GEMM_Q4W2(m, 1, 2)
GEMM_Q4W2(m, 1, 3)
GEMM_Q4W2(m, 1, 4)

// the paired wgmma forms gemm_q4<FORM><KIND>_silu_s<S> (wg_cluster_store_silu; where the host takes them:
// cuda_q4gemm.gemm_silu_takes): gate_up -> SiLU x up as bf16 words [T, N / 2], down's GEMM input. (A RoPE + KV-write
// form, pair_rope_out in this epilogue, gave rope_write_kv's bits but lost inside the graphed step: its sine and
// cosine once per head, not once per token; reports/h200-qwen2.5/session24.)
#define GEMM_Q4_WGMMA_SILU(FORM, THREADS, MINB, KIND, MODE, S)                                                    \
    extern "C" __global__ void __launch_bounds__(THREADS, MINB) WG_CLUSTER(S) gemm_q4##FORM##KIND##_silu_s##S(     \
        const uint4* __restrict__ Bq, const uint4* __restrict__ SZ, const uint4* __restrict__ X,                  \
        bf16_t* __restrict__ out, int T, int N, int K, int G, int kt_per_split) {                                 \
        gemm_q4##FORM##_impl<MODE, S, GV_EPI_SILU>(Bq, SZ, X, nullptr, nullptr, T, N, K, G, 0, kt_per_split, out); \
    }
#define GEMM_Q4_PAIRS(FORM, THREADS, MINB, KIND, MODE)                                                            \
    GEMM_Q4_WGMMA_SILU(FORM, THREADS, MINB, KIND, MODE, 1)                                                        \
    GEMM_Q4_WGMMA_SILU(FORM, THREADS, MINB, KIND, MODE, 2)                                                        \
    GEMM_Q4_WGMMA_SILU(FORM, THREADS, MINB, KIND, MODE, 3)                                                        \
    GEMM_Q4_WGMMA_SILU(FORM, THREADS, MINB, KIND, MODE, 4)
GEMM_Q4_PAIRS(wg, GQ_THREADS, 2, z, 0)
GEMM_Q4_PAIRS(wg, GQ_THREADS, 2, m, 1)
GEMM_Q4_PAIRS(w2, Q2_THREADS, 1, z, 0)
GEMM_Q4_PAIRS(w2, Q2_THREADS, 1, m, 1)

// ---------------------------------------------------------------------- the bf16 wgmma GEMM (sm_90a)
// gemm_bf16wg_s{S}: out[T, N] (= or +=) x[T, K] @ W[N, K]^T (+ bias[N]), W and x bf16 (uint16 words), out f32: the
// bf16 linears whose output tiles alone leave the GPU half empty at a batched step's token counts (a 7B's qkv, o
// and down at 256 tokens: 72 / 56 / 56 tiles of 128 x 128 on 132 SMs; cuBLAS ran qkv and o at ~42% of the roof
// there, session 13). It lives here for the ring and wgmma helpers it shares with gemm_q4wg. A block is one
// warpgroup, 128 columns x 128 tokens: two m64n128k16 wgmma a k16 step, both operands from shared memory (K-major,
// 128-byte swizzle, the W rows as A: out^T = W x^T), K in 64-wide stages through a GBW_STAGES-deep cp.async ring
// (one stage multiplied while the next GBW_STAGES - 1 load; the multiply drains at each stage's end, which the
// second block of an SM covers). K is split over the S blocks of a thread-block cluster, their partials summed in
// distributed shared memory (wg_cluster_store, as gemm_q4wg's). sm_90a only; elsewhere empty bodies the host never
// launches.
#define GBW_STAGES 3

struct GemmBf16WgSmem {
    uint4 w[GBW_STAGES][1024];  // 128 columns x 64 k, 128 bytes a row, swizzled
    uint4 x[GBW_STAGES][1024];  // 128 tokens x 64 k
};
static_assert(sizeof(GemmBf16WgSmem) >= 128 * WG_RED_LD * 4, "the partial reuses the ring's space");

template <int S>
__device__ __forceinline__ void gemm_bf16wg_impl(const uint4* __restrict__ W, const uint4* __restrict__ X,
                                                 const float* __restrict__ bias, float* __restrict__ out, int T,
                                                 int N, int K, int accumulate, int kt_per_split) {
#ifdef LLMRS_WGMMA
    pdl_enter();
    constexpr int STAGES = GBW_STAGES, AHEAD = GBW_STAGES - 1;
    extern __shared__ uint4 gbw_smem[];  // GemmBf16WgSmem + 1 KB
    GemmBf16WgSmem& sm = wg_smem<GemmBf16WgSmem>(gbw_smem);
    const int tid = threadIdx.x, warp = tid >> 5;
    const int n0 = blockIdx.x * 128, m0 = blockIdx.y * 128;
    // the cluster spans grid.z: its rank is the K slice
    const int kt0 = (int)cluster_rank() * kt_per_split, nk = max(0, min((K >> 6) - kt0, kt_per_split));
    const int K8 = K >> 3;  // 16-byte chunks a row

    // a thread's share of a stage: chunk cc of rows r0 + 16 i (i < 8) of both tiles; (r0 + 16 i) % 8 == r0 % 8, so
    // every one of its chunks lands at the same swizzled offset in its row
    const int cc = tid & 7, r0 = tid >> 3;
    const unsigned sw = (unsigned)(r0 * 128 + ((cc ^ (r0 & 7)) << 4));
    auto load = [&](int st, int kt) {
        const unsigned wd = smem_u32(sm.w[st]) + sw, xd = smem_u32(sm.x[st]) + sw;
        const int k8 = kt * 8 + cc;
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            const int wr = n0 + r0 + 16 * i, xr = m0 + r0 + 16 * i;
            cp_async16(wd + i * 2048u, W + (size_t)(wr < N ? wr : 0) * K8 + k8, wr < N ? 16 : 0);
            cp_async16(xd + i * 2048u, X + (size_t)(xr < T ? xr : 0) * K8 + k8, xr < T ? 16 : 0);
        }
    };

    float acc[2][64];
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 64; ++e) acc[j][e] = 0.0f;
#pragma unroll
    for (int s = 0; s < AHEAD; ++s) {
        if (s < nk) load(s, kt0 + s);
        cp_async_commit();
    }
    int st_use = 0, st_load = AHEAD;
    for (int it = 0; it < nk; ++it) {
        cp_async_wait<AHEAD - 1>();                                   // stage `it` has landed (this thread) ...
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // ... visible to wgmma's async proxy ...
        __syncthreads();  // ... for every thread; and stage it - 1's wgmma (the slot loaded next) are done
        if (it + AHEAD < nk) load(st_load, kt0 + it + AHEAD);
        cp_async_commit();
        const unsigned wa = smem_u32(sm.w[st_use]), xa = smem_u32(sm.x[st_use]);
        wg_fence_acc(acc[0]);
        wg_fence_acc(acc[1]);
        wg_fence();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks)
#pragma unroll
            for (int j = 0; j < 2; ++j)  // m64 tile j: W rows 64 j .. 64 j + 63 of the block (8 KB further)
                wgmma_m64n128_ss(acc[j], wg_desc(wa + 8192u * j + 32u * ks), wg_desc(xa + 32u * ks));
        wg_commit();
        wg_wait<0>();
        wg_fence_acc(acc[0]);
        wg_fence_acc(acc[1]);
        st_use = st_use + 1 == STAGES ? 0 : st_use + 1;
        st_load = st_load + 1 == STAGES ? 0 : st_load + 1;
    }
    cp_async_wait<0>();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // wgmma's reads of the ring before its reuse
    __syncthreads();  // every warp is done with the ring: its space takes the partial

    float* red = reinterpret_cast<float*>(&sm);
    wg_partial_to_smem(acc, red, [warp](int j, int h, int g) { return 64 * j + 16 * warp + 8 * h + g; });
    wg_cluster_store<S>(red, bias, out, m0, n0, T, N, accumulate);
#endif
}

#define GEMM_BF16WG(S)                                                                                           \
    extern "C" __global__ void __launch_bounds__(128, 2) WG_CLUSTER(S) gemm_bf16wg_s##S(                        \
        const uint4* __restrict__ W, const uint4* __restrict__ X, const float* __restrict__ bias,                 \
        float* __restrict__ out, int T, int N, int K, int accumulate, int kt_per_split) {                         \
        gemm_bf16wg_impl<S>(W, X, bias, out, T, N, K, accumulate, kt_per_split);                                  \
    }
GEMM_BF16WG(1)
GEMM_BF16WG(2)
GEMM_BF16WG(3)
GEMM_BF16WG(4)

// ---------------------------------------------------------------------- dequantization from this layout
// dequant_marlin_bf16: W[n, k] as bf16 (uint32 pairs [N][K/2]) from the layout above, for cuBLAS above
// cuda_q4gemm.MAX_TOKENS where the backend keeps no row-major copy (dequant_q4_bf16 reads that one): frag_b's
// values, i.e. dequant_q4_bf16's (see the top: equal values, +0 where it has -0 for a zero weight of a negative
// scale; tests/test_gemv_q4_gpu.py). One thread a lane record (32 codes of 4 columns); of word i's column
// (n = 32 nb + 8 i + g) the lane holds the bf16 pairs at words t, t + 4, t + 8, t + 12 of the column's 64-byte
// run (k = 32 kb ..): a 4 x 4 transpose across the quad (lanes 4 g .. 4 g + 3, two shuffle rounds) hands lane t
// words 4 t .. 4 t + 3, one 16-byte store (the quad writes the run whole). Two records a thread per pass: 32 bytes
// of loads in flight. On the H200, the 7B's gate_up: 207 us a layer with 16 four-byte stores a record, 93 us so
// (77% of the roof; `llmrs profile --synthetic qwen2.5-7b-awq --batch 256`).
// Grid-stride over records; whole warps stay together (records % 32 == 0), as the shuffles need.
__device__ __forceinline__ void quad_transpose(unsigned (&v)[4], int t) {
    // round 1 (lane bit 0): within each 2 x 2 block, swap the off-diagonal element with lane ^ 1
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const bool b = t & 1;
        const unsigned send = b ? v[2 * j] : v[2 * j + 1];
        const unsigned recv = __shfl_xor_sync(0xffffffffu, send, 1);
        if (b) v[2 * j] = recv; else v[2 * j + 1] = recv;
    }
    // round 2 (lane bit 1): swap the off-diagonal 2 x 2 blocks with lane ^ 2
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const bool b = t & 2;
        const unsigned send = b ? v[j] : v[2 + j];
        const unsigned recv = __shfl_xor_sync(0xffffffffu, send, 2);
        if (b) v[j] = recv; else v[2 + j] = recv;
    }
}

template <int MODE>
__device__ __forceinline__ void dequant_marlin_record(uint4 q, long long idx, const unsigned* __restrict__ SZ,
                                                      uint4* __restrict__ out, int N, int K, int G, int KB) {
    const int lane = (int)(idx & 31), kb = (int)((idx >> 5) % KB), nb = (int)((idx >> 5) / KB);
    const int g = lane >> 2, t = lane & 3;
    const unsigned wq[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int n = nb * 32 + 8 * i + g;
        float s, c12, c16;
        frag_consts<MODE>(__ldg(SZ + (size_t)(32 * kb / G) * N + n), s, c12, c16);
        unsigned v[4];  // words t, t + 4, t + 8, t + 12 of the run: b0 / b1 of k16 steps 0 and 1
        frag_b<MODE, 0>(wq[i], s, c12, c16, v[0], v[1]);
        frag_b<MODE, 1>(wq[i], s, c12, c16, v[2], v[3]);
        quad_transpose(v, t);  // now words 4 t .. 4 t + 3
        out[((size_t)n * K + 32 * kb) / 8 + t] = make_uint4(v[0], v[1], v[2], v[3]);
    }
}

template <int MODE>
__device__ __forceinline__ void dequant_marlin_impl(const uint4* __restrict__ Bq, const unsigned* __restrict__ SZ,
                                                    uint4* __restrict__ out, int N, int K, int G) {
    const int KB = K >> 5;
    const long long records = (long long)(N >> 5) * KB * 32, stride = (long long)gridDim.x * blockDim.x;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < records; idx += 2 * stride) {
        const bool two = idx + stride < records;  // the same for the whole warp (records and stride % 32 == 0)
        const uint4 q0 = ldg_stream(Bq + idx), q1 = two ? ldg_stream(Bq + idx + stride) : make_uint4(0u, 0u, 0u, 0u);
        dequant_marlin_record<MODE>(q0, idx, SZ, out, N, K, G, KB);
        if (two) dequant_marlin_record<MODE>(q1, idx + stride, SZ, out, N, K, G, KB);
    }
}

extern "C" __global__ void dequant_marlin_q4z_bf16(const uint4* __restrict__ Bq, const unsigned* __restrict__ SZ,
                                                   uint4* __restrict__ out, int N, int K, int G) {
    dequant_marlin_impl<0>(Bq, SZ, out, N, K, G);
}
extern "C" __global__ void dequant_marlin_q4m_bf16(const uint4* __restrict__ Bq, const unsigned* __restrict__ SZ,
                                                   uint4* __restrict__ out, int N, int K, int G) {
    dequant_marlin_impl<1>(Bq, SZ, out, N, K, G);
}

// ---------------------------------------------------------------------- the decode GEMV over the same layout
// gemv_q4{z,m}: out[T, N] (= or +=) x[T, K] @ W^T (+ bias) for T <= 8 tokens (decode), x f32 (the matvec's
// input), W the Marlin layout above (no second copy read). Memory-bound: a warp owns one 32-column tile (nb) and
// a contiguous run of k32 blocks (kb), each one coalesced 512-byte load (16 bytes a lane), software-pipelined as
// matvec.cu is: the next GV_DEPTH loads go out before the current ones are used, the first ones before pdl_wait
// (weights are never written by a kernel: in a graph they stream while the previous kernel drains). No barrier
// until the warps of a block (one tile, K split over them) meet at the end. (Measured on the H200 against a
// cp.async ring of 8 stages a warp at 72 registers: slower, 2.79 vs 2.19 ms for a 7B's linears.)
//
// Tensor cores, the codes as the A operand (m16 = 16 of the tile's columns: rows g and g + 8 of the mma are the
// lane's words 2j and 2j + 1, i.e. columns 16 j + g and 16 j + 8 + g) and x as B (n8 = the tokens):
//   - one lop3 turns two codes into a bf16x2 of (128 + q): the nibbles at bits 0..3 and 16..19 of (w >> 4p),
//     p = 0..3, give the pairs (nibble p, nibble p + 4). mma only needs A and B to agree on which k each slot
//     holds, so the slots take those pairs as they come and x is packed to match: slot pair (2t, 2t + 1) of k16
//     step 0 holds k (2t, 16 + 2t), pair (2t + 8, 2t + 9) holds (2t + 1, 17 + 2t); step 1 the same plus 8 (k
//     relative to 32 kb; the Marlin k of nibble j at the top of this file).
//   - the codes enter raw (128 + q: exact in bf16), the scale and zero after the group's mma: per group
//     C = sum (128 + q) x and X = sum x (one more mma, ones against x, so X sums the same bf16 x), then
//       zero: acc += s (C - (128 + z) X) = sum (q - z) s x;   min: acc += s (C - 128 X) + m X = sum (q s + m) x.
//     The cancellation costs ~4 of the f32 accumulator's 24 bits; the weights are exact (not rounded to bf16),
//     x is rounded to bf16 as the GEMM paths round it. (tests/test_quant_marlin.py emulates this in numpy.)
//   Per 32 weights a lane: one 4-byte share of a load, 3 shifts + 4 lop3, 1 mma; per k32 block 2 ones mma and
//   x's B registers (4 float2 from L1, lanes of tokens < T only).
// K is split over the block's warps and over gridDim.y (S slices); the warps meet in shared memory in a fixed
// order; with S > 1 each block writes its f32 partial and the last block of the tile (a counter per tile, reset
// by that block) sums the S partials in slice order: deterministic, one launch. Launched as a cluster of the S
// slices (sm_90+, cuda_q4gemm.gemv_q4), the blocks push their partials into the first block's shared memory
// instead (st.async, completing on its mbarrier: no fence) and that block sums them: the same sums in the same
// order, without the round trips through L2.
// Instruction-bound more than DRAM-bound at one token (ncu on the H200, the 7B's gate_up: 56% of the scheduler
// slots issued, 33% of DRAM bandwidth, ~130 instructions a warp a k32 block). So a group's scale words are loaded
// once, a group ahead, and the group is followed by a counter, not a division and a modulo per k32 block (~106
// instructions: gate_up 35.9 -> 30.7 us, down at S = 4 23.8 -> 19.5, 110 registers; scripts/bench_gemv_q4.py),
// and its address is a pointer moved by a row of groups, not a 64-bit product a flush (29.8 / 18.9 us; 7B AWQ
// decode 2.761 -> 2.735 ms/token, two runs each; reports/h200-qwen2.5/session10 call12-13).
// Measured and not kept (same script): the warp's whole run prefetched into L2 at entry (slower: 40.0 us), 8 k32
// blocks in flight (168 registers at 3 blocks an SM: 33.0 us), 5 blocks an SM (96 registers, spills), and x's B
// registers plus each group's X made once a block in shared memory (no ones mma, one 16-byte shared load a k32
// block; two versions of the staging: 3.93 / 2.82 ms/token against 2.76, the staging's wait before any mma costs
// more than the instructions it saves); each warp's codes through a ring of 3 / 4 / 5 shared-memory stages of
// 2 KB filled by one cp.async.bulk each (TMA + mbarrier, no code registers: 96-117 registers; fifteenth session,
// commit 251c82f, reports/h200-qwen2.5/session15 call3): the 7B's four linears at one token 1.724 -> 1.934 /
// 1.822 / 2.054 ms for 28 layers (gate_up 29.3 -> 29.1 us at 4 stages, down 18.1 -> 20.6), at 4 tokens 1.774 ->
// 1.942 (4 stages): more bytes in flight a warp did not stream faster. A timing probe of x written by its
// producer as bf16 in this fragment order (one 16-byte load a lane a k32 block, no F2FP: the main loop 564 -> 511
// instructions, 128 -> 118 registers; session 23 call2) did not run faster either: gate_up 23.74 -> 26.61 us, down
// (S = 4) 15.30 -> 15.30, o 5.27 -> 5.48; with 5 blocks an SM (96 registers) no better. Nor did the rest of each
// warp's run asked of L2 by one cp.async.bulk.prefetch before pdl_wait (in the step: while the previous kernel
// runs; session 23 call4, decode bench one run a process x 2): 7B AWQ 1.872 / 1.876 -> 1.886 / 1.890 ms/token with
// it in matrices up to 32M weights (qkv, o), 2.121 / 2.125 in all; the bf16 matvec's rows the same way lost more.
// Nor did the RMSNorm before qkv / gate_up folded into the paired forms (x * g into B, each lane's x^2 summed beside
// its loads and met with the partials, 1 / rms in the epilogue; session 25, commit 6bea411): its 8 more f32 values
// a k32 block a lane broke the batches' load pipelining under the 128-register bound (a branch per k32 block
// first, then the code loads spread between the mma): best of 3 a process 7B AWQ 1.872 -> 2.267 ms/token, 3B AWQ
// 1.337 -> 1.526. The norms themselves cost ~5 us a layer of the step: leaving them out (scripts/ablate_decode.py,
// wrong outputs, timing only) with the head left out too, 7B AWQ 1.921 -> 1.765 ms/token, 7B bf16 3.854 -> 3.717
// (session 25). Left out alone they seemed to make the step slower (1.873 -> 2.004, as in session 17): the head and
// the sampler slow down on the degenerate logits of un-normalized states, so that row measured the sampler.
// Then (not yet run on a GPU; SASS read from `cuobjdump -sass` of the ptxas output): the loop's instructions
// came to ~97 a k32 block at G 128 executed, of which ~8 were moves of codes between registers (q = qn at the
// top of each batch: the predicated loads made the compiler keep old values), ~3 the flush's zeroing, the rest of
// the flush's bookkeeping duplicated per k32 block. Now the batches alternate between two sets of code registers
// (qa / qb, the loop unrolled twice, every load from a valid address: past its run a warp re-reads its first
// block), x and the codes come through running pointers, and where G / 32 (CPG) is known at compile time (the
// _c1 / _c4 entry points: G 32, 128) the flush sits at fixed k32 blocks, each group's first mma starts from 0 and
// the scale words alternate between two buffers: the loop's SASS is 585 instructions for 8 k32 blocks at G 128
// (~73 a block) against 617 for 4 before.
// GV_DEPTH and GV_MINB can be set with -D for such A/Bs (bench_gemv_q4.py --variants; `llmrs ptx-check -D`).
#define GV_WARPS 4
#define GV_CLUSTER_MAX 4  // K slices a cluster launch takes at most (cuda_q4gemm.GEMV_CLUSTER_MAX)
#ifndef GV_DEPTH
#define GV_DEPTH 4  // k32 blocks in flight a warp while the previous GV_DEPTH are used (registers)
#endif
#define GV_BF16_ONES 0x3F803F80u
// Ablations for timing probes only (wrong outputs; scripts/bench_gemv_q4.py --variants '-DGV_ABLATE_MATH;
// -DGV_ABLATE_LOADS'): what the GEMV's code stream alone takes, and its math alone, against both together.
//   GV_ABLATE_MATH: a k32 block's codes folded into one accumulator (no decode, no mma; ptxas drops x's loads);
//   GV_ABLATE_LOADS: the main loop's code words made from their addresses, not loaded (the first batch, the scale
//   words and x still are).
//   GV_ABLATE_X: x's B registers made from their addresses, not loaded (alone: the codes still stream; with
//   GV_ABLATE_LOADS: the decode and mma with neither stream).
//   GV_ABLATE_ONES: no ones mma for X (2 of a k32 block's 6 HMMA); GV_ABLATE_DECODE: the code words straight into
//   the mma (none of the decode's 7 shifts / lop3 a word). With GV_ABLATE_X GV_ABLATE_LOADS, they say which of the
//   tensor pipe and the integer pipe the GEMV's arithmetic waits on (reports/h200-qwen2.5/session36/NEXT.md).
// Session 36 (an H100; reports/h200-qwen2.5/session36/COMMANDS.md), the 7B's gate_up (S 1) / down (S 4), us: kernel
// 29.5 / 15.9, code stream alone 25.6 / 13.7, math alone 20.7 / 14.5, without x's loads 28.7 / 15.7, the decode and
// mma with neither stream 18.9 / 12.7. The H200 has the same SMs at 1.3x the bandwidth, so there the math alone
// bounds the GEMV: its floors are 16.8 / 8.4 us, and down's 14.8 us in the H200's step is its math. That math uses
// ~31% of the issue slots (not its instruction count: sessions 23 / 25's shorter loops did not run faster; a pipe's
// throughput or each warp's latency, reports/h200-qwen2.5/session36/NEXT.md).
// Measured and not kept (same call): the block's x staged once in shared memory (every thread's float4s, a barrier,
// the main loop's x from there): gate_up 29.5 -> 32.2 us, down 15.9 -> 18.3, 7B AWQ 2.1753 / 2.1759 -> 2.3623 /
// 2.3638 ms/token; x's round trips were ~1-3% of the kernel (GV_ABLATE_X), the staging's wait and barrier cost more.
// Fewer registers let more blocks share an SM (GV_ABLATE_MATH: 72 against 128, sm_90); GV_ABLATE_PAD=BYTES makes
// each plain-form block reserve that much more shared memory, to hold an ablation at the kernel's own 4 blocks an SM
// (39000 on sm_90: 5 blocks of 47.7 KB do not fit in 228 KB).
// the ablations' stand-in for loaded words: four words made from an address (no load; wrong values, by design)
__device__ __forceinline__ uint4 gv_fake_words(const void* p) {
    const unsigned a = (unsigned)(size_t)p;
    return make_uint4(a * 0x9E3779B9u, a ^ 0x5BD1E995u, a * 0x85EBCA6Bu, a + 0x27D4EB2Fu);
}
#ifdef GV_ABLATE_LOADS
#define GV_CODE_LOAD(p) gv_fake_words(p)
#else
#define GV_CODE_LOAD(p) ldg_stream(p)
#endif

__device__ __forceinline__ unsigned bf16x2_code(unsigned w) { return lop3_code<0x000F000Fu, 0x43004300u>(w); }
#ifdef GV_FP16
// GV_FP16 (opt-in, for A/Bs: bench_gemv_q4.py --variants -DGV_FP16): fp16 operands instead of bf16, so that a code
// word takes 1 shift + 4 lop3 instead of 3 + 4. fp16's 10-bit mantissa holds a nibble at bits 0..3 or 4..7 under the
// exponent of 1024: (w & 0x000F000F) | 0x64006400 = 1024 + q, (w & 0x00F000F0) | 0x64006400 = 1024 + 16 q. The
// second family's k slots (each k16 step's upper 8, the B register b1) take x / 16 (exact in fp16 but for
// subnormals), so every slot sums (offset + q) x: C = sum q x + 1024 (sum_lo x + sum_hi x / 16). The ones mma's rows g
// give that bracket (cx'), its rows g + 8 (16 in the hi slots) the true X: no more HMMA than bf16. x must fit fp16.
// Timed (session 37, H100, bench_gemv_q4.py, 7B): the decode + mma with no memory (GV_ABLATE_X GV_ABLATE_LOADS)
// gate_up (S 1) 18.81 -> 17.67 us, down (S 4) 12.72 -> 11.67; with the memory 29.10 -> 29.59 / 15.62 -> 15.01; 7B AWQ
// decode 2.1453 / 2.1451 -> 2.1307 / 2.1341 ms/token. Not a default: x rounded to fp16, not bf16, is off the bf16-x
// reference of tests/test_gemv_q4_gpu.py by 7.5e-4 (tolerance 2e-5; the two roundings differ by ~1e-3 in numpy),
// and the prefill GEMM rounds x to bf16. ptxas keeps `mul.hi.u32 w, 1 << 24` (= w >> 8) as an IMAD.HI on the FMA
// pipe: with it the loop's SHF drop from 32 to 0 (8 k32 blocks, sm_90); not timed.
template <unsigned MASK>
__device__ __forceinline__ unsigned f16x2_code(unsigned w) { return lop3_code<MASK, 0x64006400u>(w); }
__device__ __forceinline__ unsigned pack_f16x2(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
MMA_16816(mma_f16, "f16")
#define GV_MMA mma_f16
#define GV_MMA_ZC mma_f16_zc
#else
#define GV_MMA mma_bf16
#define GV_MMA_ZC mma_bf16_zc
#endif
// x's B registers of one kb for the lane's token (zeros for a lane whose token is >= T): step 0 b0, b1, step 1 b0, b1
__device__ __forceinline__ uint4 gemv_xb(const float* __restrict__ xr, bool live) {
    if (!live) return make_uint4(0u, 0u, 0u, 0u);
#ifdef GV_ABLATE_X
    return gv_fake_words(xr);  // timing probe: x's B registers made from their address (no x round trips)
#endif
    // x comes from the previous kernel: ldx2 (common.cuh's early-load rules; __ldg with -DLLMRS_NO_EARLY_LOADS)
    const float2 x0 = ldx2(xr), x1 = ldx2(xr + 8), x2 = ldx2(xr + 16), x3 = ldx2(xr + 24);
#ifdef GV_FP16  // (b1 of each k16 step: the slots of the codes' upper nibbles, x / 16)
    return make_uint4(pack_f16x2(x0.x, x2.x), pack_f16x2(0.0625f * x0.y, 0.0625f * x2.y), pack_f16x2(x1.x, x3.x),
                      pack_f16x2(0.0625f * x1.y, 0.0625f * x3.y));
#else
    return make_uint4(pack_bf16x2(x0.x, x2.x), pack_bf16x2(x0.y, x2.y), pack_bf16x2(x1.x, x3.x),
                      pack_bf16x2(x1.y, x3.y));
#endif
}

// one k32 block: two m16 tiles of codes (words 0, 1 and 2, 3) x two k16 steps against each n8 tile of tokens
// (xb[u]: tokens 8 u + g), and the ones mma for X of each
// first: the group's first k32 block, whose mma start c and cx from 0 (a constant after unrolling where the group
// size is: CPG), so the flush need not zero them
template <int NU>
__device__ __forceinline__ void gemv_kb(uint4 q, const uint4 (&xb)[NU], float (&c)[NU][2][4], float (&cx)[NU][4],
                                        bool first = false) {
#ifdef GV_ABLATE_MATH
    c[0][0][0] += __uint_as_float((q.x ^ q.y ^ q.z ^ q.w) & 0x007FFFFFu);  // timing probe: the loads kept, no math
    return;
#endif
    const unsigned wq[4] = {q.x, q.y, q.z, q.w};
#ifdef GV_FP16  // rows g: 1 (cx' = sum_lo x + sum_hi x / 16); rows g + 8: 1 and 16 in the hi slots (X = sum x)
    const unsigned ones[4] = {0x3C003C00u, 0x3C003C00u, 0x3C003C00u, 0x4C004C00u};
#else
    const unsigned ones[4] = {GV_BF16_ONES, GV_BF16_ONES, GV_BF16_ONES, GV_BF16_ONES};
#endif
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const unsigned lo = wq[2 * j], hi = wq[2 * j + 1];
#ifdef GV_ABLATE_DECODE
        // timing probe: the code words themselves as the mma's A (wrong values), no shifts or lop3: what the decode's
        // 7 instructions a word cost
        const unsigned a0[4] = {lo, hi, lo ^ hi, lo + hi}, a1[4] = {hi, lo, hi ^ 0x00010001u, lo ^ 0x00010001u};
#elif defined(GV_FP16)
        const unsigned lo8 = lo >> 8, hi8 = hi >> 8;
        const unsigned a0[4] = {f16x2_code<0x000F000Fu>(lo), f16x2_code<0x000F000Fu>(hi), f16x2_code<0x00F000F0u>(lo),
                                f16x2_code<0x00F000F0u>(hi)};
        const unsigned a1[4] = {f16x2_code<0x000F000Fu>(lo8), f16x2_code<0x000F000Fu>(hi8),
                                f16x2_code<0x00F000F0u>(lo8), f16x2_code<0x00F000F0u>(hi8)};
#else
        const unsigned a0[4] = {bf16x2_code(lo), bf16x2_code(hi), bf16x2_code(lo >> 4), bf16x2_code(hi >> 4)};
        const unsigned a1[4] = {bf16x2_code(lo >> 8), bf16x2_code(hi >> 8), bf16x2_code(lo >> 12),
                                bf16x2_code(hi >> 12)};
#endif
#pragma unroll
        for (int u = 0; u < NU; ++u) {
            if (first)
                GV_MMA_ZC(c[u][j], a0, xb[u].x, xb[u].y);
            else
                GV_MMA(c[u][j], a0, xb[u].x, xb[u].y);
            GV_MMA(c[u][j], a1, xb[u].z, xb[u].w);
        }
    }
#ifndef GV_ABLATE_ONES  // timing probe: without the ones mma for X (a third of the HMMA; X stays 0: wrong sums)
#pragma unroll
    for (int u = 0; u < NU; ++u) {
        if (first)
            GV_MMA_ZC(cx[u], ones, xb[u].x, xb[u].y);
        else
            GV_MMA(cx[u], ones, xb[u].x, xb[u].y);
        GV_MMA(cx[u], ones, xb[u].z, xb[u].w);
    }
#else
    (void)ones;
#endif
}

// the group's scale and zero (min) into acc; sw[2 j + r]: the scale word of column 16 j + 8 r + g; c[u][j][2 r + h]
// is (that column, token 8 u + 2 t + h), cx[u][h] = X of that token. ZERO: c and cx start over (else the next
// group's first mma overwrites them).
template <int MODE, int NU, bool ZERO = true>
__device__ __forceinline__ void gemv_flush(const unsigned (&sw)[4], float (&c)[NU][2][4], float (&cx)[NU][4],
                                           float (&acc)[NU][2][4]) {
#pragma unroll
    for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const unsigned w = sw[2 * j + r];
            const float s = gq_f16_to_f32((unsigned short)(w & 0xffffu)), z = gq_f16_to_f32((unsigned short)(w >> 16));
#pragma unroll
            for (int u = 0; u < NU; ++u)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    float& a = acc[u][j][2 * r + h];
#ifdef GV_FP16  // C - 1024 cx' = sum q x; X = cx[u][2 + h] (the ones mma's rows g + 8)
                    const float cq = fmaf(-1024.0f, cx[u][h], c[u][j][2 * r + h]);
                    if (MODE == 0)
                        a = fmaf(s, fmaf(-z, cx[u][2 + h], cq), a);
                    else
                        a = fmaf(s, cq, fmaf(z, cx[u][2 + h], a));
#else
                    if (MODE == 0)
                        a = fmaf(s, fmaf(-(128.0f + z), cx[u][h], c[u][j][2 * r + h]), a);
                    else
                        a = fmaf(s, fmaf(-128.0f, cx[u][h], c[u][j][2 * r + h]), fmaf(z, cx[u][h], a));
#endif
                    if (ZERO) c[u][j][2 * r + h] = 0.0f;
                }
        }
    if (ZERO) {
#pragma unroll
        for (int u = 0; u < NU; ++u)
#pragma unroll
            for (int e = 0; e < 4; ++e) cx[u][e] = 0.0f;
    }
}

// NU n8 tiles of tokens: T <= 8 NU. CPG: 0, the group's k32 blocks (G / 32) followed at run time by a counter;
// else G / 32 at compile time (the host's gemv_cpg: it divides GV_DEPTH, so with kpw a multiple of GV_DEPTH every
// batch holds whole groups): the flush sits at fixed k32 blocks and each group's first mma starts from 0.
// The paired forms (EPI): a block of 2 GV_WARPS warps takes two tiles whose columns pair up in an epilogue, each
// tile's warps exactly the plain form's (the same K runs, the same sums in the same order), so the pair's outputs
// are the plain kernel's bits and the epilogue is its follower's expression:
//   GV_EPI_SILU: gate_up [2I, K]; pair b = tiles (b, I / 32 + b); act[t, 32 b + lane] = silu(gate) * up (silu_mul's
//                silu_mul_f), into out [T, I];
//   GV_EPI_ROPE: qkv [(Hq + 2 Hkv) D, K] + bias; pair b of head h = b / (D / 64): tiles (h D / 32 + j, that + D /
//                64), j = b % (D / 64), columns h D + i and h D + i + D / 2 (i = 32 j + lane): q heads rotated in
//                out (= qkv), k heads rotated and v heads as they are into the paged caches (pair_rope_out,
//                rope_write_kv's math).
// NRM, the RMSNorm between two GEMVs carried by them (one n8 tile of tokens; cuda_q4gemm.q4_norm_chain says where):
//   GV_NORM_OUT (the plain forms of o and down, accumulating into the residual stream x): the epilogue also writes
//     xg = x * g (g: the next norm's weight) and each (token, 32-column tile)'s sum of x^2 (a warp's shuffle tree)
//     into ssp [T, N / 32];
//   GV_NORM_IN (the paired forms of gate_up and qkv, over x = xg): the block that finishes a tile sums the token's
//     K / 32 partials (lane-strided, then the shuffle tree: a fixed order) and scales both tiles' sums by 1 /
//     sqrt(mean(x^2) + eps) before the bias and the follower. rms_norm + the GEMV by linearity, with x * g rounded
//     to bf16 instead of g * (x / rms) (within bf16 rounding, not the same bits), and no norm kernel: the main loop
//     is the plain form's (an in-loop fold, x * g and the squares in the GEMV's loop, broke its load pipelining
//     under the 128-register bound and lost, session 25).
#define GV_NORM_OUT 1
#define GV_NORM_IN 2
struct GvNorm {
    const float* g;  // OUT: the next norm's weight
    float* xg;       // OUT: x * g [T, N]
    float* ssp;      // OUT: written [T, N / 32]; IN: read [T, K / 32]
    float eps;       // IN
};
struct GvRope {  // what the rope epilogue writes with (rope_write_kv's arguments)
    const int* positions;
    const float* inv_freq;
    const int* slots;
    bf16_t* k_cache;
    bf16_t* v_cache;
    int Hq, Hkv, D, block_size;
};

// the tile of a paired block's half `sel` (0: the pair's first, whose columns index the epilogue)
template <int EPI>
__device__ __forceinline__ int gv_pair_tile(int b, int sel, int N, int D) {
    if (EPI == GV_EPI_SILU) return b + sel * (N >> 6);
    const int tph = D >> 6;  // a half head's tiles
    return (b / tph) * 2 * tph + b % tph + sel * tph;
}

template <int MODE, int NU, int CPG, int EPI = 0, int NRM = 0>
__device__ __forceinline__ void gemv_q4_impl(const uint4* __restrict__ Bq, const unsigned* __restrict__ SZ,
                                             const float* __restrict__ x, const float* __restrict__ bias,
                                             float* __restrict__ out, float* __restrict__ part, int* __restrict__ sem,
                                             int T, int N, int K, int G, int accumulate, int kpw,
                                             const GvRope rp = GvRope{}, const GvNorm nm = GvNorm{}) {
    static_assert(CPG == 0 || GV_DEPTH % CPG == 0, "a fixed group size must divide GV_DEPTH (whole groups a batch)");
    static_assert(EPI == 0 || NU == 1, "the paired forms take one n8 tile of tokens");
    static_assert(NRM == 0 || (NU == 1 && (NRM == GV_NORM_IN) == (EPI != 0)), "norm out: plain forms; in: paired");
    pdl_trigger();
#ifdef GV_ABLATE_PAD
    __shared__ volatile char gv_pad[EPI ? 1 : GV_ABLATE_PAD];  // timing probes: occupancy held (above)
    if (threadIdx.x == 0) gv_pad[0] = 0;
#endif
    constexpr int TOK = 8 * NU;
    constexpr int NW = EPI ? 2 * GV_WARPS : GV_WARPS;  // warps a block: one tile's, or a pair's (EPI)
    __shared__ float red[NW][TOK][36];  // [warp][token][column] (36: conflict-free stores)
    // a cluster launch (the K slices' merge below): block 0's mbarrier for the slices' pushes, initialized before
    // every block arrives at the cluster barrier that the pushes wait on
    __shared__ __align__(8) unsigned long long cbar;
    const unsigned ncl = NU == 1 ? cluster_blocks() : 1;
    if (ncl > 1) {
        if (cluster_rank() == 0 && threadIdx.x == 0) mbar_init(&cbar, 1);
        cluster_arrive_relaxed();
    }
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
    const int wk = EPI ? warp % GV_WARPS : warp;  // the warp's K run among its tile's warps
    const int nb_a = EPI ? gv_pair_tile<EPI>(blockIdx.x, 0, N, rp.D) : blockIdx.x;
    const int nb_b = EPI ? gv_pair_tile<EPI>(blockIdx.x, 1, N, rp.D) : 0;
    const int nb = EPI && warp >= GV_WARPS ? nb_b : nb_a, KB = K >> 5, cpg = CPG ? CPG : G >> 5;
    const int kb_lo = min(KB, (blockIdx.y * GV_WARPS + wk) * kpw), kb_hi = min(KB, kb_lo + kpw);
    const uint4* wp = Bq + (size_t)nb * KB * 32 + lane;
    uint4 qa[GV_DEPTH], qb[GV_DEPTH];  // two batches' codes: one used while the other is loaded (no copies)
#pragma unroll
    for (int d = 0; d < GV_DEPTH; ++d) qa[d] = ldg_early(wp + (size_t)min(kb_lo + d, max(kb_hi - 1, 0)) * 32);
    pdl_wait_on(early_words(qa));  // x (and out, part) come from earlier kernels

    bool live[NU];
    const float* xr[NU];  // this batch's x of the lane's token (running pointers: no address product a block)
#pragma unroll
    for (int u = 0; u < NU; ++u) {
        live[u] = 8 * u + g < T;
        xr[u] = x + (size_t)(live[u] ? 8 * u + g : 0) * K + 2 * t + 32 * kb_lo;
    }
    const uint4* wn = wp + (size_t)(kb_lo + GV_DEPTH) * 32;  // the next batch's codes
    const unsigned* szc = SZ + nb * 32 + g;  // + group * N + 16 j + 8 r
    float c[NU][2][4], cx[NU][4], acc[NU][2][4];
#pragma unroll
    for (int u = 0; u < NU; ++u)
#pragma unroll
        for (int e = 0; e < 4; ++e) c[u][0][e] = c[u][1][e] = cx[u][e] = acc[u][0][e] = acc[u][1][e] = 0.0f;
    // the group's scale words (e = 2 j + r: column 16 j + 8 r + g) are loaded a group ahead (swn) and used at its
    // flush (swc); the group is followed by a counter (kin: k32 blocks of the group done), no division per block
    const int g_end = kb_hi > kb_lo ? (kb_hi - 1) / cpg + 1 : 0;
    int grp = kb_lo / cpg, kin = kb_lo - grp * cpg;
    // sw[0]: this group's words, sw[1]: the next group's; with CPG they alternate instead (group i in sw[i & 1],
    // i counted from the warp's first group: a constant in the unrolled loop) and no words are moved
    unsigned sw[2][4];
    const unsigned* sp = szc + (size_t)grp * N;  // then the words of the group after the next one
#pragma unroll
    for (int e = 0; e < 4; ++e) {
        sw[0][e] = grp < g_end ? __ldg(sp + 8 * e) : 0u;
        sw[1][e] = grp + 1 < g_end ? __ldg(sp + N + 8 * e) : 0u;
    }
    sp += 2 * (size_t)N;
    // one batch: GV_DEPTH k32 blocks from base, its codes in q; the next batch's codes go out into qn first (from a
    // valid address always, so no register keeps an old value: past the run a load re-reads the run's first block)
    auto batch = [&](const uint4 (&q)[GV_DEPTH], uint4 (&qn)[GV_DEPTH], const int base, const int half) {
        uint4 xb[GV_DEPTH][NU];
#pragma unroll
        for (int d = 0; d < GV_DEPTH; ++d)
#pragma unroll
            for (int u = 0; u < NU; ++u) xb[d][u] = gemv_xb(xr[u] + 32 * d, live[u] && base + d < kb_hi);
#pragma unroll
        for (int u = 0; u < NU; ++u) xr[u] += 32 * GV_DEPTH;
#pragma unroll
        for (int d = 0; d < GV_DEPTH; ++d) qn[d] = GV_CODE_LOAD(base + GV_DEPTH + d < kb_hi ? wn + 32 * d : wp);
        wn += 32 * GV_DEPTH;
#pragma unroll
        for (int d = 0; d < GV_DEPTH; ++d) {
            if (base + d < kb_hi) {
                gemv_kb<NU>(q[d], xb[d], c, cx, CPG && d % CPG == 0);
                if (CPG ? (d + 1) % CPG == 0 : ++kin == cpg || base + d + 1 == kb_hi) {
                    const int b = CPG ? (half * GV_DEPTH + d) / (CPG ? CPG : 1) & 1 : 0;
                    gemv_flush<MODE, NU, CPG == 0>(sw[b], c, cx, acc);
                    kin = 0;
                    ++grp;
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        if (!CPG) sw[0][e] = sw[1][e];
                        sw[CPG ? b : 1][e] = grp + 1 < g_end ? __ldg(sp + 8 * e) : 0u;
                    }
                    sp += N;
                }
            }
        }
    };
    for (int base = kb_lo; base < kb_hi; base += 2 * GV_DEPTH) {
        batch(qa, qb, base, 0);
        if (base + GV_DEPTH >= kb_hi) break;
        batch(qb, qa, base + GV_DEPTH, 1);
    }
    // GV_NORM_IN: warp m's lanes ask for token m's sums of squares now, so their round trip overlaps the reduction
    // below (the epilogue's threads of token m are warp m's: P == 1 in the paired forms)
    float ssl = 0.0f;
    if (NRM == GV_NORM_IN && warp < T) {
        const int nbk = K >> 5;
        for (int j = lane; j < nbk; j += 32) ssl += __ldcg(nm.ssp + (size_t)warp * nbk + j);
    }
    // lane (g, t): column 16 j + 8 r + g, token 8 u + 2 t + h in acc[u][j][2 r + h]
#pragma unroll
    for (int u = 0; u < NU; ++u)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
            for (int r = 0; r < 2; ++r)
#pragma unroll
                for (int h = 0; h < 2; ++h) red[warp][8 * u + 2 * t + h][16 * j + 8 * r + g] = acc[u][j][2 * r + h];
    __syncthreads();
    // (token, column) pairs a thread: tid + 32 NW p of the TOK x 32; with EPI the same pair of both tiles (v, vb)
    constexpr int P = TOK / NW;
    static_assert(P * NW == TOK, "whole (token, column) pairs a thread");
    float v[P], vb[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {
        const int m = (tid >> 5) + NW * p;
        v[p] = 0.0f;
#pragma unroll
        for (int w = 0; w < GV_WARPS; ++w) v[p] += red[w][m][lane];
        vb[p] = 0.0f;
        if (EPI) {
#pragma unroll
            for (int w = GV_WARPS; w < NW; ++w) vb[p] += red[w][m][lane];
        }
    }
    const int n = nb_a * 32 + lane, n_b = nb_b * 32 + lane;
    if (ncl > 1) {
        // a cluster launch (sm_90+, GV_CLUSTER_MAX slices at most, one n8 tile of tokens: the t16 forms stay on the
        // hand-off below, whose registers the path would cost spills): the cluster is the tile's S slices (rank =
        // blockIdx.y); each block pushes its sums into block 0's shared memory (st.async, completing on block 0's
        // mbarrier: no cluster barrier with release, whose MEMBAR.ALL.GPU cost the 7B AWQ ~18 us a step, session
        // 33), and block 0 adds them in slice order from 0, the global hand-off's order below: the same bits, no
        // round trips through L2 (store, fence, atomic, loads)
        __shared__ float cpart[GV_CLUSTER_MAX][EPI ? 2 : 1][TOK][32];
        const unsigned rank = cluster_rank();
        cluster_wait();  // block 0's mbarrier initialized (every block arrived at its start)
        if (rank == 0 && tid == 0) mbar_arrive_expect(&cbar, ncl * (unsigned)T * 32u * 4u * (EPI ? 2u : 1u));
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const int m = (tid >> 5) + NW * p;
            if (m < T) {
                st_async_cluster(&cpart[rank][0][m][lane], 0, v[p], &cbar);
                if (EPI) st_async_cluster(&cpart[rank][EPI ? 1 : 0][m][lane], 0, vb[p], &cbar);
            }
        }
        if (rank != 0) return;
        mbar_wait(&cbar, 0);  // every slice's sums in
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const int m = (tid >> 5) + NW * p;
            if (m < T) {
                v[p] = 0.0f;
                for (unsigned z = 0; z < ncl; ++z) v[p] += cpart[z][0][m][lane];
                if (EPI) {
                    vb[p] = 0.0f;
                    for (unsigned z = 0; z < ncl; ++z) vb[p] += cpart[z][EPI ? 1 : 0][m][lane];
                }
            }
        }
    } else if (gridDim.y > 1) {
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const int m = (tid >> 5) + NW * p;
            if (m < T) {
                part[((size_t)blockIdx.y * T + m) * N + n] = v[p];
                if (EPI) part[((size_t)blockIdx.y * T + m) * N + n_b] = vb[p];
            }
        }
        if (!block_counts_last(sem + blockIdx.x, (int)gridDim.y)) return;
#pragma unroll
        for (int p = 0; p < P; ++p) {
            const int m = (tid >> 5) + NW * p;
            if (m < T) {
                v[p] = 0.0f;
                for (int z = 0; z < (int)gridDim.y; ++z) v[p] += __ldcg(part + ((size_t)z * T + m) * N + n);
                if (EPI) {
                    vb[p] = 0.0f;
                    for (int z = 0; z < (int)gridDim.y; ++z) vb[p] += __ldcg(part + ((size_t)z * T + m) * N + n_b);
                }
            }
        }
    }
#pragma unroll
    for (int p = 0; p < P; ++p) {
        const int m = (tid >> 5) + NW * p;
        if (m < T) {
            if (NRM == GV_NORM_IN) {  // rms_norm's expression (rmsnorm.cu) from the token's partial sums
                const float inv = 1.0f / sqrtf(warp_sum(ssl) / (float)K + nm.eps);
                v[p] *= inv;
                vb[p] *= inv;
            }
            // the plain form's output expression (+ 0.0f without a bias: -0 sums become +0 the same way)
            const float o = v[p] + (bias ? bias[n] : 0.0f);
            if (EPI == GV_EPI_SILU) {
                out[(size_t)m * (N >> 1) + n] = silu_mul_f(o, vb[p] + (bias ? bias[n_b] : 0.0f));
            } else if (EPI == GV_EPI_ROPE) {
                const int half = rp.D >> 1;
                pair_rope_out(o, vb[p] + (bias ? bias[n_b] : 0.0f), n / rp.D, n % rp.D, half, m, out, N,
                              rp.positions, rp.inv_freq, rp.slots, rp.k_cache, rp.v_cache, rp.Hq, rp.Hkv, rp.D,
                              rp.block_size);
            } else {
                float* dst = out + (size_t)m * N + n;
                const float xn = accumulate ? *dst + o : o;
                *dst = xn;
                if (NRM == GV_NORM_OUT) {  // the warp's 32 columns of token m (m is the warp's)
                    nm.xg[(size_t)m * N + n] = xn * __ldg(nm.g + n);
                    const float q = warp_sum(xn * xn);
                    if (lane == 0) nm.ssp[(size_t)m * (N >> 5) + nb_a] = q;
                }
            }
        }
    }
}

#ifndef GV_MINB
#define GV_MINB 4
#endif
#define GEMV_Q4(NAME, MODE, NU, MINB, CPG)                                                                        \
    extern "C" __global__ void __launch_bounds__(32 * GV_WARPS, MINB)                                             \
        NAME(const uint4* __restrict__ Bq, const unsigned* __restrict__ SZ, const float* __restrict__ x,          \
             const float* __restrict__ bias, float* __restrict__ out, float* __restrict__ part,                   \
             int* __restrict__ sem, int T, int N, int K, int G, int accumulate, int kpw) {                        \
        gemv_q4_impl<MODE, NU, CPG>(Bq, SZ, x, bias, out, part, sem, T, N, K, G, accumulate, kpw);                \
    }
GEMV_Q4(gemv_q4z, 0, 1, GV_MINB, 0)
GEMV_Q4(gemv_q4m, 1, 1, GV_MINB, 0)
GEMV_Q4(gemv_q4z_t16, 0, 2, 3, 0)  // 9..16 tokens: two n8 tiles of tokens, every code decoded once for both
GEMV_Q4(gemv_q4m_t16, 1, 2, 3, 0)
GEMV_Q4(gemv_q4z_c4, 0, 1, GV_MINB, 4)  // group 128 (AWQ)
GEMV_Q4(gemv_q4m_c4, 1, 1, GV_MINB, 4)
GEMV_Q4(gemv_q4z_t16_c4, 0, 2, 3, 4)
GEMV_Q4(gemv_q4m_t16_c4, 1, 2, 3, 4)
GEMV_Q4(gemv_q4z_c1, 0, 1, GV_MINB, 1)  // group 32 (GGUF Q4_0, Q4_1)
GEMV_Q4(gemv_q4m_c1, 1, 1, GV_MINB, 1)
GEMV_Q4(gemv_q4z_t16_c1, 0, 2, 3, 1)
GEMV_Q4(gemv_q4m_t16_c1, 1, 2, 3, 1)
// GV_NORM_OUT: o / down writing the next norm's x * g and sums of squares too (up to 8 tokens, G 32 / 128)
#define GEMV_Q4_NOUT(NAME, MODE, CPG)                                                                             \
    extern "C" __global__ void __launch_bounds__(32 * GV_WARPS, GV_MINB)                                          \
        NAME(const uint4* __restrict__ Bq, const unsigned* __restrict__ SZ, const float* __restrict__ x,          \
             float* __restrict__ out, float* __restrict__ part, int* __restrict__ sem, int T, int N, int K, int G, \
             int accumulate, int kpw, const float* __restrict__ gn, float* __restrict__ xg,                      \
             float* __restrict__ ssp) {                                                                           \
        gemv_q4_impl<MODE, 1, CPG, 0, GV_NORM_OUT>(Bq, SZ, x, nullptr, out, part, sem, T, N, K, G, accumulate,    \
                                                   kpw, GvRope{}, GvNorm{gn, xg, ssp, 0.0f});                     \
    }
GEMV_Q4_NOUT(gemv_q4z_c4_nout, 0, 4)
GEMV_Q4_NOUT(gemv_q4m_c4_nout, 1, 4)
GEMV_Q4_NOUT(gemv_q4z_c1_nout, 0, 1)
GEMV_Q4_NOUT(gemv_q4m_c1_nout, 1, 1)

// the paired forms (up to 8 tokens, G 32 / 128): 2 GV_WARPS warps a block, half as many blocks an SM (the same
// registers a thread and warps an SM as the plain form)
#define GEMV_Q4_SILU(NAME, MODE, CPG)                                                                             \
    extern "C" __global__ void __launch_bounds__(64 * GV_WARPS, GV_MINB / 2)                                      \
        NAME(const uint4* __restrict__ Bq, const unsigned* __restrict__ SZ, const float* __restrict__ x,          \
             float* __restrict__ out, float* __restrict__ part, int* __restrict__ sem, int T, int N, int K, int G, \
             int kpw) {                                                                                           \
        gemv_q4_impl<MODE, 1, CPG, GV_EPI_SILU>(Bq, SZ, x, nullptr, out, part, sem, T, N, K, G, 0, kpw);          \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(64 * GV_WARPS, GV_MINB / 2)                                      \
        NAME##_nin(const uint4* __restrict__ Bq, const unsigned* __restrict__ SZ, const float* __restrict__ x,    \
                   float* __restrict__ out, float* __restrict__ part, int* __restrict__ sem, int T, int N, int K,  \
                   int G, int kpw, float* __restrict__ ssp, float eps) {                                          \
        gemv_q4_impl<MODE, 1, CPG, GV_EPI_SILU, GV_NORM_IN>(Bq, SZ, x, nullptr, out, part, sem, T, N, K, G, 0,    \
                                                            kpw, GvRope{}, GvNorm{nullptr, nullptr, ssp, eps});   \
    }
#define GEMV_Q4_ROPE(NAME, MODE, CPG)                                                                             \
    extern "C" __global__ void __launch_bounds__(64 * GV_WARPS, GV_MINB / 2)                                      \
        NAME(const uint4* __restrict__ Bq, const unsigned* __restrict__ SZ, const float* __restrict__ x,          \
             const float* __restrict__ bias, float* __restrict__ out, float* __restrict__ part,                   \
             int* __restrict__ sem, int T, int N, int K, int G, int kpw, const int* __restrict__ positions,       \
             const float* __restrict__ inv_freq, const int* __restrict__ slots, bf16_t* __restrict__ k_cache,     \
             bf16_t* __restrict__ v_cache, int Hq, int Hkv, int D, int block_size) {                              \
        gemv_q4_impl<MODE, 1, CPG, GV_EPI_ROPE>(Bq, SZ, x, bias, out, part, sem, T, N, K, G, 0, kpw,              \
                                                GvRope{positions, inv_freq, slots, k_cache, v_cache, Hq, Hkv, D,  \
                                                       block_size});                                              \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__(64 * GV_WARPS, GV_MINB / 2)                                      \
        NAME##_nin(const uint4* __restrict__ Bq, const unsigned* __restrict__ SZ, const float* __restrict__ x,    \
                   const float* __restrict__ bias, float* __restrict__ out, float* __restrict__ part,             \
                   int* __restrict__ sem, int T, int N, int K, int G, int kpw, const int* __restrict__ positions, \
                   const float* __restrict__ inv_freq, const int* __restrict__ slots,                             \
                   bf16_t* __restrict__ k_cache, bf16_t* __restrict__ v_cache, int Hq, int Hkv, int D,            \
                   int block_size, float* __restrict__ ssp, float eps) {                                          \
        gemv_q4_impl<MODE, 1, CPG, GV_EPI_ROPE, GV_NORM_IN>(                                                      \
            Bq, SZ, x, bias, out, part, sem, T, N, K, G, 0, kpw,                                                  \
            GvRope{positions, inv_freq, slots, k_cache, v_cache, Hq, Hkv, D, block_size},                         \
            GvNorm{nullptr, nullptr, ssp, eps});                                                                  \
    }
GEMV_Q4_SILU(gemv_q4z_silu_c4, 0, 4)
GEMV_Q4_SILU(gemv_q4m_silu_c4, 1, 4)
GEMV_Q4_SILU(gemv_q4z_silu_c1, 0, 1)
GEMV_Q4_SILU(gemv_q4m_silu_c1, 1, 1)
GEMV_Q4_ROPE(gemv_q4z_rope_c4, 0, 4)
GEMV_Q4_ROPE(gemv_q4m_rope_c4, 1, 4)
GEMV_Q4_ROPE(gemv_q4z_rope_c1, 0, 1)
GEMV_Q4_ROPE(gemv_q4m_rope_c1, 1, 1)
