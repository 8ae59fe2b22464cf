//! The compute port's conformance suite: every operation on fixed inputs, written
//! once against `Compute`, so the same scenario runs on every adapter (`CpuCompute`
//! always, `tests/compute_conformance.rs`; `CudaCompute` on a GPU, `tests/cuda.rs`).
//! Each result is held against a plain f64 reference of the operation's definition
//! (`reference.rs`); two adapters' results can also be compared with each other
//! (GPUs sum in another order: within a tolerance), and one adapter's repeated (bit
//! for bit).

use stagehand::compute::{
    Attention, BlockView, CachedAttention, Compute, ComputeError, DType, LowRank, Mask, TensorSlot,
};

#[path = "reference.rs"]
pub mod reference;

#[path = "outputs.rs"]
mod outputs;

pub use outputs::{
    assert_same_bits, host_read_back, normalised_difference, reference_misses, Kept, Outputs,
};

/// `values` as the adapter holds them once encoded in `dtype`.
fn stored(values: &[f32], dtype: DType) -> Vec<f32> {
    dtype.decode(&dtype.encode(values))
}

/// Deterministic values in [-scale, scale) (an LCG, no dependency).
pub fn seeded(count: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            (((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0) * scale
        })
        .collect()
}

fn slot(dtype: DType, rows: usize, cols: usize, offset: usize) -> TensorSlot {
    TensorSlot::new(offset as u64, dtype, rows, cols)
}

/// FP8 weights are stored divided by their scale, which follows them in the block.
const FP8_SCALE: f32 = 1.0 / 64.0;

struct Scenario<'c, C: Compute> {
    compute: &'c C,
    /// Reads a held block's bytes back: a host read on the CPU, a device copy on a GPU.
    read_back: &'c dyn Fn(u64, usize) -> Vec<u8>,
    outputs: Outputs,
}

