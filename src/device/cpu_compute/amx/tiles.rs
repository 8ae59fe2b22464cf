//! The AMX tile registers: configuration, the kernel's `tdpbf16ps` loop (inline
//! assembly) and the AVX-512 transpose of an accumulator into `y`.

use std::arch::asm;
use std::arch::x86_64::*;

/// Four 16 × 16 f32 accumulators, in the kernel's order: (features 0–15, rows
/// 0–15), (0–15, 16–31), (16–31, 0–15), (16–31, 16–31).
#[repr(C, align(64))]
pub(super) struct Accumulators(pub [f32; 1024]);

impl Default for Accumulators {
    fn default() -> Self {
        Self([0.0; 1024])
    }
}

#[repr(C, align(64))]
struct Configuration([u8; 64]);

/// Palette 1, eight tiles of 16 rows × 64 bytes.
const CONFIGURATION: Configuration = {
    let mut bytes = [0u8; 64];
    bytes[0] = 1;
    let mut tile = 0;
    while tile < 8 {
        bytes[16 + 2 * tile] = 64;
        bytes[48 + tile] = 16;
        tile += 1;
    }
    Configuration(bytes)
};

/// # Safety
/// The process was granted the tile state (`super::available`).
pub(super) unsafe fn configure() {
    // SAFETY: a valid configuration (the caller's contract for the grant).
    unsafe {
        asm!("ldtilecfg [{}]", in(reg) CONFIGURATION.0.as_ptr(), options(nostack, readonly));
    }
}

/// # Safety
/// The tiles were configured on this thread.
pub(super) unsafe fn release() {
    // SAFETY: the caller's contract.
    unsafe { asm!("tilerelease", options(nostack, nomem)) };
}

/// `sums ← Σ_c panel(c)·packed(c)` over `chunks` tiles of the inner dimension (`+
/// sums` when `resume`: the accumulators continue a chain begun on an earlier slab):
/// the weight tiles are 16 panel rows of 64 bytes at `stride_bytes`, the activation
/// tiles 1 KiB each, row block 0's from `packed`, row block 1's `row_block_tiles`
/// tiles later.
///
/// # Safety
/// Tiles configured on this thread; `panel` covers 32 rows at `stride_bytes` of
/// `chunks` × 64 bytes, `packed` `row_block_tiles + chunks` tiles; `chunks ≥ 1`.
pub(super) unsafe fn multiply(
    panel: *const u16,
    stride_bytes: usize,
    (packed, row_block_tiles): (*const u16, usize),
    (chunks, resume): (usize, bool),
    sums: &mut Accumulators,
) {
    assert!(chunks >= 1);
    // SAFETY: every load is inside the ranges of the caller's contract; the four
    // loads and stores of `sums` cover it (4 × 1 KiB at a 64-byte stride). The tile
    // registers keep their values between the two `asm!` blocks (nothing else on this
    // thread uses them).
    unsafe {
        let second_panel = panel.cast::<u8>().add(16 * stride_bytes);
        let second_rows = packed.cast::<u8>().add(row_block_tiles * 1024);
        if resume {
            asm!(
                "tileloadd tmm0, [{c} + {stride}*1]",
                "add {c}, 1024",
                "tileloadd tmm1, [{c} + {stride}*1]",
                "add {c}, 1024",
                "tileloadd tmm2, [{c} + {stride}*1]",
                "add {c}, 1024",
                "tileloadd tmm3, [{c} + {stride}*1]",
                c = inout(reg) sums.0.as_ptr() => _,
                stride = in(reg) 64usize,
                options(nostack, readonly)
            );
        } else {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            );
        }
        asm!(
            "2:",
            "tileloadd tmm4, [{a0} + {a_stride}*1]",
            "tileloadd tmm5, [{a1} + {a_stride}*1]",
            "tileloadd tmm6, [{b0} + {b_stride}*1]",
            "tileloadd tmm7, [{b1} + {b_stride}*1]",
            "tdpbf16ps tmm0, tmm4, tmm6",
            "tdpbf16ps tmm1, tmm4, tmm7",
            "tdpbf16ps tmm2, tmm5, tmm6",
            "tdpbf16ps tmm3, tmm5, tmm7",
            "add {a0}, 64",
            "add {a1}, 64",
            "add {b0}, 1024",
            "add {b1}, 1024",
            "dec {chunks}",
            "jnz 2b",
            "tilestored [{c} + {b_stride}*1], tmm0",
            "add {c}, 1024",
            "tilestored [{c} + {b_stride}*1], tmm1",
            "add {c}, 1024",
            "tilestored [{c} + {b_stride}*1], tmm2",
            "add {c}, 1024",
            "tilestored [{c} + {b_stride}*1], tmm3",
            a0 = inout(reg) panel.cast::<u8>() => _,
            a1 = inout(reg) second_panel => _,
            a_stride = in(reg) stride_bytes,
            b0 = inout(reg) packed.cast::<u8>() => _,
            b1 = inout(reg) second_rows => _,
            b_stride = in(reg) 64usize,
            chunks = inout(reg) chunks => _,
            c = inout(reg) sums.0.as_mut_ptr() => _,
            options(nostack)
        );
    }
}

