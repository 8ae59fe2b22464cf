#!/usr/bin/env python3
"""Writes tests/fixtures/pipeline: a tiny Flux pipeline that diffusers built and ran.

The components are the real classes with tiny configs and seeded random weights
(rounded to bf16 values, stored as f32): CLIPTextModel (quick-GELU, causal mask,
pooled at the end-of-text token), T5EncoderModel (v1.1: gated tanh-GELU, relative
position bias), FluxTransformer2DModel (dev: guidance embedder), AutoencoderKL (16
latent channels, four levels as Flux's VAE, GroupNorm, the mid-block attention,
scaling 0.3611 and shift 0.1159) and FlowMatchEulerDiscreteScheduler. The tokenizers
are trained here on a few sentences: CLIP's byte-level BPE laid out as CLIP's vocab
(bytes, bytes with </w>, merges, then <|startoftext|> and <|endoftext|>), T5's unigram
(<pad>, </s>, <unk>, pieces, sentinels).

`pipe.save_pretrained` writes flux-tiny/ (model_index.json, text_encoder/,
text_encoder_2/, tokenizer/, tokenizer_2/, transformer/, vae/, scheduler/). The CLIP
tokenizer is saved as transformers 5 saves it (tokenizer.json) and, in
flux-tiny/tokenizer/, also as vocab.json + merges.txt as the published FLUX.1 folders
ship it; the test of the second form removes tokenizer.json from a copy.

expected.safetensors holds (all F32; ids and pixel levels as whole numbers), for PROMPT:
- clip_ids [77], clip_pooled [1, H], clip_hidden [1, 77, H];
- t5_ids [L], t5_states [1, L, D] (L = MAX_SEQUENCE_LENGTH);
- vae_latent [1, 16, 8, 6] and vae_image [1, 3, 64, 48]: the decoder alone on a
  latent (scaled as the pipeline scales it first);
- noise [1, 16, 8, 6] (also in noise.safetensors as `latent`, what `--latents` takes),
  latent [1, 16, 8, 6] after the steps (before the VAE), image [64, 48, 3] in [0, 1]
  (output_type "np"), and pixels [64, 48, 3] as diffusers' PIL image holds them.
- tiled_image: the VAE's tiled decode of a larger latent (tiled_latent), with
  tile_sample_min_size 32 and overlap 0.25 (diffusers' enable_tiling).

expected-encoder.safetensors: the VAE's encoder on a seeded image (see
encoder_fixture; `--encoder-only` writes it alone from the saved VAE).

comfy/: the same weights (bf16, which holds them exactly) in the layouts ComfyUI users
have (see comfy_layouts): flux1-tiny.safetensors (the transformer in Black Forest Labs'
names), clip_l.safetensors, t5xxl.safetensors, ae.safetensors (the autoencoder in its
original LDM names), t5xxl_fp8_e4m3fn_scaled.safetensors (ComfyUI's scaled FP8: E4M3
linear weights with a `scale_weight` each and the `scaled_fp8` marker), and
flux-tiny-all-in-one.safetensors (all four under ComfyUI's checkpoint prefixes). Each
layout but the transformer's is read back by diffusers' single-file loader or
transformers and checked equal to the pipeline's weights. comfy/expected-fp8.safetensors: T5's states with the FP8 weights
(dequantised, computed by transformers). The transformer's head is 16 wide, not Flux's
128, so its files say how its rope splits a head (`stagehand.flux.axes_dims_rope`).

Run with the venv that has torch, transformers and diffusers:
    /work/pyvenv/bin/python scripts/make-pipeline-fixtures.py [--encoder-only]
The tests only read the files.
"""

import json
import os
import shutil
import sys

import numpy as np
import torch
from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer, T5Config, T5EncoderModel, T5Tokenizer

torch.set_num_threads(2)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "pipeline")
HEIGHT, WIDTH, STEPS, GUIDANCE = 64, 48, 3, 3.5
MAX_SEQUENCE_LENGTH = 16
PROMPT = "A photo of a red fox sitting in the snow, highly detailed!"

