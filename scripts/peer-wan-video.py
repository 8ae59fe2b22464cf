#!/usr/bin/env python3
"""The peer of `stagehand video` for BENCHMARKS.md: diffusers' WanPipeline on a Wan
pipeline folder (the tiny tests/fixtures/wan_pipeline by default), the same prompt,
size, steps and guidance, frames written as an MP4 by diffusers' export_to_video when
imageio is there, else as a NumPy file. Prints the time per stage.

    farm-bench --vs '/work/pyvenv/bin/python scripts/peer-wan-video.py' -- \
        target/release/stagehand video --model tests/fixtures/wan_pipeline ...
"""

import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import importlib.util  # noqa: E402

spec = importlib.util.spec_from_file_location("fixtures", os.path.join(HERE, "make-wan-pipeline-fixtures.py"))
fixtures = importlib.util.module_from_spec(spec)
spec.loader.exec_module(fixtures)

from diffusers import AutoencoderKLWan, UniPCMultistepScheduler, WanPipeline, WanTransformer3DModel  # noqa: E402
from transformers import AutoTokenizer, UMT5EncoderModel  # noqa: E402


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "fixtures", "wan_pipeline")
    out = sys.argv[2] if len(sys.argv) > 2 else "/tmp/peer-fox.npy"
    torch.set_num_threads(os.cpu_count() or 1)
    started = time.perf_counter()
    pipe = WanPipeline(
        tokenizer=AutoTokenizer.from_pretrained(os.path.join(folder, "tokenizer")),
        text_encoder=UMT5EncoderModel.from_pretrained(os.path.join(folder, "text_encoder")).float().eval(),
        vae=fixtures.load(AutoencoderKLWan, os.path.join(folder, "vae")),
        transformer=fixtures.load(WanTransformer3DModel, os.path.join(folder, "transformer")),
        transformer_2=fixtures.load(WanTransformer3DModel, os.path.join(folder, "transformer_2")),
        scheduler=UniPCMultistepScheduler.from_pretrained(os.path.join(folder, "scheduler")),
        boundary_ratio=0.875,
    )
    loaded = time.perf_counter()
    with torch.no_grad():
        frames = pipe(
            prompt="a red fox runs through the snow",
            height=64,
            width=48,
            num_frames=9,
            num_inference_steps=4,
            guidance_scale=4.0,
            output_type="np",
        ).frames[0]
    done = time.perf_counter()
    np.save(out, frames)
    print(f"load {loaded - started:.2f} s, pipeline {done - loaded:.2f} s")


if __name__ == "__main__":
    main()
