#!/usr/bin/env python3
"""Writes tests/fixtures/wan_comfy/: the tiny Wan 2.2 A14B pipeline's two experts
(tests/fixtures/wan_pipeline/transformer and transformer_2) as the files ComfyUI users
have, in Wan-AI's original names:

- wan2.2_t2v_high_noise_tiny.safetensors: under `model.diffusion_model.` (ComfyUI's
  re-saved files carry the prefix);
- wan2.2_t2v_low_noise_tiny.safetensors: bare (Wan-AI's own names).

Their heads are not the published models' 128, so each file says its head width in the
metadata `stagehand.wan.attention_head_dim` (what the shapes cannot say). The same
tensors, bit for bit: each is renamed by the inverse of diffusers'
`convert_wan_transformer_to_diffusers` (written out below), and the script checks that
diffusers 0.42.1's conversion maps the file back to the folder's state dict exactly.
Run: /work/pyvenv/bin/python scripts/make-wan-comfy-fixtures.py
"""

import json
import os
import re

import torch
from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
from safetensors.torch import load_file, save_file

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")

# diffusers' name -> Wan-AI's, applied to the block-local part of each name.
ORIGINAL = [
    ("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
    ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
    ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
    ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
    ("condition_embedder.time_proj", "time_projection.1"),
    ("proj_out", "head.head"),
]
BLOCK = [
    ("attn1.to_out.0", "self_attn.o"),
    ("attn2.to_out.0", "cross_attn.o"),
    ("attn1.to_", "self_attn."),
    ("attn2.to_", "cross_attn."),
    ("attn1.", "self_attn."),
    ("attn2.", "cross_attn."),
    ("ffn.net.0.proj", "ffn.0"),
    ("ffn.net.2", "ffn.2"),
    ("norm2", "norm3"),
    ("scale_shift_table", "modulation"),
]


def original(name):
    if name == "scale_shift_table":
        return "head.modulation"
    match = re.match(r"blocks\.(\d+)\.(.*)", name)
    if match:
        rest = match.group(2)
        for new, old in BLOCK:
            if rest.startswith(new):
                rest = old + rest[len(new):]
                break
        return f"blocks.{match.group(1)}.{rest}"
    for new, old in ORIGINAL:
        if name.startswith(new):
            return old + name[len(new):]
    return name


def main():
    out_dir = os.path.join(ROOT, "wan_comfy")
    os.makedirs(out_dir, exist_ok=True)
    cases = [
        ("transformer", "wan2.2_t2v_high_noise_tiny.safetensors", "model.diffusion_model."),
        ("transformer_2", "wan2.2_t2v_low_noise_tiny.safetensors", ""),
    ]
    for folder, file, prefix in cases:
        weights = load_file(os.path.join(ROOT, "wan_pipeline", folder, "diffusion_pytorch_model.safetensors"))
        renamed = {prefix + original(name): tensor for name, tensor in weights.items()}
        assert len(renamed) == len(weights)
        back = convert_wan_transformer_to_diffusers(dict(renamed))
        assert set(back) == set(weights), sorted(set(back) ^ set(weights))
        for name, tensor in weights.items():
            assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name
        with open(os.path.join(ROOT, "wan_pipeline", folder, "config.json")) as config:
            head_dim = json.load(config)["attention_head_dim"]
        metadata = {"stagehand.wan.attention_head_dim": str(head_dim)}
        save_file(renamed, os.path.join(out_dir, file), metadata=metadata)
        print(file, len(renamed), "tensors, e.g.", sorted(renamed)[:3])


if __name__ == "__main__":
    main()
