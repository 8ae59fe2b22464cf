//! A pipeline's prompt as its text encoders see it: tokenized by Hugging Face's own
//! tokenizer, cut and padded to one fixed length as diffusers' `FluxPipeline` pads it
//! (`padding="max_length"`, `truncation=True`: CLIP to its 77 positions with
//! `<|endoftext|>`, T5 to `max_sequence_length` with `<pad>`).
//!
//! Where the tokenizer is: the encoder's own folder, or the pipeline folder's
//! sibling (`text_encoder/` → `tokenizer/`, `text_encoder_2/` → `tokenizer_2/`), as
//! `tokenizer.json` (transformers 5) or, for CLIP, `vocab.json` + `merges.txt` as the
//! published FLUX.1 folders ship it — turned here into the `tokenizer.json` that
//! transformers' `CLIPTokenizer` builds from those two files.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde_json::{json, Value};
use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

use super::inputs::{EncoderInput, BUILT_IN_IMAGE_PROMPT};
use super::FamilyError;

/// What a text encoder's prompts are cut and padded to.
pub struct PromptTokenizer {
    tokenizer: Tokenizer,
    /// Where it was read from, for messages.
    pub source: PathBuf,
    /// Every prompt's length in tokens, padding included.
    pub length: usize,
}

/// One prompt's ids, `length` long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptIds {
    pub ids: Vec<u32>,
    /// The prompt's own tokens, before the padding (its attention mask's ones).
    pub tokens: usize,
    /// The prompt was longer than `length` and was cut.
    pub truncated: bool,
}

/// The tokenizer files of the CLIP layout FLUX.1 ships.
const CLIP_FILES: [&str; 2] = ["vocab.json", "merges.txt"];

impl PromptTokenizer {
    /// The tokenizer of the text encoder in `dir`, cutting and padding every prompt
    /// to `length` tokens with its pad token (`fallback_pad` when
    /// `tokenizer_config.json` names none).
    pub fn for_encoder(dir: &Path, length: usize, fallback_pad: &str) -> Result<Self, FamilyError> {
        let candidates = tokenizer_dirs(dir);
        let Some((folder, tokenizer)) = candidates
            .iter()
            .find_map(|folder| read_tokenizer(folder).map(|tokenizer| (folder.clone(), tokenizer)))
        else {
            let looked: Vec<String> = candidates
                .iter()
                .map(|folder| folder.display().to_string())
                .collect();
            return Err(FamilyError::missing_file(dir, format!(
                "{}: no tokenizer (tokenizer.json, or vocab.json + merges.txt) in {}; give the text encoder's folder inside its pipeline, or put its tokenizer beside it",
                dir.display(),
                looked.join(" or ")
            )));
        };
        let mut tokenizer = tokenizer?;
        let pad = pad_token(&folder).unwrap_or_else(|| fallback_pad.to_string());
        let Some(pad_id) = tokenizer.token_to_id(&pad) else {
            return Err(FamilyError::bad_file(
                &folder,
                format!(
                    "{}: the pad token `{pad}` is not in the tokenizer's vocabulary",
                    folder.display()
                ),
            ));
        };
        let fail = |error: tokenizers::Error| {
            FamilyError::bad_file(&folder, format!("{}: {error}", folder.display()))
        };
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: length,
                ..TruncationParams::default()
            }))
            .map_err(fail)?;
        tokenizer.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::Fixed(length),
            pad_id,
            pad_token: pad,
            ..PaddingParams::default()
        }));
        Ok(Self {
            tokenizer,
            source: folder,
            length,
        })
    }

    /// `text`'s ids, with the tokenizer's special tokens, cut and padded.
    pub fn encode(&self, text: &str) -> Result<PromptIds, FamilyError> {
        let encoding = self.tokenizer.encode(text, true).map_err(|error| {
            FamilyError::request(
                "prompt",
                format!(
                    "{}: could not tokenize the prompt ({error})",
                    self.source.display()
                ),
            )
        })?;
        let tokens = encoding
            .get_attention_mask()
            .iter()
            .filter(|&&kept| kept == 1)
            .count();
        Ok(PromptIds {
            ids: encoding.get_ids().to_vec(),
            tokens: tokens.max(1),
            truncated: !encoding.get_overflowing().is_empty(),
        })
    }
}

/// A text encoder's prompts, `batch` a step: which a step encodes, which were cut.
pub struct PromptBatches {
    prompts: Vec<PromptIds>,
    batch: usize,
    truncated: Vec<usize>,
}

