//! The fixtures and the shared rows of the CLI tables (`cli.rs`): small models written
//! once per test binary, and the rows every run-like subcommand shares (the deployment
//! settings, `--device`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use stagehand::compute::DType;
use stagehand::families::bert::{write_bert_lora, BertDemo, BertPreset};
use stagehand::families::flux::{FluxDemo, FluxPreset, Layout};
use stagehand::families::llama::DecoderArch;
use stagehand::lora::{write_demo_lora, DemoLora};
use stagehand::model::demo::{write_linear_stack, DemoSpec};

use super::cli::{row, Expect, Row};
use super::decoder::tiny_decoder;
use super::encoder::tiny_bert;

const LINEAR_STACK: DemoSpec = DemoSpec {
    blocks: 4,
    layers_per_block: 1,
    dim: 64,
    seed: 7,
};

/// Small models and files, written once per test binary under cargo's target tmp dir.
pub struct Fixtures {
    dir: PathBuf,
    linear_stack: OnceLock<String>,
    linear_lora: OnceLock<String>,
    bert: OnceLock<String>,
    bert_lora: OnceLock<String>,
    llama: OnceLock<String>,
    moe: OnceLock<String>,
    flux: OnceLock<String>,
}

/// This test binary's fixtures.
pub fn fixtures() -> &'static Fixtures {
    static FIXTURES: OnceLock<Fixtures> = OnceLock::new();
    FIXTURES.get_or_init(|| {
        let binary = std::env::current_exe().expect("the test binary's path");
        let name = binary
            .file_stem()
            .map(|stem| stem.to_string_lossy().into_owned())
            .unwrap_or_default();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cli-table-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("the fixture folder is made");
        Fixtures {
            dir,
            linear_stack: OnceLock::new(),
            linear_lora: OnceLock::new(),
            bert: OnceLock::new(),
            bert_lora: OnceLock::new(),
            llama: OnceLock::new(),
            moe: OnceLock::new(),
            flux: OnceLock::new(),
        }
    })
}

fn shown(path: &Path) -> String {
    path.display().to_string()
}

impl Fixtures {
    /// A path in the fixture folder, not created.
    pub fn path(&self, name: &str) -> String {
        shown(&self.dir.join(name))
    }

    /// A file in the fixture folder holding `contents`.
    pub fn file(&self, name: &str, contents: &str) -> String {
        let path = self.dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).expect("the folder is made");
        }
        std::fs::write(&path, contents).expect("the fixture file is written");
        shown(&path)
    }

    /// An empty folder in the fixture folder.
    pub fn folder(&self, name: &str) -> String {
        let path = self.dir.join(name);
        std::fs::create_dir_all(&path).expect("the folder is made");
        shown(&path)
    }

    /// A linear-stack demo model of 4 blocks × 1 layer × 64×64 f32 (64 KiB): the file.
    pub fn linear_stack(&self) -> String {
        self.linear_stack
            .get_or_init(|| {
                let model = write_linear_stack(&self.dir.join("linear"), &LINEAR_STACK);
                shown(&model.expect("demo model"))
            })
            .clone()
    }

    /// The demo PEFT adapter (rank 8) of [`Fixtures::linear_stack`]'s model.
    pub fn linear_lora(&self) -> String {
        self.linear_lora
            .get_or_init(|| {
                let path = self.dir.join("linear-lora.safetensors");
                write_demo_lora(&path, &LINEAR_STACK, &DemoLora::default()).expect("adapter");
                shown(&path)
            })
            .clone()
    }

    /// The tiny BERT folder (4 layers of 128, f32).
    pub fn bert(&self) -> String {
        self.bert
            .get_or_init(|| shown(&tiny_bert(&self.dir.join("bert"), DType::F32)))
            .clone()
    }

    /// A rank-4 PEFT adapter on query/value of [`Fixtures::bert`]'s model: the file.
    pub fn bert_lora(&self) -> String {
        self.bert_lora
            .get_or_init(|| {
                let demo = BertDemo {
                    preset: BertPreset::Tiny,
                    dtype: DType::F32,
                    ..BertDemo::default()
                };
                let dir = self.dir.join("bert-lora");
                shown(&write_bert_lora(&dir, &demo, 4, 11).expect("adapter"))
            })
            .clone()
    }

    /// The tiny Llama folder (4 layers of 128, f32).
    pub fn llama(&self) -> String {
        self.llama
            .get_or_init(|| {
                let dir = self.dir.join("llama");
                shown(&tiny_decoder(&dir, DecoderArch::Llama, DType::F32, 5))
            })
            .clone()
    }

    /// The tiny Qwen3-MoE folder (16 experts, top-4, f32).
    pub fn moe(&self) -> String {
        self.moe
            .get_or_init(|| {
                let dir = self.dir.join("moe");
                shown(&tiny_decoder(&dir, DecoderArch::Qwen3Moe, DType::F32, 5))
            })
            .clone()
    }

    /// The tiny Flux transformer in the original single-file layout (f32): the file.
    pub fn flux(&self) -> String {
        self.flux
            .get_or_init(|| {
                let demo = FluxDemo {
                    preset: FluxPreset::Tiny,
                    layout: Layout::Original,
                    dtype: DType::F32,
                    seed: 42,
                };
                shown(&demo.write(&self.dir.join("flux")).expect("writes the Flux"))
            })
            .clone()
    }
}

