//! Sixteen f32 lanes in registers, and the storage dtypes widened into them.
//!
//! [`Lanes`] is implemented three times — AVX-512 (one zmm), AVX2/FMA/F16C (two ymm)
//! and portable (an array) — and the kernels are written once over it. Every
//! implementation computes the same thing lane by lane: a widened value is exact in
//! each (bf16, f16 and FP8 are all f32 values), and `fma` is one fused multiply-add
//! per lane, rounded once. So a kernel gives the same bits whichever implementation
//! this CPU runs, and the tests check the vector ones against the portable one.

/// Sixteen f32 lanes.
pub(super) trait Lanes: Copy {
    /// # Safety (all methods)
    /// The CPU has the implementation's instruction set ([`Isa::detect`] chose it),
    /// and every pointer is valid for the bytes read or written.
    unsafe fn zero() -> Self;
    /// Sixteen f32 values at `at` (any alignment).
    unsafe fn load(at: *const f32) -> Self;
    /// Sixteen values at `at` in storage format `F`, widened exactly.
    unsafe fn widen<F: Format>(at: *const u8) -> Self;
    /// Thirty-two values at `at` (elements 0–15, 16–31), widened exactly: the same
    /// lanes as two [`Lanes::widen`], in fewer instructions where a format packs
    /// (FP8 in 16-bit lanes on AVX-512).
    #[inline(always)]
    unsafe fn widen_pair<F: Format>(at: *const u8) -> (Self, Self) {
        // SAFETY: the trait's contract covers 32 elements.
        unsafe {
            (
                Self::widen::<F>(at),
                Self::widen::<F>(at.add(16 * F::BYTES)),
            )
        }
    }
    /// `value` in every lane.
    unsafe fn splat(value: f32) -> Self;
    /// `a·b + c` per lane, rounded once.
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self;
    /// `a·b` per lane.
    unsafe fn mul(a: Self, b: Self) -> Self;
    /// `a + b` per lane.
    unsafe fn add(a: Self, b: Self) -> Self;
    unsafe fn store(self, at: *mut f32);
}

/// A storage dtype the kernels read in place.
pub(super) trait Format {
    /// Bytes per element.
    const BYTES: usize;
    /// Which format, for the vector lanes' widening (a constant: the `match` on it
    /// folds away in each instantiation).
    const KIND: Kind;
    /// One element at `at`, widened exactly (the tails and the portable lanes).
    ///
    /// # Safety
    /// `at` is valid for `BYTES` bytes.
    unsafe fn scalar(at: *const u8) -> f32;
}

/// The storage formats, as [`Format::KIND`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    F32,
    F16,
    Bf16,
    E4M3,
    E5M2,
    I8,
}

pub(super) struct F32;
pub(super) struct F16;
pub(super) struct Bf16;
pub(super) struct E4M3;
pub(super) struct E5M2;
pub(super) struct I8;

impl Format for F32 {
    const KIND: Kind = Kind::F32;
    const BYTES: usize = 4;
    unsafe fn scalar(at: *const u8) -> f32 {
        // SAFETY: the caller's contract; unaligned reads are fine.
        f32::from_le_bytes(unsafe { std::ptr::read_unaligned(at as *const [u8; 4]) })
    }
}

impl Format for F16 {
    const KIND: Kind = Kind::F16;
    const BYTES: usize = 2;
    unsafe fn scalar(at: *const u8) -> f32 {
        // SAFETY: the caller's contract.
        half::f16::from_le_bytes(unsafe { std::ptr::read_unaligned(at as *const [u8; 2]) }).to_f32()
    }
}

impl Format for Bf16 {
    const KIND: Kind = Kind::Bf16;
    const BYTES: usize = 2;
    unsafe fn scalar(at: *const u8) -> f32 {
        // SAFETY: the caller's contract.
        let bits = u16::from_le_bytes(unsafe { std::ptr::read_unaligned(at as *const [u8; 2]) });
        f32::from_bits(u32::from(bits) << 16)
    }
}

