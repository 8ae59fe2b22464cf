#!/usr/bin/env python3
"""Writes tests/fixtures/wan_pipeline: a tiny Wan 2.2 A14B-shaped pipeline (two
experts with boundary_ratio 0.875) and the video diffusers' WanPipeline makes with it.

The folder holds what is new: model_index.json, transformer/ and transformer_2/ (two
seeded WanTransformer3DModels with umT5's width 32 as text_dim, weights of bf16
values stored BF16) and scheduler/ (Wan 2.2's UniPC config); text_encoder/,
tokenizer/ and vae/ are links to tests/fixtures/umt5's and tests/fixtures/wan_vae's.

expected.safetensors: the starting latent [1, 16, 3, 8, 6], the final latent
(output_type="latent") and the frames (output_type="np": [9, 64, 48, 3] in [0, 1])
of the prompt and negative prompt below, 4 steps, guidance 4.0 then 2.5.

Run: /work/pyvenv/bin/python scripts/make-wan-pipeline-fixtures.py (diffusers 0.42.1,
transformers 5)
"""

import importlib.util
import json
import os
import shutil
import sys

import torch
from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, UMT5EncoderModel

torch.set_num_threads(2)
HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures")
OUT = os.path.join(FIXTURES, "wan_pipeline")
PROMPT = "a red fox runs through the snow at sunset"
NEGATIVE = "blurry, static"

spec = importlib.util.spec_from_file_location("wan_fixtures", os.path.join(HERE, "make-wan-fixtures.py"))
wan_fixtures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(wan_fixtures)


def expert(seed):
    wan_fixtures.CONFIG["text_dim"] = 32
    return wan_fixtures.seeded_model(16, 16, True, seed)


def load(cls, folder):
    # Built from its config and loaded by hand: from_pretrained wants accelerate for
    # modules diffusers keeps in f32.
    model = cls.from_config(cls.load_config(folder))
    weights = load_file(os.path.join(folder, "diffusion_pytorch_model.safetensors"))
    model.load_state_dict({k: v.float() for k, v in weights.items()}, strict=True)
    return model.float().eval()


LINKS = {"text_encoder": "../umt5/text_encoder", "tokenizer": "../umt5/tokenizer", "vae": "../wan_vae/vae"}


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    high, low = expert(31), expert(32)
    for name, model in [("transformer", high), ("transformer_2", low)]:
        import copy

        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(os.path.join(OUT, name), safe_serialization=True)
    UniPCMultistepScheduler.from_pretrained(os.path.join(FIXTURES, "unipc", "wan-t2v")).save_pretrained(
        os.path.join(OUT, "scheduler")
    )
    index = {
        "_class_name": "WanPipeline",
        "_diffusers_version": "0.42.1",
        "boundary_ratio": 0.875,
        "expand_timesteps": False,
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "transformer_2": ["diffusers", "WanTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLWan"],
    }
    with open(os.path.join(OUT, "model_index.json"), "w") as f:
        json.dump(index, f, indent=2)

    for name, target in LINKS.items():
        os.symlink(target, os.path.join(OUT, name))
    folder = OUT
    pipe = WanPipeline(
        tokenizer=AutoTokenizer.from_pretrained(os.path.join(folder, "tokenizer")),
        text_encoder=UMT5EncoderModel.from_pretrained(os.path.join(folder, "text_encoder")).float().eval(),
        vae=load(AutoencoderKLWan, os.path.join(folder, "vae")),
        transformer=load(WanTransformer3DModel, os.path.join(folder, "transformer")),
        transformer_2=load(WanTransformer3DModel, os.path.join(folder, "transformer_2")),
        scheduler=UniPCMultistepScheduler.from_pretrained(os.path.join(folder, "scheduler")),
        boundary_ratio=0.875,
    )
    latent = torch.randn(1, 16, 3, 8, 6, generator=torch.Generator().manual_seed(5))
    common = dict(
        prompt=PROMPT,
        negative_prompt=NEGATIVE,
        height=64,
        width=48,
        num_frames=9,
        num_inference_steps=4,
        guidance_scale=4.0,
        guidance_scale_2=2.5,
    )
    with torch.no_grad():
        final = pipe(**common, latents=latent.clone(), output_type="latent").frames
        frames = pipe(**common, latents=latent.clone(), output_type="np").frames
    frames = torch.from_numpy(frames[0]).float()
    save_file(
        {"latent": latent.contiguous(), "final": final.float().contiguous(), "frames": frames.contiguous()},
        os.path.join(OUT, "expected.safetensors"),
    )
    print("frames", tuple(frames.shape), "mean", frames.mean().item())
    return 0


if __name__ == "__main__":
    sys.exit(main())
