#!/usr/bin/env python3
"""Writes tests/fixtures/flux/lora: LoRA adapters for the tiny dev fixture and what
diffusers computed with them.

Reads the committed dev fixture (tests/fixtures/flux/dev/transformer, cond.safetensors,
init.safetensors; scripts/make-flux-fixtures.py wrote them) and writes two seeded
rank-4 adapters with BF16 factors, each as its tool writes it, then loads each into
diffusers' FluxTransformer2DModel the way FluxPipeline.load_lora_weights does, at
strength STRENGTH (set_adapters' weight), and runs the base fixture's sampling (3 dev
steps from init.safetensors):

- peft.safetensors: diffusers/PEFT naming (`transformer.transformer_blocks.0.attn.to_q
  .lora_A.weight`), saved by FluxPipeline.save_lora_weights from a peft LoraConfig on
  every linear of the transformer (the fused weights' pieces each with their own A;
  `proj_out` names both the single blocks' and the final one), r 4, lora_alpha 2: the
  alpha is only in the header's `lora_adapter_metadata`, as diffusers' trainers save it.
- kohya.safetensors: kohya/original naming (`lora_unet_double_blocks_0_img_attn_qkv
  .lora_down.weight`, `.alpha` per module), read by diffusers' kohya converter
  (`lora_state_dict`, as load_lora_weights reads a file). Its alphas differ by module
  (2, 4 and 8 at rank 4: scales 1/2, 1, 2, which the converter's scaling and BF16 hold
  exactly), except final_layer's, which equal the rank: the converter drops
  final_layer alphas ("TODO: alphas", diffusers 0.42), where kohya and ComfyUI apply
  them. Two things of diffusers 0.42 this script works around, both saying so: the
  converter names the embedders (img_in, txt_in, time_in, vector_in, guidance_in) and
  the final layer's modules without the `transformer.` prefix, and load_lora_weights
  then drops them without a word (32 of 42 layers patched), so the script adds the
  prefix to those keys before loading; and it splits linear1 at Flux.1's widths
  (dims=[3072, 3072, 3072, 12288]), so no `single_blocks_N_linear1` of another width
  loads and the file has none (stagehand's kohya linear1 equals the PEFT pieces that
  share its A, tests/flux_lora.rs, and those pieces are in peft.safetensors).
- expected.safetensors: for each adapter NAME, `velocity_NAME` (the first step's
  transformer output, packed [1, 12, 64]) and `latent_NAME` (after 3 steps,
  unpacked), and `strength`.

Run with the venv that has torch, diffusers and peft: /work/venv/bin/python
scripts/make-flux-lora-fixtures.py. The tests only read the files.
"""

import importlib.util
import json
import os
import shutil
import sys
import tempfile

import torch
from diffusers import FluxPipeline, FluxTransformer2DModel
from peft import LoraConfig
from peft.utils import get_peft_model_state_dict
from safetensors import safe_open
from safetensors.torch import load_file, save_file

torch.set_num_threads(2)
HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures", "flux")
OUT = os.path.join(FIXTURES, "lora")
RANK = 4
STRENGTH = 0.8
SEED = 25

# Every linear of diffusers' FluxTransformer2DModel, as PEFT target_modules suffixes.
PEFT_TARGETS = [
    "attn.to_q",
    "attn.to_k",
    "attn.to_v",
    "attn.to_out.0",
    "attn.add_q_proj",
    "attn.add_k_proj",
    "attn.add_v_proj",
    "attn.to_add_out",
    "ff.net.0.proj",
    "ff.net.2",
    "ff_context.net.0.proj",
    "ff_context.net.2",
    "norm1.linear",
    "norm1_context.linear",
    "norm.linear",
    "proj_mlp",
    "proj_out",
    "norm_out.linear",
    "x_embedder",
    "context_embedder",
    "timestep_embedder.linear_1",
    "timestep_embedder.linear_2",
    "guidance_embedder.linear_1",
    "guidance_embedder.linear_2",
    "text_embedder.linear_1",
    "text_embedder.linear_2",
]


