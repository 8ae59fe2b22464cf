//! Llama-family decoders (`llama`, `mistral`, `qwen2`, `qwen3`, and the mixtures of
//! experts `mixtral`, `qwen2_moe`, `qwen3_moe`), written once against the compute
//! port: the variants differ in what `config.json` turns on (biases, Qwen3's per-head
//! q/k norms, experts and Qwen2-MoE's shared expert), not in their layer code.
//!
//! Step 0 prefills the prompt; every later step decodes one token. A layer is RMSNorm,
//! grouped-query attention with rotary positions over the layer's KV cache (causal),
//! the output projection and residual, RMSNorm, then the SwiGLU MLP (or the router's
//! top-k experts, each acquired as its own block through the expert cache) and
//! residual. The head applies the final RMSNorm to the last position and `lm_head`;
//! the step's output is those logits, and the next token is picked from them (greedy,
//! or seeded temperature/top-p sampling).
//!
//! The KV cache lives on the device, grown in pages reserved through the session's
//! activation path: when the budget is full, resident weights give way (by
//! max-scatter priority) and stream from then on. A cache that cannot fit at all
//! stops the run with the token count reached.
//!
//! Token embeddings: with an untied `lm_head`, the table stays in host memory and only
//! the tokens' rows go to the device (as for encoders). With tied embeddings the table
//! is `lm_head` itself, in the head block: the next token's row is gathered on the
//! device while the head is held, at the end of the step that picked it.

mod batch;
mod config;
mod demo;
mod experts;
mod input;
mod keys;
mod layer;
mod open;
mod rope;
mod sampling;
mod stack;
mod weights;
mod window;

use stagehand_actors::BlockId;

pub use batch::BatchSequence;
pub use config::{Biases, DecoderConfig, ExpertNames, Experts, Variant, DECODER_FAMILIES};
pub use demo::{
    write_decoder_folder, DecoderArch, DecoderDemo, DecoderPreset, DecoderShape, MoeShape,
};
pub use experts::{route, ExpertHint};
pub use input::{DecoderInput, PromptInput, BUILT_IN_PROMPT};
pub use keys::NO_MATH;
pub use rope::{Rope, RopeKind};
pub use sampling::{argmax, Sampling};
pub use window::SlidingWindow;

use self::weights::DecoderWeights;
use super::blocks::{Blocks, Held};
use super::family::{Decoded, Family, StepOutput};
use super::host_table::HostTable;
use super::lora_set::LoraSet;
use super::FamilyError;
use crate::compute::{Compute, TensorSlot};
use crate::model::ModelIndex;

/// Tokens per KV-cache page: the cache grows (and is reserved) a page at a time.
pub const KV_PAGE_TOKENS: usize = 64;

pub struct Decoder {
    pub config: DecoderConfig,
    weights: DecoderWeights,
    pub prompt: Vec<u32>,
    pub sampling: Sampling,
    host_table: Option<HostTable>,
    pub hint: ExpertHint,
    /// MoE: the expert cache's policy, and its slots (`None`: what the budget leaves).
    pub expert_policy: stagehand_actors::ExpertPolicy,
    pub expert_slots: Option<u32>,
    /// MoE, for the next-layer hint: per layer, its post-attention norm and router
    /// widened to f32 in host memory (`None` for a dense layer).
    host_routers: Vec<Option<experts::HostRouter>>,
}

/// The gate and up activations of one SwiGLU width.
struct MlpScratch<C: Compute> {
    gate: C::Tensor,
    up: C::Tensor,
}

/// Activations of one row count.
struct Activations<C: Compute> {
    x: C::Tensor,
    normed: C::Tensor,
    q: C::Tensor,
    k: C::Tensor,
    v: C::Tensor,
    attended: C::Tensor,
    out: C::Tensor,
    /// The dense MLP's, an expert's and the shared expert's widths.
    dense: MlpScratch<C>,
    expert: MlpScratch<C>,
    shared: MlpScratch<C>,
    mixed: C::Tensor,
    router: C::Tensor,
    /// The shared expert's gate logit, `[rows, 1]`.
    shared_gate: C::Tensor,
    low_rank: C::Tensor,
}

pub struct DecoderState<C: Compute> {
    rows: usize,
    acts: Option<Activations<C>>,
    /// The embedding of the token fed next, `[1, hidden]`.
    next: C::Tensor,
    last: C::Tensor,
    last_normed: C::Tensor,
    logits: C::Tensor,
    k_cache: Vec<C::Tensor>,
    v_cache: Vec<C::Tensor>,
    /// Tokens the caches have room for, and tokens in them.
    capacity: usize,
    position: usize,
    next_token: u32,
    rng: u64,
    zeros: Vec<f32>,
    /// The rotary frequencies of this step (dynamic scaling recomputes them).
    inv_freq: Vec<f32>,
    /// MoE: the expert blocks the last hint asked for (those of the next MoE layer).
    hinted: Vec<BlockId>,
}

