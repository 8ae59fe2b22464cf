#!/usr/bin/env python3
"""Fixtures of umT5 (WAN 2.1/2.2's text encoder) for tests/umt5_reference.rs.

A tiny UMT5EncoderModel of transformers (3 blocks, d_model 32, 4 heads of 8, d_ff 64,
32 buckets reaching 128 positions: every block with its own relative_attention_bias),
seeded weights rounded to bf16 values, saved by save_pretrained as a WAN folder keeps
it (text_encoder/, config `UMT5EncoderModel`), beside tokenizer/: a unigram vocabulary
trained on a small corpus, laid out as umT5's (<pad> 0, </s> 1, <unk> 2, the byte
pieces <0x00>..<0xFF> for byte fallback, the learned pieces, then <extra_id_N>),
saved as tokenizer.json with a tokenizer_config.json naming T5Tokenizer.

expected.safetensors (from the tokenizer and model as transformers loads them back):
- ids [L]: the prompt's ids, padded with <pad> to L = 512 as WanPipeline pads them;
- states [1, L, D]: last_hidden_state of the padded ids with no attention mask (as
  the T5 check of the Flux pipeline computes it);
- states_f64 [1, L, D]: the same computed in f64 (rounded to f32): the states
  without either side's f32 rounding;
- states_masked [1, L, D]: the same with the tokenizer's attention mask, which is
  what WanPipeline passes (its padded rows then zeroed): the reference for a masked
  encoder, which stagehand does not compute yet.
"""

import json
import os
import shutil

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import AutoTokenizer, UMT5Config, UMT5EncoderModel

torch.set_num_threads(2)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "umt5")
MAX_SEQUENCE_LENGTH = 512
# English and Chinese (WAN's default negative prompt is Chinese), every character in
# the vocabulary: transformers 5's T5Tokenizer rebuilds the unigram model with
# byte_fallback off whatever tokenizer.json says, the `tokenizers` crate honours the
# file, so a character outside the vocabulary is <unk> to one and its UTF-8 bytes to
# the other (tests/umt5_reference.rs pins that difference down).
PROMPT = "a red fox runs through the snow at sunset, 色调艳丽，过曝, highly detailed"

CORPUS = [
    "a photo of a cat sitting on a mat",
    "a red fox in the snow, highly detailed photograph",
    "an astronaut riding a horse on the moon",
    "a painting of a lighthouse at sunset, oil on canvas",
    "the quick brown fox jumps over the lazy dog",
    "a city street at night in the rain with neon signs",
    "mountains and a lake under a clear blue sky",
    "a small robot runs through a library",
    "色调艳丽，过曝，静态，细节模糊不清",
] * 4

SPECIAL = ["<pad>", "</s>", "<unk>"]
EXTRA_IDS = 3


def tokenizer_folder(folder):
    """A byte-fallback unigram vocabulary laid out as umT5's, saved as tokenizer.json."""
    trained = Tokenizer(models.Unigram())
    trained.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")]
    )
    trainer = trainers.UnigramTrainer(vocab_size=150, unk_token="<unk>", special_tokens=SPECIAL, show_progress=False)
    trained.train_from_iterator(CORPUS, trainer)
    pieces = json.loads(trained.to_str())["model"]["vocab"]
    vocab = [(token, 0.0) for token in SPECIAL]
    vocab += [(f"<0x{byte:02X}>", 0.0) for byte in range(256)]
    vocab += [(piece, score) for piece, score in pieces if piece not in SPECIAL]
    vocab += [(f"<extra_id_{i}>", 0.0) for i in range(EXTRA_IDS - 1, -1, -1)]
    tokenizer = Tokenizer(models.Unigram(vocab, unk_id=2, byte_fallback=True))
    tokenizer.pre_tokenizer = trained.pre_tokenizer
    tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="always")])
    tokenizer.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    tokenizer.add_special_tokens([token for token, _ in vocab if token in SPECIAL or token.startswith("<extra_id_")])
    os.makedirs(folder, exist_ok=True)
    tokenizer.save(os.path.join(folder, "tokenizer.json"))
    with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
        json.dump(
            {
                "tokenizer_class": "T5Tokenizer",
                "eos_token": "</s>",
                "pad_token": "<pad>",
                "unk_token": "<unk>",
                "extra_ids": EXTRA_IDS,
                "additional_special_tokens": [f"<extra_id_{i}>" for i in range(EXTRA_IDS)],
                "model_max_length": MAX_SEQUENCE_LENGTH,
            },
            f,
            indent=2,
        )
    return len(vocab)


def randomise(model, seed, head_dim):
    """Seeded weights of bf16 values: matrices ~ N(0, 1/fan_in), norms near 1; the
    queries a further 1/sqrt(d_kv) smaller, as T5's initialisation folds the score
    scaling it leaves out into q (unit-sized scores: with N(0, 1/fan_in) queries the
    sharper softmax over 512 keys puts f32 itself 2e-5 away from f64)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim >= 2:
                fan_in = parameter[0].numel()
                scale = fan_in**0.5 * (head_dim**0.5 if name.endswith(".q.weight") else 1.0)
                parameter.copy_(torch.randn_like(parameter) / scale)
            else:
                parameter.copy_(1.0 + 0.1 * torch.randn_like(parameter))
            parameter.copy_(parameter.to(torch.bfloat16).float())
    return model.float().eval()


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    vocab = tokenizer_folder(os.path.join(OUT, "tokenizer"))
    config = UMT5Config(
        vocab_size=vocab,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=3,
        num_decoder_layers=3,
        num_heads=4,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        feed_forward_proj="gated-gelu",
    )
    model = randomise(UMT5EncoderModel(config), seed=41, head_dim=config.d_kv)
    model.save_pretrained(os.path.join(OUT, "text_encoder"))
    biases = [block.layer[0].SelfAttention.relative_attention_bias.weight for block in model.encoder.block]
    assert not torch.equal(biases[0], biases[1]), "every block has its own position bias"

    tokenizer = AutoTokenizer.from_pretrained(os.path.join(OUT, "tokenizer"))
    inputs = tokenizer(
        [PROMPT],
        padding="max_length",
        max_length=MAX_SEQUENCE_LENGTH,
        truncation=True,
        add_special_tokens=True,
        return_attention_mask=True,
        return_tensors="pt",
    )
    ids, mask = inputs.input_ids, inputs.attention_mask
    reloaded = UMT5EncoderModel.from_pretrained(os.path.join(OUT, "text_encoder")).float().eval()
    with torch.no_grad():
        states = reloaded(ids).last_hidden_state
        states_masked = reloaded(ids, mask).last_hidden_state
        # The same model in f64, without either side's f32 rounding.
        exact = reloaded.double()(ids).last_hidden_state.float()
    save_file(
        {
            "ids": ids[0].to(torch.float32).contiguous(),
            "states": states.contiguous(),
            "states_f64": exact.contiguous(),
            "states_masked": states_masked.contiguous(),
        },
        os.path.join(OUT, "expected.safetensors"),
    )
    real = int(mask.sum())
    print("wrote", OUT, "vocab", vocab, "tokens", real, "ids", ids[0, :real].tolist())


if __name__ == "__main__":
    main()
