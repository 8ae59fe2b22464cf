#!/usr/bin/env bash
# The roofline measured twice in a row (issue 40): the figures a CPU run's physical
# bound comes from — memory bandwidth, the f32 and bf16 product peaks, the copy rate —
# each the best of 5 rounds of 0.25 s after a warm-up round. Prints each figure of both
# measurements, their ratio, and the machine's load before and after; exits 1 when a
# figure differs by more than 10 % (on an idle machine they must agree within that).
#
#   scripts/roofline-repeat.sh            # the release binary, built if missing
#   STAGEHAND_BIN=path/to/stagehand scripts/roofline-repeat.sh
#
# A fresh cache folder is used, so the user's cached roofline is neither read nor
# replaced. Record the figures in BENCHMARKS.md ("Roofline repeatability") with the
# date and the load shown.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}
bin=${STAGEHAND_BIN:-$target/release/stagehand}
if [ ! -x "$bin" ]; then
    cargo build --release --bin stagehand
fi
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
XDG_CACHE_HOME="$cache" "$bin" calibrate --roofline --log warn >"$cache/first.json"
XDG_CACHE_HOME="$cache" "$bin" calibrate --roofline --log warn >"$cache/second.json"
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
python3 - "$cache/first.json" "$cache/second.json" "$load_before" "$load_after" <<'PY'
import json, sys
first, second = (json.load(open(path)) for path in sys.argv[1:3])
print(f"roofline-repeat: {first['machine']['cpu_model']}, {first['machine']['cores']} cores; "
      f"load average before {sys.argv[3]}, after {sys.argv[4]}")
worst = 1.0
figures = [("memory_bytes_per_second", 1e9, "GB/s"), ("flops_per_second", 1e9, "GFLOP/s"),
           ("bf16_flops_per_second", 1e9, "GFLOP/s"), ("copy_bytes_per_second", 1e9, "GB/s")]
for name, scale, unit in figures:
    a, b = first[name], second[name]
    ratio = max(a, b) / max(min(a, b), 1e-9)
    worst = max(worst, ratio)
    print(f"  {name:26} {a / scale:9.2f} {b / scale:9.2f} {unit:8} ratio {ratio:.3f}")
verdict = "agree within 10 %" if worst <= 1.10 else "DIFFER by more than 10 %"
print(f"roofline-repeat: worst ratio {worst:.3f}: the two measurements {verdict}")
sys.exit(0 if worst <= 1.10 else 1)
PY
