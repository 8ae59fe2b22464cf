//! cuBLAS on the compute stream, spoken in row-major terms.
//!
//! Every product the port needs is `C ← α·A·op(B) + β·C` on row-major f32 matrices,
//! where `op(B)` is `B` or `Bᵀ`. cuBLAS is column-major; a row-major matrix read as
//! column-major is its transpose, so the call computes `Cᵀ = op(B)ᵀ·Aᵀ`: cuBLAS's A
//! is our B (transposed when ours is not), its B is our A, and m and n swap.
//!
//! Results are deterministic for a given handle, stream, shapes and GPU (cuBLAS's
//! default atomics mode is "not allowed"); the reference pass and the streamed run use
//! this one handle on one stream, so they agree bit for bit.

use std::ffi::c_int;

use cudarc::cublas::{result as cublas_result, sys as cublas_sys};
use cudarc::driver::CudaStream;
use stagehand_actors::DevicePtr;

use super::error::CudaError;
use super::library::require_cublas;

/// A cuBLAS handle bound to one stream. Destroyed on drop without panicking (cudarc's
/// own handle type unwraps the destroy call).
pub struct Blas {
    handle: cublas_sys::cublasHandle_t,
}

/// One row-major product `C ← α·A·op(B) + β·C`, `batch` times with element strides
/// between the matrices of a batch.
#[derive(Debug, Clone, Copy)]
pub struct Gemm {
    /// Rows of A and C.
    pub m: usize,
    /// Columns of op(B) and C.
    pub n: usize,
    /// Columns of A, rows of op(B).
    pub k: usize,
    pub a: DevicePtr,
    pub lda: usize,
    pub b: DevicePtr,
    pub ldb: usize,
    /// `B` is stored `[n, k]` and used transposed (a weight `[out, in]`); otherwise it
    /// is stored `[k, n]`.
    pub b_transposed: bool,
    pub c: DevicePtr,
    pub ldc: usize,
    pub alpha: f32,
    pub beta: f32,
    pub batch: usize,
    pub stride_a: usize,
    pub stride_b: usize,
    pub stride_c: usize,
}

impl Gemm {
    /// A single product with unit leading dimensions implied by the shapes: `A`
    /// `[m, k]`, `B` `[n, k]` (transposed) or `[k, n]`, `C` `[m, n]`.
    #[allow(clippy::too_many_arguments)]
    pub fn dense(
        m: usize,
        n: usize,
        k: usize,
        a: DevicePtr,
        b: DevicePtr,
        b_transposed: bool,
        c: DevicePtr,
        alpha: f32,
        beta: f32,
    ) -> Self {
        Self {
            m,
            n,
            k,
            a,
            lda: k,
            b,
            ldb: if b_transposed { k } else { n },
            b_transposed,
            c,
            ldc: n,
            alpha,
            beta,
            batch: 1,
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
        }
    }

    /// The cuBLAS (column-major) arguments: (transa, m, n, k, A, lda, B, ldb, C, ldc).
    fn column_major(&self) -> ColumnMajor {
        ColumnMajor {
            transpose_a: self.b_transposed,
            m: self.n,
            n: self.m,
            k: self.k,
            a: self.b,
            lda: self.ldb,
            stride_a: self.stride_b,
            b: self.a,
            ldb: self.lda,
            stride_b: self.stride_a,
        }
    }
}

/// The column-major view of a [`Gemm`] (C keeps its pointer, ldc and stride).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ColumnMajor {
    transpose_a: bool,
    m: usize,
    n: usize,
    k: usize,
    a: DevicePtr,
    lda: usize,
    stride_a: usize,
    b: DevicePtr,
    ldb: usize,
    stride_b: usize,
}

fn int(value: usize, what: &str) -> Result<c_int, CudaError> {
    c_int::try_from(value)
        .map_err(|_| CudaError::InvalidArgument(format!("{what} {value} is too large for cuBLAS")))
}

fn long(value: usize, what: &str) -> Result<i64, CudaError> {
    i64::try_from(value)
        .map_err(|_| CudaError::InvalidArgument(format!("{what} {value} is too large for cuBLAS")))
}

impl Blas {
    /// A handle whose work goes on `stream` (checks cuBLAS is installed first).
    pub fn new(stream: &CudaStream) -> Result<Self, CudaError> {
        require_cublas()?;
        super::events::make_current(stream.context())?;
        let handle = cublas_result::create_handle().map_err(CudaError::cublas("cublasCreate"))?;
        let blas = Self { handle };
        // SAFETY: both handles are live; the stream outlives the handle (the adapter
        // drops its Blas before its stream).
        unsafe { cublas_result::set_stream(blas.handle, stream.cu_stream() as _) }
            .map_err(CudaError::cublas("cublasSetStream"))?;
        Ok(blas)
    }

