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
// dtype codes: 0 = f32, 1 = f16, 2 = bf16, 3 = fp8 e4m3, 4 = fp8 e5m2, 5 = int8 (little-endian,
// as in safetensors). A weight may carry an f32 scale (FP8 and int8 checkpoints): its values
// are stored × scale; kernels take the scale's address, 0 for none.

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned short u16;

#define STAGEHAND_F32 0
#define STAGEHAND_F16 1
#define STAGEHAND_BF16 2
#define STAGEHAND_F8E4M3 3
#define STAGEHAND_F8E5M2 4
#define STAGEHAND_I8 5

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

// FP8 codes, exactly (crate::compute's fp8 module): E4M3 has no infinities and
// S.1111.111 is NaN; E5M2 is IEEE-like. For the non-negative codes, value grows with
// the code up to the largest finite one.
__device__ __forceinline__ float stagehand_fp8_to_float(u32 code, int dtype) {
    const bool e4m3 = dtype == STAGEHAND_F8E4M3;
    const u32 sign = (code & 0x80u) << 24;
    const u32 mantissa_bits = e4m3 ? 3u : 2u;
    const u32 exponent = (code & 0x7fu) >> mantissa_bits;
    const u32 mantissa = code & ((1u << mantissa_bits) - 1u);
    const int bias = e4m3 ? 7 : 15;
    if (e4m3 && exponent == 15u && mantissa == 7u) {
        return __uint_as_float(0x7fc00000u);
    }
    if (!e4m3 && exponent == 31u) {
        return mantissa == 0u ? __uint_as_float(sign | 0x7f800000u) : __uint_as_float(0x7fc00000u);
    }
    if (exponent == 0u) {
        // Subnormal: mantissa · 2^(1 − bias − mantissa_bits), exact in f32.
        const float magnitude = (float)mantissa * (e4m3 ? 1.953125e-3f : 1.52587890625e-5f);
        return sign ? -magnitude : magnitude;
    }
    return __uint_as_float(sign | ((u32)((int)exponent - bias + 127) << 23) |
                           (mantissa << (23u - mantissa_bits)));
}

// The nearest code, ties to the even code, saturating at the largest finite value.
__device__ __forceinline__ u32 stagehand_float_to_fp8(float value, int dtype) {
    const bool e4m3 = dtype == STAGEHAND_F8E4M3;
    const u32 bits = __float_as_uint(value);
    if ((bits & 0x7fffffffu) > 0x7f800000u) {
        return e4m3 ? 0x7fu : 0x7eu;
    }
    const u32 sign = (bits >> 24) & 0x80u;
    const float magnitude = __uint_as_float(bits & 0x7fffffffu);
    const u32 largest = e4m3 ? 0x7eu : 0x7bu;
    // The first code whose value is at least the magnitude (largest + 1 if none).
    u32 low = 0u, high = largest + 1u;
    while (low < high) {
        const u32 middle = (low + high) / 2u;
        if (stagehand_fp8_to_float(middle, dtype) < magnitude) {
            low = middle + 1u;
        } else {
            high = middle;
        }
    }
    u32 code;
    if (low == 0u) {
        code = 0u;
    } else if (low > largest) {
        code = largest;
    } else {
        const float below = stagehand_fp8_to_float(low - 1u, dtype);
        const float above = stagehand_fp8_to_float(low, dtype);
        const float to_below = magnitude - below, to_above = above - magnitude;
        code = (to_below < to_above || (to_below == to_above && ((low - 1u) & 1u) == 0u)) ? low - 1u : low;
    }
    return sign | code;
}

// The scale at `scale` (any byte address), or 1 for none.
__device__ __forceinline__ float stagehand_scale(const unsigned char* scale) {
    if (scale == 0) {
        return 1.0f;
    }
    const u32 bits = (u32)scale[0] | ((u32)scale[1] << 8) | ((u32)scale[2] << 16) | ((u32)scale[3] << 24);
    return __uint_as_float(bits);
}

