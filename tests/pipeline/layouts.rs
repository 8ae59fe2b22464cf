//! The layouts people download, against the diffusers folder of the same weights:
//! ComfyUI's separate files (the transformer in Black Forest Labs' names, `clip_l`,
//! `t5xxl`, `ae.safetensors` in the autoencoder's original names), its all-in-one
//! checkpoint, and T5 in ComfyUI's scaled FP8 (`tests/fixtures/pipeline/comfy`,
//! written and read back by `scripts/make-pipeline-fixtures.py`).

use std::path::PathBuf;

use stagehand::families::PromptLength;
use stagehand::pipeline::{generate, FluxParts, ImageRequest, PartFiles, PipelineError};
use stagehand::run::{Extras, WorkloadKind};
use stagehand::EncoderInput;

use super::{
    expected, first_output, fixtures, pipeline, prepare, relative_difference, streamed,
    IMAGE_TOLERANCE, MAX_SEQUENCE_LENGTH, PROMPT, TEXT_TOLERANCE,
};

fn comfy(name: &str) -> PathBuf {
    fixtures().join("comfy").join(name)
}

/// The tokenizer folders a ComfyUI user points at (the pipeline folder's here).
fn tokenizers() -> PartFiles {
    PartFiles {
        clip_tokenizer: Some(pipeline().join("tokenizer")),
        t5_tokenizer: Some(pipeline().join("tokenizer_2")),
        ..PartFiles::default()
    }
}

fn separate_files() -> PartFiles {
    PartFiles {
        clip: Some(comfy("clip_l.safetensors")),
        t5: Some(comfy("t5xxl.safetensors")),
        vae: Some(comfy("ae.safetensors")),
        ..tokenizers()
    }
}

fn image_request() -> ImageRequest {
    ImageRequest {
        prompt: PROMPT.to_string(),
        width: 48,
        height: 64,
        steps: 3,
        guidance: Some(3.5),
        seed: 0,
        count: 1,
        max_sequence_length: MAX_SEQUENCE_LENGTH,
        latents: Some(expected("noise")),
        vae_tile: None,
        init: None,
    }
}

#[test]
fn comfyui_files_and_the_all_in_one_checkpoint_give_the_folders_image() {
    // Proves the three layouts of the same weights — the diffusers folder, ComfyUI's
    // separate files, its all-in-one checkpoint — make the same picture (every pixel
    // level equal) and each diffusers' image, every stage read from its own layout.
    let settings = stagehand::settings::Settings::default();
    let run = super::pipeline_run(&settings);
    let layouts = [
        FluxParts::open(&pipeline()).expect("the folder"),
        FluxParts::locate(&comfy("flux1-tiny.safetensors"), &separate_files())
            .expect("separate files"),
        FluxParts::locate(&comfy("flux-tiny-all-in-one.safetensors"), &tokenizers())
            .expect("the all-in-one checkpoint"),
    ];
    assert!(layouts[2].vae.part.is_some() && layouts[2].clip.part.is_some());
    let images: Vec<_> = layouts
        .iter()
        .map(|parts| generate(parts, &image_request(), &run).expect("makes an image"))
        .collect();
    for (parts, generated) in layouts.iter().zip(&images) {
        let what = parts.dir.display();
        let picture = &generated.pictures[0];
        let error = relative_difference(&picture.values, &expected("image"));
        assert!(error < IMAGE_TOLERANCE, "{what}: image off by {error}");
        assert_eq!(
            picture.pixels, images[0].pictures[0].pixels,
            "{what}: the folder's pixels"
        );
        let latent_error = relative_difference(&generated.latents[0], &images[0].latents[0]);
        assert!(latent_error < 1e-6, "{what}: latent off by {latent_error}");
    }
}

#[test]
fn the_autoencoder_in_its_original_names_decodes_as_diffusers() {
    // Proves ae.safetensors (LDM names: `decoder.up.3.block.0`, the mid attention as
    // 1×1 convolutions), given alone with no config, is read as diffusers'
    // AutoencoderKL and decodes diffusers' image, streamed bit-exactly.
    super::decodes_as_diffusers(&comfy("ae.safetensors"));
}

#[test]
fn t5_in_comfyuis_scaled_fp8_gives_the_states_of_its_weights() {
    // Proves t5xxl_fp8_e4m3fn_scaled (E4M3 weights, a `scale_weight` each, the
    // `scaled_fp8` marker) opens without a config and gives what transformers'
    // T5EncoderModel computes from the same weights widened and scaled.
    let extras = Extras {
        tokenizer: Some(pipeline().join("tokenizer_2")),
        ..Extras::default()
    }
    .with(EncoderInput::Texts(vec![PROMPT.to_string()]))
    .with(PromptLength(MAX_SEQUENCE_LENGTH));
    let prepared = prepare(&comfy("t5xxl_fp8_e4m3fn_scaled.safetensors"), &extras);
    assert_eq!(prepared.family.name, "t5");
    let output = first_output(&streamed(&prepared, 1));
    let reference = stagehand::families::flux::read_tensors(&comfy("expected-fp8.safetensors"))
        .expect("reads")
        .remove(0)
        .2;
    let error = relative_difference(&output, &reference);
    assert!(error < TEXT_TOLERANCE, "states off by {error}");
}

#[test]
fn a_part_no_file_holds_is_refused_naming_the_flag_that_gives_it() {
    // Proves the transformer's file alone is refused for its missing T5 (naming
    // --t5), a text encoder file without its tokenizer naming --clip-tokenizer, and
    // a text encoder given as a file tokenizes from the pipeline folder's tokenizer.
    let without_t5 = PartFiles {
        t5: None,
        ..separate_files()
    };
    let error =
        FluxParts::locate(&comfy("flux1-tiny.safetensors"), &without_t5).expect_err("no T5");
    assert!(
        matches!(error, PipelineError::MissingFile { flag: "--t5", .. }),
        "{error}"
    );
    assert!(error.to_string().contains("t5xxl"), "{error}");
    let untokenized = PartFiles {
        clip_tokenizer: None,
        ..separate_files()
    };
    let error = FluxParts::locate(&comfy("flux1-tiny.safetensors"), &untokenized)
        .expect_err("no CLIP tokenizer");
    assert!(
        matches!(
            error,
            PipelineError::MissingFile {
                flag: "--clip-tokenizer",
                ..
            }
        ),
        "{error}"
    );
    let error = FluxParts::locate(&comfy("clip_l.safetensors"), &separate_files())
        .expect_err("not a Flux checkpoint");
    assert!(error.to_string().contains("Flux checkpoint"), "{error}");
    let folder_with_file = PartFiles {
        clip: Some(comfy("clip_l.safetensors")),
        ..PartFiles::default()
    };
    let parts = FluxParts::locate(&pipeline(), &folder_with_file).expect("the folder");
    assert_eq!(parts.clip.tokenizer, Some(pipeline().join("tokenizer")));
    let prepared = stagehand::run::prepare_with(
        &parts.clip.path,
        WorkloadKind::Auto,
        1,
        &stagehand::settings::Settings::default(),
        false,
        &Extras {
            tokenizer: parts.clip.tokenizer.clone(),
            ..Extras::default()
        }
        .with(EncoderInput::Texts(vec![PROMPT.to_string()])),
    )
    .expect("CLIP from its file");
    let pooled = expected("clip_pooled");
    let output = first_output(&streamed(&prepared, 1));
    let error = relative_difference(&output[..pooled.len()], &pooled);
    assert!(error < TEXT_TOLERANCE, "pooled off by {error}");
}
