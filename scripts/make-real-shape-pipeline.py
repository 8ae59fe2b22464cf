#!/usr/bin/env python3
"""Writes a Flux pipeline at FLUX.1-dev's real shapes, as ComfyUI users have it, with
seeded random weights: the measurement behind BENCHMARKS.md "A pipeline at Flux-dev's
real shapes on the CPU backend" (scripts/bench-real-shape-pipeline.sh runs it).

Into OUT (default /tmp/flux-dev-shapes):
- clip_l.safetensors: CLIP-L's text tower (12 layers, width 768, 77 positions, vocab
  49408) in transformers' names under `text_model.`, BF16;
- t5xxl_fp8_e4m3fn_scaled.safetensors: T5-XXL's encoder (24 blocks, width 4096, 64 heads
  of 64, d_ff 10240, vocab 32128) in ComfyUI's scaled FP8 (E4M3 block weights with a
  `scale_weight` each, the rest BF16, the `scaled_fp8` marker), generated tensor by
  tensor (4.7 GB, never the model in memory);
- ae.safetensors: Flux's autoencoder (blocks 128/256/512/512, 16 latent channels) in
  its original LDM names, BF16;
- tokenizer/ and tokenizer_2/: the tiny test pipeline's tokenizers (their ids fit
  any vocabulary; the real ones cannot be fetched here).
The transformer is `stagehand demo-model --arch flux --flux-preset dev` (the script
that runs the benchmark writes it). Run with the venv that has torch, transformers and
diffusers: /work/pyvenv/bin/python scripts/make-real-shape-pipeline.py [OUT]
"""

import importlib.util
import os
import shutil
import sys

import torch
from diffusers import AutoencoderKL
from safetensors.torch import save_file
from transformers import CLIPTextConfig, CLIPTextModel, T5Config, T5EncoderModel

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures", "pipeline", "flux-tiny")


def fixtures_module():
    spec = importlib.util.spec_from_file_location("make_pipeline_fixtures", os.path.join(HERE, "make-pipeline-fixtures.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def seeded(shape, generator):
    """N(0, 1/fan_in) for matrices, near 1 for norms, in BF16."""
    if len(shape) >= 2:
        fan_in = 1
        for size in shape[1:]:
            fan_in *= size
        return (torch.randn(shape, generator=generator) / fan_in**0.5).to(torch.bfloat16)
    return (1.0 + 0.1 * torch.randn(shape, generator=generator)).to(torch.bfloat16)


def t5xxl(out):
    config = T5Config(
        vocab_size=32128, d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64,
        relative_attention_num_buckets=32, relative_attention_max_distance=128,
        feed_forward_proj="gated-gelu", is_encoder_decoder=False, use_cache=False,
    )
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in T5EncoderModel(config).state_dict().items()}
    generator = torch.Generator().manual_seed(2)
    tensors = {}
    for name, shape in shapes.items():
        if name == "encoder.embed_tokens.weight":
            continue
        value = seeded(shape, generator)
        if name.startswith("encoder.block.") and len(shape) == 2 and "relative" not in name:
            scale = value.abs().max().float() / 448.0
            tensors[name] = (value.float() / scale).to(torch.float8_e4m3fn)
            tensors[name[: -len("weight")] + "scale_weight"] = scale.reshape(()).float()
        else:
            tensors[name] = value
    tensors["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    save_file(tensors, os.path.join(out, "t5xxl_fp8_e4m3fn_scaled.safetensors"))


def clip_l(out):
    config = CLIPTextConfig(
        vocab_size=49408, hidden_size=768, intermediate_size=3072, num_hidden_layers=12,
        num_attention_heads=12, max_position_embeddings=77, hidden_act="quick_gelu",
        projection_dim=768, bos_token_id=0, eos_token_id=2, pad_token_id=1,
    )
    generator = torch.Generator().manual_seed(1)
    with torch.device("meta"):
        shapes = {k: tuple(v.shape) for k, v in CLIPTextModel(config).state_dict().items()}
    tensors = {
        (k if k.startswith("text_model.") else "text_model." + k): seeded(shape, generator)
        for k, shape in shapes.items()
        if not k.endswith("position_ids")
    }
    save_file(tensors, os.path.join(out, "clip_l.safetensors"))


def ae(out):
    torch.manual_seed(4)
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
        up_block_types=["UpDecoderBlock2D"] * 4, block_out_channels=[128, 256, 512, 512],
        layers_per_block=2, act_fn="silu", latent_channels=16, norm_num_groups=32, sample_size=1024,
        scaling_factor=0.3611, shift_factor=0.1159, use_quant_conv=False, use_post_quant_conv=False,
    )
    state = fixtures_module().ldm_vae_state(vae)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in state.items()}, os.path.join(out, "ae.safetensors"))


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/flux-dev-shapes"
    os.makedirs(out, exist_ok=True)
    for name in ("tokenizer", "tokenizer_2"):
        shutil.copytree(os.path.join(FIXTURES, name), os.path.join(out, name), dirs_exist_ok=True)
    clip_l(out)
    ae(out)
    t5xxl(out)
    print("wrote", out)


if __name__ == "__main__":
    main()
