//! The stream-verify checksum, on the CPU and as an NVRTC kernel, so the bytes that
//! reached VRAM are checked on the device against the file.
//!
//! Definition (both sides): split the bytes into little-endian 32-bit words, the last
//! one zero-padded; sum `mix64(index · φ ⊕ word)` over all words modulo 2^64; the
//! checksum is `mix64(sum ⊕ length)`. A sum parallelises on the GPU with one atomic
//! add per warp and is independent of the order the threads finish in; `mix64`
//! (splitmix64's finaliser) is a bijection, so any single changed word changes its
//! term and the sum, and the index in each term catches moved words.

use std::sync::Arc;

use cudarc::driver::{CudaFunction, LaunchConfig, PushKernelArg};
use stagehand_actors::DevicePtr;

use super::device::CudaDevice;
use super::error::CudaError;

const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

pub fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn word_term(index: u64, word: u32) -> u64 {
    mix64(index.wrapping_mul(GOLDEN_GAMMA) ^ u64::from(word))
}

/// The sum of word terms of `bytes`, whose first word has index `first_word`. Lets the
/// CPU side fold a tensor in pieces (pieces must start on 4-byte boundaries).
pub fn partial_sum(bytes: &[u8], first_word: u64) -> u64 {
    let mut sum = 0u64;
    let mut words = bytes.chunks_exact(4);
    let mut index = first_word;
    for word in &mut words {
        let word = u32::from_le_bytes([word[0], word[1], word[2], word[3]]);
        sum = sum.wrapping_add(word_term(index, word));
        index += 1;
    }
    let tail = words.remainder();
    if !tail.is_empty() {
        let mut padded = [0u8; 4];
        padded[..tail.len()].copy_from_slice(tail);
        sum = sum.wrapping_add(word_term(index, u32::from_le_bytes(padded)));
    }
    sum
}

/// Finishes a sum of word terms over `length_bytes` bytes into the checksum.
pub fn finish(sum: u64, length_bytes: u64) -> u64 {
    mix64(sum ^ length_bytes)
}

/// The checksum of `bytes`, computed on the CPU.
pub fn checksum_cpu(bytes: &[u8]) -> u64 {
    finish(partial_sum(bytes, 0), bytes.len() as u64)
}

const KERNEL_NAME: &str = "stagehand_checksum";

/// The same definition in CUDA C. Aligned full words are loaded as one u32; the rest
/// byte by byte, so any device address and length work.
pub const KERNEL_SOURCE: &str = r#"
typedef unsigned long long u64;
typedef unsigned int u32;

__device__ __forceinline__ u64 mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

extern "C" __global__ void stagehand_checksum(const unsigned char* data, u64 length, u64* sum_out) {
    const u64 words = (length + 3) / 4;
    const u64 stride = (u64)gridDim.x * blockDim.x;
    const bool aligned = (((u64)data) & 3) == 0;
    u64 sum = 0;
    for (u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x; i < words; i += stride) {
        const u64 start = i * 4;
        u32 word = 0;
        if (aligned && start + 4 <= length) {
            word = ((const u32*)data)[i];
        } else {
            for (u64 b = 0; b < 4 && start + b < length; ++b) {
                word |= ((u32)data[start + b]) << (8 * b);
            }
        }
        sum += mix64((i * 0x9e3779b97f4a7c15ULL) ^ (u64)word);
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
        sum += __shfl_down_sync(0xffffffffu, sum, offset);
    }
    if ((threadIdx.x & 31) == 0) {
        atomicAdd(sum_out, sum);
    }
}
"#;

/// Threads per block (a multiple of the warp size: the reduction assumes full warps).
const BLOCK_THREADS: u32 = 256;
/// Upper bound on blocks: enough to fill any current GPU; the loop strides past it.
const GRID_BLOCKS_MAX: u64 = 4096;

/// The compiled checksum kernel, launched on the device's compute stream.
pub struct ChecksumKernel {
    function: CudaFunction,
    device_stream: Arc<cudarc::driver::CudaStream>,
}

impl ChecksumKernel {
    /// Compiles the kernel with NVRTC (checked present first) and loads it.
    pub fn new(device: &CudaDevice) -> Result<Self, CudaError> {
        let function = super::kernel::compile(device, KERNEL_SOURCE, KERNEL_NAME)?;
        Ok(Self {
            function,
            device_stream: device.compute_stream().clone(),
        })
    }

