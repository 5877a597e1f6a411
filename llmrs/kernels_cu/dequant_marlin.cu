// dequant_marlin.cu: W[n, k] as bf16 (uint32 pairs [N][K/2]) from q4_marlin.cuh's 4-bit layout, for cuBLAS above
// cuda.quant_linear.MAX_TOKENS where the backend keeps no row-major copy (matvec_q4.cu's dequant_q4_bf16 reads that one).
// Entry points: dequant_marlin_q4z_bf16, dequant_marlin_q4m_bf16 (zero / min mode).
// Values: frag_b's, i.e. dequant_q4_bf16's (equal values, +0 where it has -0 for a zero weight of a negative scale;
// tests/test_gemv_q4_gpu.py).
//
// One thread a lane record (32 codes of 4 columns); of word i's column (n = 32 nb + 8 i + g) the lane holds the
// bf16 pairs at words t, t + 4, t + 8, t + 12 of the column's 64-byte run (k = 32 kb ..): a 4 x 4 transpose across
// the quad (lanes 4 g .. 4 g + 3, two shuffle rounds) hands lane t words 4 t .. 4 t + 3, one 16-byte store (the
// quad writes the run whole; 16 four-byte stores a record ran at less than half the speed). Two records a thread
// per pass: 32 bytes of loads in flight. Grid-stride over records; whole warps stay together (records % 32 == 0),
// as the shuffles need.
//
// Roof (H200, the 7B AWQ at 256 sequences): 77% of the bandwidth roof on gate_up (93 us a layer), 73% on down
// (`llmrs profile --synthetic qwen2.5-7b-awq --batch 256`).
#include "common.cuh"
#include "q4_marlin.cuh"

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

