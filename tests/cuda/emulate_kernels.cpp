// The compute adapter's kernels (src/device/cuda/kernels.cu) compiled for the CPU and
// run as written: one std::thread per CUDA thread, __syncthreads as a block barrier,
// warp shuffles through a per-warp exchange and barrier. Lets a machine without a GPU
// check the kernels' arithmetic, indexing, masking and reduction trees against plain
// loops. tests/cuda.rs builds it with g++ and runs it; the checksums it prints are
// compared there with crate::compute::checksum.
//
// Exit status 0 when every check passed; each failure is printed with what failed.

#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

struct Dim {
    unsigned x = 0, y = 0, z = 0;
};
thread_local Dim threadIdx, blockIdx;
Dim blockDim, gridDim;

#define __global__
#define __device__
#define __forceinline__ inline
// Blocks run one after another, so a function-static is one block's shared memory.
#define __shared__ static

static std::barrier<>* block_barrier = nullptr;
static std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
static float warp_floats[32][32];
static unsigned long long warp_words[32][32];
static std::mutex atomic_lock;

static void __syncthreads() {
    block_barrier->arrive_and_wait();
}

template <class T>
static T shuffle_down(T (*exchange)[32], T value, int offset) {
    const unsigned warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    exchange[warp][lane] = value;
    warp_barriers[warp]->arrive_and_wait();
    const T result = lane + offset < 32 ? exchange[warp][lane + offset] : value;
    warp_barriers[warp]->arrive_and_wait();
    return result;
}

static float __shfl_down_sync(unsigned, float value, int offset) {
    return shuffle_down(warp_floats, value, offset);
}

static unsigned long long __shfl_down_sync(unsigned, unsigned long long value, int offset) {
    return shuffle_down(warp_words, value, offset);
}

static float __uint_as_float(unsigned bits) {
    float value;
    std::memcpy(&value, &bits, 4);
    return value;
}

static unsigned __float_as_uint(float value) {
    unsigned bits;
    std::memcpy(&bits, &value, 4);
    return bits;
}

static float __fmul_rn(float a, float b) {
    return a * b;
}

static unsigned long long atomicAdd(unsigned long long* address, unsigned long long value) {
    std::lock_guard<std::mutex> guard(atomic_lock);
    const unsigned long long old = *address;
    *address = old + value;
    return old;
}

#include "kernels.cu"

static int failures = 0;

#define CHECK(condition, ...)                    \
    do {                                         \
        if (!(condition)) {                      \
            ++failures;                          \
            std::printf("FAIL %s:%d: ", __FILE__, __LINE__); \
            std::printf(__VA_ARGS__);            \
            std::printf("\n");                   \
        }                                        \
    } while (0)

// Runs `kernel` on `grid` blocks of `block` threads, each thread its own std::thread.
template <class Kernel>
static void launch(unsigned grid, unsigned block, Kernel kernel) {
    gridDim = {grid, 1, 1};
    blockDim = {block, 1, 1};
    for (unsigned b = 0; b < grid; ++b) {
        std::barrier<> barrier(block);
        block_barrier = &barrier;
        warp_barriers.clear();
        for (unsigned w = 0; w < block / 32; ++w) {
            warp_barriers.push_back(std::make_unique<std::barrier<>>(32));
        }
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < block; ++t) {
            threads.emplace_back([&, b, t] {
                blockIdx = {b, 0, 0};
                threadIdx = {t, 0, 0};
                kernel();
            });
        }
        for (auto& thread : threads) {
            thread.join();
        }
    }
}

static std::vector<float> seeded(size_t count, unsigned long long seed, float scale) {
    std::vector<float> values(count);
    unsigned long long state = seed * 0x9e3779b97f4a7c15ULL | 1;
    for (auto& value : values) {
        state = state * 6364136223846793005ULL + 1442695040888963407ULL;
        value = ((float)(state >> 40) / (float)(1ull << 24) * 2.0f - 1.0f) * scale;
    }
    return values;
}

static float from_bits(int dtype, unsigned bits) {
    if (dtype == STAGEHAND_F8E4M3 || dtype == STAGEHAND_F8E5M2) return stagehand_fp8_to_float(bits, dtype);
    return dtype == STAGEHAND_F16 ? stagehand_half_to_float(bits) : stagehand_bf16_to_float(bits);
}

