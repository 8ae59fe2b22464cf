//! A weight's bytes, scale and f32 values as the CPU adapter reads them from the
//! device tier (host memory).

use crate::compute::{shapes, ComputeError, DType, Weight};

pub(super) fn weight_bytes<'w>(weight: &'w Weight<'_>) -> &'w [u8] {
    // SAFETY: a `Weight` comes from a `BlockView` whose contract (see
    // `BlockView::new`) is that its range is live host memory of this device for the
    // view's lifetime, and `weight` borrows that lifetime.
    unsafe { std::slice::from_raw_parts(weight.ptr().0 as *const u8, weight.bytes()) }
}

/// The weight's scale (FP8 checkpoints), read from the device tier.
pub(super) fn weight_scale(weight: &Weight<'_>) -> Option<f32> {
    let at = weight.scale()?;
    // SAFETY: the scale lies inside the block the weight's view was checked against
    // (`BlockView::weight`), live host memory for the view's lifetime; it may be
    // unaligned.
    Some(unsafe { std::ptr::read_unaligned(at.0 as *const f32) })
}

/// The weight as f32: in place when it is aligned, unscaled f32, else widened (and
/// scaled) into `buffer`.
pub(super) fn as_f32<'w>(weight: &'w Weight<'_>, buffer: &'w mut Vec<f32>) -> &'w [f32] {
    let bytes = weight_bytes(weight);
    let scale = weight_scale(weight);
    if weight.dtype() == DType::F32 && scale.is_none() {
        // SAFETY: every bit pattern is a valid f32; `align_to` only yields the
        // aligned middle, which we use only when it is the whole slice.
        let (prefix, floats, suffix) = unsafe { bytes.align_to::<f32>() };
        if prefix.is_empty() && suffix.is_empty() {
            return floats;
        }
    }
    buffer.clear();
    buffer.resize(weight.elements(), 0.0);
    weight.dtype().widen(bytes, buffer);
    if let Some(scale) = scale {
        buffer.iter_mut().for_each(|value| *value *= scale);
    }
    buffer
}

/// A vector weight of `expected` elements, as f32.
pub(super) fn vector<'w>(
    what: &str,
    weight: &'w Weight<'_>,
    expected: usize,
    buffer: &'w mut Vec<f32>,
) -> Result<&'w [f32], ComputeError> {
    shapes::vector(what, weight, expected)?;
    Ok(as_f32(weight, buffer))
}
