// The NVRTC kernels of the CUDA compute adapter (src/device/cuda/kernels.rs loads
// them). Written to need no header: NVRTC's built-in math (expf, erfcf, sqrtf, fmaxf)
// and bit casts only, so a driver plus libnvrtc is all a machine needs.
//
// Reductions run in a fixed tree for a given row length and block size (strided
// per-thread sums, then warp shuffles, then one warp over the warp sums) and never use
// float atomics, so the same launch on the same GPU gives the same bits: a streamed run
// equals the resident run. The one atomic is the checksum's integer sum, which is
// order-independent.
//
// dtype codes: 0 = f32, 1 = f16, 2 = bf16 (little-endian, as in safetensors).

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

#define STAGEHAND_F32 0
#define STAGEHAND_F16 1
#define STAGEHAND_BF16 2

__device__ __forceinline__ float stagehand_half_to_float(u32 bits) {
    const u32 sign = (bits & 0x8000u) << 16;
    const u32 exponent = (bits >> 10) & 0x1fu;
    const u32 mantissa = bits & 0x3ffu;
    if (exponent == 0u) {
        // Zero or subnormal: mantissa · 2^-24, exact in f32.
        const float magnitude = (float)mantissa * 5.9604644775390625e-8f;
        return sign ? -magnitude : magnitude;
    }
    if (exponent == 0x1fu) {
        return __uint_as_float(sign | 0x7f800000u | (mantissa << 13));
    }
    return __uint_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

__device__ __forceinline__ float stagehand_bf16_to_float(u32 bits) {
    return __uint_as_float(bits << 16);
}

// Round to nearest, ties to even, as `half::f16::from_f32` (and the hardware) do.
__device__ __forceinline__ u32 stagehand_float_to_half(float value) {
    const u32 bits = __float_as_uint(value);
    const u32 sign = (bits >> 16) & 0x8000u;
    const int exponent = (int)((bits >> 23) & 0xffu);
    const u32 mantissa = bits & 0x007fffffu;
    if (exponent == 0xff) {
        return sign | 0x7c00u | (mantissa != 0u ? 0x0200u : 0u);
    }
    const int unbiased = exponent - 127;
    if (unbiased > 15) {
        return sign | 0x7c00u;
    }
    if (unbiased >= -14) {
        u32 half = ((u32)(unbiased + 15) << 10) | (mantissa >> 13);
        const u32 dropped = mantissa & 0x1fffu;
        if (dropped > 0x1000u || (dropped == 0x1000u && (half & 1u))) {
            half += 1u;
        }
        return sign | half;
    }
    const u32 shift = (u32)(-1 - unbiased);
    if (shift > 24u) {
        return sign;
    }
    const u32 significand = mantissa | 0x00800000u;
    u32 half = significand >> shift;
    const u32 dropped = significand & ((1u << shift) - 1u);
    const u32 halfway = 1u << (shift - 1u);
    if (dropped > halfway || (dropped == halfway && (half & 1u))) {
        half += 1u;
    }
    return sign | half;
}

__device__ __forceinline__ u32 stagehand_float_to_bf16(float value) {
    const u32 bits = __float_as_uint(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        // Keep a NaN a NaN: truncating could leave an all-zero mantissa (infinity).
        return (bits >> 16) | 0x0040u;
    }
    return (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
}

// Element `index` of a weight in `dtype` at any byte address: whole loads when the
// address is aligned for the type, byte loads when the file left it unaligned.
__device__ __forceinline__ float stagehand_load(const unsigned char* base, u64 index, int dtype) {
    if (dtype == STAGEHAND_F32) {
        const unsigned char* at = base + index * 4ull;
        if ((((u64)at) & 3ull) == 0ull) {
            return *(const float*)at;
        }
        const u32 bits = (u32)at[0] | ((u32)at[1] << 8) | ((u32)at[2] << 16) | ((u32)at[3] << 24);
        return __uint_as_float(bits);
    }
    const unsigned char* at = base + index * 2ull;
    const u32 bits = ((((u64)at) & 1ull) == 0ull) ? (u32)(*(const u16*)at)
                                                  : ((u32)at[0] | ((u32)at[1] << 8));
    return dtype == STAGEHAND_F16 ? stagehand_half_to_float(bits) : stagehand_bf16_to_float(bits);
}

__device__ __forceinline__ void stagehand_store(unsigned char* base, u64 index, int dtype, float value) {
    if (dtype == STAGEHAND_F32) {
        unsigned char* at = base + index * 4ull;
        if ((((u64)at) & 3ull) == 0ull) {
            *(float*)at = value;
            return;
        }
        const u32 bits = __float_as_uint(value);
        at[0] = (unsigned char)bits;
        at[1] = (unsigned char)(bits >> 8);
        at[2] = (unsigned char)(bits >> 16);
        at[3] = (unsigned char)(bits >> 24);
        return;
    }
    unsigned char* at = base + index * 2ull;
    const u32 bits = dtype == STAGEHAND_F16 ? stagehand_float_to_half(value) : stagehand_float_to_bf16(value);
    if ((((u64)at) & 1ull) == 0ull) {
        *(u16*)at = (u16)bits;
    } else {
        at[0] = (unsigned char)bits;
        at[1] = (unsigned char)(bits >> 8);
    }
}

#define STAGEHAND_GRID_STRIDE(i, count) \
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < (count); i += (u64)gridDim.x * blockDim.x)

// Sum over the block, the same tree every time. `shared` holds 32 floats; the leading
// barrier protects it from a previous call whose result threads may still be reading.
__device__ float stagehand_block_sum(float value, float* shared) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        value += __shfl_down_sync(0xffffffffu, value, offset);
    }
    const u32 lane = threadIdx.x & 31u;
    const u32 warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0u) {
        shared[warp] = value;
    }
    __syncthreads();
    if (warp == 0u) {
        float total = lane < (blockDim.x >> 5) ? shared[lane] : 0.0f;
        for (int offset = 16; offset > 0; offset >>= 1) {
            total += __shfl_down_sync(0xffffffffu, total, offset);
        }
        if (lane == 0u) {
            shared[0] = total;
        }
    }
    __syncthreads();
    return shared[0];
}

