#!/usr/bin/env python3
"""Fixtures for the UniPC flow scheduler (tests/unipc_reference.rs).

diffusers' UniPCMultistepScheduler, configured as the published Wan 2.2 folders
configure it (`use_flow_sigmas`, `prediction_type: flow_prediction`, solver order 2,
bh2, `lower_order_final`) and in three variants (order 3 with another shift; the
corrector off at steps 1 and 2; bh1 with `final_sigmas_type: sigma_min`), drives a small latent for a few
steps. The model's output at each step is a function of the sample (as a real
velocity is), recorded with every sample, so the test replays the recorded outputs
and compares each step's sample.

    /work/pyvenv/bin/python scripts/make-unipc-fixtures.py   # diffusers 0.42.1, torch
"""
import json
import pathlib

import torch
from diffusers import UniPCMultistepScheduler

OUT = pathlib.Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "unipc"

# The scheduler_config.json of Wan-AI/Wan2.2-T2V-A14B-Diffusers (flow_shift 3.0).
WAN = dict(
    beta_end=0.02,
    beta_schedule="linear",
    beta_start=0.0001,
    disable_corrector=[],
    dynamic_thresholding_ratio=0.995,
    final_sigmas_type="zero",
    flow_shift=3.0,
    lower_order_final=True,
    num_train_timesteps=1000,
    predict_x0=True,
    prediction_type="flow_prediction",
    rescale_betas_zero_snr=False,
    sample_max_value=1.0,
    solver_order=2,
    solver_p=None,
    solver_type="bh2",
    steps_offset=0,
    thresholding=False,
    timestep_spacing="linspace",
    trained_betas=None,
    use_beta_sigmas=False,
    use_exponential_sigmas=False,
    use_flow_sigmas=True,
    use_karras_sigmas=False,
)

CASES = {
    "wan-t2v": (dict(WAN), 8),
    "order3-shift5": (dict(WAN, solver_order=3, flow_shift=5.0), 7),
    "no-corrector": (dict(WAN, disable_corrector=[1, 2]), 5),
    # bh1 only with a final sigma above 0: at 0, log σ is −∞ and diffusers' bh1 gives NaN.
    "bh1-sigma-min": (
        dict(WAN, solver_type="bh1", final_sigmas_type="sigma_min", lower_order_final=False),
        4,
    ),
}


def velocity(sample, timestep, noise):
    # Depends on the sample and the time, as a model's velocity does.
    return noise - 0.9 * sample + 0.001 * float(timestep) * torch.tanh(sample)


def main():
    for name, (config, steps) in CASES.items():
        folder = OUT / name
        folder.mkdir(parents=True, exist_ok=True)
        scheduler = UniPCMultistepScheduler(**config)
        scheduler.save_config(folder)
        scheduler.set_timesteps(steps)
        generator = torch.Generator().manual_seed(7)
        sample = torch.randn(2, 3, 5, generator=generator, dtype=torch.float32)
        noise = torch.randn(2, 3, 5, generator=generator, dtype=torch.float32)
        record = {
            "steps": steps,
            "sigmas": scheduler.sigmas.tolist(),
            "timesteps": scheduler.timesteps.tolist(),
            "start": sample.flatten().tolist(),
            "outputs": [],
            "samples": [],
        }
        for t in scheduler.timesteps:
            output = velocity(sample, t, noise)
            sample = scheduler.step(output, t, sample, return_dict=False)[0]
            record["outputs"].append(output.flatten().tolist())
            record["samples"].append(sample.flatten().tolist())
        (folder / "steps.json").write_text(json.dumps(record))
        print(name, steps, "steps; last sample", sample.flatten()[:3].tolist())


if __name__ == "__main__":
    main()