    /// Queues `gemm`.
    ///
    /// # Safety
    /// Every matrix the product names (with its leading dimension, stride and batch)
    /// is f32 device memory of the handle's context that stays allocated until the
    /// stream passes the call, and C overlaps neither A nor B.
    pub unsafe fn gemm(&self, gemm: &Gemm) -> Result<(), CudaError> {
        if gemm.m == 0 || gemm.n == 0 || gemm.batch == 0 {
            return Ok(());
        }
        let cm = gemm.column_major();
        let transpose = cublas_sys::cublasOperation_t::CUBLAS_OP_T;
        let plain = cublas_sys::cublasOperation_t::CUBLAS_OP_N;
        let transa = if cm.transpose_a { transpose } else { plain };
        let (m, n, k) = (int(cm.m, "m")?, int(cm.n, "n")?, int(cm.k, "k")?);
        let (lda, ldb, ldc) = (
            int(cm.lda.max(1), "lda")?,
            int(cm.ldb.max(1), "ldb")?,
            int(gemm.ldc.max(1), "ldc")?,
        );
        let a = cm.a.0 as *const f32;
        let b = cm.b.0 as *const f32;
        let c = gemm.c.0 as *mut f32;
        if gemm.batch == 1 {
            // SAFETY: the caller's promise covers the matrices; alpha and beta are
            // host scalars (the handle's default pointer mode).
            return unsafe {
                cublas_result::sgemm(
                    self.handle,
                    transa,
                    plain,
                    m,
                    n,
                    k,
                    &gemm.alpha,
                    a,
                    lda,
                    b,
                    ldb,
                    &gemm.beta,
                    c,
                    ldc,
                )
            }
            .map_err(CudaError::cublas("cublasSgemm"));
        }
        let (stride_a, stride_b, stride_c) = (
            long(cm.stride_a, "stride")?,
            long(cm.stride_b, "stride")?,
            long(gemm.stride_c, "stride")?,
        );
        // SAFETY: as above, for each of the batch's matrices.
        unsafe {
            cublas_result::sgemm_strided_batched(
                self.handle,
                transa,
                plain,
                m,
                n,
                k,
                &gemm.alpha,
                a,
                lda,
                stride_a,
                b,
                ldb,
                stride_b,
                &gemm.beta,
                c,
                ldc,
                stride_c,
                int(gemm.batch, "batch")?,
            )
        }
        .map_err(CudaError::cublas("cublasSgemmStridedBatched"))
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: the handle was created by `new` and is destroyed once.
        if let Err(error) = unsafe { cublas_result::destroy_handle(self.handle) } {
            tracing::warn!(?error, "cublasDestroy failed");
        }
    }
}

