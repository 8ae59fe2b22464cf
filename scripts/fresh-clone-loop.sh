#!/usr/bin/env bash
# Runs the README's two commands N times (default 20) on a fresh clone of this
# repository's HEAD, as RELIABILITY.md "The two commands, 20 times on a fresh clone"
# reports them. Iteration 1 builds from an empty target/; every iteration starts with
# `git clean -xfdq -e target` and an empty cache directory (XDG_CACHE_HOME), then runs
# `cargo run --release` and `scripts/test.sh`, and appends both exit codes and the
# test line to WORK/results. Exit status 0 only if every command of every iteration
# exited 0.
#
#     scripts/fresh-clone-loop.sh [N] [WORK]     # WORK defaults to a new temp dir
#
# Touch WORK/pause to hold before the next iteration (e.g. for a quiet benchmark).
set -uo pipefail
runs=${1:-20}
work=${2:-$(mktemp -d "${TMPDIR:-/tmp}/stagehand-loop.XXXXXX")}
source_repo=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$work"
rm -rf "$work/clone" "$work/results"
git clone -q "$source_repo" "$work/clone" || exit 1
cd "$work/clone" || exit 1
echo "fresh-clone-loop: $(git log --oneline -1) in $work"
failed=0
for i in $(seq 1 "$runs"); do
    while [ -e "$work/pause" ]; do sleep 5; done
    git clean -xfdq -e target
    rm -rf "$work/cache" && mkdir -p "$work/cache"
    start=$(date +%s)
    XDG_CACHE_HOME=$work/cache cargo run --release > "$work/run-$i.log" 2>&1
    run_status=$?
    middle=$(date +%s)
    XDG_CACHE_HOME=$work/cache scripts/test.sh > "$work/test-$i.log" 2>&1
    test_status=$?
    end=$(date +%s)
    line="$i run rc=$run_status $((middle - start))s test rc=$test_status $((end - middle))s $(tail -1 "$work/test-$i.log")"
    echo "$line" | tee -a "$work/results"
    if [ "$run_status" -ne 0 ] || [ "$test_status" -ne 0 ]; then failed=$((failed + 1)); fi
done
echo "fresh-clone-loop: $((runs - failed)) of $runs green (logs in $work)"
[ "$failed" -eq 0 ]
