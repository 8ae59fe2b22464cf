//! LoRA on Flux across layouts: an adapter named for either layout (kohya's fused
//! original names, PEFT's diffusers pieces) patches a checkpoint of either layout, the
//! same update giving the same latents, streamed against the resident pass; a module
//! that names no weight is refused by name.

#[path = "flux/support.rs"]
mod support;

use std::path::{Path, PathBuf};

use stagehand::compute::DType;
use stagehand::families::flux::{
    write_flux_lora, write_flux_lora_own_down, FluxLoraNaming, FluxPreset, Layout,
};
use stagehand::lora::LoraSpec;
use stagehand::run::{Outcome, RunError};
use support::{generated, input, last_latent, LAYOUTS};

const PRESET: FluxPreset = FluxPreset::Small;
const STEPS: usize = 2;

/// `model` sampled with the adapter `lora` at strength 0.8: streamed (under 0.3 of
/// the model) and fully resident.
fn streamed_and_resident(model: &Path, cond: &Path, lora: &Path) -> (Outcome, Outcome) {
    let spec = LoraSpec::parse(&format!("{}:0.8", lora.display())).unwrap();
    let prepared = support::prepare(model, input(cond, STEPS), vec![spec]);
    let streamed = support::run(&prepared, STEPS as u64, 0.3);
    let everything = prepared.facts().layout().total_bytes() * 2;
    let budget = everything + prepared.activation_bytes(STEPS as u64) + (64 << 20);
    let resident = support::run_within(&prepared, STEPS as u64, budget);
    assert!(
        resident.report.plan.vram.resident.iter().all(|r| *r),
        "{}: the resident run streams",
        model.display()
    );
    (streamed, resident)
}

/// Every layout's model of the same weights, F32 (a resident block bakes `W + s·B·A`
/// in its storage dtype: F32 keeps it within the low-rank tolerance).
fn models(dir: &Path) -> Vec<(Layout, PathBuf, PathBuf)> {
    LAYOUTS
        .iter()
        .map(|&layout| {
            let (model, cond) = generated(dir, PRESET, layout, DType::F32);
            (layout, model, cond)
        })
        .collect()
}

#[test]
fn one_update_in_either_naming_gives_the_same_latents_on_every_layout() {
    // Proves a kohya adapter (fused qkv, linear1, modulations, the final modulation)
    // and a PEFT adapter of the same update (its pieces sharing A, B split by rows,
    // norm_out's halves swapped; also in OneTrainer's flattened naming) give the same
    // latents on the original, ComfyUI and diffusers layouts: bit for bit when every block is resident (each row's merge
    // is the same arithmetic) and bit for bit streamed (each slice's low-rank pass
    // is), the streamed run checked against its resident pass within the LoRA
    // tolerance at every step.
    let dir = tempfile::tempdir().unwrap();
    let mut adapters: Vec<(String, PathBuf)> = [FluxLoraNaming::Kohya, FluxLoraNaming::Peft]
        .into_iter()
        .map(|naming| {
            let path = dir.path().join(format!("{naming:?}.safetensors"));
            write_flux_lora(&path, &PRESET.shape(), naming, 4, 9).unwrap();
            (format!("{naming:?}"), path)
        })
        .collect();
    let onetrainer = dir.path().join("onetrainer.safetensors");
    to_onetrainer(&adapters[1].1, &onetrainer);
    adapters.push(("OneTrainer".into(), onetrainer));
    let models = models(dir.path());
    let plain = {
        let (_, model, cond) = &models[0];
        last_latent(&support::sample(model, input(cond, STEPS), 0.5))
    };
    let cases: Vec<_> = models
        .iter()
        .flat_map(|model| adapters.iter().map(move |adapter| (model, adapter)))
        .collect();
    // The nine cases are independent runs (a small step computes on one thread): they
    // run side by side, and their latents are compared in case order below.
    let outcomes: Vec<(String, Outcome, Outcome)> = std::thread::scope(|scope| {
        let running: Vec<_> = cases
            .iter()
            .map(|((layout, model, cond), (naming, lora))| {
                scope.spawn(move || {
                    let case = format!("{naming} adapter on the {} layout", layout.describe());
                    let (streamed, resident) = streamed_and_resident(model, cond, lora);
                    (case, streamed, resident)
                })
            })
            .collect();
        running
            .into_iter()
            .map(|case| case.join().expect("a case ran"))
            .collect()
    });
    let mut streamed_latents = Vec::new();
    let mut resident_latents = Vec::new();
    for (case, streamed, resident) in outcomes {
        assert_eq!(streamed.report.verified_steps, STEPS as u64, "{case}");
        assert!(
            streamed.report.tolerance_steps > 0,
            "{case}: no streamed block applied low-rank"
        );
        assert_eq!(resident.report.verified_steps, STEPS as u64, "{case}");
        streamed_latents.push((
            case.clone(),
            streamed.report.plan.vram.resident.clone(),
            last_latent(&streamed),
        ));
        resident_latents.push((case, last_latent(&resident)));
    }
    let (first_case, first) = &resident_latents[0];
    assert_ne!(first, &plain, "{first_case}: the LoRA changed nothing");
    for (case, latent) in &resident_latents[1..] {
        assert_eq!(latent, first, "resident: {case} differs from {first_case}");
    }
    // The same blocks stream in every case (the plan is deterministic), so every
    // streamed block computes the same low-rank passes.
    let (first_case, first_plan, first) = &streamed_latents[0];
    for (case, plan, latent) in &streamed_latents[1..] {
        assert_eq!(
            plan, first_plan,
            "{case}: another resident set than {first_case}"
        );
        assert_eq!(latent, first, "streamed: {case} differs from {first_case}");
    }
}