/// What cuBLAS computes for `gemm`, by its column-major definition, on host memory
/// (the pointers are host addresses): lets the row-major mapping, leading dimensions,
/// strides and batches be checked on a machine without a GPU.
///
/// # Safety
/// Every matrix `gemm` names is host f32 memory of the sizes it implies.
#[cfg(test)]
pub(super) unsafe fn emulate(gemm: &Gemm) {
    let cm = gemm.column_major();
    for batch in 0..gemm.batch {
        let a = (cm.a.0 as *const f32).wrapping_add(batch * cm.stride_a);
        let b = (cm.b.0 as *const f32).wrapping_add(batch * cm.stride_b);
        let c = (gemm.c.0 as *mut f32).wrapping_add(batch * gemm.stride_c);
        for j in 0..cm.n {
            for i in 0..cm.m {
                let mut sum = 0f64;
                for l in 0..cm.k {
                    let op_a = if cm.transpose_a {
                        a.wrapping_add(l + i * cm.lda)
                    } else {
                        a.wrapping_add(i + l * cm.lda)
                    };
                    // SAFETY: the caller's promise covers every index of the product.
                    let product = unsafe { *op_a * *b.wrapping_add(l + j * cm.ldb) };
                    sum += f64::from(product);
                }
                let at = c.wrapping_add(i + j * gemm.ldc);
                // cuBLAS does not read C when beta is 0 (it may hold anything, NaN
                // included).
                // SAFETY: as above.
                unsafe {
                    *at = if gemm.beta == 0.0 {
                        gemm.alpha * sum as f32
                    } else {
                        gemm.alpha * sum as f32 + gemm.beta * *at
                    }
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ptr(values: &[f32]) -> DevicePtr {
        DevicePtr(values.as_ptr() as u64)
    }

    /// The address of an output: taken from a mutable borrow, so writing through it is
    /// sound.
    fn written(values: &mut [f32]) -> DevicePtr {
        DevicePtr(values.as_mut_ptr() as u64)
    }

    fn values(count: usize, seed: u32) -> Vec<f32> {
        (0..count as u32)
            .map(|i| ((i * 7 + seed * 13) % 11) as f32 - 5.0)
            .collect()
    }

    #[test]
    fn the_products_the_port_needs_compute_their_row_major_meaning() {
        // Proves, through cuBLAS's column-major definition, that linear (y = x·Wᵀ + y),
        // the LoRA merge (W += s·B·A) and its low-rank pair compute what they mean on
        // row-major matrices.
        let (rows, input, out, rank) = (3, 5, 4, 2);
        let x = values(rows * input, 1);
        let w = values(out * input, 2);
        let mut y = values(rows * out, 3);
        let expected: Vec<f32> = (0..rows * out)
            .map(|at| {
                let (r, o) = (at / out, at % out);
                y[at]
                    + (0..input)
                        .map(|i| x[r * input + i] * w[o * input + i])
                        .sum::<f32>()
            })
            .collect();
        let linear = Gemm::dense(
            rows,
            out,
            input,
            ptr(&x),
            ptr(&w),
            true,
            written(&mut y),
            1.0,
            1.0,
        );
        // SAFETY: host arrays of the product's sizes.
        unsafe { emulate(&linear) };
        assert_eq!(y, expected);

        let a = values(rank * input, 4);
        let b = values(out * rank, 5);
        let mut merged = w.clone();
        let expected: Vec<f32> = (0..out * input)
            .map(|at| {
                let (o, i) = (at / input, at % input);
                w[at]
                    + 0.5
                        * (0..rank)
                            .map(|r| b[o * rank + r] * a[r * input + i])
                            .sum::<f32>()
            })
            .collect();
        let merge = Gemm::dense(
            out,
            input,
            rank,
            ptr(&b),
            ptr(&a),
            false,
            written(&mut merged),
            0.5,
            1.0,
        );
        // SAFETY: as above.
        unsafe { emulate(&merge) };
        assert_eq!(merged, expected);

        let mut scratch = vec![0f32; rows * rank];
        let mut low_rank = vec![0f32; rows * out];
        let down = Gemm::dense(
            rows,
            rank,
            input,
            ptr(&x),
            ptr(&a),
            true,
            written(&mut scratch),
            1.0,
            0.0,
        );
        // SAFETY: as above.
        unsafe { emulate(&down) };
        let up = Gemm::dense(
            rows,
            out,
            rank,
            ptr(&scratch),
            ptr(&b),
            true,
            written(&mut low_rank),
            0.5,
            1.0,
        );
        // SAFETY: as above; the scratch was written before this reads it.
        unsafe { emulate(&up) };
        let merged_only: Vec<f32> = (0..rows * out)
            .map(|at| {
                let (r, o) = (at / out, at % out);
                (0..input)
                    .map(|i| x[r * input + i] * (merged[o * input + i] - w[o * input + i]))
                    .sum::<f32>()
            })
            .collect();
        assert_eq!(low_rank, merged_only, "x·(s·B·A)ᵀ = s·(x·Aᵀ)·Bᵀ");
    }

    #[test]
    fn a_row_major_linear_is_the_transposed_column_major_product() {
        // Proves y[rows, out] = x·Wᵀ maps to cuBLAS's Wᵀ-op product with m = out,
        // n = rows, W first (leading dimension in) and x second, as the old linear
        // stack called it.
        let (x, w, y) = (DevicePtr(0x1000), DevicePtr(0x2000), DevicePtr(0x3000));
        let gemm = Gemm::dense(8, 32, 16, x, w, true, y, 1.0, 0.0);
        let cm = gemm.column_major();
        assert_eq!(
            cm,
            ColumnMajor {
                transpose_a: true,
                m: 32,
                n: 8,
                k: 16,
                a: w,
                lda: 16,
                stride_a: 0,
                b: x,
                ldb: 16,
                stride_b: 0,
            }
        );
        assert_eq!(gemm.ldc, 32);
    }

    #[test]
    fn a_plain_product_keeps_b_untransposed_with_its_row_length() {
        // Proves W += B·A (B [out, rank], A [rank, in]) becomes cuBLAS's plain
        // product of A (ld in) by B (ld rank) into W (ld in).
        let (b, a, w) = (DevicePtr(0x1000), DevicePtr(0x2000), DevicePtr(0x3000));
        let gemm = Gemm::dense(12, 16, 4, b, a, false, w, 0.5, 1.0);
        let cm = gemm.column_major();
        assert!(!cm.transpose_a);
        assert_eq!((cm.m, cm.n, cm.k), (16, 12, 4));
        assert_eq!((cm.a, cm.lda, cm.b, cm.ldb), (a, 16, b, 4));
        assert_eq!(gemm.ldc, 16);
        assert!(int(usize::MAX, "m").is_err());
    }
}