__device__ float stagehand_block_max(float value, float* shared) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        value = fmaxf(value, __shfl_down_sync(0xffffffffu, value, offset));
    }
    const u32 lane = threadIdx.x & 31u;
    const u32 warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0u) {
        shared[warp] = value;
    }
    __syncthreads();
    if (warp == 0u) {
        float top = lane < (blockDim.x >> 5) ? shared[lane] : -__uint_as_float(0x7f800000u);
        for (int offset = 16; offset > 0; offset >>= 1) {
            top = fmaxf(top, __shfl_down_sync(0xffffffffu, top, offset));
        }
        if (lane == 0u) {
            shared[0] = top;
        }
    }
    __syncthreads();
    return shared[0];
}

// dst[i] = src[i] widened to f32 (the cast just before use).
extern "C" __global__ void stagehand_widen(const unsigned char* src, int dtype, float* dst, u64 count) {
    STAGEHAND_GRID_STRIDE(i, count) {
        dst[i] = stagehand_load(src, i, dtype);
    }
}

// dst[i] = src[i] narrowed to `dtype`, rounded to nearest even (a merged weight).
extern "C" __global__ void stagehand_narrow(const float* src, unsigned char* dst, int dtype, u64 count) {
    STAGEHAND_GRID_STRIDE(i, count) {
        stagehand_store(dst, i, dtype, src[i]);
    }
}

// Every row of y[rows, cols] set to `row` (a bias before a GEMM with beta = 1).
extern "C" __global__ void stagehand_fill_rows(float* y, const float* row, u64 rows, u32 cols) {
    STAGEHAND_GRID_STRIDE(i, rows * cols) {
        y[i] = row[i % cols];
    }
}

extern "C" __global__ void stagehand_add(float* x, const float* y, u64 count) {
    STAGEHAND_GRID_STRIDE(i, count) {
        x[i] = x[i] + y[i];
    }
}

extern "C" __global__ void stagehand_add_scaled_rows(float* acc, const float* y, const float* scales,
                                                     u64 rows, u32 cols) {
    STAGEHAND_GRID_STRIDE(i, rows * cols) {
        acc[i] = acc[i] + scales[i / cols] * y[i];
    }
}

// out[r] += table[ids[r]] (ids were checked against the table on the host).
extern "C" __global__ void stagehand_gather_add(const unsigned char* table, int dtype, const u32* ids,
                                                float* out, u64 rows, u32 cols) {
    STAGEHAND_GRID_STRIDE(i, rows * cols) {
        const u64 row = i / cols;
        const u64 col = i % cols;
        out[i] = out[i] + stagehand_load(table, (u64)ids[row] * cols + col, dtype);
    }
}

