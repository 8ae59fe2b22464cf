//! A BERT-style WordPiece `tokenizer.json` for generated folders: BERT's special ids
//! ([PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103), single characters and their
//! `##` continuations, a list of common words, and `[unusedN]` filler up to the
//! model's vocabulary size. Hugging Face's `tokenizers` reads it like a real one.

use serde_json::{json, Value};

const WORDS: &[&str] = &[
    "the", "a", "an", "is", "are", "was", "of", "to", "and", "in", "on", "at", "for", "with",
    "man", "woman", "men", "women", "cat", "dog", "horse", "food", "bread", "piece", "eating",
    "riding", "playing", "violin", "movie", "new", "awesome", "sits", "outside", "two", "pushed",
    "carts", "through", "woods", "weights", "stream", "from", "disk", "memory", "device", "just",
    "ahead", "compute", "model", "models", "fast", "slow", "hello", "world", "this", "that", "it",
    "be", "as", "by", "we", "you", "they", "he", "she", "not", "or", "but",
];

/// The vocabulary: index = token id.
fn vocabulary(size: usize) -> Vec<String> {
    let mut vocab: Vec<String> = Vec::with_capacity(size);
    vocab.push("[PAD]".into());
    while vocab.len() < 100 {
        vocab.push(format!("[unused{}]", vocab.len() - 1));
    }
    for special in ["[UNK]", "[CLS]", "[SEP]", "[MASK]"] {
        vocab.push(special.into());
    }
    let characters: Vec<char> = ('a'..='z')
        .chain('0'..='9')
        .chain("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~".chars())
        .collect();
    for &character in &characters {
        vocab.push(character.to_string());
    }
    for &character in &characters {
        vocab.push(format!("##{character}"));
    }
    vocab.extend(WORDS.iter().map(|word| word.to_string()));
    let mut filler = 0;
    while vocab.len() < size {
        vocab.push(format!("[unused{}]", 99 + filler));
        filler += 1;
    }
    vocab.truncate(size);
    vocab
}

/// The smallest vocabulary the tokenizer needs (specials, characters, words).
pub fn minimum_vocabulary() -> usize {
    vocabulary(0).len()
}

/// `tokenizer.json` for a vocabulary of `size` ids (at least [`minimum_vocabulary`]).
pub fn tokenizer_json(size: usize) -> Value {
    let vocab = vocabulary(size.max(minimum_vocabulary()));
    let ids: serde_json::Map<String, Value> = vocab
        .iter()
        .enumerate()
        .map(|(id, token)| (token.clone(), json!(id)))
        .collect();
    let added = |id: usize, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    let special =
        |name: &str, type_id: u32| json!({"SpecialToken": {"id": name, "type_id": type_id}});
    let sequence = |name: &str, type_id: u32| json!({"Sequence": {"id": name, "type_id": type_id}});
    json!({
        "version": "1.0",
        "truncation": {"direction": "Right", "max_length": 128, "strategy": "LongestFirst", "stride": 0},
        "padding": null,
        "added_tokens": [added(0, "[PAD]"), added(100, "[UNK]"), added(101, "[CLS]"),
                         added(102, "[SEP]"), added(103, "[MASK]")],
        "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true,
                       "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [special("[CLS]", 0), sequence("A", 0), special("[SEP]", 0)],
            "pair": [special("[CLS]", 0), sequence("A", 0), special("[SEP]", 0),
                     sequence("B", 1), special("[SEP]", 1)],
            "special_tokens": {
                "[CLS]": {"id": "[CLS]", "ids": [101], "tokens": ["[CLS]"]},
                "[SEP]": {"id": "[SEP]", "ids": [102], "tokens": ["[SEP]"]}
            }
        },
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
                  "max_input_chars_per_word": 100, "vocab": ids}
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hugging_face_reads_it_and_splits_words_into_known_pieces() {
        // Proves the generated file loads in `tokenizers`, frames a text with [CLS] and
        // [SEP], and never falls back to [UNK] for plain English.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, tokenizer_json(1024).to_string()).unwrap();
        let tokenizer = tokenizers::Tokenizer::from_file(&path).unwrap();
        let encoding = tokenizer
            .encode("A man is eating a piece of bread.", true)
            .unwrap();
        let ids = encoding.get_ids();
        assert_eq!((ids[0], ids[ids.len() - 1]), (101, 102));
        assert!(!ids.contains(&100), "no [UNK] in {ids:?}");
        let unusual = tokenizer.encode("Zyxt", true).unwrap();
        assert!(
            unusual.get_ids().len() > 3,
            "unknown words split into characters"
        );
        assert!(minimum_vocabulary() < 1024);
    }
}

