//! The x86-64 lanes: AVX2/FMA/F16C (two ymm) and AVX-512 (one zmm).

use std::arch::x86_64::*;

use super::{Format, Kind, Lanes, NAN_BITS};

/// Two ymm registers: lanes 0–7 and 8–15.
#[derive(Clone, Copy)]
pub(in crate::device::cpu_compute) struct Avx2(__m256, __m256);

/// Eight f16 bit patterns (as 16-bit integers) widened to f32.
#[inline(always)]
unsafe fn halves_to_f32(bits: __m128i) -> __m256 {
    // SAFETY: F16C, which `Isa::detect` checked with AVX2.
    unsafe { _mm256_cvtph_ps(bits) }
}

/// Eight E4M3 codes (in the low bytes of 32-bit lanes) widened to f32.
#[inline(always)]
unsafe fn e4m3_eight(codes: __m256i) -> __m256 {
    // SAFETY: AVX2 and F16C (checked by `Isa::detect`).
    unsafe {
        let sign = _mm256_slli_epi32(_mm256_and_si256(codes, _mm256_set1_epi32(0x80)), 8);
        let rest = _mm256_and_si256(codes, _mm256_set1_epi32(0x7f));
        let half = _mm256_or_si256(sign, _mm256_slli_epi32(rest, 7));
        let packed = _mm256_packus_epi32(half, half);
        let ordered = _mm256_permute4x64_epi64(packed, 0b1000);
        let value = _mm256_mul_ps(
            halves_to_f32(_mm256_castsi256_si128(ordered)),
            _mm256_set1_ps(256.0),
        );
        let nan = _mm256_castsi256_ps(_mm256_cmpeq_epi32(rest, _mm256_set1_epi32(0x7f)));
        _mm256_blendv_ps(
            value,
            _mm256_castsi256_ps(_mm256_set1_epi32(NAN_BITS as i32)),
            nan,
        )
    }
}

