// attention.cu: paged causal GQA attention over the bf16 KV cache, split along the keys (flash-decoding).
//
// For every new token t (prefill chunk or decode, the same thing here) and query head h:
//   out[t, h] = softmax(scale * q[t, h] . K[0:L_t]) V[0:L_t],   L_t = positions[t] + 1 (causal),
// with K, V of kv head h / G read through the token's block table: key j lives in block
// block_tables[seq, j / bs] at offset j % bs of the [blocks, Hkv, bs, D] layout (one head's block is
// contiguous: a warp reads a key row in one coalesced load).
//
// attn_partial: grid (T, Hkv * head_groups, splits), 4 warps. A block owns one kv head and up to MAXG of its
// query heads (GQA: each key/value row is loaded once for the whole group) and keys [s*chunk, (s+1)*chunk).
// Warp w takes keys w, w+4, ... (the next key's block-table entry and K/V rows are loaded while the current key
// is used); each lane holds DPL = D/32 dims of q, of the accumulators and of each key,
// so the dot product is DPL FMAs + a shuffle reduction per head, and the softmax is online (running max m,
// running sum l, rescaled accumulator), f32 throughout (__expf per key, expf in the merges). The 4 warps merge
// through shared memory.
// With one split the block writes the normalized output; otherwise it writes (acc, m, l) partials and
// attn_merge combines the splits: out = sum_s acc_s e^(m_s - M) / sum_s l_s e^(m_s - M).
// Register arrays are indexed only by unrolled constants (no local memory; ptx-check pins it).
#include "common.cuh"

#define ATTN_WARPS 4
#define MAXG 8
// the first keys' K / V rows before the PDL wait (attn_first_keys); -DLLMRS_NO_EARLY_KV (LLMRS_EARLY_KV=0) or
// -DLLMRS_NO_EARLY_LOADS: after it, for A/B runs
#if !defined(LLMRS_NO_EARLY_LOADS) && !defined(LLMRS_NO_EARLY_KV)
#define ATTN_EARLY_KV 1
#endif
// the online softmax's two exponentials per key and head (attn_key): __expf (ex2.approx of x log2 e: 2 instructions
// where expf is ~8; the per-key work is issue-bound, 8 warps on each of 32 SMs for the 7B), or expf with
// -DLLMRS_ATTN_EXACT_EXP (LLMRS_ATTN_FAST_EXP=0). H200, best of 3 a process (session19/call4): 7B 3.9797 -> 3.9599,
// 3B 2.2813 -> 2.2334 ms/token.
#ifndef LLMRS_ATTN_EXACT_EXP
#define ATTN_EXP(x) __expf(x)
#else
#define ATTN_EXP(x) expf(x)
#endif
// The online softmax's scalar state (running max m and sum l) and its per-key factors (corr, p): each lane keeps
// only its own head's, the head the reduce-scatter (warp_sum8_own / warp_sum4_own) leaves in its 32 / HG lanes
// (head lane / (32 / HG)), and the factors reach every lane's accumulators by two shuffles a head. Until session 20
// every lane formed every head's (the same expressions on the same values, 32 copies each): H200, best of 3 a process
// (session20/call1), 7B 3.9624 -> 3.9394, 3B 2.2336 -> 2.2089 ms/token at 8 heads a block.
#define ATTN_TABLE_STAGE 64  // block-table entries a split stages in shared memory (1,024 keys at block size 16)
// blocks per SM the register budget must allow: 1 (no cap) except head_dim 64, where ptxas's own choice with the
// prefetched K/V row put 4 bytes in local memory on sm_86/sm_89 (ptx-check); 4 (<= 128 registers) fixes it
#define ATTN_MIN_BLOCKS(DPL) ((DPL) == 2 ? 4 : 1)

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
// are bit for bit warp_sum's. -DLLMRS_NO_WARP_SUM8 (LLMRS_ATTN_WARP_SUM8=0) keeps warp_sum per head.
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
// them, at consecutive positions): those are read after the wait, through the coherent path. Without ATTN_EARLY_KV:
// every key after the wait (the code before). `word`: a word of the caller's own early loads (attn_o_cluster's o
// weights), or'ed into the wait's dependency.
template <int DPL, int N, int STRIDE>
__device__ __forceinline__ void attn_first_keys(const bf16_t* __restrict__ k_cache,
                                                const bf16_t* __restrict__ v_cache, const int* tb, int tb0, int j0,
                                                int end, int old, bool active, int Hkv, int g, int block_size,
                                                int D, int lane, typename Raw<DPL>::T* kr,
                                                typename Raw<DPL>::T* vr, unsigned word = 0u) {
#ifdef ATTN_EARLY_KV
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
#else
    pdl_wait_on(word);  // q and this token's K/V row are the previous kernels' (word: the caller's early loads)
#pragma unroll
    for (int c = 0; c < N; ++c)
        load_kv<DPL>(k_cache, v_cache, tb, tb0, j0 + c * STRIDE, end, active, Hkv, g, block_size, D, lane, kr[c],
                     vr[c]);
#endif
}

