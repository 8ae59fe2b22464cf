//! `/v1/completions` and `/v1/chat/completions`: the prompt (text through the
//! folder's tokenizer, token ids, or chat messages through its chat template) within
//! the limits, a job on the model's queue, and its tokens back as one JSON answer or
//! as server-sent events ending `data: [DONE]`.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::families::llama::Sampling;
use crate::run::loaded::{Cancel, CancelOnDrop, FinishReason, GenerateJob, Job, TokenEvent};

use super::chat::TemplateMessage;
use super::errors::ApiError;
use super::handlers::{finish, model_field, parse};
use super::openai::{self, ChatRequest, CompletionRequest, Content, TextInput, Usage};
use super::state::{AppState, ServedModel};
use super::stop_text::StopText;

/// Which endpoint a generation answers, which decides the shape of its bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Endpoint {
    Completions,
    Chat,
}

impl Endpoint {
    fn label(self) -> &'static str {
        match self {
            Endpoint::Completions => "completions",
            Endpoint::Chat => "chat_completions",
        }
    }
}

/// A generation ready to queue.
pub(super) struct Generation {
    pub endpoint: Endpoint,
    pub model: Arc<ServedModel>,
    /// The model's adapter the request named (`"model": "NAME:ADAPTER"`).
    pub adapter: Option<String>,
    pub prompt: Vec<u32>,
    pub sampling: Sampling,
    pub max_tokens: u64,
    pub stops: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    pub id: String,
    pub created: u64,
}

impl Generation {
    /// The id the request asked for: `NAME` or `NAME:ADAPTER`.
    pub fn model_id(&self) -> String {
        match &self.adapter {
            Some(adapter) => format!("{}:{adapter}", self.model.name),
            None => self.model.name.clone(),
        }
    }
}

pub(super) async fn completions(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let model = model_field(&body);
    let result = async {
        let request: CompletionRequest = parse(body, app.limits.max_body_bytes)?;
        let (served, adapter) = generator(&app, &request.model)?;
        let prompt = completion_prompt(&served, request.prompt)?;
        let generation = generation(
            &app,
            (served, adapter),
            Endpoint::Completions,
            prompt,
            request.sampling,
        )?;
        run(&app, generation, started).await
    }
    .await;
    finish(&app, model.as_deref(), "completions", started, result)
}

pub(super) async fn chat(
    State(app): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let started = Instant::now();
    let model = model_field(&body);
    let result = async {
        let request: ChatRequest = parse(body, app.limits.max_body_bytes)?;
        let (served, adapter) = generator(&app, &request.model)?;
        let prompt = chat_prompt(&served, &request.messages)?;
        let chosen = (served, adapter);
        let generation = generation(&app, chosen, Endpoint::Chat, prompt, request.sampling)?;
        run(&app, generation, started).await
    }
    .await;
    finish(&app, model.as_deref(), "chat_completions", started, result)
}

/// The served decoder `name` names, with its adapter (an encoder is refused by name).
fn generator(app: &AppState, name: &str) -> Result<(Arc<ServedModel>, Option<String>), ApiError> {
    let (model, adapter) = app.model(name)?;
    model.refuse_pipelines()?;
    if model.serves_embeddings() {
        return Err(ApiError::bad_request(
            "model",
            format!(
                "`{}` is an encoder: it embeds text; POST /v1/embeddings",
                model.name
            ),
        ));
    }
    Ok((model, adapter))
}

fn tokenize(
    model: &ServedModel,
    text: &str,
    special: bool,
    param: &str,
) -> Result<Vec<u32>, ApiError> {
    let Some(tokenizer) = &model.tokenizer else {
        return Err(ApiError::bad_request(
            param,
            format!(
                "`{}` has no tokenizer.json: send the prompt as token ids",
                model.name
            ),
        ));
    };
    let encoding = tokenizer
        .encode(text, special)
        .map_err(|error| ApiError::bad_request(param, format!("could not tokenize: {error}")))?;
    Ok(encoding.get_ids().to_vec())
}

