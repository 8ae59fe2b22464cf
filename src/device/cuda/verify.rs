//! stream-verify on the GPU: every block's bytes, as they sit in VRAM, are checksummed
//! by the NVRTC kernel and compared with the file's.
//!
//! The CPU backend's checksum (`stream_verify::checksum`, FNV-1a) is sequential by
//! definition and cannot run as a parallel kernel, so the device side uses the
//! order-independent sum of [`super::checksum`] and the expected values are computed
//! from the file with the same function ([`expected_checksums_cuda`]).

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::sys;
use stagehand_actors::{Device, DeviceArena, DevicePtr};

use super::checksum::{checksum_cpu, finish, ChecksumKernel};
use super::device::CudaDevice;
use super::error::CudaError;
use crate::model::{BlockReader, ModelIndex};

/// Reads block `block` of `index` from its files into one buffer.
pub fn read_block(index: &ModelIndex, block: usize) -> Result<Vec<u8>, CudaError> {
    if block >= index.blocks.len() {
        return Err(CudaError::InvalidArgument(format!(
            "block {block} is not in the {}-block model",
            index.blocks.len()
        )));
    }
    BlockReader::open(index)
        .and_then(|reader| reader.read(block))
        .map_err(|error| CudaError::InvalidArgument(format!("reading {error}")))
}

/// The device checksum ([`checksum_cpu`]) of every block, computed from the files.
pub fn expected_checksums_cuda(index: &ModelIndex) -> Result<Vec<u64>, CudaError> {
    let reader = BlockReader::open(index)
        .map_err(|error| CudaError::InvalidArgument(format!("reading {error}")))?;
    (0..index.blocks.len())
        .map(|block| {
            reader
                .read(block)
                .map(|bytes| checksum_cpu(&bytes))
                .map_err(|error| CudaError::InvalidArgument(format!("reading {error}")))
        })
        .collect()
}

/// A block whose device bytes did not match the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChecksumMismatch {
    pub block: usize,
    pub got: u64,
    pub expected: u64,
}

/// The checksum kernel with one device sum per block, read back once per step.
pub struct StreamVerifyGpu {
    device: Arc<CudaDevice>,
    kernel: ChecksumKernel,
    expected: Vec<u64>,
    block_bytes: Vec<u64>,
    sums: Option<DeviceArena>,
}

impl StreamVerifyGpu {
    pub fn new(device: Arc<CudaDevice>, index: &ModelIndex) -> Result<Self, CudaError> {
        let kernel = ChecksumKernel::new(&device)?;
        let expected = expected_checksums_cuda(index)?;
        let block_bytes = index.blocks.iter().map(|block| block.bytes).collect();
        let sums = device
            .allocate_arena((expected.len().max(1) * 8) as u64)
            .map_err(|error| CudaError::InvalidArgument(format!("checksum sums: {error}")))?;
        Ok(Self {
            device,
            kernel,
            expected,
            block_bytes,
            sums: Some(sums),
        })
    }

    fn sums(&self) -> Result<&DeviceArena, CudaError> {
        self.sums
            .as_ref()
            .ok_or_else(|| CudaError::InvalidArgument("checksum sums were freed".to_string()))
    }

    /// Queues zeroing every block's sum on the compute stream, before a step.
    pub fn reset(&self) -> Result<(), CudaError> {
        let sums = self.sums()?;
        self.device.bind()?;
        // SAFETY: the arena is live and holds `bytes` bytes; ordered on the compute
        // stream before the step's checksums.
        unsafe {
            sys::cuMemsetD8Async(
                sums.base.0,
                0,
                sums.bytes as usize,
                self.device.compute_stream().cu_stream(),
            )
        }
        .result()
        .map_err(CudaError::driver("cuMemsetD8Async"))
    }

    /// Queues the checksum of block `block`, whose bytes start at `data`.
    pub fn check_block(&self, block: usize, data: DevicePtr) -> Result<(), CudaError> {
        let bytes = *self.block_bytes.get(block).ok_or_else(|| {
            CudaError::InvalidArgument(format!("block {block} is not in the model"))
        })?;
        let sum = self.sums()?.base.offset(block as u64 * 8);
        self.kernel.queue_sum(data, bytes, sum)
    }

