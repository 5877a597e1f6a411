// prefill_attention.cu: causal prefill attention over the paged bf16 KV cache on tensor cores
// (flash-attention-2 style: Q tile resident, K/V tiles streamed, online softmax, one pass).
//
// Computes, for the query rows of one work tile (up to 64 consecutive new tokens of ONE sequence, listed on
// the host by cuda.prefill.plan_prefill_tiles) and one query head h:
//   out[t, h] = softmax(scale * q[t, h] . K[0:L_t]) V[0:L_t],   L_t = positions[t] + 1 (causal),
// with K, V of kv head h / G read through the sequence's block table (key j: block
// block_tables[seq, j / bs], offset j % bs of the [blocks, Hkv, bs, D] cache layout), as attn_partial does.
//
// Grid (Hq, n_tiles), 4 warps. One CTA = one query head x one tile: the G query heads of a kv head are
// neighbouring blockIdx.x, so they run together and their K/V tiles come from L2 after the first reader
// (the choice made blind to measurement: packing the G heads into the 64 MMA rows would share K/V loads in
// shared memory but mixes causal limits per row; for prefill the kernel is bound by the MMAs, not by K/V).
// Tiles come sorted longest key range first (the plan does it), so the long causal tiles start first.
//
// Per CTA: Q [64 rows, D] f32 -> bf16 into shared memory, then into registers as mma A fragments (warp w owns
// rows 16w..16w+15). Keys are walked in tiles of 64 from key 0 up to the tile's last position: K and V tiles
// [64, D] bf16 are brought by cp.async (16 bytes a copy, zero-filled past the sequence's last key) into two
// stages of shared memory, the next tile's copies in flight while this one is computed. Rows of D bf16 are
// stored in 16-byte chunks XOR-swizzled by (row & 7), so that ldmatrix (8 rows of one chunk column) and the
// cp.async stores are bank-conflict-free without padding. S = Q K^T: mma.sync m16n8k16 bf16 -> f32, K as the
// "col" operand straight from ldmatrix; online softmax in f32 on the accumulators (exp2 with the scale
// pre-multiplied by log2 e; row max/sum over the 4 lanes of a quad); P is repacked as bf16 A fragments in
// registers (the C layout of two n8 tiles is the A layout of one k16 step) and O += P V with V through
// ldmatrix.trans. The causal mask is applied only on tiles that reach past the warp's first row position;
// those (diagonal) tiles also skip the MMAs of 16-key groups past the warp's last row, in a second copy of
// the tile step, since the guards cost the unmasked tiles ~40% at long prompts when shared.
// Q's staging buffer is the second K stage: it is read into registers before the first barrier of the loop,
// and only after that barrier is the second tile copied there.
//
// Shared memory (dynamic): 2 stages x (K + V) x 64 x D bf16 = 32 KB (D 64) / 64 KB (D 128): the launch sets
// the >48 KB opt-in. Registers (D 128): O 64 + S 32 + Q fragments 32 f32/b32 per thread; ptx-check (NVRTC
// 13.5): 236-247 registers for D 128 (2 CTAs an SM), 157-164 for D 64, no spills on sm_80/86/89/90
// (__launch_bounds__(128, 1): without the 1, ptxas held D 64 on sm_80 to 128 registers and spilled).
// H200, 28/4 heads, D 128, one prompt: 2048 tokens 143 us (211 TFLOP/s), 4096 500 us (241 TFLOP/s);
// attn_partial took 6.2 / 23.9 ms (tests/test_prefill_attention_gpu.py prints the sweep).
// Numerics: Q and P are rounded to bf16 for the tensor cores (the row sums l use the f32 P); accumulation f32.
// sm_80+ (mma bf16, cp.async, ldmatrix); compiled to an empty body below sm_80 so the module still loads.
// Roof (H200): prefill_attn 211-241 TFLOP/s at 2048-4096 prompt tokens (about a quarter of the dense bf16 roof);
// decode_attn_tc 70% of the bandwidth roof at 256 decodes (7B, context 512).
#include "common.cuh"

#define PF_BQ 64       // query rows per CTA
#define PF_BK 64       // keys per tile
#define PF_THREADS 128  // 4 warps x 16 rows

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
#define PF_HAVE_MMA 1
#else
#define PF_HAVE_MMA 0
#endif