/// Rows for the deployment settings every run-like subcommand flattens in (`--config`
/// to `--compute-dtype`, less `--device`, whose rows each table writes for its own outcomes),
/// good values expecting `ok` on stdout and bad ones exit 2 naming the key.
pub fn settings_rows(ok: &'static str) -> Vec<Row> {
    settings_rows_expecting(Expect::Ok(ok))
}

/// [`settings_rows`] whose good values expect `ok` (e.g. [`Expect::Summary`]: a line
/// of the summary on stderr).
pub fn settings_rows_expecting(ok: Expect) -> Vec<Row> {
    let fixtures = fixtures();
    let decimal = fixtures.file("settings/decimal.toml", "vram_budget = \"20MB\"\n");
    let bare = fixtures.file("settings/bare.toml", "vram_budget = 2\n");
    let config = fixtures.file("settings/c.toml", "prefetch_depth = 1\n");
    let unknown_key = fixtures.file("settings/unknown.toml", "vram_budgte = \"1GiB\"\n");
    let trace = fixtures.path("settings/trace.json");
    let missing = fixtures.path("settings/none.toml");
    let folder = fixtures.folder("settings/folder");
    vec![
        row(&["--config", &config], ok),
        row(&["--config", &missing], Expect::Bad("none.toml")),
        row(&["--config", &folder], Expect::Bad("folder")),
        row(&["--config", &unknown_key], Expect::Bad("vram_budgte")),
        // A decimal unit is taken (and logged converted); a bare number is refused.
        row(&["--config", &decimal], ok),
        row(
            &["--config", &bare],
            Expect::Bad("a size needs a unit, e.g. 2GiB"),
        ),
        row(&["--vram-budget", "64MiB"], ok),
        row(&["--vram-budget", "64MB"], ok),
        row(
            &["--vram-budget", "2"],
            Expect::Bad("a size needs a unit, e.g. 2GiB"),
        ),
        row(&["--vram-budget", "lots"], Expect::Bad("vram_budget")),
        row(&["--reserve-vram", "0MiB"], ok),
        row(&["--reserve-vram", "-1"], Expect::Bad("reserve_vram")),
        row(&["--vram-headroom", "1GiB"], ok),
        row(&["--vram-headroom", "x"], Expect::Bad("vram_headroom")),
        row(&["--pin-ceiling", "64MiB"], ok),
        row(&["--pin-ceiling", "0"], Expect::Bad("pin_ceiling")),
        row(&["--ram-floor", "2GiB"], ok),
        row(&["--ram-floor", "lots"], Expect::Bad("ram_floor")),
        // Plain switches: the word after one is never its value.
        row(&["--fast-disk"], ok),
        row(&["--no-fast-disk"], ok),
        row(&["--fast-disk", "--no-fast-disk"], ok),
        row(&["--fast-disk=true"], Expect::Bad("--fast-disk")),
        row(&["--no-fast-disk=true"], Expect::Bad("--no-fast-disk")),
        row(&["--prefetch-depth", "1"], ok),
        row(&["--prefetch-depth", "65"], Expect::Bad("prefetch_depth")),
        row(&["--prefetch-depth", "-1"], Expect::Bad("prefetch_depth")),
        row(&["--metrics-addr", "127.0.0.1:0"], ok),
        row(&["--metrics-addr", "nowhere:x"], Expect::Bad("metrics")),
        row(&["--trace", &trace], ok),
        row(&["--trace", &folder], Expect::Bad("is a folder")),
        row(
            &["--trace", &format!("{missing}/t.json")],
            Expect::Bad("does not exist"),
        ),
        row(&["--log", "warn"], ok),
        row(&["--log", "[[["], Expect::Bad("not a log filter")),
        // The number after `layer.`, `layers.` or `blocks.`: every fixture's layers.
        row(&["--block-pattern", r"(?:layers?|blocks)\.(\d+)\."], ok),
        row(&["--block-pattern", "("], Expect::Bad("not a valid regex")),
        row(&["--staging-buffers", "2"], ok),
        row(&["--staging-buffers", "1"], Expect::Bad("staging_buffers")),
        row(&["--staging-buffer-size", "4MiB"], ok),
        row(
            &["--staging-buffer-size", "4MB"],
            Expect::Bad("multiple of 4 KiB"),
        ),
        row(&["--read-request-size", "1MiB"], ok),
        row(
            &["--read-request-size", "3KiB"],
            Expect::Bad("read_request_size"),
        ),
        row(&["--reader-threads", "2"], ok),
        row(&["--reader-threads", "0"], Expect::Bad("reader_threads")),
        row(&["--compute-threads", "1"], ok),
        row(&["--compute-threads", "0"], Expect::Bad("compute_threads")),
        row(&["--verify", "full"], ok),
        row(&["--verify", "first"], ok),
        row(&["--verify", "weights"], ok),
        row(&["--verify", "off"], ok),
        row(
            &["--verify", "sometimes"],
            Expect::Bad("full, first, weights, off"),
        ),
        row(&["--compute-dtype", "f32"], ok),
        row(&["--compute-dtype", "bf16"], ok),
        row(&["--compute-dtype", "fp64"], Expect::Bad("f32, bf16")),
    ]
}

