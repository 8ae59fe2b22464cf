#!/usr/bin/env python3
"""Prompt -> image on the CPU: diffusers' FluxPipeline beside `stagehand image` on the
same pipeline folder, the same prompt and the same starting noise (BENCHMARKS.md,
"Prompt to image on the CPU backend").

    bench-pipeline.py make DIR [--preset small|tiny]   write a pipeline with diffusers
    bench-pipeline.py diffusers DIR [--threads 2] ...   one diffusers run, JSON on stdout

`make` writes the real classes with seeded bf16 weights through `save_pretrained`,
and `noise.safetensors` (`latent` [1, 16, H/8, W/8]) for both sides. The "small"
preset: CLIP-L's text encoder shape (768 wide, 12 layers, vocabulary 49408), a
T5-base-shaped v1.1 encoder (768 wide, 12 layers, 12 heads, d_ff 2048), a Flux
transformer of Flux's head (128) at 1024 wide with 2 double and 4 single blocks, and
Flux's own VAE shape (128/256/512/512, 16 latent channels, GroupNorm 32). The
tokenizers are the fixture's (tests/fixtures/pipeline): small vocabularies, real
layouts. `diffusers` times each stage as FluxPipeline runs it (encode_prompt, the
denoising loop, the VAE decode and post-processing) after loading, and the peak RSS
of the whole process.

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
FIXTURE = os.path.join(HERE, "..", "tests", "fixtures", "pipeline", "flux-tiny")


def make(directory, preset):
    import torch
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from safetensors.torch import save_file
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel, T5Tokenizer

    sys.path.insert(0, HERE)
    torch.manual_seed(0)
    small = preset == "small"
    clip = CLIPTextModel(
        CLIPTextConfig(
            vocab_size=49408 if small else 727,
            hidden_size=768 if small else 32,
            intermediate_size=3072 if small else 40,
            num_hidden_layers=12 if small else 3,
            num_attention_heads=12 if small else 4,
            max_position_embeddings=77,
            hidden_act="quick_gelu",
            eos_token_id=2,
        )
    )
    t5 = T5EncoderModel(
        T5Config(
            vocab_size=32128 if small else 163,
            d_model=768 if small else 32,
            d_kv=64 if small else 8,
            d_ff=2048 if small else 48,
            num_layers=12 if small else 2,
            num_heads=12 if small else 4,
            feed_forward_proj="gated-gelu",
            is_encoder_decoder=False,
            use_cache=False,
        )
    )
    transformer = FluxTransformer2DModel(
        patch_size=1,
        in_channels=64,
        num_layers=2 if small else 1,
        num_single_layers=4 if small else 2,
        attention_head_dim=128 if small else 16,
        num_attention_heads=8 if small else 2,
        joint_attention_dim=768 if small else 32,
        pooled_projection_dim=768 if small else 32,
        guidance_embeds=True,
        axes_dims_rope=[16, 56, 56] if small else [4, 6, 6],
    )
    vae = AutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4,
        block_out_channels=[128, 256, 512, 512] if small else [8, 16, 32, 32],
        layers_per_block=2,
        latent_channels=16,
        norm_num_groups=32 if small else 4,
        sample_size=1024,
        scaling_factor=0.3611,
        shift_factor=0.1159,
        use_quant_conv=False,
        use_post_quant_conv=False,
    )
    for model in (clip, t5, transformer, vae):
        with torch.no_grad():
            for name, parameter in model.named_parameters():
                if parameter.ndim >= 2:
                    parameter.copy_(torch.randn_like(parameter) / parameter[0].numel() ** 0.5)
                elif "norm" in name:
                    parameter.copy_(1.0 + 0.1 * torch.randn_like(parameter))
                else:
                    parameter.copy_(0.02 * torch.randn_like(parameter))
        model.to(torch.bfloat16)
    scheduler = FlowMatchEulerDiscreteScheduler(
        shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096
    )
    clip_tok = CLIPTokenizer.from_pretrained(os.path.join(FIXTURE, "tokenizer"))
    t5_tok = T5Tokenizer.from_pretrained(os.path.join(FIXTURE, "tokenizer_2"))
    pipe = FluxPipeline(scheduler, vae, clip, clip_tok, t5, t5_tok, transformer)
    if os.path.isdir(directory):
        shutil.rmtree(directory)
    pipe.save_pretrained(directory, safe_serialization=True)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(os.path.join(FIXTURE, "tokenizer", name), os.path.join(directory, "tokenizer", name))
    print("wrote", directory)


def noise_file(directory, height, width):
    import torch
    from safetensors.torch import save_file

    path = os.path.join(directory, f"noise-{height}x{width}.safetensors")
    if not os.path.exists(path):
        torch.manual_seed(7)
        save_file({"latent": torch.randn(1, 16, height // 8, width // 8)}, path)
    return path


def run_diffusers(args):
    import torch

    torch.set_num_threads(args.threads)
    from diffusers import FluxPipeline
    from safetensors.torch import load_file

    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    started = time.perf_counter()
    pipe = FluxPipeline.from_pretrained(args.dir, torch_dtype=dtype)
    loaded = time.perf_counter()
    noise = load_file(noise_file(args.dir, args.height, args.width))["latent"].to(dtype)
    latents = FluxPipeline._pack_latents(noise, 1, 16, args.height // 8, args.width // 8)
    with torch.no_grad():
        t0 = time.perf_counter()
        prompt_embeds, pooled, _ = pipe.encode_prompt(
            args.prompt, prompt_2=None, max_sequence_length=args.max_sequence_length
        )
        t1 = time.perf_counter()
        latent = pipe(
            prompt_embeds=prompt_embeds,
            pooled_prompt_embeds=pooled,
            height=args.height,
            width=args.width,
            num_inference_steps=args.steps,
            guidance_scale=3.5,
            latents=latents,
            output_type="latent",
        ).images
        t2 = time.perf_counter()
        unpacked = FluxPipeline._unpack_latents(latent, args.height, args.width, pipe.vae_scale_factor)
        unpacked = unpacked / pipe.vae.config.scaling_factor + pipe.vae.config.shift_factor
        image = pipe.vae.decode(unpacked, return_dict=False)[0]
        image = pipe.image_processor.postprocess(image, output_type="pil")[0]
        t3 = time.perf_counter()
    if args.out:
        image.save(args.out)
    print(
        json.dumps(
            {
                "load_seconds": loaded - started,
                "text_encoders_seconds": t1 - t0,
                "transformer_seconds": t2 - t1,
                "vae_seconds": t3 - t2,
                "total_seconds": t3 - started,
                "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            }
        )
    )


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    made = sub.add_parser("make")
    made.add_argument("dir")
    made.add_argument("--preset", choices=["small", "tiny"], default="small")
    run = sub.add_parser("diffusers")
    run.add_argument("dir")
    run.add_argument("--threads", type=int, default=2)
    run.add_argument("--prompt", default="A photo of a red fox sitting in the snow, highly detailed")
    run.add_argument("--width", type=int, default=256)
    run.add_argument("--height", type=int, default=256)
    run.add_argument("--steps", type=int, default=4)
    run.add_argument("--max-sequence-length", type=int, default=128)
    run.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    run.add_argument("--out")
    noise = sub.add_parser("noise")
    noise.add_argument("dir")
    noise.add_argument("--width", type=int, default=256)
    noise.add_argument("--height", type=int, default=256)
    args = parser.parse_args()
    if args.command == "make":
        make(args.dir, args.preset)
    elif args.command == "noise":
        print(noise_file(args.dir, args.height, args.width))
    else:
        run_diffusers(args)


if __name__ == "__main__":
    main()
