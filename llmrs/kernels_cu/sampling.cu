// sampling.cu: one launch samples every row of a step's logits [S, V]: grid (S, NB), 1024 threads a block.
//
// Per row r, with the CPU sampler's semantics (llmrs/engine/sampling.py; vLLM's order):
//   greedy (temperature < 1e-5): the argmax, ties to the lowest index (np.argmax);
//   else p_i = exp((x_i - max) / T) (unnormalized, max p = 1), then
//     min_p: keep p_i >= min_p * max p;
//     top_k: keep exactly k largest (ties at the k-th value broken by lowest index);
//     top_p: keep the smallest set of largest p whose mass reaches top_p of the kept mass (ties by index);
//     draw:  the first index whose inclusive prefix mass exceeds u * total, u = uniform[r] drawn on the host from
//            the request's own seeded generator (reproducible, independent of the batch).
//   Non-finite logits (the CPU sampler's rules): a NaN is never picked (every comparison with it is false, its key is
//   0); a +inf maximum leaves every key 0 (inf - inf is NaN), so the row takes its argmax, the first +inf; a row with
//   no logit above -inf has no argmax: out[r] = 0 (a valid id for the next step's feed) and res[r] = -1, which the
//   host reports as that request's error.
// out: the tokens the next step's feed reads on the device; res: the same tokens, -1 for an unsamplable row, what the
// host reads back.
// 1) The max / argmax: the row's NB blocks each take a slice (threads strided: coalesced), the last of them to finish
//    (a counter a row, put back to 0 by that block) merges their partials and goes on alone; NB = 1 for big batches
//    (the host: cuda.kernels.sample_row_blocks). A greedy row is done there.
// 2) A sampled row, in that one block: no weights are stored; every pass recomputes p_i from the logits (expf).
//    The k-th largest key (the float bits of p: p >= 0, so bit order is value order) and top_p's threshold key are
//    found by radix select, 8 bits a pass over bits 30..0 (4 passes), a shared histogram of counts (top_k) or of
//    masses (top_p) a pass. Masses are fixed point, p * 2^31 truncated, summed exactly in 64 bits: the token does
//    not depend on the order the threads add in (a float total would), and the draw is exact too. A bin's mass is
//    two 32-bit words, the high one counting the low one's carries (a 64-bit shared atomicAdd compiles to a
//    compare-and-swap loop; with it, 256 rows' top_p took 3x their top_k on the H200). Index order, for the ties
//    and the draw: warp w owns a contiguous range of the row, its lanes taking 32 consecutive indices a load
//    (coalesced), SAMPLE_E loads in flight; a tie's rank is a ballot away, the draw's prefix a warp scan.
// 3) The candidate list: top_k or top_p keeps only keys in or above the first pass's selected bin (a power of 2 of
//    p: the exponent). Where those are at most SAMPLE_LIST (top_k = 50: ~100; a peaked top_p nucleus), one more
//    pass copies them (logit, index) to shared memory, a bitonic sort puts them in index order, and every later
//    pass, the ties and the draw walk that list instead of the row: 3 reads of the row instead of ~10.
// Roof: no fraction recorded; each kernel's time and % of its bandwidth floor in a real step: `llmrs profile
// --synthetic qwen2.5-7b --batch 1,256 --context 512`.
#include "common.cuh"

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900
#define SAMPLE_E 4  // loads in flight a lane (32 * SAMPLE_E consecutive indices a warp step); 8 spills before sm_90
#else
#define SAMPLE_E 8
#endif
#define SAMPLE_MAX_BLOCKS 32     // blocks a row for the max / argmax (cuda.kernels.SAMPLE_MAX_BLOCKS)
#define SAMPLE_LIST 2048         // candidates held in shared memory (logit, index)
#define FULL_MASK 0xffffffffu

typedef unsigned long long u64;

__device__ __forceinline__ void arg_better(float& bv, int& bi, float ov, int oi) {
    if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
}

__device__ __forceinline__ void warp_argmax(float& bv, int& bi) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(FULL_MASK, bv, o);
        const int oi = __shfl_xor_sync(FULL_MASK, bi, o);
        arg_better(bv, bi, ov, oi);
    }
}

// p's key: the float bits of exp((x - mx) / T) where it passes min_p (mp, as max p = 1), else 0 (NaN: 0)
__device__ __forceinline__ unsigned p_key(float x, float mx, float inv_t, float mp) {
    const float p = expf((x - mx) * inv_t);
    return p >= mp ? __float_as_uint(p) : 0u;
}

