#!/usr/bin/env python3
"""Writes tests/fixtures/wan_vae_file/: two tiny WAN VAEs, each as a diffusers `vae/`
folder (AutoencoderKLWan, save_pretrained, BF16) and as the single file ComfyUI users
have (`vae/wan_2.1_vae.safetensors`, `vae/wan2.2_vae.safetensors`) in Wan-AI's
original names:

- wan21/: Wan 2.1's VAE at base_dim 2 (z_dim 16, dim_mult [1, 2, 4, 4], two res
  blocks a level, as published); its file wan_2.1_vae_tiny.safetensors;
- wan22/: Wan 2.2's (TI2V-5B's) at base_dim 2 and decoder_base_dim 4 (z_dim 48,
  residual levels, 2 x 2 patches); its file wan2.2_vae_tiny.safetensors.

Their latents_mean/latents_std are the published ones, which a file does not carry:
Wan 2.1's are AutoencoderKLWan's defaults, Wan 2.2's the `vae22_diffusers_config` of
diffusers' scripts/convert_wan_to_diffusers.py (the same as ComfyUI's
latent_formats.Wan22); stagehand reads a file with these.

Each file holds the folder's tensors, bit for bit, under the names diffusers'
conversion renames from: the inverse of `convert_vae()` (Wan 2.1) and
`convert_vae_22()` (Wan 2.2) is written out below, and the script checks that those
two functions of diffusers' own script (given with --convert-script, from
huggingface/diffusers) — and, for 2.1, diffusers 0.42.1's single-file
`convert_wan_vae_to_diffusers` — read the file back as the folder's state dict
exactly. diffusers' 2.1 conversion numbers the decoder's up levels for two res blocks
a level (indices 0-2, 4-6 ... and the upsamplers at 3, 7, 11), which is why these
VAEs keep the published structure at tiny widths.

Run: /work/pyvenv/bin/python scripts/make-wan-vae-file-fixtures.py \
       --convert-script PATH/TO/diffusers/scripts/convert_wan_to_diffusers.py
"""

import argparse
import ast
import contextlib
import copy
import importlib.util
import inspect
import os
import re
import types

import torch
from diffusers import AutoencoderKLWan
from diffusers.loaders.single_file_utils import convert_wan_vae_to_diffusers
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "tests", "fixtures", "wan_vae_file")

WAN21 = dict(
    base_dim=2,
    z_dim=16,
    dim_mult=[1, 2, 4, 4],
    num_res_blocks=2,
    attn_scales=[],
    temperal_downsample=[False, True, True],
)
# The published means and stds of Wan 2.2's VAE (48 channels), as diffusers'
# convert_wan_to_diffusers.py `vae22_diffusers_config` writes them (checked against it).
WAN22_MEAN = [
    -0.2289, -0.0052, -0.1323, -0.2339, -0.2799, 0.0174, 0.1838, 0.1557, -0.1382, 0.0542,
    0.2813, 0.0891, 0.1570, -0.0098, 0.0375, -0.1825, -0.2246, -0.1207, -0.0698, 0.5109,
    0.2665, -0.2108, -0.2158, 0.2502, -0.2055, -0.0322, 0.1109, 0.1567, -0.0729, 0.0899,
    -0.2799, -0.1230, -0.0313, -0.1649, 0.0117, 0.0723, -0.2839, -0.2083, -0.0520, 0.3748,
    0.0152, 0.1957, 0.1433, -0.2944, 0.3573, -0.0548, -0.1681, -0.0667,
]
WAN22_STD = [
    0.4765, 1.0364, 0.4514, 1.1677, 0.5313, 0.4990, 0.4818, 0.5013, 0.8158, 1.0344,
    0.5894, 1.0901, 0.6885, 0.6165, 0.8454, 0.4978, 0.5759, 0.3523, 0.7135, 0.6804,
    0.5833, 1.4146, 0.8986, 0.5659, 0.7069, 0.5338, 0.4889, 0.4917, 0.4069, 0.4999,
    0.6866, 0.4093, 0.5709, 0.6065, 0.6415, 0.4944, 0.5726, 1.2042, 0.5458, 1.6887,
    0.3971, 1.0600, 0.3943, 0.5537, 0.5444, 0.4089, 0.7468, 0.7744,
]
WAN22 = dict(
    base_dim=2,
    decoder_base_dim=4,
    z_dim=48,
    dim_mult=[1, 2, 4, 4],
    num_res_blocks=2,
    attn_scales=[],
    temperal_downsample=[False, True, True],
    is_residual=True,
    in_channels=12,
    out_channels=12,
    patch_size=2,
    scale_factor_spatial=16,
    scale_factor_temporal=4,
    latents_mean=WAN22_MEAN,
    latents_std=WAN22_STD,
)