/// Writes the transpose of a 16 × 16 accumulator (features × rows) into `target`
/// (row-major, `stride` floats a row): `valid_rows` rows of `features` values,
/// each `sum·scale (+ bias)`.
///
/// # Safety
/// `target` covers `valid_rows` rows of `features` floats at `stride`; the CPU has
/// AVX-512F (every AMX CPU does).
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn store_transposed(
    sums: &[f32],
    (target, stride): (*mut f32, usize),
    (valid_rows, features): (usize, usize),
    scale: f32,
    bias: Option<&[f32]>,
) {
    assert_eq!(sums.len(), 256);
    assert!(features <= 16 && bias.is_none_or(|bias| bias.len() == features));
    let mask: __mmask16 = if features == 16 {
        0xffff
    } else {
        (1u16 << features) - 1
    };
    // SAFETY: 16 rows of 16 floats inside `sums` (asserted); the masked loads and
    // stores touch `features` floats of `bias` and of each of `valid_rows` rows
    // of `target` (the caller's contract).
    unsafe {
        let mut rows = [_mm512_setzero_ps(); 16];
        for (index, row) in rows.iter_mut().enumerate() {
            *row = _mm512_loadu_ps(sums.as_ptr().add(index * 16));
        }
        transpose(&mut rows);
        let scale = _mm512_set1_ps(scale);
        let bias = bias.map(|bias| _mm512_maskz_loadu_ps(mask, bias.as_ptr()));
        for (index, row) in rows.iter().take(valid_rows).enumerate() {
            let scaled = _mm512_mul_ps(*row, scale);
            let value = bias.map_or(scaled, |bias| _mm512_add_ps(scaled, bias));
            _mm512_mask_storeu_ps(target.add(index * stride), mask, value);
        }
    }
}

/// Transposes 16 rows of 16 floats in registers.
#[target_feature(enable = "avx512f")]
fn transpose(rows: &mut [__m512; 16]) {
    let r = rows;
    let mut t = [_mm512_setzero_ps(); 16];
    for pair in 0..8 {
        t[2 * pair] = _mm512_unpacklo_ps(r[2 * pair], r[2 * pair + 1]);
        t[2 * pair + 1] = _mm512_unpackhi_ps(r[2 * pair], r[2 * pair + 1]);
    }
    for quad in 0..4 {
        let base = 4 * quad;
        let (a, b) = (_mm512_castps_pd(t[base]), _mm512_castps_pd(t[base + 2]));
        let (c, d) = (_mm512_castps_pd(t[base + 1]), _mm512_castps_pd(t[base + 3]));
        r[base] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, b));
        r[base + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, b));
        r[base + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(c, d));
        r[base + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(c, d));
    }
    for half in 0..2 {
        let base = 8 * half;
        for lane in 0..4 {
            t[base + lane] = _mm512_shuffle_f32x4::<0x88>(r[base + lane], r[base + 4 + lane]);
            t[base + 4 + lane] = _mm512_shuffle_f32x4::<0xdd>(r[base + lane], r[base + 4 + lane]);
        }
    }
    for lane in 0..8 {
        r[lane] = _mm512_shuffle_f32x4::<0x88>(t[lane], t[8 + lane]);
        r[8 + lane] = _mm512_shuffle_f32x4::<0xdd>(t[lane], t[8 + lane]);
    }
}