    /// Queues the sum of word terms of `length_bytes` bytes at `data`, added into the
    /// device u64 at `sum_out` (which the caller zeroed), after everything already on
    /// the compute stream. Nothing waits: read `sum_out` back after the stream passes
    /// and finish it with [`finish`]. Lets a run checksum every block of a step and
    /// read all sums back once.
    pub fn queue_sum(
        &self,
        data: DevicePtr,
        length_bytes: u64,
        sum_out: DevicePtr,
    ) -> Result<(), CudaError> {
        if (length_bytes > 0 && data.0 == 0) || sum_out.0 == 0 {
            return Err(CudaError::InvalidArgument(
                "checksum of or into a null device pointer".to_string(),
            ));
        }
        let words = length_bytes.div_ceil(4);
        let blocks = words
            .div_ceil(u64::from(BLOCK_THREADS))
            .clamp(1, GRID_BLOCKS_MAX) as u32;
        let config = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (address, sum_address) = (data.0, sum_out.0);
        let mut launch = self.device_stream.launch_builder(&self.function);
        launch.arg(&address).arg(&length_bytes).arg(&sum_address);
        // SAFETY: the kernel's parameters are (pointer, u64, pointer) and we pass three
        // u64 values; the caller names a device range of `length_bytes` and an 8-byte
        // aligned u64 it allocated, both alive until the compute stream passes.
        unsafe { launch.launch(config) }.map_err(CudaError::driver("cuLaunchKernel"))?;
        Ok(())
    }

    /// Checksums `length_bytes` bytes of device memory at `data`, after everything
    /// already queued on the compute stream, and waits for the answer.
    pub fn checksum(&self, data: DevicePtr, length_bytes: u64) -> Result<u64, CudaError> {
        if length_bytes > 0 && data.0 == 0 {
            return Err(CudaError::InvalidArgument(
                "checksum of a null device pointer".to_string(),
            ));
        }
        let stream = &self.device_stream;
        let mut sum = stream
            .alloc_zeros::<u64>(1)
            .map_err(CudaError::driver("cuMemAlloc"))?;
        let words = length_bytes.div_ceil(4);
        let blocks = words
            .div_ceil(u64::from(BLOCK_THREADS))
            .clamp(1, GRID_BLOCKS_MAX) as u32;
        let config = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (BLOCK_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let address = data.0;
        let mut launch = stream.launch_builder(&self.function);
        launch.arg(&address).arg(&length_bytes).arg(&mut sum);
        // SAFETY: the kernel's parameters are (pointer, u64, pointer) and we pass two
        // u64 values and a device slice of one u64, in that order; the caller names a
        // device range of `length_bytes` it allocated and keeps alive until this returns.
        unsafe { launch.launch(config) }.map_err(CudaError::driver("cuLaunchKernel"))?;
        let sum = stream
            .clone_dtoh(&sum)
            .map_err(CudaError::driver("cuMemcpyDtoH"))?;
        let sum = sum.first().copied().unwrap_or(0);
        Ok(finish(sum, length_bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn any_single_changed_byte_changes_the_checksum() {
        // Proves a flip of one bit anywhere, including a ragged tail, is detected.
        let bytes: Vec<u8> = (0..1031u32).map(|i| (i * 7 + 3) as u8).collect();
        let original = checksum_cpu(&bytes);
        for position in (0..bytes.len()).step_by(13).chain([bytes.len() - 1]) {
            let mut changed = bytes.clone();
            changed[position] ^= 0x10;
            assert_ne!(checksum_cpu(&changed), original, "byte {position}");
        }
    }

    #[test]
    fn swapped_words_and_lengths_change_the_checksum() {
        // Proves the checksum depends on where each word is and on the length, so moved
        // words and zero padding cannot pass for the original.
        let bytes: Vec<u8> = (0..64u8).collect();
        let mut swapped = bytes.clone();
        swapped[0..4].copy_from_slice(&bytes[4..8]);
        swapped[4..8].copy_from_slice(&bytes[0..4]);
        assert_ne!(checksum_cpu(&swapped), checksum_cpu(&bytes));
        let mut padded = bytes.clone();
        padded.push(0);
        assert_ne!(checksum_cpu(&padded), checksum_cpu(&bytes));
        assert_ne!(checksum_cpu(&[]), checksum_cpu(&[0]));
    }

    #[test]
    fn partial_sums_over_word_aligned_pieces_add_up() {
        // Proves a tensor checksummed in pieces (as it streams) equals one pass.
        let bytes: Vec<u8> = (0..4099u32).map(|i| (i * 31 % 251) as u8).collect();
        let (head, tail) = bytes.split_at(2048);
        let sum = partial_sum(head, 0).wrapping_add(partial_sum(tail, 512));
        assert_eq!(finish(sum, bytes.len() as u64), checksum_cpu(&bytes));
    }

    #[test]
    fn the_kernel_source_uses_the_same_constants() {
        // Proves the CUDA source and the Rust side share the definition's constants.
        for constant in [
            "0x9e3779b97f4a7c15",
            "0xbf58476d1ce4e5b9",
            "0x94d049bb133111eb",
        ] {
            assert!(KERNEL_SOURCE.contains(constant), "{constant}");
        }
        assert!(KERNEL_SOURCE.contains(KERNEL_NAME));
        assert_eq!(BLOCK_THREADS % 32, 0);
    }
}