# A res block's layers: diffusers' name -> Wan-AI's (`residual` is Sequential(norm,
# SiLU, conv, norm, SiLU, dropout, conv)).
RESNET = [
    ("norm1.gamma", "residual.0.gamma"),
    ("conv1.", "residual.2."),
    ("norm2.gamma", "residual.3.gamma"),
    ("conv2.", "residual.6."),
    ("conv_shortcut.", "shortcut."),
]
TOP = [
    ("quant_conv.", "conv1."),
    ("post_quant_conv.", "conv2."),
]
CODER = [
    ("conv_in.", "conv1."),
    ("norm_out.gamma", "head.0.gamma"),
    ("conv_out.", "head.2."),
    ("mid_block.resnets.0.", "middle.0."),
    ("mid_block.attentions.0.", "middle.1."),
    ("mid_block.resnets.1.", "middle.2."),
]


def resnet(tail):
    for new, old in RESNET:
        if tail.startswith(new):
            return old + tail[len(new):]
    return tail


def original(name, config):
    """Wan-AI's name of a diffusers AutoencoderKLWan tensor (diffusers' conversion
    inverted)."""
    for new, old in TOP:
        if name.startswith(new):
            return old + name[len(new):]
    coder, rest = name.split(".", 1)
    for new, old in CODER:
        if rest.startswith(new):
            tail = rest[len(new):]
            return f"{coder}.{old}{resnet(tail) if new.endswith('resnets.0.') or new.endswith('resnets.1.') else tail}"
    blocks = config["num_res_blocks"]
    residual = config.get("is_residual", False)
    match = re.match(r"(down|up)_blocks\.(\d+)\.(.*)", rest)
    level, index, tail = match.group(1), int(match.group(2)), match.group(3)
    outer = "downsamples" if level == "down" else "upsamples"
    if residual:
        # Wan 2.2: each level a Down/Up_ResidualBlock whose own list holds its res
        # blocks, then its Resample (after num_res_blocks down, num_res_blocks + 1 up).
        inner = re.match(r"resnets\.(\d+)\.(.*)", tail)
        if inner:
            return f"{coder}.{outer}.{index}.{outer}.{inner.group(1)}.{resnet(inner.group(2))}"
        sampler = "downsampler." if level == "down" else "upsampler."
        assert tail.startswith(sampler), name
        last = blocks if level == "down" else blocks + 1
        return f"{coder}.{outer}.{index}.{outer}.{last}.{tail[len(sampler):]}"
    if level == "down":
        # Wan 2.1's encoder: one flat list, diffusers' down_blocks the same list.
        return f"{coder}.downsamples.{index}.{resnet(tail)}"
    # Wan 2.1's decoder: one flat list of num_res_blocks + 1 res blocks a level, then
    # the level's Resample; diffusers groups them per level.
    stride = blocks + 2
    inner = re.match(r"resnets\.(\d+)\.(.*)", tail)
    if inner:
        return f"decoder.upsamples.{index * stride + int(inner.group(1))}.{resnet(inner.group(2))}"
    assert tail.startswith("upsamplers.0."), name
    return f"decoder.upsamples.{index * stride + blocks + 1}.{tail[len('upsamplers.0.'):]}"


