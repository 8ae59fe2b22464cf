#!/usr/bin/env python3
"""Prompt (or image) -> video on the CPU: diffusers' WanPipeline /
WanImageToVideoPipeline beside `stagehand video` on the same pipeline folder, the same
prompt, image and starting noise (BENCHMARKS.md, "Prompt to video on the CPU backend").

    bench-wan-pipeline.py make DIR [--i2v]          write a pipeline with diffusers
    bench-wan-pipeline.py diffusers DIR [--threads 2] [--image PNG] ...   one run, JSON out

`make` writes the real classes with seeded bf16 weights through `save_pretrained`,
`noise.safetensors` (`latent` [1, 16, f, H/8, W/8]) for both sides and, with --i2v,
`first.png`. The "small" shapes: two experts of Wan 2.1 T2V-1.3B's width (1536 wide,
12 heads of 128, FFN 8960) with 4 blocks each (boundary_ratio 0.875, or 0.9 and 36
input channels for --i2v), the WAN 2.1 VAE's own shape (base_dim 96, 16 latent
channels), and the umT5 and tokenizer of tests/fixtures/umt5 (32 wide: the prompt is
not what this measures). `diffusers` times each stage as the pipeline runs it after
loading, and the peak RSS of the whole process.

Run with the venv that has torch, transformers and diffusers.
"""

import argparse
import json
import os
import resource
import shutil
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures")
WIDTH, HEIGHT, FRAMES = 160, 96, 9


