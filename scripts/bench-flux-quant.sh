#!/bin/bash
# Flux's quantized formats on the CPU backend (BENCHMARKS.md, "Flux quantized formats"):
# the generated full-depth preset in BF16, ComfyUI's scaled FP8, int8_tensorwise and
# awq_w4a16 (ComfyUI layout), each sampled at 256² under the default budget (40 % of
# its own bytes); prints the model's bytes, the bytes planned and moved per steady
# step, and the machine's load before and after. Usage:
# scripts/bench-flux-quant.sh [BINARY] [DIR]
set -euo pipefail
B=${1:-target/release/stagehand}
T=${2:-/tmp/flux-quant-bench}
mkdir -p "$T"
for dtype in bf16 fp8 int8 awq; do
  [ -f "$T/$dtype/flux.safetensors" ] || "$B" demo-model --arch flux --flux-preset full-depth \
    --layout comfyui --dtype "$dtype" --out "$T/$dtype" --cond-out "$T/cond.safetensors" --cond-tokens 64
done
uptime
for dtype in bf16 fp8 int8 awq; do
  "$B" sample --model "$T/$dtype/flux.safetensors" --cond "$T/cond.safetensors" --width 256 --height 256 \
    --steps 3 --out "$T/out-$dtype.safetensors" --device cpu --log warn --verify off --prefetch-depth 2 --json |
    python3 -c "import json,sys; d=json.load(sys.stdin); s=d['summary']; print('$dtype', 'model', s['model_bytes'], 'plan_per_step', s['streamed_bytes_per_step_planned'], 'to_vram_per_step', int(s['pinned_to_vram_bytes_per_step']), 'step_ms', round(d['seconds_per_step']*1e3,1))"
done
uptime
