// sampling.cu: one launch samples every row of a step's logits [S, V] (one 1024-thread block per row).
//
// Per row r, with the CPU sampler's semantics (llmrs/engine/sampling.py; vLLM's order):
//   greedy (temperature < 1e-5): the argmax, ties to the lowest index (np.argmax);
//   else p_i = exp((x_i - max) / T) (unnormalized, max p = 1), then
//     min_p: keep p_i >= min_p * max p;
//     top_k: keep exactly k largest (ties at the k-th value broken by lowest index), 32 radix passes
//            over the float bits of p (p >= 0, so bit order is value order);
//     top_p: keep the smallest set of largest p whose mass reaches top_p of the kept mass (ties by
//            index), found the same way with mass sums instead of counts;
//     draw:  the first index whose inclusive prefix mass exceeds u * total, u = uniform[r] drawn on the
//            host from the request's own seeded generator (reproducible, independent of the batch).
// Thread i owns the contiguous index range [i*per, (i+1)*per): index-ordered scans (ties, the draw) are a
// per-thread prefix plus a block scan. Every sum is a fixed tree: the same input gives the same token.
// `work` [S, V] holds the weights being filtered.
#include "common.cuh"

#define SAMPLE_THREADS 1024

// inclusive scan over the block (blockDim.x == SAMPLE_THREADS); `sh` is __shared__ float[32]
__device__ __forceinline__ float block_scan_incl(float v, float* sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const float n = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v += n;
    }
    __syncthreads();
    if (lane == 31) sh[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float w = sh[lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const float n = __shfl_up_sync(0xffffffffu, w, o);
            if (lane >= o) w += n;
        }
        sh[lane] = w;
    }
    __syncthreads();
    return warp > 0 ? v + sh[warp - 1] : v;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample_tokens(
    const float* __restrict__ logits, int V, const float* __restrict__ temperature, const int* __restrict__ top_k,
    const float* __restrict__ top_p, const float* __restrict__ min_p, const float* __restrict__ uniform,
    float* __restrict__ work, int* __restrict__ out) {
    __shared__ float red[32];
    __shared__ float s_val[32];
    __shared__ int s_idx[32];
    __shared__ int s_pick;
    const int r = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float* x = logits + (size_t)r * V;
    float* w = work + (size_t)r * V;
    const int per = (V + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    const int lo = min(V, tid * per), hi = min(V, lo + per);

    // 1) max and argmax (first index among equal maxima)
    float bv = NEG_INF;
    int bi = V;
    for (int i = lo; i < hi; ++i)
        if (x[i] > bv) { bv = x[i]; bi = i; }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    if (lane == 0) { s_val[warp] = bv; s_idx[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        bv = s_val[lane];
        bi = s_idx[lane];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
        }
        if (lane == 0) { s_val[0] = bv; s_idx[0] = bi; }
    }
    __syncthreads();
    const float mx = s_val[0];
    const int amax = s_idx[0];
    const float temp = temperature[r];
    if (temp < 1e-5f) {
        if (tid == 0) out[r] = amax;
        return;
    }

    // 2) unnormalized probabilities with min_p applied
    const float inv_t = 1.0f / temp, mp = min_p[r];
    for (int i = lo; i < hi; ++i) {
        const float p = expf((x[i] - mx) * inv_t);
        w[i] = p >= mp ? p : 0.0f;
    }
    __syncthreads();

    // 3) top_k: tau = k-th largest key; keep keys > tau and the first (k - count(> tau)) ties
    const int k = top_k[r];
    if (k > 0 && k < V) {
        unsigned prefix = 0;
        for (int bit = 30; bit >= 0; --bit) {
            const unsigned cand = prefix | (1u << bit);
            float c = 0.0f;
            for (int i = lo; i < hi; ++i) c += __float_as_uint(w[i]) >= cand ? 1.0f : 0.0f;
            if (block_sum(c, red) >= (float)k) prefix = cand;
        }
        float gt = 0.0f, ties = 0.0f;
        for (int i = lo; i < hi; ++i) {
            const unsigned key = __float_as_uint(w[i]);
            gt += key > prefix ? 1.0f : 0.0f;
            ties += key == prefix ? 1.0f : 0.0f;
        }
        const float need = (float)k - block_sum(gt, red);
        float rank = block_scan_incl(ties, red) - ties;  // ties before this thread's range
        for (int i = lo; i < hi; ++i) {
            const unsigned key = __float_as_uint(w[i]);
            if (key < prefix) w[i] = 0.0f;
            else if (key == prefix) {
                if (rank >= need) w[i] = 0.0f;
                rank += 1.0f;
            }
        }
        __syncthreads();
    }

    // 4) top_p over the kept mass
    const float tp = top_p[r];
    if (tp < 1.0f) {
        float tot = 0.0f;
        for (int i = lo; i < hi; ++i) tot += w[i];
        const float target = tp * block_sum(tot, red);
        unsigned prefix = 0;
        for (int bit = 30; bit >= 0; --bit) {
            const unsigned cand = prefix | (1u << bit);
            float m = 0.0f;
            for (int i = lo; i < hi; ++i) m += __float_as_uint(w[i]) >= cand ? w[i] : 0.0f;
            if (block_sum(m, red) >= target) prefix = cand;
        }
        const float ptau = __uint_as_float(prefix);
        float gt = 0.0f, ties = 0.0f;
        for (int i = lo; i < hi; ++i) {
            const unsigned key = __float_as_uint(w[i]);
            gt += key > prefix ? w[i] : 0.0f;
            ties += key == prefix ? 1.0f : 0.0f;
        }
        const float mass_gt = block_sum(gt, red);
        const float need = ptau > 0.0f ? fmaxf(1.0f, ceilf((target - mass_gt) / ptau)) : 0.0f;
        float rank = block_scan_incl(ties, red) - ties;
        for (int i = lo; i < hi; ++i) {
            const unsigned key = __float_as_uint(w[i]);
            if (key < prefix) w[i] = 0.0f;
            else if (key == prefix) {
                if (rank >= need) w[i] = 0.0f;
                rank += 1.0f;
            }
        }
        __syncthreads();
    }

    // 5) inverse-CDF draw in index order
    float c = 0.0f;
    int last = -1;
    for (int i = lo; i < hi; ++i) {
        c += w[i];
        if (w[i] > 0.0f) last = i;
    }
    if (tid == 0) s_pick = V;
    const float incl = block_scan_incl(c, red);
    const float total = red[31];  // the scan leaves the block total in the last slot
    const float before = incl - c;
    const float u = uniform[r] * total;
    if (c > 0.0f && before <= u && u < incl) {
        float run = before;
        int pick = last;
        for (int i = lo; i < hi; ++i) {
            run += w[i];
            if (w[i] > 0.0f && run > u) { pick = i; break; }
        }
        atomicMin(&s_pick, pick);
    }
    // rounding left u past every prefix: the last index with mass
    int lastmax = last;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) lastmax = max(lastmax, __shfl_xor_sync(0xffffffffu, lastmax, o));
    if (lane == 0) s_idx[warp] = lastmax;
    __syncthreads();
    if (tid == 0) {
        int lm = -1;
        for (int i = 0; i < SAMPLE_THREADS / 32; ++i) lm = max(lm, s_idx[i]);
        out[r] = s_pick < V ? s_pick : (lm >= 0 ? lm : amax);
    }
}
