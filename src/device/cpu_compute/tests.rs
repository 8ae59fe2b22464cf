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

/// A block holding `values` in `dtype` at offset `offset` (to test unaligned f32).
fn block(compute: &CpuCompute, values: &[f32], dtype: DType, offset: usize) -> CpuBlock {
    let mut bytes = vec![0u8; offset];
    bytes.extend(dtype.encode(values));
    compute.load_block(&bytes).unwrap()
}

fn slot(dtype: DType, rows: usize, cols: usize, offset: usize) -> TensorSlot {
    TensorSlot {
        offset: offset as u64,
        dtype,
        rows,
        cols,
        scale: None,
        groups: None,
    }
}

fn naive_linear(x: &[f32], rows: usize, w: &[f32], out: usize, inner: usize) -> Vec<f32> {
    let mut y = vec![0.0; rows * out];
    for r in 0..rows {
        for o in 0..out {
            y[r * out + o] = (0..inner)
                .map(|i| x[r * inner + i] * w[o * inner + i])
                .sum();
        }
    }
    y
}

fn close(a: &[f32], b: &[f32], tolerance: f32) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(a, b)| (a - b).abs() <= tolerance)
}

#[test]
fn linear_casts_every_storage_dtype_and_adds_the_bias() {
    // Proves f32 (aligned and not), f16 and bf16 weights give x·Wᵀ + b of the values
    // as stored, and that the cast buffer is reused (it stops growing).
    let compute = CpuCompute::new();
    let (rows, inner, out) = (5, 24, 7);
    let x_values = seeded(rows * inner, 1);
    let w_values = seeded(out * inner, 2);
    let bias_values = seeded(out, 3);
    let mut x = compute.tensor(rows, inner).unwrap();
    compute.write(&mut x, &x_values).unwrap();
    for (dtype, offset) in [
        (DType::F32, 0),
        (DType::F32, 2),
        (DType::F16, 2),
        (DType::Bf16, 0),
    ] {
        let stored = dtype.decode(&dtype.encode(&w_values));
        let weights = block(&compute, &w_values, dtype, offset);
        let biases = block(&compute, &bias_values, DType::F32, 0);
        let view = compute.block_view(&weights);
        let weight = view.weight(&slot(dtype, out, inner, offset)).unwrap();
        let bias_view = compute.block_view(&biases);
        let bias = bias_view.weight(&slot(DType::F32, 1, out, 0)).unwrap();
        let mut y = compute.tensor(rows, out).unwrap();
        compute.linear(&x, &weight, Some(&bias), &mut y).unwrap();
        let mut expected = naive_linear(&x_values, rows, &stored, out, inner);
        for row in expected.chunks_exact_mut(out) {
            row.iter_mut().zip(&bias_values).for_each(|(y, b)| *y += b);
        }
        assert!(
            close(y.values(), &expected, 1e-5),
            "{dtype} at offset {offset}"
        );
    }
    let grown = compute.cast_buffer_bytes();
    let weights = block(&compute, &w_values, DType::F16, 0);
    let view = compute.block_view(&weights);
    let weight = view.weight(&slot(DType::F16, out, inner, 0)).unwrap();
    let mut y = compute.tensor(rows, out).unwrap();
    compute.linear(&x, &weight, None, &mut y).unwrap();
    assert_eq!(
        compute.cast_buffer_bytes(),
        grown,
        "the cast buffer is reused"
    );
}

#[test]
fn a_weight_outside_its_block_or_a_wrong_shape_is_an_error() {
    // Proves views are bounds-checked and shapes are checked, never read out of range.
    let compute = CpuCompute::new();
    let weights = block(&compute, &[1.0; 16], DType::F32, 0);
    let view = compute.block_view(&weights);
    assert!(view.weight(&slot(DType::F32, 4, 5, 0)).is_err());
    let weight = view.weight(&slot(DType::F32, 4, 4, 0)).unwrap();
    let x = compute.tensor(2, 3).unwrap();
    let mut y = compute.tensor(2, 4).unwrap();
    let error = compute.linear(&x, &weight, None, &mut y).unwrap_err();
    assert!(error.to_string().contains("linear"), "{error}");
}

