//! The families stagehand computes, listed once (`families!` at the end of this
//! file), and how a checkpoint finds its family.
//!
//! Each family implements [`Open`] beside [`Family`]: what it is called, which kind
//! of work it is, which `config.json` `model_type`s (or `architectures`) it computes,
//! and how it opens a checkpoint with the run's inputs. The registry line turns that
//! into a [`Model`] variant, the dispatch of [`Model::facts`] and [`Model::visit`],
//! and an entry of [`REGISTRY`]: adding a family is its folder and one line here.

use std::path::Path;

use super::activations::{DescribedReserve, DescribedWorkload};
use super::family::{Facts, Family};
use super::inputs::{Extras, WorkloadKind};
use super::FamilyError;
use crate::model::{ModelFolder, ModelIndex};

/// What a family sees of a checkpoint when asked whether it is one of its own.
pub struct Found<'a> {
    pub index: &'a ModelIndex,
    /// The Hugging Face folder around the checkpoint; `None`: a bare checkpoint.
    pub folder: Option<&'a ModelFolder>,
}

impl Found<'_> {
    /// `config.json` `model_type`, if there is a folder and it says.
    pub fn model_type(&self) -> Option<String> {
        self.folder.and_then(ModelFolder::model_type)
    }

    /// The first of `config.json` `architectures`.
    pub fn architecture(&self) -> Option<String> {
        self.folder.and_then(ModelFolder::architecture)
    }

    /// diffusers' `_class_name` of `config.json` (`FluxTransformer2DModel`).
    pub fn class_name(&self) -> Option<&str> {
        self.folder?.config.get("_class_name")?.as_str()
    }
}

/// What a family opens a checkpoint with.
pub struct Request<'a> {
    /// What the user pointed at, for messages.
    pub path: &'a Path,
    pub index: &'a ModelIndex,
    pub folder: Option<&'a ModelFolder>,
    /// Sequences (texts, rows) a step computes at once.
    pub batch: usize,
    pub extras: &'a Extras,
}

impl<'a> Request<'a> {
    /// The folder, or a bad-input error saying that this family needs one.
    pub fn folder(&self, what: &str) -> Result<&'a ModelFolder, FamilyError> {
        self.folder.ok_or_else(|| {
            FamilyError::missing_file(
                self.path,
                format!(
                    "{}: {what} needs its Hugging Face folder (config.json beside the weights)",
                    self.path.display()
                ),
            )
        })
    }
}

/// What one step of a family computes, as the tools that measure and describe steps
/// (bench, validate, simulate) count it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepUnit {
    /// A token for each sequence (decoders): bench measures one row a token, and a
    /// description's tokens per step are sequences decoded together.
    Token,
    /// A batch of inputs (encoders, the generated models): bench measures a row for
    /// each of `--batches`; a description's step is one batch of its tokens.
    Batch,
    /// One denoising step over a fixed input (diffusion transformers): one row.
    Denoise,
    /// Nothing is computed (stream-verify): there is no step to measure or describe.
    Check,
}

impl StepUnit {
    /// What a bench row counts: "token", "batch" or "step".
    pub fn row_name(self) -> &'static str {
        match self {
            StepUnit::Token => "token",
            StepUnit::Batch => "batch",
            StepUnit::Denoise | StepUnit::Check => "step",
        }
    }
}

/// What `serve` answers with a family's models: the endpoints their requests come
/// through. A family declares it; the server asks the registry, never the kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoints {
    /// Not served (the pipeline's parts, the diffusion transformer alone, the
    /// generated models).
    None,
    /// `/v1/embeddings`: a batch of texts a step.
    Embeddings,
    /// `/v1/completions` and, with the folder's chat template, `/v1/chat/completions`:
    /// a token a step for every sequence decoded together.
    Completions,
}

/// Writes a family's generated demo model into a cache folder (once; later calls find
/// it) and returns its path: what `stagehand run --workload KIND` runs without
/// `--model`.
pub type DemoWriter = fn(&Path) -> Result<std::path::PathBuf, crate::model::cache::CacheError>;