impl Format for E4M3 {
    const KIND: Kind = Kind::E4M3;
    const BYTES: usize = 1;
    unsafe fn scalar(at: *const u8) -> f32 {
        // SAFETY: the caller's contract.
        e4m3_value(unsafe { *at })
    }
}

impl Format for E5M2 {
    const KIND: Kind = Kind::E5M2;
    const BYTES: usize = 1;
    unsafe fn scalar(at: *const u8) -> f32 {
        // SAFETY: the caller's contract. An E5M2 code is the top byte of an f16.
        half::f16::from_bits(u16::from(unsafe { *at }) << 8).to_f32()
    }
}

impl Format for I8 {
    const KIND: Kind = Kind::I8;
    const BYTES: usize = 1;
    unsafe fn scalar(at: *const u8) -> f32 {
        // SAFETY: the caller's contract.
        f32::from(unsafe { *at } as i8)
    }
}

/// The quiet NaN every E4M3 NaN code widens to (the bits `f32::NAN` has).
const NAN_BITS: u32 = 0x7fc0_0000;

/// An E4M3 code's value by the f16 trick the vector lanes use: `S.EEEE.MMM` shifted
/// into an f16's exponent and mantissa is the value divided by 2⁸ (f16's exponent
/// bias is 15, E4M3's 7), subnormals included; `S.1111.111` is NaN.
fn e4m3_value(code: u8) -> f32 {
    if code & 0x7f == 0x7f {
        return f32::from_bits(NAN_BITS);
    }
    let bits = (u16::from(code & 0x80) << 8) | (u16::from(code & 0x7f) << 7);
    half::f16::from_bits(bits).to_f32() * 256.0
}

/// The portable lanes: an array the compiler vectorises with what the target has.
#[derive(Clone, Copy)]
pub(super) struct Portable([f32; 16]);

impl Lanes for Portable {
    unsafe fn zero() -> Self {
        Portable([0.0; 16])
    }
    unsafe fn load(at: *const f32) -> Self {
        // SAFETY: the caller's contract.
        Portable(unsafe { std::ptr::read_unaligned(at as *const [f32; 16]) })
    }
    unsafe fn widen<F: Format>(at: *const u8) -> Self {
        let mut lanes = [0.0; 16];
        for (lane, value) in lanes.iter_mut().enumerate() {
            // SAFETY: the caller's contract covers 16 elements.
            *value = unsafe { F::scalar(at.add(lane * F::BYTES)) };
        }
        Portable(lanes)
    }
    unsafe fn splat(value: f32) -> Self {
        Portable([value; 16])
    }
    unsafe fn fma(a: Self, b: Self, c: Self) -> Self {
        let mut lanes = c.0;
        for (lane, value) in lanes.iter_mut().enumerate() {
            *value = a.0[lane].mul_add(b.0[lane], *value);
        }
        Portable(lanes)
    }
    unsafe fn mul(a: Self, b: Self) -> Self {
        Portable(std::array::from_fn(|lane| a.0[lane] * b.0[lane]))
    }
    unsafe fn add(a: Self, b: Self) -> Self {
        Portable(std::array::from_fn(|lane| a.0[lane] + b.0[lane]))
    }
    unsafe fn store(self, at: *mut f32) {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::write_unaligned(at as *mut [f32; 16], self.0) }
    }
}

#[cfg(target_arch = "x86_64")]
pub(super) use x86::{Avx2, Avx512};

#[cfg(target_arch = "x86_64")]
mod x86;

/// The widest lanes this CPU runs, chosen once per process so every product of the
/// process takes the same code path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Isa {
    Avx512,
    Avx2,
    Portable,
}

/// [`crate::settings::CPU_PATH_ENV`] caps the lanes below what the CPU has:
/// `portable` or `avx2` (`avx512`: what the CPU has), so one machine runs the kernels'
/// lower paths, as an AVX2 desktop or an older CPU would. It also turns AMX tiles off.
/// The `gemm` crate's own microkernels are chosen by that crate, not by this.
const CPU_PATH_VARIABLE: &str = crate::settings::CPU_PATH_ENV;

