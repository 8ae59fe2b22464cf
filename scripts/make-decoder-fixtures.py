#!/usr/bin/env python3
"""Writes tests/fixtures/decoders/: small decoder folders that transformers itself
wrote (save_pretrained of a seeded random model: hidden 32, 2 layers, vocabulary 128,
f32), each with reference.json holding what transformers computed from the saved
folder (from_pretrained, eager attention, f32) for a fixed prompt of token ids: the
last position's logits of the prefill and of 15 decode steps over its KV cache, and
the 16 greedy tokens they pick.

tests/decoder_reference.rs reads these files; only this script needs PyTorch:

    python3 -m venv /work/venv && /work/venv/bin/pip install torch transformers
    /work/venv/bin/python scripts/make-decoder-fixtures.py

Every fixture is checked before it is written: each greedy pick leads the runner-up
by at least MARGIN (so a rounding difference cannot flip a token), and where a
fixture exists for one config key (a rope type, a bias) the same weights without
that key give logits at least CONTRAST away, so the fixture really tests the key.
"""

import json
import math
import pathlib
import shutil
import sys

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM

ROOT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "decoders"
PROMPT = [1, 17, 42, 99, 5, 63, 100, 7]
STEPS = 16
MARGIN = 1e-3
CONTRAST = 1e-2

BASE = dict(
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=16,
    vocab_size=128,
    max_position_embeddings=64,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
)


def rope(kind, theta=10000.0, **fields):
    return {"rope_type": kind, "rope_theta": theta, **fields}


# name -> (model_type, config overrides, contrast overrides or None)
FIXTURES = {
    "llama3": (
        "llama",
        dict(rope_parameters=rope("llama3", 500000.0, factor=8.0, low_freq_factor=1.0,
                                  high_freq_factor=4.0, original_max_position_embeddings=8)),
        dict(rope_parameters=rope("default", 500000.0)),
    ),
    "llama-linear": (
        "llama",
        dict(rope_parameters=rope("linear", factor=4.0)),
        dict(rope_parameters=rope("default")),
    ),
    "llama-dynamic": (
        "llama",
        # The sequence (8 + 15 tokens) outgrows max_position_embeddings 16.
        dict(max_position_embeddings=16, rope_parameters=rope("dynamic", factor=2.0)),
        dict(max_position_embeddings=16, rope_parameters=rope("default")),
    ),
    "llama-yarn": (
        "llama",
        dict(rope_parameters=rope("yarn", factor=4.0, original_max_position_embeddings=16)),
        dict(rope_parameters=rope("default")),
    ),
    "llama-biases": (
        "llama",
        dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=True),
        None,
    ),
    "mistral": ("mistral", dict(sliding_window=4096), None),
    "qwen2": ("qwen2", dict(rope_parameters=rope("default", 1000000.0)), None),
    # head_dim 32 × 2 heads is wider than hidden 32, as in the real Qwen3 models.
    "qwen3": ("qwen3", dict(head_dim=32), None),
    "qwen3-moe": (
        "qwen3_moe",
        dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
             norm_topk_prob=True),
        dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
             norm_topk_prob=False),
    ),
    "qwen3-moe-sparse-step": (
        "qwen3_moe",
        # Layer 0 dense (intermediate_size), layer 1 experts.
        dict(num_experts=8, num_experts_per_tok=3, moe_intermediate_size=16,
             decoder_sparse_step=2, norm_topk_prob=False),
        None,
    ),
    "qwen2-moe": (
        "qwen2_moe",
        # Layer 0 dense; layer 1 experts and the sigmoid-gated shared expert.
        dict(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
             shared_expert_intermediate_size=48, mlp_only_layers=[0],
             norm_topk_prob=False),
        None,
    ),
    "mixtral": ("mixtral", dict(num_local_experts=4, num_experts_per_tok=2), None),
}


def randomise(model, seed):
    """Every parameter seeded, with spreads that keep activations near 1: transformers'
    initialisation (std 0.02, zero biases, unit norms) would leave the logits flat and
    the norms and biases untested."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float32)
            if "norm" in name:
                parameter.copy_(1.0 + 0.2 * noise)
            elif name.endswith(".bias"):
                parameter.copy_(0.2 * noise)
            elif "embed_tokens" in name:
                parameter.copy_(noise)
            else:
                parameter.copy_(noise * 1.5 / math.sqrt(parameter.shape[-1]))


def greedy(model):
    """Logits of the last position at each of STEPS steps, and the tokens picked."""
    logits, tokens = [], []
    with torch.no_grad():
        output = model(input_ids=torch.tensor([PROMPT]), use_cache=True)
        for _ in range(STEPS):
            last = output.logits[0, -1].to(torch.float32)
            token = int(torch.argmax(last))
            logits.append(last)
            tokens.append(token)
            output = model(
                input_ids=torch.tensor([[token]]),
                past_key_values=output.past_key_values,
                use_cache=True,
            )
    return logits, tokens


def margin(logits):
    top = [torch.topk(row, 2).values for row in logits]
    return min(float(pair[0] - pair[1]) for pair in top)


def model_of(model_type, overrides):
    config = AutoConfig.for_model(model_type, **{**BASE, **overrides})
    config._attn_implementation = "eager"
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)


def write(name, model_type, overrides, contrast):
    folder = ROOT / name
    for seed in range(100):
        model = model_of(model_type, overrides)
        randomise(model, 1000 + seed)
        shutil.rmtree(folder, ignore_errors=True)
        model.save_pretrained(folder)
        # The reference is computed from the folder as saved, the way users load it.
        saved = AutoModelForCausalLM.from_pretrained(
            folder, dtype=torch.float32, attn_implementation="eager"
        ).eval()
        logits, tokens = greedy(saved)
        if margin(logits) < MARGIN:
            continue
        if contrast is not None:
            other = model_of(model_type, contrast)
            other.load_state_dict(saved.state_dict())
            other_logits, _ = greedy(other.eval())
            difference = max(
                float((a - b).abs().max()) for a, b in zip(logits, other_logits)
            )
            if difference < CONTRAST:
                sys.exit(f"{name}: without its key the logits move only {difference}")
        break
    else:
        sys.exit(f"{name}: no seed gave greedy margins of {MARGIN}")
    reference = {
        "written_by": f"transformers {transformers.__version__}, torch {torch.__version__}",
        "seed": 1000 + seed,
        "prompt": PROMPT,
        "tokens": tokens,
        "greedy_margin_min": margin(logits),
        "logits": [[float(f"{value:.9g}") for value in row.tolist()] for row in logits],
    }
    (folder / "reference.json").write_text(json.dumps(reference) + "\n")
    print(f"{name}: seed {1000 + seed}, tokens {tokens}, margin {margin(logits):.4f}")


def main():
    torch.set_num_threads(2)
    ROOT.mkdir(parents=True, exist_ok=True)
    wanted = sys.argv[1:] or list(FIXTURES)
    for name in wanted:
        model_type, overrides, contrast = FIXTURES[name]
        write(name, model_type, overrides, contrast)


if __name__ == "__main__":
    main()