impl PromptBatches {
    pub fn new(prompts: Vec<PromptIds>, batch: usize) -> Result<Self, FamilyError> {
        if prompts.is_empty() {
            return Err(FamilyError::request("prompt", "no prompt to encode".into()));
        }
        let truncated = (prompts.iter().enumerate())
            .filter(|(_, prompt)| prompt.truncated)
            .map(|(position, _)| position)
            .collect();
        Ok(Self {
            prompts,
            batch: batch.max(1),
            truncated,
        })
    }

    /// The first token id at or above `vocab`, if any prompt has one.
    pub fn outside(&self, vocab: usize) -> Option<u32> {
        (self.prompts.iter().flat_map(|prompt| &prompt.ids))
            .find(|&&id| id as usize >= vocab)
            .copied()
    }

    /// Steps that encode every prompt once.
    fn batches(&self) -> u64 {
        self.prompts.len().div_ceil(self.batch) as u64
    }

    /// The prompts step `step` encodes (steps cycle through the batches).
    pub fn of_step(&self, step: u64) -> &[PromptIds] {
        let first = (step % self.batches()) as usize * self.batch;
        &self.prompts[first..(first + self.batch).min(self.prompts.len())]
    }

    /// Steps with the same key encode the same prompts.
    pub fn reference_key(&self, step: u64) -> u64 {
        step % self.batches()
    }

    /// The prompts cut short, by position.
    pub fn truncated(&self) -> &[usize] {
        &self.truncated
    }
}

/// The prompts a text encoder in `dir` encodes: `input`'s texts tokenized (or its
/// ids, each `length` long), or the built-in prompt.
pub fn prompts(
    dir: &Path,
    input: Option<&EncoderInput>,
    length: usize,
    fallback_pad: &str,
) -> Result<Vec<PromptIds>, FamilyError> {
    let texts = match input {
        Some(EncoderInput::TokenIds(ids)) => {
            return ids
                .iter()
                .map(|ids| {
                    if ids.len() != length {
                        return Err(FamilyError::request("token_ids", format!(
                            "--token-ids: a text encoder's prompt is {length} ids (padded as its tokenizer pads); got {}",
                            ids.len()
                        )));
                    }
                    // Given ids carry no mask: every one is the prompt's.
                    Ok(PromptIds {
                        ids: ids.clone(),
                        tokens: length,
                        truncated: false,
                    })
                })
                .collect();
        }
        Some(EncoderInput::Texts(texts)) => texts.clone(),
        None => vec![BUILT_IN_IMAGE_PROMPT.to_string()],
    };
    if texts.is_empty() {
        return Err(FamilyError::request("prompt", "no prompt to encode".into()));
    }
    let tokenizer = PromptTokenizer::for_encoder(dir, length, fallback_pad)?;
    texts.iter().map(|text| tokenizer.encode(text)).collect()
}

/// Where the text encoder `request` opens looks for its tokenizer: the folder the
/// run names, else its own folder (and its pipeline's tokenizer folder).
pub fn tokenizer_home(request: &super::registry::Request<'_>) -> Result<PathBuf, FamilyError> {
    if let Some(dir) = &request.extras.tokenizer {
        return Ok(dir.clone());
    }
    if let Some(folder) = request.folder {
        return Ok(folder.dir.clone());
    }
    // Token ids need no tokenizer.
    if let Some(EncoderInput::TokenIds(_)) = request.extras.input() {
        return Ok(PathBuf::new());
    }
    Err(FamilyError::missing_file(request.path, format!(
        "{}: a text encoder given as a file (no config.json beside it) needs the folder of its tokenizer (tokenizer.json, or CLIP's vocab.json + merges.txt: ComfyUI keeps them in comfy/sd1_tokenizer and comfy/text_encoders/t5_tokenizer, a diffusers pipeline in tokenizer/ and tokenizer_2/)",
        request.path.display()
    )))
}

/// Where a text encoder's tokenizer may be: its own folder, then its pipeline's
/// tokenizer folder of the same number.
fn tokenizer_dirs(dir: &Path) -> Vec<PathBuf> {
    let mut dirs = vec![dir.to_path_buf()];
    let name = dir.file_name().and_then(|name| name.to_str()).unwrap_or("");
    if let (Some(suffix), Some(parent)) = (name.strip_prefix("text_encoder"), dir.parent()) {
        dirs.push(parent.join(format!("tokenizer{suffix}")));
    }
    dirs
}