// the HG heads' query (scaled; zeros past gn and for idle lanes) and the online softmax's empty state
template <int DPL, int HG = MAXG>
__device__ __forceinline__ void attn_init(const float* __restrict__ q, int q_stride, int t, int head0, int gn,
                                          bool active, int lane, int D, float scale, float (&qr)[HG][DPL],
                                          float (&acc)[HG][DPL], float& m, float& l) {
    m = NEG_INF;
    l = 0.0f;
    // q is the previous kernel's (qkv + rope): read through the coherent path (common.cuh ldx*), which ptxas keeps
    // below pdl_wait; as a `const __restrict__` load (ld.global.nc) it had been hoisted above it (session 18,
    // `llmrs ptx-check --sass`: loads before wait), a race under programmatic launch. A lane's DPL dims are
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
#ifndef LLMRS_NO_WARP_SUM8
    float d;
    if constexpr (HG == 8) d = warp_sum8_own(dots);
    else d = warp_sum4_own(dots);
#else
    const int own = (threadIdx.x & 31) / LPH;
    float d = 0.0f;
#pragma unroll
    for (int h = 0; h < HG; ++h) {
        const float t = warp_sum(dots[h]);
        d = h == own ? t : d;
    }
#endif
    const float mn = fmaxf(m, d);
    const float corr = ATTN_EXP(m - mn), p = ATTN_EXP(d - mn);
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
// and another. The same expressions, in the same order, as when every (head, dim) formed them itself (session 19:
// the block merge was 1.3 us of attn_cluster's ~8 after its wait, 8 expf a dim), so the same bits.
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

template <int DPL>
__device__ __forceinline__ void attn_partial_impl(
    const float* __restrict__ q, int q_stride, const bf16_t* __restrict__ k_cache,
    const bf16_t* __restrict__ v_cache, const int* __restrict__ block_tables, int max_blocks,
    const int* __restrict__ token_seq, const int* __restrict__ positions, float* __restrict__ out,
    float* __restrict__ part_acc, float* __restrict__ part_ml, int Hq, int Hkv, int D, int block_size,
    int chunk, float scale) {
    pdl_trigger();
    __shared__ float s_m[ATTN_WARPS][MAXG], s_l[ATTN_WARPS][MAXG];
    __shared__ float s_acc[ATTN_WARPS][MAXG][32 * DPL];
    const int t = blockIdx.x, S = gridDim.z, s = blockIdx.z;
    const int G = Hq / Hkv, ngroups = (G + MAXG - 1) / MAXG;
    const int g = blockIdx.y / ngroups, h0 = (blockIdx.y % ngroups) * MAXG;
    const int gn = min(MAXG, G - h0);  // query heads of this block: g*G + h0 + [0, gn)
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool active = lane * DPL < D;
    const int L = positions[t] + 1;
    const int start = s * chunk, end = min(L, start + chunk);
    const int* table = block_tables + (size_t)token_seq[t] * max_blocks;
    prefetch_kv_l2(k_cache, v_cache, table, start, min(end, L - 1), Hkv, g, block_size, D);
    __shared__ int s_tbl[ATTN_TABLE_STAGE];
    const int* tb;
    int tb0;
    attn_stage_table(table, s_tbl, start, end, block_size, tb, tb0);
    // key j's K and V rows in kf / vf; the next key's (j + ATTN_WARPS) are loaded before key j is used, so a warp
    // has one block-table + K/V round trip in flight while it computes (the sums are unchanged). The first key's
    // go out before the wait where an earlier step wrote them (attn_first_keys).
    typename Raw<DPL>::T kr, vr;
    attn_first_keys<DPL, 1, 1>(k_cache, v_cache, tb, tb0, start + warp, end, L - 1 - t, active, Hkv, g,
                               block_size, D, lane, &kr, &vr);

    float qr[MAXG][DPL], acc[MAXG][DPL], m, l;
    attn_init<DPL>(q, q_stride, t, g * G + h0, gn, active, lane, D, scale, qr, acc, m, l);
#pragma unroll 1
    for (int j = start + warp; j < end; j += ATTN_WARPS) {
        float kf[DPL], vf[DPL];
        unpack_raw(kr, kf);
        unpack_raw(vr, vf);
        load_kv<DPL>(k_cache, v_cache, tb, tb0, j + ATTN_WARPS, end, active, Hkv, g, block_size, D, lane, kr, vr);
        attn_key<DPL>(qr, kf, vf, acc, m, l);
    }
    // merge the warps of the block
    attn_warp_out<DPL, ATTN_WARPS>(s_m, s_l, s_acc, warp, lane, gn, acc, m, l);
    __syncthreads();
    __shared__ float s_e[ATTN_WARPS][MAXG], s_M[MAXG];
    attn_warp_scales<ATTN_WARPS>(s_m, s_e, s_M, gn);
    __syncthreads();
    for (int idx = threadIdx.x; idx < gn * D; idx += blockDim.x) {
        const int h = idx / D, d = idx % D;
        float M, Ls, A;
        attn_warp_merge<DPL, ATTN_WARPS>(s_M, s_e, s_l, s_acc, h, d, M, Ls, A);
        const int head = g * G + h0 + h;
        if (S == 1) {
            out[(size_t)t * Hq * D + (size_t)head * D + d] = A / Ls;
        } else {
            const size_t pi = ((size_t)t * Hq + head) * S + s;
            part_acc[pi * D + d] = A;
            if (d == 0) { part_ml[2 * pi] = M; part_ml[2 * pi + 1] = Ls; }
        }
    }
}

#define ATTN(DPL)                                                                                             \
    extern "C" __global__ void __launch_bounds__(ATTN_WARPS * 32, ATTN_MIN_BLOCKS(DPL)) attn_partial_d##DPL(  \
        const float* __restrict__ q, int q_stride, const bf16_t* __restrict__ k_cache,                        \
        const bf16_t* __restrict__ v_cache, const int* __restrict__ block_tables, int max_blocks,             \
        const int* __restrict__ token_seq, const int* __restrict__ positions, float* __restrict__ out,        \
        float* __restrict__ part_acc, float* __restrict__ part_ml, int Hq, int Hkv, int D, int block_size,    \
        int chunk, float scale) {                                                                             \
        attn_partial_impl<DPL>(q, q_stride, k_cache, v_cache, block_tables, max_blocks, token_seq, positions, \
                               out, part_acc, part_ml, Hq, Hkv, D, block_size, chunk, scale);                 \
    }
ATTN(1)
ATTN(2)
ATTN(4)
ATTN(8)

