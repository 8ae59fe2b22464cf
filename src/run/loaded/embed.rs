//! Encoder jobs: the texts of every queued job, up to the token budget, embedded in
//! one step through the family's own step, and the embeddings handed back per job.
//! Only jobs of one adapter share a step: a job of another ends the gathering and
//! starts the next step.

use flume::TryRecvError;

use crate::families::bert::{embeddings_in_input_order, input_tokens, Encoder, Tokens};
use crate::families::{Facts, Family, FamilyError};
use crate::model::ModelFolder;

use super::{is_fatal, Context, EmbedJob, Embedded, Job, Loras, RunError, TokenEvent};

/// A job with its tokens, waiting for its step.
struct Gathered {
    job: EmbedJob,
    tokens: Vec<Tokens>,
    /// The adapter it embeds with (an index of the model's adapters).
    adapter: Option<usize>,
}

/// Padded tokens of a step of `texts` texts whose longest has `longest` tokens.
fn padded_tokens(texts: usize, longest: usize) -> usize {
    texts * longest
}

/// Answers jobs until the queue closes.
pub(super) fn run(
    encoder: &mut Encoder,
    folder: Option<&ModelFolder>,
    context: &mut Context<'_, '_>,
) -> Result<(), FamilyError> {
    let mut held: Option<Gathered> = None;
    loop {
        let first = match held.take() {
            Some(first) => first,
            None => match context.next_job() {
                Ok(job) => match gather(encoder, folder, &context.loras, job) {
                    Some(first) => first,
                    None => continue,
                },
                Err(_) => return Ok(()),
            },
        };
        let mut batch = vec![first];
        loop {
            let job = match context.jobs.try_recv() {
                Ok(job) => job,
                Err(TryRecvError::Empty | TryRecvError::Disconnected) => break,
            };
            let Some(next) = gather(encoder, folder, &context.loras, job) else {
                continue;
            };
            let same_adapter = next.adapter == batch[0].adapter;
            if same_adapter && fits(&batch, &next, context.limits.max_batch_tokens) {
                batch.push(next);
            } else {
                held = Some(next);
                break;
            }
        }
        embed_batch(encoder, context, batch)?;
    }
}

/// One step over a one-token text before the first request: every block lands (and
/// is checked against the file) once, so no request waits for that first read.
pub(super) fn warm_up(
    encoder: &mut Encoder,
    context: &mut Context<'_, '_>,
) -> Result<(), FamilyError> {
    let tokens = crate::families::bert::from_ids(&[vec![0]], encoder.config.usable_positions());
    encoder.set_inputs(&tokens, 1)?;
    let mut state = encoder.start(context.compute)?;
    context.blocks.begin_step();
    let stepped = encoder.step(context.compute, &mut state, context.blocks, 0);
    if stepped.is_err() {
        let _ = context.blocks.drain(context.compute);
    }
    stepped?;
    context.end_step()
}

/// Whether `next` joins `batch` within `budget` padded tokens.
fn fits(batch: &[Gathered], next: &Gathered, budget: usize) -> bool {
    let texts = batch.iter().chain([next]).map(|g| g.tokens.len()).sum();
    let longest = batch
        .iter()
        .chain([next])
        .flat_map(|g| &g.tokens)
        .map(|tokens| tokens.ids.len())
        .max()
        .unwrap_or(0);
    padded_tokens(texts, longest) <= budget
}

/// A job's tokens, or `None` after answering it with why it cannot run.
fn gather(
    encoder: &Encoder,
    folder: Option<&ModelFolder>,
    loras: &Loras<'_>,
    job: Job,
) -> Option<Gathered> {
    let job = match job {
        Job::Embed(job) => job,
        Job::Generate(job) => {
            let refusal = "this model is an encoder: it embeds text, it does not generate";
            let _ = job.events.send(TokenEvent::Refused(refusal.into()));
            return None;
        }
    };
    if job.cancel.is_cancelled() {
        return None;
    }
    let adapter = match loras.find(job.adapter.as_deref()) {
        Ok(adapter) => adapter,
        Err(refusal) => {
            let _ = job.reply.send(Err(RunError::request("adapter", refusal)));
            return None;
        }
    };
    let Some(folder) = folder else {
        // Opened as a part of a checkpoint, the encoder has no folder beside it, and
        // so no tokenizer: the file it lacks.
        let _ = job.reply.send(Err(RunError::MissingFile {
            path: "tokenizer.json".into(),
            message: "the encoder has no folder to tokenize with".into(),
            source: None,
        }));
        return None;
    };
    match input_tokens(folder, &encoder.config, encoder.limits(), &job.input) {
        Ok(tokens) => Some(Gathered {
            job,
            tokens,
            adapter,
        }),
        Err(error) => {
            // The request's own refusal, by kind (a text too long names `texts`).
            let _ = job.reply.send(Err(RunError::from_family(error, 0)));
            None
        }
    }
}

/// The texts of `batch` in as few steps as the token budget allows (one, unless a
/// job alone is larger); each job gets its own embeddings back.
fn embed_batch(
    encoder: &mut Encoder,
    context: &mut Context<'_, '_>,
    batch: Vec<Gathered>,
) -> Result<(), FamilyError> {
    let batch: Vec<Gathered> = batch
        .into_iter()
        .filter(|gathered| !gathered.job.cancel.is_cancelled())
        .collect();
    if batch.is_empty() {
        return Ok(());
    }
    let tokens: Vec<Tokens> = batch.iter().flat_map(|g| g.tokens.clone()).collect();
    let texts = tokens.len();
    // Texts a step takes within the token budget (a job larger than it takes steps).
    let longest = tokens
        .iter()
        .map(|text| text.ids.len())
        .max()
        .unwrap_or(1)
        .max(1);
    let per_step = (context.limits.max_batch_tokens / longest).clamp(1, texts);
    let adapter = batch[0].adapter;
    let embedded = (|| {
        context.use_adapter(adapter)?;
        encoder.set_inputs(&tokens, per_step)?;
        let mut state = encoder.start(context.compute)?;
        let mut steps = std::collections::BTreeMap::new();
        for step in 0..encoder.batches() as u64 {
            context
                .batches
                .batch(per_step.min(texts - step as usize * per_step));
            context.blocks.begin_step();
            let output = encoder.step(context.compute, &mut state, context.blocks, step);
            if output.is_err() {
                let _ = context.blocks.drain(context.compute);
            }
            steps.insert(step, output?.output.unwrap_or_default());
            context.end_step()?;
        }
        Ok::<_, FamilyError>(steps)
    })();
    let steps = match embedded {
        Ok(steps) => steps,
        Err(error) if is_fatal(&error) => return Err(error),
        Err(error) => {
            // A step's error is every text's of the batch: each job gets its kind
            // and words (no room now, a bad request, a bug), without its source.
            let error = RunError::from(error);
            for gathered in batch {
                let _ = gathered.job.reply.send(Err(error.detached()));
            }
            return Ok(());
        }
    };
    // The steps embedded the texts sorted by length: put them back in input order.
    let in_order =
        embeddings_in_input_order(&steps, texts, encoder.output_order()).unwrap_or_default();
    let mut rows = in_order.into_iter();
    for gathered in batch {
        let embeddings: Vec<Vec<f32>> = rows.by_ref().take(gathered.tokens.len()).collect();
        let prompt_tokens = gathered.tokens.iter().map(|tokens| tokens.length).sum();
        let _ = gathered.job.reply.send(Ok(Embedded {
            embeddings,
            prompt_tokens,
            batch_texts: texts,
        }));
    }
    Ok(())
}