CORPUS = [
    "a photo of a cat sitting on a mat",
    "a red fox in the snow, highly detailed photograph",
    "an astronaut riding a horse on the moon",
    "a painting of a lighthouse at sunset, oil on canvas",
    "the quick brown fox jumps over the lazy dog",
    "a bowl of fruit on a wooden table, studio lighting",
    "portrait of an old man with a beard, 35mm film",
    "a city street at night in the rain with neon signs",
    "mountains and a lake under a clear blue sky",
    "a small robot reading a book in a library",
] * 4


def bytes_to_unicode():
    """GPT-2's byte-to-character table, which CLIP's vocab is written in."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return [chr(c) for c in cs]


def clip_tokenizer_files(directory):
    """A CLIP vocabulary trained on CORPUS, laid out as CLIP's: vocab.json, merges.txt."""
    tokenizer = Tokenizer(models.BPE(end_of_word_suffix="</w>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=700, end_of_word_suffix="</w>", initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tokenizer.train_from_iterator([line.lower() for line in CORPUS], trainer)
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]
    symbols = bytes_to_unicode()
    vocab = symbols + [s + "</w>" for s in symbols]
    seen = set(vocab)
    kept = []
    for left, right in merges:
        if left in seen and right in seen and left + right not in seen:
            vocab.append(left + right)
            seen.add(left + right)
            kept.append((left, right))
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "vocab.json"), "w") as f:
        json.dump({token: i for i, token in enumerate(vocab)}, f, ensure_ascii=False)
    with open(os.path.join(directory, "merges.txt"), "w") as f:
        f.write("#version: 0.2\n")
        for left, right in kept:
            f.write(f"{left} {right}\n")
    return len(vocab)


def t5_tokenizer():
    """A unigram vocabulary trained on CORPUS, laid out as T5's."""
    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")]
    )
    trainer = trainers.UnigramTrainer(vocab_size=160, unk_token="<unk>", special_tokens=["<pad>", "</s>", "<unk>"], show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer)
    pieces = json.loads(tokenizer.to_str())["model"]["vocab"]
    vocab = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    vocab += [(piece, score) for piece, score in pieces if piece not in ("<pad>", "</s>", "<unk>")]
    extra_ids = 3
    vocab += [(f"<extra_id_{i}>", 0.0) for i in range(extra_ids - 1, -1, -1)]
    return T5Tokenizer(vocab=vocab, extra_ids=extra_ids, model_max_length=512)


