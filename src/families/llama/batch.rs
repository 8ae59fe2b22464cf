//! Several sequences through one step (continuous batching): each block is acquired
//! once and every sequence of the batch runs its part of the layer on it — its own
//! rows, positions, KV cache and sampling — before it is released, so every weight
//! that crosses the bus serves the whole batch. A sequence's arithmetic is exactly
//! that of [`Family::step`] alone (the same kernels on the same rows in the same
//! order), so its tokens are bit for bit those of the sequence run by itself.
//!
//! [`Family::step`]: crate::families::Family::step

use stagehand_actors::BlockId;

use super::{unallocated, Decoder, DecoderState, Sampling};
use crate::compute::Compute;
use crate::families::blocks::Blocks;
use crate::families::family::{Decoded, StepOutput};
use crate::families::FamilyError;

/// One sequence of a batched step.
pub struct BatchSequence<'a, C: Compute> {
    pub state: &'a mut DecoderState<C>,
    /// Its prompt (prefilled at its step 0).
    pub prompt: &'a [u32],
    pub sampling: Sampling,
    /// Its own step: 0 prefills, then one token a step.
    pub step: u64,
}

impl Decoder {
    /// What a step does before the layers: the sequence's length checked, its rotary
    /// frequencies, activations and KV pages, and its input rows into `x`. Returns the
    /// positions of those rows.
    pub(super) fn begin_sequence<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        state: &mut DecoderState<C>,
        blocks: &mut B,
        step: u64,
        prompt: &[u32],
        output: &mut StepOutput,
    ) -> Result<Vec<u32>, FamilyError> {
        let rows = if step == 0 { prompt.len() } else { 1 };
        let length = state.position + rows;
        if let Some(refusal) = self.config.refuse_sequence(length) {
            return Err(FamilyError::Model(format!("{refusal}; lower --max-tokens")));
        }
        if self.config.rope.depends_on_length() {
            state.inv_freq = self.config.rope.inv_freq(length);
        }
        if state.acts.is_none() || state.rows != rows {
            state.acts = Some(self.activations(compute, rows)?);
            state.rows = rows;
        }
        self.grow_cache(compute, state, blocks, state.position + rows, output)?;
        if step == 0 {
            self.embed_prompt(compute, state, blocks, prompt)?;
        } else {
            let acts = state.acts.as_mut().ok_or_else(unallocated)?;
            compute.copy(&state.next, &mut acts.x)?;
        }
        Ok((state.position..state.position + rows)
            .map(|position| position as u32)
            .collect())
    }

    /// What a step does after the head: the position moves on, the token and the KV
    /// cache's size are told.
    pub(super) fn finish_sequence<C: Compute>(
        &self,
        state: &mut DecoderState<C>,
        rows: usize,
        logits: Vec<f32>,
        output: &mut StepOutput,
    ) {
        state.position += rows;
        let decoded = output.decoded.get_or_insert_with(Decoded::default);
        decoded.token = state.next_token;
        decoded.kv_bytes = state.capacity as u64 * self.kv_bytes_per_token();
        output.output = Some(logits);
    }

    /// One step of every sequence of `batch`, each block acquired once for all of
    /// them. A sequence that cannot take its step (its KV pages do not fit, it
    /// outgrew its positions) gets its error and sits the step out; an error of the
    /// blocks themselves fails the whole step.
    pub fn step_batch<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        batch: &mut [BatchSequence<'_, C>],
        blocks: &mut B,
    ) -> Result<Vec<Result<StepOutput, FamilyError>>, FamilyError> {
        let mut outputs: Vec<Result<StepOutput, FamilyError>> = Vec::with_capacity(batch.len());
        let mut positions: Vec<Vec<u32>> = Vec::with_capacity(batch.len());
        for sequence in batch.iter_mut() {
            let mut output = StepOutput::default();
            let begun = self.begin_sequence(
                compute,
                sequence.state,
                blocks,
                sequence.step,
                sequence.prompt,
                &mut output,
            );
            match begun {
                Ok(rows) => {
                    positions.push(rows);
                    outputs.push(Ok(output));
                }
                Err(error @ FamilyError::Model(_)) => {
                    positions.push(Vec::new());
                    outputs.push(Err(error));
                }
                Err(error) => return Err(error),
            }
        }
        for layer in 0..self.config.layers {
            self.batch_layer(compute, batch, blocks, layer, &positions, &mut outputs)?;
        }
        self.batch_head(compute, batch, blocks, &positions, &mut outputs)?;
        Ok(outputs)
    }

    /// One layer of every sequence still in the step, on one hold of its block.
    fn batch_layer<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        batch: &mut [BatchSequence<'_, C>],
        blocks: &mut B,
        layer: usize,
        positions: &[Vec<u32>],
        outputs: &mut [Result<StepOutput, FamilyError>],
    ) -> Result<(), FamilyError> {
        let held = blocks.acquire(compute, BlockId(layer as u32))?;
        let lora = blocks.lora();
        let mut routed = Vec::with_capacity(batch.len());
        let outcome = (|| {
            for ((sequence, rows), output) in batch.iter_mut().zip(positions).zip(outputs.iter()) {
                if output.is_err() {
                    routed.push(None);
                    continue;
                }
                routed.push(self.layer_held(compute, &held, lora, layer, rows, sequence.state)?);
            }
            Ok::<_, FamilyError>(())
        })();
        blocks.release(compute, held)?;
        outcome?;
        // Experts are acquired per sequence, as its router picked them.
        for ((sequence, router), output) in batch.iter_mut().zip(routed).zip(outputs.iter_mut()) {
            if let (Some(router_logits), Ok(output)) = (router, output) {
                let step = sequence.step;
                self.moe(
                    compute,
                    sequence.state,
                    blocks,
                    layer,
                    &router_logits,
                    step,
                    output,
                )?;
            }
        }
        Ok(())
    }

    /// The head of every sequence still in the step, on one hold of its block.
    fn batch_head<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        batch: &mut [BatchSequence<'_, C>],
        blocks: &mut B,
        positions: &[Vec<u32>],
        outputs: &mut [Result<StepOutput, FamilyError>],
    ) -> Result<(), FamilyError> {
        let held = blocks.acquire(compute, BlockId(self.weights.head_block()))?;
        let lora = blocks.lora();
        let mut logits = Vec::with_capacity(batch.len());
        let outcome = (|| {
            for (sequence, output) in batch.iter_mut().zip(outputs.iter()) {
                if output.is_err() {
                    logits.push(Vec::new());
                    continue;
                }
                let sampling = sequence.sampling;
                logits.push(self.head_held(compute, sequence.state, &held, lora, &sampling)?);
            }
            Ok::<_, FamilyError>(())
        })();
        blocks.release(compute, held)?;
        outcome?;
        for (((sequence, rows), logits), output) in batch
            .iter_mut()
            .zip(positions)
            .zip(logits)
            .zip(outputs.iter_mut())
        {
            if let Ok(output) = output {
                self.next_row(compute, sequence.state)?;
                self.finish_sequence(sequence.state, rows.len(), logits, output);
            }
        }
        Ok(())
    }
}
