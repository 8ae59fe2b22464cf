//! The text of a generation as its tokens come, cut at the first stop sequence, and
//! what of it is safe to send: text that could still turn out to begin a stop
//! sequence is held back until the next token decides.

use crate::run::text::TextPrinter;

/// A generation's text so far.
pub struct StopText {
    printer: TextPrinter,
    stops: Vec<String>,
    text: String,
    sent: usize,
    stopped: bool,
}

impl StopText {
    pub fn new(tokenizer: Option<tokenizers::Tokenizer>, stops: Vec<String>) -> Self {
        Self {
            printer: TextPrinter::new(tokenizer),
            stops: stops.into_iter().filter(|stop| !stop.is_empty()).collect(),
            text: String::new(),
            sent: 0,
            stopped: false,
        }
    }

    /// Adds `token`; returns the text newly safe to send and whether a stop sequence
    /// was reached (the text ends before it, and nothing more follows).
    pub fn push(&mut self, token: u32) -> (String, bool) {
        if self.stopped {
            return (String::new(), true);
        }
        self.text.push_str(&self.printer.push(token));
        if let Some(at) = self.first_stop() {
            self.text.truncate(at);
            self.stopped = true;
            return (self.take(self.text.len()), true);
        }
        let safe = self.text.len() - self.held_back();
        (self.take(safe), false)
    }

    /// What is left once the sequence ended without a stop sequence.
    pub fn finish(&mut self) -> String {
        self.take(self.text.len())
    }

    /// The whole text (up to a stop sequence).
    pub fn text(&self) -> &str {
        &self.text
    }

    fn take(&mut self, end: usize) -> String {
        let end = end.max(self.sent);
        let fresh = self
            .text
            .get(self.sent..end)
            .unwrap_or_default()
            .to_string();
        self.sent = end;
        fresh
    }

    fn first_stop(&self) -> Option<usize> {
        self.stops
            .iter()
            .filter_map(|stop| self.text.find(stop.as_str()))
            .min()
    }

    /// Bytes at the end of the text that begin some stop sequence.
    fn held_back(&self) -> usize {
        let mut longest = 0;
        for stop in &self.stops {
            for (cut, _) in stop.char_indices().skip(1) {
                if cut > longest && self.text.ends_with(&stop[..cut]) {
                    longest = cut;
                }
            }
        }
        longest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cut_at_the_first_stop_and_a_partial_stop_is_held_back() {
        // Proves a stop sequence spanning tokens is found, and no part of it is sent.
        let mut text = StopText::new(None, vec!["<2><3>".into()]);
        let mut sent = String::new();
        let mut stopped = false;
        for id in [1, 2, 3, 4] {
            let (fresh, stop) = text.push(id);
            sent.push_str(&fresh);
            if stop {
                stopped = true;
                break;
            }
        }
        assert!(stopped);
        assert_eq!(sent, "<1>");
        assert_eq!(text.text(), "<1>");
    }

    #[test]
    fn without_a_stop_everything_is_sent() {
        // Proves held-back text is released when the sequence ends.
        let mut text = StopText::new(None, vec!["<9>x".into()]);
        let mut sent = String::new();
        for id in [1, 9] {
            sent.push_str(&text.push(id).0);
        }
        assert_eq!(sent, "<1>");
        sent.push_str(&text.finish());
        assert_eq!(sent, "<1><9>");
    }
}
