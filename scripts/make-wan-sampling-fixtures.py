#!/usr/bin/env python3
"""Writes tests/fixtures/wan/t2v/sampling.safetensors: diffusers' WanPipeline sampling
with the tiny T2V transformer of scripts/make-wan-fixtures.py.

WanPipeline (diffusers 0.42.1) runs with the transformer at f32, the UniPC scheduler
of tests/fixtures/unipc/wan-t2v (Wan 2.2's config), given prompt and negative prompt
states and a given starting latent, `output_type="latent"` (no VAE, no text encoder):

- `guided`: 4 steps, guidance 4.0, one expert;
- `experts`: the same transformer as both experts (`transformer_2`) with
  `boundary_ratio` 0.875 and guidance 4.0 then 2.5: the switch at timestep 875 changes
  the scale, and the solver's state must carry over.

Saved: latent [1, 16, 3, 8, 6], context and negative [1, 10, 24], and each case's
final latent. Run: /work/pyvenv/bin/python scripts/make-wan-sampling-fixtures.py
"""

import os

import torch
from diffusers import UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel
from safetensors.torch import load_file, save_file

torch.set_num_threads(2)
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")


def main():
    folder = os.path.join(ROOT, "wan", "t2v", "transformer")
    # Built from its config and loaded by hand: from_pretrained needs accelerate for
    # this model's fp32-kept modules.
    transformer = WanTransformer3DModel.from_config(WanTransformer3DModel.load_config(folder))
    weights = load_file(os.path.join(folder, "diffusion_pytorch_model.safetensors"))
    transformer.load_state_dict({k: v.float() for k, v in weights.items()}, strict=True)
    transformer = transformer.float().eval()
    scheduler_dir = os.path.join(ROOT, "unipc", "wan-t2v")
    generator = torch.Generator().manual_seed(21)
    latent = torch.randn(1, 16, 3, 8, 6, generator=generator)
    context = torch.randn(1, 10, 24, generator=generator)
    negative = torch.randn(1, 10, 24, generator=generator)
    tensors = {"latent": latent, "context": context, "negative": negative}
    cases = {
        "guided": dict(transformer_2=None, boundary_ratio=None, guidance_scale_2=None),
        "experts": dict(transformer_2=transformer, boundary_ratio=0.875, guidance_scale_2=2.5),
    }
    for name, case in cases.items():
        pipe = WanPipeline(
            tokenizer=None,
            text_encoder=None,
            vae=None,
            transformer=transformer,
            transformer_2=case["transformer_2"],
            scheduler=UniPCMultistepScheduler.from_pretrained(scheduler_dir),
            boundary_ratio=case["boundary_ratio"],
        )
        with torch.no_grad():
            out = pipe(
                prompt_embeds=context,
                negative_prompt_embeds=negative,
                height=64,
                width=48,
                num_frames=9,
                num_inference_steps=4,
                guidance_scale=4.0,
                guidance_scale_2=case["guidance_scale_2"],
                latents=latent.clone(),
                output_type="latent",
            ).frames
        tensors[f"{name}_final"] = out.float().contiguous()
        print(name, "timesteps", pipe.scheduler.timesteps.tolist(), "final", out.flatten()[:3].tolist())
    save_file({k: v.contiguous() for k, v in tensors.items()}, os.path.join(ROOT, "wan", "t2v", "sampling.safetensors"))


if __name__ == "__main__":
    main()