impl Decoder {
    /// A decoder over `index`. `headers_only`: read no tensor data (the host copies of
    /// the embedding table and the routers), for a description of the model that will
    /// not run.
    pub fn new(
        index: &ModelIndex,
        config: DecoderConfig,
        prompt: Vec<u32>,
        sampling: Sampling,
        headers_only: bool,
    ) -> Result<Self, FamilyError> {
        if prompt.is_empty() {
            return Err(FamilyError::request(
                "prompt",
                "the prompt has no tokens".into(),
            ));
        }
        if let Some(refusal) = config.refuse_sequence(prompt.len()) {
            return Err(FamilyError::request(
                "prompt",
                format!("the prompt: {refusal}"),
            ));
        }
        if let Some(&id) = prompt.iter().find(|&&id| id as usize >= config.vocab) {
            return Err(FamilyError::request(
                "prompt",
                format!(
                    "prompt token id {id} is outside the vocabulary of {}",
                    config.vocab
                ),
            ));
        }
        sampling
            .validate()
            .map_err(|message| FamilyError::request("sampling", message))?;
        let weights = DecoderWeights::place(index, &config)?;
        let host_table = match (config.tie_embeddings, headers_only) {
            (true, _) => None,
            (false, true) => Some(HostTable::described(index, weights.embed_tensor)?),
            (false, false) => Some(HostTable::read(index, weights.embed_tensor)?),
        };
        let host_routers = experts::host_routers(index, &config, headers_only)?;
        Ok(Self {
            config,
            weights,
            prompt,
            sampling,
            host_table,
            hint: ExpertHint::NextLayer,
            expert_policy: stagehand_actors::ExpertPolicy::default(),
            expert_slots: None,
            host_routers,
        })
    }

    /// Blocks of the layout: layers, the head, then experts.
    pub fn layout_len(&self) -> usize {
        self.weights.placement.layout.len()
    }

    /// Where a tensor of the index sits, for LoRA targets.
    pub fn place(&self, tensor: usize) -> Option<(usize, TensorSlot)> {
        self.weights.placement.slot_of(tensor)
    }

    /// Bytes of embedding table kept in host memory (0 when tied).
    pub fn host_table_bytes(&self) -> u64 {
        self.host_table.as_ref().map_or(0, HostTable::bytes)
    }

    /// KV-cache bytes per token (keys and values of every layer, f32).
    pub fn kv_bytes_per_token(&self) -> u64 {
        self.config.kv_bytes_per_token()
    }

    /// The KV-page bytes `state` holds through the activation path: what a sequence
    /// gives back when it leaves, however its steps ended (a step that failed after
    /// its pages were reserved still holds them).
    pub fn kv_reserved_bytes<C: Compute>(&self, state: &DecoderState<C>) -> u64 {
        state.capacity as u64 * self.kv_bytes_per_token()
    }

    /// The expert cache's slot size (one expert's bytes), for MoE models.
    pub fn expert_bytes(&self) -> Option<u64> {
        let experts = self.config.experts.as_ref()?;
        let layer = experts.sparse_layers().next()?;
        let block = self.weights.expert_block(layer, 0)?;
        self.weights
            .placement
            .layout
            .block(BlockId(block))
            .map(|block| block.bytes)
    }

    /// Bytes of the dense blocks (layers and head): what every token streams.
    pub fn dense_bytes(&self) -> u64 {
        let layout = &self.weights.placement.layout;
        (0..=self.weights.head_block())
            .filter_map(|block| layout.block(BlockId(block)))
            .map(|block| block.bytes)
            .sum()
    }

    /// The experts of layer `layer`, as block ids (none for a dense layer).
    pub fn expert_blocks(&self, layer: usize) -> Vec<BlockId> {
        let count = self
            .config
            .experts
            .as_ref()
            .map_or(0, |experts| experts.count);
        (0..count)
            .filter_map(|expert| self.weights.expert_block(layer, expert).map(BlockId))
            .collect()
    }

