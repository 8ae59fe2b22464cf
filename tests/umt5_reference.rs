//! umT5 (WAN 2.1/2.2's text encoder) against transformers: `tests/fixtures/umt5`
//! holds a tiny `UMT5EncoderModel` (every block with its own relative position bias;
//! seeded bf16-valued weights) saved by `save_pretrained` as WAN's `text_encoder/`,
//! its tokenizer as WAN's `tokenizer/tokenizer.json`, and what transformers computed
//! from them (`scripts/make-umt5-fixtures.py`). The T5 family opens the folder by its
//! config, tokenizes as WanPipeline does (padded to 512) and gives transformers' states,
//! streamed under part of its size bit for bit as it does resident.

use std::path::{Path, PathBuf};

use stagehand::families::flux::read_tensors;
use stagehand::families::prompt_tokens::PromptTokenizer;
use stagehand::families::{PaddingMasked, PromptLength};
use stagehand::run::{
    execute, prepare_with, Budgets, Extras, Outcome, Prepared, RunPlan, WorkloadKind,
};
use stagehand::settings::Settings;
use stagehand::EncoderInput;

/// Largest difference allowed relative to the reference's largest magnitude: f32 on
/// both sides in other summation orders (the T5 check of tests/pipeline.rs).
const TEXT_TOLERANCE: f32 = 1e-5;

const PROMPT: &str = "a red fox runs through the snow at sunset, 色调艳丽，过曝, highly detailed";
/// WanPipeline's `max_sequence_length`.
const MAX_SEQUENCE_LENGTH: usize = 512;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/umt5")
}

fn expected(name: &str) -> Vec<f32> {
    read_tensors(&fixtures().join("expected.safetensors"))
        .expect("reads the expected outputs")
        .into_iter()
        .find(|(found, ..)| found == name)
        .unwrap_or_else(|| panic!("expected.safetensors has no {name}"))
        .2
}

/// Largest |a − b| over the largest |b|.
fn relative_difference(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "lengths");
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-12);
    a.iter().zip(b).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale
}

fn prepare() -> Prepared {
    prepare_folder(&fixtures().join("text_encoder"))
}

fn prepare_folder(folder: &Path) -> Prepared {
    prepare_with_extras(folder, Extras::default())
}

fn prepare_with_extras(folder: &Path, extras: Extras) -> Prepared {
    let extras = extras
        .with(EncoderInput::Texts(vec![PROMPT.to_string()]))
        .with(PromptLength(MAX_SEQUENCE_LENGTH));
    prepare_with(
        folder,
        WorkloadKind::Auto,
        1,
        &Settings::default(),
        false,
        &extras,
    )
    .expect("opens")
}

/// One step under `vram_budget_bytes`, its output kept.
fn run(prepared: &Prepared, vram_budget_bytes: u64) -> Outcome {
    let settings = Settings::default();
    let plan = RunPlan {
        prefetch_depth: 1,
        keep_outputs: true,
        ..RunPlan::new(
            &settings,
            Budgets {
                vram_budget_bytes,
                pin_ceiling_bytes: 64 << 20,
            },
            1,
        )
    };
    execute(prepared, plan).expect("runs")
}

fn output(outcome: &Outcome) -> Vec<f32> {
    outcome
        .report
        .outputs
        .values()
        .next()
        .cloned()
        .expect("an output")
}

#[test]
fn umt5_tokenizer_gives_the_ids_transformers_gave() {
    // Proves WAN's tokenizer/tokenizer.json (umT5's byte-fallback unigram) loads through
    // the T5 path from text_encoder/ and pads with <pad> to 512 as WanPipeline does.
    let tokenizer = PromptTokenizer::for_encoder(
        &fixtures().join("text_encoder"),
        MAX_SEQUENCE_LENGTH,
        "<pad>",
    )
    .expect("umT5 tokenizer");
    let encoded = tokenizer.encode(PROMPT).expect("encodes");
    let want: Vec<u32> = expected("ids").iter().map(|&id| id as u32).collect();
    assert_eq!(encoded.ids, want);
    assert!(!encoded.truncated);
}

#[test]
fn a_character_outside_the_vocabulary_falls_back_to_its_bytes() {
    // Proves the `tokenizers` crate honours tokenizer.json's byte_fallback, as
    // transformers 4's fast tokenizer did: "猫" (not in the fixture's vocabulary) is
    // its three UTF-8 bytes, <0xE7> <0x8C> <0xAB> (ids 3 + byte), where transformers 5's
    // T5Tokenizer, rebuilt without byte fallback, gives <unk> (2).
    let tokenizer = PromptTokenizer::for_encoder(&fixtures().join("text_encoder"), 8, "<pad>")
        .expect("umT5 tokenizer");
    let ids = tokenizer.encode("猫").expect("encodes").ids;
    assert_eq!(&ids[1..4], &[3 + 0xE7, 3 + 0x8C, 3 + 0xAB]);
}

