#!/usr/bin/env bash
# The test command (README "Set up"; also the last step of .ci/run).
#
# Runs every test binary of the workspace, even after one fails (--no-fail-fast), and
# ends with one total line, e.g.
#     test.sh: 612 passed, 0 failed, 9 skipped (9: needs a CUDA device: ...)
# summed from cargo's own "test result:" lines. The exit status is cargo's: non-zero
# if anything failed or did not build.
#
# GPU tests are #[ignore]d with their reason, so they show as skipped, never as
# passed. STAGEHAND_GPU_TESTS=1 (on a machine with a CUDA device) runs them too.
# Extra arguments go to `cargo test`, e.g. `scripts/test.sh --test sim_properties`.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/install-prometheus.sh || exit  # promtool/prometheus for the observability tests; no-op when present
# NVRTC (CUDA 13, from PyPI) for the test that compiles every CUDA kernel; no GPU needed.
nvrtc_lib=$(scripts/install-nvrtc.sh) || exit
export LD_LIBRARY_PATH="$nvrtc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

args=("$@")
if [ "${STAGEHAND_GPU_TESTS:-}" = 1 ]; then
    # Test-binary arguments follow the first `--`; add one if there is none.
    separator=no
    for arg in "${args[@]}"; do
        if [ "$arg" = -- ]; then separator=yes; fi
    done
    if [ "$separator" = no ]; then args+=(--); fi
    args+=(--include-ignored)
fi

log=$(mktemp "${TMPDIR:-/tmp}/stagehand-test.XXXXXX")
starts=$(mktemp "${TMPDIR:-/tmp}/stagehand-test-starts.XXXXXX")
trap 'rm -f "$log" "$starts"' EXIT

# Passes cargo's lines on unchanged, and notes when each test binary started: cargo
# prints "Running unittests src/lib.rs (...)", "Running tests/x.rs (...)" or
# "Doc-tests crate" before it runs one, so a binary took from its line to the next
# one's (the last, to the end of the output).
note_binary_starts() {
    local line
    while IFS= read -r line || [ -n "$line" ]; do
        printf '%s\n' "$line"
        if [[ $line =~ ^\ *(Running|Doc-tests)\ (.*)$ ]]; then
            local kind=${BASH_REMATCH[1]} what=${BASH_REMATCH[2]}
            if [ "$kind" = Doc-tests ]; then
                what="Doc-tests $what"
            elif [[ $what =~ ^(unittests .*)\ \(.*/([^/]*)-[0-9a-f]+\)$ ]]; then
                # The two crates' unit tests share "unittests src/lib.rs": name the crate.
                what="${BASH_REMATCH[1]} [${BASH_REMATCH[2]}]"
            else
                what=${what% (*)}
            fi
            printf '%s %s\n' "$EPOCHREALTIME" "$what" >>"$starts"
        fi
    done
    printf '%s (end)\n' "$EPOCHREALTIME" >>"$starts"
}

# stdout and stderr both go to the terminal as usual, and to the log for the total.
cargo test --workspace --no-fail-fast "${args[@]}" 2>&1 | note_binary_starts | tee "$log"
status=${PIPESTATUS[0]}

# "test result: ok. 12 passed; 0 failed; 3 ignored; 0 measured; 0 filtered out; ..."
totals=$(awk '
    /^test result:/ {
        for (i = 1; i <= NF; i++) {
            if ($(i + 1) ~ /^passed;?$/) passed += $i
            if ($(i + 1) ~ /^failed;?$/) failed += $i
            if ($(i + 1) ~ /^ignored;?$/) ignored += $i
        }
        results++
    }
    /^ *Running / || /^ *Doc-tests / { binaries++ }
    END { printf "%d %d %d %d %d\n", passed, failed, ignored, results, binaries }
' "$log")
read -r passed failed ignored results binaries <<< "$totals"

# Why tests were skipped: libtest prints "test NAME ... ignored, REASON".
reasons=$(sed -n 's/^test .* \.\.\. ignored, \(.*\)$/\1/p' "$log" | sort | uniq -c |
    awk '{ count = $1; $1 = ""; sub(/^ /, ""); printf "%s%d: %s", (NR > 1 ? "; " : ""), count, $0 }')

line="$passed passed, $failed failed, $ignored skipped"
if [ -n "$reasons" ]; then line="$line ($reasons)"; fi
if [ "$results" -lt "$binaries" ]; then
    # A binary that crashed (a signal, an abort) or never started prints no result line.
    line="$line; $((binaries - results)) of $binaries test binaries ended without a result (see above)"
fi
if [ "$status" -ne 0 ] && [ "$failed" -eq 0 ] && [ "$results" -ge "$binaries" ]; then
    line="$line; cargo exited $status (a build error? see above)"
fi
# Where the time went: the slowest test binaries, so every CI log shows it.
slowest=$(awk '
    NR > 1 { seconds[NR - 1] = $1 - start; total += $1 - start }
    { start = $1; $1 = ""; sub(/^ /, ""); name[NR] = $0 }
    END {
        for (i = 1; i < NR; i++) printf "%.1f %s\n", seconds[i], name[i]
        printf "total %.0f\n", total
    }
' "$starts")
if [ "$binaries" -gt 0 ]; then
    echo
    echo "test.sh: the slowest test binaries (seconds; $(sed -n 's/^total //p' <<<"$slowest") s for all $binaries):"
    grep -v '^total ' <<<"$slowest" | sort -rn | head -n 8 | awk '{ printf "%8.1f  ", $1; $1 = ""; sub(/^ /, ""); print }'
fi
echo
echo "test.sh: $line"
exit "$status"
