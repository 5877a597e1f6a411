// attention.cuh: the pieces the decode attention kernels share (attention.cu's attn_partial, attention_cluster.cu,
// attention_o.cu), one expression each so that every form keeps the same bits: the K / V row loads through the
// block table (the first keys before the PDL wait), the scaled query, the per-key online softmax with the
// reduce-scatter of the heads' dot products, and the block's merge of its warps. Include after common.cuh.
// Register arrays are indexed only by unrolled constants (no local memory; ptx-check pins it).
#pragma once

#define MAXG 8
// The online softmax's two exponentials per key and head (attn_key) are __expf (ex2.approx of x log2 e: 2
// instructions where expf is ~8; the per-key work is issue-bound, 8 warps on each of 32 SMs for the 7B).
// The online softmax's scalar state (running max m and sum l) and its per-key factors (corr, p): each lane keeps
// only its own head's, the head the reduce-scatter (warp_sum8_own / warp_sum4_own) leaves in its 32 / HG lanes
// (head lane / (32 / HG)), and the factors reach every lane's accumulators by two shuffles a head (not 32 copies of
// every head's).
#define ATTN_TABLE_STAGE 64  // block-table entries a split stages in shared memory (1,024 keys at block size 16)

// A lane's DPL bf16 values of a K or V row as raw bits (what one load returns), unpacked when used: the next
// key's rows wait in these while the current key is computed.
template <int DPL> struct Raw { typedef unsigned short T; };
template <> struct Raw<2> { typedef unsigned T; };
template <> struct Raw<4> { typedef uint2 T; };
template <> struct Raw<8> { typedef uint4 T; };

__device__ __forceinline__ void unpack_raw(unsigned short r, float* f) { f[0] = bf16_to_f32(r); }
__device__ __forceinline__ void unpack_raw(unsigned r, float* f) {
    f[0] = __uint_as_float(r << 16); f[1] = __uint_as_float(r & 0xffff0000u);
}
__device__ __forceinline__ void unpack_raw(uint2 r, float* f) {
    f[0] = __uint_as_float(r.x << 16); f[1] = __uint_as_float(r.x & 0xffff0000u);
    f[2] = __uint_as_float(r.y << 16); f[3] = __uint_as_float(r.y & 0xffff0000u);
}
__device__ __forceinline__ void unpack_raw(uint4 r, float* f) { unpack8(r, f); }

// key j's K and V rows (this lane's DPL dims) of kv head g as raw bits; zeros past `end` or for idle lanes
// (`table` indexed by j / block_size - b0: the token's block table from entry b0, in shared memory when staged);
// COHERENT: through common.cuh's ldc (a row the kernel before wrote: the step's own keys, read after the wait)
template <int DPL, bool COHERENT = false>
__device__ __forceinline__ void load_kv(const bf16_t* __restrict__ k_cache, const bf16_t* __restrict__ v_cache,
                                        const int* table, int b0, int j, int end, bool active, int Hkv, int g,
                                        int block_size, int D, int lane, typename Raw<DPL>::T& k,
                                        typename Raw<DPL>::T& v) {
    typedef typename Raw<DPL>::T R;
    if (active && j < end) {
        const size_t base = (((size_t)table[j / block_size - b0] * Hkv + g) * block_size + j % block_size) * D
                            + lane * DPL;
        if (COHERENT) {
            k = ldc(reinterpret_cast<const R*>(k_cache + base));
            v = ldc(reinterpret_cast<const R*>(v_cache + base));
        } else {
            k = *reinterpret_cast<const R*>(k_cache + base);
            v = *reinterpret_cast<const R*>(v_cache + base);
        }
    } else {
        k = R{};
        v = R{};
    }
}

