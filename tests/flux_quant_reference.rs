//! ComfyUI's integer formats against torch: `tests/fixtures/flux/quant.safetensors`
//! holds an `int8_tensorwise` and an `awq_w4a16` linear that torch quantized from one
//! f32 weight, their dequantisation as ComfyUI's layouts compute it, and torch's
//! `F.linear` of them (`scripts/make-quant-fixtures.py`). stagehand's quantizers give
//! the same codes and tables bit for bit, its dequantisation the same weights bit for
//! bit, and its CPU products the same outputs within f32 summation order.

use std::path::Path;

use stagehand::compute::quant::{dequantize_row, Groups};
use stagehand::compute::{Compute, DType, TensorSlot};
use stagehand::device::CpuCompute;
use stagehand::model::generated::{quantize_awq, quantize_int8};

/// Largest |a − b| over the largest |b| allowed for the products: f32 both sides,
/// another summation order (measured below 1e-6).
const TOLERANCE: f32 = 1e-5;

fn fixture() -> Vec<(String, safetensors::Dtype, Vec<u8>)> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/flux/quant.safetensors");
    let bytes = std::fs::read(path).expect("the fixture is committed");
    let file = safetensors::SafeTensors::deserialize(&bytes).expect("a safetensors file");
    file.tensors()
        .into_iter()
        .map(|(name, view)| (name, view.dtype(), view.data().to_vec()))
        .collect()
}

fn bytes_of(fixture: &[(String, safetensors::Dtype, Vec<u8>)], name: &str) -> Vec<u8> {
    let found = fixture.iter().find(|(found, ..)| found == name);
    found.map(|(.., data)| data.clone()).expect(name)
}

fn f32s(fixture: &[(String, safetensors::Dtype, Vec<u8>)], name: &str) -> Vec<f32> {
    DType::F32.decode(&bytes_of(fixture, name))
}

fn largest_difference(a: &[f32], b: &[f32]) -> f32 {
    let largest = b.iter().fold(0f32, |most, value| most.max(value.abs()));
    let difference = a
        .iter()
        .zip(b)
        .fold(0f32, |most, (a, b)| most.max((a - b).abs()));
    difference / largest
}

/// `y = x·Wᵀ + bias` on the CPU adapter, the weight's `stored` bytes in a block and
/// read through `slot` (its offsets relative to the block).
fn linear(stored: &[u8], slot: TensorSlot, x: &[f32], bias: &[f32]) -> Vec<f32> {
    let compute = CpuCompute::new();
    let block = compute.load_block(stored).unwrap();
    let biases = compute.load_block(&DType::F32.encode(bias)).unwrap();
    let (view, bias_view) = (compute.block_view(&block), compute.block_view(&biases));
    let weight = view.weight(&slot).unwrap();
    let bias = bias_view
        .weight(&TensorSlot::new(0, DType::F32, 1, bias.len()))
        .unwrap();
    let mut input = compute.tensor(x.len() / slot.cols, slot.cols).unwrap();
    compute.write(&mut input, x).unwrap();
    let mut y = compute.tensor(x.len() / slot.cols, slot.rows).unwrap();
    compute
        .linear(&input, &weight, Some(&bias), &mut y)
        .unwrap();
    compute.read(&y).unwrap()
}

#[test]
fn int8_tensorwise_matches_torch() {
    // Proves stagehand quantizes int8_tensorwise as comfy-kitchen does (same codes,
    // same scale), and its int8 product equals torch's linear of code × scale.
    let fixture = fixture();
    let (weight, x, bias) = (
        f32s(&fixture, "weight"),
        f32s(&fixture, "x"),
        f32s(&fixture, "bias"),
    );
    let (codes, scale) = quantize_int8(&weight);
    assert_eq!(codes, bytes_of(&fixture, "int8.weight"));
    assert_eq!(
        scale.to_bits(),
        f32s(&fixture, "int8.weight_scale")[0].to_bits()
    );
    let dequantized: Vec<f32> = DType::I8
        .decode(&codes)
        .iter()
        .map(|code| code * scale)
        .collect();
    assert_eq!(dequantized, f32s(&fixture, "int8.dequantized"));
    let mut stored = codes.clone();
    stored.extend(scale.to_le_bytes());
    let slot = TensorSlot {
        scale: Some(codes.len() as u64),
        ..TensorSlot::new(0, DType::I8, 40, 128)
    };
    let y = linear(&stored, slot, &x, &bias);
    let difference = largest_difference(&y, &f32s(&fixture, "int8.y"));
    assert!(difference < TOLERANCE, "{difference}");
}

#[test]
fn awq_w4a16_matches_torch() {
    // Proves stagehand quantizes awq_w4a16 to torch's packed codes and BF16 tables bit
    // for bit, dequantises them to the weight comfy-kitchen's layout computes bit for
    // bit, and its grouped product equals torch's linear of that weight.
    let fixture = fixture();
    let (weight, x, bias) = (
        f32s(&fixture, "weight"),
        f32s(&fixture, "x"),
        f32s(&fixture, "bias"),
    );
    let (rows, cols) = (40, 128);
    let (packed, scales, zeros) = quantize_awq(&weight, rows, cols, 64);
    assert_eq!(packed, bytes_of(&fixture, "awq.weight"));
    let (scale_bytes, zero_bytes) = (DType::Bf16.encode(&scales), DType::Bf16.encode(&zeros));
    assert_eq!(scale_bytes, bytes_of(&fixture, "awq.weight_scale"));
    assert_eq!(zero_bytes, bytes_of(&fixture, "awq.weight_zeros"));
    let expected = f32s(&fixture, "awq.dequantized");
    for row in 0..rows {
        let codes = &packed[row * cols / 2..(row + 1) * cols / 2];
        let row_scales = [scales[row], scales[rows + row]];
        let row_zeros = [zeros[row], zeros[rows + row]];
        let mut out = vec![0f32; cols];
        dequantize_row(codes, &row_scales, &row_zeros, 64, &mut out);
        assert_eq!(out, expected[row * cols..(row + 1) * cols], "row {row}");
    }
    let mut stored = packed.clone();
    let scale_at = stored.len() as u64;
    stored.extend(&scale_bytes);
    let zero_at = stored.len() as u64;
    stored.extend(&zero_bytes);
    let slot = TensorSlot {
        groups: Some(Groups {
            scale: scale_at,
            zero: zero_at,
            dtype: DType::Bf16,
            size: 64,
            stride: rows,
        }),
        ..TensorSlot::new(0, DType::U4, rows, cols)
    };
    let y = linear(&stored, slot, &x, &bias);
    let difference = largest_difference(&y, &f32s(&fixture, "awq.y"));
    assert!(difference < TOLERANCE, "{difference}");
}