static size_t size_of(int dtype) {
    return dtype == STAGEHAND_F32 ? 4 : (dtype == STAGEHAND_F16 || dtype == STAGEHAND_BF16) ? 2 : 1;
}

static void conversions() {
    for (unsigned bits = 0; bits <= 0xffff; ++bits) {
        const float half = stagehand_half_to_float(bits);
        if (!std::isnan(half)) {
            CHECK(stagehand_float_to_half(half) == bits, "f16 %#06x round trip", bits);
            const int exponent = (bits >> 10) & 0x1f;
            const double magnitude = exponent == 0
                ? std::ldexp((double)(bits & 0x3ff), -24)
                : std::ldexp(1.0 + (bits & 0x3ff) / 1024.0, exponent - 15);
            const double expected = (bits & 0x8000) ? -magnitude : magnitude;
            CHECK(exponent == 0x1f || (double)half == expected, "f16 %#06x widens to %g", bits, half);
        }
        const float brain = stagehand_bf16_to_float(bits);
        if (!std::isnan(brain)) {
            CHECK(stagehand_float_to_bf16(brain) == bits, "bf16 %#06x round trip", bits);
        }
    }
    const float ulp = std::ldexp(1.0f, -10);
    CHECK(stagehand_float_to_half(1.0f + ulp / 2) == 0x3c00, "f16 tie goes to even (down)");
    CHECK(stagehand_float_to_half(1.0f + ulp * 1.5f) == 0x3c02, "f16 tie goes to even (up)");
    CHECK(stagehand_float_to_half(65519.0f) == 0x7bff, "f16 largest finite");
    CHECK(stagehand_float_to_half(65520.0f) == 0x7c00, "f16 overflow to infinity");
    CHECK(stagehand_float_to_half(std::ldexp(1.0f, -25)) == 0, "f16 subnormal tie to zero");
    CHECK(stagehand_float_to_half(std::ldexp(1.5f, -25)) == 1, "f16 smallest subnormal");
    CHECK(stagehand_float_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80, "bf16 tie to even");
    CHECK(std::isnan(stagehand_bf16_to_float(stagehand_float_to_bf16(NAN))), "bf16 keeps NaN");
    // FP8: every code decodes to its layout's value, finite codes round-trip, ties go
    // to the even code and out-of-range values saturate.
    for (int dtype : {STAGEHAND_F8E4M3, STAGEHAND_F8E5M2}) {
        const bool e4m3 = dtype == STAGEHAND_F8E4M3;
        const int mantissa_bits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, top = e4m3 ? 15 : 31;
        for (unsigned code = 0; code < 256; ++code) {
            const int exponent = (code & 0x7f) >> mantissa_bits, mantissa = code & ((1 << mantissa_bits) - 1);
            const double sign = (code & 0x80) ? -1.0 : 1.0;
            const float value = stagehand_fp8_to_float(code, dtype);
            if (e4m3 && exponent == top && mantissa == 7) {
                CHECK(std::isnan(value), "e4m3 %#04x is NaN", code);
                continue;
            }
            if (!e4m3 && exponent == top) {
                CHECK(mantissa == 0 ? std::isinf(value) : std::isnan(value), "e5m2 %#04x", code);
                continue;
            }
            const double expected = exponent == 0
                ? sign * std::ldexp((double)mantissa, 1 - bias - mantissa_bits)
                : sign * std::ldexp(1.0 + (double)mantissa / (1 << mantissa_bits), exponent - bias);
            CHECK((double)value == expected, "fp8 %d %#04x decodes to %g, not %g", dtype, code, value, expected);
            if (value != 0.0f) {
                CHECK(stagehand_float_to_fp8(value, dtype) == code, "fp8 %d %#04x round trip", dtype, code);
            }
        }
    }
    CHECK(stagehand_float_to_fp8(1.0625f, STAGEHAND_F8E4M3) == 0x38, "e4m3 tie to even");
    CHECK(stagehand_float_to_fp8(1.07f, STAGEHAND_F8E4M3) == 0x39, "e4m3 rounds up");
    CHECK(stagehand_float_to_fp8(1e6f, STAGEHAND_F8E4M3) == 0x7e, "e4m3 saturates");
    CHECK(stagehand_float_to_fp8(-1e6f, STAGEHAND_F8E4M3) == 0xfe, "e4m3 saturates negative");
    CHECK(stagehand_float_to_fp8(INFINITY, STAGEHAND_F8E5M2) == 0x7b, "e5m2 saturates infinity");
    CHECK(stagehand_float_to_fp8(NAN, STAGEHAND_F8E4M3) == 0x7f, "e4m3 NaN");
    CHECK(stagehand_float_to_fp8(-0.0f, STAGEHAND_F8E4M3) == 0x80, "negative zero keeps its sign");
    // Every rounding is to a nearest neighbour.
    for (float value = 1e-4f; value < 6e4f; value *= 1.013f) {
        for (int dtype : {STAGEHAND_F16, STAGEHAND_BF16}) {
            const unsigned bits = dtype == STAGEHAND_F16 ? stagehand_float_to_half(value)
                                                         : stagehand_float_to_bf16(value);
            const float rounded = from_bits(dtype, bits);
            const float up = from_bits(dtype, bits + 1), down = from_bits(dtype, bits - 1);
            CHECK(std::fabs(rounded - value) <= std::fabs(up - value) &&
                      std::fabs(rounded - value) <= std::fabs(down - value),
                  "dtype %d: %g rounds to %g", dtype, value, rounded);
        }
    }
}