/// The kernel path this process's products take: `avx512` (`avx512+amx` where bf16
/// products run on AMX tiles), `avx2` or `portable` — the widest this CPU has, capped
/// by [`crate::settings::CPU_PATH_ENV`].
pub fn kernel_path() -> &'static str {
    match (Isa::detect(), super::amx::available()) {
        (Isa::Avx512, true) => "avx512+amx",
        (Isa::Avx512, false) => "avx512",
        (Isa::Avx2, _) => "avx2",
        (Isa::Portable, _) => "portable",
    }
}

impl Isa {
    pub(super) fn detect() -> Isa {
        static CHOSEN: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
        *CHOSEN.get_or_init(|| {
            let asked = std::env::var(CPU_PATH_VARIABLE).ok();
            Self::capped(Self::of_this_cpu(), asked.as_deref())
        })
    }

    /// `detected`, capped by `asked` ([`CPU_PATH_VARIABLE`]'s value); a value the CPU
    /// cannot run, or an unknown one, is said and ignored.
    fn capped(detected: Isa, asked: Option<&str>) -> Isa {
        let Some(asked) = asked else {
            return detected;
        };
        let wanted = match asked.trim().to_ascii_lowercase().as_str() {
            "portable" => Isa::Portable,
            "avx2" => Isa::Avx2,
            "avx512" => Isa::Avx512,
            other => {
                tracing::warn!(
                    "{CPU_PATH_VARIABLE}={other}: not one of portable, avx2, avx512; using {detected:?}"
                );
                return detected;
            }
        };
        let rank = |isa: Isa| match isa {
            Isa::Portable => 0,
            Isa::Avx2 => 1,
            Isa::Avx512 => 2,
        };
        if rank(wanted) > rank(detected) {
            tracing::warn!(
                "{CPU_PATH_VARIABLE}={asked}: this CPU runs at most {detected:?}; using it"
            );
            return detected;
        }
        wanted
    }

