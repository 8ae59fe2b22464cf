#!/bin/bash
# Flux on the CPU backend (BENCHMARKS.md, "Flux on the CPU backend"): the generated
# full-depth preset at 256², resident / naive / stagehand in three interleaved rounds,
# and FP8; prints each run's steady step, compute, bytes per step and plan, and the
# machine's load before and after. Usage: scripts/bench-flux.sh [BINARY] [DIR]
set -euo pipefail
B=${1:-target/release/stagehand}
T=${2:-/tmp/flux-bench}
mkdir -p "$T"
[ -f "$T/bf16/flux.safetensors" ] || "$B" demo-model --arch flux --flux-preset full-depth --layout original --dtype bf16 --out "$T/bf16" --cond-out "$T/cond.safetensors" --cond-tokens 64
[ -f "$T/fp8/flux.safetensors" ] || "$B" demo-model --arch flux --flux-preset full-depth --layout comfyui --dtype fp8 --out "$T/fp8"
run() {
  local model=$1; shift
  "$B" sample --model "$model" --cond "$T/cond.safetensors" --width 256 --height 256 --steps 4 \
    --out "$T/out.safetensors" --device cpu --log warn --verify off --json "$@" |
    python3 -c "import json,sys; d=json.load(sys.stdin); s=d['summary']; print('$*', 'step_ms', round(d['seconds_per_step']*1e3,1), 'compute_ms', round(s['steady_compute_seconds']*1e3,1), 'to_vram_per_step', int(s['pinned_to_vram_bytes_per_step']), 'plan', s['streamed_bytes_per_step_planned'], 'model', s['model_bytes'], 'activations', d.get('activation_bytes'))"
}
cat /proc/loadavg
for round in 1 2 3; do
  run "$T/bf16/flux.safetensors" --vram-budget 600MiB
  run "$T/bf16/flux.safetensors" --prefetch-depth 0
  run "$T/bf16/flux.safetensors" --prefetch-depth 2
done
run "$T/fp8/flux.safetensors" --prefetch-depth 2
cat /proc/loadavg
