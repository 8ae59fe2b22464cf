#!/usr/bin/env python3
"""Writes tests/fixtures/wan_i2v_pipeline: a tiny Wan 2.2 I2V-A14B-shaped pipeline
(WanImageToVideoPipeline: two experts of 36 input channels — the noise's 16, the
first-frame mask's 4, the encoded image's 16 — switched at boundary_ratio 0.9, no
image encoder) and the videos diffusers makes with it from an image.

The folder holds what is new: model_index.json, transformer/ and transformer_2/ (two
seeded WanTransformer3DModels, weights of bf16 values stored BF16), scheduler/ (Wan
2.2's UniPC config with flow_shift 5.0, as I2V-A14B ships it), first.png and
last.png (48×64 RGB); text_encoder/, tokenizer/ and vae/ are links to
tests/fixtures/umt5's and tests/fixtures/wan_vae's.

expected.safetensors, for the prompt and negative prompt below, 9 frames of 48×64,
3 steps, guidance 3.5 then 2.0, from the starting latent `latent` [1, 16, 3, 8, 6]:
- `condition` [1, 20, 3, 8, 6]: the mask and the encoded first.png (prepare_latents);
- `final`, `frames` ([9, 64, 48, 3] in [0, 1]): the video of first.png;
- `condition_last`, `final_last`: the same with last.png as `last_image`.

Run: /work/pyvenv/bin/python scripts/make-wan-i2v-fixtures.py (diffusers 0.42.1,
transformers 5)
"""

import copy
import importlib.util
import json
import os
import shutil
import sys

import numpy as np
import torch
from diffusers import UniPCMultistepScheduler, WanImageToVideoPipeline
from diffusers.pipelines.wan import pipeline_wan_i2v
from PIL import Image
from safetensors.torch import save_file

torch.set_num_threads(2)
HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures")
OUT = os.path.join(FIXTURES, "wan_i2v_pipeline")
PROMPT = "the fox turns its head towards the camera"
NEGATIVE = "blurry, static"
WIDTH, HEIGHT, FRAMES = 48, 64, 9


def module(name, file):
    spec = importlib.util.spec_from_file_location(name, os.path.join(HERE, file))
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


class PlainText:
    # pipeline_wan_i2v calls ftfy without checking it is installed (pipeline_wan.py
    # checks); ftfy leaves this file's plain ASCII prompts as they are.
    @staticmethod
    def fix_text(text):
        return text


if not hasattr(pipeline_wan_i2v, "ftfy"):
    pipeline_wan_i2v.ftfy = PlainText

wan_fixtures = module("wan_fixtures", "make-wan-fixtures.py")
t2v = module("wan_pipeline_fixtures", "make-wan-pipeline-fixtures.py")


def expert(seed):
    wan_fixtures.CONFIG["text_dim"] = 32
    return wan_fixtures.seeded_model(36, 16, True, seed)


def picture(seed):
    # A smooth gradient with seeded speckle: every channel and both axes vary, so a
    # transposed or mirrored read changes the condition.
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    base = np.stack([x * 255 / WIDTH, y * 255 / HEIGHT, (x + y) * 127 / (WIDTH + HEIGHT)], axis=-1)
    noisy = base + rng.normal(0, 24, base.shape)
    return Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8), "RGB")


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    for name, seed in [("transformer", 41), ("transformer_2", 42)]:
        copy.deepcopy(expert(seed)).to(torch.bfloat16).save_pretrained(
            os.path.join(OUT, name), safe_serialization=True
        )
    scheduler = UniPCMultistepScheduler.from_pretrained(os.path.join(FIXTURES, "unipc", "wan-t2v"))
    scheduler = UniPCMultistepScheduler.from_config(scheduler.config, flow_shift=5.0)
    scheduler.save_pretrained(os.path.join(OUT, "scheduler"))
    index = {
        "_class_name": "WanImageToVideoPipeline",
        "_diffusers_version": "0.42.1",
        "boundary_ratio": 0.9,
        "expand_timesteps": False,
        "image_encoder": [None, None],
        "image_processor": [None, None],
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "transformer_2": ["diffusers", "WanTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLWan"],
    }
    with open(os.path.join(OUT, "model_index.json"), "w") as f:
        json.dump(index, f, indent=2)
    for name, target in t2v.LINKS.items():
        os.symlink(target, os.path.join(OUT, name))
    first, last = picture(1), picture(2)
    first.save(os.path.join(OUT, "first.png"))
    last.save(os.path.join(OUT, "last.png"))

    from transformers import AutoTokenizer, UMT5EncoderModel
    from diffusers import AutoencoderKLWan, WanTransformer3DModel

    pipe = WanImageToVideoPipeline(
        tokenizer=AutoTokenizer.from_pretrained(os.path.join(OUT, "tokenizer")),
        text_encoder=UMT5EncoderModel.from_pretrained(os.path.join(OUT, "text_encoder")).float().eval(),
        vae=t2v.load(AutoencoderKLWan, os.path.join(OUT, "vae")),
        transformer=t2v.load(WanTransformer3DModel, os.path.join(OUT, "transformer")),
        transformer_2=t2v.load(WanTransformer3DModel, os.path.join(OUT, "transformer_2")),
        scheduler=UniPCMultistepScheduler.from_pretrained(os.path.join(OUT, "scheduler")),
        boundary_ratio=0.9,
    )
    latent = torch.randn(1, 16, 3, 8, 6, generator=torch.Generator().manual_seed(6))
    common = dict(
        prompt=PROMPT,
        negative_prompt=NEGATIVE,
        height=HEIGHT,
        width=WIDTH,
        num_frames=FRAMES,
        num_inference_steps=3,
        guidance_scale=3.5,
        guidance_scale_2=2.0,
    )
    tensors = {"latent": latent.contiguous()}
    with torch.no_grad():
        for suffix, last_image in [("", None), ("_last", last)]:
            processed = pipe.video_processor.preprocess(first, height=HEIGHT, width=WIDTH).float()
            processed_last = None
            if last_image is not None:
                processed_last = pipe.video_processor.preprocess(last_image, height=HEIGHT, width=WIDTH).float()
            _, condition = pipe.prepare_latents(
                processed, 1, 16, HEIGHT, WIDTH, FRAMES, torch.float32, "cpu", None, latent.clone(), processed_last
            )
            tensors["condition" + suffix] = condition.contiguous()
            run = dict(common, image=first, last_image=last_image, latents=latent.clone())
            tensors["final" + suffix] = pipe(**run, output_type="latent").frames.float().contiguous()
            if last_image is None:
                frames = pipe(**run, output_type="np").frames
                tensors["frames"] = torch.from_numpy(frames[0]).float().contiguous()
    save_file(tensors, os.path.join(OUT, "expected.safetensors"))
    for name, tensor in tensors.items():
        print(name, tuple(tensor.shape), f"mean {tensor.mean().item():.5f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