// a key's mass in fixed point: p * 2^31 truncated (p <= 1: at most 2^31; a row of V keys sums below 2^31 V)
__device__ __forceinline__ unsigned key_mass(unsigned key) {
    return __float2uint_rz(__uint_as_float(key) * 2147483648.0f);
}

// a histogram bin's 64-bit mass += m, exactly, as two 32-bit words: the low word's carry counted in the high one
__device__ __forceinline__ void add_mass(unsigned* lo, unsigned* hi, unsigned m) {
    const unsigned old = atomicAdd(lo, m);
    if (old + m < old) atomicAdd(hi, 1u);
}

// What a sampled row's passes walk: the row of logits, or the candidate list (logits and their indices in shared
// memory, in index order). value(j), index(j): the j-th element's logit and index.
struct RowSrc {
    const float* __restrict__ x;
    int n;
    __device__ __forceinline__ float value(int j) const { return __ldg(x + j); }
    __device__ __forceinline__ int index(int j) const { return j; }
};
struct ListSrc {
    const float* x;
    const int* idx;
    int n;
    __device__ __forceinline__ float value(int j) const { return x[j]; }
    __device__ __forceinline__ int index(int j) const { return idx[j]; }
};

// The warp layout: warp w owns elements [w * per, (w + 1) * per), per a multiple of 32 * SAMPLE_E; a step loads
// SAMPLE_E x 32 consecutive elements (lane-minor), then calls f(i, valid, x_i) in index order. Every lane of the
// warp calls f at every element (f may ballot).
template <class Src, class F>
__device__ __forceinline__ void walk(const Src& src, F&& f) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int step = 32 * SAMPLE_E;
    const int per = ((src.n + SAMPLE_WARPS - 1) / SAMPLE_WARPS + step - 1) / step * step;
    const int w0 = min(src.n, warp * per), w1 = min(src.n, w0 + per);
    for (int base = w0; base < w1; base += step) {
        float v[SAMPLE_E];
#pragma unroll
        for (int e = 0; e < SAMPLE_E; ++e) {
            const int j = base + 32 * e + lane;
            v[e] = j < w1 ? src.value(j) : NEG_INF;
        }
#pragma unroll
        for (int e = 0; e < SAMPLE_E; ++e) {
            const int j = base + 32 * e + lane;
            f(j < w1 ? src.index(j) : 0, j < w1, v[e]);
        }
    }
}

// A threshold filter: keys above tau pass; of the keys equal to tau, all (cut false) or the first `need` in index
// order (cut: a warp's rank starts at `off`, the ties in the warps before it, and `run` counts on through a walk).
// on false: every key passes.
struct TieCut {
    unsigned tau;
    int need, off, run;
    bool on, cut;
};

__device__ __forceinline__ unsigned tie_cut(TieCut& f, unsigned key) {
    if (!f.on) return key;
    const bool tie = key == f.tau && key != 0u;
    if (f.cut) {  // uniform across the warp
        const unsigned m = __ballot_sync(FULL_MASK, tie);
        const int rank = f.run + __popc(m & ((1u << (threadIdx.x & 31)) - 1u));
        f.run += __popc(m);
        return key > f.tau || (tie && rank < f.need) ? key : 0u;
    }
    return key >= f.tau ? key : 0u;
}

// shared state of the select passes
struct SampleShared {
    unsigned hist_lo[256], hist_hi[256];
    int hist_c[256];
    u64 w_val[SAMPLE_WARPS];
    u64 above, total;
    int sel, ties, count_ge, n_list;
    float list_x[SAMPLE_LIST];
    int list_i[SAMPLE_LIST];
};

// exclusive scan of the 32 warps' values in s.w_val (in place), the sum in s.total; call from every thread
__device__ __forceinline__ void warp_offsets(SampleShared& s) {
    __syncthreads();
    if (threadIdx.x < 32) {
        const u64 v = s.w_val[threadIdx.x];
        u64 incl = v;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u64 n = __shfl_up_sync(FULL_MASK, incl, o);
            if ((int)threadIdx.x >= o) incl += n;
        }
        s.w_val[threadIdx.x] = incl - v;
        if (threadIdx.x == 31) s.total = incl;
    }
    __syncthreads();
}

// The tie offsets of a cut filter: each warp counts the keys equal to f.tau that `keyf` hands it (the filters
// before this one applied; `reset` rewinds their tie counts before a walk), the warps before it give its `off`.
template <class Src, class K, class Z>
__device__ __forceinline__ void tie_offsets(const Src& src, SampleShared& s, TieCut& f, K&& keyf, Z&& reset) {
    int n = 0;
    reset();
    walk(src, [&](int, bool valid, float v) {
        const unsigned key = keyf(v);
        n += __popc(__ballot_sync(FULL_MASK, valid && key == f.tau));
    });
    if ((threadIdx.x & 31) == 0) s.w_val[threadIdx.x >> 5] = (u64)n;
    warp_offsets(s);
    f.off = (int)s.w_val[threadIdx.x >> 5];
    __syncthreads();
}