// The MAXG (8) heads' dot products of one key summed over the warp at once, as a reduce-scatter: at xor 16 a lane
// keeps 4 heads and sends the other 4, at xor 8 it keeps 2, at xor 4 one (head (lane >> 2) & 7), then xor 2 and
// 1 finish it: the lane's own head's total (in its 4 lanes). 11 shuffles, 5 deep, for the 40 (8 chains of 5) of a
// warp_sum per head; every sum is the same butterfly warp_sum forms (own + partner's at each level), so the values
// are bit for bit warp_sum's.
__device__ __forceinline__ float warp_sum8_own(const float (&v)[MAXG]) {
    static_assert(MAXG == 8, "warp_sum8_own reduces 8 heads");
    const int lane = threadIdx.x & 31;
    const bool hi16 = lane & 16, hi8 = lane & 8, hi4 = lane & 4;
    float w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // heads 4 * hi16 + i
        const float keep = hi16 ? v[i + 4] : v[i], send = hi16 ? v[i] : v[i + 4];
        w[i] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
    }
    float x[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // heads 4 * hi16 + 2 * hi8 + i
        const float keep = hi8 ? w[i + 2] : w[i], send = hi8 ? w[i] : w[i + 2];
        x[i] = keep + __shfl_xor_sync(0xffffffffu, send, 8);
    }
    const float keep = hi4 ? x[1] : x[0], send = hi4 ? x[0] : x[1];
    float y = keep + __shfl_xor_sync(0xffffffffu, send, 4);  // head (lane >> 2) & 7
    y += __shfl_xor_sync(0xffffffffu, y, 2);
    y += __shfl_xor_sync(0xffffffffu, y, 1);
    return y;
}

// warp_sum8_own's reduce-scatter for 4 heads (attn_cluster's _g4 forms): xor 16 keeps 2, xor 8 one (head (lane >> 3)
// & 3), then xor 4, 2, 1. The same butterfly as warp_sum, so the same bits.
__device__ __forceinline__ float warp_sum4_own(const float (&v)[4]) {
    const int lane = threadIdx.x & 31;
    const bool hi16 = lane & 16, hi8 = lane & 8;
    float w[2];
#pragma unroll
    for (int i = 0; i < 2; ++i) {  // heads 2 * hi16 + i
        const float keep = hi16 ? v[i + 2] : v[i], send = hi16 ? v[i] : v[i + 2];
        w[i] = keep + __shfl_xor_sync(0xffffffffu, send, 16);
    }
    const float keep = hi8 ? w[1] : w[0], send = hi8 ? w[0] : w[1];
    float y = keep + __shfl_xor_sync(0xffffffffu, send, 8);  // head (lane >> 3) & 3
    y += __shfl_xor_sync(0xffffffffu, y, 4);
    y += __shfl_xor_sync(0xffffffffu, y, 2);
    y += __shfl_xor_sync(0xffffffffu, y, 1);
    return y;
}

// The pieces attn_partial and attn_cluster share (one expression each, so both keep the same bits).
// The split's block-table entries [b0, ...) for keys [start, end) in shared memory (host-written before the step:
// read before pdl_wait), so a key costs one dependent round trip (its K/V rows) instead of two; splits spanning more
// than ATTN_TABLE_STAGE blocks read the table from global memory. Sets the table the keys read (tb, from entry tb0).
__device__ __forceinline__ void attn_stage_table(const int* table, int* s_tbl, int start, int end, int block_size,
                                                 const int*& tb, int& tb0) {
    const int b0 = start / block_size, nblk = end > start ? (end - 1) / block_size + 1 - b0 : 0;
    const bool staged = nblk <= ATTN_TABLE_STAGE;
    if (staged)
        for (int i = threadIdx.x; i < nblk; i += blockDim.x) s_tbl[i] = table[b0 + i];
    __syncthreads();
    tb = staged ? s_tbl : table;
    tb0 = staged ? b0 : 0;
}

