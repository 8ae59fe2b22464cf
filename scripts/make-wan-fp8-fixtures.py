#!/usr/bin/env python3
"""Writes tests/fixtures/wan_fp8/: the tiny Wan 2.2 A14B experts of
tests/fixtures/wan_comfy (Wan-AI's original names, BF16; written by
scripts/make-wan-comfy-fixtures.py) as ComfyUI's scaled-FP8 files
(`diffusion_models/wan2.2_t2v_*_14B_fp8_scaled.safetensors`), and the velocity diffusers
computes from their dequantised weights.

What a ComfyUI scaled-FP8 WAN file holds (docs/wan.md, "Scaled FP8"): each block's
Linear weights (self_attn and cross_attn q, k, v, o; ffn.0, ffn.2) stored F8_E4M3 with a
per-tensor F32 `<layer>.scale_weight` (the weight is `fp8 × scale`) and an F32
`<layer>.scale_input` of 1.0; a `scaled_fp8` marker tensor whose dtype is the weights'
FP8 format (an empty F8_E4M3 tensor); everything else (the Conv3d patch embedding, the
embedders, the head, norms, modulation tables, biases) as it was. The scale is the
weight's largest magnitude over the format's largest finite value (448 for E4M3,
57344 for E5M2), so the largest weight lands on the format's edge; the codes are
round-to-nearest-even of `weight / scale` (torch's cast).

Files written:

- wan2.2_t2v_high_noise_tiny_fp8_scaled.safetensors: the high-noise expert, under
  `model.diffusion_model.` as ComfyUI's files are, E4M3, the blocks' Linears;
- wan2.2_t2v_low_noise_tiny_fp8_scaled.safetensors: the low-noise expert, bare, E4M3;
- wan2.2_t2v_high_noise_tiny_fp8_e5m2_all_linears.safetensors: the high-noise expert
  with every Linear quantised (the blocks', the text and time embedders',
  time_projection and head.head) to E5M2 with an E5M2 marker: the other FP8 format the
  marker can name, and the Linears outside the blocks, so that every path the
  family computes FP8 through has a reference;
- expected.safetensors: a latent [1, 16, 2, 4, 6], encoder_hidden_states [1, 8, 32],
  timestep [1] and the velocity of `WanTransformer3DModel.forward` (diffusers 0.42.1,
  f32) loaded with each file's weights dequantised as ComfyUI dequantises them without
  FP8 matrix multiplication (`weight.float() × scale_weight`; the rest widened to f32):
  `velocity_e4m3` for the first file, `velocity_e5m2` for the third.

The script checks that diffusers' `convert_wan_transformer_to_diffusers` reads each
file's dequantised tensors back under the folder's names.
Run: /work/pyvenv/bin/python scripts/make-wan-fp8-fixtures.py
"""

import json
import os
import re

import torch
from diffusers import WanTransformer3DModel
from diffusers.loaders.single_file_utils import convert_wan_transformer_to_diffusers
from safetensors.torch import load_file, save_file

torch.set_num_threads(2)
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")
OUT = os.path.join(ROOT, "wan_fp8")
PREFIX = "model.diffusion_model."
HEAD_DIM = "stagehand.wan.attention_head_dim"

# The Linear weights ComfyUI's scaled-FP8 WAN files quantise: each block's.
BLOCK_LINEAR = re.compile(r"^blocks\.\d+\.(self_attn|cross_attn)\.[qkvo]\.weight$|^blocks\.\d+\.ffn\.[02]\.weight$")
# The other Linears of WanModel (operations.Linear in comfy/ldm/wan/model.py).
OTHER_LINEAR = re.compile(r"^(text_embedding\.[02]|time_embedding\.[02]|time_projection\.1|head\.head)\.weight$")
FORMATS = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}


def quantised(weights, prefix, fp8, largest, every_linear):
    """The file's tensors with its Linears in `fp8`, their scales and the marker; and
    the same tensors dequantised (fp8 × scale), by the file's names without markers."""
    written, dequantised = {}, {}
    for name, tensor in weights.items():
        local = name[len(prefix):]
        if not (BLOCK_LINEAR.match(local) or (every_linear and OTHER_LINEAR.match(local))):
            written[name] = tensor
            dequantised[local] = tensor.float()
            continue
        stem = name[: -len(".weight")]
        wide = tensor.float()
        scale = (wide.abs().max() / largest).reshape(())
        codes = (wide / scale).to(fp8)
        written[name] = codes
        written[stem + ".scale_weight"] = scale.clone()
        written[stem + ".scale_input"] = torch.ones((), dtype=torch.float32)
        dequantised[local] = codes.float() * scale
    written[prefix + "scaled_fp8"] = torch.empty(0, dtype=fp8)
    return written, dequantised


def velocity(config, dequantised, inputs):
    """diffusers' velocity from the dequantised weights (f32)."""
    state = convert_wan_transformer_to_diffusers(dict(dequantised))
    model = WanTransformer3DModel(**{k: v for k, v in config.items() if not k.startswith("_")}).float().eval()
    missing, unexpected = model.load_state_dict(state, strict=True)
    assert not missing and not unexpected, (missing, unexpected)
    with torch.no_grad():
        return model(
            hidden_states=inputs["latent"],
            timestep=inputs["timestep"],
            encoder_hidden_states=inputs["encoder_hidden_states"],
            return_dict=False,
        )[0]


def main():
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(ROOT, "wan_pipeline", "transformer", "config.json")) as file:
        config = json.load(file)
    metadata = {HEAD_DIM: str(config["attention_head_dim"])}
    comfy = os.path.join(ROOT, "wan_comfy")
    high = load_file(os.path.join(comfy, "wan2.2_t2v_high_noise_tiny.safetensors"))
    low = load_file(os.path.join(comfy, "wan2.2_t2v_low_noise_tiny.safetensors"))
    torch.manual_seed(11)
    inputs = {
        "latent": torch.randn(1, config["in_channels"], 2, 4, 6),
        "encoder_hidden_states": torch.randn(1, 8, config["text_dim"]),
        "timestep": torch.tensor([937.0]),
    }
    expected = dict(inputs)
    cases = [
        ("wan2.2_t2v_high_noise_tiny_fp8_scaled.safetensors", high, PREFIX, "e4m3", False),
        ("wan2.2_t2v_low_noise_tiny_fp8_scaled.safetensors", low, "", "e4m3", False),
        ("wan2.2_t2v_high_noise_tiny_fp8_e5m2_all_linears.safetensors", high, PREFIX, "e5m2", True),
    ]
    for file, weights, prefix, format_name, every_linear in cases:
        fp8, largest = FORMATS[format_name]
        written, dequantised = quantised(weights, prefix, fp8, largest, every_linear)
        save_file(written, os.path.join(OUT, file), metadata=metadata)
        count = sum(1 for tensor in written.values() if tensor.dtype == fp8 and tensor.numel() > 0)
        print(f"{file}: {count} {format_name} weights, {os.path.getsize(os.path.join(OUT, file))} bytes")
        if prefix == PREFIX:
            result = velocity(config, dequantised, inputs)
            bf16 = velocity(config, {k[len(prefix):]: v.float() for k, v in weights.items()}, inputs)
            drift = (result - bf16).abs().max().item() / bf16.abs().max().item()
            print(f"  velocity {tuple(result.shape)}, {drift:.3e} of its largest from the BF16 expert's")
            expected[f"velocity_{format_name}"] = result.contiguous()
    save_file({k: v.contiguous() for k, v in expected.items()}, os.path.join(OUT, "expected.safetensors"))


if __name__ == "__main__":
    main()