#[test]
fn umt5_gives_transformers_states_streamed_as_resident() {
    // Proves the T5 family on a umt5 config (a position bias per block, unscaled
    // scores, gated tanh GELU, final RMS norm) computes UMT5EncoderModel's states of
    // the padded prompt, and streamed under a block less than the model gives the
    // resident states bit for bit.
    let prepared = prepare();
    assert_eq!(prepared.family.name, "t5");
    assert_eq!(prepared.facts().describe(), "umt5 encoder");
    let layout = prepared.facts().layout();
    let activations = prepared.activation_bytes(1);
    let resident = output(&run(&prepared, layout.total_bytes() + activations));
    let error = relative_difference(&resident, &expected("states"));
    let error_f64 = relative_difference(&resident, &expected("states_f64"));
    eprintln!("umT5 states: largest difference {error:e} of the largest magnitude from transformers' f32, {error_f64:e} from its f64");
    assert!(error < TEXT_TOLERANCE, "states off by {error}");

    let smallest = layout.blocks.iter().map(|block| block.bytes).min();
    let budget = layout.total_bytes() - smallest.unwrap_or(0) + activations;
    let outcome = run(&prepared, budget);
    assert!(
        outcome.report.plan.vram.resident.iter().any(|held| !held),
        "some block streams"
    );
    assert_eq!(outcome.report.verified_steps, 1, "streamed = resident");
    let streamed = output(&outcome);
    let same_bits = streamed
        .iter()
        .zip(&resident)
        .all(|(a, b)| a.to_bits() == b.to_bits());
    assert!(same_bits && streamed.len() == resident.len(), "bit for bit");
}

#[test]
fn the_same_weights_read_as_t5_miss_transformers_states() {
    // Proves the fixture tells umT5 from T5: its folder with `model_type: t5` (the
    // first block's bias shared by all) is far from UMT5EncoderModel's states.
    let copy = tempfile::tempdir().expect("temp dir");
    let folder = copy.path().join("text_encoder");
    std::fs::create_dir(&folder).expect("folder");
    let source = fixtures().join("text_encoder");
    std::fs::copy(
        source.join("model.safetensors"),
        folder.join("model.safetensors"),
    )
    .expect("copies");
    let config = std::fs::read_to_string(source.join("config.json")).expect("config");
    let config = config.replace("\"umt5\"", "\"t5\"").replace("UMT5", "T5");
    std::fs::write(folder.join("config.json"), config).expect("writes");
    let tokenizer = copy.path().join("tokenizer");
    std::fs::create_dir(&tokenizer).expect("folder");
    for name in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(
            fixtures().join("tokenizer").join(name),
            tokenizer.join(name),
        )
        .expect("copies");
    }
    let prepared = prepare_folder(&folder);
    assert_eq!(prepared.facts().describe(), "t5 encoder");
    let budget = prepared.facts().layout().total_bytes() + prepared.activation_bytes(1);
    let states = output(&run(&prepared, budget));
    let error = relative_difference(&states, &expected("states"));
    assert!(error > 1e-2, "shared bias only {error} off");
}

#[test]
fn with_the_padding_masked_umt5_gives_wanpipelines_states() {
    // Proves the key mask WanPipeline passes (the tokenizer's attention mask): the
    // prompt's rows equal UMT5EncoderModel's with that mask, the padded rows are zero
    // (as WanPipeline zeroes them), and streamed equals resident bit for bit.
    let folder = fixtures().join("text_encoder");
    let prepared = prepare_with_extras(&folder, Extras::default().with(PaddingMasked));
    let tokens = PromptTokenizer::for_encoder(&folder, MAX_SEQUENCE_LENGTH, "<pad>")
        .expect("umT5 tokenizer")
        .encode(PROMPT)
        .expect("encodes")
        .tokens;
    assert!(
        tokens > 1 && tokens < MAX_SEQUENCE_LENGTH,
        "{tokens} prompt tokens"
    );
    let layout = prepared.facts().layout();
    let activations = prepared.activation_bytes(1);
    let resident = output(&run(&prepared, layout.total_bytes() + activations));
    let width = resident.len() / MAX_SEQUENCE_LENGTH;
    let masked = expected("states_masked");
    let error = relative_difference(&resident[..tokens * width], &masked[..tokens * width]);
    eprintln!("umT5 masked states: largest difference {error:e} of the largest magnitude");
    assert!(error < TEXT_TOLERANCE, "masked states off by {error}");
    assert!(
        resident[tokens * width..].iter().all(|&value| value == 0.0),
        "padding zeroed"
    );
    // The mask changes the prompt's rows: the unmasked states are not these.
    let unmasked = relative_difference(
        &resident[..tokens * width],
        &expected("states")[..tokens * width],
    );
    assert!(unmasked > 1e-3, "the mask changed nothing ({unmasked})");

    let smallest = layout.blocks.iter().map(|block| block.bytes).min();
    let budget = layout.total_bytes() - smallest.unwrap_or(0) + activations;
    let streamed = output(&run(&prepared, budget));
    assert!(streamed
        .iter()
        .zip(&resident)
        .all(|(a, b)| a.to_bits() == b.to_bits()));
}
