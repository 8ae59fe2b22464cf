//! Chat templates: the Jinja `chat_template` of a folder's `tokenizer_config.json`,
//! rendered with minijinja as Hugging Face's `apply_chat_template` does (`messages`,
//! `add_generation_prompt`, `bos_token`, `eos_token`, `raise_exception`).

use std::path::Path;

use minijinja::{context, Environment, Error, ErrorKind};
use serde::Serialize;
use serde_json::Value;

/// A folder's chat template and special tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct ChatTemplate {
    source: String,
    bos_token: String,
    eos_token: String,
}

/// One message as the template sees it.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TemplateMessage {
    pub role: String,
    pub content: String,
}

/// A special token in `tokenizer_config.json`: a string or `{"content": …}`.
fn token_text(value: Option<&Value>) -> String {
    match value {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Object(fields)) => fields
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string(),
        _ => String::new(),
    }
}

impl ChatTemplate {
    /// The template of the folder `dir`; `Ok(None)` when it has none (no
    /// `tokenizer_config.json`, or no `chat_template` in it).
    pub fn from_folder(dir: &Path) -> Result<Option<Self>, String> {
        let path = dir.join("tokenizer_config.json");
        let Ok(text) = std::fs::read_to_string(&path) else {
            return Ok(None);
        };
        let config: Value = serde_json::from_str(&text)
            .map_err(|error| format!("{}: not JSON ({error})", path.display()))?;
        let source = match config.get("chat_template") {
            Some(Value::String(source)) => source.clone(),
            // A list of named templates: the default one.
            Some(Value::Array(named)) => named
                .iter()
                .find(|entry| entry.get("name").and_then(Value::as_str) == Some("default"))
                .or_else(|| named.first())
                .and_then(|entry| entry.get("template"))
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_string(),
            _ => return Ok(None),
        };
        if source.is_empty() {
            return Ok(None);
        }
        let template = Self {
            source,
            bos_token: token_text(config.get("bos_token")),
            eos_token: token_text(config.get("eos_token")),
        };
        // A template that does not compile is the folder's fault: say so at start.
        template
            .render(&[TemplateMessage {
                role: "user".into(),
                content: "hello".into(),
            }])
            .map_err(|error| format!("{}: chat_template: {error}", path.display()))?;
        Ok(Some(template))
    }

    /// The prompt text of `messages`, ending with the assistant's turn.
    pub fn render(&self, messages: &[TemplateMessage]) -> Result<String, String> {
        let mut environment = Environment::new();
        environment.add_function(
            "raise_exception",
            |message: String| -> Result<String, Error> {
                Err(Error::new(ErrorKind::InvalidOperation, message))
            },
        );
        environment
            .render_str(
                &self.source,
                context! {
                    messages => messages,
                    add_generation_prompt => true,
                    bos_token => self.bos_token,
                    eos_token => self.eos_token,
                },
            )
            .map_err(|error| error.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generated_decoders_template_renders_each_message_and_the_assistant_turn() {
        // Proves a folder's template is read and rendered as apply_chat_template would.
        let dir = tempfile::tempdir().unwrap();
        let config = crate::model::generated::chat_tokenizer_config_json();
        std::fs::write(dir.path().join("tokenizer_config.json"), config.to_string()).unwrap();
        let template = ChatTemplate::from_folder(dir.path()).unwrap().unwrap();
        let messages = [
            TemplateMessage {
                role: "system".into(),
                content: "be brief".into(),
            },
            TemplateMessage {
                role: "user".into(),
                content: "hi".into(),
            },
        ];
        assert_eq!(
            template.render(&messages).unwrap(),
            "<|begin_of_text|><|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
        );
    }

    #[test]
    fn a_template_that_raises_is_an_error_with_its_message() {
        // Proves raise_exception (used by real templates to refuse roles) surfaces its text.
        let template = ChatTemplate {
            source: "{{ raise_exception('only user and assistant roles') }}".into(),
            bos_token: String::new(),
            eos_token: String::new(),
        };
        let error = template.render(&[]).unwrap_err();
        assert!(error.contains("only user and assistant roles"), "{error}");
    }

    #[test]
    fn a_folder_without_tokenizer_config_has_no_template() {
        // Proves the absence is reported as None (chat refused by name), not an error.
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(ChatTemplate::from_folder(dir.path()).unwrap(), None);
    }
}
