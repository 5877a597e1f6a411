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
// The one-launch forms: attention_cluster.cu (the splits merged in a thread-block cluster) and attention_o.cu (that,
// fused with the o projection); attention_gqa.cu is attn_partial's decode form.
// Roof: none recorded as a fraction; the kernel's time and % of its bandwidth floor in a step: `llmrs profile
// --synthetic qwen2.5-7b --context 512` (one stream), or tools/bench_kernels_graph.py.
#include "common.cuh"
#include "attention.cuh"

#define ATTN_WARPS 4
// blocks per SM the register budget must allow: 1 (no cap) except head_dim 64, where ptxas's own choice with the
// prefetched K/V row put 4 bytes in local memory on sm_86/sm_89 (ptx-check); 4 (<= 128 registers) fixes it
#define ATTN_MIN_BLOCKS(DPL) ((DPL) == 2 ? 4 : 1)

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
// split block writes one), not ~10 dependent L2 round trips of (m, l) pairs a thread at 33 splits. Past MERGE_STAGE
// splits each thread reads them itself; the arithmetic and its order are the same either way (the same bits).
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