def randomise(model, seed):
    """Seeded weights of bf16 values: matrices ~ N(0, 1/fan_in), norms near 1."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if parameter.ndim >= 2:
                fan_in = parameter[0].numel()
                parameter.copy_(torch.randn_like(parameter) / fan_in**0.5)
            elif "norm" in name or "layer_norm" in name:
                parameter.copy_(1.0 + 0.1 * torch.randn_like(parameter))
            else:
                parameter.copy_(0.02 * torch.randn_like(parameter))
            parameter.copy_(parameter.to(torch.bfloat16).float())
    return model.float().eval()


def components(clip_vocab):
    clip = randomise(
        CLIPTextModel(
            CLIPTextConfig(
                vocab_size=clip_vocab,
                # 64-wide heads, as every CLIP has: a file without its config is read so.
                hidden_size=128,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                max_position_embeddings=77,
                hidden_act="quick_gelu",
                projection_dim=32,
                # CLIP-L's config says 2 (the legacy value): the pooled row is the argmax id's.
                bos_token_id=0,
                eos_token_id=2,
                pad_token_id=1,
            )
        ),
        1,
    )
    t5 = randomise(
        T5EncoderModel(
            T5Config(
                vocab_size=163,
                d_model=32,
                d_kv=8,
                d_ff=48,
                num_layers=2,
                num_heads=4,
                relative_attention_num_buckets=32,
                relative_attention_max_distance=128,
                feed_forward_proj="gated-gelu",
                layer_norm_epsilon=1e-6,
                is_encoder_decoder=False,
                use_cache=False,
                tie_word_embeddings=False,
            )
        ),
        2,
    )
    transformer = randomise(
        FluxTransformer2DModel(
            patch_size=1,
            in_channels=64,
            num_layers=1,
            num_single_layers=2,
            attention_head_dim=16,
            num_attention_heads=2,
            joint_attention_dim=32,
            pooled_projection_dim=128,
            guidance_embeds=True,
            axes_dims_rope=[4, 6, 6],
        ),
        3,
    )
    vae = randomise(
        AutoencoderKL(
            in_channels=3,
            out_channels=3,
            down_block_types=["DownEncoderBlock2D"] * 4,
            up_block_types=["UpDecoderBlock2D"] * 4,
            # 32 groups, as every AutoencoderKL has: a file without its config is read so.
            block_out_channels=[32, 32, 32, 32],
            layers_per_block=1,
            act_fn="silu",
            latent_channels=16,
            norm_num_groups=32,
            sample_size=64,
            scaling_factor=0.3611,
            shift_factor=0.1159,
            use_quant_conv=False,
            use_post_quant_conv=False,
            mid_block_add_attention=True,
        ),
        4,
    )
    scheduler = FlowMatchEulerDiscreteScheduler(
        num_train_timesteps=1000,
        shift=3.0,
        use_dynamic_shifting=True,
        base_shift=0.5,
        max_shift=1.15,
        base_image_seq_len=256,
        max_image_seq_len=4096,
    )
    return clip, t5, transformer, vae, scheduler


def main():
    if os.path.isdir(OUT):
        shutil.rmtree(OUT)
    os.makedirs(OUT)
    vocab_dir = os.path.join(OUT, "clip-vocab")
    clip_vocab = clip_tokenizer_files(vocab_dir)
    clip_tok = CLIPTokenizer(
        vocab=json.load(open(os.path.join(vocab_dir, "vocab.json"))),
        merges=[tuple(l.split()) for l in open(os.path.join(vocab_dir, "merges.txt")).read().splitlines()[1:]],
        model_max_length=77,
    )
    t5_tok = t5_tokenizer()
    clip, t5, transformer, vae, scheduler = components(clip_vocab)
    pipe = FluxPipeline(
        scheduler=scheduler,
        vae=vae,
        text_encoder=clip,
        tokenizer=clip_tok,
        text_encoder_2=t5,
        tokenizer_2=t5_tok,
        transformer=transformer,
    )
    folder = os.path.join(OUT, "flux-tiny")
    pipe.save_pretrained(folder, safe_serialization=True)
    # The published layout of the CLIP tokenizer, beside transformers 5's tokenizer.json.
    for name in ("vocab.json", "merges.txt"):
        shutil.move(os.path.join(vocab_dir, name), os.path.join(folder, "tokenizer", name))
    os.rmdir(vocab_dir)

    expected = {}
    with torch.no_grad():
        clip_ids = clip_tok(PROMPT, padding="max_length", max_length=77, truncation=True, return_tensors="pt").input_ids
        out = clip(clip_ids, output_hidden_states=False)
        expected["clip_ids"] = clip_ids[0].to(torch.float32)
        expected["clip_pooled"] = out.pooler_output
        expected["clip_hidden"] = out.last_hidden_state
        t5_ids = t5_tok(
            PROMPT, padding="max_length", max_length=MAX_SEQUENCE_LENGTH, truncation=True, return_tensors="pt"
        ).input_ids
        expected["t5_ids"] = t5_ids[0].to(torch.float32)
        expected["t5_states"] = t5(t5_ids, output_hidden_states=False)[0]

        torch.manual_seed(5)
        vae_latent = torch.randn(1, 16, HEIGHT // 8, WIDTH // 8)
        expected["vae_latent"] = vae_latent
        scaled = vae_latent / vae.config.scaling_factor + vae.config.shift_factor
        expected["vae_image"] = vae.decode(scaled, return_dict=False)[0]

        # Tiled decode: a 96 x 80 image in 32-pixel tiles overlapping by a quarter.
        torch.manual_seed(6)
        tiled_latent = torch.randn(1, 16, 12, 10)
        expected["tiled_latent"] = tiled_latent
        vae.enable_tiling()
        vae.tile_sample_min_size, vae.tile_latent_min_size, vae.tile_overlap_factor = 32, 4, 0.25
        expected["tiled_image"] = vae.decode(tiled_latent / 0.3611 + 0.1159, return_dict=False)[0]
        vae.disable_tiling()

        torch.manual_seed(7)
        noise = torch.randn(1, 16, HEIGHT // 8, WIDTH // 8)
        expected["noise"] = noise
        packed = FluxPipeline._pack_latents(noise, 1, 16, HEIGHT // 8, WIDTH // 8)
        common = dict(
            prompt=PROMPT,
            height=HEIGHT,
            width=WIDTH,
            num_inference_steps=STEPS,
            guidance_scale=GUIDANCE,
            max_sequence_length=MAX_SEQUENCE_LENGTH,
        )
        latent = pipe(**common, latents=packed.clone(), output_type="latent").images
        expected["latent"] = FluxPipeline._unpack_latents(latent, HEIGHT, WIDTH, pipe.vae_scale_factor)
        image = pipe(**common, latents=packed.clone(), output_type="np").images[0]
        expected["image"] = torch.from_numpy(np.ascontiguousarray(image))
        pil = pipe(**common, latents=packed.clone(), output_type="pil").images[0]
        expected["pixels"] = torch.from_numpy(np.asarray(pil).astype(np.float32).copy())

    save_file({k: v.contiguous() for k, v in expected.items()}, os.path.join(OUT, "expected.safetensors"))
    save_file({"latent": noise.contiguous()}, os.path.join(OUT, "noise.safetensors"))
    with open(os.path.join(OUT, "prompt.json"), "w") as f:
        json.dump(
            dict(
                prompt=PROMPT,
                height=HEIGHT,
                width=WIDTH,
                steps=STEPS,
                guidance=GUIDANCE,
                max_sequence_length=MAX_SEQUENCE_LENGTH,
            ),
            f,
            indent=1,
        )
    # T5's buckets (32, distance 128) for key offsets -600 .. 599, for the unit test.
    from transformers.models.t5.modeling_t5 import T5Attention

    offsets = torch.arange(-600, 600)
    buckets = T5Attention._relative_position_bucket(offsets, True, 32, 128)
    with open(os.path.join(OUT, "t5-buckets-32-128.txt"), "w") as f:
        f.write(",".join(map(str, buckets.tolist())) + "\n")
    print("wrote", OUT, "clip vocab", clip_vocab, "t5 ids", expected["t5_ids"].tolist())


def encoder_fixture():
    """expected-encoder.safetensors: the VAE's encoder on a seeded 64 x 48 image in
    [-1, 1] (`image` [1, 3, 64, 48]) and its latent distribution's mode, scaled as
    FluxImg2ImgPipeline scales it: (mode - shift_factor) * scaling_factor (`latent`).
    Reads the saved VAE, so it runs alone too (`--encoder-only`)."""
    vae = AutoencoderKL.from_pretrained(os.path.join(OUT, "flux-tiny", "vae")).float().eval()
    torch.manual_seed(8)
    image = torch.rand(1, 3, HEIGHT, WIDTH) * 2 - 1
    with torch.no_grad():
        mode = vae.encode(image).latent_dist.mode()
    latent = (mode - vae.config.shift_factor) * vae.config.scaling_factor
    save_file({"image": image.contiguous(), "latent": latent.contiguous()}, os.path.join(OUT, "expected-encoder.safetensors"))


def flux_fixtures():
    """scripts/make-flux-fixtures.py as a module (its original_state)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "make-flux-fixtures.py")
    spec = importlib.util.spec_from_file_location("make_flux_fixtures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def ldm_vae_state(vae):
    """The AutoencoderKL's weights in the original (LDM) names of Flux's ae.safetensors:
    the inverse of diffusers' convert_ldm_vae_checkpoint (the decoder's up levels
    reversed, the mid attention's projections as 1x1 convolutions)."""
    sd = {k: v.detach().clone() for k, v in vae.state_dict().items()}
    levels = len(vae.config.block_out_channels)
    out = {}
    attention = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}
    for name, value in sd.items():
        coder, rest = name.split(".", 1)
        if coder not in ("encoder", "decoder"):
            out[name] = value
            continue
        rest = rest.replace("conv_norm_out", "norm_out").replace("conv_shortcut", "nin_shortcut")
        parts = rest.split(".")
        if parts[0] in ("down_blocks", "up_blocks"):
            index = int(parts[1])
            level = "down" if parts[0] == "down_blocks" else "up"
            if level == "up":
                index = levels - 1 - index
            if parts[2] == "resnets":
                rest = f"{level}.{index}.block.{parts[3]}." + ".".join(parts[4:])
            else:  # downsamplers.0.conv / upsamplers.0.conv
                sampler = "downsample" if level == "down" else "upsample"
                rest = f"{level}.{index}.{sampler}." + ".".join(parts[4:])
        elif parts[0] == "mid_block" and parts[1] == "resnets":
            rest = f"mid.block_{int(parts[2]) + 1}." + ".".join(parts[3:])
        elif parts[0] == "mid_block" and parts[1] == "attentions":
            layer = ".".join(parts[3:-1])
            rest = f"mid.attn_1.{attention[layer]}.{parts[-1]}"
            if layer != "group_norm" and value.ndim == 2:
                value = value[:, :, None, None]
        out[f"{coder}.{rest}"] = value
    return out