/// Rewrites the PEFT adapter `from` in OneTrainer's naming: the diffusers modules
/// flattened behind `lora_transformer_`, with kohya's factor suffixes.
fn to_onetrainer(from: &Path, to: &Path) {
    let bytes = std::fs::read(from).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let renamed: Vec<(String, safetensors::tensor::TensorView<'_>)> = file
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            let (module, suffix) = [
                (".lora_A.weight", ".lora_down.weight"),
                (".lora_B.weight", ".lora_up.weight"),
                (".alpha", ".alpha"),
            ]
            .iter()
            .find_map(|(peft, kohya)| Some((name.strip_suffix(peft)?, *kohya)))
            .unwrap();
            let module = module
                .strip_prefix("transformer.")
                .unwrap()
                .replace('.', "_");
            (format!("lora_transformer_{module}{suffix}"), view)
        })
        .collect();
    std::fs::write(to, safetensors::serialize(renamed, None).unwrap()).unwrap();
}

#[test]
fn peft_pieces_with_their_own_a_give_the_same_latents_on_every_layout() {
    // Proves a PEFT adapter as diffusers trainers write it (each piece of a fused
    // weight with its own A, which no single kohya module can hold) patches its row
    // slice of the original and ComfyUI layouts' fused weights as it patches the
    // diffusers pieces: the same latents bit for bit, resident and streamed.
    let dir = tempfile::tempdir().unwrap();
    let lora = dir.path().join("own-down.safetensors");
    write_flux_lora_own_down(&lora, &PRESET.shape(), 4, 11).unwrap();
    let mut latents = Vec::new();
    for (layout, model, cond) in models(dir.path()) {
        let (streamed, resident) = streamed_and_resident(&model, &cond, &lora);
        assert_eq!(streamed.report.verified_steps, STEPS as u64, "{layout:?}");
        assert!(streamed.report.tolerance_steps > 0, "{layout:?}");
        latents.push((layout, last_latent(&streamed), last_latent(&resident)));
    }
    let (_, streamed, resident) = &latents[0];
    assert_ne!(streamed, resident, "streamed and resident compute alike");
    for (layout, other_streamed, other_resident) in &latents[1..] {
        assert_eq!(other_resident, resident, "{layout:?}: resident differs");
        assert_eq!(other_streamed, streamed, "{layout:?}: streamed differs");
    }
}

/// Copies the adapter `from` to `to` with one more module, `module`, of zero factors
/// `A [rank, input]`, `B [out, rank]` under the naming's suffixes.
fn with_module(
    from: &Path,
    to: &Path,
    module: &str,
    naming: FluxLoraNaming,
    out: usize,
    input: usize,
) {
    let bytes = std::fs::read(from).unwrap();
    let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let (down, up) = match naming {
        FluxLoraNaming::Kohya => ("lora_down", "lora_up"),
        FluxLoraNaming::Peft => ("lora_A", "lora_B"),
    };
    let rank = 4;
    let extra = [
        (format!("{module}.{down}.weight"), vec![rank, input]),
        (format!("{module}.{up}.weight"), vec![out, rank]),
    ];
    let zeros: Vec<Vec<u8>> = extra
        .iter()
        .map(|(_, shape)| vec![0; shape.iter().product::<usize>() * 4])
        .collect();
    let mut views: Vec<(String, safetensors::tensor::TensorView<'_>)> =
        file.tensors().into_iter().collect();
    for ((name, shape), data) in extra.iter().zip(&zeros) {
        let view =
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data)
                .unwrap();
        views.push((name.clone(), view));
    }
    std::fs::write(to, safetensors::serialize(views, None).unwrap()).unwrap();
}

