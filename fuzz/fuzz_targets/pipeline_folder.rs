//! A diffusers pipeline folder's JSON: `model_index.json` as Flux and Wan recognise
//! it (`pipeline::FluxParts::folder`, `WanParts::is_pipeline`, `WanParts::folder`),
//! the transformer's `config.json` (its channels) and the Wan scheduler's
//! `scheduler_config.json` (`families::wan::scheduler::read_unipc`). Any bytes give
//! the parts or an error naming the file, never a panic. (Flux reads no scheduler
//! file: its sampler is fixed in code.)
//!
//! Input: `model_index.json`, a NUL byte, the transformer's `config.json`, a NUL
//! byte, `scheduler_config.json` (JSON text holds no NUL; a missing piece is empty).
#![no_main]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use stagehand::families::wan::scheduler::read_unipc;
use stagehand::pipeline::{FluxParts, WanParts};

/// Every part a Flux or Wan folder lists, each with an (empty) `config.json`; the
/// files the input fills are written over on each run.
fn folder() -> &'static Path {
    static FOLDER: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &FOLDER
        .get_or_init(|| {
            let dir = tempfile::tempdir().expect("a temporary folder");
            let parts = [
                "text_encoder",
                "text_encoder_2",
                "transformer",
                "transformer_2",
                "vae",
                "scheduler",
            ];
            for part in parts {
                let path = dir.path().join(part);
                std::fs::create_dir_all(&path).expect("a part's folder");
                std::fs::write(path.join("config.json"), "{}").expect("its config");
            }
            let path = dir.path().to_path_buf();
            (dir, path)
        })
        .1
}

fuzz_target!(|input: &[u8]| {
    let mut pieces = input.splitn(3, |&byte| byte == 0);
    let mut next = || pieces.next().unwrap_or_default();
    let (index, transformer, scheduler) = (next(), next(), next());
    let dir = folder();
    let scheduler_path = dir.join("scheduler").join("scheduler_config.json");
    std::fs::write(dir.join("model_index.json"), index).expect("written");
    std::fs::write(dir.join("transformer").join("config.json"), transformer).expect("written");
    std::fs::write(&scheduler_path, scheduler).expect("written");
    let _ = FluxParts::folder(dir);
    if WanParts::is_pipeline(dir) {
        if let Ok(parts) = WanParts::folder(dir) {
            assert!(parts.latent_channels > 0);
            assert!(parts
                .boundary_ratio
                .is_none_or(|ratio| (0.0..=1.0).contains(&ratio)));
        }
    }
    if let Ok(config) = read_unipc(&scheduler_path) {
        assert!(config.train_timesteps >= 1);
        assert!((1..=4).contains(&config.solver_order));
    }
});
