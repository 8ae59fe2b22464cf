//! Sentence embeddings from an encoder folder, streamed under a VRAM budget below the
//! model's size, each batch checked against the fully-resident pass.
//!
//!     cargo run --example embed [FOLDER] [TEXT ...]
//!
//! Without a folder it writes a small generated BERT (real names and shapes, seeded
//! weights, a WordPiece tokenizer) into a temporary folder and embeds three sentences.

use std::path::PathBuf;

use stagehand::{BertDemo, BudgetAsk, EncoderInput, Extras, RunPlan, Settings, WorkloadKind};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let scratch = std::env::temp_dir().join(format!("stagehand-embed-{}", std::process::id()));
    let folder = match args.next() {
        Some(folder) => PathBuf::from(folder),
        None => stagehand::write_bert_folder(&scratch, &BertDemo::default())?,
    };
    let mut texts: Vec<String> = args.collect();
    if texts.is_empty() {
        texts = [
            "A man is eating food.",
            "A man is eating a piece of bread.",
            "The new movie is awesome.",
        ]
        .map(String::from)
        .to_vec();
    }
    let settings = Settings::default();
    let extras = Extras::default().with(EncoderInput::Texts(texts.clone()));
    let model = stagehand::prepare_with(
        &folder,
        WorkloadKind::Encoder,
        32,
        &settings,
        false,
        &extras,
    )?;
    let budgets = stagehand::budgets_for(&model, &settings, BudgetAsk::steps(1));
    let plan = RunPlan {
        keep_outputs: true,
        ..RunPlan::new(&settings, budgets, 1)
    };
    let outcome = stagehand::execute(&model, plan)?;
    // The texts are embedded longest first; this puts them back in the order given.
    let rows = stagehand::families::bert::embeddings_in_input_order(
        &outcome.report.outputs,
        texts.len(),
        model.facts().output_order(),
    )
    .unwrap_or_default();
    let width = rows.first().map_or(0, Vec::len);
    println!(
        "{} texts embedded in {width} dimensions under a {} VRAM budget ({} streamed); {} step verified against the fully-resident pass",
        texts.len(),
        stagehand::actors::Bytes(budgets.vram_budget_bytes),
        stagehand::actors::Bytes(outcome.model_bytes),
        outcome.report.verified_steps
    );
    for (i, a) in rows.iter().enumerate() {
        for (j, b) in rows.iter().enumerate().skip(i + 1) {
            println!("cosine({i}, {j}) = {:.4}", cosine(a, b));
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(a, b)| a * b).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b)).max(f32::MIN_POSITIVE)
}