// grid (T, Hq), block >= D threads (rounded to a warp multiple): combine the splits of one (token, head).
// Up to MERGE_STAGE splits the block first reads every split's (m, l) once, its threads together, into shared
// memory and forms each split's weight e = exp(m - M) there once; then each thread sums its dim over the splits
// with 16 loads in flight (the partial of a split past the token's causal limit is read and skipped, as every
// split block writes one). Before, each thread read the (m, l) pairs itself in two passes of 8 loads in flight:
// at 33 splits ~10 dependent L2 round trips. The arithmetic and its order are the same (the same bits).
#ifndef MERGE_STAGE  // -DMERGE_STAGE=1 keeps every merge on the per-thread loop (the test compares the two)
#define MERGE_STAGE 256
#endif
// the merged value as the output's type: f32, or bf16 words (o's GEMM input: f32_to_bf16 of the very f32 value,
// the bits cast_f32_bf16 would make of it)
template <typename OutT> __device__ __forceinline__ OutT merge_out(float v);
template <> __device__ __forceinline__ float merge_out<float>(float v) { return v; }
template <> __device__ __forceinline__ bf16_t merge_out<bf16_t>(float v) { return f32_to_bf16(v); }

template <typename OutT>
__device__ __forceinline__ void attn_merge_impl(const float* __restrict__ part_acc,
                                                const float* __restrict__ part_ml, OutT* __restrict__ out, int Hq,
                                                int D, int S) {
    pdl_enter();
    __shared__ float s_m[MERGE_STAGE], s_l[MERGE_STAGE], s_e[MERGE_STAGE];
    const int t = blockIdx.x, head = blockIdx.y, d = threadIdx.x;
    const size_t p0 = ((size_t)t * Hq + head) * S;
    if (S <= MERGE_STAGE) {
        for (int s = threadIdx.x; s < S; s += blockDim.x) {
            s_m[s] = part_ml[2 * (p0 + s)];
            s_l[s] = part_ml[2 * (p0 + s) + 1];
        }
        __syncthreads();
        float M = NEG_INF;
        for (int s = 0; s < S; ++s) M = fmaxf(M, s_m[s]);
        for (int s = threadIdx.x; s < S; s += blockDim.x) s_e[s] = s_m[s] == NEG_INF ? 0.0f : expf(s_m[s] - M);
        __syncthreads();
        if (d >= D) return;
        const float* acc = part_acc + p0 * D + d;
        float Ls = 0.0f, A = 0.0f;
#pragma unroll 16
        for (int s = 0; s < S; ++s) {
            const float a = acc[(size_t)s * D];
            if (s_m[s] == NEG_INF) continue;  // a split past this token's causal limit: no keys
            const float e = s_e[s];
            Ls += s_l[s] * e;
            A += a * e;
        }
        out[(size_t)t * Hq * D + (size_t)head * D + d] = merge_out<OutT>(A / Ls);
        return;
    }
    if (d >= D) return;
    // (more splits than MERGE_STAGE: long contexts) each thread on its own, loads unrolled so that the splits'
    // loads are in flight together; the sums still run in split order
    float M = NEG_INF;
#pragma unroll 8
    for (int s = 0; s < S; ++s) M = fmaxf(M, part_ml[2 * (p0 + s)]);
    float Ls = 0.0f, A = 0.0f;
#pragma unroll 8
    for (int s = 0; s < S; ++s) {
        const float ms = part_ml[2 * (p0 + s)];
        if (ms == NEG_INF) continue;  // a split past this token's causal limit: no keys
        const float e = expf(ms - M);
        Ls += part_ml[2 * (p0 + s) + 1] * e;
        A += part_acc[(p0 + s) * D + d] * e;
    }
    out[(size_t)t * Hq * D + (size_t)head * D + d] = merge_out<OutT>(A / Ls);
}

extern "C" __global__ void attn_merge(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                      float* __restrict__ out, int Hq, int D, int S) {
    attn_merge_impl<float>(part_acc, part_ml, out, Hq, D, S);
}
extern "C" __global__ void attn_merge_bf16(const float* __restrict__ part_acc, const float* __restrict__ part_ml,
                                           bf16_t* __restrict__ out, int Hq, int D, int S) {
    attn_merge_impl<bf16_t>(part_acc, part_ml, out, Hq, D, S);
}

// ---------------------------------------------------------------------- one launch: the splits meet in a cluster
// attn_cluster{CL}_d{DPL}: attn_partial's work and attn_merge's in one kernel (sm_90+). grid (T, Hkv * head_groups,
// CL), a thread-block cluster of (1, 1, CL): the CL blocks of one (token, kv head, head group) are the splits of its
// keys, chunk = ceil(L / CL) keys a block (L = the token's length). A block has CW warps; warp w takes keys
// start + w, start + w + CW, ... and loads the K / V rows of up to CK of them at once (one round trip for all,
// not one a key), then runs attn_partial's per-key math on them in order (the same expressions: dot products,
// warp_sum8, online softmax). The warps meet in shared memory as in attn_partial (M, L, A per head and dim); the
// block pushes each (head, dim)'s (M, L, A) into the shared memory of the block that merges that pair (mapa +
// st.async, completing on that block's mbarrier: each block expects the bytes its pairs get and waits for them, with
// no cluster barrier with release and its MEMBAR.ALL.GPU; every block merges 1 / CL of the pairs), and each block's
// threads combine their pairs over the CL splits from their own shared memory, in block
// order with attn_merge's expressions: out = sum_s A_s e^(M_s - M) / sum_s L_s e^(M_s - M). -DLLMRS_ATTN_CLUSTER_PULL
// (LLMRS_ATTN_CLUSTER_PUSH=0; the form before session 20) leaves them in the block's own shared memory and the
// merging threads read the other blocks' (ld.shared::cluster), a second barrier keeping it alive until all have
// read it. The same bits either way.
// So the step has no partials in global memory and no attn_merge launch. Below sm_90 the entry points exist and
// trap (the host never launches them there: cuda.py's cluster rule checks the compute capability).
// -DLLMRS_ATTN_CLOCKS (a probe, scripts/attn_clocks.py): thread 0 of every attn_cluster block adds the SM cycles
// (clock64) of each phase to attn_clocks[phase] and counts itself in attn_clocks[15]; the host reads them
// (RawModule.get_global) after a run of graphed decode steps: where the kernel's time goes after its PDL wait.
// attn_o_cluster's blocks (ATTN_O_CLOCK) count themselves in attn_clocks[14] instead, and the last block of each
// split, whose cross-head sum is phase 9, in attn_clocks[13] (a step runs one of the two kernels, never both).
#ifdef LLMRS_ATTN_CLOCKS
__device__ unsigned long long attn_clocks[16];
#define ATTN_CLOCK_START long long clk_prev_ = clock64();
#define ATTN_CLOCK_IN(i, COUNT)                                                              \
    if (threadIdx.x == 0) {                                                                  \
        const long long now_ = clock64();                                                    \
        atomicAdd(&attn_clocks[i], (unsigned long long)(now_ - clk_prev_));                  \
        clk_prev_ = now_;                                                                    \
        if ((i) == 0) atomicAdd(&attn_clocks[COUNT], 1ull);                                  \
    }