def make(directory, i2v):
    import numpy as np
    import torch
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanTransformer3DModel
    from PIL import Image
    from safetensors.torch import save_file

    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    torch.manual_seed(0)
    for name in ["transformer", "transformer_2"]:
        model = WanTransformer3DModel(
            patch_size=(1, 2, 2),
            num_attention_heads=12,
            attention_head_dim=128,
            in_channels=36 if i2v else 16,
            out_channels=16,
            text_dim=32,
            freq_dim=256,
            ffn_dim=8960,
            num_layers=4,
            cross_attn_norm=True,
            rope_max_seq_len=1024,
        )
        with torch.no_grad():
            for parameter in model.parameters():
                if parameter.ndim >= 2:
                    parameter.copy_(torch.randn_like(parameter) / parameter[0].numel() ** 0.5)
        model.to(torch.bfloat16).save_pretrained(os.path.join(directory, name))
    AutoencoderKLWan(base_dim=96, z_dim=16).to(torch.bfloat16).save_pretrained(os.path.join(directory, "vae"))
    scheduler = UniPCMultistepScheduler.from_pretrained(os.path.join(FIXTURES, "unipc", "wan-t2v"))
    scheduler.save_pretrained(os.path.join(directory, "scheduler"))
    for part in ["text_encoder", "tokenizer"]:
        shutil.copytree(os.path.join(FIXTURES, "umt5", part), os.path.join(directory, part))
    index = {
        "_class_name": "WanImageToVideoPipeline" if i2v else "WanPipeline",
        "_diffusers_version": "0.42.1",
        "boundary_ratio": 0.9 if i2v else 0.875,
        "expand_timesteps": False,
        "scheduler": ["diffusers", "UniPCMultistepScheduler"],
        "text_encoder": ["transformers", "UMT5EncoderModel"],
        "tokenizer": ["transformers", "T5TokenizerFast"],
        "transformer": ["diffusers", "WanTransformer3DModel"],
        "transformer_2": ["diffusers", "WanTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLWan"],
    }
    if i2v:
        index["image_encoder"] = [None, None]
        index["image_processor"] = [None, None]
        rng = np.random.default_rng(1)
        y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
        base = np.stack([x * 255 / WIDTH, y * 255 / HEIGHT, (x + y) * 127 / (WIDTH + HEIGHT)], axis=-1)
        picture = np.clip(base + rng.normal(0, 24, base.shape), 0, 255).astype(np.uint8)
        Image.fromarray(picture, "RGB").save(os.path.join(directory, "first.png"))
    with open(os.path.join(directory, "model_index.json"), "w") as f:
        json.dump(index, f, indent=2)
    latent = torch.randn(1, 16, (FRAMES - 1) // 4 + 1, HEIGHT // 8, WIDTH // 8, generator=torch.Generator().manual_seed(5))
    save_file({"latent": latent.contiguous()}, os.path.join(directory, "noise.safetensors"))
    print(f"wrote {directory}")


def run_diffusers(directory, threads, steps, guidance, image):
    import torch
    from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanImageToVideoPipeline, WanPipeline
    from diffusers import WanTransformer3DModel
    from diffusers.pipelines.wan import pipeline_wan_i2v
    from PIL import Image
    from safetensors.torch import load_file
    from transformers import AutoTokenizer, UMT5EncoderModel

    class PlainText:
        @staticmethod
        def fix_text(text):
            return text

    if not hasattr(pipeline_wan_i2v, "ftfy"):
        pipeline_wan_i2v.ftfy = PlainText
    torch.set_num_threads(threads)
    started = time.perf_counter()

    def load(cls, name):
        folder = os.path.join(directory, name)
        model = cls.from_config(cls.load_config(folder))
        weights = load_file(os.path.join(folder, "diffusion_pytorch_model.safetensors"))
        model.load_state_dict({k: v.float() for k, v in weights.items()}, strict=True)
        return model.float().eval()

    with open(os.path.join(directory, "model_index.json")) as f:
        index = json.load(f)
    i2v = index["_class_name"] == "WanImageToVideoPipeline"
    cls = WanImageToVideoPipeline if i2v else WanPipeline
    pipe = cls(
        tokenizer=AutoTokenizer.from_pretrained(os.path.join(directory, "tokenizer")),
        text_encoder=UMT5EncoderModel.from_pretrained(os.path.join(directory, "text_encoder")).float().eval(),
        vae=load(AutoencoderKLWan, "vae"),
        transformer=load(WanTransformer3DModel, "transformer"),
        transformer_2=load(WanTransformer3DModel, "transformer_2"),
        scheduler=UniPCMultistepScheduler.from_pretrained(os.path.join(directory, "scheduler")),
        boundary_ratio=index["boundary_ratio"],
    )
    loaded = time.perf_counter()
    marks = {}
    transformer_calls = []
    for name in ["transformer", "transformer_2"]:
        module = getattr(pipe, name)
        forward = module.forward

        def timed(*args, _forward=forward, _name=name, **kwargs):
            t = time.perf_counter()
            result = _forward(*args, **kwargs)
            transformer_calls.append((_name, time.perf_counter() - t))
            return result

        module.forward = timed
    decode = pipe.vae.decode

    def timed_decode(*args, **kwargs):
        t = time.perf_counter()
        result = decode(*args, **kwargs)
        marks["vae_decode"] = time.perf_counter() - t
        return result

    pipe.vae.decode = timed_decode
    latents = load_file(os.path.join(directory, "noise.safetensors"))["latent"]
    arguments = dict(
        prompt="a red fox runs through the snow at sunset",
        negative_prompt="blurry, static",
        height=HEIGHT,
        width=WIDTH,
        num_frames=FRAMES,
        num_inference_steps=steps,
        guidance_scale=guidance,
        latents=latents,
        output_type="np",
    )
    if i2v:
        arguments["image"] = Image.open(image or os.path.join(directory, "first.png")).convert("RGB")
    with torch.no_grad():
        pipe(**arguments)
    done = time.perf_counter()
    per_expert = {}
    for name, seconds in transformer_calls:
        per_expert.setdefault(name, []).append(seconds)
    print(
        json.dumps(
            {
                "load_seconds": loaded - started,
                "pipeline_seconds": done - loaded,
                "transformer_calls_seconds": per_expert,
                "vae_decode_seconds": marks.get("vae_decode"),
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            },
            indent=1,
        )
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["make", "diffusers"])
    parser.add_argument("dir")
    parser.add_argument("--i2v", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--guidance", type=float, default=4.0)
    parser.add_argument("--image")
    args = parser.parse_args()
    if args.command == "make":
        make(args.dir, args.i2v)
    else:
        run_diffusers(args.dir, args.threads, args.steps, args.guidance, args.image)


if __name__ == "__main__":
    sys.exit(main())
