#!/usr/bin/env python3
"""Writes tests/fixtures/flux: tiny Flux transformers that diffusers built and ran.

For each variant (dev: guidance embedder, shifted schedule, 3 steps; schnell: no
guidance, unshifted, 2 steps) a seeded random FluxTransformer2DModel (weights rounded
to bf16, computed in f32) is saved with save_pretrained (diffusers layout,
<variant>/transformer/), and for dev also in the original layout
(dev/original/flux.safetensors, the fused qkv / linear1 and norm_out halves swapped
back, as diffusers' conversion script maps them). Beside them:

- cond.safetensors: encoder_hidden_states [1, 8, D], pooled_projections [1, P];
- init.safetensors: latent [1, 16, 8, 6] (a 64 x 48 image), the starting noise;
- expected.safetensors: velocity (the transformer's output for the first step,
  packed [1, 12, 64]), latent (after all steps, unpacked), sigmas.

Run with the venv that has torch and diffusers: /work/venv/bin/python
scripts/make-flux-fixtures.py. The tests only read the files.
"""

import json
import os
import sys

import numpy as np
import torch
from diffusers import FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel
from diffusers.pipelines.flux.pipeline_flux import FluxPipeline, calculate_shift, retrieve_timesteps
from safetensors.torch import save_file

torch.set_num_threads(2)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "flux")
HEIGHT, WIDTH, TEXT = 64, 48, 8
CONFIG = dict(
    patch_size=1,
    in_channels=64,
    num_layers=2,
    num_single_layers=2,
    attention_head_dim=16,
    num_attention_heads=2,
    joint_attention_dim=32,
    pooled_projection_dim=16,
    axes_dims_rope=[4, 6, 6],
)


def seeded_model(guidance, seed):
    torch.manual_seed(seed)
    model = FluxTransformer2DModel(guidance_embeds=guidance, **CONFIG).float().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim == 2:
                parameter.copy_(torch.randn_like(parameter) / parameter.shape[1] ** 0.5)
            elif "norm" in name:
                parameter.copy_(1.0 + 0.1 * torch.randn_like(parameter))
            else:
                parameter.copy_(0.02 * torch.randn_like(parameter))
            # Values bf16 can hold, so the bf16 files are these weights exactly.
            parameter.copy_(parameter.to(torch.bfloat16).float())
    return model


def original_state(model):
    """The diffusers weights under the original (Black Forest Labs) names."""
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    out = {}

    def take(new, old):
        out[new] = sd.pop(old)

    for src, dst in [
        ("x_embedder", "img_in"),
        ("context_embedder", "txt_in"),
        ("time_text_embed.timestep_embedder.linear_1", "time_in.in_layer"),
        ("time_text_embed.timestep_embedder.linear_2", "time_in.out_layer"),
        ("time_text_embed.text_embedder.linear_1", "vector_in.in_layer"),
        ("time_text_embed.text_embedder.linear_2", "vector_in.out_layer"),
        ("time_text_embed.guidance_embedder.linear_1", "guidance_in.in_layer"),
        ("time_text_embed.guidance_embedder.linear_2", "guidance_in.out_layer"),
        ("proj_out", "final_layer.linear"),
    ]:
        for suffix in ("weight", "bias"):
            if f"{src}.{suffix}" in sd:
                take(f"{dst}.{suffix}", f"{src}.{suffix}")
    for suffix in ("weight", "bias"):
        scale, shift = sd.pop(f"norm_out.linear.{suffix}").chunk(2, dim=0)
        out[f"final_layer.adaLN_modulation.1.{suffix}"] = torch.cat([shift, scale], dim=0)
    for n in range(model.config.num_layers):
        b, o = f"transformer_blocks.{n}", f"double_blocks.{n}"
        for suffix in ("weight", "bias"):
            out[f"{o}.img_attn.qkv.{suffix}"] = torch.cat([sd.pop(f"{b}.attn.to_{x}.{suffix}") for x in "qkv"])
            out[f"{o}.txt_attn.qkv.{suffix}"] = torch.cat(
                [sd.pop(f"{b}.attn.add_{x}_proj.{suffix}") for x in "qkv"]
            )
            for src, dst in [
                ("norm1.linear", "img_mod.lin"),
                ("norm1_context.linear", "txt_mod.lin"),
                ("attn.to_out.0", "img_attn.proj"),
                ("attn.to_add_out", "txt_attn.proj"),
                ("ff.net.0.proj", "img_mlp.0"),
                ("ff.net.2", "img_mlp.2"),
                ("ff_context.net.0.proj", "txt_mlp.0"),
                ("ff_context.net.2", "txt_mlp.2"),
            ]:
                take(f"{o}.{dst}.{suffix}", f"{b}.{src}.{suffix}")
        for src, dst in [
            ("attn.norm_q", "img_attn.norm.query_norm"),
            ("attn.norm_k", "img_attn.norm.key_norm"),
            ("attn.norm_added_q", "txt_attn.norm.query_norm"),
            ("attn.norm_added_k", "txt_attn.norm.key_norm"),
        ]:
            take(f"{o}.{dst}.scale", f"{b}.{src}.weight")
    for n in range(model.config.num_single_layers):
        b, o = f"single_transformer_blocks.{n}", f"single_blocks.{n}"
        for suffix in ("weight", "bias"):
            out[f"{o}.linear1.{suffix}"] = torch.cat(
                [sd.pop(f"{b}.attn.to_{x}.{suffix}") for x in "qkv"] + [sd.pop(f"{b}.proj_mlp.{suffix}")]
            )
            take(f"{o}.modulation.lin.{suffix}", f"{b}.norm.linear.{suffix}")
            take(f"{o}.linear2.{suffix}", f"{b}.proj_out.{suffix}")
        take(f"{o}.norm.query_norm.scale", f"{b}.attn.norm_q.weight")
        take(f"{o}.norm.key_norm.scale", f"{b}.attn.norm_k.weight")
    assert not sd, f"unmapped: {sorted(sd)}"
    return out


