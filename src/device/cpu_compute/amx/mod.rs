//! Many-rows products on AMX tiles, for `compute_dtype = "bf16"` on a CPU that has
//! them (Intel Sapphire Rapids and later): `y ← x·Wᵀ·scale (+ bias)` with `x` and `W`
//! rounded to bf16 and every sum kept in f32 — the arithmetic of PyTorch's bf16
//! products, which oneDNN runs on the same tiles.
//!
//! One `tdpbf16ps` multiplies a 16 × 32 bf16 tile by a 32 × 16 one into a 16 × 16
//! f32 accumulator. The kernel keeps four accumulators (32 output features × 32
//! rows), two weight tiles and two activation tiles in the eight tile registers, and
//! runs the whole inner dimension into them before writing them out once:
//!
//! - the **weight** side (the tiles' rows) is 32 output features: a bf16 weight whose
//!   rows fill whole tiles is read in place; any other is a panel rounded (f32, f16)
//!   or widened exactly (FP8, int8, a ragged bf16) to bf16, its row stride padded by
//!   64 bytes so the 16 rows of a tile do not share cache sets;
//! - the **activation** side is `x` rounded to bf16 once per product and packed in
//!   the tiles' pair-interleaved ("VNNI") order: tile `(b, c)` holds rows `16b..16b+16`
//!   and inner values `32c..32c+32`, pair `p` of row `n` at `u32` `16p + n`;
//! - an accumulator holds 16 features × 16 rows, so it is transposed (AVX-512
//!   shuffles) on its way into the row-major `y`, scaled, biased.
//!
//! The feature blocks are shared over the compute threads by shape alone, and each
//! output element is one accumulator's chain of `tdpbf16ps` over the inner dimension
//! in order, so the bits never depend on the thread count: streamed = resident.
//!
//! The Linux kernel hands the tile state to a process only on request
//! (`ARCH_REQ_XCOMP_PERM`); [`available`] asks once and answers false when the CPU
//! or the kernel says no, and the caller then takes the f32 kernels on bf16-rounded
//! inputs (the same arithmetic, another summation order).

use std::sync::{Mutex, OnceLock, PoisonError};

use crate::compute::DType;

use super::gemm::{widen, Gemm};
use super::pool::{share, Pool, SharedOut};

/// Output features per kernel call (two tiles of rows).
const FEATURES: usize = 32;
/// Activation rows per kernel call (two tiles of columns).
const ROWS: usize = 32;
/// Inner values per tile (32 bf16 = 64 bytes, one tile row).
const CHUNK: usize = 32;
/// `u16`s in one packed activation tile (16 pairs × 16 rows × 2).
const TILE_HALVES: usize = 512;
/// Padding of a weight panel's row, in `u16`s (64 bytes).
const ROW_PADDING: usize = 32;

/// Whether this process may run AMX bf16 tiles (asked of the CPU and the kernel once).
pub(super) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    // A lower path forced for tests has no tiles either.
    *AVAILABLE.get_or_init(|| super::simd::Isa::detect() == super::simd::Isa::Avx512 && detect())
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn detect() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // CPUID leaf 7: EDX bit 22 is AMX-BF16, bit 24 AMX-TILE.
    let leaf = std::arch::x86_64::__cpuid_count(7, 0);
    let tiles = leaf.edx & (1 << 22) != 0 && leaf.edx & (1 << 24) != 0;
    let vectors = std::arch::is_x86_feature_detected!("avx512f");
    // SAFETY: `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` takes two integers
    // and only changes which XSAVE state the kernel lets this process use.
    tiles
        && vectors
        && unsafe {
            libc::syscall(
                libc::SYS_arch_prctl,
                ARCH_REQ_XCOMP_PERM,
                XFEATURE_XTILEDATA,
            )
        } == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn detect() -> bool {
    false
}

/// f32 → bf16 bits, rounded to nearest even (the `half` crate's conversion, which
/// the bf16 dtype's narrowing uses too); a NaN stays a quiet NaN.
#[inline(always)]
fn round_bf16(value: f32) -> u16 {
    half::bf16::from_f32(value).to_bits()
}

/// Packed activations past this many bytes are multiplied in slabs of the inner
/// dimension of [`SLAB_BYTES`] (with every row block), so a slab stays in L2 while
/// every feature block reads it: at 265 rows, `down_proj`'s 8192 inner values pack to
/// 4.3 MiB, which otherwise streams from L3 for each block of 32 features.
/// (The unit tests slab products of a few hundred KiB, so their shapes take this path.)
const SLABBED_BYTES: usize = if cfg!(test) { 64 << 10 } else { 2 << 20 };
const SLAB_BYTES: usize = if cfg!(test) { 32 << 10 } else { 1 << 20 };