#[test]
fn gelu_layer_norm_and_rms_norm_match_their_definitions() {
    // Proves the exact-erf GELU against tabulated values (to 2 ulp), and both norms per row.
    let compute = CpuCompute::new();
    let mut x = compute.tensor(1, 4).unwrap();
    compute.write(&mut x, &[1.0, -1.0, 0.0, 3.0]).unwrap();
    compute.gelu_erf(&mut x).unwrap();
    // Within 2 ulp (5e-7 at 3.0): the vectorised f32 erf, not an f64 erfc rounded once.
    assert!(close(
        x.values(),
        &[0.841_344_7, -0.158_655_3, 0.0, 2.995_950_2],
        5e-7
    ));

    let values = [1.0f32, 2.0, 3.0, 6.0];
    let params = block(
        &compute,
        &[2.0, 2.0, 2.0, 2.0, 0.5, 0.5, 0.5, 0.5],
        DType::F32,
        0,
    );
    let view = compute.block_view(&params);
    let gamma = view.weight(&slot(DType::F32, 1, 4, 0)).unwrap();
    let beta = view.weight(&slot(DType::F32, 1, 4, 16)).unwrap();
    let mut x = compute.tensor(1, 4).unwrap();
    compute.write(&mut x, &values).unwrap();
    let mut y = compute.tensor(1, 4).unwrap();
    compute.layer_norm(&x, &gamma, &beta, 0.0, &mut y).unwrap();
    // mean 3, variance (4 + 1 + 0 + 9)/4 = 3.5.
    let expected: Vec<f32> = values
        .iter()
        .map(|v| (v - 3.0) / 3.5f32.sqrt() * 2.0 + 0.5)
        .collect();
    assert!(close(y.values(), &expected, 1e-6));
    compute.rms_norm(&x, Some(&gamma), 0.0, &mut y).unwrap();
    let rms = ((1.0 + 4.0 + 9.0 + 36.0) / 4.0f32).sqrt();
    let expected: Vec<f32> = values.iter().map(|v| v / rms * 2.0).collect();
    assert!(close(y.values(), &expected, 1e-6));
}

#[test]
fn norms_and_add_of_many_rows_match_f64_and_repeat_on_any_thread_count() {
    // Proves the row-split norms and add: each row's layer norm within 1e-5 of an f64
    // one (the sums in sixteen lanes, a width with a tail too), and the same bits on
    // 1, 2 and 3 threads (the inputs are past the size that splits over threads).
    for cols in [384usize, 389] {
        let rows = 40_000 / cols + 7;
        let values: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919 % 1009) as f32 - 504.0) * 3e-3 + (i / cols) as f32 * 0.1)
            .collect();
        let gamma_values: Vec<f32> = (0..cols).map(|i| 0.5 + i as f32 * 1e-3).collect();
        let beta_values: Vec<f32> = (0..cols).map(|i| i as f32 * -2e-3).collect();
        let mut outputs = Vec::new();
        for threads in [1, 2, 3] {
            let compute = CpuCompute::with_threads(threads);
            let params = block(
                &compute,
                &[gamma_values.clone(), beta_values.clone()].concat(),
                DType::F32,
                0,
            );
            let view = compute.block_view(&params);
            let gamma = view.weight(&slot(DType::F32, 1, cols, 0)).unwrap();
            let beta = view.weight(&slot(DType::F32, 1, cols, cols * 4)).unwrap();
            let mut x = compute.tensor(rows, cols).unwrap();
            compute.write(&mut x, &values).unwrap();
            let residual = x.clone();
            compute.add(&mut x, &residual).unwrap();
            let mut normed = compute.tensor(rows, cols).unwrap();
            compute
                .layer_norm(&x, &gamma, &beta, 1e-12, &mut normed)
                .unwrap();
            let mut rms = compute.tensor(rows, cols).unwrap();
            compute.rms_norm(&x, Some(&gamma), 1e-6, &mut rms).unwrap();
            let bits = |values: &[f32]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            outputs.push([x.values(), normed.values(), rms.values()].map(bits));
            if threads == 1 {
                for (row, out) in values.chunks(cols).zip(normed.values().chunks(cols)) {
                    let row: Vec<f64> = row.iter().map(|&v| 2.0 * v as f64).collect();
                    let mean = row.iter().sum::<f64>() / cols as f64;
                    let variance =
                        row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
                    for (column, (&value, &got)) in row.iter().zip(out).enumerate() {
                        let expected = (value - mean) / (variance + 1e-12).sqrt()
                            * gamma_values[column] as f64
                            + beta_values[column] as f64;
                        assert!(
                            (got as f64 - expected).abs() < 1e-5,
                            "{cols}: {got} vs {expected}"
                        );
                    }
                }
            }
        }
        assert!(outputs.windows(2).all(|pair| pair[0] == pair[1]), "{cols}");
    }
}

