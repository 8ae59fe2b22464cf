//! Reading a `tokenizer.json` with Hugging Face's `tokenizers`, the one way every
//! edge (pipelines' text encoders, embedders, decoders, serve) loads one.
//!
//! `tokenizers` 0.23.2 panics on some malformed files instead of returning its error:
//! `DecoderWrapper`'s deserializer ends in `.expect("Helper")` (decoders/mod.rs:90),
//! so a `"decoder"` object that is not JSON (found by the fuzz target
//! `tokenizer_file`) aborts the process. That panic is inside a crate stagehand cannot
//! change, so it is caught here, once, and turned into an error like the crate's own.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;

use tokenizers::Tokenizer;

/// Why a `tokenizer.json` could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TokenizerFileError {
    /// `tokenizers` refused it (not JSON, an unknown model, a missing file …).
    #[error("{0}")]
    Refused(tokenizers::Error),
    /// `tokenizers` panicked reading it (a malformed file it does not check).
    #[error("malformed ({0})")]
    Panicked(String),
}

/// The tokenizer of the `tokenizer.json` at `path`.
pub fn read(path: &Path) -> Result<Tokenizer, TokenizerFileError> {
    let read = catch_unwind(AssertUnwindSafe(|| Tokenizer::from_file(path)));
    match read {
        Ok(read) => read.map_err(TokenizerFileError::Refused),
        Err(panic) => {
            let message = (panic.downcast_ref::<&str>().map(|text| text.to_string()))
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic in the tokenizers crate".into());
            Err(TokenizerFileError::Panicked(message))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decoder_that_is_not_json_is_an_error_not_a_panic() {
        // Proves the regression of the fuzz target tokenizer_file: a decoder object
        // holding a bare word panicked inside tokenizers 0.23.2 (`expect("Helper")`).
        let dir = tempfile::tempdir().expect("a folder");
        let path = dir.path().join("tokenizer.json");
        let text = br#"{"decoder":{"type":"Sequence","decoders":[{d}]}}"#;
        std::fs::write(&path, text).expect("written");
        assert!(matches!(read(&path), Err(TokenizerFileError::Panicked(_))));
        std::fs::write(&path, b"not json").expect("written");
        assert!(matches!(read(&path), Err(TokenizerFileError::Refused(_))));
    }
}
