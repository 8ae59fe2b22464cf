#!/usr/bin/env bash
# Builds, on this machine (which has the cargo registry), everything scripts/gpu-check.sh
# runs on a GPU machine that has neither network nor cargo, and puts it in gpu-bin/
# (git-ignored; carry it to the GPU machine with the working tree).
#
#   scripts/build-gpu-bin.sh            # release stagehand + the GPU test binaries
#   GPU_TEST_TARGETS="cuda cuda_run other" scripts/build-gpu-bin.sh
#
# Layout written:
#   gpu-bin/stagehand          the CLI (`stagehand bench --device cuda`, `stagehand run --device cuda`)
#   gpu-bin/tests/<target>     one libtest binary per GPU test target (tests/<target>.rs)
#   gpu-bin/MANIFEST           commit, toolchain and file sizes, for the report
# Binaries are stripped of debug info: the carry to the GPU machine is capped (64 MiB).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT_DIR=gpu-bin
# By default every GPU test target that exists (one may be parked as *.rs.pending).
DEFAULT_TARGETS=""
for candidate in cuda cuda_run cuda_flux cuda_wan; do
    if [ -f "tests/$candidate.rs" ]; then DEFAULT_TARGETS="$DEFAULT_TARGETS $candidate"; fi
done
TARGETS=${GPU_TEST_TARGETS:-$DEFAULT_TARGETS}
CARRY_LIMIT_BYTES=$((60 * 1024 * 1024))

rm -rf "$OUT_DIR"
mkdir -p "$OUT_DIR/tests"

cargo build --release --bin stagehand
cp target/release/stagehand "$OUT_DIR/stagehand"

for target in $TARGETS; do
    # Cargo prints one JSON message per artifact; the test binary's path is the
    # `executable` of the artifact built for this test target.
    executable=$(cargo test --release --no-run --message-format=json --test "$target" \
        | grep '"reason":"compiler-artifact"' \
        | grep "\"name\":\"$target\"" \
        | grep -o '"executable":"[^"]*"' \
        | sed 's/"executable":"\(.*\)"/\1/' \
        | tail -n 1)
    if [ -z "$executable" ] || [ ! -x "$executable" ]; then
        echo "build-gpu-bin: no test binary found for tests/$target.rs" >&2
        exit 1
    fi
    cp "$executable" "$OUT_DIR/tests/$target"
done

for binary in "$OUT_DIR/stagehand" "$OUT_DIR"/tests/*; do
    strip --strip-debug "$binary" 2>/dev/null || true
done

{
    echo "commit: $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo ' (with uncommitted changes)')"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "rustc: $(rustc --version)"
    echo "files:"
    (cd "$OUT_DIR" && find . -type f ! -name MANIFEST -printf '  %p %s bytes\n' | sort)
} > "$OUT_DIR/MANIFEST"
cat "$OUT_DIR/MANIFEST"

total_bytes=$(du -sb "$OUT_DIR" | cut -f1)
if [ "$total_bytes" -gt "$CARRY_LIMIT_BYTES" ]; then
    echo "build-gpu-bin: warning: gpu-bin/ is $total_bytes bytes, near or over the 64 MiB carry limit" >&2
fi