__device__ __forceinline__ void ldmatrix_x4(unsigned* r, unsigned addr) {
#if PF_HAVE_MMA
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, unsigned addr) {
#if PF_HAVE_MMA
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));
#endif
}

// c[4] += A (16x16 bf16, a[4]) x B (16x8 bf16, b0 b1), f32 accumulate
__device__ __forceinline__ void mma_bf16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
#if PF_HAVE_MMA
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                 "{%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// two f32 -> one b32 of two bf16 (lo in the low half), round to nearest even (as f32_to_bf16)
__device__ __forceinline__ unsigned pack_bf16x2(float lo, float hi) {
    unsigned r = 0;
#if PF_HAVE_MMA
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
#endif
    return r;
}

template <bool B>
struct BoolC {
    static constexpr bool value = B;
};

// byte offset of 16-byte chunk `chunk` of row `row` in a [rows, D] bf16 tile, XOR-swizzled by row & 7
template <int D>
__device__ __forceinline__ int swz(int row, int chunk) {
    return row * (D * 2) + ((chunk ^ (row & 7)) << 4);
}

// One tile's online-softmax update for the two rows (r, r + 8) a lane holds in the m16n8 C fragments `s` (NT n8
// key tiles of raw scores, scaled by scale_log2 here): the row maxima over the quad's 4 lanes, the running maxima
// m0 / m1 (log2 units) and the lane's partial sums l0 / l1 rescaled, s turned into p = exp2(s * scale - m), and
// the O accumulator's DT n8 tiles rescaled. The caller makes sure each row's maximum is finite (a key in range).
// LAZY (decode_attn_tc): the O rescale is skipped when no row of the warp's 16 changed its maximum (every factor
// exp2(0) = 1 exactly: the same bits), which after the first tiles is most of them.
template <int NT, int DT, bool LAZY = false>
__device__ __forceinline__ void online_softmax(float (&s)[NT][4], float (&o)[DT][4], float& m0, float& m1,
                                               float& l0, float& l1, float scale_log2) {
    float mx0 = fmaxf(s[0][0], s[0][1]), mx1 = fmaxf(s[0][2], s[0][3]);
#pragma unroll
    for (int nt = 1; nt < NT; ++nt) {
        mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
        mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
    mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
    mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
    const float mn0 = fmaxf(m0, mx0 * scale_log2), mn1 = fmaxf(m1, mx1 * scale_log2);
    const float corr0 = exp2f(m0 - mn0), corr1 = exp2f(m1 - mn1);
    m0 = mn0;
    m1 = mn1;
    float sum0 = 0.0f, sum1 = 0.0f;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        s[nt][0] = exp2f(fmaf(s[nt][0], scale_log2, -mn0));
        s[nt][1] = exp2f(fmaf(s[nt][1], scale_log2, -mn0));
        s[nt][2] = exp2f(fmaf(s[nt][2], scale_log2, -mn1));
        s[nt][3] = exp2f(fmaf(s[nt][3], scale_log2, -mn1));
        sum0 += s[nt][0] + s[nt][1];
        sum1 += s[nt][2] + s[nt][3];
    }
    l0 = l0 * corr0 + sum0;  // per-lane partial sums; the quad adds them up at the end
    l1 = l1 * corr1 + sum1;
    if (LAZY && !__any_sync(0xffffffffu, corr0 != 1.0f || corr1 != 1.0f)) return;
#pragma unroll
    for (int d = 0; d < DT; ++d) {
        o[d][0] *= corr0; o[d][1] *= corr0;
        o[d][2] *= corr1; o[d][3] *= corr1;
    }
}

