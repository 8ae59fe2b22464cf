//! Streamed generations: OpenAI's server-sent events (`data: {chunk}` lines, a usage
//! chunk when `stream_options.include_usage`, then `data: [DONE]`). A task reads the
//! job's tokens and writes the events; when the client goes away the event channel
//! closes, the task ends, and its guard cancels the job, whose KV pages go back at
//! the model's next step.

use std::convert::Infallible;
use std::sync::Arc;

use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

use crate::run::loaded::{CancelOnDrop, FinishReason};

use super::access_log::RequestFacts;
use super::generation::{label, object, Endpoint, Generation, Next, Tokens};
use super::openai::Usage;
use super::state::{AppState, Ticket};
use super::stop_text::StopText;

/// The streamed response of `generation`; `ticket` keeps it counted in flight.
pub(super) fn respond(
    app: Arc<AppState>,
    generation: Generation,
    tokens: Tokens,
    ticket: Ticket,
) -> Response {
    let (events, stream) = flume::bounded::<Result<Event, Infallible>>(64);
    // The access log's line is written when the stream ends: the task counts into it.
    let facts = Arc::new(RequestFacts::default());
    let counted = Arc::clone(&facts);
    tokio::spawn(async move {
        let guard = CancelOnDrop::new(tokens.cancel.clone());
        let outcome = write_events(&generation, &tokens, &events, &counted).await;
        let series = &generation.model.series;
        series.request(
            label(generation.endpoint),
            outcome,
            tokens.started.elapsed().as_secs_f64(),
        );
        // A finished job needs no cancel; one the client left is cancelled by the guard.
        if outcome == "ok" {
            let mut guard = guard;
            guard.disarm();
        }
        drop(ticket);
        drop(app);
    });
    let mut response = Sse::new(stream.into_stream())
        .keep_alive(KeepAlive::default())
        .into_response();
    response.extensions_mut().insert(facts);
    response
}

/// Writes every event of the generation; returns the request's outcome label.
async fn write_events(
    generation: &Generation,
    tokens: &Tokens,
    events: &flume::Sender<Result<Event, Infallible>>,
    facts: &RequestFacts,
) -> &'static str {
    let model = &generation.model;
    model
        .series
        .prompt_tokens
        .increment(generation.prompt.len() as u64);
    let send = |value: Value| events.send_async(Ok(Event::default().data(value.to_string())));
    if generation.endpoint == Endpoint::Chat
        && send(chunk(
            generation,
            Some(json!({"role": "assistant", "content": ""})),
            None,
        ))
        .await
        .is_err()
    {
        return "cancelled";
    }
    let mut text = StopText::new(model.tokenizer.clone(), generation.stops.clone());
    let mut generated = 0;
    let reason = loop {
        let next = tokens.next(&mut text, &mut generated, model).await;
        facts.set_tokens(generation.prompt.len(), generated);
        match next {
            Next::Failed(error) => {
                let _ = send(error.body()).await;
                let _ = events.send_async(Ok(Event::default().data("[DONE]"))).await;
                return error.outcome();
            }
            Next::Text(fresh, reason) => {
                if !fresh.is_empty() && send(text_chunk(generation, &fresh)).await.is_err() {
                    return "cancelled";
                }
                if let Some(reason) = reason {
                    break reason;
                }
            }
        }
    };
    if send(chunk(generation, None, Some(reason))).await.is_err() {
        return "cancelled";
    }
    if generation.include_usage {
        let usage = Usage::new(generation.prompt.len(), generated);
        let mut last = chunk(generation, None, None);
        last["choices"] = json!([]);
        last["usage"] = json!(usage);
        if send(last).await.is_err() {
            return "cancelled";
        }
    }
    if events
        .send_async(Ok(Event::default().data("[DONE]")))
        .await
        .is_err()
    {
        return "cancelled";
    }
    "ok"
}

fn text_chunk(generation: &Generation, fresh: &str) -> Value {
    match generation.endpoint {
        Endpoint::Completions => {
            let mut value = chunk(generation, None, None);
            value["choices"][0]["text"] = json!(fresh);
            value
        }
        Endpoint::Chat => chunk(generation, Some(json!({"content": fresh})), None),
    }
}

/// One chunk: a chat `delta` (or a completion's empty text) and an optional finish.
fn chunk(generation: &Generation, delta: Option<Value>, reason: Option<FinishReason>) -> Value {
    let finish = reason.map(FinishReason::as_str);
    let choice = match generation.endpoint {
        Endpoint::Completions => {
            json!({"index": 0, "text": "", "finish_reason": finish, "logprobs": null})
        }
        Endpoint::Chat => json!({"index": 0, "delta": delta.unwrap_or_else(|| json!({})),
                                 "finish_reason": finish, "logprobs": null}),
    };
    json!({
        "id": generation.id,
        "object": object(generation.endpoint, true),
        "created": generation.created,
        "model": generation.model_id(),
        "choices": [choice],
    })
}
