//! What `--model` names: a shipped description, a description TOML, a folder of a
//! family stagehand computes (described from the family), or a bare checkpoint.

use std::path::Path;

use super::super::Failure;
use super::SimulateArgs;
use crate::model::ModelIndex;
use crate::simulate::ModelDescription;

/// Most tokens one described encoder step may have (a bound on the ids made up to
/// describe it; far above any real batch).
const MAX_ENCODER_TOKENS: u64 = 1 << 20;

/// A shipped name or description TOML, else a checkpoint `inspect` can read.
pub(super) fn load_model(
    args: &SimulateArgs,
    pattern: Option<&str>,
) -> Result<ModelDescription, Failure> {
    let path = Path::new(&args.model);
    let is_description = ModelDescription::builtin_names().contains(&args.model.as_str())
        || path.extension().is_some_and(|ext| ext == "toml")
        || !path.exists();
    if is_description {
        return ModelDescription::load(&args.model).map_err(Failure::bad_input);
    }
    if args.tokens_per_step == 0 {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--tokens-per-step 0: a step processes at least 1 token"
        )));
    }
    let family = crate::model::ModelFolder::find(path)
        .ok()
        .flatten()
        .and_then(|folder| folder.model_type());
    if let Some(family) = family {
        if let Some(prepared) = prepare_family(path, &family, args.tokens_per_step)? {
            return ModelDescription::from_prepared(&prepared, args.tokens_per_step)
                .map_err(Failure::bad_input);
        }
    }
    let index = ModelIndex::open(path, pattern).map_err(Failure::bad_input)?;
    ModelDescription::from_model_index(&index, args.tokens_per_step, None)
        .map_err(Failure::bad_input)
}

/// A folder of a family stagehand computes, prepared as `run` prepares it (headers
/// only for a decoder): its own blocks, the kernels it calls, what it reserves.
/// `None` for other folders (described from their checkpoint).
fn prepare_family(
    path: &Path,
    family: &str,
    tokens_per_step: u64,
) -> Result<Option<crate::run::Prepared>, Failure> {
    let settings = crate::settings::Settings::default();
    let (kind, extras, batch) = if crate::families::llama::DECODER_FAMILIES.contains(&family) {
        let extras = crate::run::Extras {
            headers_only: true,
            ..crate::run::Extras::default()
        };
        (crate::run::WorkloadKind::Decoder, extras, 1)
    } else if family == "bert" {
        if tokens_per_step > MAX_ENCODER_TOKENS {
            return Err(Failure::bad_input(anyhow::anyhow!(
                "--tokens-per-step {tokens_per_step}: an encoder step of at most {MAX_ENCODER_TOKENS} tokens is described (the token ids it embeds are made up to describe it)"
            )));
        }
        // One step embeds `tokens_per_step` tokens: sequences of the model's longest,
        // one batch (the texts' ids do not change the work).
        let max_positions = crate::model::ModelFolder::find(path)
            .ok()
            .flatten()
            .and_then(|folder| {
                crate::families::bert::bert_config(&folder.config_path(), &folder.config).ok()
            })
            .map_or(512, |config| config.max_positions as u64)
            .max(1);
        let sequences = tokens_per_step.div_ceil(max_positions);
        let ids: Vec<Vec<u32>> = (0..sequences)
            .map(|sequence| {
                let length = (tokens_per_step - sequence * max_positions).min(max_positions);
                vec![0; length as usize]
            })
            .collect();
        let extras = crate::run::Extras {
            encoder: Some(crate::run::EncoderInput::TokenIds(ids)),
            ..crate::run::Extras::default()
        };
        (
            crate::run::WorkloadKind::Encoder,
            extras,
            sequences as usize,
        )
    } else {
        return Ok(None);
    };
    crate::run::prepare_with(path, kind, batch, &settings, false, &extras)
        .map(Some)
        .map_err(|error| Failure::bad_input(anyhow::anyhow!(error)))
}