static void encode(int dtype, const std::vector<float>& values, unsigned char* out) {
    for (size_t i = 0; i < values.size(); ++i) {
        if (dtype == STAGEHAND_F32) {
            std::memcpy(out + 4 * i, &values[i], 4);
        } else if (size_of(dtype) == 1) {
            out[i] = (unsigned char)stagehand_float_to_fp8(values[i], dtype);
        } else {
            const unsigned bits = dtype == STAGEHAND_F16 ? stagehand_float_to_half(values[i])
                                                         : stagehand_float_to_bf16(values[i]);
            out[2 * i] = (unsigned char)bits;
            out[2 * i + 1] = (unsigned char)(bits >> 8);
        }
    }
}

static void widen_and_narrow() {
    const size_t count = 1000;
    const auto values = seeded(count, 1, 100.0f);
    for (int dtype : {STAGEHAND_F32, STAGEHAND_F16, STAGEHAND_BF16, STAGEHAND_F8E4M3, STAGEHAND_F8E5M2}) {
        const size_t size = size_of(dtype);
        for (size_t offset = 0; offset < 4; ++offset) {
            std::vector<unsigned char> bytes(offset + count * size + 4, 0xAB);
            encode(dtype, values, bytes.data() + offset);
            std::vector<float> widened(count);
            launch(3, 64, [&] { stagehand_widen(bytes.data() + offset, dtype, nullptr, widened.data(), count); });
            std::vector<unsigned char> narrowed(offset + count * size + 4, 0xCD);
            launch(2, 96, [&] { stagehand_narrow(widened.data(), narrowed.data() + offset, dtype, nullptr, count); });
            for (size_t i = 0; i < count; ++i) {
                float stored;
                if (dtype == STAGEHAND_F32) {
                    std::memcpy(&stored, bytes.data() + offset + 4 * i, 4);
                } else if (size == 1) {
                    stored = stagehand_fp8_to_float(bytes[offset + i], dtype);
                } else {
                    const unsigned char* at = bytes.data() + offset + 2 * i;
                    stored = from_bits(dtype, at[0] | (at[1] << 8));
                }
                CHECK(widened[i] == stored, "dtype %d offset %zu: widen %zu", dtype, offset, i);
            }
            CHECK(std::memcmp(narrowed.data() + offset, bytes.data() + offset, count * size) == 0,
                  "dtype %d offset %zu: narrow gives the stored bytes", dtype, offset);
            CHECK(narrowed[offset + count * size] == 0xCD && (offset == 0 || narrowed[offset - 1] == 0xCD),
                  "dtype %d offset %zu: narrow writes only its range", dtype, offset);
        }
    }
}

static double relative(double got, double expected) {
    return std::fabs(got - expected) / std::fmax(1.0, std::fabs(expected));
}