/// How a family is found and opened: the registry's side of a family.
pub trait Open: Family + Sized {
    /// The family's name (`llama`, `bert`).
    const NAME: &'static str;
    /// The kind of work it is.
    const KIND: WorkloadKind;
    /// What one of its steps computes, for bench, validate and simulate.
    const STEP: StepUnit;
    /// The endpoints `serve` answers with its models.
    const ENDPOINTS: Endpoints = Endpoints::None;
    /// A generated family's demo model, written on first use (`None`: the family
    /// computes folders people bring).
    const DEMO: Option<DemoWriter> = None;
    /// The `config.json` `model_type`s it computes.
    const MODEL_TYPES: &'static [&'static str] = &[];
    /// Prefixes of `config.json` `architectures` it computes, for configs without a
    /// `model_type` (`BertModel`).
    const ARCHITECTURES: &'static [&'static str] = &[];

    /// Whether this family computes the checkpoint: by default a folder whose
    /// `model_type` (or else first architecture) is one of its own.
    fn recognises(found: &Found<'_>) -> bool {
        if found.folder.is_none() {
            return Self::recognises_bare(found.index);
        }
        if let Some(model_type) = found.model_type() {
            return Self::MODEL_TYPES.contains(&model_type.as_str());
        }
        found.architecture().is_some_and(|architecture| {
            Self::ARCHITECTURES
                .iter()
                .any(|prefix| architecture.starts_with(prefix))
        })
    }

    /// Whether this family computes a checkpoint that came without a `config.json`,
    /// by its tensors' names (ComfyUI's separate files, a part of an all-in-one
    /// checkpoint); by default none.
    fn recognises_bare(_index: &ModelIndex) -> bool {
        false
    }

    /// Values of one activation row of the checkpoint, when a batch's activations
    /// scale with it: the run checks `batch ×` that against the host's memory before
    /// the family is opened (and allocates its input).
    fn activation_row_values(found: &Found<'_>) -> Option<u64> {
        let _ = found;
        None
    }

    /// Puts the input of a measured step of `batch` inputs into `extras` (bench and
    /// validate measure steps without a user's input): by default the family's own
    /// built-in input, which `open` takes when `extras` names none.
    fn measured_input(batch: usize, extras: &mut Extras) {
        let _ = (batch, extras);
    }

    /// The batch of one step of `tokens_per_step` tokens as `simulate --model`
    /// describes it from headers only, with that step's input put into `extras`;
    /// `None`: the family is not described from its own steps (its checkpoint is).
    fn described_step(
        found: &Found<'_>,
        tokens_per_step: u64,
        extras: &mut Extras,
    ) -> Result<Option<usize>, FamilyError> {
        let _ = (found, tokens_per_step, extras);
        Ok(None)
    }

    /// What a step of a model with this `config.json` reserves beside the weights at
    /// `workload`, from the config alone (a shipped model description states its
    /// activations so, computed by the code `simulate --model` uses on a checkpoint);
    /// `None`: the family reserves nothing it could compute without the weights.
    fn described_reserve(
        config: &serde_json::Value,
        workload: &DescribedWorkload,
    ) -> Result<Option<DescribedReserve>, FamilyError> {
        let _ = (config, workload);
        Ok(None)
    }

    /// The family over the checkpoint, with the run's inputs. Errors are the user's:
    /// a missing tensor, a shape or config that disagrees, a prompt out of range.
    fn open(request: &Request<'_>) -> Result<Self, FamilyError>;
}

/// Generic work over whichever family a [`Model`] holds.
pub trait Visit {
    type Output;
    fn visit<F: Family>(self, family: &F) -> Self::Output;
}