def bf16(state, prefix=""):
    return {prefix + k: v.to(torch.bfloat16).contiguous() for k, v in state.items()}


def scaled_fp8(state):
    """ComfyUI's scaled FP8 of T5 (t5xxl_fp8_e4m3fn_scaled): every linear weight of the
    blocks as E4M3 with a per-tensor `scale_weight` (amax / 448), the rest bf16, and the
    `scaled_fp8` marker. Returns the file's tensors and the weights they stand for."""
    out, dequantised = {}, {}
    for name, value in state.items():
        if name.startswith("encoder.block.") and name.endswith(".weight") and value.ndim == 2 and "relative" not in name:
            scale = value.abs().max().float() / 448.0
            stored = (value / scale).to(torch.float8_e4m3fn)
            out[name] = stored
            out[name[: -len("weight")] + "scale_weight"] = scale.reshape(()).float()
            dequantised[name] = stored.float() * scale
        else:
            out[name] = value.to(torch.bfloat16).contiguous()
            dequantised[name] = value.to(torch.bfloat16).float()
    out["scaled_fp8"] = torch.empty(0, dtype=torch.float8_e4m3fn)
    return out, dequantised


def comfy_layouts():
    """comfy/: the pipeline's weights in ComfyUI's layouts, each read back by diffusers'
    own single-file loaders (or transformers') and checked equal, and T5's states with
    its scaled FP8 weights."""
    folder = os.path.join(OUT, "flux-tiny")
    comfy = os.path.join(OUT, "comfy")
    os.makedirs(comfy, exist_ok=True)
    transformer = FluxTransformer2DModel.from_pretrained(os.path.join(folder, "transformer")).float().eval()
    clip = CLIPTextModel.from_pretrained(os.path.join(folder, "text_encoder")).float().eval()
    t5 = T5EncoderModel.from_pretrained(os.path.join(folder, "text_encoder_2")).float().eval()
    vae = AutoencoderKL.from_pretrained(os.path.join(folder, "vae")).float().eval()
    axes = {"stagehand.flux.axes_dims_rope": json.dumps(list(transformer.config.axes_dims_rope))}
    flux_state = flux_fixtures().original_state(transformer)
    from safetensors.torch import load_file

    # The text encoders' files as ComfyUI's: transformers' checkpoint names, CLIP's
    # under `text_model.` as the published CLIP-L (openai/clip-vit-large-patch14) has them.
    clip_saved = load_file(os.path.join(folder, "text_encoder", "model.safetensors"))
    clip_state = {k if k.startswith("text_model.") else "text_model." + k: v for k, v in clip_saved.items()}
    t5_state = load_file(os.path.join(folder, "text_encoder_2", "model.safetensors"))
    vae_state = ldm_vae_state(vae)
    files = {
        "flux1-tiny.safetensors": (bf16(flux_state), axes),
        "clip_l.safetensors": (bf16(clip_state), None),
        "t5xxl.safetensors": (bf16(t5_state), None),
        "ae.safetensors": (bf16(vae_state), None),
    }
    all_in_one = {}
    for state, prefix in [
        (flux_state, "model.diffusion_model."),
        (clip_state, "text_encoders.clip_l.transformer."),
        (t5_state, "text_encoders.t5xxl.transformer."),
        (vae_state, "vae."),
    ]:
        all_in_one.update(bf16(state, prefix))
    files["flux-tiny-all-in-one.safetensors"] = (all_in_one, axes)
    fp8, dequantised = scaled_fp8(t5_state)
    files["t5xxl_fp8_e4m3fn_scaled.safetensors"] = (fp8, None)
    for name, (tensors, metadata) in files.items():
        save_file(tensors, os.path.join(comfy, name), metadata=metadata)

    # diffusers' single-file loaders read these layouts back as the pipeline's weights.
    def same(model, reference, what):
        got, want = model.state_dict(), reference.state_dict()
        assert got.keys() == want.keys(), what
        for key in want:
            assert torch.equal(got[key].float(), want[key].float()), f"{what}: {key}"

    # (diffusers' Flux converter is hard-wired to Flux's width, 3072, so it cannot read
    # this transformer back; its names are make-flux-fixtures.py's original_state, which
    # tests/flux_reference.rs checks against diffusers' outputs.)
    for name in ("ae.safetensors", "flux-tiny-all-in-one.safetensors"):
        loaded = AutoencoderKL.from_single_file(
            os.path.join(comfy, name), config=folder, subfolder="vae", torch_dtype=torch.float32
        )
        same(loaded, vae, name)
    # transformers' from_pretrained reads the text encoders' files (as the weights of a
    # folder with the encoder's config) as the pipeline's encoders.
    import tempfile

    for name, model, prefix, part in [
        ("clip_l.safetensors", clip, "", "text_encoder"),
        ("t5xxl.safetensors", t5, "", "text_encoder_2"),
        ("flux-tiny-all-in-one.safetensors", clip, "text_encoders.clip_l.transformer.", "text_encoder"),
        ("flux-tiny-all-in-one.safetensors", t5, "text_encoders.t5xxl.transformer.", "text_encoder_2"),
    ]:
        tensors = {k[len(prefix):]: v.float() for k, v in load_file(os.path.join(comfy, name)).items() if k.startswith(prefix)}
        with tempfile.TemporaryDirectory() as temporary:
            shutil.copy(os.path.join(folder, part, "config.json"), temporary)
            save_file(tensors, os.path.join(temporary, "model.safetensors"))
            loaded = type(model).from_pretrained(temporary).float().eval()
        same(loaded, model, f"{name} ({prefix or 'whole'})")

    # T5 with its FP8 weights, as ComfyUI computes them (widened, times their scale).
    t5_fp8 = T5EncoderModel(t5.config).float().eval()
    t5_fp8.load_state_dict({k: v for k, v in dequantised.items()}, strict=False)
    t5_fp8.tie_weights()
    expected = load_file(os.path.join(OUT, "expected.safetensors"))
    t5_ids = expected["t5_ids"].to(torch.long)[None]
    with torch.no_grad():
        states = t5_fp8(t5_ids)[0]
    save_file({"t5_states": states.contiguous()}, os.path.join(comfy, "expected-fp8.safetensors"))
    print("wrote", comfy)


if __name__ == "__main__":
    if "--encoder-only" not in sys.argv:
        main()
    encoder_fixture()
    comfy_layouts()
