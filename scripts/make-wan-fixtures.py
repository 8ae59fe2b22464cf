#!/usr/bin/env python3
"""Writes tests/fixtures/wan: tiny WanTransformer3DModels that diffusers built and ran.

Two seeded random transformers (weights rounded to bf16 values, computed in f32),
saved with save_pretrained (diffusers layout, <variant>/transformer/):

- t2v: a text-to-video expert's shape (16 latent channels in and out, cross_attn_norm),
  stored BF16 as the published Wan 2.2 folders are;
- i2v: Wan 2.2 image-to-video's (36 channels in: noise, mask and the image's latent;
  16 out), without norm2 (cross_attn_norm false), stored F32.

Beside each, expected.safetensors holds two inputs and diffusers' output for each
(WanTransformer3DModel.forward, the velocity [1, out, f, h, w]):

- latent [1, C, 3, 8, 6] (36 video tokens), encoder_hidden_states [1, 10, text_dim],
  timestep [1], velocity;
- the same names with the suffix _short: a latent [1, C, 2, 4, 4] (8 tokens) with 12
  text tokens, more text than video (stagehand pads the video's rows).

Run with the venv that has torch and diffusers: /work/pyvenv/bin/python
scripts/make-wan-fixtures.py. The tests only read the files.
"""

import copy
import os
import sys

import torch
from diffusers import WanTransformer3DModel
from safetensors.torch import save_file

torch.set_num_threads(2)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "wan")
CONFIG = dict(
    patch_size=(1, 2, 2),
    num_attention_heads=2,
    attention_head_dim=16,
    text_dim=24,
    freq_dim=32,
    ffn_dim=48,
    num_layers=2,
    rope_max_seq_len=64,
)
VARIANTS = [
    # name, in, out, cross_attn_norm, stored dtype, seed
    ("t2v", 16, 16, True, torch.bfloat16, 7),
    ("i2v", 36, 16, False, torch.float32, 8),
]


def seeded_model(in_channels, out_channels, cross_attn_norm, seed):
    torch.manual_seed(seed)
    model = WanTransformer3DModel(
        in_channels=in_channels, out_channels=out_channels, cross_attn_norm=cross_attn_norm, **CONFIG
    )
    model = model.float().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim >= 2 and "scale_shift_table" not in name:
                fan_in = parameter[0].numel()
                parameter.copy_(torch.randn_like(parameter) / fan_in**0.5)
            elif "norm" in name and name.endswith("weight"):
                parameter.copy_(1.0 + 0.1 * torch.randn_like(parameter))
            else:
                # Biases, norm2's bias, the modulation tables.
                parameter.copy_(0.1 * torch.randn_like(parameter))
            # Values bf16 can hold, so a bf16 file is these weights exactly.
            parameter.copy_(parameter.to(torch.bfloat16).float())
    return model


def case(model, in_channels, frames, height, width, text, timestep, suffix):
    latent = torch.randn(1, in_channels, frames, height, width)
    context = torch.randn(1, text, CONFIG["text_dim"])
    t = torch.tensor([timestep], dtype=torch.float32)
    with torch.no_grad():
        velocity = model(
            hidden_states=latent, timestep=t, encoder_hidden_states=context, return_dict=False
        )[0]
    print(f"  {suffix or 'main'}: velocity {tuple(velocity.shape)} mean |v| {velocity.abs().mean().item():.4f}")
    return {
        f"latent{suffix}": latent.contiguous(),
        f"encoder_hidden_states{suffix}": context.contiguous(),
        f"timestep{suffix}": t,
        f"velocity{suffix}": velocity.contiguous(),
    }


def main():
    for name, in_channels, out_channels, cross_attn_norm, dtype, seed in VARIANTS:
        model = seeded_model(in_channels, out_channels, cross_attn_norm, seed)
        folder = os.path.join(OUT, name)
        # A copy is cast for the file: casting the model itself would round its rope
        # tables (buffers, not saved) to bf16 too.
        copy.deepcopy(model).to(dtype).save_pretrained(os.path.join(folder, "transformer"), safe_serialization=True)
        print(name)
        torch.manual_seed(100 + seed)
        tensors = case(model, in_channels, 3, 8, 6, 10, 937.5, "")
        tensors.update(case(model, in_channels, 2, 4, 4, 12, 412.0, "_short"))
        save_file(tensors, os.path.join(folder, "expected.safetensors"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