/// One line of the registry.
pub struct Entry {
    pub name: &'static str,
    pub kind: WorkloadKind,
    pub step: StepUnit,
    pub endpoints: Endpoints,
    pub demo: Option<DemoWriter>,
    pub model_types: &'static [&'static str],
    recognises: fn(&Found<'_>) -> bool,
    row_values: fn(&Found<'_>) -> Option<u64>,
    measured_input: fn(usize, &mut Extras),
    described_step: fn(&Found<'_>, u64, &mut Extras) -> Result<Option<usize>, FamilyError>,
    described_reserve: ReserveFn,
    open: fn(&Request<'_>) -> Result<Model, FamilyError>,
}

impl Entry {
    pub fn recognises(&self, found: &Found<'_>) -> bool {
        (self.recognises)(found)
    }

    /// See [`Open::activation_row_values`].
    pub fn activation_row_values(&self, found: &Found<'_>) -> Option<u64> {
        (self.row_values)(found)
    }

    /// See [`Open::measured_input`].
    pub fn measured_input(&self, batch: usize, extras: &mut Extras) {
        (self.measured_input)(batch, extras);
    }

    /// See [`Open::described_step`].
    pub fn described_step(
        &self,
        found: &Found<'_>,
        tokens_per_step: u64,
        extras: &mut Extras,
    ) -> Result<Option<usize>, FamilyError> {
        (self.described_step)(found, tokens_per_step, extras)
    }

    /// See [`Open::described_reserve`].
    pub fn described_reserve(
        &self,
        config: &serde_json::Value,
        workload: &DescribedWorkload,
    ) -> Result<Option<DescribedReserve>, FamilyError> {
        (self.described_reserve)(config, workload)
    }

    pub fn open(&self, request: &Request<'_>) -> Result<Model, FamilyError> {
        (self.open)(request)
    }
}

/// [`Open::described_reserve`] of a registry line.
type ReserveFn =
    fn(&serde_json::Value, &DescribedWorkload) -> Result<Option<DescribedReserve>, FamilyError>;

/// The registry's line of the family called `name` (`flux`, `llama`).
pub fn named(name: &str) -> Option<&'static Entry> {
    REGISTRY.iter().find(|entry| entry.name == name)
}

/// The registry's line of the family of `kind` that no folder declares
/// (linear-stack, moe, stream-verify), for tools that run it by name.
pub fn generated(kind: WorkloadKind) -> Option<&'static Entry> {
    REGISTRY
        .iter()
        .find(|entry| entry.kind == kind && entry.model_types.is_empty())
}

/// The demo model a run of `kind` takes when it names none: the generated family of
/// that kind's own, else the first generated family's (stream-verify checks the
/// linear-stack demo's bytes; a kind that computes folders is refused by `find`).
pub fn demo_writer(kind: WorkloadKind) -> Option<DemoWriter> {
    let own = generated(kind).and_then(|entry| entry.demo);
    own.or_else(|| REGISTRY.iter().find_map(|entry| entry.demo))
}

/// The `model_type`s of every family, for messages.
pub fn supported_model_types() -> Vec<&'static str> {
    REGISTRY
        .iter()
        .flat_map(|entry| entry.model_types.iter().copied())
        .collect()
}

/// The family that computes `found`, as `kind` asks: `Auto` takes the one that
/// recognises the checkpoint; a kind names what the user expects, and a checkpoint of
/// another kind is refused by name.
pub fn find(kind: WorkloadKind, found: &Found<'_>) -> Result<&'static Entry, FamilyError> {
    // Kinds no folder declares (linear-stack, moe, stream-verify) are taken at the
    // user's word; their `open` checks the checkpoint. A family of the kind that
    // recognises the checkpoint comes first: two families of one kind that declare
    // no model_type (Flux and WAN, found by `_class_name`) are told apart so.
    if kind != WorkloadKind::Auto {
        let recognised = REGISTRY
            .iter()
            .find(|entry| entry.kind == kind && entry.recognises(found));
        if let Some(entry) = recognised.or_else(|| generated(kind)) {
            return Ok(entry);
        }
    }
    // A folder two families recognise (a VAE: its decoder, and its encoder asked for
    // by kind) opens as the one of the kind asked, else the first.
    let asked = REGISTRY
        .iter()
        .find(|entry| entry.kind == kind && entry.recognises(found));
    let Some(entry) = asked.or_else(|| REGISTRY.iter().find(|entry| entry.recognises(found)))
    else {
        let model_type = found.model_type();
        return Err(FamilyError::Unsupported {
            path: config_or_path(found),
            message: format!(
                "{}: model_type {} is not a family stagehand computes yet (supported: {}); pass --workload stream-verify to stream and check its bytes without computing",
                config_or_path(found).display(),
                model_type.as_ref().map_or("(none)".to_string(), |kind| format!("\"{kind}\"")),
                supported_model_types().join(", ")
            ),
            found: model_type.unwrap_or_default(),
        });
    };
    if kind == WorkloadKind::Auto || entry.kind == kind {
        return Ok(entry);
    }
    if found.folder.is_none() {
        return Err(FamilyError::missing_file(&found.index.path, format!(
            "{}: no config.json beside the weights, so this is a bare checkpoint; a model family needs its Hugging Face folder (config.json, weights, tokenizer.json)",
            found.index.path.display()
        )));
    }
    Err(FamilyError::Unsupported {
        path: config_or_path(found),
        found: entry.kind.with_article().to_string(),
        message: format!(
            "{}: this is {} model, not {}; use the command for its family (`embed` for encoders, `generate` for decoders)",
            config_or_path(found).display(),
            entry.kind.with_article(),
            kind.with_article()
        ),
    })
}

fn config_or_path(found: &Found<'_>) -> std::path::PathBuf {
    found
        .folder
        .map_or_else(|| found.index.path.clone(), |folder| folder.config_path())
}

/// Lists the families: `Variant => family type`, one line each.
macro_rules! families {
    ($($variant:ident => $family:ty),* $(,)?) => {
        /// A model opened for a run, of any family.
        pub enum Model {
            $($variant(Box<$family>),)*
        }

        impl Model {
            /// What the run and the tools ask about it, whatever its family.
            pub fn facts(&self) -> &dyn Facts {
                match self {
                    $(Model::$variant(family) => &**family,)*
                }
            }

            /// Runs generic work over the family it holds.
            pub fn visit<V: Visit>(&self, visitor: V) -> V::Output {
                match self {
                    $(Model::$variant(family) => visitor.visit(&**family),)*
                }
            }

            /// The registry's name of its family.
            pub fn family_name(&self) -> &'static str {
                match self {
                    $(Model::$variant(_) => <$family as Open>::NAME,)*
                }
            }
        }

        /// Every family, in the order they are asked whether a checkpoint is theirs.
        pub static REGISTRY: &[Entry] = &[
            $(Entry {
                name: <$family as Open>::NAME,
                kind: <$family as Open>::KIND,
                step: <$family as Open>::STEP,
                endpoints: <$family as Open>::ENDPOINTS,
                demo: <$family as Open>::DEMO,
                model_types: <$family as Open>::MODEL_TYPES,
                recognises: <$family as Open>::recognises,
                row_values: <$family as Open>::activation_row_values,
                measured_input: <$family as Open>::measured_input,
                described_step: <$family as Open>::described_step,
                described_reserve: <$family as Open>::described_reserve,
                open: |request| Ok(Model::$variant(Box::new(<$family as Open>::open(request)?))),
            },)*
        ];
    };
}

