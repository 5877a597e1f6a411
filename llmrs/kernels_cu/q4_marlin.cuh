// q4_marlin.cuh: the Marlin-style 4-bit weight layout and the device pieces its kernels share (gemm_q4.cu,
// gemm_q4_wgmma.cu, gemv_q4.cu, dequant_marlin.cu): the m16n8k16 mma, the code decode, the scale constants and the
// cp.async stage loader of the GEMMs. Include after common.cuh.
//
// W[N, K] 4-bit with group size G along K: mode "zero" (AWQ, Q4_0 with z = 8) w = (q - z) * s, mode "min" (Q4_1)
// w = q * s + m. N % 32 == 0, K % 64 == 0, G % 32 == 0.
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
#pragma once

#define GQ_THREADS 128
#define GQ_BN 128  // output columns per block

// NAME: c += a b, NAME##_zc: c = a b (C = 0: the first mma of a sum, no zeroing of c before it); m16n8k16 with
// operands of type T, f32 accumulators
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
// memory to hold them, cuda.kernels.gemm_q4_smem_bytes)
#define WG_RED_LD 132

// One thread's share of filling a pipeline stage, its addresses computed once: each load() copies k tile kt0,
// kt0 + 1, ... (in order) into a stage and advances the global pointers by one tile (x: 8 chunks, codes: 2 k32
// blocks; shared-memory addresses as 32-bit offsets from stage 0); the scale row is k >> log2 G; the stages rotate
// by counters. No 64-bit products, divisions by G or `% STAGES` per stage, and every copy loop unrolls (its trip
// count is a constant): `llmrs ptx-check --sass` on sm_90 counts 437 instructions in gemm_q4z_m4's main loop.
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
        gshift = __ffs(G) - 1;  // G a power of two (cuda.quant_linear.supported)
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
