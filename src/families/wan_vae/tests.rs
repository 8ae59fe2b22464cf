//! The decode's life over a recording compute (no adapter, no files read): every
//! stage's shapes check chunk after chunk, a failed chunk gives back every block it
//! held and drops its video's feature cache, and the next video starts afresh.

use std::path::Path;

use stagehand_actors::BlockId;

use super::{VideoLatentInput, WanVaeConfig, WanVaeDecoder};
use crate::compute::record::{RecordedBlock, Recorder};
use crate::families::blocks::{Blocks, Held};
use crate::families::family::{Facts, Family};
use crate::families::lora_set::LoraSet;
use crate::families::FamilyError;
use crate::model::{read_json, ModelIndex};

/// Blocks of the layout's sizes that count what is held, and fail the acquire after
/// `acquires_left` of them (a read that failed).
struct Counting {
    bytes: Vec<u64>,
    held: usize,
    acquires_left: usize,
}

impl Blocks<Recorder> for Counting {
    fn acquire(
        &mut self,
        _compute: &Recorder,
        block: BlockId,
    ) -> Result<Held<RecordedBlock>, FamilyError> {
        if self.acquires_left == 0 {
            return Err(FamilyError::internal(
                "injected: the block's read failed".into(),
            ));
        }
        self.acquires_left -= 1;
        self.held += 1;
        let bytes = self.bytes[block.index()];
        Ok(Held::of_loaded(block, RecordedBlock { bytes }))
    }

    fn release(
        &mut self,
        _compute: &Recorder,
        _held: Held<RecordedBlock>,
    ) -> Result<(), FamilyError> {
        self.held -= 1;
        Ok(())
    }

    fn lora(&self) -> Option<&LoraSet> {
        None
    }
}

/// The fixture's tiny decoder over two videos of 3 latent frames of 4 × 4.
fn decoder() -> WanVaeDecoder {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/wan_vae/vae");
    let index = ModelIndex::open(&folder, None).expect("indexes the fixture");
    let path = folder.join("config.json");
    let json = read_json(&path).expect("reads config.json");
    let config = WanVaeConfig::from_json(&path, &json).expect("a Wan 2.1 config");
    let input = VideoLatentInput {
        latents: vec![vec![0.5; 16 * 3 * 4 * 4]; 2],
        frames: 3,
        height: 4,
        width: 4,
        tile: None,
    };
    WanVaeDecoder::new(&index, config, input).expect("opens")
}

#[test]
fn a_failed_chunk_gives_back_its_blocks_and_drops_the_decode() {
    // Proves a chunk's stages fit each other's shapes (1, then 4, frames of 32²), a
    // failure in the second chunk leaves no block held and no feature cache, the
    // video's next chunk is refused by name, and the next video decodes.
    let decoder = decoder();
    let compute = Recorder::new();
    let layout = decoder.layout();
    let mut blocks = Counting {
        bytes: layout.blocks.iter().map(|block| block.bytes).collect(),
        held: 0,
        acquires_left: usize::MAX,
    };
    let mut state = decoder.start(&compute).expect("starts");
    let first = decoder
        .step(&compute, &mut state, &mut blocks, 0)
        .expect("chunk 0");
    assert_eq!(first.output.map(|frames| frames.len()), Some(3 * 32 * 32));
    assert!(state.cache.is_some(), "the video's decode goes on");

    blocks.acquires_left = 3;
    let failed = decoder.step(&compute, &mut state, &mut blocks, 1);
    assert!(failed.is_err(), "the injected read fails the chunk");
    assert_eq!(blocks.held, 0, "a block left held");
    assert!(
        state.cache.is_none(),
        "the failed decode's cache outlived it"
    );

    blocks.acquires_left = usize::MAX;
    let refused = decoder
        .step(&compute, &mut state, &mut blocks, 2)
        .err()
        .map(|error| error.to_string());
    assert!(refused.is_some_and(|message| message.contains("no decode to continue")));

    for step in 3..6 {
        let chunk = decoder
            .step(&compute, &mut state, &mut blocks, step)
            .expect("decodes");
        let frames = if step == 3 { 1 } else { 4 };
        assert_eq!(
            chunk.output.map(|values| values.len()),
            Some(3 * frames * 32 * 32)
        );
    }
    assert!(state.cache.is_none(), "a finished video keeps its cache");
    assert_eq!(blocks.held, 0);
}
