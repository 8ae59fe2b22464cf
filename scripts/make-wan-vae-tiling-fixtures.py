#!/usr/bin/env python3
"""Writes tests/fixtures/wan_vae/tiled.safetensors: diffusers' tiled decode of the
tiny AutoencoderKLWan that scripts/make-wan-vae-fixtures.py wrote.

Written with torch 2.15.0 and diffusers 0.42.1 (the versions are printed and stored in
the file's metadata). The VAE is read from tests/fixtures/wan_vae/vae (its BF16
weights are the values the model was made with, computed in f32 here), so this
script changes nothing the other fixtures hold.

The tensors:

- latent [1, 16, 2, 6, 7]: a seeded latent video as a Wan pipeline's transformer
  leaves it (normalised), wider and taller than the tiles;
- video [1, 3, 5, 48, 56]: `vae.decode(latent / (1 / latents_std) + latents_mean)`
  after `vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32,
  tile_sample_stride_height=24, tile_sample_stride_width=24)`: tiles of 4 latent
  positions every 3 (diffusers' ratio of stride to tile, as `--vae-tile 4`), 2 × 3
  tiles, the last column 1 position wide;
- video_wide [1, 3, 5, 48, 56]: the same latent with tiles of 32 × 40 pixels every
  16 × 32 (4 × 5 latent positions every 2 × 4), a tile and a stride of their own
  in each direction: 3 × 2 tiles.

Run with the venv that has torch and diffusers: /work/pyvenv/bin/python
scripts/make-wan-vae-tiling-fixtures.py. The tests only read the file.
"""

import os
import sys

import diffusers
import torch
from diffusers import AutoencoderKLWan
from safetensors.torch import save_file

torch.set_num_threads(1)
HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "wan_vae")
SEED = 311
TILINGS = {
    "video": dict(
        tile_sample_min_height=32,
        tile_sample_min_width=32,
        tile_sample_stride_height=24,
        tile_sample_stride_width=24,
    ),
    "video_wide": dict(
        tile_sample_min_height=32,
        tile_sample_min_width=40,
        tile_sample_stride_height=16,
        tile_sample_stride_width=32,
    ),
}


def main():
    model = AutoencoderKLWan.from_pretrained(os.path.join(HERE, "vae")).float().eval()
    z_dim = model.config.z_dim
    torch.manual_seed(SEED)
    latent = torch.randn(1, z_dim, 2, 6, 7)
    # WanPipeline's un-normalisation, as it writes it.
    latents_mean = torch.tensor(model.config.latents_mean).view(1, z_dim, 1, 1, 1)
    latents_std = 1.0 / torch.tensor(model.config.latents_std).view(1, z_dim, 1, 1, 1)
    tensors = {"latent": latent.contiguous()}
    for name, tiling in TILINGS.items():
        model.enable_tiling(**tiling)
        with torch.no_grad():
            video = model.decode(latent / latents_std + latents_mean, return_dict=False)[0]
        clamped = (video.abs() >= 1.0).float().mean().item()
        print(f"{name} {tuple(video.shape)} mean |v| {video.abs().mean().item():.4f}, {clamped:.1%} at the clamp")
        tensors[name] = video.contiguous()
    versions = {"torch": torch.__version__, "diffusers": diffusers.__version__}
    print(versions)
    save_file(tensors, os.path.join(HERE, "tiled.safetensors"), metadata=versions)
    return 0


if __name__ == "__main__":
    sys.exit(main())
