//! The sharded index JSON (`*.safetensors.index.json`): any bytes give the shards and
//! tensor placement or an error; an accepted index never names a shard outside its
//! folder.
#![no_main]

use std::path::{Component, Path};

use libfuzzer_sys::fuzz_target;
use stagehand::model::parse_index;

fuzz_target!(|bytes: &[u8]| {
    let Ok(parsed) = parse_index(Path::new("model.safetensors.index.json"), bytes) else {
        return;
    };
    for name in &parsed.shard_names {
        assert!(Path::new(name)
            .components()
            .all(|component| matches!(component, Component::Normal(_))));
    }
    for &shard in parsed.expected.values() {
        assert!(shard < parsed.shard_names.len());
    }
});
