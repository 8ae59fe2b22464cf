//! The settings layers: a TOML file over the defaults and `STAGEHAND_*` variables over
//! it, merged and validated. Any text gives settings or an error naming the key and
//! the layer, never a panic.
//!
//! Input: two bytes of little-endian TOML length, the TOML text, then environment
//! lines `NAME=VALUE` (names get the `STAGEHAND_` prefix when they lack it).
#![no_main]

use std::collections::BTreeMap;

use libfuzzer_sys::fuzz_target;
use stagehand::settings::load_layers;

fuzz_target!(|input: &[u8]| {
    let Some((length, rest)) = input.split_first_chunk::<2>() else {
        return;
    };
    let toml_bytes = usize::from(u16::from_le_bytes(*length)).min(rest.len());
    let (toml, env_text) = rest.split_at(toml_bytes);
    let toml = String::from_utf8_lossy(toml);
    let env_text = String::from_utf8_lossy(env_text);
    let env: BTreeMap<String, String> = env_text
        .lines()
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| {
            let name = if name.to_ascii_uppercase().starts_with("STAGEHAND_") {
                name.to_string()
            } else {
                format!("STAGEHAND_{name}")
            };
            (name, value.to_string())
        })
        .collect();
    if let Ok(loaded) = load_layers(&toml, &env) {
        // Loading is a pure function of the layers: the same input, the same result.
        assert_eq!(load_layers(&toml, &env).ok(), Some(loaded));
    }
});
