#!/usr/bin/env python3
"""Writes tests/fixtures/wan_ti2v: a tiny Wan 2.2 TI2V-5B-shaped pipeline (Wan 2.2's
48-channel VAE, one transformer of 48 channels, `expand_timesteps`: a timestep per
latent token) and what diffusers computes with it.

The folder holds model_index.json (WanPipeline, expand_timesteps true, no second
expert, as TI2V-5B's), vae/ (a seeded AutoencoderKLWan of Wan 2.2's structure:
is_residual, patch_size 2, z_dim 48, 12 channels in and out, scale_factor_spatial 16;
narrow: base_dim 8, decoder_base_dim 12, dim_mult [1, 2, 2, 2], one ResNet block a
level; BF16), transformer/ (a seeded WanTransformer3DModel of 48 channels in and out,
text_dim 32; BF16), scheduler/ (Wan 2.2's UniPC config); text_encoder/ and
tokenizer/ are links to tests/fixtures/umt5's. Weights are bf16 values computed in f32.

expected.safetensors:
- vae_latent [1, 48, 3, 2, 3] and vae_video [1, 3, 9, 32, 48]: WanPipeline's
  `vae.decode(latents / (1 / latents_std) + latents_mean).sample`;
- vae_video_tiled: the same decoded by `tiled_decode` after `enable_tiling(32, 32,
  16, 16)`: tiles of 2 latent positions every 1;
- encoder_video [1, 3, 5, 32, 48] and encoder_latent [1, 48, 2, 2, 3]: `(vae.encode(video)
  .latent_dist.mode() - latents_mean) * (1 / latents_std)`;
- tr_latent [1, 48, 3, 4, 6], tr_context [1, 10, 32], tr_timestep [1, 18] (the first
  latent frame's 6 tokens at 0, the rest at 700: TI2V's image-to-video timesteps) and
  tr_velocity: WanTransformer3DModel.forward with a timestep per token;
- latent [1, 48, 3, 4, 6], t2v_final and t2v_frames ([9, 64, 96, 3] in [0, 1],
  stored F16 to keep the fixture small: a pixel's level is still the one diffusers'
  f32 frame rounds to, give or take one): WanPipeline(expand_timesteps=True) from
  that noise, 4 steps, guidance 4.0;
- i2v_final and i2v_frames (F16): WanImageToVideoPipeline(expand_timesteps=True)
  from first.png (96 x 64) and the same noise, 3 steps, guidance 3.5.

Run: /work/pyvenv/bin/python scripts/make-wan-ti2v-fixtures.py (diffusers 0.42.1,
transformers 5)
"""

import copy
import importlib.util
import json
import os
import shutil
import sys

import torch
from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanImageToVideoPipeline, WanPipeline
from diffusers import WanTransformer3DModel
from diffusers.pipelines.wan import pipeline_wan_i2v
from safetensors.torch import save_file
from transformers import AutoTokenizer, UMT5EncoderModel

torch.set_num_threads(2)
HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures")
OUT = os.path.join(FIXTURES, "wan_ti2v")
PROMPT = "a paper boat drifts down a rainy street"
NEGATIVE = "blurry, static"
WIDTH, HEIGHT, FRAMES = 96, 64, 9
VAE = dict(
    base_dim=8,
    decoder_base_dim=12,
    z_dim=48,
    dim_mult=[1, 2, 2, 2],
    num_res_blocks=1,
    attn_scales=[],
    temperal_downsample=[False, True, True],
    is_residual=True,
    in_channels=12,
    out_channels=12,
    patch_size=2,
    scale_factor_spatial=16,
    scale_factor_temporal=4,
)


def module(name, file):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, file))
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


class PlainText:
    # pipeline_wan_i2v calls ftfy without checking it is installed; ftfy leaves
    # these plain ASCII prompts as they are.
    @staticmethod
    def fix_text(text):
        return text


if not hasattr(pipeline_wan_i2v, "ftfy"):
    pipeline_wan_i2v.ftfy = PlainText

wan_fixtures = module("wan_fixtures", "make-wan-fixtures.py")
vae_fixtures = module("wan_vae_fixtures", "make-wan-vae-fixtures.py")
t2v = module("wan_pipeline_fixtures", "make-wan-pipeline-fixtures.py")
i2v = module("wan_i2v_fixtures", "make-wan-i2v-fixtures.py")


def seeded_vae():
    vae = vae_fixtures.seeded_model(VAE)
    # Means and stds of their own, so the (un-)normalisation is exercised per channel.
    torch.manual_seed(3)
    vae.register_to_config(
        latents_mean=[round(v, 4) for v in (0.3 * torch.randn(48)).tolist()],
        latents_std=[round(v, 4) for v in (0.8 + 0.6 * torch.rand(48)).tolist()],
    )
    return vae


