#!/usr/bin/env bash
# A Wan 2.2 T2V-A14B pipeline with its two experts at their real shapes (40 blocks of
# width 5120, 26.6 GiB each in BF16) on the CPU backend, under a VRAM budget and pin
# ceiling far below one expert (the measurement behind BENCHMARKS.md "A Wan 2.2 A14B
# pair at real shapes on the CPU backend").
#
#   scripts/bench-real-shape-wan.sh [DIR] [VRAM_BUDGET] [PIN_CEILING]
#
# VIDEO_FLAGS (environment) are added to the `video` command, e.g.
# VIDEO_FLAGS=--no-hand-over-prefetch to time the switch without the second expert
# opening during the first's last step.
#
# DIR (default /tmp/wan-a14b-shapes) gets the pipeline folder: scripts/make-real-shape-wan.py
# writes umT5 at umT5-XXL's width (2 layers), Wan 2.1's VAE, the scheduler and the
# tokenizer; `stagehand demo-model --wan-preset a14b` the high-noise expert, and the
# low-noise expert is a hard link of it (53 GB of two distinct experts would not fit
# beside the build on this disk; the pipeline opens, streams and budgets them as two
# models all the same, and 24 GiB of RAM cannot cache either). ~28 GB on disk. Then a
# 16x16, 1-frame video in 2 steps (one per expert) with 64 text tokens, and a line
# per stage: time, compute and waits of its step, peaks against the budgets (which
# must hold), what each held after; and the hand-over's figures.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-/tmp/wan-a14b-shapes}
vram=${2:-3GiB}
pins=${3:-6GiB}
python=${PYTHON:-/work/pyvenv/bin/python}
cargo build --release --quiet
bin=target/release/stagehand
if [ ! -f "$dir/vae/config.json" ]; then
    "$python" scripts/make-real-shape-wan.py "$dir"
fi
if [ ! -f "$dir/transformer/config.json" ]; then
    "$bin" demo-model --arch wan --wan-preset a14b --dtype bf16 --out "$dir/expert"
    mv "$dir/expert/transformer" "$dir/transformer"
    rmdir "$dir/expert"
fi
[ -d "$dir/transformer_2" ] || cp -al "$dir/transformer" "$dir/transformer_2"
json=$(mktemp)
trap 'rm -f "$json"' EXIT
/usr/bin/time -f '%e s wall, %M KiB peak RSS' "$bin" video --model "$dir" \
    --prompt "a red fox runs through the snow" --negative-prompt "blurry" \
    --frames 1 --width 16 --height 16 --steps 2 --max-sequence-length 64 \
    --vram-budget "$vram" --pin-ceiling "$pins" --out "$dir/fox.mp4" --json ${VIDEO_FLAGS:-} >"$json"
python3 - "$json" <<'PY'
import json, sys
video = json.load(open(sys.argv[1]))
gib = 2**30
held = True
for stage in video["stages"]:
    s = stage["summary"]
    within = s["peak_vram_bytes"] <= s["vram_budget_bytes"] and s["peak_pinned_bytes"] <= s["pin_ceiling_bytes"]
    held &= within and s["vram_bytes_after_shutdown"] == 0 and s["pinned_bytes_after_shutdown"] == 0
    print(f"{stage['stage']}: {stage['seconds']:.1f} s, model {s['model_bytes'] / gib:.2f} GiB, "
          f"compute {s['first_step_compute_seconds']:.1f} s + waits {s['first_step_wait_seconds']:.1f} s "
          f"(bound {s['bound_seconds']:.1f} s, {s['bound_limited_by']}), "
          f"peak VRAM {s['peak_vram_bytes'] / gib:.3f} of {s['vram_budget_bytes'] / gib:.2f} GiB, "
          f"pinned {s['peak_pinned_bytes'] / gib:.3f} of {s['pin_ceiling_bytes'] / gib:.2f} GiB, "
          f"after: {s['vram_bytes_after_shutdown']} B / {s['pinned_bytes_after_shutdown']} B, "
          f"peak RSS {s['peak_rss_bytes'] / gib:.2f} GiB")
print("hand-over:", json.dumps(video["hand_over"]))
print("every stage within its budgets and nothing held after:", "yes" if held else "NO")
sys.exit(0 if held else 1)
PY