// The K / V rows of a warp's first N keys j0, j0 + STRIDE, ... (< end) into kr / vr, then pdl_wait. A key below
// `old` (L - 1 - t for token t) was written by an earlier step, complete before this step's graph began: its rows go
// out before the wait, so their DRAM / L2 round trip overlaps the kernel before (qkv + rope), and the wait depends on
// a word of each (common.cuh pdl_wait_on), so ptxas keeps them there. Keys from `old` on may be this step's own
// (written by the kernel before: token t's, and in a prefill chunk its sequence's tokens before it, at most t of
// them, at consecutive positions): those are read after the wait, through the coherent path. `word`: a word of the caller's own early loads (attn_o_cluster's o
// weights), or'ed into the wait's dependency.
template <int DPL, int N, int STRIDE>
__device__ __forceinline__ void attn_first_keys(const bf16_t* __restrict__ k_cache,
                                                const bf16_t* __restrict__ v_cache, const int* tb, int tb0, int j0,
                                                int end, int old, bool active, int Hkv, int g, int block_size,
                                                int D, int lane, typename Raw<DPL>::T* kr,
                                                typename Raw<DPL>::T* vr, unsigned word = 0u) {
    const int early_end = min(end, old);
#pragma unroll
    for (int c = 0; c < N; ++c) {
        load_kv<DPL>(k_cache, v_cache, tb, tb0, j0 + c * STRIDE, early_end, active, Hkv, g, block_size, D, lane,
                     kr[c], vr[c]);
        word |= early_word(kr[c]) | early_word(vr[c]);
    }
    pdl_wait_on(word);  // q and the step's own K / V rows are the previous kernels'
#pragma unroll
    for (int c = 0; c < N; ++c)
        if (j0 + c * STRIDE >= early_end)
            load_kv<DPL, true>(k_cache, v_cache, tb, tb0, j0 + c * STRIDE, end, active, Hkv, g, block_size, D,
                               lane, kr[c], vr[c]);
}

// the HG heads' query (scaled; zeros past gn and for idle lanes) and the online softmax's empty state
template <int DPL, int HG = MAXG>
__device__ __forceinline__ void attn_init(const float* __restrict__ q, int q_stride, int t, int head0, int gn,
                                          bool active, int lane, int D, float scale, float (&qr)[HG][DPL],
                                          float (&acc)[HG][DPL], float& m, float& l) {
    m = NEG_INF;
    l = 0.0f;
    // q is the previous kernel's (qkv + rope): read through the coherent path (common.cuh ldx*), which ptxas keeps
    // below pdl_wait; a `const __restrict__` load (ld.global.nc) may be hoisted above it (`llmrs ptx-check --sass`:
    // loads before wait), a race under programmatic launch. A lane's DPL dims are
    // consecutive: one 16- (or 8-) byte load per 4 (2) of them where q's rows are so aligned (the same values).
    constexpr int VW = DPL >= 4 ? 4 : DPL;
    const bool vec = VW > 1 && ((q_stride | D) & (VW - 1)) == 0 && ((size_t)q & (4 * VW - 1)) == 0;
#pragma unroll
    for (int h = 0; h < HG; ++h) {
        const bool on = h < gn && active;
        const float* qh = q + (size_t)t * q_stride + (size_t)(head0 + h) * D + lane * DPL;
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[h][i] = 0.0f;
        if constexpr (VW == 4) {
            if (vec) {
#pragma unroll
                for (int i = 0; i < DPL; i += 4) {
                    const float4 v = on ? ldx4(qh + i) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                    qr[h][i] = v.x * scale; qr[h][i + 1] = v.y * scale;
                    qr[h][i + 2] = v.z * scale; qr[h][i + 3] = v.w * scale;
                }
                continue;
            }
        } else if constexpr (VW == 2) {
            if (vec) {
                const float2 v = on ? ldx2(qh) : make_float2(0.0f, 0.0f);
                qr[h][0] = v.x * scale; qr[h][1] = v.y * scale;
                continue;
            }
        }
#pragma unroll
        for (int i = 0; i < DPL; ++i) qr[h][i] = on ? ldx1(qh + i) * scale : 0.0f;
    }
}