/// Attention computed the obvious way, one query at a time.
fn naive_attention(q: &[f32], k: &[f32], v: &[f32], shape: &Attention<'_>) -> Vec<f32> {
    let (length, dim) = (shape.sequence_length, shape.head_dim);
    let (q_stride, kv_stride) = (shape.heads * dim, shape.kv_heads * dim);
    let mut out = vec![0.0; q.len()];
    for sequence in 0..shape.sequences {
        for head in 0..shape.heads {
            let kv_head = head / (shape.heads / shape.kv_heads);
            for i in 0..length {
                let visible = match shape.mask {
                    Mask::Padding(lengths) => lengths[sequence],
                    Mask::Causal => i + 1,
                };
                let row = sequence * length + i;
                let scores: Vec<f32> = (0..visible)
                    .map(|j| {
                        let key = sequence * length + j;
                        (0..dim)
                            .map(|d| {
                                q[row * q_stride + head * dim + d]
                                    * k[key * kv_stride + kv_head * dim + d]
                            })
                            .sum::<f32>()
                            * shape.scale
                    })
                    .collect();
                let top = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let weights: Vec<f32> = scores.iter().map(|s| (s - top).exp()).collect();
                let total: f32 = weights.iter().sum();
                for d in 0..dim {
                    out[row * q_stride + head * dim + d] = (0..visible)
                        .map(|j| {
                            weights[j] / total
                                * v[(sequence * length + j) * kv_stride + kv_head * dim + d]
                        })
                        .sum();
                }
            }
        }
    }
    out
}

#[test]
fn attention_masks_padding_and_the_future_and_shares_key_value_heads() {
    // Proves padded keys and future keys get no weight, grouped-query heads read their
    // shared K/V head, against a query-by-query implementation.
    let compute = CpuCompute::new();
    let lengths = [5usize, 3];
    for (heads, kv_heads, mask) in [
        (4, 4, Mask::Padding(&lengths)),
        (4, 2, Mask::Causal),
        (6, 1, Mask::Padding(&lengths)),
    ] {
        let shape = Attention {
            sequences: 2,
            sequence_length: 5,
            heads,
            kv_heads,
            head_dim: 8,
            scale: 1.0 / 8f32.sqrt(),
            mask,
        };
        let rows = 10;
        let q_values = seeded(rows * heads * 8, 4);
        let k_values = seeded(rows * kv_heads * 8, 5);
        let v_values = seeded(rows * kv_heads * 8, 6);
        let mut q = compute.tensor(rows, heads * 8).unwrap();
        let mut k = compute.tensor(rows, kv_heads * 8).unwrap();
        let mut v = compute.tensor(rows, kv_heads * 8).unwrap();
        compute.write(&mut q, &q_values).unwrap();
        compute.write(&mut k, &k_values).unwrap();
        compute.write(&mut v, &v_values).unwrap();
        let mut out = compute.tensor(rows, heads * 8).unwrap();
        compute.attention(&q, &k, &v, &shape, &mut out).unwrap();
        let expected = naive_attention(&q_values, &k_values, &v_values, &shape);
        assert!(
            close(out.values(), &expected, 1e-5),
            "{heads}/{kv_heads} {mask:?}"
        );
    }
}