static void norms() {
    for (unsigned cols : {24u, 257u, 1000u}) {
        const unsigned rows = 3;
        const auto x = seeded(rows * cols, cols, 3.0f);
        const auto gamma = seeded(cols, 2, 1.0f), beta = seeded(cols, 3, 1.0f);
        std::vector<float> y(rows * cols), z(rows * cols), plain(rows * cols);
        // The production block (256 threads) once, smaller blocks (still several warps)
        // for the rest: a thread per CUDA thread is slow to start.
        const unsigned block = cols == 1000 ? 256 : 64;
        launch(rows, block, [&] { stagehand_layer_norm(x.data(), gamma.data(), beta.data(), 1e-12f, y.data(), cols); });
        launch(rows, block, [&] { stagehand_rms_norm(x.data(), gamma.data(), 1e-6f, z.data(), cols); });
        launch(rows, block, [&] { stagehand_rms_norm(x.data(), nullptr, 1e-6f, plain.data(), cols); });
        for (unsigned r = 0; r < rows; ++r) {
            double mean = 0, squares = 0;
            for (unsigned c = 0; c < cols; ++c) mean += x[r * cols + c];
            mean /= cols;
            double variance = 0;
            for (unsigned c = 0; c < cols; ++c) {
                const double deviation = x[r * cols + c] - mean;
                variance += deviation * deviation;
                squares += (double)x[r * cols + c] * x[r * cols + c];
            }
            variance /= cols;
            const double rms = std::sqrt(squares / cols + 1e-6);
            for (unsigned c = 0; c < cols; ++c) {
                const size_t i = r * cols + c;
                const double layer = (x[i] - mean) / std::sqrt(variance + 1e-12) * gamma[c] + beta[c];
                CHECK(relative(y[i], layer) < 1e-5, "layer_norm cols %u [%u,%u]: %g vs %g", cols, r, c, y[i], layer);
                CHECK(relative(z[i], x[i] / rms * gamma[c]) < 1e-5, "rms_norm cols %u [%u,%u]", cols, r, c);
                CHECK(relative(plain[i], x[i] / rms) < 1e-5, "rms_norm without weight cols %u", cols);
            }
        }
    }
}

static void softmax() {
    const unsigned heads = 2, sequences = 3;
    for (unsigned length : {7u, 33u}) {
        const std::vector<unsigned> lengths = {length, 1, length / 2 + 1};
        for (int causal : {0, 1}) {
            const size_t count = (size_t)heads * sequences * length * length;
            const auto original = seeded(count, length + causal, 8.0f);
            auto scores = original;
            launch(heads * sequences * length, 64, [&] {
                stagehand_masked_softmax(scores.data(), lengths.data(), sequences, length, length, 0, causal);
            });
            for (size_t row = 0; row < count / length; ++row) {
                const unsigned query = row % length, sequence = (row / length) % sequences;
                const unsigned visible = causal ? query + 1 : lengths[sequence];
                double top = -INFINITY, total = 0;
                for (unsigned j = 0; j < visible; ++j) top = std::fmax(top, original[row * length + j]);
                for (unsigned j = 0; j < visible; ++j) total += std::exp(original[row * length + j] - top);
                for (unsigned j = 0; j < length; ++j) {
                    const double expected = j < visible ? std::exp(original[row * length + j] - top) / total : 0.0;
                    const float got = scores[row * length + j];
                    CHECK(j < visible ? relative(got, expected) < 1e-5 : got == 0.0f,
                          "softmax length %u causal %d row %zu key %u: %g vs %g", length, causal, row, j, got, expected);
                }
            }
        }
    }
}

static void rows() {
    const unsigned rows = 5, cols = 24;
    auto x = seeded(rows * cols, 4, 2.0f);
    const auto y = seeded(rows * cols, 5, 2.0f);
    const std::vector<float> scales = {0.5f, -1.0f, 0.0f, 2.0f, 0.25f};
    auto expected = x;
    for (size_t i = 0; i < x.size(); ++i) expected[i] = expected[i] + y[i];
    launch(1, 64, [&] { stagehand_add(x.data(), y.data(), x.size()); });
    CHECK(x == expected, "add");
    for (size_t i = 0; i < x.size(); ++i) expected[i] = expected[i] + scales[i / cols] * y[i];
    launch(2, 32, [&] { stagehand_add_scaled_rows(x.data(), y.data(), scales.data(), rows, cols); });
    CHECK(x == expected, "add_scaled_rows");

    const auto table = seeded(10 * cols, 6, 1.0f);
    std::vector<unsigned char> bytes(3 + table.size() * 2);
    encode(STAGEHAND_F16, table, bytes.data() + 3);
    const std::vector<unsigned> ids = {3, 0, 9, 3, 7};
    for (unsigned r = 0; r < rows; ++r) {
        for (unsigned c = 0; c < cols; ++c) {
            const unsigned char* at = bytes.data() + 3 + 2 * (ids[r] * cols + c);
            expected[r * cols + c] = expected[r * cols + c] + stagehand_half_to_float(at[0] | (at[1] << 8));
        }
    }
    launch(1, 256, [&] { stagehand_gather_add(bytes.data() + 3, STAGEHAND_F16, nullptr, ids.data(), x.data(), rows, cols); });
    CHECK(x == expected, "gather_add from an odd offset");

    const auto bias = seeded(cols, 7, 1.0f);
    std::vector<float> filled(rows * cols);
    launch(1, 32, [&] { stagehand_fill_rows(filled.data(), bias.data(), rows, cols); });
    for (size_t i = 0; i < filled.size(); ++i) CHECK(filled[i] == bias[i % cols], "fill_rows %zu", i);

    auto gelu = seeded(512, 8, 8.0f);
    const auto before = gelu;
    launch(1, 128, [&] { stagehand_gelu_erf(gelu.data(), gelu.size()); });
    for (size_t i = 0; i < gelu.size(); ++i) {
        const double value = before[i];
        const double expected = value * 0.5 * std::erfc(-value / std::sqrt(2.0));
        CHECK(std::fabs(gelu[i] - expected) <= 1e-6 * std::fmax(1.0, std::fabs(expected)),
              "gelu(%g) = %g, expected %g", value, gelu[i], expected);
    }
}