// Element `index` of a weight in `dtype` at any byte address: whole loads when the
// address is aligned for the type, byte loads when the file left it unaligned.
__device__ __forceinline__ float stagehand_load(const unsigned char* base, u64 index, int dtype) {
    if (dtype == STAGEHAND_I8) {
        return (float)(signed char)base[index];
    }
    if (dtype == STAGEHAND_F8E4M3 || dtype == STAGEHAND_F8E5M2) {
        return stagehand_fp8_to_float(base[index], dtype);
    }
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
    if (dtype == STAGEHAND_I8) {
        // Nearest code, ties to even, saturating (as the CPU backend narrows).
        base[index] = (unsigned char)(signed char)fminf(fmaxf(rintf(value), -128.0f), 127.0f);
        return;
    }
    if (dtype == STAGEHAND_F8E4M3 || dtype == STAGEHAND_F8E5M2) {
        base[index] = (unsigned char)stagehand_float_to_fp8(value, dtype);
        return;
    }
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

// dst[i] = src[i] widened to f32, times the weight's scale if it has one (the cast
// just before use).
extern "C" __global__ void stagehand_widen(const unsigned char* src, int dtype, const unsigned char* scale,
                                           float* dst, u64 count) {
    const float factor = stagehand_scale(scale);
    STAGEHAND_GRID_STRIDE(i, count) {
        const float value = stagehand_load(src, i, dtype);
        dst[i] = scale ? value * factor : value;
    }
}

// dst[i] = src[i] (divided by the weight's scale if it has one) narrowed to `dtype`,
// rounded to nearest even (a merged weight stored back).
extern "C" __global__ void stagehand_narrow(const float* src, unsigned char* dst, int dtype,
                                            const unsigned char* scale, u64 count) {
    const float factor = stagehand_scale(scale);
    STAGEHAND_GRID_STRIDE(i, count) {
        stagehand_store(dst, i, dtype, scale ? src[i] / factor : src[i]);
    }
}

// Decode products, y[rows, out] = x[rows, in] · Wᵀ (· scale) + bias, for at most
// STAGEHAND_GEMV_ROWS rows, reading W[out, in] once in its storage dtype and widening
// each element in registers (no widened copy of the weight). One warp per output
// feature: lane l sums elements l, l + 32, … of its row in that order, then the warp
// adds the 32 partial sums in one fixed tree, so every launch gives the same bits
// whatever the block the weight lies in (a streamed slot or a resident block).
#define STAGEHAND_GEMV_ROWS 8
extern "C" __global__ void stagehand_gemv(const float* x, u32 rows, const unsigned char* w, int dtype,
                                          const unsigned char* scale, const float* bias, float* y,
                                          u32 out, u32 in) {
    const u32 lane = threadIdx.x & 31u;
    const u64 feature = (u64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (feature >= out) {
        return;
    }
    float sums[STAGEHAND_GEMV_ROWS];
    for (u32 r = 0; r < STAGEHAND_GEMV_ROWS; ++r) {
        sums[r] = 0.0f;
    }
    const u64 row_start = feature * (u64)in;
    for (u32 i = lane; i < in; i += 32u) {
        const float weight = stagehand_load(w, row_start + i, dtype);
        for (u32 r = 0; r < STAGEHAND_GEMV_ROWS; ++r) {
            if (r < rows) {
                sums[r] += weight * x[(u64)r * in + i];
            }
        }
    }
    const float factor = stagehand_scale(scale);
    for (u32 r = 0; r < STAGEHAND_GEMV_ROWS; ++r) {
        if (r >= rows) {
            break;
        }
        float sum = sums[r];
        for (int offset = 16; offset > 0; offset >>= 1) {
            sum += __shfl_down_sync(0xffffffffu, sum, offset);
        }
        if (lane == 0u) {
            const float scaled = scale ? sum * factor : sum;
            y[(u64)r * out + feature] = bias ? scaled + bias[feature] : scaled;
        }
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

// out[r] += table[ids[r]] (times its scale; ids were checked against the table on the
// host). The product is rounded before the add, as the CPU adapter does.
extern "C" __global__ void stagehand_gather_add(const unsigned char* table, int dtype,
                                                const unsigned char* scale, const u32* ids,
                                                float* out, u64 rows, u32 cols) {
    const float factor = stagehand_scale(scale);
    STAGEHAND_GRID_STRIDE(i, rows * cols) {
        const u64 row = i / cols;
        const u64 col = i % cols;
        const float value = stagehand_load(table, (u64)ids[row] * cols + col, dtype);
        out[i] = out[i] + (scale ? __fmul_rn(value, factor) : value);
    }
}

// A row's mean, then 1/√(the biased variance of its deviations + eps) (as PyTorch),
// each summed over the block in its fixed tree. `shared` holds 32 floats.
__device__ void stagehand_row_moments(const float* in, u32 cols, float eps, float* shared, float* mean_out,
                                      float* inverse_out) {
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
    *mean_out = mean;
    *inverse_out = 1.0f / sqrtf(variance + eps);
}

// One block per row.
extern "C" __global__ void stagehand_layer_norm(const float* x, const float* gamma, const float* beta,
                                                float eps, float* y, u32 cols) {
    __shared__ float shared[32];
    const float* in = x + (u64)blockIdx.x * cols;
    float* out = y + (u64)blockIdx.x * cols;
    float mean, inverse;
    stagehand_row_moments(in, cols, eps, shared, &mean, &inverse);
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

// One block per score row of [heads][sequences][queries][keys]: softmax over the keys
// the query may see (its sequence's real tokens, or, when causal, keys 0..=past + i for
// query i), exactly 0 for the rest.
extern "C" __global__ void stagehand_masked_softmax(float* scores, const u32* lengths, u32 sequences,
                                                    u32 queries, u32 keys, u32 past, int causal) {
    __shared__ float shared[32];
    const u64 row = blockIdx.x;
    const u32 query = (u32)(row % queries);
    const u32 sequence = (u32)((row / queries) % sequences);
    const u32 visible = causal ? past + query + 1u : lengths[sequence];
    const u32 length = keys;
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

// gate = silu(gate)·up (SwiGLU), in the CPU adapter's order of operations.
extern "C" __global__ void stagehand_silu_mul(float* gate, const float* up, u64 count) {
    STAGEHAND_GRID_STRIDE(i, count) {
        const float value = gate[i];
        gate[i] = value / (1.0f + expf(-value)) * up[i];
    }
}

// Rotary embedding, Llama's rotate-half layout: in each head of each row, the pair
// (i, i + half) turns by positions[row] · inv_freq[i].
extern "C" __global__ void stagehand_rope(float* x, const u32* positions, const float* inv_freq,
                                          u64 rows, u32 heads, u32 head_dim) {
    const u32 half = head_dim / 2u;
    STAGEHAND_GRID_STRIDE(i, rows * heads * half) {
        const u32 pair = (u32)(i % half);
        const u64 head = i / half;
        const u64 row = head / heads;
        float* at = x + head * head_dim;
        const float angle = (float)positions[row] * inv_freq[pair];
        float sine, cosine;
        sincosf(angle, &sine, &cosine);
        const float a = at[pair], b = at[pair + half];
        at[pair] = a * cosine - b * sine;
        at[pair + half] = b * cosine + a * sine;
    }
}

// Diffusion transformers (Flux), in the CPU adapter's order of operations. One block
// per row: y = LayerNorm(x)·(1 + scale) + shift, LayerNorm without affine weights;
// shift and scale are one row broadcast over every row.
extern "C" __global__ void stagehand_adaptive_norm(const float* x, const float* shift, const float* scale,
                                                   float eps, float* y, u32 cols) {
    __shared__ float shared[32];
    const float* in = x + (u64)blockIdx.x * cols;
    float* out = y + (u64)blockIdx.x * cols;
    float mean, inverse;
    stagehand_row_moments(in, cols, eps, shared, &mean, &inverse);
    for (u32 i = threadIdx.x; i < cols; i += blockDim.x) {
        out[i] = (in[i] - mean) * inverse * (1.0f + scale[i]) + shift[i];
    }
}

// x += gate·y, the gate one row broadcast over every row.
extern "C" __global__ void stagehand_add_gated(float* x, const float* y, const float* gate, u64 rows,
                                               u32 cols) {
    STAGEHAND_GRID_STRIDE(i, rows * cols) {
        x[i] = x[i] + gate[i % cols] * y[i];
    }
}

extern "C" __global__ void stagehand_silu(float* x, u64 count) {
    STAGEHAND_GRID_STRIDE(i, count) {
        const float value = x[i];
        x[i] = value / (1.0f + expf(-value));
    }
}

// PyTorch's gelu(approximate="tanh").
extern "C" __global__ void stagehand_gelu_tanh(float* x, u64 count) {
    STAGEHAND_GRID_STRIDE(i, count) {
        const float value = x[i];
        const float inner = 0.7978846f * (value + 0.044715f * value * value * value);
        x[i] = 0.5f * value * (1.0f + tanhf(inner));
    }
}

// Rotary embedding on interleaved pairs (Flux): in each head of row r, the pair
// (2i, 2i + 1) turns by the angle whose cosine and sine are table[r][2i], table[r][2i + 1].
extern "C" __global__ void stagehand_rope_pairs(float* x, const float* table, u64 rows, u32 heads,
                                                u32 head_dim) {
    const u32 half = head_dim / 2u;
    STAGEHAND_GRID_STRIDE(i, rows * heads * half) {
        const u32 pair = (u32)(i % half);
        const u64 head = i / half;
        const u64 row = head / heads;
        float* at = x + head * head_dim + 2u * pair;
        const float* angle = table + row * head_dim + 2u * pair;
        const float cosine = angle[0], sine = angle[1];
        const float real = at[0], imaginary = at[1];
        at[0] = real * cosine - imaginary * sine;
        at[1] = imaginary * cosine + real * sine;
    }
}

// to[r][at .. at + narrow] = from[r] for every row (the single block's concatenation).
extern "C" __global__ void stagehand_write_cols(float* to, const float* from, u64 rows, u32 wide, u32 at,
                                                u32 narrow) {
    STAGEHAND_GRID_STRIDE(i, rows * narrow) {
        const u64 row = i / narrow;
        to[row * wide + at + (i % narrow)] = from[i];
    }
}

// The stream-verify checksum (crate::compute::checksum): the sum over little-endian
// 32-bit words (the last zero-padded) of (word ^ low32(g)) * (high32(g) | 1), a 32 x 32
// -> 64-bit product, where g = index * phi. An integer sum, so the atomic per warp does
// not make it depend on thread order.
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
        const u64 key = i * 0x9e3779b97f4a7c15ULL;
        sum += (u64)(word ^ (u32)key) * (u64)((u32)(key >> 32) | 1u);
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        sum += __shfl_down_sync(0xffffffffu, sum, offset);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(sum_out, sum);
    }
}