// Radix select over the keys `keyf` hands out (0: not a candidate): the key tau with weight(keys > tau) < target <=
// weight(keys >= tau), weight = count (MASS false) or fixed-point mass. MASS with frac >= 0: target = frac x the
// total mass (at least 1). Returns a filter keeping exactly that set (its ties cut by index where needed), off where
// every candidate's weight falls short of the target. `reset` rewinds keyf's tie counts before each walk. probe:
// the first pass only, leaving its bin in s.sel (-1: short of the target), the keys in or above it in s.count_ge
// and the target in s.total.
template <bool MASS, class Src, class K, class Z>
__device__ TieCut radix_select(const Src& src, SampleShared& s, u64 target, double frac, K&& keyf, Z&& reset,
                               bool probe = false) {
    const int tid = threadIdx.x, lane = tid & 31;
    unsigned prefix = 0u, mask = 0u;
    int ties = 0;
    for (int pass = 0; pass < 4; ++pass) {
        const int shift = pass < 3 ? 23 - 8 * pass : 0;
        const unsigned dm = pass < 3 ? 0xffu : 0x7fu;
        if (tid < 256) { s.hist_lo[tid] = 0u; s.hist_hi[tid] = 0u; s.hist_c[tid] = 0; }
        if (tid == 0) s.sel = -1;
        __syncthreads();
        reset();
        walk(src, [&](int, bool valid, float v) {
            const unsigned key = keyf(v);
            if (valid && key != 0u && (key & mask) == prefix) {
                const unsigned d = (key >> shift) & dm;
                atomicAdd(&s.hist_c[d], 1);
                if (MASS) add_mass(s.hist_lo + d, s.hist_hi + d, key_mass(key));
            }
        });
        __syncthreads();
        if (tid < 32) {  // the digit where the weight from the top reaches the target; lane l holds bins 8l..8l+7
            u64 h[8], sum = 0;
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                const int d = 8 * lane + e;
                h[e] = MASS ? ((u64)s.hist_hi[d] << 32) + s.hist_lo[d] : (u64)s.hist_c[d];
                sum += h[e];
            }
            u64 incl = sum;  // inclusive suffix sum over the lanes
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const u64 n = __shfl_down_sync(FULL_MASK, incl, o);
                if (lane + o < 32) incl += n;
            }
            if (pass == 0 && MASS && frac >= 0.0) {
                const u64 total = __shfl_sync(FULL_MASK, incl, 0);
                target = (u64)(frac * (double)total);
                target = target < 1 ? 1 : (target > total ? total : target);
            }
            u64 acc = incl - sum;
            int c = 0;  // the counts in the lanes above, for count_ge
            for (int e = 0; e < 8; ++e) c += s.hist_c[8 * lane + e];
            int c_incl = c;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int n = __shfl_down_sync(FULL_MASK, c_incl, o);
                if (lane + o < 32) c_incl += n;
            }
            int c_acc = c_incl - c;
#pragma unroll
            for (int e = 7; e >= 0; --e) {
                c_acc += s.hist_c[8 * lane + e];
                if (acc < target && acc + h[e] >= target) {
                    s.sel = 8 * lane + e;
                    s.above = acc;
                    s.ties = s.hist_c[8 * lane + e];
                    s.count_ge = c_acc;
                }
                acc += h[e];
            }
            if (lane == 0) s.total = target;
        }
        __syncthreads();
        const int sel = s.sel;
        target = s.total;
        if (sel < 0 || probe) {  // probe; or the candidates' weight falls short of the target: all pass
            __syncthreads();
            return TieCut{0u, 0, 0, 0, false, false};
        }
        prefix |= (unsigned)sel << shift;
        mask |= dm << shift;
        target -= s.above;
        ties = s.ties;
        __syncthreads();
    }
    TieCut f{prefix, 0, 0, 0, true, false};
    if (MASS) {  // the ties needed to reach the rest of the target, each weighing key_mass(tau)
        const u64 m = key_mass(prefix);
        f.need = m ? (int)min((u64)ties, (target + m - 1) / m) : ties;
    } else {
        f.need = (int)target;
    }
    f.cut = ties > f.need;
    return f;
}

