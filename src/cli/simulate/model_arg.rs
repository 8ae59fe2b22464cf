//! What `--model` names: a shipped description, a description TOML, a folder of a
//! family stagehand computes (described from the family), or a bare checkpoint.

use std::path::Path;

use super::super::Failure;
use super::SimulateArgs;
use stagehand::families::{Extras, WorkloadKind};
use stagehand::model::ModelIndex;
use stagehand::simulate::ModelDescription;

/// A shipped name or description TOML, else a checkpoint `inspect` can read.
pub(super) fn load_model(
    args: &SimulateArgs,
    pattern: Option<&str>,
) -> Result<ModelDescription, Failure> {
    load_model_named(&args.model, args, pattern)
}

/// [`load_model`] of `model` (`--model`, or `--with`'s second model).
pub(super) fn load_model_named(
    model: &str,
    args: &SimulateArgs,
    pattern: Option<&str>,
) -> Result<ModelDescription, Failure> {
    let path = Path::new(model);
    let is_description = ModelDescription::builtin_names().contains(&model)
        || path.extension().is_some_and(|ext| ext == "toml")
        || !path.exists();
    if is_description {
        return ModelDescription::load(model).map_err(Failure::bad_input);
    }
    if args.tokens_per_step == 0 {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--tokens-per-step 0: a step processes at least 1 token"
        )));
    }
    if let Some(prepared) = prepare_family(path, args.tokens_per_step, pattern, &Extras::default())?
    {
        return ModelDescription::from_prepared(&prepared, args.tokens_per_step)
            .map_err(Failure::bad_input);
    }
    let index = ModelIndex::open(path, pattern).map_err(Failure::bad_input)?;
    ModelDescription::from_model_index(&index, args.tokens_per_step, None)
        .map_err(Failure::bad_input)
}

/// One model of a pipeline (a folder, a file, or a part of an all-in-one file),
/// described from its family as [`load_model_named`] describes a folder.
pub(super) fn load_part(
    model: &stagehand::pipeline::PipelinePart,
    args: &SimulateArgs,
    pattern: Option<&str>,
) -> Result<ModelDescription, Failure> {
    let given = Extras {
        part: model.part.clone(),
        tokenizer: model.tokenizer.clone(),
        ..Extras::default()
    };
    match prepare_family(&model.path, args.tokens_per_step, pattern, &given)? {
        Some(prepared) => ModelDescription::from_prepared(&prepared, args.tokens_per_step)
            .map_err(Failure::bad_input),
        None => Err(Failure::bad_input(anyhow::anyhow!(
            "{}: not a model of a family stagehand computes",
            model.path.display()
        ))),
    }
}

/// A folder of a family stagehand computes, prepared as `run` prepares it (headers
/// only): its own blocks, the kernels it calls, what it reserves. `None` for other
/// folders and bare checkpoints (described from their checkpoint). `given`: the
/// part of the file that is the model, and its tokenizer.
fn prepare_family(
    path: &Path,
    tokens_per_step: u64,
    pattern: Option<&str>,
    given: &Extras,
) -> Result<Option<stagehand::run::Prepared>, Failure> {
    // A bare checkpoint may still be a family's (a Flux file in the original or
    // ComfyUI layout); any other is described from its checkpoint.
    let folder = match given.part {
        Some(_) => None,
        None => stagehand::model::ModelFolder::find(path).ok().flatten(),
    };
    let checkpoint = folder
        .as_ref()
        .map_or(path, |folder| folder.checkpoint.as_path());
    let bare = folder.is_none();
    let Ok(index) = stagehand::run::open_index(checkpoint, pattern, given.part.as_ref(), bare)
    else {
        return Ok(None);
    };
    let found = stagehand::families::Found {
        index: &index,
        folder: folder.as_ref(),
    };
    let Ok(entry) = stagehand::families::find(WorkloadKind::Auto, &found) else {
        return Ok(None);
    };
    let mut extras = Extras {
        headers_only: true,
        ..given.clone()
    };
    let described = entry
        .described_step(&found, tokens_per_step, &mut extras)
        .map_err(|error| Failure::bad_input(anyhow::anyhow!(error)))?;
    let Some(batch) = described else {
        return Ok(None);
    };
    let settings = stagehand::settings::Settings::default();
    stagehand::run::prepare_with(path, entry.kind, batch, &settings, false, &extras)
        .map(Some)
        .map_err(|error| Failure::bad_input(anyhow::anyhow!(error)))
}
