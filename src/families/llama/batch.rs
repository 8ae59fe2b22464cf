//! Several sequences through one step (continuous batching): each block is acquired
//! once and every sequence of the batch runs its part of the layer on it — its own
//! rows, positions, KV cache and sampling — before it is released, so every weight
//! that crosses the bus serves the whole batch. A sequence's arithmetic is exactly
//! that of [`Family::step`] alone (the same kernels on the same rows in the same
//! order), so its tokens are bit for bit those of the sequence run by itself.
//!
//! [`Family::step`]: crate::families::Family::step

use stagehand_actors::BlockId;

use super::stack::Stack;
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
            return Err(FamilyError::request(
                "max_tokens",
                format!("{refusal}; lower --max-tokens"),
            ));
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

    /// Before the layers, for a sequence that joins a stack: its length checked and
    /// its KV pages grown (its input row goes into the stack).
    fn begin_stacked<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        state: &mut DecoderState<C>,
        blocks: &mut B,
        output: &mut StepOutput,
    ) -> Result<(), FamilyError> {
        let length = state.position + 1;
        if let Some(refusal) = self.config.refuse_sequence(length) {
            return Err(FamilyError::request(
                "max_tokens",
                format!("{refusal}; lower --max-tokens"),
            ));
        }
        self.grow_cache(compute, state, blocks, length, output)
    }

    /// One step of every sequence of `batch`, each block acquired once for all of
    /// them; the sequences that decode one token go in stacks of the adapter's
    /// `stackable_rows` (one product per projection), the others (prefills, expert layers) one by one
    /// on the same hold. A sequence that cannot take its step (its KV pages do not
    /// fit, it outgrew its positions) gets its error and sits the step out; an error
    /// of the blocks themselves fails the whole step.
    pub fn step_batch<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        batch: &mut [BatchSequence<'_, C>],
        blocks: &mut B,
    ) -> Result<Vec<Result<StepOutput, FamilyError>>, FamilyError> {
        let mut outputs: Vec<Result<StepOutput, FamilyError>> = Vec::with_capacity(batch.len());
        let mut positions: Vec<Vec<u32>> = Vec::with_capacity(batch.len());
        let mut stacked = Vec::new();
        for (index, sequence) in batch.iter_mut().enumerate() {
            let mut output = StepOutput::default();
            let stacks = self.stacks(sequence.step);
            let begun = if stacks {
                self.begin_stacked(compute, sequence.state, blocks, &mut output)
                    .map(|()| vec![sequence.state.position as u32])
            } else {
                let (state, step, prompt) = (&mut *sequence.state, sequence.step, sequence.prompt);
                self.begin_sequence(compute, state, blocks, step, prompt, &mut output)
            };
            match begun {
                Ok(rows) => {
                    if stacks {
                        stacked.push(index);
                    }
                    positions.push(rows);
                    outputs.push(Ok(output));
                }
                // The sequence's own refusal (its length, its tokens) or no room for
                // it now: it ends alone, the batch goes on.
                Err(
                    error @ (FamilyError::BadRequest { .. }
                    | FamilyError::Internal { .. }
                    | FamilyError::NoRoom(_)),
                ) => {
                    positions.push(Vec::new());
                    outputs.push(Err(error));
                }
                Err(error) => return Err(error),
            }
        }
        let mut stacks = stacked
            .chunks(compute.stackable_rows().max(1))
            .map(|members| {
                let states: Vec<&DecoderState<C>> = members
                    .iter()
                    .map(|&member| &*batch[member].state)
                    .collect();
                self.stack(compute, members.to_vec(), &states)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let alone: Vec<bool> = (0..batch.len())
            .map(|index| outputs[index].is_ok() && !stacked.contains(&index))
            .collect();
        for layer in 0..self.config.layers {
            let work = Work {
                batch: &mut *batch,
                positions: &positions,
                alone: &alone,
            };
            self.batch_layer(compute, work, blocks, layer, &mut stacks, &mut outputs)?;
        }
        let work = Work {
            batch,
            positions: &positions,
            alone: &alone,
        };
        self.batch_head(compute, work, blocks, &mut stacks, &mut outputs)?;
        Ok(outputs)
    }

    /// One layer of every sequence still in the step, on one hold of its block.
    fn batch_layer<C: Compute, B: Blocks<C>>(
        &self,
        compute: &C,
        work: Work<'_, '_, C>,
        blocks: &mut B,
        layer: usize,
        stacks: &mut [Stack<C>],
        outputs: &mut [Result<StepOutput, FamilyError>],
    ) -> Result<(), FamilyError> {
        let Work {
            batch,
            positions,
            alone,
        } = work;
        let held = blocks.acquire(compute, BlockId(layer as u32))?;
        let lora = blocks.lora();
        let mut routed = Vec::with_capacity(batch.len());
        let outcome = (|| {
            for stack in stacks.iter_mut() {
                let mut states = members(batch, &stack.members);
                self.stacked_layer(compute, &held, lora, layer, stack, &mut states)?;
            }
            for ((sequence, rows), alone) in batch.iter_mut().zip(positions).zip(alone) {
                if !alone {
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
        work: Work<'_, '_, C>,
        blocks: &mut B,
        stacks: &mut [Stack<C>],
        outputs: &mut [Result<StepOutput, FamilyError>],
    ) -> Result<(), FamilyError> {
        let Work {
            batch,
            positions,
            alone,
        } = work;
        let held = blocks.acquire(compute, BlockId(self.weights.head_block()))?;
        let lora = blocks.lora();
        let mut logits: Vec<Vec<f32>> = vec![Vec::new(); batch.len()];
        let outcome = (|| {
            for stack in stacks.iter_mut() {
                let samplings: Vec<Sampling> = stack
                    .members
                    .iter()
                    .map(|&member| batch[member].sampling)
                    .collect();
                let mut states = members(batch, &stack.members);
                let picked =
                    self.stacked_head(compute, &held, lora, stack, &mut states, &samplings)?;
                for (&member, row) in stack.members.iter().zip(picked) {
                    logits[member] = row;
                }
            }
            for ((sequence, alone), logits) in batch.iter_mut().zip(alone).zip(logits.iter_mut()) {
                if *alone {
                    let sampling = sequence.sampling;
                    *logits = self.head_held(compute, sequence.state, &held, lora, &sampling)?;
                }
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

/// The sequences of a step and which of them run one by one (not in a stack).
struct Work<'w, 'a, C: Compute> {
    batch: &'w mut [BatchSequence<'a, C>],
    positions: &'w [Vec<u32>],
    alone: &'w [bool],
}

/// The states of a stack's members, in row order.
fn members<'w, C: Compute>(
    batch: &'w mut [BatchSequence<'_, C>],
    members: &[usize],
) -> Vec<&'w mut DecoderState<C>> {
    batch
        .iter_mut()
        .enumerate()
        .filter(|(index, _)| members.contains(index))
        .map(|(_, sequence)| &mut *sequence.state)
        .collect()
}