// A weight with a scale at an odd address: widened values are stored × scale, and a
// merged value narrows back through the scale to the same code.
static void scaled() {
    const size_t count = 300;
    const auto values = seeded(count, 9, 400.0f);
    std::vector<unsigned char> bytes(1 + count + 4 + 1);
    encode(STAGEHAND_F8E4M3, values, bytes.data() + 1);
    const float scale = 0.0625f;
    std::memcpy(bytes.data() + 1 + count, &scale, 4);
    const unsigned char* scale_at = bytes.data() + 1 + count;
    std::vector<float> widened(count);
    launch(1, 64, [&] { stagehand_widen(bytes.data() + 1, STAGEHAND_F8E4M3, scale_at, widened.data(), count); });
    std::vector<unsigned char> narrowed(count);
    launch(1, 64, [&] { stagehand_narrow(widened.data(), narrowed.data(), STAGEHAND_F8E4M3, scale_at, count); });
    for (size_t i = 0; i < count; ++i) {
        CHECK(widened[i] == stagehand_fp8_to_float(bytes[1 + i], STAGEHAND_F8E4M3) * scale, "scaled widen %zu", i);
        CHECK(narrowed[i] == bytes[1 + i], "scaled narrow %zu", i);
    }
    std::vector<unsigned> ids = {2, 0};
    std::vector<float> out(2 * 10, 1.0f);
    launch(1, 32, [&] { stagehand_gather_add(bytes.data() + 1, STAGEHAND_F8E4M3, scale_at, ids.data(), out.data(), 2, 10); });
    for (unsigned r = 0; r < 2; ++r)
        for (unsigned c = 0; c < 10; ++c)
            CHECK(out[r * 10 + c] == 1.0f + stagehand_fp8_to_float(bytes[1 + ids[r] * 10 + c], STAGEHAND_F8E4M3) * scale,
                  "scaled gather [%u,%u]", r, c);
}