#else
#define ATTN_CLOCK_START
#define ATTN_CLOCK_IN(i, COUNT)
#endif
#define ATTN_CLOCK(i) ATTN_CLOCK_IN(i, 15)
#define ATTN_O_CLOCK(i) ATTN_CLOCK_IN(i, 14)
// CW warps a cluster block, CK keys a warp loads at once: 8 x 8 (a split of 64 keys, the host's
// ATTN_CLUSTER_KEYS_PER_SPLIT, in one batch), or 16 x 4 (the _w16 forms: the same 64 keys over twice the warps, each
// with half the keys' dependent chain; LLMRS_ATTN_CLUSTER_WARPS=16, 4 heads a block only)
template <int DPL, int CL, int HG, int CW, int CK>
__device__ __forceinline__ void attn_cluster_impl(
    const float* __restrict__ q, int q_stride, const bf16_t* __restrict__ k_cache,
    const bf16_t* __restrict__ v_cache, const int* __restrict__ block_tables, int max_blocks,
    const int* __restrict__ token_seq, const int* __restrict__ positions, float* __restrict__ out, int Hq, int Hkv,
    int D, int block_size, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    ATTN_CLOCK_START
    pdl_trigger();
    __shared__ float s_m[CW][HG], s_l[CW][HG];
    __shared__ float s_acc[CW][HG][32 * DPL];
#ifndef LLMRS_ATTN_CLUSTER_PULL
    // the (head, dim) pairs h * 32 * DPL + d of the cluster's heads, SL of them merged by each block: every block's
    // split of those pairs (A) and of their heads (M, L), pushed here by the blocks
    constexpr int SL = HG * 32 * DPL / CL;
    static_assert(SL <= CW * 32 && SL * CL == HG * 32 * DPL, "a pair a thread");
    __shared__ float p_a[CL][SL], p_m[CL][HG], p_l[CL][HG];
    // the pushes (st.async) complete on the receiving block's mbarrier, initialized before the block arrives at the
    // cluster barrier every push waits on (attn_o_impl's way: no cluster barrier with release, a MEMBAR.ALL.GPU)
    __shared__ __align__(8) unsigned long long p_bar;
    if (threadIdx.x == 0) mbar_init(&p_bar, 1);
    cluster_arrive_relaxed();  // this block runs (its shared memory there to push into): waited on before the pushes
#else
    __shared__ float c_a[HG][32 * DPL], c_m[HG], c_l[HG];  // this block's merged split, read cluster-wide
#endif
    __shared__ int s_tbl[ATTN_TABLE_STAGE];
    const int t = blockIdx.x, s = (int)cluster_rank();
    const int G = Hq / Hkv, ngroups = (G + HG - 1) / HG;
    const int g = blockIdx.y / ngroups, h0 = (blockIdx.y % ngroups) * HG;
    const int gn = min(HG, G - h0);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const bool active = lane * DPL < D;
    const int L = positions[t] + 1, chunk = (L + CL - 1) / CL;
    const int start = min(L, s * chunk), end = min(L, start + chunk);
    const int* table = block_tables + (size_t)token_seq[t] * max_blocks;
#ifdef ATTN_EARLY_KV
    const int pf0 = start + CW * CK;  // the first batch is loaded outright (attn_first_keys): the L2 prefetch after it
#else
    const int pf0 = start;
#endif
    prefetch_kv_l2(k_cache, v_cache, table, pf0, min(end, L - 1), Hkv, g, block_size, D);
    const int* tb;
    int tb0;
    attn_stage_table(table, s_tbl, start, end, block_size, tb, tb0);
    // the first batch's K / V rows, before the wait where an earlier step wrote them (attn_first_keys)
    typename Raw<DPL>::T kr[CK], vr[CK];
    ATTN_CLOCK(0)  // entry -> the table staged, the early loads issued
    attn_first_keys<DPL, CK, CW>(k_cache, v_cache, tb, tb0, start + warp, end, L - 1 - t, active, Hkv, g,
                                 block_size, D, lane, kr, vr);
    ATTN_CLOCK(1)  // -> past the PDL wait

    float qr[HG][DPL], acc[HG][DPL], m, l;
    attn_init<DPL, HG>(q, q_stride, t, g * G + h0, gn, active, lane, D, scale, qr, acc, m, l);
#pragma unroll 1
    for (int j0 = start + warp; j0 < end; j0 += CW * CK) {
        if (j0 != start + warp) {
#pragma unroll
            for (int c = 0; c < CK; ++c)
                load_kv<DPL>(k_cache, v_cache, tb, tb0, j0 + c * CW, end, active, Hkv, g, block_size, D, lane,
                             kr[c], vr[c]);
        }
#pragma unroll
        for (int c = 0; c < CK; ++c) {
            if (j0 + c * CW >= end) break;  // warp-uniform
            float kf[DPL], vf[DPL];
            unpack_raw(kr[c], kf);
            unpack_raw(vr[c], vf);
            attn_key<DPL, HG>(qr, kf, vf, acc, m, l);
        }
    }
    ATTN_CLOCK(2)  // -> q and the keys done (warp 0)
    // the block's warps, as attn_partial merges them
    attn_warp_out<DPL, CW, HG>(s_m, s_l, s_acc, warp, lane, gn, acc, m, l);
    __syncthreads();
    __shared__ float s_e[CW][HG], s_M[HG];
    attn_warp_scales<CW, HG>(s_m, s_e, s_M, gn);
    __syncthreads();
    ATTN_CLOCK(3)  // -> every warp's keys done
#ifndef LLMRS_ATTN_CLUSTER_PULL
    // the block's split of each (head, dim) pushed into the shared memory of the block that merges it (rank pair /
    // SL; a head's M and L into each block merging some of its dims), one barrier, then each block merges its SL
    // pairs from its own shared memory: no remote reads on the way out and no second barrier (session 20: the pull
    // form's merging blocks read 3 dependent rounds of remote shared memory while the others waited at the second
    // barrier, ~1.3 us of the kernel's ~5 after its wait)
    cluster_wait();  // every block of the cluster runs (arrived at its start: its mbarrier initialized)
    if (threadIdx.x == 0) {
        // the bytes this block receives from each split: the A of its pairs [s SL, (s + 1) SL) that are real (head <
        // gn, dim < D), and M and L of every head whose pairs [h 32 DPL, (h + 1) 32 DPL) reach into them (the loop
        // below sends exactly these)
        const int lo = s * SL, hi = lo + SL;
        unsigned n = 0;
        for (int h = 0; h < gn; ++h) {
            const int b = h * 32 * DPL;
            n += (unsigned)max(0, min(hi, b + D) - max(lo, b));
            if (b < hi && b + 32 * DPL > lo) n += 2;
        }
        mbar_arrive_expect(&p_bar, CL * n * 4);
    }
    for (int idx = threadIdx.x; idx < gn * D; idx += blockDim.x) {
        const int h = idx / D, d = idx % D, pi = h * 32 * DPL + d;
        float M, Ls, A;
        attn_warp_merge<DPL, CW, HG>(s_M, s_e, s_l, s_acc, h, d, M, Ls, A);
        st_async_cluster(&p_a[s][pi % SL], pi / SL, A, &p_bar);
        if (d == 0) {
            for (int o = pi / SL; o <= (pi + 32 * DPL - 1) / SL; ++o) {
                st_async_cluster(&p_m[s][h], o, M, &p_bar);
                st_async_cluster(&p_l[s][h], o, Ls, &p_bar);
            }
        }
    }
    ATTN_CLOCK(4)  // -> the block's warps merged, pushed
    mbar_wait(&p_bar, 0);  // every split's pushes in (each block waits for its own: none leaves while pushed to)
    ATTN_CLOCK(5)  // -> the pushes in
    if ((int)threadIdx.x < SL) {  // the splits, attn_merge's way, in block order
        const int pi = s * SL + threadIdx.x, h = pi / (32 * DPL), d = pi % (32 * DPL);
        if (h < gn && d < D) {
            float M = NEG_INF;
#pragma unroll
            for (int r = 0; r < CL; ++r) M = fmaxf(M, p_m[r][h]);
            float Ls = 0.0f, A = 0.0f;
#pragma unroll
            for (int r = 0; r < CL; ++r) {
                const float mr = p_m[r][h];
                if (mr == NEG_INF) continue;  // a split with no keys
                const float e = expf(mr - M);
                Ls += p_l[r][h] * e;
                A += p_a[r][threadIdx.x] * e;
            }
            out[(size_t)t * Hq * D + (size_t)(g * G + h0 + h) * D + d] = A / Ls;
        }
    }
    ATTN_CLOCK(6)  // -> the splits merged, out written
    ATTN_CLOCK(7)  // (no second barrier: nothing reads another block's shared memory after the first)
#else
    for (int idx = threadIdx.x; idx < gn * D; idx += blockDim.x) {
        const int h = idx / D, d = idx % D;
        float M, Ls, A;
        attn_warp_merge<DPL, CW, HG>(s_M, s_e, s_l, s_acc, h, d, M, Ls, A);
        c_a[h][d] = A;
        if (d == 0) { c_m[h] = M; c_l[h] = Ls; }
    }
    ATTN_CLOCK(4)  // -> the block's warps merged
    cluster_sync();  // every block's (M, L, A) written and visible to the cluster
    ATTN_CLOCK(5)  // -> the cluster barrier
    // the splits, attn_merge's way: (head, dim) pairs dealt over the cluster's threads
    for (int idx = s * blockDim.x + threadIdx.x; idx < gn * D; idx += CL * blockDim.x) {
        const int h = idx / D, d = idx % D;
        float ms[CL];
        float M = NEG_INF;
#pragma unroll
        for (int r = 0; r < CL; ++r) {
            ms[r] = ld_cluster(&c_m[h], r);
            M = fmaxf(M, ms[r]);
        }
        float Ls = 0.0f, A = 0.0f;
#pragma unroll
        for (int r = 0; r < CL; ++r) {
            if (ms[r] == NEG_INF) continue;  // a split with no keys
            const float e = expf(ms[r] - M);
            Ls += ld_cluster(&c_l[h], r) * e;
            A += ld_cluster(&c_a[h][d], r) * e;
        }
        out[(size_t)t * Hq * D + (size_t)(g * G + h0 + h) * D + d] = A / Ls;
    }
    ATTN_CLOCK(6)  // -> the splits merged, out written
    cluster_sync();  // no block leaves (its shared memory) while another may still read it
    ATTN_CLOCK(7)  // -> the second barrier
#endif
#else
    __trap();
#endif
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define CLUSTER_DIMS(CL) __cluster_dims__(1, 1, CL)
#else
#define CLUSTER_DIMS(CL)
#endif
// attn_cluster{CL}_d{DPL}{NAME}: HG query heads of a kv head a block. _g4: 4, not 8: twice the blocks (SMs) at the
// same cluster size, half the per-key arithmetic a warp (the keys were issue-bound on 8 warps an SM, session 19's
// scripts/attn_clocks.py); each K / V row is read by two blocks (from L2 the second time). The same keys a warp in
// the same order, and every head's sums and softmax expressions as in the 8-head form: the same bits.
#define ATTN_CLUSTER_HG(CL, DPL, HG, CW, CK, NAME)                                                             \
    extern "C" __global__ void __launch_bounds__(CW * 32, 1) CLUSTER_DIMS(CL) attn_cluster##CL##_d##DPL##NAME( \
        const float* __restrict__ q, int q_stride, const bf16_t* __restrict__ k_cache,                        \
        const bf16_t* __restrict__ v_cache, const int* __restrict__ block_tables, int max_blocks,             \
        const int* __restrict__ token_seq, const int* __restrict__ positions, float* __restrict__ out, int Hq, \
        int Hkv, int D, int block_size, float scale) {                                                        \
        attn_cluster_impl<DPL, CL, HG, CW, CK>(q, q_stride, k_cache, v_cache, block_tables, max_blocks,        \
                                               token_seq, positions, out, Hq, Hkv, D, block_size, scale);      \
    }
