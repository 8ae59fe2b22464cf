//! The kernels of one step of a Llama-family decoder, block by block, as
//! `workload::decoder` calls the compute port (`layer.rs`, `experts.rs`, the head in
//! `mod.rs`): what a calibrated profile times for a decoder description.
//!
//! The first step prefills the prompt (all its tokens at once, attention causal over
//! them); every later step decodes one token per sequence, attending over the cache.
//! A decode step's attention is counted at the first decoded token's context (the
//! prompt and one more key): the context grows by one key per step, a few percent of
//! a short run's attention and nothing beside the GEMVs of any real model.

use crate::compute::DType;
use crate::families::llama::DecoderConfig;
use crate::model::ModelIndex;

use crate::compute::work::{ElementOp, Kernel, Work};

/// What one step of the decoder pushes through its blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepShape {
    /// Sequences decoded at once (the description's `tokens_per_step`).
    pub sequences: u64,
    /// New tokens of each sequence: the prompt in the prefill, then 1.
    pub queries: u64,
    /// Tokens already in each sequence's cache.
    pub past: u64,
}

impl StepShape {
    /// The prefill of a `prompt`-token prompt (one sequence, as `run` prefills it).
    pub fn prefill(prompt: u64) -> Self {
        Self {
            sequences: 1,
            queries: prompt,
            past: 0,
        }
    }

    /// A decode step of `sequences` sequences after a `prompt`-token prompt.
    pub fn decode(sequences: u64, prompt: u64) -> Self {
        Self {
            sequences,
            queries: 1,
            past: prompt,
        }
    }

    fn rows(&self) -> u64 {
        self.sequences * self.queries
    }
}

/// The kernels of a decoder's blocks, with each weight's stored dtype read from the
/// checkpoint by its Hugging Face name (the names `workload::decoder` places).
pub struct DecoderWork<'a> {
    pub config: &'a DecoderConfig,
    pub index: &'a ModelIndex,
    /// The token embeddings stay in host memory (untied `lm_head`).
    pub host_table: bool,
}