static void decoder() {
    // Causal softmax over a cache: query i of `queries` sees keys 0..=past + i.
    const unsigned heads = 2, queries = 3, past = 4, keys = past + queries;
    const auto original = seeded(heads * queries * keys, 11, 6.0f);
    auto scores = original;
    launch(heads * queries, 64, [&] { stagehand_masked_softmax(scores.data(), nullptr, 1, queries, keys, past, 1); });
    for (unsigned row = 0; row < heads * queries; ++row) {
        const unsigned visible = past + row % queries + 1;
        double top = -INFINITY, total = 0;
        for (unsigned j = 0; j < visible; ++j) top = std::fmax(top, original[row * keys + j]);
        for (unsigned j = 0; j < visible; ++j) total += std::exp(original[row * keys + j] - top);
        for (unsigned j = 0; j < keys; ++j) {
            const double expected = j < visible ? std::exp(original[row * keys + j] - top) / total : 0.0;
            CHECK(j < visible ? relative(scores[row * keys + j], expected) < 1e-5 : scores[row * keys + j] == 0.0f,
                  "cached softmax row %u key %u", row, j);
        }
    }

    auto gate = seeded(200, 12, 8.0f);
    const auto up = seeded(200, 13, 2.0f), before = gate;
    launch(1, 64, [&] { stagehand_silu_mul(gate.data(), up.data(), gate.size()); });
    for (size_t i = 0; i < gate.size(); ++i) {
        const double expected = before[i] / (1.0 + std::exp(-(double)before[i])) * up[i];
        CHECK(relative(gate[i], expected) < 1e-5, "silu_mul %zu", i);
    }

    const unsigned rows = 3, rope_heads = 2, head_dim = 8, half = head_dim / 2;
    auto x = seeded(rows * rope_heads * head_dim, 14, 1.0f);
    const auto original_x = x;
    const std::vector<unsigned> positions = {0, 5, 1000};
    const std::vector<float> frequencies = {1.0f, 0.1f, 0.01f, 0.001f};
    launch(1, 32, [&] { stagehand_rope(x.data(), positions.data(), frequencies.data(), rows, rope_heads, head_dim); });
    for (unsigned r = 0; r < rows; ++r)
        for (unsigned h = 0; h < rope_heads; ++h)
            for (unsigned i = 0; i < half; ++i) {
                const size_t at = (r * rope_heads + h) * head_dim + i;
                const double angle = (double)(float)((float)positions[r] * frequencies[i]);
                const double a = original_x[at], b = original_x[at + half];
                CHECK(std::fabs(x[at] - (a * std::cos(angle) - b * std::sin(angle))) < 1e-5 &&
                          std::fabs(x[at + half] - (b * std::cos(angle) + a * std::sin(angle))) < 1e-5,
                      "rope row %u head %u pair %u", r, h, i);
            }
}

// The diffusion-transformer kernels (Flux) against plain loops in double precision.
static void diffusion() {
    const unsigned rows = 3, cols = 257;
    const auto x = seeded(rows * cols, 20, 3.0f);
    const auto shift = seeded(cols, 21, 1.0f), scale = seeded(cols, 22, 0.5f);
    std::vector<float> y(rows * cols);
    launch(rows, 64, [&] { stagehand_adaptive_norm(x.data(), shift.data(), scale.data(), 1e-6f, y.data(), cols); });
    for (unsigned r = 0; r < rows; ++r) {
        double mean = 0, variance = 0;
        for (unsigned c = 0; c < cols; ++c) mean += x[r * cols + c];
        mean /= cols;
        for (unsigned c = 0; c < cols; ++c) variance += (x[r * cols + c] - mean) * (x[r * cols + c] - mean);
        variance /= cols;
        for (unsigned c = 0; c < cols; ++c) {
            const double expected = (x[r * cols + c] - mean) / std::sqrt(variance + 1e-6) * (1.0 + scale[c]) + shift[c];
            CHECK(relative(y[r * cols + c], expected) < 1e-5, "adaptive_norm [%u,%u]: %g vs %g", r, c, y[r * cols + c], expected);
        }
    }

    auto gated = x;
    const auto add = seeded(rows * cols, 23, 2.0f), gate = seeded(cols, 24, 1.0f);
    launch(2, 32, [&] { stagehand_add_gated(gated.data(), add.data(), gate.data(), rows, cols); });
    for (size_t i = 0; i < gated.size(); ++i) {
        CHECK(gated[i] == x[i] + gate[i % cols] * add[i], "add_gated %zu", i);
    }

    auto silu = seeded(300, 25, 8.0f), tanh_gelu = silu;
    const auto before = silu;
    launch(1, 64, [&] { stagehand_silu(silu.data(), silu.size()); });
    launch(1, 64, [&] { stagehand_gelu_tanh(tanh_gelu.data(), tanh_gelu.size()); });
    for (size_t i = 0; i < before.size(); ++i) {
        const double v = before[i];
        CHECK(relative(silu[i], v / (1.0 + std::exp(-v))) < 1e-5, "silu(%g) = %g", v, silu[i]);
        const double gelu = 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
        CHECK(relative(tanh_gelu[i], gelu) < 1e-5, "gelu_tanh(%g) = %g, expected %g", v, tanh_gelu[i], gelu);
    }

    // Interleaved pairs: head h of row r turns pair (2i, 2i + 1) by the table's
    // (cos, sin) at row r, columns 2i and 2i + 1.
    const unsigned heads = 2, head_dim = 8;
    auto turned = seeded(rows * heads * head_dim, 26, 1.0f);
    const auto original = turned;
    std::vector<float> table(rows * head_dim);
    for (unsigned r = 0; r < rows; ++r)
        for (unsigned i = 0; i < head_dim / 2; ++i) {
            const double angle = 0.3 * (r + 1) * (i + 1);
            table[r * head_dim + 2 * i] = (float)std::cos(angle);
            table[r * head_dim + 2 * i + 1] = (float)std::sin(angle);
        }
    launch(1, 32, [&] { stagehand_rope_pairs(turned.data(), table.data(), rows, heads, head_dim); });
    for (unsigned r = 0; r < rows; ++r)
        for (unsigned h = 0; h < heads; ++h)
            for (unsigned i = 0; i < head_dim / 2; ++i) {
                const size_t at = (r * heads + h) * head_dim + 2 * i;
                const float cosine = table[r * head_dim + 2 * i], sine = table[r * head_dim + 2 * i + 1];
                const float real = original[at], imaginary = original[at + 1];
                CHECK(turned[at] == real * cosine - imaginary * sine &&
                          turned[at + 1] == imaginary * cosine + real * sine,
                      "rope_pairs row %u head %u pair %u", r, h, i);
            }

    const unsigned wide = 11, narrow = 4, at = 5;
    std::vector<float> to(rows * wide, -1.0f);
    const auto from = seeded(rows * narrow, 27, 1.0f);
    launch(1, 32, [&] { stagehand_write_cols(to.data(), from.data(), rows, wide, at, narrow); });
    for (unsigned r = 0; r < rows; ++r)
        for (unsigned c = 0; c < wide; ++c) {
            const bool inside = c >= at && c < at + narrow;
            CHECK(to[r * wide + c] == (inside ? from[r * narrow + c - at] : -1.0f), "write_cols [%u,%u]", r, c);
        }
}