def vae_cases(vae, tensors):
    mean = torch.tensor(vae.config.latents_mean).view(1, 48, 1, 1, 1)
    inverse_std = 1.0 / torch.tensor(vae.config.latents_std).view(1, 48, 1, 1, 1)
    torch.manual_seed(111)
    latent = torch.randn(1, 48, 3, 2, 3)
    clip = torch.rand(1, 3, 5, 32, 48) * 2 - 1
    with torch.no_grad():
        video = vae.decode(latent / inverse_std + mean, return_dict=False)[0]
        encoded = (vae.encode(clip).latent_dist.mode() - mean) * inverse_std
        # Tiles of 2 latent positions (32 pixels) every 1 (16): 2 x 3 tiles, the
        # blend and the crop in the patches' space, unpatchified after.
        vae.enable_tiling(32, 32, 16, 16)
        tiled = vae.decode(latent / inverse_std + mean, return_dict=False)[0]
        vae.use_tiling = False
    at_clamp = (video.abs() >= 1.0).float().mean().item()
    print(f"vae video {tuple(video.shape)} {at_clamp:.1%} at the clamp; encoded {tuple(encoded.shape)}")
    tensors.update(
        vae_latent=latent, vae_video=video, vae_video_tiled=tiled, encoder_video=clip, encoder_latent=encoded
    )


def transformer_case(transformer, tensors):
    torch.manual_seed(222)
    latent = torch.randn(1, 48, 3, 4, 6)
    context = torch.randn(1, 10, 32)
    timestep = torch.full((1, 3 * 2 * 3), 700.0)
    timestep[:, : 2 * 3] = 0.0
    with torch.no_grad():
        velocity = transformer(
            hidden_states=latent, timestep=timestep, encoder_hidden_states=context, return_dict=False
        )[0]
    tensors.update(tr_latent=latent, tr_context=context, tr_timestep=timestep, tr_velocity=velocity)


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    vae = seeded_vae()
    copy.deepcopy(vae).to(torch.bfloat16).save_pretrained(os.path.join(OUT, "vae"), safe_serialization=True)
    wan_fixtures.CONFIG["text_dim"] = 32
    transformer = wan_fixtures.seeded_model(48, 48, True, 51)
    copy.deepcopy(transformer).to(torch.bfloat16).save_pretrained(
        os.path.join(OUT, "transformer"), safe_serialization=True
    )
    scheduler = UniPCMultistepScheduler.from_pretrained(os.path.join(FIXTURES, "unipc", "wan-t2v"))
    scheduler = UniPCMultistepScheduler.from_config(scheduler.config, flow_shift=5.0)
    scheduler.save_pretrained(os.path.join(OUT, "scheduler"))
    index = {
        "_class_name": "WanPipeline",
        "_diffusers_version": "0.42.1",
        "boundary_ratio": None,
        "expand_timesteps": True,
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "transformer_2": [None, None],
        "vae": ["diffusers", "AutoencoderKLWan"],
    }
    with open(os.path.join(OUT, "model_index.json"), "w") as f:
        json.dump(index, f, indent=2)
    for name in ["text_encoder", "tokenizer"]:
        os.symlink(t2v.LINKS[name], os.path.join(OUT, name))
    i2v.WIDTH, i2v.HEIGHT = WIDTH, HEIGHT
    first = i2v.picture(3)
    first.save(os.path.join(OUT, "first.png"))

    tensors = {}
    vae = t2v.load(AutoencoderKLWan, os.path.join(OUT, "vae"))
    transformer = t2v.load(WanTransformer3DModel, os.path.join(OUT, "transformer"))
    vae_cases(vae, tensors)
    transformer_case(transformer, tensors)
    parts = dict(
        tokenizer=AutoTokenizer.from_pretrained(os.path.join(OUT, "tokenizer")),
        text_encoder=UMT5EncoderModel.from_pretrained(os.path.join(OUT, "text_encoder")).float().eval(),
        vae=vae,
        transformer=transformer,
        scheduler=UniPCMultistepScheduler.from_pretrained(os.path.join(OUT, "scheduler")),
    )
    latent = torch.randn(1, 48, 3, 4, 6, generator=torch.Generator().manual_seed(7))
    tensors["latent"] = latent
    common = dict(prompt=PROMPT, negative_prompt=NEGATIVE, height=HEIGHT, width=WIDTH, num_frames=FRAMES)
    text = WanPipeline(**parts, expand_timesteps=True)
    image = WanImageToVideoPipeline(**parts, expand_timesteps=True)
    with torch.no_grad():
        for name, pipe, extra in [
            ("t2v", text, dict(num_inference_steps=4, guidance_scale=4.0)),
            ("i2v", image, dict(num_inference_steps=3, guidance_scale=3.5, image=first)),
        ]:
            run = dict(common, **extra)
            tensors[name + "_final"] = pipe(**run, latents=latent.clone(), output_type="latent").frames.float()
            frames = pipe(**run, latents=latent.clone(), output_type="np").frames
            tensors[name + "_frames"] = torch.from_numpy(frames[0]).half()
    tensors = {name: tensor.contiguous() for name, tensor in tensors.items()}
    save_file(tensors, os.path.join(OUT, "expected.safetensors"))
    for name, tensor in tensors.items():
        print(name, tuple(tensor.shape), f"mean {tensor.mean().item():.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
