//! Shared helpers of the LoRA tests: the small demo model with demo adapters, a CPU
//! session over it, and hand-written adapter files.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use stagehand::actors::{BlockId, NoObserver, ResidencyPolicy, Session, SessionConfig};
use stagehand::device::CpuDevice;
use stagehand::lora::{write_demo_lora, DemoLora, LoraNaming};
use stagehand::model::ModelIndex;
use stagehand::run::driver::DriverOptions;
use stagehand::storage::{open_storage, StorageFile, StorageOptions};

use super::demo::{small_demo_model, small_demo_spec};

/// The small demo model in a fresh directory, and its index.
pub fn setup() -> (tempfile::TempDir, PathBuf, ModelIndex) {
    let dir = tempfile::tempdir().unwrap();
    let model = small_demo_model(dir.path());
    let index = ModelIndex::open(&model, None).unwrap();
    (dir, model, index)
}

/// A demo adapter for the small demo model, written as `dir/name`.
pub fn lora_file(dir: &Path, name: &str, lora: &DemoLora) -> PathBuf {
    let path = dir.join(name);
    write_demo_lora(&path, &small_demo_spec(), lora).unwrap();
    path
}

/// A PEFT adapter `p.safetensors` (the demo default) and a kohya one `k.safetensors`
/// with `kohya`'s factors, in `dir`.
pub fn peft_and_kohya(dir: &Path, kohya: DemoLora) -> (PathBuf, PathBuf) {
    let peft = lora_file(dir, "p.safetensors", &DemoLora::default());
    let kohya = lora_file(
        dir,
        "k.safetensors",
        &DemoLora {
            naming: LoraNaming::Kohya,
            ..kohya
        },
    );
    (peft, kohya)
}

/// A session over the small demo model on the CPU device: pin ceiling 3 MiB, prefetch
/// depth 1, planned residency.
pub fn session(index: &ModelIndex, vram_budget_bytes: u64) -> Session {
    let layout = index.layout();
    let settings = stagehand::settings::Settings::default();
    let files: Vec<StorageFile> = index
        .files
        .iter()
        .map(|file| StorageFile {
            path: file.path.clone(),
            expected_bytes: file.bytes,
        })
        .collect();
    let storage = open_storage(&files, &StorageOptions::from_settings(&settings), false).unwrap();
    let device = Arc::new(CpuDevice::new(vram_budget_bytes).unwrap());
    let order: Vec<BlockId> = (0..layout.len() as u32).map(BlockId).collect();
    Session::start(
        SessionConfig {
            vram_budget_bytes,
            pin_ceiling_bytes: 3 << 20,
            prefetch_depth: 1,
            staging_buffers: 3,
            fast_disk_chunk_bytes: None,
            policy: ResidencyPolicy::Planned,
            max_reads_in_flight: 2,
            activation_reserve_bytes: 0,
        },
        layout,
        order,
        device,
        storage,
        Arc::new(NoObserver),
    )
    .unwrap()
}

/// Runs `steps` steps, never stopped early, with no per-step callback.
pub fn options(steps: u64) -> DriverOptions {
    DriverOptions::steps(steps)
}

/// A safetensors file of f32 tensors `(name, shape, values)`, for adapters the demo
/// writer would not produce.
pub fn write_f32_tensors(path: &Path, tensors: &[(&str, Vec<usize>, Vec<f32>)]) {
    let bytes: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, _, values)| values.iter().flat_map(|v| v.to_le_bytes()).collect())
        .collect();
    let views: Vec<(String, safetensors::tensor::TensorView<'_>)> = tensors
        .iter()
        .zip(&bytes)
        .map(|((name, shape, _), bytes)| {
            (
                name.to_string(),
                safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                    .unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}
