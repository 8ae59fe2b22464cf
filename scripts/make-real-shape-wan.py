#!/usr/bin/env python3
"""Writes the parts of a Wan 2.2 T2V-A14B pipeline folder around its two experts, at
the widths the experts need, with seeded random weights: the measurement behind
BENCHMARKS.md "A Wan 2.2 A14B pair at real shapes on the CPU backend"
(scripts/bench-real-shape-wan.sh runs it and writes the experts with
`stagehand demo-model --arch wan --wan-preset a14b`).

Into OUT (default /tmp/wan-a14b-shapes):
- model_index.json: WanPipeline with transformer and transformer_2, boundary_ratio
  0.875 (Wan2.2-T2V-A14B-Diffusers' own);
- scheduler/: Wan 2.2's UniPC config (the test fixture's, which is the published one);
- text_encoder/: umT5 at umT5-XXL's width (d_model 4096, 64 heads of 64, d_ff 10240,
  per-layer relative position bias) but 2 layers deep and the tiny tokenizer's
  vocabulary: the experts' cross-attention needs the width, and the 24 layers and
  256 k vocabulary (11.4 GB in BF16) would not fit beside the experts on this disk;
- tokenizer/: the test fixture's tiny tokenizer (the real one cannot be fetched here);
- vae/: Wan 2.1's VAE at its published config (base_dim 96, 16 latent channels,
  127 M parameters), BF16.

Run with the venv that has torch, transformers and diffusers:
/work/pyvenv/bin/python scripts/make-real-shape-wan.py [OUT]
"""

import json
import os
import shutil
import sys

import torch
from diffusers import AutoencoderKLWan
from transformers import UMT5Config, UMT5EncoderModel

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "tests", "fixtures", "wan_pipeline")


def text_encoder(out):
    vocabulary = json.load(open(os.path.join(FIXTURE, "text_encoder", "config.json")))["vocab_size"]
    config = UMT5Config(
        d_model=4096,
        num_heads=64,
        d_kv=64,
        d_ff=10240,
        num_layers=2,
        num_decoder_layers=2,
        vocab_size=vocabulary,
        feed_forward_proj="gated-gelu",
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
    )
    torch.manual_seed(41)
    model = UMT5EncoderModel(config).to(torch.bfloat16).eval()
    model.save_pretrained(os.path.join(out, "text_encoder"), safe_serialization=True)


def vae(out):
    torch.manual_seed(42)
    model = AutoencoderKLWan().to(torch.bfloat16).eval()
    model.save_pretrained(os.path.join(out, "vae"), safe_serialization=True)


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/wan-a14b-shapes"
    os.makedirs(out, exist_ok=True)
    for part in ["scheduler", "tokenizer"]:
        shutil.rmtree(os.path.join(out, part), ignore_errors=True)
        shutil.copytree(os.path.join(FIXTURE, part), os.path.join(out, part))
    shutil.copy(os.path.join(FIXTURE, "model_index.json"), os.path.join(out, "model_index.json"))
    text_encoder(out)
    vae(out)
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