def base_fixture():
    """make-flux-fixtures.py as a module, for its sampling loop."""
    spec = importlib.util.spec_from_file_location("make_flux_fixtures", os.path.join(HERE, "make-flux-fixtures.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def dev_model():
    path = os.path.join(FIXTURES, "dev", "transformer")
    return FluxTransformer2DModel.from_pretrained(path, torch_dtype=torch.float32).eval()


def seeded(shape, generator, scale):
    values = torch.randn(shape, generator=generator) * scale
    # Values BF16 holds, so the BF16 file is these factors exactly.
    return values.to(torch.bfloat16).float()


def write_peft(path):
    """A PEFT adapter on every linear, saved as diffusers' trainers save one."""
    model = dev_model()
    config = LoraConfig(r=RANK, lora_alpha=2, target_modules=PEFT_TARGETS, init_lora_weights=False)
    model.add_adapter(config)
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for name, parameter in sorted(model.named_parameters()):
            if ".lora_A." in name:
                parameter.copy_(seeded(parameter.shape, generator, parameter.shape[1] ** -0.5))
            elif ".lora_B." in name:
                parameter.copy_(seeded(parameter.shape, generator, 0.1))
    layers = {k: v.to(torch.bfloat16).contiguous() for k, v in get_peft_model_state_dict(model).items()}
    metadata = model.peft_config["default"].to_dict()
    # peft keeps target_modules as a set: sorted, the file is the same bytes every run.
    metadata["target_modules"] = sorted(metadata["target_modules"])
    with tempfile.TemporaryDirectory() as folder:
        FluxPipeline.save_lora_weights(
            folder,
            transformer_lora_layers=layers,
            transformer_lora_adapter_metadata=metadata,
        )
        shutil.copyfile(os.path.join(folder, "pytorch_lora_weights.safetensors"), path)
    with safe_open(path, "pt") as file:
        metadata = json.loads(file.metadata()["lora_adapter_metadata"])
    assert metadata["transformer.lora_alpha"] == 2 and metadata["transformer.r"] == RANK, metadata
    return len(layers) // 2


def write_kohya(path):
    """A kohya adapter of the original layout's modules, alpha per module."""
    hidden, mlp = 32, 128
    modules = [("img_in", 64, hidden), ("txt_in", 32, hidden)]
    for stem, inputs in [("time_in", 256), ("guidance_in", 256), ("vector_in", 16)]:
        modules += [(f"{stem}_in_layer", inputs, hidden), (f"{stem}_out_layer", hidden, hidden)]
    for block in range(2):
        for stream in ("img", "txt"):
            at = f"double_blocks_{block}_{stream}"
            modules += [
                (f"{at}_attn_qkv", hidden, 3 * hidden),
                (f"{at}_attn_proj", hidden, hidden),
                (f"{at}_mlp_0", hidden, mlp),
                (f"{at}_mlp_2", mlp, hidden),
                (f"{at}_mod_lin", hidden, 6 * hidden),
            ]
        at = f"single_blocks_{block}"
        modules += [(f"{at}_linear2", hidden + mlp, hidden), (f"{at}_modulation_lin", hidden, 3 * hidden)]
    modules += [("final_layer_adaLN_modulation_1", hidden, 2 * hidden), ("final_layer_linear", hidden, 64)]
    generator = torch.Generator().manual_seed(SEED + 1)
    tensors = {}
    for number, (stem, inputs, outputs) in enumerate(modules):
        name = f"lora_unet_{stem}"
        tensors[f"{name}.lora_down.weight"] = seeded((RANK, inputs), generator, inputs**-0.5)
        tensors[f"{name}.lora_up.weight"] = seeded((outputs, RANK), generator, 0.1)
        alpha = float(RANK) if stem.startswith("final_layer") else [2.0, 4.0, 8.0][number % 3]
        tensors[f"{name}.alpha"] = torch.tensor(alpha)
    save_file({k: v.to(torch.bfloat16).contiguous() for k, v in tensors.items()}, path, metadata={"format": "pt"})
    return len(modules)


def sampled_with(path, fixture, cond, noise):
    """Velocity and final latent of the dev fixture with the adapter at `path`."""
    model = dev_model()
    pipeline = FluxPipeline(
        scheduler=None,
        vae=None,
        text_encoder=None,
        tokenizer=None,
        text_encoder_2=None,
        tokenizer_2=None,
        transformer=model,
    )
    state_dict = FluxPipeline.lora_state_dict(path)
    unprefixed = [key for key in state_dict if not key.startswith("transformer.")]
    if unprefixed:
        # diffusers' kohya converter leaves these without the prefix the loader keeps.
        print(f"{os.path.basename(path)}: adding the transformer. prefix to {len(unprefixed)} keys diffusers would drop")
        state_dict = {(key if key.startswith("transformer.") else f"transformer.{key}"): value for key, value in state_dict.items()}
    pipeline.load_lora_weights(state_dict if unprefixed else path, adapter_name="fixture")
    pipeline.set_adapters(["fixture"], adapter_weights=[STRENGTH])
    patched = {name for name, _ in model.named_modules() if name.endswith(".lora_A")}
    velocity, latent, _ = fixture.run(model, True, 3, True, cond, noise)
    return velocity, latent, len(patched)


def main():
    fixture = base_fixture()
    cond = load_file(os.path.join(FIXTURES, "cond.safetensors"))
    noise = load_file(os.path.join(FIXTURES, "init.safetensors"))["latent"]
    base = load_file(os.path.join(FIXTURES, "dev", "expected.safetensors"))
    os.makedirs(OUT, exist_ok=True)
    expected = {"strength": torch.tensor([STRENGTH])}
    for name, write in [("peft", write_peft), ("kohya", write_kohya)]:
        path = os.path.join(OUT, f"{name}.safetensors")
        modules = write(path)
        velocity, latent, patched = sampled_with(path, fixture, cond, noise)
        change = (latent - base["latent"]).abs().max() / base["latent"].abs().max()
        assert change > 0.05, f"{name}: the adapter barely changes the latent ({change})"
        expected[f"velocity_{name}"] = velocity.contiguous()
        expected[f"latent_{name}"] = latent.contiguous()
        print(f"{name}: {modules} modules written, {patched} diffusers layers patched, latent moved {change:.3f} (relative)")
    save_file(expected, os.path.join(OUT, "expected.safetensors"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
