//! The request and response bodies of the OpenAI API that `serve` answers. Fields
//! that would change the result and are not implemented (`n` above 1, penalties,
//! `logprobs`, `dimensions`, tools) are refused by name rather than ignored.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::errors::ApiError;

/// A string, a list of strings, a list of token ids, or a list of lists of ids.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum TextInput {
    One(String),
    Many(Vec<String>),
    Ids(Vec<u32>),
    ManyIds(Vec<Vec<u32>>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct EmbeddingsRequest {
    pub model: String,
    pub input: TextInput,
    #[serde(default)]
    pub encoding_format: Option<String>,
    #[serde(default)]
    pub dimensions: Option<Value>,
}

/// `stop`: one string or several.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

impl Stop {
    pub fn into_list(self) -> Vec<String> {
        match self {
            Stop::One(stop) => vec![stop],
            Stop::Many(stops) => stops,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Default)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// What completions and chat share.
#[derive(Debug, Clone, Deserialize, Default)]
pub struct Sampling {
    #[serde(default)]
    pub max_tokens: Option<u64>,
    #[serde(default)]
    pub max_completion_tokens: Option<u64>,
    #[serde(default)]
    pub temperature: Option<f32>,
    #[serde(default)]
    pub top_p: Option<f32>,
    #[serde(default)]
    pub seed: Option<u64>,
    #[serde(default)]
    pub stop: Option<Stop>,
    #[serde(default)]
    pub stream: Option<bool>,
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    #[serde(default)]
    pub n: Option<u64>,
    #[serde(default)]
    pub presence_penalty: Option<f32>,
    #[serde(default)]
    pub frequency_penalty: Option<f32>,
    #[serde(default)]
    pub logprobs: Option<Value>,
    #[serde(default)]
    pub top_logprobs: Option<Value>,
    #[serde(default)]
    pub logit_bias: Option<Value>,
    #[serde(default)]
    pub echo: Option<bool>,
    #[serde(default)]
    pub best_of: Option<u64>,
    #[serde(default)]
    pub suffix: Option<Value>,
    #[serde(default)]
    pub tools: Option<Value>,
    #[serde(default)]
    pub response_format: Option<Value>,
}

impl Sampling {
    /// Refuses what would change the output and is not implemented, naming the field.
    pub fn refuse_unsupported(&self) -> Result<(), ApiError> {
        let refuse = |param: &str, what: &str| {
            Err(ApiError::bad_request(
                param,
                format!("`{param}` {what} is not supported by stagehand serve; leave it out"),
            ))
        };
        if self.n.is_some_and(|n| n != 1) || self.best_of.is_some_and(|n| n != 1) {
            return refuse("n", "above 1");
        }
        if self.presence_penalty.is_some_and(|p| p != 0.0) {
            return refuse("presence_penalty", "other than 0");
        }
        if self.frequency_penalty.is_some_and(|p| p != 0.0) {
            return refuse("frequency_penalty", "other than 0");
        }
        if self.logprobs.as_ref().is_some_and(is_set)
            || self.top_logprobs.as_ref().is_some_and(is_set)
        {
            return refuse("logprobs", "(token log-probabilities)");
        }
        if self.logit_bias.as_ref().is_some_and(is_set) {
            return refuse("logit_bias", "");
        }
        if self.echo == Some(true) {
            return refuse("echo", "true");
        }
        if self.suffix.as_ref().is_some_and(is_set) {
            return refuse("suffix", "");
        }
        if self.tools.as_ref().is_some_and(is_set) {
            return refuse("tools", "(function calling)");
        }
        if self.response_format.as_ref().is_some_and(|format| {
            format
                .get("type")
                .and_then(Value::as_str)
                .is_some_and(|kind| kind != "text")
        }) {
            return refuse("response_format", "other than text");
        }
        Ok(())
    }
}

/// A JSON value that asks for something: not null, false, 0 or empty.
fn is_set(value: &Value) -> bool {
    match value {
        Value::Null => false,
        Value::Bool(flag) => *flag,
        Value::Number(number) => number.as_f64() != Some(0.0),
        Value::Array(items) => !items.is_empty(),
        Value::Object(fields) => !fields.is_empty(),
        Value::String(_) => true,
    }
}

#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub model: String,
    pub prompt: TextInput,
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// A chat message's content: text, or parts of which the text ones are kept.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Value>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub model: String,
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub sampling: Sampling,
}

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    pub total_tokens: usize,
}

impl Usage {
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Self {
        Self {
            prompt_tokens,
            completion_tokens,
            total_tokens: prompt_tokens + completion_tokens,
        }
    }
}