fn completion_prompt(model: &ServedModel, prompt: TextInput) -> Result<Vec<u32>, ApiError> {
    let one = "one prompt per request: send a string or one list of token ids";
    match prompt {
        TextInput::One(text) => tokenize(model, &text, true, "prompt"),
        TextInput::Many(texts) if texts.len() == 1 => tokenize(model, &texts[0], true, "prompt"),
        TextInput::Ids(ids) => Ok(ids),
        TextInput::ManyIds(mut ids) if ids.len() == 1 => Ok(ids.remove(0)),
        _ => Err(ApiError::bad_request("prompt", one)),
    }
}

fn chat_prompt(
    model: &ServedModel,
    messages: &[openai::ChatMessage],
) -> Result<Vec<u32>, ApiError> {
    let Some(template) = &model.chat else {
        return Err(ApiError::bad_request(
            "model",
            format!(
                "`{}` has no chat template (no chat_template in its tokenizer_config.json), so it does not take chat; POST /v1/completions with a prompt",
                model.name
            ),
        ));
    };
    if messages.is_empty() {
        return Err(ApiError::bad_request("messages", "`messages` is empty"));
    }
    let messages: Vec<TemplateMessage> = messages
        .iter()
        .map(|message| TemplateMessage {
            role: message.role.clone(),
            content: content_text(message.content.as_ref()),
        })
        .collect();
    let text = template.render(&messages).map_err(|error| {
        ApiError::bad_request(
            "messages",
            format!("the chat template refused the messages: {error}"),
        )
    })?;
    // The template writes the special tokens itself.
    tokenize(model, &text, false, "messages")
}

/// A message's text: the string, or its text parts joined.
pub(super) fn content_text(content: Option<&Content>) -> String {
    match content {
        None => String::new(),
        Some(Content::Text(text)) => text.clone(),
        Some(Content::Parts(parts)) => parts
            .iter()
            .filter_map(|part| part.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
    }
}

/// The request's sampling and limits, checked; each error names its field.
fn generation(
    app: &AppState,
    (model, adapter): (Arc<ServedModel>, Option<String>),
    endpoint: Endpoint,
    prompt: Vec<u32>,
    request: openai::Sampling,
) -> Result<Generation, ApiError> {
    request.refuse_unsupported()?;
    let limit = app.limits.max_prompt_tokens;
    let param = if endpoint == Endpoint::Chat {
        "messages"
    } else {
        "prompt"
    };
    if prompt.is_empty() {
        return Err(ApiError::bad_request(param, "the prompt has no tokens"));
    }
    if prompt.len() > limit {
        return Err(ApiError::bad_request(
            param,
            format!(
                "the prompt has {} tokens; the limit is {limit} (limits.max_prompt_tokens)",
                prompt.len()
            ),
        ));
    }
    let max_tokens = request
        .max_tokens
        .or(request.max_completion_tokens)
        .unwrap_or(model.max_tokens);
    if max_tokens == 0 || max_tokens > model.max_tokens {
        return Err(ApiError::bad_request(
            "max_tokens",
            format!(
                "max_tokens {max_tokens} is out of range: 1 up to {} for `{}`",
                model.max_tokens, model.name
            ),
        ));
    }
    let temperature = request.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(ApiError::bad_request(
            "temperature",
            format!("temperature {temperature} is out of range: 0 (greedy) up to 2"),
        ));
    }
    let top_p = request.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad_request(
            "top_p",
            format!("top_p {top_p} is out of range: above 0, at most 1"),
        ));
    }
    let stops = request
        .stop
        .map(openai::Stop::into_list)
        .unwrap_or_default();
    if stops.len() > 4 {
        return Err(ApiError::bad_request("stop", "at most 4 stop sequences"));
    }
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    Ok(Generation {
        endpoint,
        model,
        adapter,
        prompt,
        sampling: Sampling {
            temperature,
            top_p,
            seed: request.seed.unwrap_or(0),
        },
        max_tokens,
        stops,
        stream: request.stream.unwrap_or(false),
        include_usage: request
            .stream_options
            .is_some_and(|options| options.include_usage),
        id: request_id(endpoint),
        created,
    })
}