// OUT_BF16: out holds bf16 words (the o projection's cuBLAS input, written here instead of f32 + cast_f32_bf16:
// f32_to_bf16 of the very f32 value, the same bits as the cast)
template <int D, bool OUT_BF16>
__device__ __forceinline__ void prefill_attn_impl(
    const float* __restrict__ q, int q_stride, const bf16_t* __restrict__ k_cache,
    const bf16_t* __restrict__ v_cache, const int* __restrict__ block_tables, int max_blocks,
    const int* __restrict__ positions, const int* __restrict__ tiles, void* __restrict__ out, int Hq, int Hkv,
    int bs_shift, float scale_log2) {
#if PF_HAVE_MMA
    constexpr int CH = D / 8;        // 16-byte chunks per row
    constexpr int KS = D / 16;       // k16 steps over D (S = Q K^T)
    constexpr int DT = D / 8;        // n8 tiles over D (O)
    constexpr int NT = PF_BK / 8;    // n8 tiles over the keys of a tile (S)
    constexpr int TILE_BYTES = PF_BK * D * 2;
    extern __shared__ __align__(128) unsigned char smem[];
    const unsigned s_base = smem_addr(smem);
    // [K stage 0][K stage 1 = Q staging][V stage 0][V stage 1]
    const unsigned sK0 = s_base, sV0 = s_base + 2 * TILE_BYTES;

    const int h = blockIdx.x;
    // the plan row (4 int32, not int4: the host may pack it at any offset of a bigger index array)
    const int* tl = tiles + 4 * blockIdx.y;
    const int seq = tl[0], t0 = tl[1], n = tl[2], kv_len = tl[3];  // kv_len = positions[t0 + n - 1] + 1
    const int g = h / (Hq / Hkv);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int* table = block_tables + (size_t)seq * max_blocks;
    const int bs_mask = (1 << bs_shift) - 1;
    const int n_kv = (kv_len + PF_BK - 1) / PF_BK;

    // K/V tile `it` -> stage `st`: each thread copies (PF_BK * CH / PF_THREADS) 16-byte chunks of K and of V
    auto load_kv = [&](int it, int st) {
        const int kv0 = it * PF_BK;
#pragma unroll
        for (int i = 0; i < PF_BK * CH / PF_THREADS; ++i) {
            const int idx = tid + i * PF_THREADS;
            const int r = idx / CH, c = idx % CH, j = kv0 + r;
            size_t off = 0;
            if (j < kv_len)
                off = ((((size_t)table[j >> bs_shift] * Hkv + g) << bs_shift) + (j & bs_mask)) * D + c * 8;
            const int bytes = j < kv_len ? 16 : 0;  // 0: zero-fill (keys past the end: masked, but V must be finite)
            const unsigned so = (unsigned)(st * TILE_BYTES + swz<D>(r, c));
            cp_async16(sK0 + so, k_cache + off, bytes);
            cp_async16(sV0 + so, v_cache + off, bytes);
        }
        cp_async_commit();
    };

    load_kv(0, 0);

    // Q rows t0 .. t0+n-1 (rows past n: zeros) -> bf16 into the K stage 1 buffer
    {
        unsigned char* sQ = smem + TILE_BYTES;
        const float* qh = q + (size_t)h * D;
#pragma unroll 4
        for (int i = 0; i < PF_BQ * D / 4 / PF_THREADS; ++i) {
            const int idx = tid + i * PF_THREADS;
            const int r = idx / (D / 4), c4 = idx % (D / 4);
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r < n) v = *reinterpret_cast<const float4*>(qh + (size_t)(t0 + r) * q_stride + c4 * 4);
            uint2 w;
            w.x = pack_bf16x2(v.x, v.y);
            w.y = pack_bf16x2(v.z, v.w);
            *reinterpret_cast<uint2*>(sQ + swz<D>(r, c4 >> 1) + (c4 & 1) * 8) = w;
        }
    }
    __syncthreads();

    // this warp's 16 rows of Q as A fragments, all k16 steps over D
    unsigned qf[KS][4];
    {
        const int r = warp * 16 + (lane & 15);
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) ldmatrix_x4(qf[kk], sK0 + TILE_BYTES + swz<D>(r, 2 * kk + (lane >> 4)));
    }

    const int grp = lane >> 2, tig = lane & 3;
    const int r0 = warp * 16 + grp;  // this thread's rows: r0 and r0 + 8 (rows past n repeat row n-1's limit)
    const int lim0 = positions[t0 + min(r0, n - 1)], lim1 = positions[t0 + min(r0 + 8, n - 1)];
    const int warp_pos_min = positions[t0 + min(warp * 16, n - 1)];
    const int warp_pos_max = positions[t0 + min(warp * 16 + 15, n - 1)];
    const bool warp_active = warp * 16 < n;

    float o[DT][4];
