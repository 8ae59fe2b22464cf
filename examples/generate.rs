//! Text from a decoder folder, streamed under a VRAM budget below the model's size:
//! the prompt is prefilled as one step, then each step decodes one token, every
//! step's logits checked bit for bit against the fully-resident pass.
//!
//!     cargo run --example generate [FOLDER] [PROMPT]
//!
//! Without a folder it writes a small generated Llama (real names and shapes, seeded
//! weights, a byte-level tokenizer) into a temporary folder; its text is noise, the
//! streaming and the checks are real.

use std::path::PathBuf;

use stagehand::{
    BudgetAsk, DecoderArch, DecoderDemo, DecoderInput, DecoderPreset, ExpertHint, Extras,
    PromptInput, RunPlan, Sampling, Settings, WorkloadKind,
};

const NEW_TOKENS: u64 = 8;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let scratch = std::env::temp_dir().join(format!("stagehand-generate-{}", std::process::id()));
    let folder = match args.next() {
        Some(folder) => PathBuf::from(folder),
        None => stagehand::write_decoder_folder(
            &scratch,
            &DecoderDemo {
                arch: DecoderArch::Llama,
                preset: DecoderPreset::Tiny,
                dtype: stagehand::DType::Bf16,
                seed: 7,
                shard_bytes: 1 << 30,
            },
        )?,
    };
    let prompt = args
        .next()
        .unwrap_or_else(|| "Weights stream from disk".to_string());
    let settings = Settings::default();
    let extras = Extras::default().with(DecoderInput {
        prompt: PromptInput::Text(prompt.clone()),
        sampling: Sampling::default(),
        hint: ExpertHint::NextLayer,
    });
    let model =
        stagehand::prepare_with(&folder, WorkloadKind::Decoder, 1, &settings, false, &extras)?;
    // The prefill and NEW_TOKENS decode steps; the first decode step's token is the
    // prefill's pick, so NEW_TOKENS + 1 steps give NEW_TOKENS + 1 tokens.
    let steps = NEW_TOKENS + 1;
    let budgets = stagehand::budgets_for(&model, &settings, BudgetAsk::steps(steps));
    let outcome = stagehand::execute(&model, RunPlan::new(&settings, budgets, steps))?;
    let report = &outcome.report;
    println!("prompt: {prompt:?}");
    println!("tokens: {:?}", report.tokens);
    println!(
        "{} steps verified against the fully-resident pass, under a {} VRAM budget ({} streamed)",
        report.verified_steps,
        stagehand::actors::Bytes(budgets.vram_budget_bytes),
        stagehand::actors::Bytes(outcome.model_bytes)
    );
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}
