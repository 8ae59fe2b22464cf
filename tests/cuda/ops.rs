//! Every operation of the compute port on fixed inputs, written once against
//! `Compute` so the same scenario runs on `CpuCompute` and on `CudaCompute` and their
//! results can be compared (GPUs sum in another order: within a tolerance) or, on one
//! adapter, repeated (bit for bit).

use stagehand::compute::{
    Attention, BlockView, CachedAttention, Compute, ComputeError, DType, LowRank, Mask, TensorSlot,
};

/// What one pass of the scenario produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Outputs {
    /// (what, values, largest normalised difference allowed between two adapters).
    pub values: Vec<(String, Vec<f32>, f32)>,
    /// Weights after a LoRA merge, as stored (dtype, bytes).
    pub merged: Vec<(String, DType, Vec<u8>)>,
    /// Checksums of byte ranges (exact on every adapter).
    pub checksums: Vec<(String, u64)>,
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

/// max |a − b| over max(1, max |a|); infinite for different lengths or a NaN.
pub fn normalised_difference(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    let scale = a.iter().fold(1f32, |max, value| max.max(value.abs()));
    a.iter().zip(b).fold(0f32, |max, (a, b)| {
        let delta = (a - b).abs();
        if delta.is_nan() {
            f32::INFINITY
        } else {
            max.max(delta / scale)
        }
    })
}

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
    ) -> Result<(), ComputeError> {
        let values = self.compute.read(tensor)?;
        self.outputs.values.push((what, values, tolerance));
        Ok(())
    }

    fn linear(&mut self) -> Result<(), ComputeError> {
        for (rows, inner, out) in [(5, 96, 40), (33, 512, 384)] {
            let x = self.tensor(rows, inner, &seeded(rows * inner, 1, 1.0))?;
            let weights = seeded(out * inner, 2, 0.1);
            let bias = seeded(out, 3, 1.0);
            for (dtype, offset, bias_dtype) in [
                (DType::F32, 0, DType::F32),
                (DType::F32, 2, DType::F16),
                (DType::F16, 2, DType::Bf16),
                (DType::Bf16, 0, DType::F32),
            ] {
                let block = self.block(&weights, dtype, offset)?;
                let biases = self.block(&bias, bias_dtype, 6)?;
                let view = self.compute.block_view(&block);
                let weight = view.weight(&slot(dtype, out, inner, offset))?;
                let bias_view = self.compute.block_view(&biases);
                let bias = bias_view.weight(&slot(bias_dtype, 1, out, 6))?;
                let mut y = self.compute.tensor(rows, out)?;
                self.compute.linear(&x, &weight, Some(&bias), &mut y)?;
                self.keep(
                    format!("linear {rows}x{inner}x{out} {dtype}+{offset}"),
                    &y,
                    1e-5,
                )?;
                self.compute.linear(&x, &weight, None, &mut y)?;
                self.keep(
                    format!("linear {rows}x{inner}x{out} {dtype}+{offset} no bias"),
                    &y,
                    1e-5,
                )?;
            }
        }
        Ok(())
    }

    fn low_rank(&mut self) -> Result<(), ComputeError> {
        let (rows, input, out, rank) = (3, 16, 12, 4);
        let factors = [seeded(rank * input, 8, 1.0), seeded(out * rank, 9, 1.0)].concat();
        let x = self.tensor(rows, input, &seeded(rows * input, 10, 1.0))?;
        for dtype in [DType::F32, DType::Bf16] {
            let block = self.block(&factors, dtype, 0)?;
            let view = self.compute.block_view(&block);
            let a = view.weight(&slot(dtype, rank, input, 0))?;
            let b = view.weight(&slot(dtype, out, rank, rank * input * dtype.size_bytes()))?;
            let low_rank = LowRank::new(a, b)?;
            let mut y = self.tensor(rows, out, &seeded(rows * out, 11, 1.0))?;
            // A scratch of the wrong shape is replaced, as the port allows.
            let mut scratch = self.compute.tensor(rows, 1)?;
            self.compute
                .low_rank_add(&x, &low_rank, 0.5, &mut scratch, &mut y)?;
            self.keep(format!("low_rank_add {dtype}"), &y, 1e-5)?;

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
                self.outputs.merged.push((
                    format!("merge {dtype} factors into {weight_dtype}+{offset}"),
                    weight_dtype,
                    bytes,
                ));
            }
            let (merged, slot) = self.scaled_block(&weights, DType::F8E5M2, 1, out, input)?;
            let merged_view = self.compute.block_view(&merged);
            let weight = merged_view.weight(&slot)?;
            self.compute.merge_low_rank(&weight, &low_rank, 0.5)?;
            self.compute.wait(self.compute.fence()?)?;
            let bytes = self.read_back(&merged_view, 1, weight.bytes());
            self.outputs.merged.push((
                format!("merge {dtype} factors into a scaled f8e5m2+1"),
                DType::F8E5M2,
                bytes,
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
        self.keep("add".into(), &x, 1e-6)?;
        self.compute
            .add_scaled_rows(&mut x, &y, &[0.5, -1.0, 0.0, 2.0, 0.25, 1.0])?;
        self.keep("add_scaled_rows".into(), &x, 1e-6)?;

        let table = seeded(10 * cols, 22, 1.0);
        let block = self.block(&table, DType::F16, 2)?;
        let view = self.compute.block_view(&block);
        let table = view.weight(&slot(DType::F16, 10, cols, 2))?;
        self.compute
            .gather_add(&table, &[3, 0, 9, 3, 7, 1], &mut x)?;
        self.keep("gather_add f16+2".into(), &x, 1e-6)?;
        let error = self
            .compute
            .gather_add(&table, &[3, 0, 10, 3, 7, 1], &mut x);
        assert!(error.is_err(), "an id past the table must be refused");

        let params = [seeded(cols, 23, 1.0), seeded(cols, 24, 1.0)].concat();
        let block = self.block(&params, DType::Bf16, 0)?;
        let view = self.compute.block_view(&block);
        let gamma = view.weight(&slot(DType::Bf16, 1, cols, 0))?;
        let beta = view.weight(&slot(DType::Bf16, 1, cols, cols * 2))?;
        let mut normed = self.compute.tensor(rows, cols)?;
        self.compute
            .layer_norm(&x, &gamma, &beta, 1e-12, &mut normed)?;
        self.keep("layer_norm".into(), &normed, 1e-5)?;
        self.compute.rms_norm(&x, Some(&gamma), 1e-6, &mut normed)?;
        self.keep("rms_norm".into(), &normed, 1e-5)?;
        self.compute.rms_norm(&x, None, 1e-6, &mut normed)?;
        self.keep("rms_norm without weight".into(), &normed, 1e-5)?;

        let mut wide = self.tensor(4, 64, &seeded(256, 25, 6.0))?;
        self.compute.gelu_erf(&mut wide)?;
        self.keep("gelu_erf".into(), &wide, 1e-6)?;
        let mut copied = self.compute.tensor(4, 64)?;
        self.compute.copy(&wide, &mut copied)?;
        self.keep("copy".into(), &copied, 0.0)?;
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
            let q = self.tensor(rows, heads * dim, &seeded(rows * heads * dim, 30, 2.0))?;
            let k = self.tensor(
                rows,
                kv_heads * dim,
                &seeded(rows * kv_heads * dim, 31, 2.0),
            )?;
            let v = self.tensor(
                rows,
                kv_heads * dim,
                &seeded(rows * kv_heads * dim, 32, 2.0),
            )?;
            let mut out = self.compute.tensor(rows, heads * dim)?;
            self.compute.attention(&q, &k, &v, &shape, &mut out)?;
            self.keep(
                format!("attention {sequences}x{length} {heads}/{kv_heads} heads {mask:?}"),
                &out,
                1e-5,
            )?;
        }
        Ok(())
    }

    fn decoder(&mut self) -> Result<(), ComputeError> {
        let (rows, cols) = (3, 32);
        let mut gate = self.tensor(rows, cols, &seeded(rows * cols, 40, 6.0))?;
        let up = self.tensor(rows, cols, &seeded(rows * cols, 41, 2.0))?;
        self.compute.silu_mul(&mut gate, &up)?;
        self.keep("silu_mul".into(), &gate, 1e-5)?;
        let mut x = self.tensor(rows, cols, &seeded(rows * cols, 42, 1.0))?;
        let frequencies: Vec<f32> = (0..4).map(|i| 10_000f32.powf(-(i as f32) / 4.0)).collect();
        self.compute
            .rope(&mut x, 4, 8, &[0, 7, 4095], &frequencies)?;
        self.keep("rope".into(), &x, 1e-5)?;

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
        self.keep("resize_rows shrunk then grown".into(), &grown, 0.0)?;
        let q = self.tensor(
            queries,
            heads * dim,
            &seeded(queries * heads * dim, 45, 2.0),
        )?;
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
        self.keep("attention_cached".into(), &out, 1e-5)?;
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

/// The bytes at a host address (the CPU adapter's "device" memory).
pub fn host_read_back(address: u64, length: usize) -> Vec<u8> {
    // SAFETY: only called with the range of a block the scenario holds.
    unsafe { std::slice::from_raw_parts(address as *const u8, length) }.to_vec()
}