/// GPT-2's byte-to-character map of byte-level tokenizers: printable bytes stand for
/// themselves, the rest are shifted above 255 so every byte is a visible character.
fn byte_characters() -> Vec<char> {
    let printable = |byte: u32| {
        (u32::from(b'!')..=u32::from(b'~')).contains(&byte)
            || (0xA1..=0xAC).contains(&byte)
            || (0xAE..=0xFF).contains(&byte)
    };
    let mut shifted = 0;
    (0u32..256)
        .map(|byte| {
            if printable(byte) {
                char::from_u32(byte).unwrap_or('?')
            } else {
                shifted += 1;
                char::from_u32(255 + shifted).unwrap_or('?')
            }
        })
        .collect()
}

/// The special tokens of generated decoders, after the 256 byte tokens.
pub const BEGIN_OF_TEXT: &str = "<|begin_of_text|>";
pub const END_OF_TEXT: &str = "<|end_of_text|>";

/// A byte-level `tokenizer.json` (one token per byte, like a BPE with no merges),
/// with `<|begin_of_text|>` (id 256) prepended to every text and `<|end_of_text|>`
/// (id 257). The model's vocabulary may be larger: ids past 257 decode to nothing.
pub fn byte_level_tokenizer_json() -> Value {
    let mut vocab: serde_json::Map<String, Value> = byte_characters()
        .into_iter()
        .enumerate()
        .map(|(id, character)| (character.to_string(), json!(id)))
        .collect();
    vocab.insert(BEGIN_OF_TEXT.into(), json!(256));
    vocab.insert(END_OF_TEXT.into(), json!(257));
    let added = |id: usize, content: &str| {
        json!({"id": id, "content": content, "single_word": false, "lstrip": false,
               "rstrip": false, "normalized": false, "special": true})
    };
    let byte_level = json!({"type": "ByteLevel", "add_prefix_space": false,
                            "trim_offsets": true, "use_regex": true});
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [added(256, BEGIN_OF_TEXT), added(257, END_OF_TEXT)],
        "normalizer": null,
        "pre_tokenizer": byte_level,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": BEGIN_OF_TEXT, "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": BEGIN_OF_TEXT, "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {BEGIN_OF_TEXT: {"id": BEGIN_OF_TEXT, "ids": [256], "tokens": [BEGIN_OF_TEXT]}}
        },
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
                  "continuing_subword_prefix": null, "end_of_word_suffix": null,
                  "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
                  "vocab": vocab, "merges": []}
    })
}

/// `tokenizer_config.json` for the byte-level tokenizer: its special tokens and a chat
/// template (Jinja, as Hugging Face's `apply_chat_template` renders it), so a served
/// generated decoder answers chat requests.
pub fn chat_tokenizer_config_json() -> Value {
    json!({
        "bos_token": BEGIN_OF_TEXT,
        "eos_token": END_OF_TEXT,
        "add_bos_token": true,
        "model_max_length": 2048,
        "chat_template": CHAT_TEMPLATE,
    })
}

/// Each message as `<|role|>` and its text on the next line; the assistant's turn last.
const CHAT_TEMPLATE: &str = "{{ bos_token }}{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}";

#[cfg(test)]
mod byte_level_tests {
    use super::*;

    #[test]
    fn every_byte_is_a_token_and_text_round_trips() {
        // Proves the byte-level tokenizer loads, marks the start, and decodes back.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tokenizer.json");
        std::fs::write(&path, byte_level_tokenizer_json().to_string()).unwrap();
        let tokenizer = tokenizers::Tokenizer::from_file(&path).unwrap();
        let text = "héllo, wörld!";
        let ids = tokenizer.encode(text, true).unwrap().get_ids().to_vec();
        assert_eq!(ids[0], 256);
        assert_eq!(ids.len(), 1 + text.len(), "one token per byte");
        assert_eq!(tokenizer.decode(&ids[1..], true).unwrap(), text);
    }
}
