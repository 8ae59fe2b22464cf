//! The kernels of one step of a BERT encoder, block by block, as
//! `workload::encoder` calls the compute port: what a calibrated profile times for
//! an encoder description.
//!
//! Attention is counted over the padded length, as both backends compute it (the
//! padding mask only hides the padded keys from the softmax).

use crate::compute::DType;
use crate::families::bert::BertConfig;
use crate::model::ModelIndex;

use crate::compute::work::{ElementOp, Kernel, Work};

/// The kernels of an encoder's blocks for batches of `sequences` × `length` tokens,
/// with each weight's stored dtype read from the checkpoint by its Hugging Face name
/// (with or without the `bert.` prefix).
pub struct EncoderWork<'a> {
    pub config: &'a BertConfig,
    pub index: &'a ModelIndex,
    pub sequences: u64,
    /// Tokens per sequence, padding included.
    pub length: u64,
    /// The word table streams with the embeddings block (the gather runs on the
    /// device) instead of staying in host memory.
    pub word_streams: bool,
}

impl EncoderWork<'_> {
    fn rows(&self) -> u64 {
        self.sequences * self.length
    }

    fn dtype(&self, name: &str) -> DType {
        self.index
            .tensor(name)
            .or_else(|| self.index.tensor(&format!("bert.{name}")))
            .and_then(|tensor| DType::from_safetensors(&tensor.dtype))
            .unwrap_or(DType::F32)
    }

    fn linear(&self, inner: usize, outer: usize, name: &str) -> Kernel {
        Kernel::Linear {
            rows: self.rows(),
            inner: inner as u64,
            outer: outer as u64,
            dtype: self.dtype(&format!("{name}.weight")),
        }
    }

    fn element(&self, op: ElementOp, width: usize) -> Kernel {
        Kernel::Elementwise {
            op,
            elements: self.rows() * width as u64,
        }
    }

    /// The embeddings block: the word rows written (gathered from the host table, or
    /// zeros before the device gathers them), the position and token-type rows
    /// gathered onto them, and their LayerNorm.
    pub fn embeddings(&self) -> Work {
        let hidden = self.config.hidden;
        let mut kernels = vec![self.element(ElementOp::Move, hidden)];
        if self.word_streams {
            kernels.push(self.element(ElementOp::Gather, hidden));
        }
        kernels.extend([
            self.element(ElementOp::Gather, hidden),
            self.element(ElementOp::Gather, hidden),
            self.element(ElementOp::LayerNorm, hidden),
        ]);
        Work { kernels }
    }

    /// Encoder layer `layer`: the Q/K/V GEMMs, attention, the output GEMM, residual
    /// and LayerNorm, the GELU MLP, residual and LayerNorm. The last layer's states
    /// are read back for pooling.
    pub fn layer(&self, layer: usize) -> Work {
        let config = self.config;
        let (hidden, inner) = (config.hidden, config.intermediate);
        let at = format!("encoder.layer.{layer}");
        let mut kernels = vec![
            self.linear(hidden, hidden, &format!("{at}.attention.self.query")),
            self.linear(hidden, hidden, &format!("{at}.attention.self.key")),
            self.linear(hidden, hidden, &format!("{at}.attention.self.value")),
            Kernel::Attention {
                score_dims: self.sequences
                    * (config.heads * config.head_dim()) as u64
                    * self.length
                    * self.length,
            },
            self.linear(hidden, hidden, &format!("{at}.attention.output.dense")),
            self.element(ElementOp::Add, hidden),
            self.element(ElementOp::LayerNorm, hidden),
            self.linear(hidden, inner, &format!("{at}.intermediate.dense")),
            self.element(ElementOp::GeluErf, inner),
            self.linear(inner, hidden, &format!("{at}.output.dense")),
            self.element(ElementOp::Add, hidden),
            self.element(ElementOp::LayerNorm, hidden),
        ];
        if layer + 1 == config.layers {
            kernels.push(self.element(ElementOp::Move, hidden));
        }
        Work { kernels }
    }
}