def run(model, guidance, steps, shifted, cond, noise):
    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000,
        shift=3.0 if shifted else 1.0,
        use_dynamic_shifting=shifted,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )
    h, w = noise.shape[2], noise.shape[3]
    latents = FluxPipeline._pack_latents(noise, 1, 16, h, w)
    image_ids = FluxPipeline._prepare_latent_image_ids(1, h // 2, w // 2, "cpu", torch.float32)
    text_ids = torch.zeros(TEXT, 3)
    sigmas = np.linspace(1.0, 1 / steps, steps)
    mu = calculate_shift(latents.shape[1], 256, 4096, 0.5, 1.15)
    timesteps, _ = retrieve_timesteps(scheduler, steps, "cpu", sigmas=sigmas, mu=mu)
    guidance_tensor = torch.full([1], 3.5, dtype=torch.float32) if guidance else None
    velocity = None
    with torch.no_grad():
        for t in timesteps:
            timestep = t.expand(latents.shape[0]).to(latents.dtype)
            prediction = model(
                hidden_states=latents,
                timestep=timestep / 1000,
                guidance=guidance_tensor,
                pooled_projections=cond["pooled_projections"],
                encoder_hidden_states=cond["encoder_hidden_states"],
                txt_ids=text_ids,
                img_ids=image_ids,
                return_dict=False,
            )[0]
            if velocity is None:
                velocity = prediction.clone()
            latents = scheduler.step(prediction, t, latents, return_dict=False)[0]
    final = FluxPipeline._unpack_latents(latents, HEIGHT * 8 // 8 * 1, WIDTH, 8 // 1)
    # _unpack_latents takes pixel sizes and the VAE factor; check it inverts _pack.
    assert torch.equal(FluxPipeline._pack_latents(final, 1, 16, h, w), latents)
    return velocity, final, scheduler.sigmas.clone()


def main():
    torch.manual_seed(1234)
    cond = {
        "encoder_hidden_states": torch.randn(1, TEXT, CONFIG["joint_attention_dim"]),
        "pooled_projections": torch.randn(1, CONFIG["pooled_projection_dim"]),
    }
    noise = torch.randn(1, 16, HEIGHT // 8, WIDTH // 8)
    os.makedirs(OUT, exist_ok=True)
    save_file(cond, os.path.join(OUT, "cond.safetensors"))
    save_file({"latent": noise}, os.path.join(OUT, "init.safetensors"))
    for variant, guidance, steps, seed in [("dev", True, 3, 7), ("schnell", False, 2, 8)]:
        model = seeded_model(guidance, seed)
        folder = os.path.join(OUT, variant)
        model.to(torch.bfloat16).save_pretrained(os.path.join(folder, "transformer"), safe_serialization=True)
        model.float()
        if variant == "dev":
            state = {k: v.to(torch.bfloat16).contiguous() for k, v in original_state(model).items()}
            os.makedirs(os.path.join(folder, "original"), exist_ok=True)
            save_file(
                state,
                os.path.join(folder, "original", "flux.safetensors"),
                metadata={"format": "pt", "stagehand.flux.axes_dims_rope": json.dumps(CONFIG["axes_dims_rope"])},
            )
        velocity, latent, sigmas = run(model, guidance, steps, guidance, cond, noise)
        save_file(
            {"velocity": velocity.contiguous(), "latent": latent.contiguous(), "sigmas": sigmas.contiguous()},
            os.path.join(folder, "expected.safetensors"),
        )
        print(variant, "velocity", velocity.abs().mean().item(), "latent", latent.abs().mean().item(), "sigmas", sigmas.tolist())
    return 0


if __name__ == "__main__":
    sys.exit(main())