/// Per-thread buffers: the weight panel (bf16), its f32 widening, and the
/// accumulators kept between slabs (one per feature block and row block).
#[derive(Default)]
pub(super) struct Panel {
    halves: Vec<u16>,
    widened: Vec<f32>,
    sums: Vec<tiles::Accumulators>,
}

impl Panel {
    /// Bytes held (grown to the largest use).
    pub(super) fn bytes(&self) -> usize {
        self.halves.capacity() * 2
            + self.widened.capacity() * 4
            + self.sums.capacity() * std::mem::size_of::<tiles::Accumulators>()
    }
}

/// Chunks of the inner dimension a slab takes (`chunks`: one slab).
fn slab_chunks(product: &Gemm<'_>, chunks: usize, tile_blocks: usize) -> usize {
    let chunk_bytes = tile_blocks * TILE_HALVES * 2;
    let slabbed = product.dtype == DType::Bf16
        && product.inner % CHUNK == 0
        && chunks * chunk_bytes > SLABBED_BYTES;
    match slabbed {
        true => (SLAB_BYTES / chunk_bytes).clamp(1, chunks),
        false => chunks,
    }
}

/// `y ← x·Wᵀ·scale (+ bias)` on AMX tiles. [`available`] must have said yes.
/// `panels` holds one buffer per pool thread; `packed` takes the packed activations.
pub(super) fn gemm(
    pool: &Pool,
    panels: &[Mutex<Panel>],
    packed: &mut Vec<u16>,
    product: &Gemm<'_>,
    y: &mut [f32],
) {
    assert!(available(), "AMX tiles are available");
    product.assert_shapes(y);
    assert!(panels.len() >= pool.threads());
    assert!(
        product.dtype != DType::U4,
        "grouped weights take their own path"
    );
    let chunks = product.inner.div_ceil(CHUNK);
    let row_blocks = product.rows.div_ceil(ROWS);
    let packed = pack_rows(pool, product, chunks, packed);
    let slab = slab_chunks(product, chunks, row_blocks * (ROWS / 16));
    let blocks = product.out.div_ceil(FEATURES);
    let threads = pool.threads().min(blocks);
    let output = SharedOut::new(y);
    pool.run(&|index| {
        if index >= threads {
            return;
        }
        let mut guard = panels[index].lock().unwrap_or_else(PoisonError::into_inner);
        let Panel {
            halves,
            widened,
            sums,
        } = &mut *guard;
        let (first, end) = share(blocks, threads, index, 1);
        // One accumulator per (block, row block) when there are slabs to carry them
        // across; one in all otherwise. Their contents never matter before a use (a
        // first slab starts from zero tiles).
        let slabbed = slab < chunks;
        let needed = if slabbed {
            (end - first) * row_blocks
        } else {
            1
        };
        if sums.len() < needed {
            sums.resize_with(needed, Default::default);
        }
        // SAFETY: the tiles were granted (`available`); the configuration is a valid
        // palette-1 layout of eight 16 × 64-byte tiles.
        unsafe { tiles::configure() };
        // Slabs of the inner dimension in order, each over every block: an output's
        // chain of products runs through the slabs in order, its accumulator kept in
        // `sums` between them (f32, as in the tile), so the bits are the one-slab bits.
        for slab_start in (0..chunks).step_by(slab) {
            let slab = (slab_start, slab.min(chunks - slab_start));
            for block in first..end {
                let feature = block * FEATURES;
                let panel = match in_place(product, feature) {
                    Some(rows) => rows,
                    None => {
                        let (offset, stride) =
                            fill_panel(product, feature, chunks, (halves, widened));
                        (&halves[offset..], stride)
                    }
                };
                for row_block in 0..row_blocks {
                    let at = if slabbed {
                        (block - first) * row_blocks + row_block
                    } else {
                        0
                    };
                    let sums = &mut sums[at];
                    // SAFETY: block `block` owns output columns `feature..feature + 32`
                    // (those below `out`), written by this thread alone; the panel
                    // holds 32 rows of `chunks` tiles at `stride`, `packed` every row
                    // block.
                    unsafe {
                        one_block(
                            product,
                            (panel, packed),
                            (feature, row_block * ROWS),
                            (chunks, slab),
                            sums,
                            output,
                        )
                    };
                }
            }
        }
        // SAFETY: tiles configured above; releasing them returns the state to init.
        unsafe { tiles::release() };
    });
}

