//! Decoder jobs, batched continuously: up to `max_sequences` sequences at once, each
//! with its own state and KV pages; a sequence joins when a job arrives and leaves
//! when it stops, reaches `max_tokens`, fails or is cancelled, between steps. Each
//! round is one batched step of the family ([`Decoder::step_batch`]): every block is
//! acquired once and serves every sequence, and each sequence computes exactly what
//! it would alone. Sequences of different adapters are stepped in groups, one batched
//! step per adapter each round, the attached adapter's group first (so two adapters
//! in use switch once a round, not twice).
//!
//! A sequence whose next KV pages find no room (a shared budget's lease is smaller
//! than a full batch's want, other sequences hold the rest) waits: it took no step
//! and is tried again next round, once others have left. An adapter switch that
//! finds no room for the adapter's regions waits the same way. A round in which no
//! sequence could step first asks the shared budget for room (another model may
//! hold it: it gives way); only when no more can be had does a sequence fail — the
//! newest one holding KV pages, which frees them for the others, or, when none holds
//! any, those waiting (nothing would free room for them).

use flume::TryRecvError;

use crate::device::CpuCompute;
use crate::families::llama::{BatchSequence, Decoder, DecoderState};
use crate::families::{Family, FamilyError, StepOutput};

use super::{is_fatal, Context, FinishReason, Finished, GenerateJob, Job, TokenEvent};

/// One sequence being decoded.
struct Sequence {
    job: GenerateJob,
    /// The prompt, swapped into the decoder for this sequence's steps.
    prompt: Vec<u32>,
    prompt_tokens: usize,
    /// The adapter it decodes with (an index of the model's adapters).
    adapter: Option<usize>,
    state: DecoderState<CpuCompute>,
    step: u64,
    generated: usize,
    finished: Option<FinishReason>,
    /// Why this round's step found no room for it (it waits for the next round).
    no_room: Option<String>,
}

/// Answers jobs until the queue closes and the last sequence has left.
pub(super) fn run(decoder: &mut Decoder, context: &mut Context<'_, '_>) -> Result<(), FamilyError> {
    let mut active: Vec<Sequence> = Vec::new();
    let mut closed = false;
    let mut stuck_rounds = 0;
    loop {
        if active.is_empty() {
            if closed {
                return Ok(());
            }
            match context.next_job() {
                Ok(job) => admit(decoder, context, job, &mut active)?,
                Err(_) => return Ok(()),
            }
        }
        while !closed && active.len() < context.limits.max_sequences.max(1) {
            match context.jobs.try_recv() {
                Ok(job) => admit(decoder, context, job, &mut active)?,
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => closed = true,
            }
        }
        if active.is_empty() {
            continue;
        }
        step_round(decoder, context, &mut active, &mut stuck_rounds)?;
        retire(decoder, context, &mut active);
    }
}

/// One prefill of a one-token prompt before the first request: every block lands
/// (and is checked against the file) once, so no request waits for that first read.
pub(super) fn warm_up(
    decoder: &mut Decoder,
    context: &mut Context<'_, '_>,
) -> Result<(), FamilyError> {
    let prompt = std::mem::replace(&mut decoder.prompt, vec![0]);
    let mut state = decoder.start(context.compute)?;
    context.blocks.begin_step();
    let stepped = decoder.step(context.compute, &mut state, context.blocks, 0);
    decoder.prompt = prompt;
    if stepped.is_err() {
        let _ = context.blocks.drain(context.compute);
    }
    let ended = stepped.and_then(|_| context.end_step());
    context
        .blocks
        .session()
        .release_activations(decoder.kv_reserved_bytes(&state));
    ended
}

/// Starts a job's sequence, or answers it with why it cannot run.
fn admit(
    decoder: &mut Decoder,
    context: &mut Context<'_, '_>,
    job: Job,
    active: &mut Vec<Sequence>,
) -> Result<(), FamilyError> {
    let job = match job {
        Job::Generate(job) => job,
        Job::Embed(job) => {
            let refusal = "this model is a decoder: it generates text, it does not embed";
            let _ = job
                .reply
                .send(Err(super::RunError::request("model", refusal)));
            return Ok(());
        }
    };
    let adapter =
        check_job(decoder, &job).and_then(|()| context.loras.find(job.adapter.as_deref()));
    let adapter = match adapter {
        Ok(adapter) => adapter,
        Err(refusal) => {
            let _ = job.events.send(TokenEvent::Refused(refusal));
            return Ok(());
        }
    };
    decoder.prompt = job.prompt.clone();
    decoder.sampling = job.sampling;
    let state = decoder.start(context.compute)?;
    active.push(Sequence {
        prompt: job.prompt.clone(),
        prompt_tokens: job.prompt.len(),
        adapter,
        job,
        state,
        step: 0,
        generated: 0,
        finished: None,
        no_room: None,
    });
    Ok(())
}

