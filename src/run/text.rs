//! Token ids back to text, for the decoders' output: `generate` prints it as it
//! comes, `serve` sends it as it comes.

/// Turns tokens into text as they come: decodes the whole sequence and prints what
/// is new, so multi-byte characters split across tokens come out whole.
pub struct TextPrinter {
    tokenizer: Option<tokenizers::Tokenizer>,
    ids: Vec<u32>,
    printed: usize,
}

impl TextPrinter {
    pub fn new(tokenizer: Option<tokenizers::Tokenizer>) -> Self {
        Self {
            tokenizer,
            ids: Vec::new(),
            printed: 0,
        }
    }

    /// The text of `ids`; an id the tokenizer has no text for (a generated model's
    /// vocabulary is larger than its byte-level tokenizer) shows as `<id>`.
    pub fn text(&self, ids: &[u32]) -> String {
        let Some(tokenizer) = &self.tokenizer else {
            return ids.iter().map(|id| format!("<{id}>")).collect();
        };
        let known = tokenizer.get_vocab_size(true) as u32;
        let mut text = String::new();
        let mut run = Vec::new();
        for &id in ids {
            if id < known {
                run.push(id);
                continue;
            }
            text.push_str(&tokenizer.decode(&run, true).unwrap_or_default());
            run.clear();
            text.push_str(&format!("<{id}>"));
        }
        text.push_str(&tokenizer.decode(&run, true).unwrap_or_default());
        text
    }

    pub fn push(&mut self, token: u32) -> String {
        self.ids.push(token);
        let text = self.text(&self.ids);
        // Hold back a trailing replacement character: the rest of its bytes may come.
        let stable = text.trim_end_matches('\u{FFFD}');
        let fresh = stable.get(self.printed..).unwrap_or_default().to_string();
        self.printed = self.printed.max(stable.len());
        fresh
    }
}