#pragma unroll
    for (int d = 0; d < DT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;

    // per-lane parts of the ldmatrix addresses (row & 7 == lane & 7 in both, so the swizzle is per lane)
    const int k_row = (lane & 7) + ((lane >> 4) << 3), k_chunk = (lane >> 3) & 1;  // K: 16 keys x 2 chunks
    const int v_row = lane & 15, v_chunk = lane >> 4;                                // V: 16 keys x 2 chunks

    for (int it = 0; it < n_kv; ++it) {
        cp_async_wait<0>();
        __syncthreads();  // tile it landed for all; everyone is done with tile it-1 (and with Q's staging)
        if (it + 1 < n_kv) load_kv(it + 1, (it + 1) & 1);
        if (!warp_active) continue;
        const unsigned sK = sK0 + (it & 1) * TILE_BYTES, sV = sV0 + (it & 1) * TILE_BYTES;
        const int kv0 = it * PF_BK;
        // the last 16-key group of this tile that any row of the warp sees (< 3 only on the diagonal: the
        // groups past it are fully masked, so a masked tile skips their MMAs; the mask sets them to -inf)
        const int kmax = min(PF_BK / 16 - 1, (warp_pos_max - kv0) >> 4);
        // one tile; MASKED: a diagonal tile (causal mask, MMAs of fully masked 16-key groups skipped). Two
        // copies: the guards inside the unrolled loops cost the unmasked tiles ~40% at long prompts.
        auto tile_step = [&](auto masked_tag) {
            constexpr bool MASKED = decltype(masked_tag)::value;

            // S = Q K^T for 16 rows x 64 keys
            float s[NT][4];
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KS; ++kk) {
#pragma unroll
                for (int np = 0; np < NT / 2; ++np) {
                    if (!MASKED || np <= kmax) {
                        unsigned b[4];
                        ldmatrix_x4(b, sK + swz<D>(np * 16 + k_row, 2 * kk + k_chunk));
                        mma_bf16(s[2 * np], qf[kk], b[0], b[1]);
                        mma_bf16(s[2 * np + 1], qf[kk], b[2], b[3]);
                    }
                }
            }
            // causal mask: only where the tile reaches past this warp's first row (also covers zero-filled keys)
            if constexpr (MASKED) {
#pragma unroll
                for (int nt = 0; nt < NT; ++nt) {
                    const int key = kv0 + nt * 8 + tig * 2;
                    if (key > lim0) s[nt][0] = NEG_INF;
                    if (key + 1 > lim0) s[nt][1] = NEG_INF;
                    if (key > lim1) s[nt][2] = NEG_INF;
                    if (key + 1 > lim1) s[nt][3] = NEG_INF;
                }
            }
            // online softmax (row max over the quad's 4 lanes); key 0 is in tile 0 for every row, so m is finite
            // from the first tile on and a fully masked row of a later tile only gets p = 0
            online_softmax<NT, DT>(s, o, m0, m1, l0, l1, scale_log2);
            // O += P V: P's C fragments of n8 tiles 2kk, 2kk+1 are the A fragment of k16 step kk
#pragma unroll
            for (int kk = 0; kk < PF_BK / 16; ++kk) {
                if (MASKED && kk > kmax) continue;  // P is 0 there
                unsigned a[4];
                a[0] = pack_bf16x2(s[2 * kk][0], s[2 * kk][1]);
                a[1] = pack_bf16x2(s[2 * kk][2], s[2 * kk][3]);
                a[2] = pack_bf16x2(s[2 * kk + 1][0], s[2 * kk + 1][1]);
                a[3] = pack_bf16x2(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
                for (int np = 0; np < DT / 2; ++np) {
                    unsigned b[4];
                    ldmatrix_x4_trans(b, sV + swz<D>(kk * 16 + v_row, 2 * np + v_chunk));
                    mma_bf16(o[2 * np], a, b[0], b[1]);
                    mma_bf16(o[2 * np + 1], a, b[2], b[3]);
                }
            }
        };
        if (kv0 + PF_BK - 1 > warp_pos_min) tile_step(BoolC<true>{});
        else tile_step(BoolC<false>{});
    }

    if (!warp_active) return;
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    const float inv0 = 1.0f / l0, inv1 = 1.0f / l1;
    const size_t row_stride = (size_t)Hq * D;
    const size_t off0 = (size_t)(t0 + r0) * row_stride + (size_t)h * D + tig * 2, off1 = off0 + 8 * row_stride;
    const bool w0 = r0 < n, w1 = r0 + 8 < n;
#pragma unroll
    for (int d = 0; d < DT; ++d) {
        const float a0 = o[d][0] * inv0, a1 = o[d][1] * inv0, b0 = o[d][2] * inv1, b1 = o[d][3] * inv1;
        if (OUT_BF16) {
            unsigned* ob = reinterpret_cast<unsigned*>(static_cast<bf16_t*>(out) + d * 8);
            if (w0) ob[off0 / 2] = bf16x2(a0, a1);
            if (w1) ob[off1 / 2] = bf16x2(b0, b1);
        } else {
            float* of = static_cast<float*>(out) + d * 8;
            if (w0) *reinterpret_cast<float2*>(of + off0) = make_float2(a0, a1);
            if (w1) *reinterpret_cast<float2*>(of + off1) = make_float2(b0, b1);
        }
    }
#endif
}

