//! The safetensors header and the block index built from it: any file image must give
//! an index or an error naming the file, never a panic, a hang or an allocation the
//! file's own size does not justify.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use stagehand::model::ModelIndex;

fuzz_target!(|image: &[u8]| {
    let Ok(index) = ModelIndex::from_image(Path::new("fuzz.safetensors"), image, None) else {
        return;
    };
    // Whatever was accepted must be self-consistent: blocks tile the tensors, extents
    // stay inside the file.
    let layout = index.layout();
    let file_bytes = image.len() as u64;
    let mut tensor_bytes = 0u64;
    for tensor in &index.tensors {
        assert!(tensor.offset + tensor.bytes <= file_bytes);
        tensor_bytes += tensor.bytes;
    }
    assert_eq!(index.total_bytes(), tensor_bytes);
    for block in &layout.blocks {
        for extent in &block.extents {
            assert!(extent.offset + extent.length <= file_bytes);
        }
    }
    let _ = index.largest_block();
});
