#!/usr/bin/env bash
# One prepared GPU check for a machine with a GPU but no network and no cargo.
#
# Here (with cargo):      scripts/build-gpu-bin.sh      # fills gpu-bin/
# On the GPU machine:     scripts/gpu-check.sh          # OUT=dir to choose the output
#
# It prints nvidia-smi, runs every GPU test binary in gpu-bin/tests/ with
# STAGEHAND_GPU_TESTS=1 and --include-ignored (GPU tests are #[ignore]d, so a plain
# `cargo test` lists them as ignored), runs `gpu-bin/stagehand bench --device cuda
# --json`, a short `gpu-bin/stagehand run --device cuda --steps 3 --json`, and
# `stagehand embed` of two sentences on a generated BERT-base folder (f16 weights,
# written to $WORK, outside $OUT) streamed on the GPU and, for comparison, on the CPU
# backend, then `calibrate --device cuda` and `validate --device cuda` (the simulator's
# predictions on that profile against real runs on the GPU), and last `bench --model`
# of generated Llama-3.2-1B-shaped folders in bf16 and FP8 (decode tokens/s resident,
# naive, streamed). It writes into $OUT
# (default ./gpu-out):
#   nvidia-smi.txt, tests-<target>.txt, bench.json, bench.stderr.txt, bench.md,
#   run.json, run.stderr.txt, bert.txt, embed-cuda.json, embed-cuda.stderr.txt,
#   embed-cpu.json, embed-cpu.stderr.txt, hardware-gpu.toml, calibrate.stderr.txt,
#   validate.txt, validate.stderr.txt, llama-1b-{bf16,fp8}.txt,
#   bench-llama-1b-{bf16,fp8}.txt,
#   summary.json (every step's exit code and seconds, the bench, run and embed JSON)
#   and report.md (the same, readable, with the bench's own Markdown tables).
# Everything runs under one deadline, 7 minutes in all (GPU_CHECK_SECONDS, default 420,
# plus 15 s for the report): each step gets what is left, and the report is written even
# when a step fails or runs out of time. Exit status: 0 only
# if every step passed.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ -z "${GPU_CHECK_INNER:-}" ]; then
    # Safety net over the per-step deadlines: nothing outlives the deadline + 15 s.
    GPU_CHECK_INNER=1 exec timeout --kill-after=5 $(( ${GPU_CHECK_SECONDS:-420} + 15 )) "$0" "$@"
fi

OUT=${OUT:-./gpu-out}
BIN=gpu-bin
# The generated model folder is large (BERT-base, ~220 MB): kept out of $OUT, which is
# carried back.
WORK=${WORK:-$(mktemp -d)}
BUDGET_SECONDS=${GPU_CHECK_SECONDS:-420}
START=$(date +%s)
mkdir -p "$OUT"

remaining() {
    local left=$((BUDGET_SECONDS - ($(date +%s) - START)))
    if [ "$left" -lt 1 ]; then left=1; fi
    echo "$left"
}

STEPS_JSON=""
STEPS_MD=""
FAILED=0