impl Lanes for Avx2 {
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: AVX (checked by `Isa::detect`).
        unsafe { Avx2(_mm256_setzero_ps(), _mm256_setzero_ps()) }
    }
    #[inline(always)]
    unsafe fn load(at: *const f32) -> Self {
        // SAFETY: the trait's contract.
        unsafe { Avx2(_mm256_loadu_ps(at), _mm256_loadu_ps(at.add(8))) }
    }
    #[inline(always)]
    unsafe fn widen<F: Format>(at: *const u8) -> Self {
        // SAFETY: the trait's contract: 16 elements of F at `at`.
        unsafe {
            match F::KIND {
                Kind::F32 => Self::load(at as *const f32),
                Kind::Bf16 => {
                    let words = _mm256_loadu_si256(at as *const __m256i);
                    let low = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(words));
                    let high = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(words, 1));
                    Avx2(
                        _mm256_castsi256_ps(_mm256_slli_epi32(low, 16)),
                        _mm256_castsi256_ps(_mm256_slli_epi32(high, 16)),
                    )
                }
                Kind::F16 => Avx2(
                    halves_to_f32(_mm_loadu_si128(at as *const __m128i)),
                    halves_to_f32(_mm_loadu_si128(at.add(16) as *const __m128i)),
                ),
                Kind::E5M2 => {
                    let codes = _mm_loadu_si128(at as *const __m128i);
                    let zero = _mm_setzero_si128();
                    Avx2(
                        halves_to_f32(_mm_unpacklo_epi8(zero, codes)),
                        halves_to_f32(_mm_unpackhi_epi8(zero, codes)),
                    )
                }
                Kind::I8 => {
                    let low = _mm256_cvtepi8_epi32(_mm_loadl_epi64(at as *const __m128i));
                    let high = _mm256_cvtepi8_epi32(_mm_loadl_epi64(at.add(8) as *const __m128i));
                    Avx2(_mm256_cvtepi32_ps(low), _mm256_cvtepi32_ps(high))
                }
                Kind::E4M3 => {
                    let low = _mm256_cvtepu8_epi32(_mm_loadl_epi64(at as *const __m128i));
                    let high = _mm256_cvtepu8_epi32(_mm_loadl_epi64(at.add(8) as *const __m128i));
                    Avx2(e4m3_eight(low), e4m3_eight(high))
                }
            }
        }
    }
    #[inline(always)]
    unsafe fn splat(value: f32) -> Self {
        // SAFETY: AVX (checked by `Isa::detect`).
        unsafe { Avx2(_mm256_set1_ps(value), _mm256_set1_ps(value)) }
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        // SAFETY: FMA (checked by `Isa::detect`).
        unsafe {
            Avx2(
                _mm256_fmadd_ps(a.0, b.0, c.0),
                _mm256_fmadd_ps(a.1, b.1, c.1),
            )
        }
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        // SAFETY: AVX (checked by `Isa::detect`).
        unsafe { Avx2(_mm256_mul_ps(a.0, b.0), _mm256_mul_ps(a.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        // SAFETY: AVX (checked by `Isa::detect`).
        unsafe { Avx2(_mm256_add_ps(a.0, b.0), _mm256_add_ps(a.1, b.1)) }
    }
    #[inline(always)]
    unsafe fn store(self, at: *mut f32) {
        // SAFETY: the trait's contract.
        unsafe {
            _mm256_storeu_ps(at, self.0);
            _mm256_storeu_ps(at.add(8), self.1);
        }
    }
}

/// One zmm register.
#[derive(Clone, Copy)]
pub(in crate::device::cpu_compute) struct Avx512(__m512);

impl Lanes for Avx512 {
    #[inline(always)]
    unsafe fn zero() -> Self {
        // SAFETY: AVX-512F (checked by `Isa::detect`).
        unsafe { Avx512(_mm512_setzero_ps()) }
    }
    #[inline(always)]
    unsafe fn load(at: *const f32) -> Self {
        // SAFETY: the trait's contract.
        unsafe { Avx512(_mm512_loadu_ps(at)) }
    }
    #[inline(always)]
    unsafe fn widen<F: Format>(at: *const u8) -> Self {
        // SAFETY: the trait's contract: 16 elements of F at `at`.
        unsafe {
            match F::KIND {
                Kind::F32 => Self::load(at as *const f32),
                Kind::Bf16 => {
                    let words = _mm512_cvtepu16_epi32(_mm256_loadu_si256(at as *const __m256i));
                    Avx512(_mm512_castsi512_ps(_mm512_slli_epi32(words, 16)))
                }
                Kind::F16 => Avx512(_mm512_cvtph_ps(_mm256_loadu_si256(at as *const __m256i))),
                Kind::E5M2 => {
                    let codes = _mm256_cvtepu8_epi16(_mm_loadu_si128(at as *const __m128i));
                    Avx512(_mm512_cvtph_ps(_mm256_slli_epi16(codes, 8)))
                }
                Kind::I8 => Avx512(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
                    at as *const __m128i,
                )))),
                Kind::E4M3 => {
                    let codes = _mm512_cvtepu8_epi32(_mm_loadu_si128(at as *const __m128i));
                    let rest = _mm512_and_si512(codes, _mm512_set1_epi32(0x7f));
                    let sign =
                        _mm512_slli_epi32(_mm512_and_si512(codes, _mm512_set1_epi32(0x80)), 8);
                    let half = _mm512_or_si512(sign, _mm512_slli_epi32(rest, 7));
                    let value = _mm512_mul_ps(
                        _mm512_cvtph_ps(_mm512_cvtepi32_epi16(half)),
                        _mm512_set1_ps(256.0),
                    );
                    let nan = _mm512_cmpeq_epi32_mask(rest, _mm512_set1_epi32(0x7f));
                    Avx512(_mm512_mask_mov_ps(
                        value,
                        nan,
                        _mm512_castsi512_ps(_mm512_set1_epi32(NAN_BITS as i32)),
                    ))
                }
            }
        }
    }
    #[inline(always)]
    unsafe fn widen_pair<F: Format>(at: *const u8) -> (Self, Self) {
        if F::KIND != Kind::E4M3 {
            // SAFETY: the trait's contract covers 32 elements.
            return unsafe {
                (
                    Self::widen::<F>(at),
                    Self::widen::<F>(at.add(16 * F::BYTES)),
                )
            };
        }
        // The f16 trick of `e4m3_value` on 32 codes in 16-bit lanes (AVX-512BW):
        // half the integer work of two 16-code widenings, the decode step's
        // inner loop for FP8 weights.
        // SAFETY: the trait's contract: 32 codes at `at`; AVX-512F/BW and F16C
        // were checked by `Isa::detect`.
        unsafe {
            let codes = _mm512_cvtepu8_epi16(_mm256_loadu_si256(at as *const __m256i));
            let rest = _mm512_and_si512(codes, _mm512_set1_epi16(0x7f));
            let sign = _mm512_slli_epi16(_mm512_and_si512(codes, _mm512_set1_epi16(0x80)), 8);
            let half = _mm512_or_si512(sign, _mm512_slli_epi16(rest, 7));
            let nan = _mm512_cmpeq_epi16_mask(rest, _mm512_set1_epi16(0x7f));
            let nan_value = _mm512_castsi512_ps(_mm512_set1_epi32(NAN_BITS as i32));
            let factor = _mm512_set1_ps(256.0);
            let low = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(half)), factor);
            let high = _mm512_mul_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(half, 1)), factor);
            (
                Avx512(_mm512_mask_mov_ps(low, nan as u16, nan_value)),
                Avx512(_mm512_mask_mov_ps(high, (nan >> 16) as u16, nan_value)),
            )
        }
    }
    #[inline(always)]
    unsafe fn splat(value: f32) -> Self {
        // SAFETY: AVX-512F (checked by `Isa::detect`).
        unsafe { Avx512(_mm512_set1_ps(value)) }
    }
    #[inline(always)]
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        // SAFETY: AVX-512F (checked by `Isa::detect`).
        unsafe { Avx512(_mm512_fmadd_ps(a.0, b.0, c.0)) }
    }
    #[inline(always)]
    unsafe fn mul(a: Self, b: Self) -> Self {
        // SAFETY: AVX-512F (checked by `Isa::detect`).
        unsafe { Avx512(_mm512_mul_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn add(a: Self, b: Self) -> Self {
        // SAFETY: AVX-512F (checked by `Isa::detect`).
        unsafe { Avx512(_mm512_add_ps(a.0, b.0)) }
    }
    #[inline(always)]
    unsafe fn store(self, at: *mut f32) {
        // SAFETY: the trait's contract.
        unsafe { _mm512_storeu_ps(at, self.0) }
    }
}
