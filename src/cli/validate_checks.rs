//! `stagehand validate`'s arguments checked before anything is written or run: a
//! matrix takes seconds to minutes, so a bad value is refused at once, not after it.

use super::validate::{ValidateArgs, ValidateDevice, MAX_REPEATS, MAX_STEPS};
use super::{CommandResult, Failure};

/// What is refused before anything is written or run.
pub(super) fn check_arguments(args: &ValidateArgs) -> CommandResult {
    if args.steps < 3 {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--steps {}: at least 3 (a cold step, a warm-up step, then steady ones)",
            args.steps
        )));
    }
    if !(1..=MAX_REPEATS).contains(&args.repeats) {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--repeats {}: between 1 and {MAX_REPEATS} real runs per configuration",
            args.repeats
        )));
    }
    if args.steps > MAX_STEPS {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--steps {}: at most {MAX_STEPS} per run (the matrix runs 40 of them)",
            args.steps
        )));
    }
    if args.quick && args.encoder.is_some() {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--encoder is not part of the --quick matrix (it has no encoder); drop --quick to validate it"
        )));
    }
    if let Some(encoder) = args.encoder.as_ref().filter(|dir| !dir.is_dir()) {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--encoder {}: not a folder; give an encoder's Hugging Face folder (config.json, weights, tokenizer.json)",
            encoder.display()
        )));
    }
    if let Some(cache) = args
        .cache_dir
        .as_ref()
        .filter(|dir| dir.exists() && !dir.is_dir())
    {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "--cache-dir {}: not a folder (it is a file); give a folder (made if missing)",
            cache.display()
        )));
    }
    if let Some(traces) = &args.traces {
        std::fs::create_dir_all(traces).map_err(|error| {
            Failure::bad_input(anyhow::anyhow!(
                "--traces {}: cannot make the folder ({error}); give a writable folder",
                traces.display()
            ))
        })?;
    }
    if args.device == ValidateDevice::Cuda {
        check_cuda()?;
    }
    Ok(())
}

/// `--device cuda` on a machine without one is bad input, said before the first run.
#[cfg(feature = "cuda")]
fn check_cuda() -> CommandResult {
    match stagehand::device::cuda::device_count() {
        Ok(0) => Err(Failure::bad_input(anyhow::anyhow!(
            "--device cuda: the NVIDIA driver sees no GPU; use --device cpu"
        ))),
        Ok(_) => Ok(()),
        Err(error) => Err(Failure::bad_input(anyhow::anyhow!(
            "--device cuda: {error}"
        ))),
    }
}

#[cfg(not(feature = "cuda"))]
fn check_cuda() -> CommandResult {
    Err(Failure::bad_input(anyhow::anyhow!(
        "--device cuda: this build has no CUDA support (built without the `cuda` feature); use --device cpu"
    )))
}