    /// Floating-point operations of one decode step (one token) in its GEMMs: the
    /// projections, each layer's dense MLP or router, top-k experts and shared expert
    /// with its gate, and `lm_head`. Attention's sequence-length term is left out.
    pub fn flops_per_token(&self) -> f64 {
        let config = &self.config;
        let hidden = config.hidden as f64;
        let attention = 2.0 * hidden * (2 * config.q_dim() + 2 * config.kv_dim()) as f64;
        let swiglu = |inner: usize| 2.0 * 3.0 * hidden * inner as f64;
        let ffn = |layer: usize| match &config.experts {
            Some(experts) if config.is_sparse(layer) => {
                let shared = experts
                    .shared_intermediate
                    .map_or(0.0, |inner| swiglu(inner) + 2.0 * hidden);
                2.0 * hidden * experts.count as f64
                    + experts.top_k as f64 * swiglu(experts.intermediate)
                    + shared
            }
            _ => swiglu(config.intermediate),
        };
        let layers: f64 = (0..config.layers).map(|layer| attention + ffn(layer)).sum();
        layers + 2.0 * hidden * config.vocab as f64
    }

    fn activations<C: Compute>(
        &self,
        compute: &C,
        rows: usize,
    ) -> Result<Activations<C>, FamilyError> {
        let config = &self.config;
        let experts = config.experts.as_ref();
        let has_dense = (0..config.layers).any(|layer| !config.is_sparse(layer));
        // Widths a model never uses get one column, not a full activation.
        let scratch = |width: Option<usize>| -> Result<MlpScratch<C>, FamilyError> {
            let width = width.unwrap_or(1);
            Ok(MlpScratch {
                gate: compute.tensor(rows, width)?,
                up: compute.tensor(rows, width)?,
            })
        };
        Ok(Activations {
            x: compute.tensor(rows, config.hidden)?,
            normed: compute.tensor(rows, config.hidden)?,
            q: compute.tensor(rows, config.q_dim())?,
            k: compute.tensor(rows, config.kv_dim())?,
            v: compute.tensor(rows, config.kv_dim())?,
            attended: compute.tensor(rows, config.q_dim())?,
            out: compute.tensor(rows, config.hidden)?,
            dense: scratch(has_dense.then_some(config.intermediate))?,
            expert: scratch(experts.map(|experts| experts.intermediate))?,
            shared: scratch(experts.and_then(|experts| experts.shared_intermediate))?,
            mixed: compute.tensor(rows, config.hidden)?,
            router: compute.tensor(rows, experts.map_or(1, |experts| experts.count))?,
            shared_gate: compute.tensor(rows, 1)?,
            low_rank: compute.tensor(rows, 1)?,
        })
    }

