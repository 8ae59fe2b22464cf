//! The feature cache of one video's decode (diffusers' `_feat_map`): the decoder runs
//! one latent frame (a chunk) at a time, and each causal 3-D convolution sees the
//! last two frames of its own input from the chunks before, so the chunks together
//! compute the convolution over the whole video, zero-padded by two frames at its
//! start. The cache holds, per causal convolution in the order a chunk reaches them,
//! those last (at most) two input frames; fewer than two stand for zeros.
//!
//! It lives exactly as long as one video's decode: made at its first chunk, dropped
//! after its last or when a chunk fails (it is owned by the family's state, which
//! never keeps one across a failure), so nothing of a failed decode stays held.

use crate::compute::Compute;
use crate::families::blocks::Blocks;
use crate::families::FamilyError;

/// A causal convolution's temporal padding in diffusers (`CACHE_T`): frames of its
/// input a chunk carries to the next.
pub const CACHE_FRAMES: usize = 2;

/// The cache of one decode, over the compute's tensors `T` (one frame each,
/// channels-last).
pub struct FeatureCache<T> {
    /// Per causal convolution, in call order: the last ≤ 2 frames of its input.
    entries: Vec<Vec<T>>,
    /// The convolution the current chunk reaches next.
    next: usize,
    /// The chunk being decoded (0: the first, whose temporal upsamplings keep its
    /// one frame).
    chunk: usize,
    /// Causal convolutions of a chunk: the bound on `entries`.
    convolutions: usize,
}

impl<T> FeatureCache<T> {
    /// An empty cache for a decoder of `convolutions` causal convolutions.
    pub fn new(convolutions: usize) -> Self {
        Self {
            entries: Vec::with_capacity(convolutions),
            next: 0,
            chunk: 0,
            convolutions,
        }
    }

    /// Whether the chunk being decoded is the video's first.
    pub fn first_chunk(&self) -> bool {
        self.chunk == 0
    }

    /// Ends a chunk: the next starts again at the first convolution.
    pub fn end_chunk(&mut self) -> Result<(), FamilyError> {
        if self.next != self.convolutions {
            return Err(FamilyError::internal(format!(
                "a WAN VAE chunk reached {} of its {} causal convolutions",
                self.next, self.convolutions
            )));
        }
        self.next = 0;
        self.chunk += 1;
        Ok(())
    }

    /// The entry of the next causal convolution of this chunk.
    pub fn next_entry(&mut self) -> Result<&mut Vec<T>, FamilyError> {
        let at = self.next;
        if at >= self.convolutions {
            return Err(FamilyError::internal(format!(
                "a WAN VAE chunk asked for causal convolution {} of {}",
                at + 1,
                self.convolutions
            )));
        }
        if self.entries.len() == at {
            self.entries.push(Vec::with_capacity(CACHE_FRAMES + 1));
        }
        self.next += 1;
        Ok(&mut self.entries[at])
    }
}

/// What a WAN VAE run (decoder or encoder) carries from step to step: whether its
/// working set is reserved, and the feature cache of the video under way — made at
/// its first chunk, kept while its chunks succeed, dropped after its last or as soon
/// as one fails (a chunk takes it out and only a chunk that succeeded puts it back).
pub struct ChunkState<T> {
    reserved: bool,
    pub(super) cache: Option<FeatureCache<T>>,
}

impl<T> ChunkState<T> {
    pub fn new() -> Self {
        Self {
            reserved: false,
            cache: None,
        }
    }

    /// Reserves the run's working set through the activation path, once.
    pub fn reserve_once<C: Compute<Tensor = T>, B: Blocks<C>>(
        &mut self,
        blocks: &mut B,
        bytes: u64,
    ) -> Result<(), FamilyError> {
        if !self.reserved {
            blocks.reserve_activations(bytes)?;
            self.reserved = true;
        }
        Ok(())
    }

    /// The cache chunk `chunk` continues: a new one of `convolutions` at a video's
    /// first chunk, else the one the chunk before left (`missing` says why there is
    /// none: that chunk failed, or never ran).
    pub fn take(
        &mut self,
        chunk: usize,
        convolutions: usize,
        missing: impl FnOnce() -> String,
    ) -> Result<FeatureCache<T>, FamilyError> {
        if chunk == 0 {
            self.cache = Some(FeatureCache::new(convolutions));
        }
        self.cache
            .take()
            .ok_or_else(|| FamilyError::internal(missing()))
    }

    /// Puts a chunk's cache back for the next, unless it was the video's last.
    pub fn keep(&mut self, cache: FeatureCache<T>, last: bool) {
        if !last {
            self.cache = Some(cache);
        }
    }
}

impl<T> Default for ChunkState<T> {
    fn default() -> Self {
        Self::new()
    }
}

/// Appends a chunk's input `frames` to a convolution's `cached` frames and keeps the
/// last [`CACHE_FRAMES`]: what the next chunk's convolution pads with.
pub fn advance<T>(cached: &mut Vec<T>, frames: Vec<T>) {
    cached.extend(frames);
    let older = cached.len().saturating_sub(CACHE_FRAMES);
    cached.drain(..older);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_convolution_keeps_the_last_two_frames_of_its_input() {
        // Proves the cache's rule: one frame after the first chunk, then always the
        // last two of the stream, and that a chunk must reach every convolution.
        let mut cache = FeatureCache::new(1);
        let entry = cache.next_entry().expect("an entry");
        advance(entry, vec![0]);
        assert_eq!(*entry, [0]);
        cache.end_chunk().expect("ends");
        assert!(!cache.first_chunk());
        let entry = cache.next_entry().expect("an entry");
        advance(entry, vec![1, 2]);
        assert_eq!(*entry, [1, 2]);
        assert!(cache.next_entry().is_err(), "one convolution only");
        let mut short = FeatureCache::<u8>::new(2);
        short.next_entry().expect("an entry");
        assert!(short.end_chunk().is_err());
    }
}