#[test]
fn low_rank_on_the_fly_agrees_with_the_merged_weight() {
    // Proves y + s·(x·Aᵀ)·Bᵀ equals x·(W + s·B·A)ᵀ to f32 rounding, and that a merge
    // into an f16 weight is rounded back to f16.
    let compute = CpuCompute::new();
    let (rows, input, out, rank) = (3, 16, 12, 4);
    let w_values = seeded(out * input, 7);
    let factors = block(
        &compute,
        &[seeded(rank * input, 8), seeded(out * rank, 9)].concat(),
        DType::F32,
        0,
    );
    let factor_view = compute.block_view(&factors);
    let a = factor_view
        .weight(&slot(DType::F32, rank, input, 0))
        .unwrap();
    let b = factor_view
        .weight(&slot(DType::F32, out, rank, rank * input * 4))
        .unwrap();
    let low_rank = LowRank::new(a, b).unwrap();
    let mut x = compute.tensor(rows, input).unwrap();
    compute.write(&mut x, &seeded(rows * input, 10)).unwrap();

    let streamed = block(&compute, &w_values, DType::F32, 0);
    let view = compute.block_view(&streamed);
    let weight = view.weight(&slot(DType::F32, out, input, 0)).unwrap();
    let mut y = compute.tensor(rows, out).unwrap();
    compute.linear(&x, &weight, None, &mut y).unwrap();
    let mut scratch = compute.tensor(rows, rank).unwrap();
    compute
        .low_rank_add(&x, &low_rank, 0.5, &mut scratch, &mut y)
        .unwrap();

    let merged = block(&compute, &w_values, DType::F32, 0);
    let view = compute.block_view(&merged);
    let weight = view.weight(&slot(DType::F32, out, input, 0)).unwrap();
    compute.merge_low_rank(&weight, &low_rank, 0.5).unwrap();
    let mut expected = compute.tensor(rows, out).unwrap();
    compute.linear(&x, &weight, None, &mut expected).unwrap();
    assert!(close(y.values(), expected.values(), 1e-5));

    let half = block(&compute, &w_values, DType::F16, 0);
    let view = compute.block_view(&half);
    let weight = view.weight(&slot(DType::F16, out, input, 0)).unwrap();
    compute.merge_low_rank(&weight, &low_rank, 0.5).unwrap();
    let bytes = &half.bytes()[..out * input * 2];
    let stored = DType::F16.decode(bytes);
    assert_eq!(DType::F16.encode(&stored), bytes, "merged weights stay f16");
}

#[test]
fn an_impossible_activation_is_an_error_not_an_abort() {
    // Proves a huge batch fails with a message instead of aborting the process.
    let compute = CpuCompute::new();
    let error = compute.tensor(usize::MAX / 2, 4).unwrap_err();
    assert!(error.to_string().contains("lower --batch"), "{error}");
}