#define ATTN_CLUSTER(CL, DPL) ATTN_CLUSTER_HG(CL, DPL, MAXG, 8, 8, )
#define ATTN_CLUSTER_G4(CL, DPL) ATTN_CLUSTER_HG(CL, DPL, 4, 8, 8, _g4)
#define ATTN_CLUSTER_G4_W16(CL, DPL) ATTN_CLUSTER_HG(CL, DPL, 4, 16, 4, _g4_w16)
ATTN_CLUSTER(4, 4)
ATTN_CLUSTER(8, 4)
ATTN_CLUSTER(16, 4)
ATTN_CLUSTER(8, 2)
ATTN_CLUSTER(16, 2)
ATTN_CLUSTER_G4(8, 4)
ATTN_CLUSTER_G4(16, 4)
ATTN_CLUSTER_G4(8, 2)
ATTN_CLUSTER_G4(16, 2)
ATTN_CLUSTER_G4_W16(8, 4)
ATTN_CLUSTER_G4_W16(16, 4)
ATTN_CLUSTER_G4_W16(8, 2)
ATTN_CLUSTER_G4_W16(16, 2)

// ---------------------------------------------------------------------------------------------------------------
// attn_o_cluster{CL}: one token's decode attention fused with the o projection that follows it (x += W_o att), for
// 128-dim heads on sm_90+. The o projection's input is the whole attention output, so after attn_cluster the o
// kernel waited on a grid boundary (~1 us of release latency plus an L2 round trip for its input: session 30's
// scripts/grid_barrier_bench.py measured 4.2 us for a dependent one-token 2048 x 2048 matvec whose rows were all
// loaded before its wait, against 1.95 us of bytes) on top of the attention's own. Here the o product is split
// along its input by head instead: o(att) = sum_h W_o[:, h D:(h+1) D] att_h, and the block of (head h, split s)
// multiplies its head's output into rows [s N / CL, (s+1) N / CL), so it needs only what its own cluster computed.
//   grid (T, Hq, CL), clusters of CL blocks along z (the key splits of one head), W warps a block (AO_WARPS, or 8).
//   Before the PDL wait: the block's o weights (rows of its split x its head's 128 columns: a lane's 16-byte chunks
//   in registers, RP of them), the split's block-table entries, the first keys' K / V rows (attn_first_keys).
//   Keys: warp w takes keys start + w, + W, ... (AO_CK at once: their dot products reduced together, then
//   the online softmax over them in key order), one head a warp (warp_sum: every lane has the dot product).
//   Merges: the block's warps through shared memory; the cluster's splits pushed into every block's shared memory
//   (st.async, completing on each block's mbarrier, which it waits on: no cluster barrier with release after the
//   pushes, a MEMBAR.ALL.GPU; 3B one stream 2.0176 / 2.0184 -> 2.0110 / 2.0114 ms/token, session 33 call6), each
//   block merging all D dims (so each has its head's whole output).
//   o: a half-warp a row (16 lanes x 8 columns), reduced by 4 shuffles; the block writes its rows' partial sums to
//   part[t][h][row], counts itself in for (t, s) (block_counts_last), and the last of the Hq heads' blocks of that
//   split adds sum_h part[t][h][row] (heads in order: deterministic) to x.
// The sums differ from attn_cluster + the o matvec's by float rounding (another association), not in kind; the host
// takes it only at one token (cuda.py `_attn_o_fused`), LLMRS_ATTN_O_FUSED=0 keeps the two kernels.
#define AO_WARPS 16
#define AO_CK 4   // keys a warp takes at once (a batch of AO_WARPS * AO_CK = 64 keys a block)
// RP: the 16-byte o weight chunks a lane holds (2 * RP rows a warp, at most 2 * RP * AO_WARPS a block): 8 with 8
// splits (256 rows), 16 with 4 (512 rows: the 3B's 2048 in clusters of 4, where 16 clusters of 8 did not fit at once)
template <int CL, int RP, int W>
__device__ __forceinline__ void attn_o_impl(
    const float* __restrict__ q, int q_stride, const bf16_t* __restrict__ k_cache,
    const bf16_t* __restrict__ v_cache, const int* __restrict__ block_tables, int max_blocks,
    const int* __restrict__ token_seq, const int* __restrict__ positions, const bf16_t* __restrict__ wo,
    float* __restrict__ part, int* __restrict__ counts, float* __restrict__ x, int Hq, int Hkv, int N,
    int block_size, float scale) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    constexpr int DPL = 4, D = 128;
    ATTN_CLOCK_START
    pdl_trigger();
    __shared__ float s_m[W], s_l[W], s_e[W], s_M;
    __shared__ __align__(16) float s_acc[W][D];
    __shared__ float p_a[CL][D], p_m[CL], p_l[CL];  // every split's (A, M, L), pushed by the cluster's blocks
    __shared__ __align__(16) float s_att[D];
    __shared__ int s_tbl[ATTN_TABLE_STAGE];
    // the splits' pushes (st.async) complete on each block's mbarrier: initialized before the block arrives at the
    // cluster barrier that every push waits on (no barrier with release after the pushes: its MEMBAR.ALL.GPU)
    __shared__ __align__(8) unsigned long long p_bar;
    if (threadIdx.x == 0) mbar_init(&p_bar, 1);
    cluster_arrive_relaxed();  // this block runs (its shared memory there to push into): waited on before the pushes
    const int t = blockIdx.x, h = blockIdx.y, s = (int)cluster_rank();
    const int g = h / (Hq / Hkv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int L = positions[t] + 1, chunk = (L + CL - 1) / CL;
    const int start = min(L, s * chunk), end = min(L, start + chunk);
    const int* table = block_tables + (size_t)token_seq[t] * max_blocks;
    // the o weights: row r0 + warp * 2 * RP + 2 i + (lane >> 4) of the block's rows, columns h D + 8 (lane & 15)
    const int rpb = N / CL, r0 = s * rpb, K = Hq * D;
    uint4 wr[RP];
    unsigned word = 0u;
#pragma unroll
    for (int i = 0; i < RP; ++i) {
        const int row = warp * 2 * RP + 2 * i + (lane >> 4);
        wr[i] = row < rpb ? ldg_early(reinterpret_cast<const uint4*>(wo + (size_t)(r0 + row) * K + h * D) + (lane & 15))
                          : make_uint4(0u, 0u, 0u, 0u);
        word |= early_word(wr[i]);
    }
#ifdef ATTN_EARLY_KV
    const int pf0 = start + W * AO_CK;
#else
    const int pf0 = start;
#endif
    prefetch_kv_l2(k_cache, v_cache, table, pf0, min(end, L - 1), Hkv, g, block_size, D);
    const int* tb;
    int tb0;
    attn_stage_table(table, s_tbl, start, end, block_size, tb, tb0);
    typename Raw<DPL>::T kr[AO_CK], vr[AO_CK];
    ATTN_O_CLOCK(0)  // entry -> the o weights, the table, the early K / V loads issued
    attn_first_keys<DPL, AO_CK, W>(k_cache, v_cache, tb, tb0, start + warp, end, L - 1 - t, true, Hkv, g,
                                          block_size, D, lane, kr, vr, word);
    ATTN_O_CLOCK(1)  // -> past the PDL wait
    float qr[1][DPL], acc[1][DPL], m, l;
    attn_init<DPL, 1>(q, q_stride, t, h, 1, true, lane, D, scale, qr, acc, m, l);
#pragma unroll 1
    for (int j0 = start + warp; j0 < end; j0 += W * AO_CK) {
        if (j0 != start + warp) {
#pragma unroll
            for (int c = 0; c < AO_CK; ++c)
                load_kv<DPL>(k_cache, v_cache, tb, tb0, j0 + c * W, end, true, Hkv, g, block_size, D, lane,
                             kr[c], vr[c]);
        }
        float dk[AO_CK];
#pragma unroll
        for (int c = 0; c < AO_CK; ++c) {
            float kf[DPL];
            unpack_raw(kr[c], kf);
            float d = 0.0f;
#pragma unroll
            for (int i = 0; i < DPL; ++i) d += qr[0][i] * kf[i];
            dk[c] = d;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {  // the AO_CK butterflies side by side (warp_sum's order for each)
#pragma unroll
            for (int c = 0; c < AO_CK; ++c) dk[c] += __shfl_xor_sync(0xffffffffu, dk[c], o);
        }
#pragma unroll
        for (int c = 0; c < AO_CK; ++c) {
            if (j0 + c * W >= end) break;  // warp-uniform
            float vf[DPL];
            unpack_raw(vr[c], vf);
            const float mn = fmaxf(m, dk[c]);
            const float corr = ATTN_EXP(m - mn), p = ATTN_EXP(dk[c] - mn);
            l = l * corr + p;
            m = mn;
#pragma unroll
            for (int i = 0; i < DPL; ++i) acc[0][i] = acc[0][i] * corr + p * vf[i];
        }
    }
    ATTN_O_CLOCK(2)  // -> q and the keys (warp 0)
    // the block's warps: (m, l, acc) into shared memory, the factors once, then (M, L, A) of dim d by thread d
    if (lane == 0) { s_m[warp] = m; s_l[warp] = l; }
    *reinterpret_cast<float4*>(&s_acc[warp][lane * DPL]) = make_float4(acc[0][0], acc[0][1], acc[0][2], acc[0][3]);
    __syncthreads();
    if ((int)threadIdx.x < W) {
        float M = NEG_INF;
        for (int u = 0; u < W; ++u) M = fmaxf(M, s_m[u]);
        s_e[threadIdx.x] = M != NEG_INF ? expf(s_m[threadIdx.x] - M) : 0.0f;
        if (threadIdx.x == 0) s_M = M;
    }
    __syncthreads();
    ATTN_O_CLOCK(3)  // -> every warp's keys, the block's merge factors
    cluster_wait();  // every block of the cluster runs (arrived at its start: its mbarrier initialized)
    if (threadIdx.x == 0) mbar_arrive_expect(&p_bar, CL * (D + 2) * 4);  // every split's A, M and L
    if ((int)threadIdx.x < D) {
        const int d = threadIdx.x;
        const float M = s_M;
        float Ls = 0.0f, A = 0.0f;
        if (M != NEG_INF) {
            for (int u = 0; u < W; ++u) {
                Ls += s_l[u] * s_e[u];
                A += s_acc[u][d] * s_e[u];
            }
        }
#pragma unroll
        for (int r = 0; r < CL; ++r) {
            st_async_cluster(&p_a[s][d], r, A, &p_bar);
            if (d == 0) { st_async_cluster(&p_m[s], r, M, &p_bar); st_async_cluster(&p_l[s], r, Ls, &p_bar); }
        }
    }
    ATTN_O_CLOCK(4)  // -> the cluster's blocks running, the block's (M, L, A) pushed
    mbar_wait(&p_bar, 0);  // every split's pushes in (each block waits for its own: none leaves while pushed to)
    ATTN_O_CLOCK(5)  // -> every split's pushes in
    if ((int)threadIdx.x < D) {  // the splits, attn_merge's way, in split order: the head's output, dim d
        const int d = threadIdx.x;
        float M = NEG_INF;
#pragma unroll
        for (int r = 0; r < CL; ++r) M = fmaxf(M, p_m[r]);
        float Ls = 0.0f, A = 0.0f;
#pragma unroll
        for (int r = 0; r < CL; ++r) {
            if (p_m[r] == NEG_INF) continue;  // a split with no keys
            const float e = expf(p_m[r] - M);
            Ls += p_l[r] * e;
            A += p_a[r][d] * e;
        }
        s_att[d] = A / Ls;
    }
    __syncthreads();
    ATTN_O_CLOCK(6)  // -> the splits merged: the head's output
    // o: the lane's rows times its 8 columns of the head's output, summed over the half-warp
    const float4 a0 = *reinterpret_cast<const float4*>(&s_att[8 * (lane & 15)]),
                 a1 = *reinterpret_cast<const float4*>(&s_att[8 * (lane & 15) + 4]);
    float y[RP];
#pragma unroll
    for (int i = 0; i < RP; ++i) {
        float wf[8];
        unpack8(wr[i], wf);
        y[i] = wf[0] * a0.x + wf[1] * a0.y + wf[2] * a0.z + wf[3] * a0.w + wf[4] * a1.x + wf[5] * a1.y
               + wf[6] * a1.z + wf[7] * a1.w;
    }
#pragma unroll
    for (int o = 8; o > 0; o >>= 1) {
#pragma unroll
        for (int i = 0; i < RP; ++i) y[i] += __shfl_xor_sync(0xffffffffu, y[i], o);
    }
#ifdef LLMRS_ATTN_O_RED
    // timing probe (LLMRS_CUDA_DEFINES=LLMRS_ATTN_O_RED): every block adds its rows' partial sums straight into x
    // (atomicAdd, compiled to RED.ADD.F32: the heads in whatever order the L2 takes them, so not deterministic), no
    // partials, no count and no last block's sum: what the cross-head reduction's dependent phase costs
    (void)part; (void)counts;
    if ((lane & 15) == 0) {
#pragma unroll
        for (int i = 0; i < RP; ++i) {
            const int row = warp * 2 * RP + 2 * i + (lane >> 4);
            if (row < rpb) atomicAdd(x + (size_t)t * N + r0 + row, y[i]);
        }
    }
    ATTN_O_CLOCK(7)  // -> o's rows added into x
#else
    float* pt = part + ((size_t)t * Hq + h) * N + r0;
    if ((lane & 15) == 0) {
#pragma unroll
        for (int i = 0; i < RP; ++i) {
            const int row = warp * 2 * RP + 2 * i + (lane >> 4);
            if (row < rpb) pt[row] = y[i];
        }
    }
    ATTN_O_CLOCK(7)  // -> o's rows, their partial sums stored
    const bool last = block_counts_last(&counts[t * CL + s], Hq);
    ATTN_O_CLOCK(8)  // -> counted in (block_counts_last: barrier, fence, atomic)
    if (last) {  // the split's rows: every head's partial in, head order
        const float* pr = part + (size_t)t * Hq * N + r0;
        for (int row = threadIdx.x; row < rpb; row += blockDim.x) {
            float v = 0.0f;
            for (int u = 0; u < Hq; ++u) v += __ldcg(pr + (size_t)u * N + row);
            x[(size_t)t * N + r0 + row] += v;
        }
#ifdef LLMRS_ATTN_CLOCKS
        __syncthreads();  // (thread 0's clock after every row; `last` is the block's)
        ATTN_O_CLOCK(9)  // -> the last block's cross-head sum into x
        if (threadIdx.x == 0) atomicAdd(&attn_clocks[13], 1ull);
#endif
    }
#endif
#else
    __trap();
#endif
}

// attn_o_cluster{CL}{NAME}: W warps a block, MINB blocks an SM. _w8: 8 warps, each lane holding 16 chunks of o (256
// rows a block, as the 16-warp form's), two blocks an SM (__launch_bounds__(256, 2): 128 registers), its warps walking
// 32 keys a batch (the 16-warp form 64): the H200 runs 30 of its clusters of 8 at once against 15, so the 3B's 16
// heads all run at once (auto's form there, `CUDABackend._attn_o_form`: 3B 2.045 -> 2.019 ms/token, session 32)
#define ATTN_O_CLUSTER_W(CL, RP, W, MINB, NAME)                                                                      \
    extern "C" __global__ void __launch_bounds__(W * 32, MINB) CLUSTER_DIMS(CL) attn_o_cluster##CL##NAME(            \
        const float* __restrict__ q, int q_stride, const bf16_t* __restrict__ k_cache,                               \
        const bf16_t* __restrict__ v_cache, const int* __restrict__ block_tables, int max_blocks,                    \
        const int* __restrict__ token_seq, const int* __restrict__ positions, const bf16_t* __restrict__ wo,         \
        float* __restrict__ part, int* __restrict__ counts, float* __restrict__ x, int Hq, int Hkv, int N,           \
        int block_size, float scale) {                                                                               \
        attn_o_impl<CL, RP, W>(q, q_stride, k_cache, v_cache, block_tables, max_blocks, token_seq, positions, wo,    \
                               part, counts, x, Hq, Hkv, N, block_size, scale);                                      \
    }
#define ATTN_O_CLUSTER(CL, RP) ATTN_O_CLUSTER_W(CL, RP, AO_WARPS, 1, )
ATTN_O_CLUSTER(4, 16)
ATTN_O_CLUSTER(8, 8)
ATTN_O_CLUSTER_W(8, 16, 8, 2, _w8)