    /// Makes room in the KV caches for `tokens` tokens: whole pages, reserved through
    /// the activation path first (resident weights give way when the budget is full).
    fn grow_cache<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        state: &mut DecoderState<C>,
        blocks: &mut B,
        tokens: usize,
        output: &mut StepOutput,
    ) -> Result<(), FamilyError> {
        if tokens <= state.capacity {
            return Ok(());
        }
        let capacity = tokens.div_ceil(KV_PAGE_TOKENS) * KV_PAGE_TOKENS;
        let added = (capacity - state.capacity) as u64 * self.kv_bytes_per_token();
        let gave_way = blocks.reserve_activations(added).map_err(|error| {
            FamilyError::NoRoom(format!(
                "the KV cache does not fit after {} tokens: {} more for the next {} tokens ({error}); lower --max-tokens or raise --vram-budget",
                state.position,
                stagehand_actors::Bytes(added),
                capacity - state.capacity
            ))
        })?;
        let decoded = output.decoded.get_or_insert_with(Decoded::default);
        decoded.kv_evicted.extend(gave_way);
        decoded.kv_reserved_bytes = added;
        // The state owns the reservation from here on ([`Decoder::kv_reserved_bytes`]),
        // whatever becomes of this step: a sequence gives back what its state holds.
        state.capacity = capacity;
        for cache in state.k_cache.iter_mut().chain(state.v_cache.iter_mut()) {
            compute.resize_rows(cache, capacity)?;
        }
        Ok(())
    }

    /// The final norm on the last position, `lm_head`, the next token (picked as
    /// `sampling` says), and its embedding for the next step.
    fn head<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        state: &mut DecoderState<C>,
        blocks: &mut B,
        sampling: &Sampling,
    ) -> Result<Vec<f32>, FamilyError> {
        let held = blocks.acquire(compute, BlockId(self.weights.head_block()))?;
        let lora = blocks.lora();
        let outcome = self.head_held(compute, state, &held, lora, sampling);
        blocks.release(compute, held)?;
        let logits = outcome?;
        self.next_row(compute, state)?;
        Ok(logits)
    }

    /// [`Decoder::head`] while the head block is held: the logits and the next token
    /// (with tied embeddings, its row gathered from `lm_head` into `next`).
    fn head_held<C: Compute>(
        &self,
        compute: &C,
        state: &mut DecoderState<C>,
        held: &Held<C::Block>,
        lora: Option<&LoraSet>,
        sampling: &Sampling,
    ) -> Result<Vec<f32>, FamilyError> {
        let view = held.view(compute);
        let head = self.weights.head;
        let acts = state.acts.as_mut().ok_or_else(unallocated)?;
        compute.slice_rows(&acts.x, state.rows - 1, &mut state.last)?;
        compute.rms_norm(
            &state.last,
            Some(&view.weight(&head.norm)?),
            self.config.rms_eps,
            &mut state.last_normed,
        )?;
        Self::project(
            compute,
            held,
            lora,
            &head.lm_head,
            None,
            &state.last_normed,
            &mut state.logits,
            &mut acts.low_rank,
        )?;
        let logits = compute.read(&state.logits)?;
        let token = sampling.pick(&logits, &mut state.rng);
        state.next_token = token;
        if self.host_table.is_none() {
            compute.write(&mut state.next, &state.zeros)?;
            compute.gather_add(&view.weight(&head.lm_head)?, &[token], &mut state.next)?;
        }
        Ok(logits)
    }

    /// With an untied `lm_head`, the next token's row from the host table into `next`.
    fn next_row<C: Compute>(
        &self,
        compute: &C,
        state: &mut DecoderState<C>,
    ) -> Result<(), FamilyError> {
        if let Some(table) = &self.host_table {
            let mut row = Vec::new();
            table.gather(&[state.next_token], &mut row)?;
            compute.write(&mut state.next, &row)?;
        }
        Ok(())
    }

    /// The prompt's embeddings into `x` (step 0).
    fn embed_prompt<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        state: &mut DecoderState<C>,
        blocks: &mut B,
        prompt: &[u32],
    ) -> Result<(), FamilyError> {
        let acts = state.acts.as_mut().ok_or_else(unallocated)?;
        if let Some(table) = &self.host_table {
            let mut rows = Vec::new();
            table.gather(prompt, &mut rows)?;
            compute.write(&mut acts.x, &rows)?;
            return Ok(());
        }
        let held = blocks.acquire(compute, BlockId(self.weights.head_block()))?;
        let outcome = (|| {
            let view = held.view(compute);
            let zeros = vec![0.0; prompt.len() * self.config.hidden];
            compute.write(&mut acts.x, &zeros)?;
            compute.gather_add(
                &view.weight(&self.weights.head.lm_head)?,
                prompt,
                &mut acts.x,
            )?;
            Ok::<_, FamilyError>(())
        })();
        blocks.release(compute, held)?;
        outcome
    }
}

fn unallocated() -> FamilyError {
    FamilyError::internal("activations were not allocated".into())
}

impl Family for Decoder {
    type State<C: Compute> = DecoderState<C>;

    fn start<C: Compute>(&self, compute: &C) -> Result<DecoderState<C>, FamilyError> {
        let config = &self.config;
        let empty = |compute: &C| compute.tensor(0, config.kv_dim());
        Ok(DecoderState {
            rows: 0,
            acts: None,
            next: compute.tensor(1, config.hidden)?,
            last: compute.tensor(1, config.hidden)?,
            last_normed: compute.tensor(1, config.hidden)?,
            logits: compute.tensor(1, config.vocab)?,
            k_cache: (0..config.layers)
                .map(|_| empty(compute))
                .collect::<Result<_, _>>()?,
            v_cache: (0..config.layers)
                .map(|_| empty(compute))
                .collect::<Result<_, _>>()?,
            capacity: 0,
            position: 0,
            next_token: 0,
            rng: self.sampling.seed,
            zeros: vec![0.0; config.hidden],
            inv_freq: config.rope.inv_freq(self.prompt.len()),
            hinted: Vec::new(),
        })
    }

    fn step<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        state: &mut DecoderState<C>,
        blocks: &mut B,
        step: u64,
    ) -> Result<StepOutput, FamilyError> {
        let mut output = StepOutput::default();
        let positions =
            self.begin_sequence(compute, state, blocks, step, &self.prompt, &mut output)?;
        for layer in 0..self.config.layers {
            self.layer(compute, state, blocks, layer, &positions, step, &mut output)?;
        }
        let logits = self.head(compute, state, blocks, &self.sampling)?;
        self.finish_sequence(state, positions.len(), logits, &mut output);
        Ok(output)
    }
}