#define PREFILL_ATTN(D, NAME, OUT_BF16, OUT_T)                                                                 \
    extern "C" __global__ void __launch_bounds__(PF_THREADS, 1) NAME(                                           \
        const float* __restrict__ q, int q_stride, const bf16_t* __restrict__ k_cache,                         \
        const bf16_t* __restrict__ v_cache, const int* __restrict__ block_tables, int max_blocks,              \
        const int* __restrict__ positions, const int* __restrict__ tiles, OUT_T* __restrict__ out, int Hq,     \
        int Hkv, int bs_shift, float scale_log2) {                                                             \
        prefill_attn_impl<D, OUT_BF16>(q, q_stride, k_cache, v_cache, block_tables, max_blocks, positions,     \
                                       tiles, out, Hq, Hkv, bs_shift, scale_log2);                             \
    }
PREFILL_ATTN(64, prefill_attn_d64, false, float)
PREFILL_ATTN(128, prefill_attn_d128, false, float)
PREFILL_ATTN(64, prefill_attn_bf16_d64, true, bf16_t)
PREFILL_ATTN(128, prefill_attn_bf16_d128, true, bf16_t)

// ---------------------------------------------------------------------------------------------------------------
// decode_attn_tc: decode attention on tensor cores for grouped-query heads, the batched decode step's attention
// (the backend's dispatch: from a few tokens a step, and for small heads from one). A drop-in for attention.cu's
// attn_partial (same q / cache / index arguments, the same outputs: `out` with one split, else the (acc, m, l)
// partials attn_merge combines) for any tokens of a step, each with its own causal limit.
// Roof (H200, 7B, 256 decodes at context 512): 70% of the bandwidth roof (attn_partial_gqa: 28%).
//
// Why: attn_partial_gqa's lane per key does 8 heads x 128 FMAs per key from shared-memory broadcasts, so that kernel
// is bound by issue and load latency, not by its 134 MB of K/V a layer. Here the G <= 16 query heads of one KV
// head are the 16 rows of an m16n8k16 MMA (rows past G are zeros; all rows share the token's causal limit, which
// is what keeps the prefill kernel from packing heads), so S = Q K^T and O += P V are 32 MMAs per 16 keys.
//
// Grid (T, Hkv, splits), 4 warps. Block (t, g, s) owns keys [s*chunk, min(L_t, (s+1)*chunk)) of token t, kv head
// g; its warps take 16-key tiles round robin (warp w: tiles w, w+4, ...), each warp a flash-decoding worker of its
// own: K and V tiles [16, D] bf16 copied by cp.async into the warp's two stages (the next tile in flight while this
// one is computed; keys past the range zero-filled and masked to -inf), Q's 16 rows as A fragments in registers
// (f32 -> bf16 once, staged through shared memory), scores and P.V as in prefill_attn (exp2 with the scale
// pre-multiplied by log2 e; P rounded to bf16 for the MMA, the row sums l from the f32 P). The 4 warps then merge
// through shared memory (overlaying their stages) as attn_partial's warps do; partials carry m in natural-log units
// (m_log2 * ln 2), as attn_merge expects. Dynamic shared memory: 4 warps x 2 stages x (K + V) x 16 x D bf16 + Q
// 16 x D bf16 = 68 KB (D 128) / 34 KB (D 64). Numerics as prefill_attn: Q and P in bf16, f32 accumulation.
// Two K / V stages a warp: a third (two tiles in flight) measured no faster in the graphed step. The q / k / v bias,
// RoPE and the cache write stay in rope_write_kv: in this kernel's prologue they delay each block's loads and
// measured slower. One block-table read a tile and constant offsets keep the tile loop at ~300 executed SASS
// instructions (the O rescale skipped when no maximum moved).
#define DT_WARPS 4
#define DT_BK 16  // keys per warp tile
#define DT_LN2 0.6931471805599453f