// min_p, top_k, top_p and the draw over `src` (the row, or its candidate list); k_on / p_on: the filters to run,
// p_target: top_p's target mass where already known (the row's, for a list that top_p cut), else 0 (tp x the
// total of what top_k kept). Returns the token, or -1 where nothing has mass (the caller takes the argmax).
template <class Src>
__device__ int sample_from(const Src& src, SampleShared& s, float mx, float inv_t, float mp, int k, bool k_on,
                           float tp, bool p_on, u64 p_target, float u01) {
    __shared__ int s_pick;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    auto key0 = [&](float v) { return p_key(v, mx, inv_t, mp); };
    TieCut fk{0u, 0, 0, 0, false, false}, fp{0u, 0, 0, 0, false, false};
    auto reset = [&]() { fk.run = fk.off; fp.run = fp.off; };  // each walk counts the ties from its warp's offset
    if (k_on) {
        fk = radix_select<false>(src, s, (u64)k, -1.0, key0, reset);
        if (fk.cut) tie_offsets(src, s, fk, key0, reset);
    }
    auto key1 = [&](float v) { return tie_cut(fk, key0(v)); };
    if (p_on) {
        fp = radix_select<true>(src, s, p_target, p_target ? -1.0 : (double)tp, key1, reset);
        if (fp.cut) tie_offsets(src, s, fp, key1, reset);
    }
    auto key2 = [&](float v) { return tie_cut(fp, key1(v)); };

    // the draw: each warp's kept mass, the warps' offsets, then the warp holding u * total finds the index
    u64 m = 0;
    reset();
    walk(src, [&](int, bool valid, float v) {
        const unsigned key = key2(v);
        m += valid ? key_mass(key) : 0u;
    });
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m += __shfl_xor_sync(FULL_MASK, m, o);
    if (lane == 0) s.w_val[warp] = m;
    if (tid == 0) s_pick = -1;
    warp_offsets(s);
    const u64 total = s.total, off = s.w_val[warp];
    if (total > 0) {
        u64 u = (u64)((double)u01 * (double)total);
        u = u < total ? u : total - 1;
        if (off <= u && u < off + m) {  // this warp's range holds the draw
            u64 run = off;
            reset();
            walk(src, [&](int i, bool valid, float v) {
                const unsigned key = key2(v);  // in every lane: the filters ballot
                const u64 w = valid ? key_mass(key) : 0u;
                u64 incl = w;
#pragma unroll
                for (int o = 1; o < 32; o <<= 1) {
                    const u64 n = __shfl_up_sync(FULL_MASK, incl, o);
                    if (lane >= o) incl += n;
                }
                if (w > 0 && run + incl - w <= u && u < run + incl) s_pick = i;
                run += __shfl_sync(FULL_MASK, incl, 31);
            });
        }
    }
    __syncthreads();
    return s_pick;
}