# run_step NAME OUTPUT_FILE COMMAND...: runs under the remaining deadline, tees output.
run_step() {
    local name=$1 output=$2
    shift 2
    local began rc seconds
    began=$(date +%s.%N)
    echo "== $name"
    timeout --kill-after=5 "$(remaining)" "$@" 2>&1 | tee "$output"
    rc=${PIPESTATUS[0]}
    seconds=$(awk -v a="$began" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    local verdict=passed
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then verdict="timed out"; fi
    if [ "$rc" -ne 0 ] && [ "$verdict" = passed ]; then verdict="failed"; fi
    if [ "$rc" -ne 0 ]; then FAILED=1; fi
    echo "== $name: $verdict (exit $rc, ${seconds} s)"
    STEPS_JSON="$STEPS_JSON${STEPS_JSON:+,}
    {\"name\": \"$name\", \"exit_code\": $rc, \"verdict\": \"$verdict\", \"seconds\": $seconds, \"output\": \"$(basename "$output")\"}"
    STEPS_MD="$STEPS_MD| $name | $verdict | $rc | $seconds |
"
}

if [ ! -x "$BIN/stagehand" ]; then
    echo "gpu-check: $BIN/stagehand is missing: run scripts/build-gpu-bin.sh on a machine with cargo first" >&2
    exit 2
fi

run_step "nvidia-smi" "$OUT/nvidia-smi.txt" nvidia-smi

for test_binary in "$BIN"/tests/*; do
    [ -x "$test_binary" ] || continue
    target=$(basename "$test_binary")
    # One thread: the tests compare the driver's free-memory figure before and after
    # their own allocations, which concurrent tests would disturb.
    run_step "tests/$target" "$OUT/tests-$target.txt" \
        env STAGEHAND_GPU_TESTS=1 "$test_binary" --include-ignored --test-threads=1 --nocapture
done

run_step "bench --device cuda" "$OUT/bench.stderr.txt" \
    sh -c "'$BIN/stagehand' bench --device cuda --json > '$OUT/bench.json'"
# The bench prints its Markdown on stderr after a marker line.
MARKER='<!-- bench-cuda-markdown -->'
if grep -qF "$MARKER" "$OUT/bench.stderr.txt"; then
    sed -n "/$MARKER/,\$p" "$OUT/bench.stderr.txt" | tail -n +2 > "$OUT/bench.md"
fi

run_step "run --device cuda --steps 3" "$OUT/run.stderr.txt" \
    sh -c "'$BIN/stagehand' run --device cuda --steps 3 --json > '$OUT/run.json'"

# A real architecture on the GPU: a generated BERT-base folder (f16), most layers
# streamed under a 96 MiB budget, each step equal to its resident pass on the GPU (the
# run checks it), and the same sentences on the CPU backend for the similarity.
FOOD="A man is eating food."
BREAD="A man is eating a piece of bread."
run_step "demo-model --arch bert --preset base --dtype f16" "$OUT/bert.txt" \
    "$BIN/stagehand" demo-model --arch bert --preset base --dtype f16 --out "$WORK/bert-base"
run_step "embed --device cuda (BERT-base f16, 96 MiB)" "$OUT/embed-cuda.stderr.txt" \
    sh -c "'$BIN/stagehand' embed --model '$WORK/bert-base' --device cuda --vram-budget 96MiB --json '$FOOD' '$BREAD' > '$OUT/embed-cuda.json'"
run_step "embed --device cpu (BERT-base f16, 96 MiB)" "$OUT/embed-cpu.stderr.txt" \
    sh -c "'$BIN/stagehand' embed --model '$WORK/bert-base' --device cpu --vram-budget 96MiB --json '$FOOD' '$BREAD' > '$OUT/embed-cpu.json'"

# The simulator checked against this GPU: a profile calibrated on it (copies over its
# link, its kernels), then the validation matrix run there (--quick: two rows, so it
# fits the deadline; drop --quick for all 38 when there is time).
run_step "calibrate --device cuda" "$OUT/calibrate.stderr.txt" \
    "$BIN/stagehand" calibrate --device cuda --quick --dir "$WORK" --out "$OUT/hardware-gpu.toml"
run_step "validate --device cuda" "$OUT/validate.stderr.txt" \
    sh -c "'$BIN/stagehand' validate --device cuda --quick --no-decoder --hardware '$OUT/hardware-gpu.toml' --cache-dir '$WORK' > '$OUT/validate.txt'"

# A decoder on the GPU (last: the steps above matter more if time runs out): Llama-3.2-1B shapes in bf16 and FP8 (widened on the device),
# decode tokens/s resident vs naive vs streamed under 40 % of the model, each token's
# logits equal to the resident pass (the bench checks it).
for dtype in bf16 fp8; do
    run_step "demo-model --arch llama --decoder-preset 1b --dtype $dtype" "$OUT/llama-1b-$dtype.txt" \
        "$BIN/stagehand" demo-model --arch llama --decoder-preset 1b --dtype "$dtype" --out "$WORK/llama-1b-$dtype"
    run_step "bench --model llama-1b-$dtype --device cuda" "$OUT/bench-llama-1b-$dtype.txt" \
        "$BIN/stagehand" bench --model "$WORK/llama-1b-$dtype" --device cuda --batches 1
    if [ "$dtype" = bf16 ]; then
        # The peer on the same GPU and weights: stagehand's resident generate (a
        # 265-token prompt, 64 tokens) and PyTorch/transformers (the machine's own
        # python3), decode ms per token and prefill.
        PROMPT_IDS=$(seq 0 264 | awk '{ printf "%s%d", (NR > 1 ? "," : ""), 1000 + (7 * $1) % 20000 }')
        run_step "generate --device cuda llama-1b-bf16 (265-token prompt, 64 tokens)" "$OUT/generate-llama-1b-bf16.stderr.txt" \
            sh -c "'$BIN/stagehand' generate --model '$WORK/llama-1b-bf16' --device cuda --token-ids '$PROMPT_IDS' --max-tokens 64 --json --log warn > '$OUT/generate-llama-1b-bf16.json'"
        run_step "PyTorch decode llama-1b-bf16 --device cuda" "$OUT/peer-decode-llama-1b-bf16.txt" \
            python3 scripts/peer-bench.py decode --model "$WORK/llama-1b-bf16" --device cuda --tokens 64 --prompt-tokens 265
        run_step "PyTorch prefill llama-1b-bf16 --device cuda" "$OUT/peer-prefill-llama-1b-bf16.txt" \
            python3 scripts/peer-bench.py prefill --model "$WORK/llama-1b-bf16" --device cuda --prompt-tokens 265 --repeats 5
    fi
    rm -rf "$WORK/llama-1b-$dtype"
done

# Flux on the GPU (issue 25): generated checkpoints at Flux's block count (19 double +
# 38 single) — full-depth (width 256, 158 MiB BF16) and full-depth-wide (width 1024,
# Flux's head size and rope axes, 2.47 GiB BF16) — sampled resident (budget above the
# model), naive (depth 0) and stagehand (depth 2) under 40 % of the model plus the
# step's activations (read from the resident run's JSON), every block's bytes checked
# as they land (`--verify weights`); FP8 of full-depth at stagehand's settings. Steady
# ms per denoising step in the report.
FLUX_DIR="$WORK/flux"
run_step "demo-model --arch flux (full-depth bf16 + fp8, full-depth-wide bf16)" "$OUT/flux-demo.txt" \
    sh -c "'$BIN/stagehand' demo-model --arch flux --flux-preset full-depth --layout original --dtype bf16 --out '$FLUX_DIR/bf16' --cond-out '$FLUX_DIR/cond.safetensors' --cond-tokens 64 && '$BIN/stagehand' demo-model --arch flux --flux-preset full-depth --layout comfyui --dtype fp8 --out '$FLUX_DIR/fp8' && '$BIN/stagehand' demo-model --arch flux --flux-preset full-depth-wide --layout original --dtype bf16 --out '$FLUX_DIR/wide' --cond-out '$FLUX_DIR/cond-wide.safetensors' --cond-tokens 64"
flux_sample() {  # NAME MODEL COND SIDE ARGS...: one `sample --device cuda --json` into flux-NAME.json
    local name=$1 model=$2 cond=$3 side=$4
    shift 4
    run_step "sample --device cuda $name" "$OUT/flux-$name.stderr.txt" \
        sh -c "'$BIN/stagehand' sample --model '$model' --cond '$cond' --width $side --height $side --steps 4 --out '$WORK/latent.safetensors' --device cuda --log warn --json $* > '$OUT/flux-$name.json'"
}
flux_three_ways() {  # PRESET MODEL COND SIDE: resident, naive, stagehand
    local preset=$1 model=$2 cond=$3 side=$4
    [ -f "$model" ] || return 0
    local model_bytes activation_bytes
    model_bytes=$(stat -c %s "$model")
    flux_sample "$preset-$side-resident" "$model" "$cond" "$side" --verify off --vram-budget "$((model_bytes * 2 + (1 << 30)))B"
    activation_bytes=$(grep -o '"activation_bytes": [0-9]*' "$OUT/flux-$preset-$side-resident.json" 2>/dev/null | head -n 1 | grep -o '[0-9]*$')
    FLUX_BUDGET="$((model_bytes * 4 / 10 + ${activation_bytes:-0}))B"
    flux_sample "$preset-$side-naive" "$model" "$cond" "$side" --verify weights --prefetch-depth 0 --vram-budget "$FLUX_BUDGET"
    flux_sample "$preset-$side-stagehand" "$model" "$cond" "$side" --verify weights --prefetch-depth 2 --vram-budget "$FLUX_BUDGET"
}
for side in 256 512 1024; do
    flux_three_ways wide "$FLUX_DIR/wide/flux.safetensors" "$FLUX_DIR/cond-wide.safetensors" "$side"
done
flux_three_ways full-depth "$FLUX_DIR/bf16/flux.safetensors" "$FLUX_DIR/cond.safetensors" 1024
if [ -f "$FLUX_DIR/fp8/flux.safetensors" ]; then
    flux_sample "full-depth-1024-fp8-stagehand" "$FLUX_DIR/fp8/flux.safetensors" "$FLUX_DIR/cond.safetensors" 1024 --verify weights --prefetch-depth 2 --vram-budget "$FLUX_BUDGET"
fi
rm -rf "$FLUX_DIR"

TOTAL_SECONDS=$(( $(date +%s) - START ))

# summary.json: the steps, plus the bench's own JSON when it produced an object.
BENCH_JSON=null
if [ -s "$OUT/bench.json" ] && [ "$(head -c 1 "$OUT/bench.json")" = "{" ]; then
    BENCH_JSON=$(cat "$OUT/bench.json")
fi
RUN_JSON=null
if [ -s "$OUT/run.json" ] && [ "$(head -c 1 "$OUT/run.json")" = "{" ]; then
    RUN_JSON=$(cat "$OUT/run.json")
fi
EMBED_CUDA_JSON=null
if [ -s "$OUT/embed-cuda.json" ] && [ "$(head -c 1 "$OUT/embed-cuda.json")" = "{" ]; then
    EMBED_CUDA_JSON=$(cat "$OUT/embed-cuda.json")
fi
EMBED_CPU_JSON=null
if [ -s "$OUT/embed-cpu.json" ] && [ "$(head -c 1 "$OUT/embed-cpu.json")" = "{" ]; then
    EMBED_CPU_JSON=$(cat "$OUT/embed-cpu.json")
fi
cat > "$OUT/summary.json" <<JSON
{
  "passed": $([ "$FAILED" -eq 0 ] && echo true || echo false),
  "total_seconds": $TOTAL_SECONDS,
  "manifest": "$(head -n 1 "$BIN/MANIFEST" 2>/dev/null | sed 's/"/\\"/g')",
  "steps": [$STEPS_JSON
  ],
  "bench": $BENCH_JSON,
  "run": $RUN_JSON,
  "embed_cuda": $EMBED_CUDA_JSON,
  "embed_cpu": $EMBED_CPU_JSON
}
JSON

{
    echo "# GPU check"
    echo
    echo "$(head -n 1 "$BIN/MANIFEST" 2>/dev/null || echo 'commit: unknown'), $(date -u +%Y-%m-%dT%H:%M:%SZ), ${TOTAL_SECONDS} s in all"
    echo
    echo '```'
    nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current \
        --format=csv 2>/dev/null || head -n 12 "$OUT/nvidia-smi.txt"
    echo '```'
    echo
    echo "| step | verdict | exit | seconds |"
    echo "|---|---|---|---|"
    printf '%s' "$STEPS_MD"
    for log in "$OUT"/tests-*.txt; do
        [ -f "$log" ] || continue
        echo
        echo "## $(basename "$log" .txt)"
        echo
        echo '```'
        # Test lines, the tolerances met, and each panic with the message that follows it.
        awk '/^test |^test result|normalised error|skipped/ { print } /panicked at/ { print; getline; print }' "$log"
        echo '```'
        # Tables the tests print (the link figures) go in as Markdown.
        grep -E '^\|' "$log" || true
    done
    echo
    echo "## bench --device cuda"
    echo
    if [ -s "$OUT/bench.md" ]; then
        cat "$OUT/bench.md"
    elif [ "$BENCH_JSON" != null ] && command -v python3 >/dev/null 2>&1; then
        python3 - "$OUT/bench.json" <<'PY'
import json, sys
def rows(value, prefix=""):
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from rows(inner, f"{prefix}{key}.")
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            yield from rows(inner, f"{prefix}{index}.")
    else:
        yield prefix.rstrip("."), value
print("| figure | value |\n|---|---|")
for key, value in rows(json.load(open(sys.argv[1]))):
    print(f"| {key} | {value:.4g} |" if isinstance(value, float) else f"| {key} | {value} |")
PY
    elif [ "$BENCH_JSON" != null ]; then
        echo '```json'
        cat "$OUT/bench.json"
        echo '```'
    else
        echo "No bench JSON; its output:"
        echo
        echo '```'
        tail -n 30 "$OUT/bench.stderr.txt"
        echo '```'
    fi
    echo
    echo "## run --device cuda --steps 3"
    echo
    if [ "$RUN_JSON" != null ]; then
        echo '```'
        grep -E '"(device|steps|verified_steps|model_bytes|vram_budget_bytes|streamed_bytes_per_step_planned|steady_step_seconds|steady_compute_seconds|bound_seconds|bound_limited_by|efficiency|copy_bytes_per_second|pinned_to_vram_bytes_per_step|peak_vram_bytes|vram_bytes_after_shutdown|pinned_bytes_after_shutdown)"' "$OUT/run.json"
        echo '```'
    else
        echo "No run JSON; its output:"
        echo
        echo '```'
        tail -n 20 "$OUT/run.stderr.txt"
        echo '```'
    fi
    # The run logs the driver's VRAM figure against budget + headroom.
    grep -h "VRAM in use (driver figure)" "$OUT/run.stderr.txt" 2>/dev/null | sed 's/^/    /' || true
    echo
    echo "## embed: generated BERT-base (f16), two sentences, cuda then cpu"
    echo
    for device in cuda cpu; do
        echo "### --device $device"
        echo
        echo '```'
        if [ -s "$OUT/embed-$device.json" ]; then
            # The 2 × 2 similarity matrix, then the run's figures.
            grep -A 9 '"similarity": \[' "$OUT/embed-$device.json" | tr -d ' \n' && echo
            grep -E '"(device|steps|verified_steps|vram_budget_bytes|streamed_bytes_per_step_planned|steady_step_seconds|bound_seconds|bound_limited_by|efficiency)"' "$OUT/embed-$device.json"
        else
            tail -n 20 "$OUT/embed-$device.stderr.txt" 2>/dev/null
        fi
        echo '```'
    done
    grep -h "VRAM in use (driver figure)" "$OUT/embed-cuda.stderr.txt" 2>/dev/null | sed 's/^/    /' || true
    echo
    echo "## validate --device cuda (profile calibrated on this GPU)"
    echo
    echo '```'
    if [ -s "$OUT/validate.txt" ]; then
        cat "$OUT/validate.txt"
    else
        tail -n 20 "$OUT/validate.stderr.txt" 2>/dev/null
    fi
    echo '```'
    for dtype in bf16 fp8; do
        echo
        echo "## bench --model llama-1b-$dtype --device cuda"
        echo
        echo '```'
        grep -v " INFO " "$OUT/bench-llama-1b-$dtype.txt" 2>/dev/null | tail -n 12
        echo '```'
    done
    echo
    echo "## Llama-1B bf16 resident on this GPU: stagehand generate vs PyTorch (transformers)"
    echo
    echo '```'
    grep -hE '"(prefill_tokens_per_second|time_to_first_token_seconds|cold_read_seconds|prefill_compute_seconds|decode_tokens_per_second)"' "$OUT/generate-llama-1b-bf16.json" 2>/dev/null
    tail -n 1 "$OUT/peer-decode-llama-1b-bf16.txt" 2>/dev/null
    tail -n 1 "$OUT/peer-prefill-llama-1b-bf16.txt" 2>/dev/null
    echo '```'
    echo
    echo "## sample Flux --device cuda (steady ms per denoising step)"
    echo
    if command -v python3 >/dev/null 2>&1; then
        python3 - "$OUT" <<'PY'
import json, os, sys
out = sys.argv[1]
print("| run | ms/step | compute ms | bound ms (limited by) | →vram MiB/step | planned MiB/step | model MiB |")
print("|---|---|---|---|---|---|---|")
for name in sorted(f[5:-5] for f in os.listdir(out) if f.startswith("flux-") and f.endswith(".json")):
    try:
        d = json.load(open(os.path.join(out, f"flux-{name}.json")))
        s = d["summary"]
        mib = lambda b: f"{b / 2**20:.1f}"
        print(f"| {name} | {d['seconds_per_step'] * 1e3:.2f} | {s['steady_compute_seconds'] * 1e3:.2f} | "
              f"{s.get('bound_seconds', 0) * 1e3:.2f} ({s.get('bound_limited_by', '?')}) | "
              f"{mib(s['pinned_to_vram_bytes_per_step'])} | {mib(s['streamed_bytes_per_step_planned'])} | {mib(s['model_bytes'])} |")
    except Exception as error:
        print(f"| {name} | no result ({type(error).__name__}) | | | | |")
PY
    fi
} > "$OUT/report.md"

echo
cat "$OUT/report.md"
exit "$FAILED"