families! {
    LinearStack => super::linear_stack::LinearStack,
    Moe => super::moe::MoeRun,
    Bert => super::bert::Encoder,
    Llama => super::llama::Decoder,
    Flux => super::flux::Flux,
    Wan => super::wan::Wan,
    Clip => super::clip::ClipText,
    T5 => super::t5::T5Encoder,
    // Before the Flux VAE: a bare WAN VAE file has the diffusers prefixes the Flux
    // VAE knows a bare file by (`decoder.up_blocks.0.`); the WAN VAE's own mark (its
    // RMS norms) is not in a Flux VAE.
    WanVae => super::wan_vae::WanVaeDecoder,
    WanVaeEncoder => super::wan_vae::WanVaeEncoder,
    Vae => super::vae::VaeDecoder,
    VaeEncoder => super::vae::VaeEncoder,
    StreamVerify => super::stream_verify::StreamVerify,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_declare_their_endpoints_and_generated_ones_their_demo() {
        // Proves what serve and `run` ask the registry: the encoder answers
        // embeddings, the decoder completions, the pipeline parts nothing; a run of
        // the MoE kind without a model gets the MoE demo, and a kind with no demo of
        // its own the linear-stack one.
        let endpoints = |name: &str| {
            let entry = REGISTRY.iter().find(|entry| entry.name == name);
            entry.map(|entry| entry.endpoints)
        };
        assert_eq!(endpoints("bert"), Some(Endpoints::Embeddings));
        assert_eq!(endpoints("llama"), Some(Endpoints::Completions));
        for part in ["clip", "t5", "vae", "flux"] {
            assert_eq!(endpoints(part), Some(Endpoints::None), "{part}");
        }
        let moe = generated(WorkloadKind::Moe).and_then(|entry| entry.demo);
        let linear = generated(WorkloadKind::LinearStack).and_then(|entry| entry.demo);
        assert!(moe.is_some() && linear.is_some());
        let same = |a: Option<DemoWriter>, b: Option<DemoWriter>| {
            a.map(|f| f as usize) == b.map(|f| f as usize)
        };
        assert!(same(demo_writer(WorkloadKind::Moe), moe));
        assert!(same(demo_writer(WorkloadKind::StreamVerify), linear));
        assert!(same(demo_writer(WorkloadKind::Auto), linear));
    }
}