/// The tokenizer of `folder`, if it has one: `tokenizer.json`, else CLIP's
/// `vocab.json` + `merges.txt`.
fn read_tokenizer(folder: &Path) -> Option<Result<Tokenizer, FamilyError>> {
    let json = folder.join("tokenizer.json");
    if json.is_file() {
        return Some(super::tokenizer_json::read(&json).map_err(|error| {
            FamilyError::bad_file(
                &json,
                format!(
                    "{}: is not a tokenizer Hugging Face's tokenizers can read ({error})",
                    json.display()
                ),
            )
        }));
    }
    if CLIP_FILES.iter().all(|name| folder.join(name).is_file()) {
        return Some(clip_from_vocab(folder));
    }
    None
}

/// `tokenizer_config.json`'s `pad_token` (a string, or `{"content": …}`).
fn pad_token(folder: &Path) -> Option<String> {
    let text = std::fs::read_to_string(folder.join("tokenizer_config.json")).ok()?;
    let config: Value = serde_json::from_str(&text).ok()?;
    match config.get("pad_token")? {
        Value::String(token) => Some(token.clone()),
        Value::Object(token) => token.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// CLIP's tokenizer from `vocab.json` and `merges.txt`: what transformers'
/// `CLIPTokenizer` builds from them (NFC, whitespace runs to one space, lower case;
/// CLIP's split pattern, then byte-level; BPE with `</w>` ending a word;
/// `<|startoftext|>` … `<|endoftext|>` around every text).
fn clip_from_vocab(folder: &Path) -> Result<Tokenizer, FamilyError> {
    let read = |name: &str| {
        std::fs::read_to_string(folder.join(name)).map_err(|error| FamilyError::Io {
            path: folder.join(name).display().to_string(),
            reason: error.to_string(),
        })
    };
    let bad = |name: &str, problem: String| {
        FamilyError::bad_file(
            &folder.join(name),
            format!("{}: {problem}", folder.join(name).display()),
        )
    };
    let vocab: Value = serde_json::from_str(&read("vocab.json")?)
        .map_err(|error| bad("vocab.json", format!("is not JSON ({error})")))?;
    let merges: Vec<Value> = read("merges.txt")?
        .lines()
        .filter(|line| !line.starts_with("#version") && !line.trim().is_empty())
        .map(|line| {
            let mut pair = line.split(' ');
            match (pair.next(), pair.next(), pair.next()) {
                (Some(left), Some(right), None) => Ok(json!([left, right])),
                _ => Err(bad(
                    "merges.txt",
                    format!("`{line}` is not a pair of symbols"),
                )),
            }
        })
        .collect::<Result<_, _>>()?;
    let id = |token: &str| {
        vocab
            .get(token)
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("vocab.json", format!("has no `{token}`")))
    };
    let (start, end) = (id("<|startoftext|>")?, id("<|endoftext|>")?);
    let special = |token: &str, id: u64| {
        json!({"id": id, "content": token, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    let split = r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+";
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special("<|startoftext|>", start), special("<|endoftext|>", end)],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "NFC"},
            {"type": "Replace", "pattern": {"Regex": r"\s+"}, "content": " "},
            {"type": "Lowercase"}]},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Removed", "invert": true},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}]},
        "post_processor": {"type": "RobertaProcessing", "sep": ["<|endoftext|>", end],
            "cls": ["<|startoftext|>", start], "trim_offsets": false, "add_prefix_space": false},
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": "<|endoftext|>",
            "continuing_subword_prefix": "", "end_of_word_suffix": "</w>", "fuse_unk": false,
            "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": merges}
    });
    Tokenizer::from_str(&tokenizer.to_string()).map_err(|error| {
        bad(
            "vocab.json",
            format!("does not make a CLIP tokenizer ({error})"),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipelines_text_encoder_finds_the_tokenizer_of_its_number() {
        // Proves text_encoder_2 looks in tokenizer_2 and text_encoder in tokenizer.
        let dirs = tokenizer_dirs(Path::new("/p/text_encoder_2"));
        assert_eq!(dirs[1], Path::new("/p/tokenizer_2"));
        let dirs = tokenizer_dirs(Path::new("/p/text_encoder"));
        assert_eq!(dirs[1], Path::new("/p/tokenizer"));
        assert_eq!(tokenizer_dirs(Path::new("/p/clip")).len(), 1);
    }
}
