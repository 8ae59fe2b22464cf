#!/usr/bin/env bash
# A prompt-to-image pipeline at FLUX.1-dev's real shapes on the CPU backend, under a
# VRAM budget and pin ceiling that make T5-XXL and the 12 B transformer stream (the
# measurement behind BENCHMARKS.md "A pipeline at Flux-dev's real shapes").
#
#   scripts/bench-real-shape-pipeline.sh [DIR] [VRAM_BUDGET] [PIN_CEILING]
#
# DIR (default /tmp/flux-dev-shapes) gets ComfyUI's separate files with seeded weights:
# scripts/make-real-shape-pipeline.py writes CLIP-L, T5-XXL (scaled FP8) and the VAE,
# `stagehand demo-model --flux-preset dev` the transformer (FP8, ComfyUI's names);
# ~17 GB on disk. Then one 64x64 image, 2 steps, a 64-token T5 prompt, and a line per
# stage: time, bytes streamed, peaks against the budgets (which must hold).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-/tmp/flux-dev-shapes}
vram=${2:-2GiB}
pins=${3:-4GiB}
python=${PYTHON:-/work/pyvenv/bin/python}
cargo build --release --quiet
bin=target/release/stagehand
if [ ! -f "$dir/t5xxl_fp8_e4m3fn_scaled.safetensors" ]; then
    "$python" scripts/make-real-shape-pipeline.py "$dir"
fi
transformer=$dir/flux1-dev-fp8/flux.safetensors
if [ ! -f "$transformer" ]; then
    "$bin" demo-model --arch flux --flux-preset dev --layout comfyui --dtype fp8 \
        --out "$dir/flux1-dev-fp8"
fi
json=$(mktemp)
trap 'rm -f "$json"' EXIT
/usr/bin/time -f '%e s wall, %M KiB peak RSS' "$bin" image \
    --model "$transformer" \
    --clip "$dir/clip_l.safetensors" --t5 "$dir/t5xxl_fp8_e4m3fn_scaled.safetensors" \
    --vae "$dir/ae.safetensors" \
    --clip-tokenizer "$dir/tokenizer" --t5-tokenizer "$dir/tokenizer_2" \
    --prompt "a red fox in the snow" --width 64 --height 64 --steps 2 \
    --max-sequence-length 64 --vram-budget "$vram" --pin-ceiling "$pins" \
    --out "$dir/fox.png" --json >"$json"
python3 - "$json" <<'PY'
import json, sys
result = json.load(open(sys.argv[1]))
gib = 1 << 30
print(f"image in {result['seconds']:.1f} s")
for stage in result["stages"]:
    s = stage["summary"]
    streamed = max(0, s["model_bytes"] - s["resident_bytes"])
    print(
        f"{stage['stage']:<12} {stage['seconds']:8.1f} s  weights {s['model_bytes'] / gib:6.2f} GiB "
        f"(streamed {streamed / gib:5.2f} GiB a step)  peak VRAM {s['peak_vram_bytes'] / gib:5.2f} "
        f"of {s['vram_budget_bytes'] / gib:5.2f} GiB, pinned {s['peak_pinned_bytes'] / gib:5.2f} "
        f"of {s['pin_ceiling_bytes'] / gib:5.2f} GiB"
    )
    assert s["peak_vram_bytes"] <= s["vram_budget_bytes"], stage["stage"]
    assert s["peak_pinned_bytes"] <= s["pin_ceiling_bytes"] + s["staging_ring_bytes"], stage["stage"]
PY