/// `x` rounded to bf16 in the tiles' order (zero past its rows and inner values),
/// row blocks shared over the threads. Returns the 64-byte aligned tiles.
fn pack_rows<'p>(
    pool: &Pool,
    product: &Gemm<'_>,
    chunks: usize,
    packed: &'p mut Vec<u16>,
) -> &'p [u16] {
    let tile_blocks = product.rows.div_ceil(ROWS) * (ROWS / 16);
    let halves = tile_blocks * chunks * TILE_HALVES;
    // Every value is written below; only the padding (rows past `rows`, values past
    // `inner`) is zeroed, tile by tile, so the buffer is not cleared as a whole.
    packed.resize(halves + ROW_PADDING, 0);
    let offset = packed.as_ptr().align_offset(64).min(ROW_PADDING);
    let tiles = &mut packed[offset..offset + halves];
    let pointer = SendPointer(tiles.as_mut_ptr());
    let threads = pool.threads().min(tile_blocks);
    let inner = product.inner;
    pool.run(&|index| {
        if index >= threads {
            return;
        }
        let (first, end) = share(tile_blocks, threads, index, 1);
        // The whole wrapper, not its field (a closure would capture the raw pointer).
        let base = pointer;
        for tile_block in first..end {
            let block_start = tile_block * chunks * TILE_HALVES;
            let padded_rows = (tile_block + 1) * 16 > product.rows;
            let zeroed = match (padded_rows, inner % CHUNK) {
                (true, _) => Some(block_start..block_start + chunks * TILE_HALVES),
                (false, 0) => None,
                (false, _) => Some(
                    block_start + (chunks - 1) * TILE_HALVES..block_start + chunks * TILE_HALVES,
                ),
            };
            if let Some(range) = zeroed {
                // SAFETY: tile block `tile_block`'s tiles, this thread's alone.
                unsafe {
                    std::ptr::write_bytes(base.0.add(range.start), 0, range.len());
                }
            }
            for n in 0..16 {
                let row = tile_block * 16 + n;
                if row >= product.rows {
                    break;
                }
                let values = &product.x[row * inner..(row + 1) * inner];
                for (chunk, values) in values.chunks(CHUNK).enumerate() {
                    let tile = block_start + chunk * TILE_HALVES + n * 2;
                    // SAFETY: `tile` and the 16 pairs at a 32-`u16` stride from it lie
                    // in tile block `tile_block`'s tiles, which only this thread writes
                    // (the blocks are shared disjointly).
                    unsafe { pack_chunk(values, base.0.add(tile)) };
                }
            }
        }
    });
    &packed[offset..offset + halves]
}

/// One row's (up to) 32 values of one chunk, rounded, as 16 pairs at a stride of one
/// tile row (32 `u16`s) from `target`.
///
/// # Safety
/// `target + 32p`, `target + 32p + 1` are writable for every pair `p` of `values`.
#[inline(always)]
unsafe fn pack_chunk(values: &[f32], target: *mut u16) {
    if let Ok(values) = <&[f32; CHUNK]>::try_from(values) {
        let mut rounded = [0u16; CHUNK];
        for (half, &value) in rounded.iter_mut().zip(values) {
            *half = round_bf16(value);
        }
        for pair in 0..CHUNK / 2 {
            let word = u32::from(rounded[2 * pair]) | (u32::from(rounded[2 * pair + 1]) << 16);
            // SAFETY: the caller's contract; a pair is 4 bytes at an even `u16` offset.
            unsafe { target.add(pair * 32).cast::<u32>().write_unaligned(word) };
        }
        return;
    }
    for (within, &value) in values.iter().enumerate() {
        // SAFETY: the caller's contract.
        unsafe { *target.add((within / 2) * 32 + within % 2) = round_bf16(value) };
    }
}

#[derive(Clone, Copy)]
struct SendPointer(*mut u16);
// SAFETY: the parts of a job write disjoint tile blocks through it; the buffer
// outlives the job.
unsafe impl Send for SendPointer {}
unsafe impl Sync for SendPointer {}

/// A bf16 weight whose 32 rows from `feature` are whole tiles read in place (no
/// panel copy): its rows and inner values fill whole tiles. Their `u16`s and stride.
fn in_place<'w>(product: &Gemm<'w>, feature: usize) -> Option<(&'w [u16], usize)> {
    let whole = product.dtype == DType::Bf16
        && product.inner % CHUNK == 0
        && feature + FEATURES <= product.out;
    if !whole {
        return None;
    }
    let start = feature * product.inner * 2;
    let bytes = &product.weight[start..start + FEATURES * product.inner * 2];
    // SAFETY: every bit pattern is a valid u16; `align_to` yields the aligned middle,
    // used only when it is the whole range (a 2-aligned weight, as checkpoints are).
    let (head, halves, tail) = unsafe { bytes.align_to::<u16>() };
    (head.is_empty() && tail.is_empty()).then_some((halves, product.inner))
}

