// gemm_q4_wgmma.cu: the Hopper form of the 4-bit GEMM (wgmma, sm_90a): gemm_q4.cu's product
//   out[T, N] (= or +=) x[T, K] @ W[N, K]^T (+ bias[N]), x bf16, out f32, W in q4_marlin.cuh's layout,
// multiplied by the warpgroup's asynchronous wgmma.mma_async instead of mma.sync (on the H200 the mma.sync m8
// kernel stalls at ~300-350 TFLOP/s, 2 blocks an SM; cuBLAS's wgmma reaches 350-490 on the dequantized weights).
// Entry points: gemm_q4wg{z,m}_s{S} (one warpgroup, 128 columns x 128 tokens a block), gemm_q4w2{z,m}_s{S} (two
// warpgroups, 128 columns x 256 tokens), and their SiLU forms gemm_q4{wg,w2}{z,m}_silu_s{S}; S = 1..4 K slices
// over a thread-block cluster.
//
// gemm_q4wg: the same layout and ring as gemm_q4{z,m}_m8 (K in 64-wide stages filled by StageLoader<8>). The roles
// swap: out^T = W x^T, the weights are wgmma's A from registers (the dequantized fragments: per warp exactly
// mma.sync's m16n8k16 A layout) and x is B from shared memory, K-major: the ring's 128-byte x rows with their 16-byte
// chunks XOR-swizzled by row % 8 are wgmma's 128-byte swizzle as they stand (the stages are 1024-byte aligned; a
// k16 step is +32 bytes on the descriptor's start address; 8-row groups 1024 bytes apart).
// Rows of A: warp w's rows of m64 tile j are the block's columns 32 w + 16 j + (0..15), so a lane's 16 bytes of
// n-block w (words 2j, 2j + 1: the n8 tiles of rows g and g + 8) are its whole A fragment of both tiles.
// Per stage two halves (k32 sub-blocks kb), each: dequantize 4 fragments, fence, 4 wgmma, commit; the next half's
// fragments are decoded while the previous half multiplies (wait_group 1 before a half's registers are
// rewritten). The ring's loads run STAGES - 2 ahead, so the stage they overwrite has no wgmma in flight.
// K split over a cluster of S blocks (wg_cluster_store below: no partials in global memory, no gemm_q4_reduce).
// sm_90a only (wgmma): other targets compile empty bodies, never launched (cuda.quant_linear).
//
// Roof (H200, the 7B's gate_up in the 256-sequence step): gemm_q4w2 ~59% of the FLOP roof (bf16 cuBLAS ~84%);
// gemm_q4wg at 256 tokens 39-42% (it decodes every weight twice there).
// Registers / spills / serialized wgmma: `llmrs ptx-check llmrs/kernels_cu/gemm_q4_wgmma.cu --arch sm_90a`.
#include "common.cuh"
#include "q4_marlin.cuh"

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
// it: cuda.QuantLinearOps.w2_takes (129-256 and 425-512 tokens), its figures there.
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
// wgmma. (The scale constants are made every half, not once a stage where G >= 64: that branch in the pipeline
// makes ptxas serialize the wgmma.)
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
// cuda.QuantLinearOps.gemm_silu_takes): gate_up -> SiLU x up as bf16 words [T, N / 2], down's GEMM input. (No RoPE + KV-write
// form: in this epilogue it computes each sine and cosine once per head, not once per token, and measured slower
// inside the graphed step.)
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