impl<C: Compute> Scenario<'_, C> {
    fn tensor(&self, rows: usize, cols: usize, values: &[f32]) -> Result<C::Tensor, ComputeError> {
        let mut tensor = self.compute.tensor(rows, cols)?;
        self.compute.write(&mut tensor, values)?;
        Ok(tensor)
    }

    /// A block of `values` encoded in `dtype` after `offset` filler bytes.
    fn block(&self, values: &[f32], dtype: DType, offset: usize) -> Result<C::Block, ComputeError> {
        let mut bytes: Vec<u8> = (0..offset).map(|i| i as u8).collect();
        bytes.extend(dtype.encode(values));
        self.compute.load_block(&bytes)
    }

    /// A block of `values` stored as `dtype` divided by [`FP8_SCALE`], the scale right
    /// after them, all after `offset` filler bytes; and the slot that reads them back.
    fn scaled_block(
        &self,
        values: &[f32],
        dtype: DType,
        offset: usize,
        rows: usize,
        cols: usize,
    ) -> Result<(C::Block, TensorSlot), ComputeError> {
        let mut bytes: Vec<u8> = (0..offset).map(|i| i as u8).collect();
        let stored: Vec<f32> = values.iter().map(|value| value / FP8_SCALE).collect();
        bytes.extend(dtype.encode(&stored));
        let scale_at = bytes.len() as u64;
        bytes.extend(FP8_SCALE.to_le_bytes());
        let slot = TensorSlot {
            scale: Some(scale_at),
            ..slot(dtype, rows, cols, offset)
        };
        Ok((self.compute.load_block(&bytes)?, slot))
    }

    fn keep(
        &mut self,
        what: String,
        tensor: &C::Tensor,
        tolerance: f32,
        reference: Vec<f32>,
    ) -> Result<(), ComputeError> {
        let values = self.compute.read(tensor)?;
        self.outputs.values.push(Kept {
            what,
            values,
            tolerance,
            reference,
        });
        Ok(())
    }

    fn linear(&mut self) -> Result<(), ComputeError> {
        for (rows, inner, out) in [(5, 96, 40), (33, 512, 384)] {
            let x_values = seeded(rows * inner, 1, 1.0);
            let x = self.tensor(rows, inner, &x_values)?;
            let weights = seeded(out * inner, 2, 0.1);
            let bias = seeded(out, 3, 1.0);
            for (dtype, offset, bias_dtype) in [
                (DType::F32, 0, DType::F32),
                (DType::F32, 2, DType::F16),
                (DType::F16, 2, DType::Bf16),
                (DType::Bf16, 0, DType::F32),
            ] {
                let block = self.block(&weights, dtype, offset)?;
                let bias_values = bias.clone();
                let biases = self.block(&bias, bias_dtype, 6)?;
                let view = self.compute.block_view(&block);
                let weight = view.weight(&slot(dtype, out, inner, offset))?;
                let bias_view = self.compute.block_view(&biases);
                let bias = bias_view.weight(&slot(bias_dtype, 1, out, 6))?;
                let mut y = self.compute.tensor(rows, out)?;
                let (w, b) = (stored(&weights, dtype), stored(&bias_values, bias_dtype));
                self.compute.linear(&x, &weight, Some(&bias), &mut y)?;
                self.keep(
                    format!("linear {rows}x{inner}x{out} {dtype}+{offset}"),
                    &y,
                    1e-5,
                    reference::linear(&x_values, &w, Some(&b), inner),
                )?;
                self.compute.linear(&x, &weight, None, &mut y)?;
                self.keep(
                    format!("linear {rows}x{inner}x{out} {dtype}+{offset} no bias"),
                    &y,
                    1e-5,
                    reference::linear(&x_values, &w, None, inner),
                )?;
            }
        }
        Ok(())
    }

    fn low_rank(&mut self) -> Result<(), ComputeError> {
        let (rows, input, out, rank) = (3, 16, 12, 4);
        let factors = [seeded(rank * input, 8, 1.0), seeded(out * rank, 9, 1.0)].concat();
        let x_values = seeded(rows * input, 10, 1.0);
        let x = self.tensor(rows, input, &x_values)?;
        for dtype in [DType::F32, DType::Bf16] {
            let block = self.block(&factors, dtype, 0)?;
            let view = self.compute.block_view(&block);
            let a = view.weight(&slot(dtype, rank, input, 0))?;
            let b = view.weight(&slot(dtype, out, rank, rank * input * dtype.size_bytes()))?;
            let low_rank = LowRank::new(a, b)?;
            let stored_factors = stored(&factors, dtype);
            let (a_values, b_values) = stored_factors.split_at(rank * input);
            let y_values = seeded(rows * out, 11, 1.0);
            let mut y = self.tensor(rows, out, &y_values)?;
            // A scratch of the wrong shape is replaced, as the port allows.
            let mut scratch = self.compute.tensor(rows, 1)?;
            self.compute
                .low_rank_add(&x, &low_rank, 0.5, &mut scratch, &mut y)?;
            let expected =
                reference::low_rank_add(&x_values, a_values, b_values, 0.5, input, &y_values);
            self.keep(format!("low_rank_add {dtype}"), &y, 1e-5, expected)?;

            let weights = seeded(out * input, 7, 1.0);
            for (weight_dtype, offset) in [
                (DType::F32, 0),
                (DType::F32, 2),
                (DType::F16, 2),
                (DType::Bf16, 0),
            ] {
                let merged = self.block(&weights, weight_dtype, offset)?;
                let merged_view = self.compute.block_view(&merged);
                let weight = merged_view.weight(&slot(weight_dtype, out, input, offset))?;
                self.compute.merge_low_rank(&weight, &low_rank, 0.5)?;
                self.compute.wait(self.compute.fence()?)?;
                let bytes = self.read_back(&merged_view, offset, weight.bytes());
                let expected = reference::merge_low_rank(
                    &stored(&weights, weight_dtype),
                    a_values,
                    b_values,
                    0.5,
                    input,
                );
                self.outputs.merged.push((
                    format!("merge {dtype} factors into {weight_dtype}+{offset}"),
                    weight_dtype,
                    bytes,
                    expected,
                ));
            }
            let (merged, slot) = self.scaled_block(&weights, DType::F8E5M2, 1, out, input)?;
            let merged_view = self.compute.block_view(&merged);
            let weight = merged_view.weight(&slot)?;
            self.compute.merge_low_rank(&weight, &low_rank, 0.5)?;
            self.compute.wait(self.compute.fence()?)?;
            let bytes = self.read_back(&merged_view, 1, weight.bytes());
            // Stored values are the weight over its scale: so is the reference merge.
            let over_scale: Vec<f32> = weights.iter().map(|w| w / FP8_SCALE).collect();
            let before: Vec<f32> = stored(&over_scale, DType::F8E5M2)
                .iter()
                .map(|w| w * FP8_SCALE)
                .collect();
            let expected: Vec<f32> =
                reference::merge_low_rank(&before, a_values, b_values, 0.5, input)
                    .iter()
                    .map(|w| w / FP8_SCALE)
                    .collect();
            self.outputs.merged.push((
                format!("merge {dtype} factors into a scaled f8e5m2+1"),
                DType::F8E5M2,
                bytes,
                expected,
            ));
        }
        Ok(())
    }

    fn read_back(&self, view: &BlockView<'_>, offset: usize, bytes: usize) -> Vec<u8> {
        let whole = (self.read_back)(view.ptr().0, view.bytes() as usize);
        whole[offset..offset + bytes].to_vec()
    }

    fn rows(&mut self) -> Result<(), ComputeError> {
        let (rows, cols) = (6, 24);
        let values = seeded(rows * cols, 20, 3.0);
        let other = seeded(rows * cols, 21, 3.0);
        let mut x = self.tensor(rows, cols, &values)?;
        let y = self.tensor(rows, cols, &other)?;
        self.compute.add(&mut x, &y)?;
        let mut expected = reference::add(&values, &other);
        self.keep("add".into(), &x, 1e-6, expected.clone())?;
        let scales = [0.5, -1.0, 0.0, 2.0, 0.25, 1.0];
        self.compute.add_scaled_rows(&mut x, &y, &scales)?;
        expected = reference::add_scaled_rows(&expected, &other, &scales, cols);
        self.keep("add_scaled_rows".into(), &x, 1e-6, expected.clone())?;

        let table_values = seeded(10 * cols, 22, 1.0);
        let block = self.block(&table_values, DType::F16, 2)?;
        let view = self.compute.block_view(&block);
        let table = view.weight(&slot(DType::F16, 10, cols, 2))?;
        let ids = [3, 0, 9, 3, 7, 1];
        self.compute.gather_add(&table, &ids, &mut x)?;
        let table_values = stored(&table_values, DType::F16);
        expected = reference::gather_add(&table_values, &ids, &expected, cols);
        self.keep("gather_add f16+2".into(), &x, 1e-6, expected.clone())?;
        let error = self
            .compute
            .gather_add(&table, &[3, 0, 10, 3, 7, 1], &mut x);
        assert!(error.is_err(), "an id past the table must be refused");

        let params = [seeded(cols, 23, 1.0), seeded(cols, 24, 1.0)].concat();
        let block = self.block(&params, DType::Bf16, 0)?;
        let view = self.compute.block_view(&block);
        let gamma = view.weight(&slot(DType::Bf16, 1, cols, 0))?;
        let beta = view.weight(&slot(DType::Bf16, 1, cols, cols * 2))?;
        let params = stored(&params, DType::Bf16);
        let (gamma_values, beta_values) = params.split_at(cols);
        let mut normed = self.compute.tensor(rows, cols)?;
        self.compute
            .layer_norm(&x, &gamma, &beta, 1e-12, &mut normed)?;
        let layer_normed = reference::layer_norm(&expected, gamma_values, beta_values, 1e-12, cols);
        self.keep("layer_norm".into(), &normed, 1e-5, layer_normed)?;
        self.compute.rms_norm(&x, Some(&gamma), 1e-6, &mut normed)?;
        let rms_normed = reference::rms_norm(&expected, Some(gamma_values), 1e-6, cols);
        self.keep("rms_norm".into(), &normed, 1e-5, rms_normed)?;
        self.compute.rms_norm(&x, None, 1e-6, &mut normed)?;
        let plain = reference::rms_norm(&expected, None, 1e-6, cols);
        self.keep("rms_norm without weight".into(), &normed, 1e-5, plain)?;
        // Per head (Qwen3's q_norm): each row is 4 heads of 6, one weight of 6.
        let mut per_head = self.tensor(rows, cols, &expected)?;
        let head_gamma = view.weight(&slot(DType::Bf16, 1, 6, 0))?;
        self.compute
            .rms_norm_heads(&mut per_head, 4, &head_gamma, 1e-6)?;
        let heads_normed = reference::rms_norm(&expected, Some(&gamma_values[..6]), 1e-6, 6);
        self.keep("rms_norm_heads".into(), &per_head, 1e-5, heads_normed)?;
        let wrong = self
            .compute
            .rms_norm_heads(&mut per_head, 5, &head_gamma, 1e-6);
        assert!(
            wrong.is_err(),
            "heads that do not divide the row must be refused"
        );

        let wide_values = seeded(256, 25, 6.0);
        let mut wide = self.tensor(4, 64, &wide_values)?;
        self.compute.gelu_erf(&mut wide)?;
        let gelu = reference::gelu_erf(&wide_values);
        self.keep("gelu_erf".into(), &wide, 1e-6, gelu)?;
        // A copy of values written from the host: exact on every adapter (a copy of
        // the GELU above would carry that kernel's own last-bit differences).
        let source = self.tensor(4, 64, &wide_values)?;
        let mut copied = self.compute.tensor(4, 64)?;
        self.compute.copy(&source, &mut copied)?;
        self.keep("copy".into(), &copied, 0.0, wide_values)?;
        Ok(())
    }

    fn attention(&mut self) -> Result<(), ComputeError> {
        let short = [5usize, 3];
        let long = [33usize, 1, 20];
        for (sequences, length, heads, kv_heads, dim, mask) in [
            (2, 5, 4, 4, 8, Mask::Padding(&short)),
            (2, 5, 4, 2, 8, Mask::Causal),
            (2, 5, 6, 1, 8, Mask::Padding(&short)),
            (3, 33, 4, 2, 16, Mask::Padding(&long)),
            (3, 33, 4, 4, 16, Mask::Causal),
        ] {
            let shape = Attention {
                sequences,
                sequence_length: length,
                heads,
                kv_heads,
                head_dim: dim,
                scale: 1.0 / (dim as f32).sqrt(),
                mask,
            };
            let rows = sequences * length;
            let q_values = seeded(rows * heads * dim, 30, 2.0);
            let k_values = seeded(rows * kv_heads * dim, 31, 2.0);
            let v_values = seeded(rows * kv_heads * dim, 32, 2.0);
            let q = self.tensor(rows, heads * dim, &q_values)?;
            let k = self.tensor(rows, kv_heads * dim, &k_values)?;
            let v = self.tensor(rows, kv_heads * dim, &v_values)?;
            let mut out = self.compute.tensor(rows, heads * dim)?;
            self.compute.attention(&q, &k, &v, &shape, &mut out)?;
            let mut expected = reference::attention(&q_values, &k_values, &v_values, &shape);
            // Padding rows (queries past a sequence's length) are not defined by the
            // port: take the adapter's own there.
            if let Mask::Padding(lengths) = mask {
                let values = self.compute.read(&out)?;
                for (sequence, &real) in lengths.iter().enumerate() {
                    let first = (sequence * length + real) * heads * dim;
                    let end = (sequence + 1) * length * heads * dim;
                    expected[first..end].copy_from_slice(&values[first..end]);
                }
            }
            self.keep(
                format!("attention {sequences}x{length} {heads}/{kv_heads} heads {mask:?}"),
                &out,
                1e-5,
                expected,
            )?;
        }
        Ok(())
    }

    fn decoder(&mut self) -> Result<(), ComputeError> {
        let (rows, cols) = (3, 32);
        let (gate_values, up_values) = (seeded(rows * cols, 40, 6.0), seeded(rows * cols, 41, 2.0));
        let mut gate = self.tensor(rows, cols, &gate_values)?;
        let up = self.tensor(rows, cols, &up_values)?;
        self.compute.silu_mul(&mut gate, &up)?;
        let expected = reference::silu_mul(&gate_values, &up_values);
        self.keep("silu_mul".into(), &gate, 1e-5, expected)?;
        let x_values = seeded(rows * cols, 42, 1.0);
        let mut x = self.tensor(rows, cols, &x_values)?;
        let frequencies: Vec<f32> = (0..4).map(|i| 10_000f32.powf(-(i as f32) / 4.0)).collect();
        let positions = [0, 7, 4095];
        self.compute.rope(&mut x, 4, 8, &positions, &frequencies)?;
        let expected = reference::rope(&x_values, 4, 8, &positions, &frequencies);
        self.keep("rope".into(), &x, 1e-5, expected)?;

        // A cache grown row by row, shrunk and grown again: new rows read as zeros.
        let (heads, kv_heads, dim, past, queries) = (4, 2, 8, 5, 2);
        let kv_cols = kv_heads * dim;
        let mut k_cache = self.compute.tensor(0, kv_cols)?;
        let mut v_cache = self.compute.tensor(0, kv_cols)?;
        let keys = past + queries;
        let k_values = seeded(keys * kv_cols, 43, 1.0);
        let v_values = seeded(keys * kv_cols, 44, 1.0);
        for row in 0..keys {
            for (cache, values) in [(&mut k_cache, &k_values), (&mut v_cache, &v_values)] {
                self.compute.resize_rows(cache, row + 1)?;
                let new = self.tensor(1, kv_cols, &values[row * kv_cols..(row + 1) * kv_cols])?;
                self.compute.write_rows(cache, row, &new)?;
            }
        }
        let mut grown = self.tensor(2, kv_cols, &k_values[..2 * kv_cols])?;
        self.compute.resize_rows(&mut grown, 1)?;
        self.compute.resize_rows(&mut grown, 3)?;
        let kept_row = [&k_values[..kv_cols], &vec![0.0; 2 * kv_cols][..]].concat();
        self.keep(
            "resize_rows shrunk then grown".into(),
            &grown,
            0.0,
            kept_row,
        )?;
        let q_values = seeded(queries * heads * dim, 45, 2.0);
        let q = self.tensor(queries, heads * dim, &q_values)?;
        let mut out = self.compute.tensor(queries, heads * dim)?;
        let shape = CachedAttention {
            heads,
            kv_heads,
            head_dim: dim,
            scale: 1.0 / (dim as f32).sqrt(),
            past,
            queries,
        };
        self.compute
            .attention_cached(&q, &k_cache, &v_cache, &shape, &mut out)?;
        let expected = reference::attention_cached(&q_values, &k_values, &v_values, &shape);
        self.keep("attention_cached".into(), &out, 1e-5, expected)?;
        Ok(())
    }

    fn checksums(&mut self) -> Result<(), ComputeError> {
        let bytes: Vec<u8> = (0..(1u32 << 20) + 7)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let block = self.compute.load_block(&bytes)?;
        let view = self.compute.block_view(&block);
        for (offset, length) in [
            (0usize, bytes.len()),
            (1, 4097),
            (2, 6),
            (4, 1 << 20),
            (7, 1),
        ] {
            // SAFETY: a sub-range of a block this scenario loaded and still holds.
            let part = unsafe { BlockView::new(view.ptr().offset(offset as u64), length as u64) };
            let checksum = self.compute.checksum(&part)?;
            assert_eq!(
                checksum,
                stagehand::compute::checksum::checksum(&bytes[offset..offset + length]),
                "{} checksum at {offset}+{length}",
                self.compute.name()
            );
            self.outputs
                .checksums
                .push((format!("{offset}+{length}"), checksum));
        }
        Ok(())
    }
}

/// Runs every operation on `compute`; `read_back(address, length)` returns the bytes
/// of a block the scenario holds.
pub fn run_ops<C: Compute>(
    compute: &C,
    read_back: &dyn Fn(u64, usize) -> Vec<u8>,
) -> Result<Outputs, ComputeError> {
    let mut scenario = Scenario {
        compute,
        read_back,
        outputs: Outputs {
            values: Vec::new(),
            merged: Vec::new(),
            checksums: Vec::new(),
        },
    };
    scenario.linear()?;
    scenario.low_rank()?;
    scenario.rows()?;
    scenario.attention()?;
    scenario.decoder()?;
    scenario.checksums()?;
    compute.wait(compute.fence()?)?;
    Ok(scenario.outputs)
}