/// Why `job` cannot run on this decoder (a message for the client), if it cannot.
fn check_job(decoder: &Decoder, job: &GenerateJob) -> Result<(), String> {
    if job.prompt.is_empty() {
        return Err("the prompt has no tokens".into());
    }
    if job.max_tokens == 0 {
        return Err("max_tokens must be at least 1".into());
    }
    let vocab = decoder.config.vocab;
    if let Some(id) = job.prompt.iter().find(|&&id| id as usize >= vocab) {
        return Err(format!(
            "prompt token id {id} is outside the vocabulary of {vocab}"
        ));
    }
    let length = job.prompt.len() + job.max_tokens as usize;
    if let Some(refusal) = decoder.config.refuse_sequence(length) {
        return Err(format!("prompt + max_tokens: {refusal}"));
    }
    job.sampling.validate()
}

/// Rounds in a row in which nothing stepped and the shared budget gave more room
/// before the waiting sequences count as stuck: another model may take the room
/// back before each round, so growing is not always progress.
const STUCK_ROUNDS_MAX: u32 = 16;

/// One step of every active sequence: one batch per adapter in use.
fn step_round(
    decoder: &Decoder,
    context: &mut Context<'_, '_>,
    active: &mut [Sequence],
    stuck_rounds: &mut u32,
) -> Result<(), FamilyError> {
    for sequence in active.iter_mut() {
        if sequence.job.cancel.is_cancelled() || sequence.job.events.is_disconnected() {
            sequence.finished = Some(FinishReason::Cancelled);
        }
    }
    let mut stepped = 0;
    for adapter in round_order(context.loras.attached, active) {
        stepped += step_group(decoder, context, active, adapter)?;
    }
    if active.iter().all(|sequence| sequence.no_room.is_none()) {
        *stuck_rounds = 0;
        return Ok(());
    }
    if stepped > 0 {
        // Room comes back as the others leave; in a shared budget, ask for more now.
        *stuck_rounds = 0;
        if let Some(member) = context.member {
            member.begin_use();
        }
    } else {
        // Nothing stepped: a shrink for another model may have taken the room these
        // sequences' pages and adapter regions need. Ask for it back before failing.
        *stuck_rounds += 1;
        let grew = *stuck_rounds <= STUCK_ROUNDS_MAX
            && context.member.is_some_and(|member| member.ask_for_room());
        if !grew {
            *stuck_rounds = 0;
            fail_for_room(decoder, active);
        }
    }
    // The others wait for the next round.
    active
        .iter_mut()
        .for_each(|sequence| sequence.no_room = None);
    Ok(())
}

/// Nothing stepped and no more room can be had: the sequences [`who_fails`] names
/// fail, the other waiting ones are tried again next round.
fn fail_for_room(decoder: &Decoder, active: &mut [Sequence]) {
    let waiting: Vec<Waiting> = active
        .iter()
        .map(|sequence| Waiting {
            waits: sequence.no_room.is_some(),
            holds_pages: decoder.kv_reserved_bytes(&sequence.state) > 0,
        })
        .collect();
    for (sequence, fails) in active.iter_mut().zip(who_fails(&waiting)) {
        let why = sequence.no_room.take();
        if let (true, Some(why)) = (fails, why) {
            let _ = sequence.job.events.send(TokenEvent::Failed(why));
            sequence.finished = Some(FinishReason::Cancelled);
        }
    }
}

/// A sequence of a round in which nothing stepped, as [`who_fails`] sees it.
#[derive(Debug, Clone, Copy)]
struct Waiting {
    /// It found no room this round.
    waits: bool,
    /// It holds KV pages (leaving frees them).
    holds_pages: bool,
}

/// Which sequences of a stuck round fail, in the order they joined: the newest
/// waiting one that holds KV pages (leaving, it frees them for the others), or,
/// when none holds any, every waiting one (nothing would free room for them).
fn who_fails(sequences: &[Waiting]) -> Vec<bool> {
    let holder = sequences
        .iter()
        .rposition(|sequence| sequence.waits && sequence.holds_pages);
    (0..sequences.len())
        .map(|index| match holder {
            Some(holder) => index == holder,
            None => sequences[index].waits,
        })
        .collect()
}

/// The adapters of the sequences still running, the attached one first, the others
/// in the order their first sequence joined.
fn round_order(attached: Option<Option<usize>>, active: &[Sequence]) -> Vec<Option<usize>> {
    let mut order: Vec<Option<usize>> = Vec::new();
    let running = active.iter().filter(|sequence| sequence.finished.is_none());
    for sequence in running {
        if !order.contains(&sequence.adapter) {
            order.push(sequence.adapter);
        }
    }
    if let Some(first) = order.iter().position(|&adapter| Some(adapter) == attached) {
        order[..=first].rotate_right(1);
    }
    order
}