// Prints "checksum OFFSET LENGTH SUM" for a buffer tests/cuda.rs rebuilds: byte i is
// (i · 2654435761 mod 2^32) >> 13, truncated to a byte.
static void checksums() {
    std::vector<unsigned char> bytes((1u << 16) + 7);
    for (unsigned i = 0; i < bytes.size(); ++i) bytes[i] = (unsigned char)((i * 2654435761u) >> 13);
    const size_t cases[][2] = {{0, bytes.size()}, {1, 4097}, {2, 6}, {4, 1u << 16}, {7, 1}, {3, 0}};
    for (const auto& range : cases) {
        unsigned long long sum = 0;
        launch(3, 64, [&] { stagehand_checksum(bytes.data() + range[0], range[1], &sum); });
        std::printf("checksum %zu %zu %llu\n", range[0], range[1], sum);
    }
}

// Prints "narrow DTYPE F32BITS CODE" for a sweep of values (ties, subnormals, out of
// range, both signs), which tests/cuda.rs compares with crate::compute::DType's own
// narrowing.
static void narrowing_sweep() {
    std::vector<float> sweep;
    for (float value = 1e-9f; value < 1e6f; value *= 1.37f) {
        sweep.push_back(value);
        sweep.push_back(-value);
    }
    for (int dtype : {STAGEHAND_F16, STAGEHAND_BF16, STAGEHAND_F8E4M3, STAGEHAND_F8E5M2}) {
        // Values half-way between neighbouring codes: the ties.
        for (unsigned code = 0; code < (size_of(dtype) == 1 ? 0x7eu : 0x7bffu); code += 7) {
            const float low = from_bits(dtype, code), high = from_bits(dtype, code + 1);
            if (std::isfinite(low) && std::isfinite(high)) sweep.push_back((low + high) / 2);
        }
    }
    for (int dtype : {STAGEHAND_F16, STAGEHAND_BF16, STAGEHAND_F8E4M3, STAGEHAND_F8E5M2}) {
        for (float value : sweep) {
            unsigned char stored[2] = {0, 0};
            stagehand_store(stored, 0, dtype, value);
            const unsigned code = size_of(dtype) == 1 ? stored[0] : stored[0] | (stored[1] << 8);
            std::printf("narrow %d %u %u\n", dtype, __float_as_uint(value), code);
        }
    }
}

int main() {
    conversions();
    widen_and_narrow();
    norms();
    softmax();
    rows();
    scaled();
    decoder();
    diffusion();
    checksums();
    narrowing_sweep();
    std::printf("%s: %d failure(s)\n", failures ? "FAILED" : "passed", failures);
    return failures ? 1 : 0;
}