/// Fills the panel with features `feature..feature + 32` of the weight in bf16 (rows
/// past `out` and values past `inner` zero). Returns the panel's 64-byte aligned
/// start and its row stride, in `u16`s.
fn fill_panel(
    product: &Gemm<'_>,
    feature: usize,
    chunks: usize,
    (halves, widened): (&mut Vec<u16>, &mut Vec<f32>),
) -> (usize, usize) {
    let stride = chunks * CHUNK + ROW_PADDING;
    let needed = FEATURES * stride + ROW_PADDING;
    if halves.len() != needed {
        halves.clear();
        halves.resize(needed, 0);
    }
    let offset = halves.as_ptr().align_offset(64).min(ROW_PADDING);
    let element = product.dtype.size_bytes();
    let inner = product.inner;
    let features = FEATURES.min(product.out - feature);
    for row in 0..FEATURES {
        let target = &mut halves[offset + row * stride..offset + (row + 1) * stride];
        if row >= features {
            target.fill(0);
            continue;
        }
        let (values, padding) = target.split_at_mut(inner);
        padding.fill(0);
        let start = (feature + row) * inner * element;
        let stored = &product.weight[start..start + inner * element];
        if product.dtype == DType::Bf16 {
            for (half, bytes) in values.iter_mut().zip(stored.chunks_exact(2)) {
                *half = u16::from_le_bytes([bytes[0], bytes[1]]);
            }
        } else {
            widened.clear();
            widened.resize(inner, 0.0);
            widen(product.dtype, stored, widened);
            for (half, &value) in values.iter_mut().zip(widened.iter()) {
                *half = round_bf16(value);
            }
        }
    }
    (offset, stride)
}

/// One kernel call: features `feature..feature + 32` × rows `row..row + 32`.
///
/// # Safety
/// The tiles are configured on this thread; `panel` holds 32 rows of `chunks` tiles at
/// `stride`, `packed` the row blocks of `product`; no other thread writes these
/// output columns.
unsafe fn one_block(
    product: &Gemm<'_>,
    ((panel, stride), packed): ((&[u16], usize), &[u16]),
    (feature, row): (usize, usize),
    (chunks, (slab_start, slab_chunks)): (usize, (usize, usize)),
    sums: &mut tiles::Accumulators,
    output: SharedOut,
) {
    assert!(panel.len() >= FEATURES * stride && slab_start + slab_chunks <= chunks);
    let first_tile = ((row / 16) * chunks + slab_start) * TILE_HALVES;
    assert!(packed.len() >= first_tile + (chunks + slab_chunks) * TILE_HALVES);
    // SAFETY: bounds asserted above (the second row block's tiles start `chunks`
    // tiles after the first's); tiles configured (the caller's contract).
    unsafe {
        tiles::multiply(
            panel.as_ptr().add(slab_start * CHUNK),
            stride * 2,
            (packed.as_ptr().add(first_tile), chunks),
            (slab_chunks, slab_start > 0),
            sums,
        )
    };
    if slab_start + slab_chunks < chunks {
        return;
    }
    let (out, rows) = (product.out, product.rows);
    let scale = product.scale.unwrap_or(1.0);
    for (tile, (feature_offset, row_offset)) in
        [(0, 0), (0, 16), (16, 0), (16, 16)].into_iter().enumerate()
    {
        let first_feature = feature + feature_offset;
        if first_feature >= out {
            continue;
        }
        let features = 16.min(out - first_feature);
        let first_row = row + row_offset;
        let valid_rows = 16.min(rows.saturating_sub(first_row));
        let bias = product
            .bias
            .map(|bias| &bias[first_feature..first_feature + features]);
        // SAFETY: rows `first_row..first_row + valid_rows`, columns
        // `first_feature..first_feature + features` lie inside y and are this
        // thread's (the caller's contract).
        unsafe {
            let target = output.pointer().add(first_row * out + first_feature);
            tiles::store_transposed(
                &sums.0[tile * 256..tile * 256 + 256],
                (target, out),
                (valid_rows, features),
                scale,
                bias,
            );
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod tiles;

#[cfg(not(target_arch = "x86_64"))]
#[path = "no_tiles.rs"]
mod tiles;