/// One step of the running sequences of `adapter`, as one batch: each block acquired
/// once for all of them ([`Decoder::step_batch`]); each token told to its job.
/// Returns how many took their step.
fn step_group(
    decoder: &Decoder,
    context: &mut Context<'_, '_>,
    active: &mut [Sequence],
    adapter: Option<usize>,
) -> Result<usize, FamilyError> {
    let in_group = |sequence: &Sequence| sequence.finished.is_none() && sequence.adapter == adapter;
    let stepped = context.use_adapter(adapter).and_then(|()| {
        let mut batch: Vec<BatchSequence<'_, CpuCompute>> = active
            .iter_mut()
            .filter(|sequence| in_group(sequence))
            .map(|sequence| BatchSequence {
                state: &mut sequence.state,
                prompt: &sequence.prompt,
                sampling: sequence.job.sampling,
                step: sequence.step,
            })
            .collect();
        context.batches.batch(batch.len());
        context.blocks.begin_step();
        decoder.step_batch(context.compute, &mut batch, context.blocks)
    });
    let outputs = match stepped {
        Ok(outputs) => outputs,
        Err(error) => {
            let _ = context.blocks.drain(context.compute);
            if is_fatal(&error) {
                return Err(error);
            }
            let no_room = matches!(
                error,
                FamilyError::Session(stagehand_actors::SessionError::Activations(_))
            );
            for sequence in active.iter_mut().filter(|s| in_group(s)) {
                if no_room {
                    sequence.no_room = Some(error.to_string());
                    continue;
                }
                let _ = sequence
                    .job
                    .events
                    .send(TokenEvent::Failed(error.to_string()));
                sequence.finished = Some(FinishReason::Cancelled);
            }
            return Ok(0);
        }
    };
    context.end_step()?;
    let mut took = 0;
    let stepped = active.iter_mut().filter(|sequence| in_group(sequence));
    for (sequence, output) in stepped.zip(outputs) {
        took += usize::from(record(sequence, output));
    }
    Ok(took)
}

/// A sequence's step output: its token told, its KV pages counted, its end decided.
/// Returns whether it took its step.
fn record(sequence: &mut Sequence, output: Result<StepOutput, FamilyError>) -> bool {
    let output = match output {
        Ok(output) => output,
        Err(FamilyError::NoRoom(why)) => {
            sequence.no_room = Some(why);
            return false;
        }
        Err(error) => {
            let _ = sequence
                .job
                .events
                .send(TokenEvent::Failed(error.to_string()));
            sequence.finished = Some(FinishReason::Cancelled);
            return false;
        }
    };
    sequence.step += 1;
    let decoded = output.decoded.unwrap_or_default();
    sequence.generated += 1;
    let _ = sequence.job.events.send(TokenEvent::Token(decoded.token));
    if sequence.job.stop_tokens.contains(&decoded.token) {
        sequence.finished = Some(FinishReason::Stop);
    } else if sequence.generated as u64 >= sequence.job.max_tokens {
        sequence.finished = Some(FinishReason::Length);
    }
    true
}

/// Sequences that ended leave: their KV pages go back, their jobs are told.
fn retire(decoder: &Decoder, context: &mut Context<'_, '_>, active: &mut Vec<Sequence>) {
    active.retain(|sequence| {
        let Some(reason) = sequence.finished else {
            return true;
        };
        let reserved = decoder.kv_reserved_bytes(&sequence.state);
        context.blocks.session().release_activations(reserved);
        let _ = sequence.job.events.send(TokenEvent::Finished(Finished {
            reason,
            prompt_tokens: sequence.prompt_tokens,
            generated_tokens: sequence.generated,
        }));
        false
    });
}

#[cfg(test)]
mod tests {
    use super::{who_fails, Waiting};

    fn waiting(flags: &[(bool, bool)]) -> Vec<Waiting> {
        (flags.iter())
            .map(|&(waits, holds_pages)| Waiting { waits, holds_pages })
            .collect()
    }

    #[test]
    fn a_stuck_round_fails_only_the_newest_sequence_that_holds_pages() {
        // Proves one leaving frees room for the rest: the older holders and those
        // without pages wait on (they failed all together before, on the CI machine).
        let round = waiting(&[(true, true), (true, false), (true, true), (true, false)]);
        assert_eq!(who_fails(&round), [false, false, true, false]);
    }

    #[test]
    fn a_stuck_round_with_no_pages_held_fails_every_waiting_sequence() {
        // Nothing would free room for them: each is told why now, not left to hang.
        let round = waiting(&[(true, false), (false, false), (true, false)]);
        assert_eq!(who_fails(&round), [true, false, true]);
    }
}