// one key (this lane's K / V dims kf, vf) into every head's online softmax: every one of the HG heads, also past
// gn (q = 0 there, results unused): without a branch per head the compiler interleaves the heads' shuffle reductions
// and exps instead of running them one after another (a key cost ~7 x the latency of one head's chain that way)
template <int DPL, int HG = MAXG>
__device__ __forceinline__ void attn_key(const float (&qr)[HG][DPL], const float (&kf)[DPL], const float (&vf)[DPL],
                                         float (&acc)[HG][DPL], float& m, float& l) {
    float dots[HG];
#pragma unroll
    for (int h = 0; h < HG; ++h) {
        float d = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) d += qr[h][i] * kf[i];
        dots[h] = d;
    }
    // the lane's own head's total (head lane / LPH, in its LPH lanes), its softmax step here, then its factors to
    // every lane's accumulators
    constexpr int LPH = 32 / HG;
    float d;
    if constexpr (HG == 8) d = warp_sum8_own(dots);
    else d = warp_sum4_own(dots);
    const float mn = fmaxf(m, d);
    const float corr = __expf(m - mn), p = __expf(d - mn);
    l = l * corr + p;
    m = mn;
#pragma unroll
    for (int h = 0; h < HG; ++h) {
        const float ch = __shfl_sync(0xffffffffu, corr, LPH * h), ph = __shfl_sync(0xffffffffu, p, LPH * h);
#pragma unroll
        for (int i = 0; i < DPL; ++i) acc[h][i] = acc[h][i] * ch + ph * vf[i];
    }
}

// the block's W warps merged: each warp's (m, l, acc) of its heads into shared memory, then for (head h, dim d)
// the block's M, L and A (call after a __syncthreads that follows attn_warp_out)
template <int DPL, int W, int HG = MAXG>
__device__ __forceinline__ void attn_warp_out(float (&s_m)[W][HG], float (&s_l)[W][HG],
                                              float (&s_acc)[W][HG][32 * DPL], int warp, int lane, int gn,
                                              const float (&acc)[HG][DPL], const float m, const float l) {
    constexpr int LPH = 32 / HG;  // lanes a head (attn_key)
    if (lane % LPH == 0 && lane / LPH < gn) { s_m[warp][lane / LPH] = m; s_l[warp][lane / LPH] = l; }
#pragma unroll
    for (int h = 0; h < HG; ++h) {
        if (h < gn) {
#pragma unroll
            for (int i = 0; i < DPL; ++i) s_acc[warp][h][lane * DPL + i] = acc[h][i];
        }
    }
}
// the merge's per-(warp, head) factors, once a block (not once a dim): M_h = max_w m_w, e_wh = e^(m_w - M_h) (unused
// where M_h = -inf: no keys), by the block's first gn * W threads; call between the __syncthreads after attn_warp_out
// and another. The same expressions, in the same order, as if every (head, dim) formed them itself (so the same
// bits), without 8 expf a dim.
template <int W, int HG = MAXG>
__device__ __forceinline__ void attn_warp_scales(const float (&s_m)[W][HG], float (&s_e)[W][HG],
                                                 float (&s_M)[HG], int gn) {
    if ((int)threadIdx.x < gn * W) {
        const int h = threadIdx.x / W, w = threadIdx.x % W;
        float M = NEG_INF;
        for (int u = 0; u < W; ++u) M = fmaxf(M, s_m[u][h]);
        s_e[w][h] = M != NEG_INF ? expf(s_m[w][h] - M) : 0.0f;
        if (w == 0) s_M[h] = M;
    }
}
// (head h, dim d)'s M, L and A over the block's warps, from attn_warp_scales' factors
template <int DPL, int W, int HG = MAXG>
__device__ __forceinline__ void attn_warp_merge(const float (&s_M)[HG], const float (&s_e)[W][HG],
                                                const float (&s_l)[W][HG], const float (&s_acc)[W][HG][32 * DPL],
                                                int h, int d, float& M, float& Ls, float& A) {
    M = s_M[h];
    Ls = 0.0f;
    A = 0.0f;
    if (M != NEG_INF) {
        for (int w = 0; w < W; ++w) {
            const float e = s_e[w][h];
            Ls += s_l[w][h] * e;
            A += s_acc[w][h][d] * e;
        }
    }
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define CLUSTER_DIMS(CL) __cluster_dims__(1, 1, CL)
#else
#define CLUSTER_DIMS(CL)
#endif