    fn of_this_cpu() -> Isa {
        {
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::is_x86_feature_detected as has;
                if has!("avx512f")
                    && has!("avx512bw")
                    && has!("avx2")
                    && has!("f16c")
                    && has!("fma")
                {
                    return Isa::Avx512;
                }
                if has!("avx2") && has!("fma") && has!("f16c") {
                    return Isa::Avx2;
                }
            }
            Isa::Portable
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compute::DType;

    #[test]
    fn the_cpu_path_variable_caps_the_lanes_and_never_raises_them() {
        // Proves STAGEHAND_CPU_PATH forces a lower path, cannot ask for one the CPU
        // lacks, and an unknown value leaves the detected one.
        assert_eq!(Isa::capped(Isa::Avx512, None), Isa::Avx512);
        assert_eq!(Isa::capped(Isa::Avx512, Some("avx2")), Isa::Avx2);
        assert_eq!(Isa::capped(Isa::Avx512, Some("Portable")), Isa::Portable);
        assert_eq!(Isa::capped(Isa::Avx2, Some("avx512")), Isa::Avx2);
        assert_eq!(Isa::capped(Isa::Portable, Some("avx2")), Isa::Portable);
        assert_eq!(Isa::capped(Isa::Avx2, Some("sse9")), Isa::Avx2);
    }

    fn widened<L: Lanes, F: Format>(bytes: &[u8]) -> [f32; 16] {
        let mut out = [0f32; 16];
        // SAFETY: `bytes` holds 16 elements; the lanes were chosen for this CPU.
        unsafe { L::widen::<F>(bytes.as_ptr()).store(out.as_mut_ptr()) };
        out
    }

    /// Every lane implementation this CPU can run, widening `bytes` as `F`.
    fn all_lanes<F: Format>(bytes: &[u8]) -> Vec<[f32; 16]> {
        let mut results = vec![widened::<Portable, F>(bytes)];
        #[cfg(target_arch = "x86_64")]
        {
            let isa = Isa::detect();
            if isa != Isa::Portable {
                results.push(widened::<Avx2, F>(bytes));
            }
            if isa == Isa::Avx512 {
                results.push(widened::<Avx512, F>(bytes));
            }
        }
        results
    }

    /// The bits of each value, every NaN as the one quiet NaN (a NaN's payload and
    /// sign differ between conversions and mean nothing to a product).
    fn bits(values: &[f32]) -> Vec<u32> {
        values
            .iter()
            .map(|value| {
                if value.is_nan() {
                    NAN_BITS
                } else {
                    value.to_bits()
                }
            })
            .collect()
    }

    #[test]
    fn every_fp8_code_widens_to_the_decoders_value_in_every_lane_implementation() {
        // Proves the vector E4M3/E5M2 conversions (the f16 trick) give the bits of
        // the reference decoder for all 256 codes, NaN, infinity and subnormals included.
        for (dtype, name) in [(DType::F8E4M3, "e4m3"), (DType::F8E5M2, "e5m2")] {
            for first in (0..256).step_by(16) {
                let codes: Vec<u8> = (first..first + 16).map(|code| code as u8).collect();
                let expected = bits(&dtype.decode(&codes));
                let results = match dtype {
                    DType::F8E4M3 => all_lanes::<E4M3>(&codes),
                    _ => all_lanes::<E5M2>(&codes),
                };
                for result in results {
                    assert_eq!(bits(&result), expected, "{name} codes from {first}");
                }
            }
        }
    }

    #[test]
    fn a_widened_pair_is_two_widened_sixteens() {
        // Proves `widen_pair` (the packed FP8 path on AVX-512) gives the lanes of two
        // `widen` calls, for all 256 E4M3 codes.
        #[cfg(target_arch = "x86_64")]
        if Isa::detect() == Isa::Avx512 {
            for first in (0..256).step_by(32) {
                let codes: Vec<u8> = (first..first + 32).map(|code| code as u8).collect();
                let mut pair = [0f32; 32];
                // SAFETY: 32 codes; AVX-512 detected.
                unsafe {
                    let (low, high) = widen_pair_avx512(&codes);
                    low.store(pair.as_mut_ptr());
                    high.store(pair.as_mut_ptr().add(16));
                }
                let mut singles = widened::<Portable, E4M3>(&codes[..16]).to_vec();
                singles.extend(widened::<Portable, E4M3>(&codes[16..]));
                assert_eq!(bits(&pair), bits(&singles), "codes from {first}");
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
    unsafe fn widen_pair_avx512(codes: &[u8]) -> (Avx512, Avx512) {
        // SAFETY: the caller's contract.
        unsafe { Avx512::widen_pair::<E4M3>(codes.as_ptr()) }
    }

    #[test]
    fn every_int8_code_widens_to_its_value_in_every_lane_implementation() {
        // Proves the vector int8 widening (sign extension, then conversion) gives
        // every code's value, −128 and 127 included, in every lane.
        for first in (0..256).step_by(16) {
            let codes: Vec<u8> = (first..first + 16).map(|code| code as u8).collect();
            let expected: Vec<u32> = codes
                .iter()
                .map(|&code| f32::from(code as i8).to_bits())
                .collect();
            for result in all_lanes::<I8>(&codes) {
                assert_eq!(bits(&result), expected, "int8 codes from {first}");
            }
        }
    }

    #[test]
    fn half_precision_widens_exactly_in_every_lane_implementation() {
        // Proves f16 and bf16 lanes widen as the scalar conversions do (bit for bit).
        let values: Vec<f32> = (0..16).map(|i| (i as f32 - 7.5) * 1.337e-3).collect();
        for dtype in [DType::F16, DType::Bf16, DType::F32] {
            let bytes = dtype.encode(&values);
            let expected = bits(&dtype.decode(&bytes));
            let results = match dtype {
                DType::F16 => all_lanes::<F16>(&bytes),
                DType::Bf16 => all_lanes::<Bf16>(&bytes),
                _ => all_lanes::<F32>(&bytes),
            };
            for result in results {
                assert_eq!(bits(&result), expected, "{dtype}");
            }
        }
    }
}
