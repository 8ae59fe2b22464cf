#!/usr/bin/env python3
"""Writes tests/fixtures/wan/t2v/euler.safetensors and tests/fixtures/euler/wan-t2v/:
diffusers' WanPipeline sampling with FlowMatchEulerDiscreteScheduler and the tiny T2V
transformer of scripts/make-wan-fixtures.py.

The scheduler: diffusers 0.42.1's FlowMatchEulerDiscreteScheduler with `shift` 5.0
(Wan 2.1's 720p value; a static shift, `use_dynamic_shifting: false`), its config saved
with every key diffusers writes. The starting latent and the prompt and negative prompt
states are tests/fixtures/wan/t2v/sampling.safetensors' (the UniPC fixture's), so the
two samplers start from the same place. WanPipeline runs with the transformer at f32,
`output_type="latent"` (no VAE, no text encoder):

- `guided`: 4 steps, guidance 4.0, one expert;
- `experts`: the same transformer as both experts (`transformer_2`) with
  `boundary_ratio` 0.875 and guidance 4.0 then 2.5.

Saved: the schedule's timesteps and sigmas, and each case's final latent.
Run: /work/pyvenv/bin/python scripts/make-wan-euler-fixtures.py
"""

import os

import torch
from diffusers import FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
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
    scheduler_dir = os.path.join(ROOT, "euler", "wan-t2v")
    FlowMatchEulerDiscreteScheduler(shift=5.0).save_config(scheduler_dir)
    start = load_file(os.path.join(ROOT, "wan", "t2v", "sampling.safetensors"))
    latent, context, negative = start["latent"], start["context"], start["negative"]
    tensors = {}
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
            scheduler=FlowMatchEulerDiscreteScheduler.from_pretrained(scheduler_dir),
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
        tensors["timesteps"] = pipe.scheduler.timesteps.float().contiguous()
        tensors["sigmas"] = pipe.scheduler.sigmas.float().contiguous()
        print(name, "timesteps", pipe.scheduler.timesteps.tolist(), "sigmas", pipe.scheduler.sigmas.tolist())
    save_file(tensors, os.path.join(ROOT, "wan", "t2v", "euler.safetensors"))


if __name__ == "__main__":
    main()