fn request_id(endpoint: Endpoint) -> String {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let number = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    match endpoint {
        Endpoint::Completions => format!("cmpl-{number}"),
        Endpoint::Chat => format!("chatcmpl-{number}"),
    }
}

/// A job on the model's queue, answered whole or streamed.
async fn run(
    app: &Arc<AppState>,
    generation: Generation,
    started: Instant,
) -> Result<Response, ApiError> {
    let ticket = app.admit(&generation.model)?;
    let cancel = Cancel::new();
    let (events, received) = flume::bounded(event_capacity(generation.max_tokens));
    generation.model.submit(Job::Generate(GenerateJob {
        prompt: generation.prompt.clone(),
        adapter: generation.adapter.clone(),
        sampling: generation.sampling,
        max_tokens: generation.max_tokens,
        stop_tokens: generation.model.stop_tokens.clone(),
        events,
        cancel: cancel.clone(),
    }))?;
    let deadline = tokio::time::Instant::now() + app.timeout();
    let tokens = Tokens {
        received,
        cancel,
        deadline,
        started,
        timeout_seconds: app.limits.request_timeout_seconds,
    };
    if generation.stream {
        return Ok(super::streaming::respond(
            Arc::clone(app),
            generation,
            tokens,
            ticket,
        ));
    }
    let mut guard = CancelOnDrop::new(tokens.cancel.clone());
    let (answer, usage) = collect(&generation, tokens).await?;
    guard.disarm();
    drop(ticket);
    let mut response = Json(answer).into_response();
    super::access_log::RequestFacts::of(&mut response)
        .set_tokens(usage.prompt_tokens, usage.completion_tokens);
    Ok(response)
}

/// Room for every event one job can send: at most `max_tokens` tokens, then how it
/// ended — a `Finished`, a `Refused`, or a `Failed` followed by its `Finished`.
/// `max_tokens` is at most the model's `max_tokens` (the server's `limits.max_tokens`
/// or lower: checked in `generation`), so the channel is bounded by the limits; and
/// as the job can never fill it, the model's thread, which decodes every sequence of
/// the batch, never waits on one slow client.
fn event_capacity(max_tokens: u64) -> usize {
    const ENDING_EVENTS: usize = 2;
    usize::try_from(max_tokens)
        .unwrap_or(usize::MAX)
        .saturating_add(ENDING_EVENTS)
}

/// A queued job's events and its deadline.
pub(super) struct Tokens {
    pub received: flume::Receiver<TokenEvent>,
    pub cancel: Cancel,
    pub deadline: tokio::time::Instant,
    pub started: Instant,
    pub timeout_seconds: f64,
}

/// What a generation's next event brings.
pub(super) enum Next {
    /// Text safe to send, and whether the sequence ended with it.
    Text(String, Option<FinishReason>),
    Failed(ApiError),
}

impl Tokens {
    /// The next event, turned into text by `text`; counts tokens into `generated`.
    pub async fn next(
        &self,
        text: &mut StopText,
        generated: &mut usize,
        model: &ServedModel,
    ) -> Next {
        let event = tokio::time::timeout_at(self.deadline, self.received.recv_async()).await;
        match event {
            Err(_) => {
                self.cancel.cancel();
                Next::Failed(ApiError::timeout(self.timeout_seconds))
            }
            Ok(Err(_)) => Next::Failed(ApiError::failed(format!(
                "the model `{}` stopped",
                model.name
            ))),
            Ok(Ok(TokenEvent::Token(token))) => {
                if *generated == 0 {
                    model
                        .series
                        .time_to_first_token
                        .record(self.started.elapsed().as_secs_f64());
                }
                *generated += 1;
                model.series.generated_tokens.increment(1);
                let (fresh, stopped) = text.push(token);
                if stopped {
                    // The job stops at its next step; its KV pages go back then.
                    self.cancel.cancel();
                    return Next::Text(fresh, Some(FinishReason::Stop));
                }
                Next::Text(fresh, None)
            }
            Ok(Ok(TokenEvent::Finished(finished))) => {
                Next::Text(text.finish(), Some(finished.reason))
            }
            Ok(Ok(TokenEvent::Refused(message))) => {
                Next::Failed(ApiError::bad_request("prompt", message))
            }
            // The model could not make room for it now (its KV pages): retry later.
            Ok(Ok(TokenEvent::Failed(message))) => Next::Failed(ApiError::unavailable(message)),
        }
    }
}