#[test]
fn a_module_naming_no_weight_of_either_layout_is_refused_by_name() {
    // Proves a module that is no weight of the checkpoint nor of its other layout (a
    // block the model does not have) is refused at open, by name, as bad input (exit
    // 2), whichever naming and layout, and the modules that map are not listed.
    let dir = tempfile::tempdir().unwrap();
    let hidden = PRESET.shape().hidden();
    let stray = PRESET.shape().double_blocks + 5;
    for (layout, naming, module) in [
        (
            Layout::Original,
            FluxLoraNaming::Peft,
            format!("transformer.transformer_blocks.{stray}.attn.to_q"),
        ),
        (
            Layout::Diffusers,
            FluxLoraNaming::Kohya,
            format!("lora_unet_double_blocks_{stray}_img_attn_qkv"),
        ),
    ] {
        let (model, cond) = generated(dir.path(), PRESET, layout, DType::F32);
        let good = dir.path().join(format!("{naming:?}.safetensors"));
        write_flux_lora(&good, &PRESET.shape(), naming, 4, 9).unwrap();
        let bad = dir.path().join(format!("{naming:?}-stray.safetensors"));
        with_module(&good, &bad, &module, naming, 3 * hidden, hidden);
        let message = refusal(&model, &cond, &bad, &module, layout);
        assert!(message.contains("1 of "), "{layout:?}: {message}");
    }
}

/// The one-line bad-input refusal of preparing `model` with the adapter `lora`, which
/// must name `module`.
fn refusal(model: &Path, cond: &Path, lora: &Path, module: &str, layout: Layout) -> String {
    let spec = LoraSpec::parse(&lora.display().to_string()).unwrap();
    let extras = stagehand::run::Extras {
        loras: vec![spec],
        ..stagehand::run::Extras::default()
    }
    .with(input(cond, 1));
    let settings = stagehand::settings::Settings::default();
    let kind = stagehand::run::WorkloadKind::Auto;
    match stagehand::run::prepare_with(model, kind, 1, &settings, false, &extras) {
        Err(RunError::BadRequest { field, message, .. }) => {
            assert_eq!(field, "lora", "{message}");
            assert!(message.contains(module), "{layout:?}: {message}");
            assert!(!message.contains('\n'), "{message}");
            message
        }
        Err(other) => panic!("{layout:?}: not bad input: {other}"),
        Ok(_) => panic!("{layout:?}: {module} was accepted"),
    }
}

#[test]
fn a_stray_block_is_not_read_as_the_top_level_module_its_name_ends_in() {
    // Proves a PEFT module of a single block the model lacks
    // (`single_transformer_blocks.N.proj_out`) is refused as unmatched, by name and
    // with the blocks the model has, in one line and as bad input (exit 2), on either
    // layout: its name is not shortened past the block's number to the final layer's
    // `proj_out` (which gave a shape error about another weight).
    let dir = tempfile::tempdir().unwrap();
    let shape = PRESET.shape();
    let hidden = shape.hidden();
    let stray = shape.single_blocks + 5;
    let module = format!("transformer.single_transformer_blocks.{stray}.proj_out");
    for layout in [Layout::Diffusers, Layout::Original] {
        let (model, cond) = generated(dir.path(), PRESET, layout, DType::F32);
        let good = dir.path().join("peft.safetensors");
        write_flux_lora(&good, &shape, FluxLoraNaming::Peft, 4, 9).unwrap();
        let bad = dir.path().join("peft-stray-proj-out.safetensors");
        with_module(
            &good,
            &bad,
            &module,
            FluxLoraNaming::Peft,
            hidden,
            5 * hidden,
        );
        let last = shape.single_blocks - 1;
        let message = refusal(&model, &cond, &bad, &module, layout);
        assert!(message.contains("1 of "), "{layout:?}: {message}");
        let has = format!(
            "names single_transformer_blocks {stray}, and this model's run from 0 to {last}"
        );
        assert!(message.contains(&has), "{layout:?}: {message}");
        assert!(!message.contains("does not patch"), "{layout:?}: {message}");
    }
}