    /// Waits for the compute stream, reads every sum back and compares; `Ok(Err(..))`
    /// names the first block whose bytes differ from the file.
    pub fn compare(&self) -> Result<Result<(), ChecksumMismatch>, CudaError> {
        let sums = self.sums()?;
        let mut values = vec![0u64; self.expected.len()];
        self.device.bind()?;
        let stream = self.device.compute_stream();
        // SAFETY: `values` holds one u64 per block, as the arena does, and outlives the
        // copy, which the synchronize below completes.
        unsafe {
            sys::cuMemcpyDtoHAsync_v2(
                values.as_mut_ptr() as *mut c_void,
                sums.base.0,
                values.len() * 8,
                stream.cu_stream(),
            )
        }
        .result()
        .map_err(CudaError::driver("cuMemcpyDtoHAsync"))?;
        stream
            .synchronize()
            .map_err(CudaError::driver("cuStreamSynchronize"))?;
        Ok(first_mismatch(&values, &self.block_bytes, &self.expected))
    }
}

/// The first block whose finished device sum differs from the expected checksum.
pub fn first_mismatch(
    sums: &[u64],
    block_bytes: &[u64],
    expected: &[u64],
) -> Result<(), ChecksumMismatch> {
    for (block, ((sum, bytes), expected)) in sums.iter().zip(block_bytes).zip(expected).enumerate()
    {
        let got = finish(*sum, *bytes);
        if got != *expected {
            return Err(ChecksumMismatch {
                block,
                got,
                expected: *expected,
            });
        }
    }
    Ok(())
}

impl Drop for StreamVerifyGpu {
    fn drop(&mut self) {
        if let Some(sums) = self.sums.take() {
            self.device.free_arena(sums);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::cuda::checksum_partial_sum;
    use crate::model::demo::{write_linear_stack, DemoSpec};

    #[test]
    fn expected_checksums_are_the_device_checksum_of_each_blocks_file_bytes() {
        // Proves the expected values use the kernel's function over exactly the bytes
        // of each block in the file (its tensors' data, in block order).
        let dir = tempfile::tempdir().unwrap();
        let spec = DemoSpec {
            blocks: 3,
            layers_per_block: 2,
            dim: 8,
            seed: 11,
        };
        let path = write_linear_stack(dir.path(), &spec).unwrap();
        let index = ModelIndex::open(&path, None).unwrap();
        let expected = expected_checksums_cuda(&index).unwrap();
        assert_eq!(expected.len(), 3);
        let file = std::fs::read(&path).unwrap();
        for (block, info) in index.blocks.iter().enumerate() {
            let mut bytes = Vec::new();
            for extent in &info.extents {
                let start = extent.offset as usize;
                bytes.extend_from_slice(&file[start..start + extent.length as usize]);
            }
            assert_eq!(bytes.len() as u64, spec.block_bytes());
            assert_eq!(expected[block], checksum_cpu(&bytes), "block {block}");
        }
        assert_ne!(expected[0], expected[1]);
    }

    #[test]
    fn a_wrong_sum_names_its_block() {
        // Proves the per-step comparison finishes each raw device sum with its block's
        // length and reports the first block that differs.
        let blocks: Vec<Vec<u8>> = vec![vec![1, 2, 3, 4, 5], vec![9; 12]];
        let sums: Vec<u64> = blocks.iter().map(|b| checksum_partial_sum(b, 0)).collect();
        let lengths: Vec<u64> = blocks.iter().map(|b| b.len() as u64).collect();
        let expected: Vec<u64> = blocks.iter().map(|b| checksum_cpu(b)).collect();
        assert_eq!(first_mismatch(&sums, &lengths, &expected), Ok(()));
        let mut corrupted = sums.clone();
        corrupted[1] ^= 1;
        let mismatch = first_mismatch(&corrupted, &lengths, &expected).unwrap_err();
        assert_eq!(mismatch.block, 1);
        assert_eq!(mismatch.expected, expected[1]);
    }
}
