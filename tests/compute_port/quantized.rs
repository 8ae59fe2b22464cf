//! Linear layers of integer-quantized weights, against a plain f64 reference of the
//! dequantised weight written out here from ComfyUI's definitions (not the adapter's
//! code): `int8_tensorwise` is `code × scale`, `awq_w4a16` is `(q − 8)·scale + zero`
//! with the scale and zero of the element's group of inputs and its output row, the
//! codes two a byte (element `2j` in the low nibble), the tables `[in / group, out]`.

use stagehand::compute::quant::Groups;
use stagehand::compute::{Compute, ComputeError, DType, TensorSlot};

use crate::ops::{normalised_difference, reference, seeded};

/// Largest normalised difference from the reference: f32 sums in another order than
/// f64, and the dequantisation's two roundings (the suite's tolerance).
pub const TOLERANCE: f32 = 1e-4;

/// The shapes (rows, inputs, outputs): decode products (few rows), batched ones, and
/// weights larger than one dequantised panel.
const SHAPES: [(usize, usize, usize); 4] =
    [(3, 128, 40), (33, 256, 72), (2, 1024, 300), (9, 1024, 300)];

/// Every case's name, its normalised difference from the reference, and its output.
pub type Misses = Vec<(String, f32, Vec<f32>)>;

/// An int8 weight of `out × inner` codes (all of −128..=127 occur) and its scale.
fn int8_case(out: usize, inner: usize) -> (Vec<u8>, f32, Vec<f32>) {
    let codes: Vec<f32> = seeded(out * inner, 21, 128.0)
        .iter()
        .map(|value| value.floor().clamp(-128.0, 127.0))
        .collect();
    let scale = 1.0 / 512.0;
    let weights = codes.iter().map(|code| code * scale).collect();
    (DType::I8.encode(&codes), scale, weights)
}

/// Packed U4 codes, BF16 scales and zeros `[inner / 64, out]`, and the dequantised
/// weight `[out, inner]`.
fn awq_case(out: usize, inner: usize) -> (Vec<u8>, Vec<u8>, Vec<u8>, Vec<f32>) {
    let groups = inner / 64;
    let centred: Vec<f32> = seeded(out * inner, 22, 8.0)
        .iter()
        .map(|value| value.floor().clamp(-8.0, 7.0))
        .collect();
    let scales: Vec<f32> = seeded(groups * out, 23, 0.01)
        .iter()
        .map(|value| 0.011 + value)
        .collect();
    let zeros = seeded(groups * out, 24, 0.05);
    let (scale_bytes, zero_bytes) = (DType::Bf16.encode(&scales), DType::Bf16.encode(&zeros));
    let (scales, zeros) = (
        DType::Bf16.decode(&scale_bytes),
        DType::Bf16.decode(&zero_bytes),
    );
    let mut weights = vec![0f32; out * inner];
    for n in 0..out {
        for k in 0..inner {
            let at = (k / 64) * out + n;
            let code = f64::from(centred[n * inner + k]);
            let value = code * f64::from(scales[at]) + f64::from(zeros[at]);
            weights[n * inner + k] = value as f32;
        }
    }
    (DType::U4.encode(&centred), scale_bytes, zero_bytes, weights)
}

/// `linear` of int8 and (with `awq`) awq_w4a16 weights for every shape, and of a
/// slice of an AWQ weight's rows (a fused qkv's piece: its tables keep their stride).
pub fn quantized_linear_misses<C: Compute>(compute: &C, awq: bool) -> Result<Misses, ComputeError> {
    let mut misses = Vec::new();
    for (rows, inner, out) in SHAPES {
        let x_values = seeded(rows * inner, 25, 1.0);
        let mut x = compute.tensor(rows, inner)?;
        compute.write(&mut x, &x_values)?;
        let mut y = compute.tensor(rows, out)?;
        // int8: the codes after 3 filler bytes, the f32 scale after them.
        let (codes, scale, weights) = int8_case(out, inner);
        let mut bytes = vec![7u8; 3];
        bytes.extend(&codes);
        let scale_at = bytes.len() as u64;
        bytes.extend(scale.to_le_bytes());
        let block = compute.load_block(&bytes)?;
        let view = compute.block_view(&block);
        let slot = TensorSlot {
            scale: Some(scale_at),
            ..TensorSlot::new(3, DType::I8, out, inner)
        };
        compute.linear(&x, &view.weight(&slot)?, None, &mut y)?;
        let expected = reference::linear(&x_values, &weights, None, inner);
        let values = compute.read(&y)?;
        let difference = normalised_difference(&values, &expected);
        misses.push((
            format!("int8 linear {rows}x{inner}x{out}"),
            difference,
            values,
        ));
        if !awq {
            continue;
        }
        let (codes, scales, zeros, weights) = awq_case(out, inner);
        let mut bytes = vec![9u8; 1];
        bytes.extend(&codes);
        let scale_at = bytes.len() as u64;
        bytes.extend(&scales);
        let zero_at = bytes.len() as u64;
        bytes.extend(&zeros);
        let block = compute.load_block(&bytes)?;
        let view = compute.block_view(&block);
        let groups = Groups {
            scale: scale_at,
            zero: zero_at,
            dtype: DType::Bf16,
            size: 64,
            stride: out,
        };
        let slot = TensorSlot {
            groups: Some(groups),
            ..TensorSlot::new(1, DType::U4, out, inner)
        };
        compute.linear(&x, &view.weight(&slot)?, None, &mut y)?;
        let expected = reference::linear(&x_values, &weights, None, inner);
        let values = compute.read(&y)?;
        let difference = normalised_difference(&values, &expected);
        misses.push((
            format!("awq linear {rows}x{inner}x{out}"),
            difference,
            values,
        ));
        // Rows 8..24 alone, as a fused weight's piece is read.
        let (first, count) = (8, 16);
        let piece = TensorSlot {
            offset: 1 + (first * inner / 2) as u64,
            rows: count,
            groups: Some(Groups {
                scale: scale_at + 2 * first as u64,
                zero: zero_at + 2 * first as u64,
                ..groups
            }),
            ..slot
        };
        let mut part = compute.tensor(rows, count)?;
        compute.linear(&x, &view.weight(&piece)?, None, &mut part)?;
        let rows_weights = &weights[first * inner..(first + count) * inner];
        let expected = reference::linear(&x_values, rows_weights, None, inner);
        let values = compute.read(&part)?;
        let difference = normalised_difference(&values, &expected);
        let what = format!("awq rows {first}.. of {rows}x{inner}x{out}");
        misses.push((what, difference, values));
    }
    Ok(misses)
}

/// A group table that runs past its block is refused, not read.
pub fn awq_tables_outside_the_block_are_refused<C: Compute>(
    compute: &C,
) -> Result<bool, ComputeError> {
    let block = compute.load_block(&[0u8; 256])?;
    let view = compute.block_view(&block);
    let slot = TensorSlot {
        groups: Some(Groups {
            scale: 64,
            zero: 250,
            dtype: DType::Bf16,
            size: 64,
            stride: 4,
        }),
        ..TensorSlot::new(0, DType::U4, 4, 128)
    };
    Ok(matches!(view.weight(&slot), Err(ComputeError::Shape(_))))
}
