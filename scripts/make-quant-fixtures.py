#!/usr/bin/env python3
"""Writes tests/fixtures/flux/quant.safetensors: two linear layers in ComfyUI's integer
formats with what torch computes from them, dequantised exactly as ComfyUI's layouts do
(comfy-kitchen's TensorWiseINT8Layout and TensorCoreAWQW4A16Layout, as comfy/ops.py
loads them), in float32:

- int8.weight I8 [40, 128], int8.weight_scale F32 [] (quantize_int8_tensorwise:
  scale = max|w| / 127, codes = round(w * (1 / scale)) clamped to [-128, 127]);
  int8.dequantized = weight.to(float32) * scale.
- awq.weight I8 [40, 64] (packed: bits 0..3 are column 2j, bits 4..7 column 2j + 1,
  unsigned 0..15), awq.weight_scale and awq.weight_zeros BF16 [2, 40] (groups of 64
  inputs by output row; each group's range in 15 steps, zero = min + 8 * scale);
  awq.dequantized = ((q - 8) * scale + zero) in float32, per group.
- weight F32 [40, 128], the values both were quantized from; x F32 [3, 128], bias
  F32 [40], and int8.y / awq.y = F.linear(x, dequantized, bias).

Run with the venv that has torch: /work/venv/bin/python scripts/make-quant-fixtures.py.
The tests only read the file (tests/flux_quant_reference.rs).
"""

import os

import torch
import torch.nn.functional as F
from safetensors.torch import save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "flux")
ROWS, COLS, GROUP = 40, 128, 64

torch.manual_seed(7)
weight = torch.randn(ROWS, COLS) * 0.05
x = torch.randn(3, COLS)
bias = torch.randn(ROWS) * 0.02

# int8_tensorwise, as comfy-kitchen's eager quantize_int8_tensorwise.
scale = (weight.abs().max().float() / 127.0).clamp(min=1e-30)
int8 = weight.float().mul(1.0 / scale).round_().clamp_(-128.0, 127.0).to(torch.int8)
int8_dequantized = int8.to(torch.float32) * scale

# awq_w4a16: per group of 64 inputs of each row, min..max in 15 steps (BF16 tables).
groups = weight.view(ROWS, COLS // GROUP, GROUP)
low, high = groups.amin(dim=-1), groups.amax(dim=-1)
scales = ((high - low) / 15.0).to(torch.bfloat16)
zeros = (low + 8.0 * scales.float()).to(torch.bfloat16)
codes = ((groups - zeros.float().unsqueeze(-1)) / scales.float().unsqueeze(-1)).round() + 8.0
codes = codes.clamp(0, 15).to(torch.int32).view(ROWS, COLS)
packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
weight_scale = scales.t().contiguous()  # [K / G, N]
weight_zeros = zeros.t().contiguous()

# TensorCoreAWQW4A16Layout.dequantize with orig_dtype float32.
q_i32 = packed.to(torch.int32)
w_uint = torch.empty(ROWS, COLS, dtype=torch.int32)
w_uint[:, 0::2] = q_i32 & 0x0F
w_uint[:, 1::2] = (q_i32 >> 4) & 0x0F
table_scales = weight_scale.float().t().unsqueeze(-1)
table_zeros = weight_zeros.float().t().unsqueeze(-1)
unpacked = w_uint.view(ROWS, COLS // GROUP, GROUP).to(torch.float32)
awq_dequantized = ((unpacked - 8.0) * table_scales + table_zeros).view(ROWS, COLS)

tensors = {
    "weight": weight,
    "x": x,
    "bias": bias,
    "int8.weight": int8,
    "int8.weight_scale": scale.reshape(()),
    "int8.dequantized": int8_dequantized,
    "int8.y": F.linear(x, int8_dequantized, bias),
    "awq.weight": packed,
    "awq.weight_scale": weight_scale,
    "awq.weight_zeros": weight_zeros,
    "awq.dequantized": awq_dequantized,
    "awq.y": F.linear(x, awq_dequantized, bias),
}
os.makedirs(OUT, exist_ok=True)
save_file({name: t.contiguous() for name, t in tensors.items()}, os.path.join(OUT, "quant.safetensors"))
print("wrote", os.path.join(OUT, "quant.safetensors"))
