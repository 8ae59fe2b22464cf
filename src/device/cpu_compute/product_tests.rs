//! The products and attentions against plain f64 references, and the same bits on any
//! number of compute threads.
//!
//! Tolerance: a dot product of `n` terms summed in f32 is within `n·u·Σ|xᵢ·wᵢ|` of the
//! exact sum (`u` = 2⁻²⁴, the classic forward-error bound); every product here is
//! checked against that bound (plus the bias), computed in f64 from the values as
//! stored, the scale applied.

use super::*;
use crate::compute::{CachedAttention, DType, Mask, TensorSlot};

fn seeded(count: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

/// The storage cases: dtype, byte offset in the block (2 = an unaligned f32), scale.
const STORAGE: [(DType, usize, Option<f32>); 6] = [
    (DType::F32, 0, None),
    (DType::F32, 2, None),
    (DType::F16, 2, None),
    (DType::Bf16, 0, None),
    (DType::F8E4M3, 1, Some(0.037)),
    (DType::F8E5M2, 3, Some(1.5)),
];

/// Shape classes: (rows, inner, out). Decode (1–8 rows) around the 16-lane chunks and
/// the 4-row groups, and many rows (the GEMM) around its column blocks.
const SHAPES: [(usize, usize, usize); 7] = [
    (1, 37, 13),
    (2, 64, 4),
    (8, 100, 9),
    (1, 512, 300),
    (9, 48, 70),
    (40, 300, 150),
    (24, 256, 520),
];

/// A block holding a weight of `values` in `dtype` at `offset`, its scale after it.
fn weight_block(
    compute: &CpuCompute,
    values: &[f32],
    storage: (DType, usize, Option<f32>),
) -> (CpuBlock, TensorSlot) {
    let (dtype, offset, scale) = storage;
    let mut bytes = vec![0u8; offset];
    // FP8 codes hold the values divided by the scale, as a quantised checkpoint does.
    let stored: Vec<f32> = values
        .iter()
        .map(|value| value / scale.unwrap_or(1.0))
        .collect();
    bytes.extend(dtype.encode(&stored));
    let scale_at = bytes.len();
    if let Some(scale) = scale {
        bytes.extend(scale.to_le_bytes());
    }
    let slot = TensorSlot {
        offset: offset as u64,
        dtype,
        rows: 0,
        cols: 0,
        scale: scale.map(|_| scale_at as u64),
        groups: None,
    };
    (compute.load_block(&bytes).expect("block"), slot)
}

/// `y = x·Wᵀ + b` in f64 from the stored values, and each element's error bound.
fn reference(
    x: &[f32],
    stored: &[f64],
    bias: &[f32],
    (rows, inner, out): (usize, usize, usize),
) -> Vec<(f64, f64)> {
    let unit = f64::from(f32::EPSILON) / 2.0;
    let mut y = Vec::with_capacity(rows * out);
    for r in 0..rows {
        for o in 0..out {
            let terms = (0..inner).map(|i| f64::from(x[r * inner + i]) * stored[o * inner + i]);
            let (sum, magnitude) = terms.fold((0.0, 0.0), |(sum, magnitude), term: f64| {
                (sum + term, magnitude + term.abs())
            });
            let bias = f64::from(bias[o]);
            // n·u for the sum, one more rounding each for the scale and the bias.
            let bound = (inner as f64 + 2.0) * unit * (magnitude + bias.abs()) + f64::MIN_POSITIVE;
            y.push((sum + bias, bound));
        }
    }
    y
}

/// `linear` of one storage case and shape on `compute`: the output values.
fn product(
    compute: &CpuCompute,
    storage: (DType, usize, Option<f32>),
    shape: (usize, usize, usize),
    with_bias: bool,
) -> (Vec<f32>, Vec<(f64, f64)>) {
    let (rows, inner, out) = shape;
    let x_values = seeded(rows * inner, 1 + inner as u64);
    let w_values = seeded(out * inner, 2 + out as u64);
    let bias_values = if with_bias {
        seeded(out, 3)
    } else {
        vec![0.0; out]
    };
    let (block, slot) = weight_block(compute, &w_values, storage);
    let view = compute.block_view(&block);
    let weight = view
        .weight(&TensorSlot {
            rows: out,
            cols: inner,
            ..slot
        })
        .expect("weight");
    let bias_block = compute
        .load_block(&DType::F32.encode(&bias_values))
        .expect("bias");
    let bias_view = compute.block_view(&bias_block);
    let bias = bias_view
        .weight(&TensorSlot::new(0, DType::F32, 1, out))
        .expect("bias");
    let mut x = compute.tensor(rows, inner).expect("x");
    compute.write(&mut x, &x_values).expect("write");
    let mut y = compute.tensor(rows, out).expect("y");
    compute
        .linear(&x, &weight, with_bias.then_some(&bias), &mut y)
        .expect("linear");
    let (dtype, _, scale) = storage;
    let stored_codes: Vec<f32> = w_values
        .iter()
        .map(|value| value / scale.unwrap_or(1.0))
        .collect();
    // bf16 products multiply bf16 operands: activations rounded, f32/f16 weights too.
    let bf16 = compute.compute_dtype() == ComputeDtype::Bf16 && rows > compute.gemv_rows();
    let rounded = |value: f32| half::bf16::from_f32(value).to_f32();
    let x_operands: Vec<f32> = match bf16 {
        true => x_values.iter().map(|&value| rounded(value)).collect(),
        false => x_values,
    };
    let round_weight = bf16 && matches!(dtype, DType::F32 | DType::F16);
    let stored: Vec<f64> = dtype
        .decode(&dtype.encode(&stored_codes))
        .iter()
        .map(|&value| if round_weight { rounded(value) } else { value })
        .map(|value| f64::from(value) * f64::from(scale.unwrap_or(1.0)))
        .collect();
    (
        y.values().to_vec(),
        reference(&x_operands, &stored, &bias_values, shape),
    )
}

/// Every storage case and shape (with and without bias) on `compute` within the f32
/// summation bound of the reference of its operands.
fn assert_every_product_within_bound(compute: &CpuCompute, what: &str) {
    for storage in STORAGE {
        for shape in SHAPES.iter().chain(&BF16_SHAPES) {
            for with_bias in [false, true] {
                let (y, expected) = product(compute, storage, *shape, with_bias);
                for (index, (value, (exact, bound))) in y.iter().zip(&expected).enumerate() {
                    assert!(
                        (f64::from(*value) - exact).abs() <= *bound,
                        "{what} {storage:?} {shape:?} bias {with_bias}: y[{index}] = {value}, exact {exact} ± {bound}"
                    );
                }
            }
        }
    }
}

/// Many-rows shapes around the AMX kernel's 32 × 32 blocks and 32-value tiles, and
/// one whose packed activations (bf16 weights) are multiplied in slabs.
const BF16_SHAPES: [(usize, usize, usize); 4] =
    [(33, 33, 33), (64, 64, 64), (17, 700, 31), (40, 1024, 70)];

#[test]
fn products_of_every_dtype_and_shape_class_match_an_f64_reference() {
    // Proves decode and many-rows products of f32 (aligned or not), f16, bf16 and
    // FP8 with a scale give x·Wᵀ + b of the stored values within the f32 bound.
    assert_every_product_within_bound(&CpuCompute::with_threads(2), "f32");
}

#[test]
fn bf16_products_sum_their_rounded_operands_within_the_f32_bound() {
    // Proves `compute_dtype = bf16` multiplies x and f32/f16 weights rounded to bf16
    // (bf16 and FP8 weights as stored) with f32 sums, on AMX tiles where this CPU has
    // them and on the f32 kernels otherwise: both paths are checked here.
    let compute = CpuCompute::with_threads(2).with_compute_dtype(ComputeDtype::Bf16);
    if compute.tiles {
        assert_every_product_within_bound(&compute, "bf16 on AMX tiles");
    } else {
        eprintln!("this CPU has no AMX tiles: the bf16 tile kernel is not checked here");
    }
    let mut kernels = CpuCompute::with_threads(2).with_compute_dtype(ComputeDtype::Bf16);
    kernels.tiles = false;
    assert_every_product_within_bound(&kernels, "bf16 on the f32 kernels");
}

#[test]
fn products_give_the_same_bits_on_one_two_and_three_threads() {
    // Proves the split over compute threads never changes a product's bits: the
    // property that lets a streamed pass and its reference use any thread counts.
    for compute_dtype in [ComputeDtype::F32, ComputeDtype::Bf16] {
        let computes: Vec<CpuCompute> = [1, 2, 3]
            .into_iter()
            .map(|threads| CpuCompute::with_threads(threads).with_compute_dtype(compute_dtype))
            .collect();
        assert_same_bits_on(&computes);
    }
}

fn assert_same_bits_on(computes: &[CpuCompute]) {
    for storage in STORAGE {
        for &shape in SHAPES.iter().chain(&BF16_SHAPES) {
            let bits = |compute: &CpuCompute| -> Vec<u32> {
                product(compute, storage, shape, true)
                    .0
                    .iter()
                    .map(|value| value.to_bits())
                    .collect()
            };
            let single = bits(&computes[0]);
            for compute in &computes[1..] {
                assert_eq!(
                    bits(compute),
                    single,
                    "{storage:?} {shape:?} on {} threads",
                    compute.threads()
                );
            }
        }
    }
}

/// Attention in f64, one query at a time: `(sequence, query) → visible keys`.
fn reference_attention(
    (q, k, v): (&[f32], &[f32], &[f32]),
    (heads, kv_heads, dim): (usize, usize, usize),
    (sequences, queries, keys): (usize, usize, usize),
    scale: f32,
    visible: &dyn Fn(usize, usize) -> usize,
) -> Vec<f64> {
    let (q_stride, kv_stride) = (heads * dim, kv_heads * dim);
    let mut out = vec![0.0; q.len()];
    for sequence in 0..sequences {
        for head in 0..heads {
            let kv_head = head / (heads / kv_heads);
            for query in 0..queries {
                let row = sequence * queries + query;
                let seen = visible(sequence, query);
                let scores: Vec<f64> = (0..seen)
                    .map(|key| {
                        let key_row = sequence * keys + key;
                        (0..dim)
                            .map(|d| {
                                f64::from(q[row * q_stride + head * dim + d])
                                    * f64::from(k[key_row * kv_stride + kv_head * dim + d])
                            })
                            .sum::<f64>()
                            * f64::from(scale)
                    })
                    .collect();
                let top = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let weights: Vec<f64> = scores.iter().map(|score| (score - top).exp()).collect();
                let total: f64 = weights.iter().sum();
                for d in 0..dim {
                    out[row * q_stride + head * dim + d] = (0..seen)
                        .map(|key| {
                            weights[key] / total
                                * f64::from(
                                    v[(sequence * keys + key) * kv_stride + kv_head * dim + d],
                                )
                        })
                        .sum();
                }
            }
        }
    }
    out
}

fn tensor(compute: &CpuCompute, rows: usize, cols: usize, seed: u64) -> (CpuTensor, Vec<f32>) {
    let values = seeded(rows * cols, seed);
    let mut tensor = compute.tensor(rows, cols).expect("tensor");
    compute.write(&mut tensor, &values).expect("write");
    (tensor, values)
}

#[test]
fn tiled_attention_over_many_key_tiles_matches_f64_and_repeats_on_any_thread_count() {
    // Proves causal and padded attention across several key tiles (150 keys, tiles of
    // 64) with grouped-query heads agree with f64 within 1e-5 and give the same bits
    // on 1, 2 and 3 threads.
    let (length, heads, kv_heads, dim) = (150, 4, 2, 32);
    let lengths = [150usize, 70];
    let computes: Vec<CpuCompute> = [1, 2, 3]
        .into_iter()
        .map(CpuCompute::with_threads)
        .collect();
    for mask in [Mask::Causal, Mask::Padding(&lengths)] {
        let shape = Attention {
            sequences: 2,
            sequence_length: length,
            heads,
            kv_heads,
            head_dim: dim,
            scale: 0.17,
            mask,
        };
        let mut results = Vec::new();
        for compute in &computes {
            let (q, q_values) = tensor(compute, 2 * length, heads * dim, 21);
            let (k, k_values) = tensor(compute, 2 * length, kv_heads * dim, 22);
            let (v, v_values) = tensor(compute, 2 * length, kv_heads * dim, 23);
            let mut out = compute.tensor(2 * length, heads * dim).expect("out");
            compute
                .attention(&q, &k, &v, &shape, &mut out)
                .expect("attention");
            let visible = |sequence: usize, query: usize| match mask {
                Mask::Causal => query + 1,
                Mask::Padding(lengths) => lengths[sequence],
            };
            let expected = reference_attention(
                (&q_values, &k_values, &v_values),
                (heads, kv_heads, dim),
                (2, length, length),
                0.17,
                &visible,
            );
            assert!(
                out.values()
                    .iter()
                    .zip(&expected)
                    .all(|(a, b)| (f64::from(*a) - b).abs() < 1e-5),
                "{mask:?}"
            );
            results.push(
                out.values()
                    .iter()
                    .map(|value| value.to_bits())
                    .collect::<Vec<_>>(),
            );
        }
        assert!(
            results.windows(2).all(|pair| pair[0] == pair[1]),
            "{mask:?}: the same bits on every thread count"
        );
    }
}

#[test]
fn cached_attention_of_many_queries_matches_f64_and_repeats_on_any_thread_count() {
    // Proves attention of 40 new queries over a 130-row cache (3 key tiles) agrees
    // with f64 within 1e-5 and gives the same bits on 1, 2 and 3 threads.
    let (heads, kv_heads, dim) = (4, 2, 32);
    let computes: Vec<CpuCompute> = [1, 2, 3]
        .into_iter()
        .map(CpuCompute::with_threads)
        .collect();
    let (past, queries) = (90, 40);
    let shape = CachedAttention {
        heads,
        kv_heads,
        head_dim: dim,
        scale: 0.2,
        past,
        queries,
    };
    let mut results = Vec::new();
    for compute in &computes {
        let (q, q_values) = tensor(compute, queries, heads * dim, 24);
        let (k, k_values) = tensor(compute, past + queries + 5, kv_heads * dim, 25);
        let (v, v_values) = tensor(compute, past + queries + 5, kv_heads * dim, 26);
        let mut out = compute.tensor(queries, heads * dim).expect("out");
        compute
            .attention_cached(&q, &k, &v, &shape, &mut out)
            .expect("cached");
        let visible = |_: usize, query: usize| past + query + 1;
        let expected = reference_attention(
            (&q_values, &k_values, &v_values),
            (heads, kv_heads, dim),
            (1, queries, past + queries + 5),
            0.2,
            &visible,
        );
        assert!(
            out.values()
                .iter()
                .zip(&expected)
                .all(|(a, b)| (f64::from(*a) - b).abs() < 1e-5),
            "cached"
        );
        results.push(
            out.values()
                .iter()
                .map(|value| value.to_bits())
                .collect::<Vec<_>>(),
        );
    }
    assert!(
        results.windows(2).all(|pair| pair[0] == pair[1]),
        "cached: the same bits on every thread count"
    );
}