def seeded(config):
    spec = importlib.util.spec_from_file_location("wan_vae_fixtures", os.path.join(HERE, "make-wan-vae-fixtures.py"))
    fixtures = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fixtures)
    return fixtures.seeded_model(config)


def diffusers_script(path):
    """convert_vae, convert_vae_22 and vae22_diffusers_config of diffusers'
    convert_wan_to_diffusers.py, run on a local file and a tiny model: its
    hf_hub_download gives the file, torch.load reads it (safetensors), and the model
    it builds is the tiny one (the same class, the fixture's config)."""
    tree = ast.parse(open(path).read())
    wanted = {"convert_vae", "convert_vae_22", "vae22_diffusers_config"}
    kept = [
        node
        for node in tree.body
        if (isinstance(node, ast.FunctionDef) and node.name in wanted)
        or (isinstance(node, ast.Assign) and any(getattr(t, "id", None) in wanted for t in node.targets))
    ]
    assert len(kept) == 3, f"{path} lacks one of {wanted}"
    state = {}
    names = {
        "hf_hub_download": lambda *_: state["file"],
        "torch": types.SimpleNamespace(load=lambda file, weights_only=True: load_file(file)),
        "init_empty_weights": contextlib.nullcontext,
        "AutoencoderKLWan": lambda **_: AutoencoderKLWan(**state["config"]),
    }
    exec(compile(ast.Module(body=kept, type_ignores=[]), path, "exec"), names)

    def convert(function, file, config):
        state.update(file=file, config=config)
        return {name: tensor for name, tensor in names[function]().state_dict().items()}

    return convert, names["vae22_diffusers_config"]


def same(got, want, what):
    assert got.keys() == want.keys(), f"{what}: {sorted(got.keys() ^ want.keys())[:6]}"
    for name in want:
        assert got[name].dtype == want[name].dtype and torch.equal(got[name], want[name]), f"{what}: {name}"


def write(folder, file, config, convert, function):
    model = seeded(config)
    vae_dir = os.path.join(OUT, folder, "vae")
    copy.deepcopy(model).to(torch.bfloat16).save_pretrained(vae_dir, safe_serialization=True)
    folder_tensors = load_file(os.path.join(vae_dir, "diffusion_pytorch_model.safetensors"))
    renamed = {original(name, config): tensor.contiguous() for name, tensor in folder_tensors.items()}
    assert len(renamed) == len(folder_tensors), "two tensors share an original name"
    path = os.path.join(OUT, folder, file)
    save_file(renamed, path)
    same(convert(function, path, config), folder_tensors, f"diffusers' {function}")
    if function == "convert_vae":
        same(convert_wan_vae_to_diffusers(load_file(path)), folder_tensors, "convert_wan_vae_to_diffusers")
    print(f"{path}: {len(renamed)} tensors, {os.path.getsize(path)} bytes; diffusers' {function} reads the folder's")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--convert-script",
        required=True,
        help="diffusers' scripts/convert_wan_to_diffusers.py (huggingface/diffusers)",
    )
    args = parser.parse_args()
    convert, published = diffusers_script(args.convert_script)
    assert published["latents_mean"] == WAN22_MEAN and published["latents_std"] == WAN22_STD
    defaults = inspect.signature(AutoencoderKLWan.__init__).parameters
    assert len(defaults["latents_mean"].default) == 16 and len(defaults["latents_std"].default) == 16
    write("wan21", "wan_2.1_vae_tiny.safetensors", WAN21, convert, "convert_vae")
    write("wan22", "wan2.2_vae_tiny.safetensors", WAN22, convert, "convert_vae_22")


if __name__ == "__main__":
    main()