impl DecoderWork<'_> {
    fn dtype(&self, name: &str) -> DType {
        self.index
            .tensor(name)
            .and_then(|tensor| DType::from_safetensors(&tensor.dtype))
            .unwrap_or(DType::F32)
    }

    fn linear(&self, rows: u64, inner: usize, outer: usize, name: &str) -> Kernel {
        Kernel::Linear {
            rows,
            inner: inner as u64,
            outer: outer as u64,
            dtype: self.dtype(name),
        }
    }

    /// Layer `layer`'s block in one step: attention with its cache update, then the
    /// dense SwiGLU MLP or (Mixtral) the router and the experts it picks — folded into
    /// the layer, as the description holds them. The first layer also carries the
    /// step's input: the prompt's embeddings, or the picked token's.
    pub fn layer(&self, layer: usize, shape: StepShape) -> Work {
        let config = self.config;
        let rows = shape.rows();
        let hidden = config.hidden as u64;
        let at = format!("model.layers.{layer}");
        let element = |op, elements| Kernel::Elementwise { op, elements };
        let mut kernels = Vec::new();
        if layer == 0 {
            kernels.extend(self.step_input(shape));
        }
        kernels.push(element(ElementOp::RmsNorm, rows * hidden));
        for (name, outer) in [
            ("q_proj", config.q_dim()),
            ("k_proj", config.kv_dim()),
            ("v_proj", config.kv_dim()),
        ] {
            kernels.push(self.linear(
                rows,
                config.hidden,
                outer,
                &format!("{at}.self_attn.{name}.weight"),
            ));
        }
        kernels.push(element(ElementOp::Rope, rows * config.q_dim() as u64));
        kernels.push(element(ElementOp::Rope, rows * config.kv_dim() as u64));
        // The new keys and values written into the cache.
        kernels.push(element(ElementOp::Move, 2 * rows * config.kv_dim() as u64));
        kernels.push(Kernel::CachedAttention {
            score_dims: shape.sequences
                * (config.heads * config.head_dim) as u64
                * shape.queries
                * (shape.past + shape.queries),
        });
        kernels.push(self.linear(
            rows,
            config.q_dim(),
            config.hidden,
            &format!("{at}.self_attn.o_proj.weight"),
        ));
        kernels.push(element(ElementOp::Add, rows * hidden));
        kernels.push(element(ElementOp::RmsNorm, rows * hidden));
        match config.experts {
            None => {
                kernels.extend(self.swiglu(
                    rows,
                    &format!("{at}.mlp"),
                    "gate_proj",
                    "up_proj",
                    "down_proj",
                ));
                kernels.push(element(ElementOp::Add, rows * hidden));
            }
            Some(experts) => {
                let count = experts.count as u64;
                kernels.push(self.linear(
                    rows,
                    config.hidden,
                    experts.count,
                    &format!("{at}.block_sparse_moe.gate.weight"),
                ));
                // The router logits read back; the hint reads the hidden state; the
                // mix is zeroed.
                kernels.push(element(ElementOp::Move, rows * count + 2 * rows * hidden));
                // Each expert a token picks runs on every row (rows it did not pick
                // scale by 0): at most top_k per row, and every expert at most once.
                let used = (rows * experts.top_k as u64).min(count);
                for expert in 0..used {
                    let at = format!("{at}.block_sparse_moe.experts.{expert}");
                    kernels.extend(self.swiglu(rows, &at, "w1", "w3", "w2"));
                    kernels.push(element(ElementOp::Add, rows * hidden));
                }
                kernels.push(element(ElementOp::Add, rows * hidden));
            }
        }
        Work { kernels }
    }

    /// `down(silu(gate(x)) · up(x))` of the MLP (or expert) at `at`.
    fn swiglu(&self, rows: u64, at: &str, gate: &str, up: &str, down: &str) -> [Kernel; 4] {
        let (hidden, inner) = (self.config.hidden, self.config.intermediate);
        [
            self.linear(rows, hidden, inner, &format!("{at}.{gate}.weight")),
            self.linear(rows, hidden, inner, &format!("{at}.{up}.weight")),
            Kernel::Elementwise {
                op: ElementOp::SiluMul,
                elements: rows * inner as u64,
            },
            self.linear(rows, inner, hidden, &format!("{at}.{down}.weight")),
        ]
    }

    /// The step's input rows: the prompt's embeddings (gathered from the host table
    /// and written, or zeroed and gathered on the device from the tied table), or the
    /// picked token's embedding copied in.
    fn step_input(&self, shape: StepShape) -> Vec<Kernel> {
        let values = shape.rows() * self.config.hidden as u64;
        let mut kernels = vec![Kernel::Elementwise {
            op: ElementOp::Move,
            elements: values,
        }];
        if shape.past == 0 && !self.host_table {
            kernels.push(Kernel::Elementwise {
                op: ElementOp::Gather,
                elements: values,
            });
        }
        kernels
    }

    /// The head: the final norm on each sequence's last position, `lm_head` over the
    /// vocabulary, the logits read back, and the next token's embedding (gathered
    /// on the device from a tied table, else written from the host table).
    pub fn head(&self, shape: StepShape) -> Work {
        let config = self.config;
        let rows = shape.sequences;
        let hidden = config.hidden as u64;
        let head_name = if config.tie_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        let element = |op, elements| Kernel::Elementwise { op, elements };
        let mut kernels = vec![
            element(ElementOp::Move, rows * hidden),
            element(ElementOp::RmsNorm, rows * hidden),
            self.linear(rows, config.hidden, config.vocab, head_name),
            element(ElementOp::Move, rows * config.vocab as u64 + rows * hidden),
        ];
        if !self.host_table {
            kernels.push(element(ElementOp::Gather, rows * hidden));
        }
        Work { kernels }
    }
}