// One block per row: mean, then the biased variance of the deviations (as PyTorch).
extern "C" __global__ void stagehand_layer_norm(const float* x, const float* gamma, const float* beta,
                                                float eps, float* y, u32 cols) {
    __shared__ float shared[32];
    const float* in = x + (u64)blockIdx.x * cols;
    float* out = y + (u64)blockIdx.x * cols;
    float sum = 0.0f;
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) {
        sum += in[i];
    }
    const float mean = stagehand_block_sum(sum, shared) / (float)cols;
    float squares = 0.0f;
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) {
        const float deviation = in[i] - mean;
        squares += deviation * deviation;
    }
    const float variance = stagehand_block_sum(squares, shared) / (float)cols;
    const float inverse = 1.0f / sqrtf(variance + eps);
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) {
        out[i] = (in[i] - mean) * inverse * gamma[i] + beta[i];
    }
}

// One block per row: y = x / sqrt(mean(x²) + eps) · gamma (gamma null: 1).
extern "C" __global__ void stagehand_rms_norm(const float* x, const float* gamma, float eps, float* y,
                                              u32 cols) {
    __shared__ float shared[32];
    const float* in = x + (u64)blockIdx.x * cols;
    float* out = y + (u64)blockIdx.x * cols;
    float squares = 0.0f;
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) {
        squares += in[i] * in[i];
    }
    const float mean_square = stagehand_block_sum(squares, shared) / (float)cols;
    const float scale = 1.0f / sqrtf(mean_square + eps);
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) {
        out[i] = gamma ? in[i] * scale * gamma[i] : in[i] * scale;
    }
}

// x·Φ(x) with Φ(x) = erfc(−x/√2)/2: the complementary form keeps negative inputs
// accurate where 1 + erf(x/√2) would cancel.
extern "C" __global__ void stagehand_gelu_erf(float* x, u64 count) {
    STAGEHAND_GRID_STRIDE(i, count) {
        const float value = x[i];
        x[i] = value * 0.5f * erfcf(-value * 0.70710678118654752f);
    }
}

// One block per score row of [heads][sequences][length][length]: softmax over the keys
// the query may see (its sequence's real tokens, or keys 0..=i when causal), exactly 0
// for the rest.
extern "C" __global__ void stagehand_masked_softmax(float* scores, const u32* lengths, u32 sequences,
                                                    u32 length, int causal) {
    __shared__ float shared[32];
    const u64 row = blockIdx.x;
    const u32 query = (u32)(row % length);
    const u32 sequence = (u32)((row / length) % sequences);
    const u32 visible = causal ? query + 1u : lengths[sequence];
    float* values = scores + row * length;
    float top = -__uint_as_float(0x7f800000u);
    for (u32 j = threadIdx.x; j < visible; j += blockDim.x) {
        top = fmaxf(top, values[j]);
    }
    top = stagehand_block_max(top, shared);
    float total = 0.0f;
    for (u32 j = threadIdx.x; j < visible; j += blockDim.x) {
        const float weight = expf(values[j] - top);
        values[j] = weight;
        total += weight;
    }
    total = stagehand_block_sum(total, shared);
    for (u32 j = threadIdx.x; j < length; j += blockDim.x) {
        values[j] = j < visible ? values[j] / total : 0.0f;
    }
}

// The stream-verify checksum (crate::compute::checksum): the sum of
// mix64(index · φ ⊕ word) over little-endian 32-bit words, the last zero-padded. An
// integer sum, so the atomic per warp does not make it depend on thread order.
__device__ __forceinline__ u64 stagehand_mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

extern "C" __global__ void stagehand_checksum(const unsigned char* data, u64 length, u64* sum_out) {
    const u64 words = (length + 3) / 4;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const bool aligned = (((u64)data) & 3) == 0;
    u64 sum = 0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
        const u64 start = i * 4;
        u32 word = 0;
        if (aligned && start + 4 <= length) {
            word = ((const u32*)data)[i];
        } else {
            for (u64 b = 0; b < 4 && start + b < length; ++b) {
                word |= ((u32)data[start + b]) << (8 * b);
            }
        }
        sum += stagehand_mix64((i * 0x9e3779b97f4a7c15ULL) ^ (u64)word);
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        sum += __shfl_down_sync(0xffffffffu, sum, offset);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(sum_out, sum);
    }
}