/// The whole answer of a generation that is not streamed.
async fn collect(generation: &Generation, tokens: Tokens) -> Result<(Value, Usage), ApiError> {
    let model = &generation.model;
    model
        .series
        .prompt_tokens
        .increment(generation.prompt.len() as u64);
    let mut text = StopText::new(model.tokenizer.clone(), generation.stops.clone());
    let mut generated = 0;
    let reason = loop {
        match tokens.next(&mut text, &mut generated, model).await {
            Next::Failed(error) => return Err(error),
            Next::Text(_, Some(reason)) => break reason,
            Next::Text(_, None) => {}
        }
    };
    let usage = Usage::new(generation.prompt.len(), generated);
    Ok((answer_body(generation, text.text(), reason, usage), usage))
}

fn answer_body(generation: &Generation, text: &str, reason: FinishReason, usage: Usage) -> Value {
    let choice = match generation.endpoint {
        Endpoint::Completions => {
            json!({"index": 0, "text": text, "finish_reason": reason.as_str(), "logprobs": null})
        }
        Endpoint::Chat => json!({"index": 0, "message": {"role": "assistant", "content": text},
                                 "finish_reason": reason.as_str(), "logprobs": null}),
    };
    json!({
        "id": generation.id,
        "object": object(generation.endpoint, false),
        "created": generation.created,
        "model": generation.model_id(),
        "choices": [choice],
        "usage": usage,
    })
}

pub(super) fn object(endpoint: Endpoint, chunk: bool) -> &'static str {
    match (endpoint, chunk) {
        (Endpoint::Completions, _) => "text_completion",
        (Endpoint::Chat, false) => "chat.completion",
        (Endpoint::Chat, true) => "chat.completion.chunk",
    }
}

pub(super) fn label(endpoint: Endpoint) -> &'static str {
    endpoint.label()
}

#[cfg(test)]
mod tests {
    use crate::run::loaded::{FinishReason, Finished, TokenEvent};

    #[test]
    fn a_jobs_event_channel_is_bounded_and_holds_its_longest_answer() {
        // Proves the channel no longer grows without bound (a flood past the capacity
        // is refused) and that a job's most events — every token, a failure and its
        // end — fit without the model's thread ever waiting.
        let max_tokens = 16;
        let (events, received) = flume::bounded(super::event_capacity(max_tokens));
        assert_eq!(events.capacity(), Some(max_tokens as usize + 2));
        for token in 0..max_tokens as u32 {
            assert!(events.try_send(TokenEvent::Token(token)).is_ok());
        }
        assert!(events
            .try_send(TokenEvent::Failed("no room".into()))
            .is_ok());
        let finished = TokenEvent::Finished(Finished {
            reason: FinishReason::Cancelled,
            prompt_tokens: 1,
            generated_tokens: max_tokens as usize,
        });
        assert!(events.try_send(finished).is_ok(), "the longest answer fits");
        let flood = (0..1000).filter(|_| events.try_send(TokenEvent::Token(0)).is_ok());
        assert_eq!(flood.count(), 0, "nothing past the bound");
        assert_eq!(received.len(), max_tokens as usize + 2);
    }
}