/// Rows for `--device`: `cpu` and `auto` run (`ok` on stdout), `sim` points at
/// `simulate`, `cuda` runs on a GPU machine and exits 2 naming CUDA elsewhere, and an
/// unknown kind is refused.
pub fn device_rows(ok: &'static str) -> Vec<Row> {
    device_rows_expecting(Expect::Ok(ok))
}

/// [`device_rows`] whose runs expect `ok` (e.g. [`Expect::Summary`]).
pub fn device_rows_expecting(ok: Expect) -> Vec<Row> {
    vec![
        row(&["--device", "cpu"], ok),
        row(&["--device", "auto"], ok),
        row(&["--device", "sim"], Expect::Bad("simulate")),
        row(&["--device", "cuda"], Expect::OkOrBad("cuda")),
        row(&["--device", "tpu"], Expect::Bad("tpu")),
    ]
}

/// Rows for `--device` of a subcommand that opens no device (`config`, `inspect`,
/// `simulate`): every kind is accepted (`ok` on stdout), an unknown one refused.
pub fn unopened_device_rows(ok: &'static str) -> Vec<Row> {
    let mut rows: Vec<Row> = ["cpu", "auto", "sim", "cuda"]
        .into_iter()
        .map(|device| row(&["--device", device], Expect::Ok(ok)))
        .collect();
    rows.push(row(&["--device", "tpu"], Expect::Bad("tpu")));
    rows
}