// OUT_BF16 (one split only): out holds bf16 words, as prefill_attn_impl's
template <int D, bool OUT_BF16>
__device__ __forceinline__ void decode_attn_tc_impl(
    const float* __restrict__ q, int q_stride, const bf16_t* __restrict__ k_cache,
    const bf16_t* __restrict__ v_cache, const int* __restrict__ block_tables, int max_blocks,
    const int* __restrict__ token_seq, const int* __restrict__ positions, void* __restrict__ out,
    float* __restrict__ part_acc, float* __restrict__ part_ml, int Hq, int Hkv, int bs_shift, int chunk,
    float scale_log2) {
    pdl_trigger();
#if PF_HAVE_MMA
    constexpr int CH = D / 8;                   // 16-byte chunks per row
    constexpr int KS = D / 16;                  // k16 steps over D (S = Q K^T)
    constexpr int DT = D / 8;                   // n8 tiles over D (O)
    constexpr int TB = DT_BK * D * 2;           // bytes of one K (or V) tile
    constexpr int WARP_BYTES = 2 * 2 * TB;      // a warp's two stages of K and V
    extern __shared__ __align__(128) unsigned char smem[];
    const unsigned s_base = smem_addr(smem);
    const int t = blockIdx.x, g = blockIdx.y, S = gridDim.z, s = blockIdx.z;
    const int G = Hq / Hkv;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const unsigned sW = s_base + warp * WARP_BYTES;  // this warp's [K0][V0][K1][V1]
    const int qoff = DT_WARPS * WARP_BYTES;          // Q staging: [16 rows, D] bf16, swizzled
    const int L = positions[t] + 1;
    const int start = s * chunk, end = min(L, start + chunk);
    const int* table = block_tables + (size_t)token_seq[t] * max_blocks;
    const int bs_mask = (1 << bs_shift) - 1;
    const int n_tiles = end > start ? (end - start + DT_BK - 1) / DT_BK : 0;
    const int my_tiles = n_tiles > warp ? (n_tiles - warp + DT_WARPS - 1) / DT_WARPS : 0;
    pdl_wait();  // q and this token's K/V row are the previous kernels'

    // this warp's tile i -> stage st: a lane copies (DT_BK * CH / 32) 16-byte chunks of K and of V, rows
    // r_lane + u * RPU, chunk c_lane. Every tile lies in one cache block (the host's rule, decode_tc_supported /
    // decode_attention_tc: blocks of a multiple of DT_BK tokens, each split's range starting on a multiple of
    // DT_BK), so a tile reads the block table once, and each chunk's source and swizzled destination are constant
    // offsets from the lane's ((r_lane + u RPU) & 7 is r_lane ^ (u RPU & 7), as r_lane < RPU).
    constexpr int RPU = 32 / CH;
    const int r_lane = lane / CH, c_lane = lane % CH;
    const unsigned s_lane = sW + (unsigned)(r_lane * (D * 2)), x_lane = (unsigned)(c_lane ^ r_lane);
    const int g_lane = r_lane * D + c_lane * 8;
    auto load_tile = [&](int i, int st) {
        const int kv0 = start + (warp + i * DT_WARPS) * DT_BK;
        const size_t base = ((((size_t)__ldg(table + (kv0 >> bs_shift)) * Hkv + g) << bs_shift)
                             + (kv0 & bs_mask)) * D + g_lane;
        const bf16_t* kp = k_cache + base;
        const bf16_t* vp = v_cache + base;
        const int rows = end - kv0;
        const unsigned sb = s_lane + (unsigned)(st * 2 * TB);
#pragma unroll
        for (int u = 0; u < DT_BK * CH / 32; ++u) {
            const unsigned so = sb + (unsigned)(u * RPU * (D * 2)) + ((x_lane ^ (unsigned)((u * RPU) & 7)) << 4);
            const int bytes = r_lane + u * RPU < rows ? 16 : 0;  // keys past the range: zero-filled, masked below
            cp_async16(so, kp + u * RPU * D, bytes);
            cp_async16(so + TB, vp + u * RPU * D, bytes);
        }
        cp_async_commit();
    };
    if (my_tiles > 0) load_tile(0, 0);

    // Q: rows r < G are heads g * G + r of token t (f32 -> bf16); rows G..15 zeros
    for (int idx = tid; idx < 16 * D / 4; idx += blockDim.x) {
        const int r = idx / (D / 4), c4 = idx % (D / 4);
        float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (r < G) v = *reinterpret_cast<const float4*>(q + (size_t)t * q_stride + (size_t)(g * G + r) * D + c4 * 4);
        uint2 w;
        w.x = pack_bf16x2(v.x, v.y);
        w.y = pack_bf16x2(v.z, v.w);
        *reinterpret_cast<uint2*>(smem + qoff + swz<D>(r, c4 >> 1) + (c4 & 1) * 8) = w;
    }
    __syncthreads();
    unsigned qf[KS][4];
#pragma unroll
    for (int kk = 0; kk < KS; ++kk) ldmatrix_x4(qf[kk], s_base + qoff + swz<D>(lane & 15, 2 * kk + (lane >> 4)));

    const int grp = lane >> 2, tig = lane & 3;  // this lane's rows grp, grp + 8; keys 2 tig, 2 tig + 1 of an n8 tile
    const int k_row = (lane & 7) + ((lane >> 4) << 3), k_chunk = (lane >> 3) & 1;  // ldmatrix: 16 keys x 2 chunks
    const int v_row = lane & 15, v_chunk = lane >> 4;
    float o[DT][4];
#pragma unroll
    for (int d = 0; d < DT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    float m0 = NEG_INF, m1 = NEG_INF, l0 = 0.0f, l1 = 0.0f;

    for (int i = 0; i < my_tiles; ++i) {
        if (i + 1 < my_tiles) {
            load_tile(i + 1, (i + 1) & 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncwarp();  // tile i's copies (every lane's) are visible to the warp
        const unsigned sK = sW + (unsigned)((i & 1) * 2 * TB), sV = sK + TB;
        const int kv0 = start + (warp + i * DT_WARPS) * DT_BK;
        float sc[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < KS; ++kk) {
            unsigned b[4];
            ldmatrix_x4(b, sK + swz<D>(k_row, 2 * kk + k_chunk));
            mma_bf16(sc[0], qf[kk], b[0], b[1]);
            mma_bf16(sc[1], qf[kk], b[2], b[3]);
        }
        if (kv0 + DT_BK > end) {  // the range's last tile: keys past it (zero-filled) get no weight
#pragma unroll
            for (int nt = 0; nt < 2; ++nt) {
                const int key = kv0 + nt * 8 + tig * 2;
                if (key >= end) sc[nt][0] = sc[nt][2] = NEG_INF;
                if (key + 1 >= end) sc[nt][1] = sc[nt][3] = NEG_INF;
            }
        }
        // online softmax; the tile's first key is in range, so the row maxima are finite
        online_softmax<2, DT, true>(sc, o, m0, m1, l0, l1, scale_log2);
        // O += P V: the C fragments of the two n8 key tiles are the A fragment of the tile's k16 step
        unsigned a[4];
        a[0] = pack_bf16x2(sc[0][0], sc[0][1]);
        a[1] = pack_bf16x2(sc[0][2], sc[0][3]);
        a[2] = pack_bf16x2(sc[1][0], sc[1][1]);
        a[3] = pack_bf16x2(sc[1][2], sc[1][3]);
#pragma unroll
        for (int np = 0; np < DT / 2; ++np) {
            unsigned b[4];
            ldmatrix_x4_trans(b, sV + swz<D>(v_row, 2 * np + v_chunk));
            mma_bf16(o[2 * np], a, b[0], b[1]);
            mma_bf16(o[2 * np + 1], a, b[2], b[3]);
        }
        __syncwarp();  // done with this stage before the copy of tile i + 2 lands in it
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);

    // merge the warps (a warp without tiles has m = -inf, l = 0, o = 0): [warp][16 rows][D] f32 + (m, l) pairs,
    // over the stages
    __syncthreads();
    float* s_o = reinterpret_cast<float*>(smem);
    float* s_ml = s_o + DT_WARPS * 16 * D;
#pragma unroll
    for (int d = 0; d < DT; ++d) {
        float* r0p = s_o + (warp * 16 + grp) * D + d * 8 + tig * 2;
        r0p[0] = o[d][0];
        r0p[1] = o[d][1];
        r0p[8 * D] = o[d][2];
        r0p[8 * D + 1] = o[d][3];
    }
    if (tig == 0) {
        s_ml[2 * (warp * 16 + grp)] = m0;
        s_ml[2 * (warp * 16 + grp) + 1] = l0;
        s_ml[2 * (warp * 16 + grp + 8)] = m1;
        s_ml[2 * (warp * 16 + grp + 8) + 1] = l1;
    }
    __syncthreads();
    for (int idx = tid; idx < G * D; idx += blockDim.x) {
        const int r = idx / D, d = idx % D;
        float M = NEG_INF;
#pragma unroll
        for (int w = 0; w < DT_WARPS; ++w) M = fmaxf(M, s_ml[2 * (w * 16 + r)]);
        float Ls = 0.0f, A = 0.0f;
        if (M != NEG_INF) {
#pragma unroll
            for (int w = 0; w < DT_WARPS; ++w) {
                const float e = exp2f(s_ml[2 * (w * 16 + r)] - M);
                Ls += s_ml[2 * (w * 16 + r) + 1] * e;
                A += s_o[(w * 16 + r) * D + d] * e;
            }
        }
        const int head = g * G + r;
        if (S == 1) {
            const size_t oi = (size_t)t * Hq * D + (size_t)head * D + d;
            if (OUT_BF16) static_cast<bf16_t*>(out)[oi] = f32_to_bf16(A / Ls);
            else static_cast<float*>(out)[oi] = A / Ls;
        } else {
            const size_t pi = ((size_t)t * Hq + head) * S + s;
            part_acc[pi * D + d] = A;
            if (d == 0) {
                part_ml[2 * pi] = M == NEG_INF ? NEG_INF : M * DT_LN2;
                part_ml[2 * pi + 1] = Ls;
            }
        }
    }
#endif
}

#define DECODE_ATTN_TC(D, NAME, OUT_BF16, OUT_T)                                                               \
    extern "C" __global__ void __launch_bounds__(DT_WARPS * 32, 3) NAME(                                        \
        const float* __restrict__ q, int q_stride, const bf16_t* __restrict__ k_cache,                         \
        const bf16_t* __restrict__ v_cache, const int* __restrict__ block_tables, int max_blocks,              \
        const int* __restrict__ token_seq, const int* __restrict__ positions, OUT_T* __restrict__ out,         \
        float* __restrict__ part_acc, float* __restrict__ part_ml, int Hq, int Hkv, int bs_shift, int chunk,   \
        float scale_log2) {                                                                                    \
        decode_attn_tc_impl<D, OUT_BF16>(q, q_stride, k_cache, v_cache, block_tables, max_blocks, token_seq,   \
                                         positions, out, part_acc, part_ml, Hq, Hkv, bs_shift, chunk,          \
                                         scale_log2);                                                          \
    }
DECODE_ATTN_TC(64, decode_attn_tc_d64, false, float)
DECODE_ATTN_TC(128, decode_attn_tc_d128, false, float)
DECODE_ATTN_TC(64, decode_attn_tc_bf16_d64, true, bf16_t)
DECODE_ATTN_TC(128, decode_attn_tc_bf16_d128, true, bf16_t)
