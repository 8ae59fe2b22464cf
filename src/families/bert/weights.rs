//! Where a BERT encoder's weights are: found by their Hugging Face names (with or
//! without the `bert.` / `roberta.` prefix of `BertFor*` / `RobertaFor*` checkpoints, `LayerNorm.weight` or the
//! older `LayerNorm.gamma`), checked against `config.json`, and placed as blocks — the
//! embeddings, then one block per encoder layer. The pooler and `position_ids` are not
//! used by a sentence embedding and are left out.

use crate::compute::TensorSlot;
use crate::families::placement::{Placement, PlacementBuilder};
use crate::families::FamilyError;
use crate::model::ModelIndex;

use super::config::BertConfig;

/// A linear layer: `[out, in]` weight and `[out]` bias.
#[derive(Debug, Clone, Copy)]
pub struct Linear {
    pub weight: TensorSlot,
    pub bias: TensorSlot,
}

/// A LayerNorm's weight and bias.
#[derive(Debug, Clone, Copy)]
pub struct Norm {
    pub weight: TensorSlot,
    pub bias: TensorSlot,
}

#[derive(Debug, Clone, Copy)]
pub struct LayerSlots {
    pub query: Linear,
    pub key: Linear,
    pub value: Linear,
    pub attention_out: Linear,
    pub attention_norm: Norm,
    pub intermediate: Linear,
    pub output: Linear,
    pub output_norm: Norm,
}

#[derive(Debug, Clone, Copy)]
pub struct EmbeddingSlots {
    /// The word table, when it streams with the embeddings block.
    pub word: Option<TensorSlot>,
    pub position: TensorSlot,
    pub token_type: TensorSlot,
    pub norm: Norm,
}

/// The encoder's weights, placed.
pub struct EncoderWeights {
    pub placement: Placement,
    pub embeddings: EmbeddingSlots,
    pub layers: Vec<LayerSlots>,
    /// The word table's tensor in the index (read to the host when it does not stream).
    pub word_tensor: usize,
}

/// Looks tensors up by Hugging Face name under the checkpoint's prefix.
struct Names<'i> {
    index: &'i ModelIndex,
    prefix: &'static str,
}

impl Names<'_> {
    fn new<'i>(index: &'i ModelIndex, config: &BertConfig) -> Names<'i> {
        let prefix = ["", config.variant.prefix()]
            .into_iter()
            .find(|prefix| {
                index
                    .tensor(&format!("{prefix}embeddings.word_embeddings.weight"))
                    .is_some()
            })
            .unwrap_or("");
        Names { index, prefix }
    }

    /// The full name of `name`, trying LayerNorm's old `gamma`/`beta` spelling too.
    fn full(&self, name: &str) -> String {
        let full = format!("{}{name}", self.prefix);
        if self.index.tensor(&full).is_some() {
            return full;
        }
        let old = full
            .replace("LayerNorm.weight", "LayerNorm.gamma")
            .replace("LayerNorm.bias", "LayerNorm.beta");
        if self.index.tensor(&old).is_some() {
            old
        } else {
            full
        }
    }
}

struct Placer<'i> {
    names: Names<'i>,
    builder: PlacementBuilder<'i>,
}

impl Placer<'_> {
    fn add(&mut self, name: &str, shape: &[usize]) -> Result<usize, FamilyError> {
        self.builder.add(&self.names.full(name), shape)
    }

    fn linear(&mut self, name: &str, out: usize, input: usize) -> Result<[usize; 2], FamilyError> {
        Ok([
            self.add(&format!("{name}.weight"), &[out, input])?,
            self.add(&format!("{name}.bias"), &[out])?,
        ])
    }

    fn norm(&mut self, name: &str, width: usize) -> Result<[usize; 2], FamilyError> {
        Ok([
            self.add(&format!("{name}.weight"), &[width])?,
            self.add(&format!("{name}.bias"), &[width])?,
        ])
    }

    /// Encoder layer `layer` as a block of its own: its eight (weight, bias) pairs in
    /// [`LayerSlots`]' order.
    fn layer(&mut self, layer: usize, config: &BertConfig) -> Result<[[usize; 2]; 8], FamilyError> {
        let (hidden, intermediate) = (config.hidden, config.intermediate);
        let at = format!("encoder.layer.{layer}");
        self.builder.block(at.clone());
        Ok([
            self.linear(&format!("{at}.attention.self.query"), hidden, hidden)?,
            self.linear(&format!("{at}.attention.self.key"), hidden, hidden)?,
            self.linear(&format!("{at}.attention.self.value"), hidden, hidden)?,
            self.linear(&format!("{at}.attention.output.dense"), hidden, hidden)?,
            self.norm(&format!("{at}.attention.output.LayerNorm"), hidden)?,
            self.linear(&format!("{at}.intermediate.dense"), intermediate, hidden)?,
            self.linear(&format!("{at}.output.dense"), hidden, intermediate)?,
            self.norm(&format!("{at}.output.LayerNorm"), hidden)?,
        ])
    }
}