#[test]
fn cached_attention_one_token_at_a_time_equals_causal_attention() {
    // Proves decoding against a KV cache, a query at a time, gives what causal
    // attention over the whole sequence gives (grouped-query heads too), bit for bit.
    let compute = CpuCompute::new();
    let (length, heads, kv_heads, head_dim) = (6, 4, 2, 8);
    let q_values = seeded(length * heads * head_dim, 11);
    let k_values = seeded(length * kv_heads * head_dim, 12);
    let v_values = seeded(length * kv_heads * head_dim, 13);
    let full = Attention {
        sequences: 1,
        sequence_length: length,
        heads,
        kv_heads,
        head_dim,
        scale: 0.3,
        mask: Mask::Causal,
    };
    let expected = naive_attention(&q_values, &k_values, &v_values, &full);
    let tensor = |rows: usize, values: &[f32]| {
        let mut tensor = compute.tensor(rows, values.len() / rows).unwrap();
        compute.write(&mut tensor, values).unwrap();
        tensor
    };
    let mut causal = compute.tensor(length, heads * head_dim).unwrap();
    let (q_all, k_all, v_all) = (
        tensor(length, &q_values),
        tensor(length, &k_values),
        tensor(length, &v_values),
    );
    compute
        .attention(&q_all, &k_all, &v_all, &full, &mut causal)
        .unwrap();
    let mut k_cache = compute.tensor(0, kv_heads * head_dim).unwrap();
    let mut v_cache = compute.tensor(0, kv_heads * head_dim).unwrap();
    let kv_cols = kv_heads * head_dim;
    for token in 0..length {
        compute.resize_rows(&mut k_cache, token + 1).unwrap();
        compute.resize_rows(&mut v_cache, token + 1).unwrap();
        let mut k_row = compute.tensor(1, kv_cols).unwrap();
        let mut v_row = compute.tensor(1, kv_cols).unwrap();
        compute
            .write(
                &mut k_row,
                &k_values[token * kv_cols..(token + 1) * kv_cols],
            )
            .unwrap();
        compute
            .write(
                &mut v_row,
                &v_values[token * kv_cols..(token + 1) * kv_cols],
            )
            .unwrap();
        compute.write_rows(&mut k_cache, token, &k_row).unwrap();
        compute.write_rows(&mut v_cache, token, &v_row).unwrap();
        let q_cols = heads * head_dim;
        let mut q = compute.tensor(1, q_cols).unwrap();
        compute
            .write(&mut q, &q_values[token * q_cols..(token + 1) * q_cols])
            .unwrap();
        let mut out = compute.tensor(1, q_cols).unwrap();
        let shape = CachedAttention {
            heads,
            kv_heads,
            head_dim,
            scale: 0.3,
            past: token,
            queries: 1,
        };
        compute
            .attention_cached(&q, &k_cache, &v_cache, &shape, &mut out)
            .unwrap();
        let row = &expected[token * q_cols..(token + 1) * q_cols];
        assert!(close(out.values(), row, 1e-5), "token {token}");
        // A query's bits do not depend on the rows it shares a block with.
        let prefill = &causal.values()[token * q_cols..(token + 1) * q_cols];
        let bits = |values: &[f32]| values.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        assert_eq!(
            bits(out.values()),
            bits(prefill),
            "token {token}: decode = prefill"
        );
    }
}

#[test]
fn rope_rotates_pairs_by_position_and_keeps_their_length() {
    // Proves position 0 is the identity, pairs (i, i + d/2) keep their norm, and a
    // quarter turn maps (a, b) to (−b, a).
    let compute = CpuCompute::new();
    let values = seeded(3 * 8, 14);
    let mut x = compute.tensor(3, 8).unwrap();
    compute.write(&mut x, &values).unwrap();
    let quarter = std::f32::consts::FRAC_PI_2;
    compute
        .rope(&mut x, 2, 4, &[0, 1, 2], &[quarter, 0.1])
        .unwrap();
    let out = x.values();
    assert_eq!(&out[..8], &values[..8], "position 0 is unchanged");
    let (a, b) = (values[8], values[10]);
    assert!(
        (out[8] + b).abs() < 1e-6 && (out[10] - a).abs() < 1e-6,
        "a quarter turn"
    );
    for row in 0..3 {
        for head in 0..2 {
            for i in 0..2 {
                let at = row * 8 + head * 4 + i;
                let before = values[at].hypot(values[at + 2]);
                let after = out[at].hypot(out[at + 2]);
                assert!((before - after).abs() < 1e-6);
            }
        }
    }
    let mut gate = compute.tensor(1, 2).unwrap();
    compute.write(&mut gate, &[0.0, 2.0]).unwrap();
    let mut up = compute.tensor(1, 2).unwrap();
    compute.write(&mut up, &[5.0, 3.0]).unwrap();
    compute.silu_mul(&mut gate, &up).unwrap();
    let silu_two = 2.0 / (1.0 + (-2.0f32).exp());
    assert!(close(gate.values(), &[0.0, silu_two * 3.0], 1e-6));
}
