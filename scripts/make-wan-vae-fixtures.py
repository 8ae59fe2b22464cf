#!/usr/bin/env python3
"""Writes tests/fixtures/wan_vae: a tiny AutoencoderKLWan that diffusers built and ran.

A seeded random AutoencoderKLWan of Wan 2.1's structure (16 latent channels,
temperal_downsample [false, true, true], so two of the decoder's up blocks double the
frames; no attention outside the middle block) but narrow: base_dim 8, dim_mult
[1, 2, 2, 2], one ResNet block per level (two in each up block). Its weights are
rounded to bf16 values and computed in f32; saved with save_pretrained as BF16
(tests/fixtures/wan_vae/vae/).

Beside it, expected.safetensors holds (the decoder's, then the encoder's):

- latent [1, 16, 3, 4, 4]: what a Wan pipeline's transformer leaves (normalised);
- video [1, 3, 9, 32, 32]: what the pipeline decodes from it, exactly as
  WanPipeline does: `latents / (1 / latents_std) + latents_mean`, then
  `vae.decode(...).sample` (AutoencoderKLWan._decode: frame by frame with the
  feature cache, clamped to [-1, 1]);
- encoder_video [1, 3, 5, 32, 32] in [-1, 1] and encoder_latent [1, 16, 2, 4, 4]: what
  WanImageToVideoPipeline conditions on, `(vae.encode(video).latent_dist.mode() -
  latents_mean) * (1 / latents_std)` (AutoencoderKLWan._encode: the first frame, then
  4 frames a chunk, with the feature cache).

Run with the venv that has torch and diffusers: /work/pyvenv/bin/python
scripts/make-wan-vae-fixtures.py. The tests only read the files.

`--wan21 DIR` writes the same files for Wan 2.1's full-width VAE instead (diffusers'
defaults: base_dim 96, dim_mult [1, 2, 4, 4], two ResNet blocks a level; 243 MB in
BF16) with a latent [1, 16, 2, 8, 8] (5 frames of 64 x 64), for a check by hand:
STAGEHAND_WAN_VAE_FIXTURE=DIR cargo test --test wan_vae_reference (about 6 minutes
on two cores).
"""

import copy
import os
import sys

import torch
from diffusers import AutoencoderKLWan
from safetensors.torch import save_file

torch.set_num_threads(2)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "wan_vae")
CONFIG = dict(
    base_dim=8,
    z_dim=16,
    dim_mult=[1, 2, 2, 2],
    num_res_blocks=1,
    attn_scales=[],
    temperal_downsample=[False, True, True],
)
SEED = 11


def seeded_model(config):
    torch.manual_seed(SEED)
    model = AutoencoderKLWan(**config).float().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("gamma"):
                parameter.copy_(1.0 + 0.1 * torch.randn_like(parameter))
            elif parameter.ndim >= 2:
                fan_in = parameter[0].numel()
                parameter.copy_(torch.randn_like(parameter) / fan_in**0.5)
            else:
                parameter.copy_(0.1 * torch.randn_like(parameter))
            # Values bf16 can hold, so a bf16 file is these weights exactly.
            parameter.copy_(parameter.to(torch.bfloat16).float())
        # Keep the output mostly inside the clamp, so the comparison sees real values.
        model.decoder.conv_out.weight.mul_(0.25)
    return model


def main():
    full = len(sys.argv) == 3 and sys.argv[1] == "--wan21"
    out, config, shape = (sys.argv[2], {}, (2, 8, 8)) if full else (OUT, CONFIG, (3, 4, 4))
    model = seeded_model(config)
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(os.path.join(out, "vae"), safe_serialization=True)
    torch.manual_seed(100 + SEED)
    z_dim = model.config.z_dim
    latent = torch.randn(1, z_dim, *shape)
    # WanPipeline's un-normalisation, as it writes it.
    latents_mean = torch.tensor(model.config.latents_mean).view(1, z_dim, 1, 1, 1)
    latents_std = 1.0 / torch.tensor(model.config.latents_std).view(1, z_dim, 1, 1, 1)
    with torch.no_grad():
        video = model.decode(latent / latents_std + latents_mean, return_dict=False)[0]
    clamped = (video.abs() >= 1.0).float().mean().item()
    print(f"video {tuple(video.shape)} mean |v| {video.abs().mean().item():.4f}, {clamped:.1%} at the clamp")
    # The encoder, as WanImageToVideoPipeline conditions on it: the mode of the
    # latent distribution, normalised.
    torch.manual_seed(200 + SEED)
    clip = torch.rand(1, 3, 5, 8 * shape[1], 8 * shape[2]) * 2 - 1
    with torch.no_grad():
        mode = model.encode(clip).latent_dist.mode()
    encoded = (mode - latents_mean) * latents_std
    print(f"encoded {tuple(encoded.shape)} mean |z| {encoded.abs().mean().item():.4f}")
    save_file(
        {
            "latent": latent.contiguous(),
            "video": video.contiguous(),
            "encoder_video": clip.contiguous(),
            "encoder_latent": encoded.contiguous(),
        },
        os.path.join(out, "expected.safetensors"),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