// the candidate list: the row's elements whose key (min_p applied) is nonzero and in bin `sel` of the first pass
// (bits 30..23) or above, copied in any order, then sorted by index (bitonic, padded to a power of 2 with index
// INT_MAX). Returns their count (the first pass's count_ge: the same keys).
__device__ int build_list(const RowSrc& row, SampleShared& s, int sel, float mx, float inv_t, float mp) {
    const int tid = threadIdx.x;
    if (tid == 0) s.n_list = 0;
    __syncthreads();
    walk(row, [&](int i, bool valid, float v) {
        const unsigned key = p_key(v, mx, inv_t, mp);
        if (valid && key != 0u && (key >> 23) >= (unsigned)sel) {
            const int slot = atomicAdd(&s.n_list, 1);
            if (slot < SAMPLE_LIST) { s.list_x[slot] = v; s.list_i[slot] = i; }
        }
    });
    __syncthreads();
    const int n = min(s.n_list, SAMPLE_LIST);
    int np = 2;
    while (np < n) np <<= 1;
    for (int j = n + tid; j < np; j += SAMPLE_THREADS) { s.list_x[j] = NEG_INF; s.list_i[j] = 0x7fffffff; }
    __syncthreads();
    for (int kk = 2; kk <= np; kk <<= 1) {
        for (int j = kk >> 1; j > 0; j >>= 1) {
            for (int t = tid; t < np / 2; t += SAMPLE_THREADS) {
                const int a = 2 * t - (t & (j - 1)), b = a + j;  // a: bit j clear
                const int ia = s.list_i[a], ib = s.list_i[b];
                if ((ia > ib) == ((a & kk) == 0)) {
                    const float xa = s.list_x[a];
                    s.list_i[a] = ib;
                    s.list_i[b] = ia;
                    s.list_x[a] = s.list_x[b];
                    s.list_x[b] = xa;
                }
            }
            __syncthreads();
        }
    }
    return n;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS) sample_tokens(
    const float* __restrict__ logits, int V, const float* __restrict__ temperature, const int* __restrict__ top_k,
    const float* __restrict__ top_p, const float* __restrict__ min_p, const float* __restrict__ uniform,
    float* __restrict__ part_v, int* __restrict__ part_i, int* __restrict__ sem, int* __restrict__ out,
    int* __restrict__ res) {
    __shared__ SampleShared s;
    __shared__ float s_val[32];
    __shared__ int s_idx[32];
    const int r = blockIdx.x, b = blockIdx.y, nb = gridDim.y, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float* x = logits + (size_t)r * V;

    // 1) max and argmax (first index among equal maxima) of this block's slice, threads strided
    const int chunk = (V + nb - 1) / nb;
    const int lo = min(V, b * chunk), hi = min(V, lo + chunk);
    float bv = NEG_INF;
    int bi = V;
    int i = lo + tid;
    for (; i + 3 * SAMPLE_THREADS < hi; i += 4 * SAMPLE_THREADS) {
        float v[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) v[e] = __ldg(x + i + e * SAMPLE_THREADS);
#pragma unroll
        for (int e = 0; e < 4; ++e)
            if (v[e] > bv) { bv = v[e]; bi = i + e * SAMPLE_THREADS; }
    }
    for (; i < hi; i += SAMPLE_THREADS) {
        const float v = __ldg(x + i);
        if (v > bv) { bv = v; bi = i; }
    }
    warp_argmax(bv, bi);
    if (lane == 0) { s_val[warp] = bv; s_idx[warp] = bi; }
    __syncthreads();
    if (warp == 0) {
        bv = s_val[lane];
        bi = s_idx[lane];
        warp_argmax(bv, bi);
        if (lane == 0) { s_val[0] = bv; s_idx[0] = bi; }
    }
    __syncthreads();
    if (nb > 1) {  // the row's blocks hand over: the last to count in merges the partials
        if (tid == 0) {
            part_v[(size_t)r * nb + b] = s_val[0];
            part_i[(size_t)r * nb + b] = s_idx[0];
        }
        if (!block_counts_last(sem + r, nb)) return;
        if (warp == 0) {
            bv = NEG_INF;
            bi = V;
            if (lane < nb) { bv = __ldcg(part_v + (size_t)r * nb + lane); bi = __ldcg(part_i + (size_t)r * nb + lane); }
            warp_argmax(bv, bi);
            if (lane == 0) { s_val[0] = bv; s_idx[0] = bi; }
        }
        __syncthreads();
    }
    const float mx = s_val[0];
    const int amax = s_idx[0];
    const float temp = temperature[r];
    if (temp < 1e-5f) {
        if (tid == 0) { out[r] = amax < V ? amax : 0; res[r] = amax < V ? amax : -1; }
        return;
    }

    // 2) a sampled row: min_p in the key, then top_k, then top_p over what top_k kept, then the draw
    const float inv_t = 1.0f / temp, mp = min_p[r], tp = top_p[r];
    const int k = top_k[r];
    const bool k_on = k > 0 && k < V, p_on = tp < 1.0f;
    const RowSrc row{x, V};
    int pick = -1;
    bool listed = false;
    if (k_on || p_on) {  // 3) the first filter's first pass over the row: are its candidates few enough to list?
        auto key0 = [&](float v) { return p_key(v, mx, inv_t, mp); };
        auto none = [] {};
        if (k_on) radix_select<false>(row, s, (u64)k, -1.0, key0, none, true);
        else radix_select<true>(row, s, 0, (double)tp, key0, none, true);
        const int sel = s.sel, count_ge = s.count_ge;
        const u64 p_target = k_on ? 0 : s.total;  // top_p alone: the row's target (the list misses lower bins' mass)
        __syncthreads();
        if (sel >= 0 && count_ge <= SAMPLE_LIST) {
            const ListSrc list{s.list_x, s.list_i, build_list(row, s, sel, mx, inv_t, mp)};
            pick = sample_from(list, s, mx, inv_t, mp, k, k_on, tp, p_on, p_target, uniform[r]);
            listed = true;
        }
    }
    if (!listed) pick = sample_from(row, s, mx, inv_t, mp, k, k_on, tp, p_on, 0, uniform[r]);
    if (tid == 0) {
        const int t = pick >= 0 ? pick : amax;
        out[r] = t < V ? t : 0;
        res[r] = t < V ? t : -1;
    }
}