impl EncoderWeights {
    /// Finds and places every tensor; `word_streams` puts the word table in the
    /// embeddings block.
    pub fn place(
        index: &ModelIndex,
        config: &BertConfig,
        word_streams: bool,
    ) -> Result<Self, FamilyError> {
        let hidden = config.hidden;
        let mut placer = Placer {
            names: Names::new(index, config),
            builder: PlacementBuilder::new(index),
        };
        placer.builder.block("embeddings");
        let word_name = placer.names.full("embeddings.word_embeddings.weight");
        let word_tensor = index
            .tensors
            .iter()
            .position(|tensor| tensor.name == word_name)
            .ok_or_else(|| {
                FamilyError::missing_tensor(
                    &index.path,
                    &word_name,
                    format!(
                        "{}: tensor `{word_name}` is missing; is this a BERT checkpoint?",
                        index.path.display()
                    ),
                )
            })?;
        let word = if word_streams {
            Some(placer.add("embeddings.word_embeddings.weight", &[config.vocab, hidden])?)
        } else {
            check_shape(index, word_tensor, &[config.vocab, hidden])?;
            None
        };
        let position = placer.add(
            "embeddings.position_embeddings.weight",
            &[config.max_positions, hidden],
        )?;
        let token_type = placer.add(
            "embeddings.token_type_embeddings.weight",
            &[config.type_vocab, hidden],
        )?;
        let embedding_norm = placer.norm("embeddings.LayerNorm", hidden)?;
        let layer_tensors = (0..config.layers)
            .map(|layer| placer.layer(layer, config))
            .collect::<Result<Vec<_>, FamilyError>>()?;
        let placement = placer.builder.finish();
        let slot = |tensor: usize| -> Result<TensorSlot, FamilyError> {
            placement
                .slot_of(tensor)
                .map(|(_, slot)| slot)
                .ok_or_else(|| FamilyError::internal(format!("tensor {tensor} was not placed")))
        };
        let pair = |[weight, bias]: [usize; 2]| -> Result<Linear, FamilyError> {
            Ok(Linear {
                weight: slot(weight)?,
                bias: slot(bias)?,
            })
        };
        let norm = |tensors: [usize; 2]| {
            pair(tensors).map(|linear| Norm {
                weight: linear.weight,
                bias: linear.bias,
            })
        };
        let embeddings = EmbeddingSlots {
            word: word.map(slot).transpose()?,
            position: slot(position)?,
            token_type: slot(token_type)?,
            norm: norm(embedding_norm)?,
        };
        let layers = layer_tensors
            .into_iter()
            .map(|[query, key, value, attention_out, attention_norm, intermediate, output, output_norm]| {
                Ok(LayerSlots {
                    query: pair(query)?,
                    key: pair(key)?,
                    value: pair(value)?,
                    attention_out: pair(attention_out)?,
                    attention_norm: norm(attention_norm)?,
                    intermediate: pair(intermediate)?,
                    output: pair(output)?,
                    output_norm: norm(output_norm)?,
                })
            })
            .collect::<Result<_, FamilyError>>()?;
        Ok(Self {
            placement,
            embeddings,
            layers,
            word_tensor,
        })
    }
}

fn check_shape(index: &ModelIndex, tensor: usize, shape: &[usize]) -> Result<(), FamilyError> {
    let info = &index.tensors[tensor];
    if info.shape != shape {
        return Err(FamilyError::tensor_shape(
            &index.path,
            &info.name,
            (shape, &info.shape),
            format!(
                "{}: tensor `{}` has shape {:?}, but config.json implies {shape:?}",
                index.path.display(),
                info.name,
                info.shape
            ),
        ));
    }
    if crate::compute::DType::float_from_safetensors(&info.dtype).is_none() {
        return Err(FamilyError::tensor_dtype(
            &index.path,
            &info.name,
            &info.dtype,
            format!(
                "{}: tensor `{}` is {}; stagehand computes with F32, F16 and BF16 weights",
                index.path.display(),
                info.name,
                info.dtype
            ),
        ));
    }
    Ok(())
}
